'use strict';
// Lock: an exclusive lock held on the server. Semaphore, ReadLock and MultiLock (in their own
// files) change only the commands it sends.

const { adapt, isReplyError } = require('./adapter');
const wire = require('./wire');
const { LockLostError, LockBusyError, DurabilityError } = require('./errors');
const { fencedCall } = require('./fence');
const { feedFor } = require('./feed');
const defaults = require('./default-session');

/** How long `durable` waits for replicas unless `durableTimeout` says otherwise, in ms. */
const DEFAULT_DURABLE_TIMEOUT_MS = 1000;

class Lock {
  /**
   * `new Lock(client, name, ttl, options)` takes nothing yet; `acquire()` does. `ttl` is the hold
   * time in milliseconds (with a `session`, 0: no deadline of its own). Without a `session`
   * option (and without `lockDelay`) the hold also joins the client's default session
   * (lib/default-session.js) and keeps its ttl; `session: null`: the ttl alone. Options: `owner`,
   * `watchdog`, `watchdogPeriod`, `onLost`, `feed`, `session`, `lockDelay`, `durable`,
   * `durableTimeout` (see index.d.ts and the README).
   */
  constructor(client, name, ttl, options = {}) {
    this.client = client;
    this._adapter = adapt(client);
    this.name = name;
    const explicit = options.session !== undefined && options.session !== null;
    /**
     * Not given: the hold also joins the client's default session (lib/default-session.js),
     * keeping its own ttl; not with a lockDelay, which in a session is the session's. `null`: the
     * hold lives by its ttl alone.
     */
    this._joinsDefault = options.session === undefined && options.lockDelay === undefined;
    /** The session the hold is in: the given one, the default one once acquired, or undefined. */
    this.session = explicit ? options.session : undefined;
    if (explicit && options.watchdog) {
      throw new RangeError("a lock in a session runs no watchdog: the session's keepalive covers it");
    }
    if (explicit && options.lockDelay !== undefined) {
      throw new RangeError("a lock in a session has its session's lockDelay");
    }
    // In an explicit session a ttl of 0 means no deadline of the hold's own.
    this._ttl = wire.toMs(ttl, 'ttl', explicit);
    this._delay = wire.toLockDelay(options.lockDelay);
    this.owner = options.owner !== undefined ? String(options.owner) : wire.newOwner();
    if (this.owner.length === 0) throw new RangeError('owner must not be empty');
    this.watchdog = Boolean(options.watchdog);
    this.watchdogPeriod =
      options.watchdogPeriod !== undefined ? wire.toMs(options.watchdogPeriod, 'watchdogPeriod') : undefined;
    if (this.watchdogPeriod !== undefined && this.watchdogPeriod >= this._ttl) {
      throw new RangeError('watchdogPeriod must be shorter than the ttl');
    }
    this.onLost = options.onLost;
    /** With onLost: watch the key through the client's change feed while held (lib/feed.js). */
    this.feed = options.feed === undefined ? true : Boolean(options.feed);
    this._feedSub = null;
    this.durable = options.durable === undefined ? 0 : options.durable;
    if (!Number.isInteger(this.durable) || this.durable < 0) {
      throw new RangeError(`durable must be a whole number of replicas, got ${String(options.durable)}`);
    }
    this.durableTimeout =
      options.durableTimeout !== undefined
        ? wire.toMs(options.durableTimeout, 'durableTimeout')
        : DEFAULT_DURABLE_TIMEOUT_MS;
    this._token = null;
    this._lostReason = null;
    this._controller = null;
    this._deadlineTimer = null;
    this._dog = null;
  }

  /** The fencing token of the current hold (an exact number), or null when not held. */
  get token() {
    return this._token;
  }

  /** The hold time in ms that acquire, extend() and the watchdog ask for. */
  get ttl() {
    return this._ttl;
  }

  /**
   * ms nobody is granted what this hold had once it expired (`LOCKDELAY`; undefined: none). A
   * release is clean: no delay.
   */
  get lockDelay() {
    return this._delay;
  }

