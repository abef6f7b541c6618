'use strict';
// Session: one lease for many holds (LOCK.SESSION), kept alive by one timer, like the Python
// package's Session and the Rust crate's session.rs.
//
// `new Session(client, ttl, options)` opens nothing yet; `open()` sends
// `LOCK.SESSION OPEN ttl [BOUND] [LOCKDELAY ms]` and starts `LOCK.SESSION KEEPALIVE id` every
// `keepalivePeriod` ms (default ttl/3), however many locks it holds. A lock made with
// `session` acquires with `SESSION id` and runs no watchdog: its hold ends when the session ends
// (or at its own deadline; a ttl of 0 means none).
//
// How a session is lost, reported once (`lost`, `lostReason`, `onLost(session)`, and every hold
// of it as `session lost: <reason>`):
// - "ended": KEEPALIVE answered nil (it expired, was closed elsewhere, or its bound connection
//   closed): every hold it had is gone;
// - "keepalive failed: <error>": no answer within the period (fail-safe, as the watchdog);
// - "connection lost: <error>" (bound): the dedicated connection closed; the server ends a bound
//   session the moment it sees that. On a single server, no re-ATTACH: a session found again
//   would not prove that each of its holds survived (a promoted replica can miss the newest
//   grants). The client's default session (lib/default-session.js) is opened with `GRACE`, so
//   the server keeps it detached for the grace, and it re-ATTACHes after a blip (`_reattaches`).
//
// In a cluster (issue 34) a failover is followed instead: a keepalive or session command that
// meets MOVED, READONLY or a lost connection is sent again to the slot's master, looked up
// afresh, until the ttl from the last keepalive that succeeded; a bound session whose connection
// met a failover re-attaches (LOCK.SESSION ATTACH) on the slot's master. Only the server's nil
// (KEEPALIVE or ATTACH: "ended") or that ttl passing loses it.
//
// `bound: true`: opened on a dedicated connection (lib/adapter.js `dedicated`: made like the
// client's own, never reconnected, nothing re-sent) that carries only the session's keepalives
// and is watched for its close, so a close is seen at once.

const { adapt, IOREDIS_CLUSTER, NODE_REDIS_CLUSTER } = require('./adapter');
const wire = require('./wire');
const { LockError } = require('./errors');

/** A map reply (a RESP2 flat array, a RESP3 Map or object) as a plain object. */
function fields(reply) {
  if (reply === null || reply === undefined) return null;
  if (Array.isArray(reply)) {
    const out = {};
    for (let i = 0; i < reply.length; i += 2) out[String(reply[i])] = reply[i + 1];
    return out;
  }
  if (reply instanceof Map) return Object.fromEntries(reply);
  return { ...reply };
}

class Session {
  /**
   * `ttl`: ms the session lives after its last keepalive. Options: `bound`, `lockDelay` (ms, 0 to
   * 60000), `key` (with a cluster client: a key the session will lock; its node opens it),
   * `onLost(session)`, `keepalivePeriod` (ms, default ttl/3).
   */
  constructor(client, ttl, options = {}) {
    this.client = client;
    this._adapter = adapt(client);
    this._ttl = wire.toMs(ttl, 'ttl');
    this.bound = Boolean(options.bound);
    this._delay = wire.toLockDelay(options.lockDelay);
    this.key = options.key;
    if ((this._adapter.kind === IOREDIS_CLUSTER || this._adapter.kind === NODE_REDIS_CLUSTER) && this.key === undefined) {
      throw new RangeError(
        "a session in a cluster belongs to one node, the master of a slot: name a key it will lock (key); " +
          "OPEN goes to that key's master, and every lock of the session must be on it"
      );
    }
    this.onLost = options.onLost;
    this.keepalivePeriod =
      options.keepalivePeriod !== undefined ? wire.toMs(options.keepalivePeriod, 'keepalivePeriod') : undefined;
    if (this.keepalivePeriod !== undefined && this.keepalivePeriod >= this._ttl) {
      throw new RangeError('keepalivePeriod must be shorter than the ttl');
    }
    this._id = null;
    this._closed = false;
    this._lostReason = null;
    this._holds = new Set();
    this._conn = null; // the bound session's dedicated connection
    /** The session's public serial (LOCK.SESSION LIST), once a bound session is open. */
    this.serial = null;
    this._timer = null;
    this._inFlight = null;
    this._lastOk = null; // performance.now() when the last successful keepalive was sent
    this._reattaching = null; // the re-ATTACH in flight (a cluster failover)
  }

  /** The session id (`{tag}` + 32 hex digits), or null before open(). A secret. */
  get id() {
    return this._id;
  }

  get ttl() {
    return this._ttl;
  }

  /** ms nobody is granted what a hold had after the session was lost uncleanly (undefined: 0). */
  get lockDelay() {
    return this._delay;
  }

  get lost() {
    return this._lostReason !== null;
  }

  /** "ended", "keepalive failed: ..." or "connection lost: ..."; null while not lost. */
  get lostReason() {
    return this._lostReason;
  }

  get closed() {
    return this._closed;
  }

