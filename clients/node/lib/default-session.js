'use strict';
// The client's default session: what a lock made without `session` joins (issue 29), as the
// Python package's default_session.py.
//
// Every Lock, Semaphore, ReadWriteLock side, MultiLock and Election made without a `session`
// option holds in its client's *default session*: one BOUND session per client object and server
// (per master of the keys for a cluster client, opened there with `key`), opened by the first
// acquire that needs it, kept alive by one keepalive timer for all its holds. So a process that
// dies (exits, crashes, `kill -9`) frees everything it held the moment the server sees its
// connection close (plus the grace below), instead of when each hold's ttl runs out.
//
// Nothing else changes for the lock: it sends its own ttl as well as `SESSION id`
// (`LOCK.ACQUIRE key owner ttl-ms SESSION id`), so the hold keeps its own deadline, and
// `watchdog`, `extend()` and `durable` work as without a session. `session: null` keeps the
// TTL-only behaviour exactly; `lockDelay` also means no default session (a session's lock-delay is
// the session's, one for all its holds, and a hold in a session cannot have its own: such a lock
// holds by its ttl alone, as before).
//
// The session:
// - ttl DEFAULT_SESSION_TTL_MS (10 s), a keepalive every third: the bound for a holder whose
//   *host* vanished without closing its connection (the server learns of that only from TCP). A
//   process that dies on a live host has its connection closed by the kernel at once.
// - `GRACE` DEFAULT_GRACE_MS (500 ms): opened as `LOCK.SESSION OPEN ttl BOUND GRACE ms`. When its
//   connection drops while the process lives (`CLIENT KILL`, a proxy or the network closing it),
//   the server keeps the session that long, and the client, which watches that connection for
//   its close, binds the session to a new one (`LOCK.SESSION ATTACH`): every hold is kept. If
//   ATTACH answers nil, or no ATTACH succeeded within the grace, each hold reports the loss as
//   with an explicit session (`lostReason` "session lost: ...", `onLost`); the next acquire opens
//   a new session. A server that answers GRACE with a syntax error (a module without it) gets the
//   OPEN without it, remembered per client and node: there a blip ends the session.
// - Closed (`LOCK.SESSION CLOSE`: every hold released at once, no lock-delay) when the client is
//   closed: the client object's own `quit()`, `disconnect()` (and node-redis's `close()`,
//   `destroy()`) close its default sessions first (only that object's methods are wrapped, never
//   the class's); not its 'end' event, which a dead server causes too. Its connection and timers are unref()ed: a
//   default session never keeps the process alive; a process that exits without closing its
//   client has the connection closed by the kernel, and the server ends the session after the
//   grace.
// - Seen like any bound session: `LOCK.SESSION LIST` (one entry per client and node), `INFO lock`
//   (`lock_sessions`), and `CLIENT LIST` shows its connection as `name=redislock-session-<serial>`.

const { adapt, isReplyError, IOREDIS_CLUSTER } = require('./adapter');
const { Session } = require('./session');
const { slotOf } = require('./slot');
const wire = require('./wire');

/** The default session's ttl in ms; the keepalive runs every third. */
const DEFAULT_SESSION_TTL_MS = 10000;

/**
 * ms the server keeps the default session after its bound connection dropped (`BOUND GRACE ms`),
 * for the client to re-ATTACH it; also how much longer than the close of a killed holder's
 * connection its holds stay taken.
 */
const DEFAULT_GRACE_MS = 500;

/** How many times an acquire in the default session is made when the session ended under it. */
const ATTEMPTS = 3;

/** Whether an acquire's error says its session ended (before it, or while it waited). */
function sessionGone(error) {
  const text = String(error && error.message);
  return /no such session/.test(text) || /session ended while the client waited/.test(text);
}

/** The server's answer to GRACE from a module that does not know it. */
function refusesGrace(error) {
  return isReplyError(error) && /syntax/i.test(error.message) && /GRACE/.test(error.message);
}

class DefaultSession extends Session {
  constructor(client, sessions, node, key) {
    super(client, DEFAULT_SESSION_TTL_MS, { bound: true, key });
    this._sessions = sessions;
    this._node = node;
    /** null: no grace (the module has none, or DEFAULT_GRACE_MS is 0): a blip ends the session. */
    this.grace = sessions.noGrace.has(node) || module.exports.DEFAULT_GRACE_MS <= 0 ? null : module.exports.DEFAULT_GRACE_MS;
  }

  _openArgs() {
    const args = super._openArgs();
    if (this.grace !== null) args.push('GRACE', this.grace);
    return args;
  }

  async open() {
    try {
      await super.open();
    } catch (error) {
      if (this.grace === null || !refusesGrace(error)) throw error;
      this._sessions.noGrace.add(this._node);
      this.grace = null;
      await super.open();
    }
    if (this._conn !== null) this._conn.unref();
    return this;
  }

  _attach(conn) {
    super._attach(conn);
    if (this._id !== null) conn.unref();
  }

  _reattaches(error) {
    return this.grace !== null || super._reattaches(error);
  }

  /**
   * After a blip on one server: the grace, counted from now (the close was seen at once), so the
   * session is reported lost no later than the server may have ended it. A cluster's failover
   * keeps the session's ttl (a promoted replica keeps it unbound).
   */
  _attachUntil() {
    if (this._adapter.isCluster || this.grace === null) return super._attachUntil();
    return performance.now() + this.grace;
  }