  /** Aborts when the current hold is lost (renewal answered 0 or failed, ttl ran out). */
  get signal() {
    if (this._controller === null) {
      throw new Error(`${JSON.stringify(this.name)} is not held: acquire it first`);
    }
    return this._controller.signal;
  }

  get lost() {
    return this._lostReason !== null;
  }

  /**
   * "not held", "extend failed: <error>" or "expired" (the watchdog and the ttl); "session lost:
   * <the session's lostReason>"; from the change feed "feed: <event>" (released, expired, lost,
   * deleted, flushed, swapped, demoted), `feed: acquired to "OWNER"` / `feed: handoff to "OWNER"`
   * (the owner as JSON), "feed: not held (LOCK.INFO)", "deadline passed: no renewal succeeded" or
   * "feed connection lost: <error>"; null while not lost.
   */
  get lostReason() {
    return this._lostReason;
  }

  // --- the commands (what the other kinds change) ---

  /** Send `args` through the user's client (routed by the lock's first key in a cluster). */
  _call(args) {
    return this._adapter.call(args, this._keys()[0]);
  }

  /** The keys the lock lives on (the first routes the command in a cluster). */
  _keys() {
    return [this.name];
  }

  _modeArgs() {
    return [];
  }

  /** `SESSION id` for a lock in a session (LockError if the session cannot take holds). */
  _sessionArgs() {
    return this.session === undefined ? [] : ['SESSION', this.session._usableId()];
  }

  /** `LOCKDELAY ms` for a plain hold given a lockDelay. */
  _delayArgs() {
    return this._delay === undefined ? [] : ['LOCKDELAY', this._delay];
  }

  _acquireArgs(blockMs) {
    const args = ['LOCK.ACQUIRE', this.name, this.owner, this._ttl, ...this._modeArgs(), ...this._sessionArgs(), ...this._delayArgs()];
    return blockMs === undefined ? args : [...args, 'BLOCK', blockMs];
  }

  /** The keys and tokens the change feed watches for this hold. */
  _feedTokens() {
    return new Map([[this.name, this._token]]);
  }

  /** True if the hold may share its key (another owner's grant does not end it). */
  _shared() {
    return this._modeArgs().includes('SHARED');
  }

  _releaseArgs() {
    return ['LOCK.RELEASE', this.name, this.owner];
  }

  _extendArgs() {
    return ['LOCK.EXTEND', this.name, this.owner, this._ttl];
  }

  _renewed(reply) {
    return reply === 1;
  }

  _released(reply) {
    return reply === 1;
  }

  /** Drop the record of a hold (it was given back). */
  _forget() {
    this._token = null;
  }

  /** Record a grant's reply; the new token. */
  _granted(reply) {
    this._token = wire.toToken(reply);
    return this._token;
  }

  // --- acquire ---

  /**
   * Take the lock; true if granted, false if the wait ran out.
   *
   * `timeout`: how long to wait in the server's queue, in ms (undefined: no limit; 0: one try).
   * `signal`: an AbortSignal that cancels the wait (the call rejects with its reason, and no
   * grant is left behind).
   */
  async acquire({ timeout, signal } = {}) {
    if (signal && signal.aborted) throw wire.abortReason(signal);
    // Before anything else is sent (a default session's OPEN too).
    if (this.durable > 0) await wire.checkDurable(this._adapter, this._keys()[0]);
    if (!this._joinsDefault) return this._acquire({ timeout, signal });
    // In the client's default session: if that session ended before or while this call waited
    // (ERR no such session, ERR the session ended while the client waited), try again in a new
    // default session, at the back of the queue, within what is left of `timeout`.
    const ends = timeout === undefined ? null : performance.now() + wire.toMs(timeout, 'timeout', true);
    for (let attempt = 1; ; attempt++) {
      if (signal && signal.aborted) throw wire.abortReason(signal);
      const left = ends === null ? undefined : timeout === 0 ? 0 : Math.max(0, Math.ceil(ends - performance.now()));
      if (this._token === null || this.session === undefined || !this.session._usable()) {
        const session = await defaults.sessionFor(this.client, this._keys()[0]);
        if (this.session !== undefined && this.session !== session) {
          this.session._forget(this);
          if (this._token !== null) this._forget(); // that hold ended with its session
        }
        this.session = session;
      }
      try {
        return await this._acquire({ timeout: left, signal });
      } catch (error) {
        if (!defaults.sessionGone(error) || attempt >= defaults.ATTEMPTS) throw error;
        defaults.retire(this.client, this.session);
        this._forget(); // whatever it held there ended with that session
      }
    }
  }