  _period() {
    return this.keepalivePeriod !== undefined ? this.keepalivePeriod : Math.max(1, Math.floor(this._ttl / 3));
  }

  _openArgs() {
    const args = ['LOCK.SESSION', 'OPEN', this._ttl];
    if (this.bound) args.push('BOUND');
    if (this._delay !== undefined) args.push('LOCKDELAY', this._delay);
    return args;
  }

  /** The id for an acquire's `SESSION id`; LockError if the session cannot take holds. */
  _usableId() {
    if (this._id === null) throw new LockError('the session is not open: call open() first');
    if (this._closed) throw new LockError('the session is closed');
    if (this._lostReason !== null) throw new LockError(`the session was lost (${this._lostReason}): open a new one`);
    return this._id;
  }

  /** Run a command about this session where it lives (its bound connection, or its node). */
  _call(args) {
    if (this._conn !== null) return this._conn.call(args);
    const route = this._id !== null ? this._id : this.key;
    if (!this._adapter.isCluster) return this._adapter.callOnKey(route, args);
    const since = this._lastOk !== null ? this._lastOk : performance.now();
    return wire.following(this._adapter, () => this._adapter.callOnKey(route, args), {
      key: route,
      untilMono: since + this._ttl,
      what: String(args[1]),
    });
  }

  /** A bound session's dedicated connection: watched for its close. */
  _attach(conn) {
    this._conn = conn;
    conn.onClose((error) => {
      if (this._conn !== conn) return; // replaced or closed by us
      const e = error || new Error('closed');
      if (this._id !== null && this._reattaches(e)) this._reattach(e);
      else this._lose(`connection lost: ${e.message}`);
    });
  }

  /**
   * Whether the bound connection's close (by `error`) is worth a re-ATTACH rather than a loss: in
   * a cluster, a failover. The default session (lib/default-session.js) also re-attaches after a
   * blip on one server, where the server keeps it for its grace.
   */
  _reattaches(_error) {
    return Boolean(this._adapter.isCluster);
  }

  /**
   * Until when (performance.now() scale) a re-ATTACH is tried: in a cluster, the session's ttl
   * from its last keepalive (a promoted replica keeps it that long, unbound).
   */
  _attachUntil() {
    return (this._lastOk !== null ? this._lastOk : performance.now()) + this._ttl;
  }

  /** Whether an ATTACH that failed with `error` is worth another try: the slot's master moved, or
   * the server has not yet seen the old connection close ("... still open"). */
  static _attachAgain(error) {
    return wire.movedAway(error) || /still open/.test(String(error && error.message));
  }

  /** Open, not closed, not lost: it can take holds. */
  _usable() {
    return this._id !== null && !this._closed && this._lostReason === null;
  }

  /**
   * A bound session's connection met a failover (a cluster), or dropped while the server keeps
   * the session detached for its grace (the default session, `_reattaches`): bind the session to a
   * new connection to its slot's master (LOCK.SESSION ATTACH; a promoted replica has it unbound),
   * tried until `_attachUntil()`. "ended" when the server has no such session: also when the old
   * master is alive and ended it because its bound connection closed (or the grace ran out).
   */
  _reattach(error) {
    if (this._reattaching !== null) return this._reattaching;
    const old = this._conn;
    this._conn = null;
    if (old !== null) old.close();
    const until = this._attachUntil();
    const run = async () => {
      let last = error;
      while (!this._closed && this._lostReason === null) {
        if (this._adapter.isCluster) await this._adapter.refresh(this._id);
        let conn = null;
        try {
          // Named as the old one was, on connecting (before ATTACH is sent).
          const name = this.serial !== null ? `redislock-session-${this.serial}` : 'redislock-session';
          conn = await this._adapter.dedicated(this._id, name);
          const reply = await wire.withTimeout(
            conn.call(['LOCK.SESSION', 'ATTACH', this._id]),
            Math.min(this._period(), Math.max(50, Math.ceil(until - performance.now()))),
            'LOCK.SESSION ATTACH'
          );
          if (reply === null) {
            conn.close();
            return this._lose('ended');
          }
          if (this._closed || this._lostReason !== null) return conn.close();
          this._attach(conn);
          return;
        } catch (e) {
          if (conn !== null) conn.close();
          if (!Session._attachAgain(e)) return this._lose(`attach failed: ${e.message}`);
          last = e;
        }
        if (performance.now() >= until) return this._lose(`connection lost: ${last.message}`);
        await new Promise((resolve) => setTimeout(resolve, wire.FOLLOW_BACKOFF_MS));
      }
    };
    this._reattaching = run().finally(() => {
      this._reattaching = null;
    });
    return this._reattaching;
  }

