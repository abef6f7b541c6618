'use strict';
// redislock-native: the Node client for the redis-lock module (LOCK.ACQUIRE, RELEASE, EXTEND,
// FENCE, INFO, MACQUIRE, MRELEASE), for ioredis 5/6 and node-redis 4/5 clients passed in.
//
// Layout: lib/adapter.js (how commands reach each kind of client; the waiter connections),
// lib/wire.js (owners, times, tokens, the blocking wait and its cancellation, the durable check),
// lib/lock.js (Lock: acquire, release, extend, watchdog, signal), lib/shared.js (Semaphore,
// ReadWriteLock), lib/multi.js (MultiLock), lib/fence.js (fenced writes), lib/session.js
// (Session: LOCK.SESSION and its keepalive), lib/default-session.js (the client's default
// session, which a lock made without `session` joins), lib/feed.js (the change feed: loss reports and
// observers), lib/election.js (Election), lib/errors.js;
// redlock.js is the drop-in for node-redlock.

const { Lock } = require('./lib/lock');
const { Semaphore, ReadLock, ReadWriteLock } = require('./lib/shared');
const { MultiLock } = require('./lib/multi');
const { Session } = require('./lib/session');
const { DEFAULT_SESSION_TTL_MS, DEFAULT_GRACE_MS, closeDefaultSessions } = require('./lib/default-session');
const { Election, Leadership, Observation, watch } = require('./lib/election');
const { FENCE_CHECK_LUA, FENCED_CALL_LUA, fencedCall, fencedScript } = require('./lib/fence');
// LockError and its subclasses: LockLostError, LockBusyError, DurabilityError,
// DurableUnsupportedError, StaleTokenError, TimeoutError.
const errors = require('./lib/errors');

/** One client and default options for every lock made from it; `using` for the common case. */
class Locks {
  constructor(client, defaults = {}) {
    this.client = client;
    this.defaults = defaults;
  }

  lock(name, ttl, options) {
    return new Lock(this.client, name, ttl, { ...this.defaults, ...options });
  }

  semaphore(name, limit, ttl, options) {
    return new Semaphore(this.client, name, limit, ttl, { ...this.defaults, ...options });
  }

  readWrite(name, ttl, options) {
    return new ReadWriteLock(this.client, name, ttl, { ...this.defaults, ...options });
  }

  multi(names, ttl, options) {
    return new MultiLock(this.client, names, ttl, { ...this.defaults, ...options });
  }

  /**
   * `using(name, ttl, [options], fn)`: acquire `name` (waiting up to `options.timeout` ms, no limit
   * by default; `options.signal` cancels the wait), run `fn(signal)` where `signal` aborts if the
   * lock is lost, and release on every exit path. The watchdog is on unless `watchdog: false`.
   */
  using(name, ttl, options, fn) {
    if (typeof options === 'function') [options, fn] = [{}, options];
    const { timeout, signal, ...rest } = options || {};
    const lock = this.lock(name, ttl, { watchdog: true, ...rest });
    return lock.using(fn, { timeout, signal });
  }
}

module.exports = {
  Locks,
  Lock,
  Semaphore,
  ReadLock,
  ReadWriteLock,
  MultiLock,
  Session,
  DEFAULT_SESSION_TTL_MS,
  DEFAULT_GRACE_MS,
  closeDefaultSessions,
  Election,
  Leadership,
  Observation,
  watch,
  fencedCall,
  fencedScript,
  FENCE_CHECK_LUA,
  FENCED_CALL_LUA,
  ...errors,
};