  async _acquire({ timeout, signal } = {}) {
    if (signal && signal.aborted) throw wire.abortReason(signal);
    const key = this._keys()[0];
    const before = this._token;
    const waitMs = timeout === undefined ? null : wire.toMs(timeout, 'timeout', true);
    const cleanup = before !== null ? async () => {} : () => this._call(this._releaseArgs());

    const sent = performance.now();
    let outcome;
    for (let left = waitMs; ; ) {
      try {
        outcome = await this._acquireOnce(key, left, signal, cleanup);
        break;
      } catch (error) {
        // In a cluster, a waiter whose master became a replica (UNBLOCKED, or its connection
        // closed), or a try sent to a node that no longer serves the slot (MOVED, READONLY),
        // was not granted (a grant whose reply was lost was given back): it queues again on the
        // slot's master, within its own timeout (issue 34).
        if (!this._adapter.isCluster || !wire.movedAway(error) || (signal && signal.aborted)) throw error;
        const elapsed = performance.now() - sent;
        if (waitMs === 0 && elapsed >= wire.FOLLOW_TRY_MS) throw error;
        if (waitMs !== null && waitMs !== 0) {
          left = Math.ceil(waitMs - elapsed);
          if (left <= 0) return false;
        }
        await this._adapter.refresh(key);
        await new Promise((resolve) => setTimeout(resolve, wire.FOLLOW_BACKOFF_MS));
      }
    }
    const { reply, acked, blocked } = outcome;
    if (reply === null) return false;
    const token = this._granted(reply);
    if (acked !== undefined && acked < this.durable) {
      await this._notDurable(acked, before !== null && token === before);
    }
    this._held();
    this._watchFeed(blocked ? null : sent);
    return true;
  }

  /**
   * One try on the user's client, then (if it answered nil and `waitMs` is not 0) one
   * LOCK.ACQUIRE ... BLOCK on a connection of its own: `{ reply, acked, blocked }`.
   */
  async _acquireOnce(key, waitMs, signal, cleanup) {
    // One try first, on the user's client: most acquires are granted at once.
    let reply;
    let blocked = false;
    try {
      reply = await this._adapter.callOnKey(key, this._acquireArgs());
    } catch (error) {
      if (!isReplyError(error)) await wire.quietly(cleanup);
      throw error;
    }
    let acked;
    if (reply !== null) {
      if (this.durable > 0) acked = await this._wait((args) => this._adapter.callOnKey(key, args));
    } else if (waitMs !== 0) {
      blocked = true;
      // Then one LOCK.ACQUIRE ... BLOCK on a connection of its own, however long the wait.
      // The try above answered nil, so this object holds nothing there: a grant that raced a
      // cancellation is this call's own, and cleanup may release it.
      reply = await wire.blockingCall(this._adapter, key, this._acquireArgs(waitMs === null ? 0 : waitMs), {
        waitMs,
        signal,
        cleanup: () => this._call(this._releaseArgs()),
        after:
          this.durable > 0
            ? async (_reply, conn) => {
                acked = await this._wait((args) => conn.call(args));
              }
            : undefined,
      });
    }
    return { reply, acked, blocked };
  }

  /** WAIT durable durableTimeout through `call`; how many replicas acknowledged (0 on error). */
  async _wait(call) {
    try {
      return await call(['WAIT', this.durable, this.durableTimeout]);
    } catch (error) {
      this._waitError = error;
      return 0;
    }
  }