  /**
   * LOCK.SESSION CLOSE on the bound connection, waiting at most a keepalive period; never rejects.
   * Without an answer the connection is closed all the same, and the server ends the session after
   * its grace.
   */
  async end() {
    try {
      await wire.withTimeout(this.close(), this._period(), 'LOCK.SESSION CLOSE');
    } catch {
      if (this._conn !== null) this._conn.close();
    }
  }
}

/** The registry key of `key`'s node: its master's address in a cluster, '' for one server. */
function nodeOf(adapter, key) {
  if (!adapter.isCluster) return '';
  if (typeof adapter.node === 'function') {
    const node = adapter.node(key); // ioredis Cluster
    return `${node.options.host}:${node.options.port}`;
  }
  const master = adapter.client.getSlotMaster(slotOf(key)); // node-redis cluster
  if (master === undefined) return '';
  return String(master.address || master.id || `${master.host}:${master.port}`);
}

/** The default sessions of one client object, by node. */
class Sessions {
  constructor(client) {
    this.client = client;
    this.adapter = adapt(client);
    this.noGrace = new Set(); // nodes that answered GRACE with a syntax error
    this.byNode = new Map(); // node -> a DefaultSession, or the promise of one being opened
    this.retired = []; // sessions an acquire found gone before the client did
  }

  /** The usable default session for `key`'s node, opened if needed (one open per node at a time). */
  async get(key) {
    if (this.adapter.kind === IOREDIS_CLUSTER && this.client.status !== 'ready') {
      await this.adapter._ready(); // the slot table, for the node
    }
    for (;;) {
      const node = nodeOf(this.adapter, key);
      const entry = this.byNode.get(node);
      if (entry instanceof DefaultSession && entry._usable()) return entry;
      if (entry !== undefined && !(entry instanceof DefaultSession)) {
        await entry.catch(() => {});
        continue;
      }
      if (entry !== undefined) this.retired.push(entry);
      const session = new DefaultSession(this.client, this, node, key);
      const opening = session.open().then(
        () => {
          if (this.byNode.get(node) === opening) this.byNode.set(node, session);
          return session;
        },
        (error) => {
          if (this.byNode.get(node) === opening) this.byNode.delete(node);
          throw error;
        }
      );
      this.byNode.set(node, opening);
      return opening;
    }
  }

  /** An acquire was told `session` is gone: the next one opens a new session. */
  retire(session) {
    for (const [node, s] of this.byNode) {
      if (s === session) {
        this.byNode.delete(node);
        this.retired.push(session);
      }
    }
  }

  /** Close every default session (the client is being closed). */
  async close() {
    const entries = [...this.byNode.values(), ...this.retired];
    this.byNode.clear();
    this.retired = [];
    await Promise.all(
      entries.map(async (entry) => {
        const session = entry instanceof DefaultSession ? entry : await entry.catch(() => null);
        if (session !== null) await session.end();
      })
    );
  }
}

const all = new WeakMap(); // client object -> Sessions

/** The methods that close a client, per library; each is wrapped on the client object itself. */
const CLOSERS = ['quit', 'disconnect', 'close', 'destroy'];

function sessionsOf(client) {
  let sessions = all.get(client);
  if (sessions === undefined) {
    sessions = new Sessions(client);
    all.set(client, sessions);
    wrapClose(client, sessions);
  }
  return sessions;
}

/**
 * Make the client object's own close methods close its default sessions first (`quit()` waits
 * for the CLOSE replies; `disconnect()` and the others, synchronous in some libraries, start them
 * and go on). Only this object's: its class is untouched.
 */
function wrapClose(client, sessions) {
  for (const name of CLOSERS) {
    const original = client[name];
    if (typeof original !== 'function') continue;
    const wrapped =
      name === 'quit'
        ? async function quit(...args) {
            await sessions.close();
            return original.apply(this, args);
          }
        : function (...args) {
            // ioredis's disconnect(true) reconnects: not a close.
            if (!(name === 'disconnect' && args[0] === true)) sessions.close();
            return original.apply(this, args);
          };
    try {
      client[name] = wrapped;
    } catch {
      // a read-only method: closeDefaultSessions(client) closes them
    }
  }
  // Not on the client's 'end' event: a client also ends when its server goes away (no retry
  // strategy), and closing the sessions then would end them quietly, so their holds' loss would
  // never be reported (seen: feed.test.js "a stopped server ..." on every server). The sessions'
  // own connections see that loss and report it.
}

/** The default session of `client` for `key`'s node, opened if needed. */
function sessionFor(client, key) {
  return sessionsOf(client).get(key);
}

/** `Sessions.retire` for `client`'s default sessions. */
function retire(client, session) {
  const sessions = all.get(client);
  if (sessions !== undefined) sessions.retire(session);
}

/**
 * Close the default sessions of `client` now (closing the client does it too); the next lock
 * acquired through it opens a new one.
 */
async function closeDefaultSessions(client) {
  const sessions = all.get(client);
  if (sessions !== undefined) await sessions.close();
}

module.exports = {
  DEFAULT_SESSION_TTL_MS,
  DEFAULT_GRACE_MS,
  ATTEMPTS,
  DefaultSession,
  sessionGone,
  sessionFor,
  retire,
  closeDefaultSessions,
};