  /** Open the session and start its keepalive; resolves to this. */
  async open() {
    if (this._id !== null) throw new LockError('this session object was opened already; make a new one');
    let reply;
    const sent = performance.now();
    if (this.bound) {
      const conn = await this._adapter.dedicated(this.key, 'redislock-session');
      try {
        reply = await conn.call(this._openArgs());
      } catch (error) {
        conn.close();
        throw error;
      }
      if (reply !== null) this._id = String(reply);
      this._attach(conn);
    } else {
      reply = await this._call(this._openArgs());
    }
    if (reply === null) throw new LockError('LOCK.SESSION OPEN answered nil');
    this._id = String(reply);
    if (this._conn !== null) await this._nameConnection();
    this._lastOk = sent;
    this._schedule();
    return this;
  }

  /**
   * Name the bound connection after the session's serial (LOCK.SESSION INFO), never its id, so
   * that CLIENT LIST says whose it is: `name=redislock-session-<serial>`. Best effort: a server
   * without the serial or a user refused CLIENT SETNAME leaves it unnamed.
   */
  async _nameConnection() {
    try {
      const info = await this._conn.call(['LOCK.SESSION', 'INFO', this._id]);
      const pairs = Array.isArray(info) ? info : Object.entries(info || {}).flat();
      for (let i = 0; i + 1 < pairs.length; i += 2) {
        if (String(pairs[i]) === 'serial') this.serial = Number(pairs[i + 1]);
      }
      if (this.serial !== null) {
        await this._conn.call(['CLIENT', 'SETNAME', `redislock-session-${this.serial}`]);
      }
    } catch (_) {
      // unnamed: naming is for operators, never a reason to fail the open
    }
  }

  _schedule() {
    this._timer = setTimeout(() => {
      this._inFlight = this._keepalive().then(
        (remaining) => {
          if (this._timer === null) return;
          if (remaining === null) return this._lose('ended');
          this._schedule();
        },
        (error) => {
          if (this._timer !== null) this._lose(`keepalive failed: ${error.message}`);
        }
      );
    }, this._period());
    this._timer.unref();
  }

  /**
   * One keepalive: the remaining ms, or null if the server has no such session. In a cluster it
   * follows a failover (see the top of this file): a bound session re-attaches first.
   */
  async _keepalive() {
    const args = ['LOCK.SESSION', 'KEEPALIVE', this._id];
    const period = this._period();
    const sent = performance.now();
    let remaining;
    if (this._reattaching !== null) {
      await this._reattaching; // a blip (the default session) or a failover: bound again first
      if (this._lostReason !== null || this._timer === null) return undefined;
    }
    if (!this._adapter.isCluster) {
      remaining = await wire.withTimeout(this._call(args), period, 'LOCK.SESSION KEEPALIVE');
    } else {
      const conn = this._conn;
      try {
        remaining = await wire.withTimeout(
          conn !== null ? conn.call(args) : this._call(args),
          period,
          'LOCK.SESSION KEEPALIVE'
        );
      } catch (error) {
        if (!wire.movedAway(error)) throw error;
        if (this.bound) {
          await this._reattach(error);
          if (this._lostReason !== null) return undefined;
        }
        remaining = await wire.following(this._adapter, () => this._call(args), {
          key: this._id,
          perTryMs: period,
          untilMono: (this._lastOk !== null ? this._lastOk : sent) + this._ttl,
          what: 'LOCK.SESSION KEEPALIVE',
          stopped: () => this._timer === null,
        });
      }
    }
    if (remaining !== null) this._lastOk = sent;
    return remaining;
  }

  /** End the session (CLOSE): its holds are released with no lock-delay. The number released,
   * or null if the server had no such session (or it was closed or lost already). */
  async close() {
    if (this._id === null || this._closed) return null;
    this._closed = true;
    clearTimeout(this._timer);
    this._timer = null;
    if (this._inFlight !== null) await this._inFlight.catch(() => {});
    const holds = [...this._holds];
    this._holds.clear();
    for (const lock of holds) lock._sessionClosed();
    try {
      return await this._call(['LOCK.SESSION', 'CLOSE', this._id]);
    } finally {
      if (this._conn !== null) this._conn.close();
    }
  }

  /** LOCK.SESSION INFO as an object ({ttl, bound, lockdelay, holds}), or null. */
  async info() {
    if (this._id === null) throw new LockError('the session is not open: call open() first');
    return fields(await this._call(['LOCK.SESSION', 'INFO', this._id]));
  }

  /** A lock of this session was granted; true if the session was lost already. */
  _hold(lock) {
    this._holds.add(lock);
    return this._lostReason !== null;
  }

  _forget(lock) {
    this._holds.delete(lock);
  }

  _lose(reason) {
    if (this._lostReason !== null || this._closed) return;
    this._lostReason = reason;
    clearTimeout(this._timer);
    this._timer = null;
    if (this._conn !== null) this._conn.close(); // the server ends a bound session it still had
    const holds = [...this._holds];
    this._holds.clear();
    if (typeof this.onLost === 'function') {
      try {
        const r = this.onLost(this);
        if (r && typeof r.catch === 'function') r.catch(() => {});
      } catch {
        // each hold hears of it even if the session's callback threw
      }
    }
    for (const lock of holds) lock._lose(`session lost: ${reason}`);
  }
}

module.exports = { Session, MAX_LOCK_DELAY_MS: wire.MAX_LOCK_DELAY_MS, fields };