  async _notDurable(acked, heldBefore) {
    const wanted = this.durable;
    const what = `${JSON.stringify(this.name)}: ${acked} of ${wanted} replicas acknowledged the grant within ${this.durableTimeout} ms`;
    const cause = this._waitError;
    this._waitError = undefined;
    if (heldBefore) {
      // An idempotent retry of a hold this object already had: leave that hold alone.
      throw new DurabilityError(`${what}; the hold this lock already had is kept`, {
        acknowledged: acked,
        wanted,
        released: false,
        heldBefore: true,
        mayStayHeld: false,
      }, { cause });
    }
    this._forget();
    let released;
    try {
      await this._call(this._releaseArgs());
      released = true;
    } catch (error) {
      throw new DurabilityError(
        `${what}; releasing it failed too (${error.message}): the lock may stay held until its ttl (${this._ttl} ms) runs out`,
        { acknowledged: acked, wanted, released: false, heldBefore: false, mayStayHeld: true },
        { cause: error }
      );
    }
    throw new DurabilityError(`${what}; the grant was released`, {
      acknowledged: acked,
      wanted,
      released,
      heldBefore: false,
      mayStayHeld: false,
    }, { cause });
  }

  /** A grant arrived: a fresh signal for this hold, its deadline, the watchdog. */
  _held() {
    if (this._controller === null || this._controller.signal.aborted) {
      this._controller = new AbortController();
    }
    this._lostReason = null;
    if (this._ttl > 0) this._armDeadline(Date.now() + this._ttl);
    if (this.watchdog) this._startWatchdog();
    if (this.session !== undefined && this.session._hold(this)) {
      this._lose(`session lost: ${this.session.lostReason}`);
    }
  }

  // --- the change feed: a loss reported at once (lib/feed.js) ---

  /**
   * After a grant: watch the key through the client's feed if a loss callback wants it. `sent`:
   * when a single try was sent (its grant is no older); null for a blocking grant, whose moment
   * is unknown (the feed's first state read gives the deadline).
   */
  _watchFeed(sent) {
    if (this._feedSub !== null) {
      if (sent !== null) this._renewedFeed(sent); // an idempotent retry moved the deadline
      return;
    }
    if (typeof this.onLost !== 'function' || !this.feed || this._lostReason !== null) return;
    const deadline = sent !== null && this._ttl > 0 ? { sentAt: sent, ttl: this._ttl } : null;
    this._feedSub = feedFor(this.client, this._keys()[0]).hold(this, this._feedTokens(), this._shared(), deadline);
  }

  _unwatchFeed() {
    const sub = this._feedSub;
    this._feedSub = null;
    if (sub !== null) sub.feed.drop(sub);
  }

  /** A renewal sent at `sent` (performance.now()) succeeded: the feed's deadline moves. */
  _renewedFeed(sent) {
    if (this._feedSub !== null && this._ttl > 0) this._feedSub.feed.renewed(this._feedSub, sent, this._ttl);
  }

  /** The feed found this hold lost: stop renewing, report once. */
  _feedLost(sub, reason) {
    if (sub !== this._feedSub) return;
    this._feedSub = null;
    this._lose(reason);
  }

  /** Its session was closed: the server released the hold cleanly; nothing to report. */
  _sessionClosed() {
    this._stopWatchdogNow();
    this._unwatchFeed();
    clearTimeout(this._deadlineTimer);
    this._forget();
  }

  /** The signal aborts at `at` unless an extend moves it (a hold sent at t lasts until t + ttl). */
  _armDeadline(at) {
    clearTimeout(this._deadlineTimer);
    this._deadlineTimer = setTimeout(() => this._lose('expired'), Math.max(0, at - Date.now()));
    this._deadlineTimer.unref();
  }

  _lose(reason) {
    if (this._token === null || this._lostReason !== null) return;
    this._lostReason = reason;
    clearTimeout(this._deadlineTimer);
    this._stopWatchdogNow();
    this._unwatchFeed();
    if (this.session !== undefined) this.session._forget(this);
    const error = new LockLostError(`lost ${JSON.stringify(this.name)}: ${reason}`, reason);
    this._controller.abort(error);
    if (typeof this.onLost === 'function') {
      try {
        const r = this.onLost(this, error);
        if (r && typeof r.catch === 'function') r.catch(() => {});
      } catch {
        // a throwing callback must not stop the others
      }
    }
  }

  // --- release, extend, queries ---

  /** Give the lock back; true if this owner held it, false if it was already lost. */
  async release() {
    await this._stopWatchdog();
    clearTimeout(this._deadlineTimer);
    this._unwatchFeed();
    if (this.session !== undefined) this.session._forget(this);
    this._forget();
    return this._released(await this._call(this._releaseArgs()));
  }

  /**
   * Set the deadline to now + `ttl` ms (default: the lock's ttl, which a given `ttl` replaces,
   * also for the watchdog). True if held; false if lost (the signal aborts): acquire again.
   */
  async extend(ttl) {
    if (ttl !== undefined) this._ttl = wire.toMs(ttl, 'ttl');
    const sent = Date.now();
    const sentMono = performance.now();
    const held = this._renewed(await this._call(this._extendArgs()));
    if (held && this._token !== null && this._lostReason === null) {
      if (this._ttl > 0) this._armDeadline(sent + this._ttl);
      this._renewedFeed(sentMono);
    }
    if (!held) this._lose('not held');
    return held;
  }

  /** True if anyone holds the lock (LOCK.FENCE key; works on replicas too). */
  async locked() {
    return (await this._call(['LOCK.FENCE', this.name])) !== null;
  }

  /** True if this object's hold is the live one (LOCK.FENCE key token). */
  async owned() {
    if (this._token === null) return false;
    return (await this._call(['LOCK.FENCE', this.name, this._token])) === 1;
  }

  /** Run `command key ...args` only while this hold is live; else StaleTokenError. */
  fenced(command, key, ...args) {
    return fencedCall(this.client, this.name, this._token, command, key, ...args);
  }

  /**
   * Acquire (waiting as `acquire` does, `timeout` and `signal` as there), run `fn(signal)` with
   * this hold's signal, and release on every exit path. A wait that runs out rejects with
   * LockBusyError; `fn`'s own result or error is passed on.
   */
  async using(fn, { timeout, signal } = {}) {
    if (!(await this.acquire({ timeout, signal }))) {
      throw new LockBusyError(`could not acquire ${JSON.stringify(this.name)} within ${timeout} ms`);
    }
    try {
      return await fn(this.signal);
    } finally {
      await this.release().catch(() => {});
    }
  }

  // --- watchdog ---

  _period() {
    return this.watchdogPeriod !== undefined ? this.watchdogPeriod : Math.max(1, Math.floor(this._ttl / 3));
  }

  _startWatchdog() {
    if (this._dog !== null) return;
    const dog = { timer: null, inFlight: null, stopped: false, lastOk: performance.now() };
    this._dog = dog;
    const tick = () => {
      dog.timer = setTimeout(() => {
        const sent = Date.now();
        const sentMono = performance.now();
        const period = this._period();
        // In a cluster a renewal that meets a failover is sent again to the slot's master until
        // the hold's deadline from the last renewal (issue 34).
        dog.inFlight = wire
          .following(this._adapter, () => this._call(this._extendArgs()), {
            key: this._keys()[0],
            perTryMs: period,
            untilMono: (dog.lastOk !== undefined ? dog.lastOk : sentMono) + this._ttl,
            what: 'LOCK.EXTEND',
            stopped: () => dog.stopped,
          })
          .then(
            (reply) => {
              if (dog.stopped) return;
              if (!this._renewed(reply)) return this._lose('not held');
              dog.lastOk = sentMono;
              this._armDeadline(sent + this._ttl);
              this._renewedFeed(sentMono);
              tick();
            },
            (error) => {
              if (!dog.stopped) this._lose(`extend failed: ${error.message}`);
            }
          );
      }, this._period());
      dog.timer.unref();
    };
    tick();
  }

  _stopWatchdogNow() {
    const dog = this._dog;
    this._dog = null;
    if (dog !== null) {
      dog.stopped = true;
      clearTimeout(dog.timer);
    }
    return dog;
  }

  /** Stop renewing; once this resolves, no renewal is in flight and none will follow. */
  async _stopWatchdog() {
    const dog = this._stopWatchdogNow();
    if (dog !== null && dog.inFlight !== null) await dog.inFlight.catch(() => {});
  }
}

module.exports = { Lock, DEFAULT_DURABLE_TIMEOUT_MS };
