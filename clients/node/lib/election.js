'use strict';
// Leader election on one lock key, as the Python package's election.py and the Rust crate's
// election.rs.
//
// A candidate campaigns with `LOCK.ACQUIRE name value ttl BLOCK ...`: it waits in the key's FIFO
// queue, one command, and leads once granted. The owner is the candidate's *value* (what the
// leader publishes about itself: an address, an id), so candidates keep their values unique; the
// *term* is the grant's fencing token, larger for every new leader, so a deposed leader's fenced
// writes are refused. A leadership is an ordinary Lock with a watchdog (or, with `session`, a
// hold of the session: a bound session ends the moment the leader's process dies, and the next
// candidate leads within milliseconds), watched through the change feed (lib/feed.js), so
// `onLost` tells the leader at once that it does not lead any more.
//
// `leader()` reads LOCK.INFO. `observe()` follows the key's feed: every change of leader, null
// when nobody leads, and after a reconnect or a gap in the feed's sequence numbers the state
// read again, marked `resync: true`.

const { adapt } = require('./adapter');
const { Lock } = require('./lock');
const { feedFor, parseInfo } = require('./feed');
const { fencedCall } = require('./fence');
const { TimeoutError } = require('./errors');

/** A leadership's hold time without a session, in ms (renewed by its watchdog every third). */
const DEFAULT_TTL_MS = 10000;

class Leadership {
  constructor(lock) {
    this.lock = lock;
    this.term = null; // set once granted
  }

  /** What this leader published (its owner string). */
  get value() {
    return this.lock.owner;
  }

  get lost() {
    return this.lock.lost;
  }

  get lostReason() {
    return this.lock.lostReason;
  }

  /** Aborts when this leadership is found gone. */
  get signal() {
    return this.lock.signal;
  }

  /** `command key ...args`, run only while this term is the live one; else StaleTokenError. */
  fenced(command, key, ...args) {
    return fencedCall(this.lock.client, this.lock.name, this.term, command, key, ...args);
  }

  /** Step down (LOCK.RELEASE): the next candidate leads. True if this leadership was live. */
  resign() {
    return this.lock.release();
  }
}

/**
 * The changes of one election (or of any lock's holder, `watch(client, name)`): an async iterator
 * (`for await (const change of observation)`, `next()` resolving `{value, done}` as the iterator
 * protocol defines), and `get(timeout)` resolving the change itself.
 */
class Observation {
  constructor(feed, observer) {
    this._feed = feed;
    this._observer = observer;
    this._closed = false;
  }

  /**
   * The next change, `{leader: {value, term} | null, resync, seq}`; rejects with a TimeoutError
   * (code 'ETIMEDOUT') if none came within `timeout` ms (undefined: no limit).
   */
  async get(timeout) {
    const item = this._observer.next();
    let timer;
    const result =
      timeout === undefined
        ? await item
        : await Promise.race([
            item,
            new Promise((_, reject) => {
              timer = setTimeout(() => reject(new TimeoutError(`no leadership change within ${timeout} ms`)), timeout);
            }),
          ]).finally(() => clearTimeout(timer));
    if (result instanceof Error) throw result;
    return result;
  }

  /**
   * The iterator protocol's `next()`: `{value: change, done: false}`, or `{value: undefined, done:
   * true}` once closed. `timeout` (ms) as for `get`.
   */
  async next(timeout) {
    if (this._closed) return { value: undefined, done: true };
    return { value: await this.get(timeout), done: false };
  }

  /** The iterator protocol's `return()`: closes the observation. */
  async return() {
    this.close();
    return { value: undefined, done: true };
  }

  close() {
    if (this._closed) return;
    this._closed = true;
    this._observer.feed.drop(this._observer); // its feed now: a failover may have moved it
  }

  [Symbol.asyncIterator]() {
    return this;
  }
}

/**
 * Every change of the exclusive holder of any lock `name`: an Observation whose changes are those
 * of `Election.observe()`, `leader` being the holder (`{value: owner, term: token}`) or null when
 * nobody holds it. The first is the state when it started. Close it when done.
 */
function watch(client, name) {
  return new Election(client, name).observe();
}

class Election {
  /**
   * Leader election on the lock key `name`. Options: `ttl` (ms a leadership lasts unless renewed;
   * default 10000, renewed by its watchdog every `watchdogPeriod`, default ttl/3; with `session`
   * default 0: the session's keepalive covers it), `session` (a Session the leadership is held
   * in; `bound: true` for a takeover within milliseconds of the leader's death).
   */
  constructor(client, name, options = {}) {
    this.client = client;
    this._adapter = adapt(client);
    this.name = name;
    // undefined: the client's default session (lib/default-session.js), with the leadership's
    // own ttl and watchdog on top; null: the ttl and watchdog alone; a Session: the session's.
    this.session = options.session;
    const explicit = this.session !== undefined && this.session !== null;
    this.ttl = options.ttl !== undefined ? options.ttl : explicit ? 0 : DEFAULT_TTL_MS;
    this.watchdogPeriod = options.watchdogPeriod;
    this._leadership = null;
  }

  /**
   * Wait in the queue until this candidate leads; its Leadership, or null if `timeout` ms passed
   * first (undefined: no limit; `signal` cancels the wait). `value` becomes the owner: keep it
   * unique among candidates. `onLost(leadership, error)` is called once when it is found gone.
   */
  async campaign(value, { timeout, signal, onLost } = {}) {
    let leadership;
    const options = {
      owner: value,
      session: this.session,
      onLost: (_lock, error) => {
        if (typeof onLost === 'function') return onLost(leadership, error);
      },
    };
    if (this.session === undefined || this.session === null) {
      Object.assign(options, { watchdog: true, watchdogPeriod: this.watchdogPeriod });
    }
    const lock = new Lock(this.client, this.name, this.ttl, options);
    leadership = new Leadership(lock);
    if (!(await lock.acquire({ timeout, signal }))) return null;
    leadership.term = lock.token;
    this._leadership = leadership;
    return leadership;
  }

  /** Step down from the last leadership this object won; false if it was not live. */
  async resign() {
    const leadership = this._leadership;
    this._leadership = null;
    return leadership !== null && (await leadership.resign());
  }

  /** Who leads now (LOCK.INFO): `{value, term}`, or null. */
  async leader() {
    const state = parseInfo(await this._adapter.callOnKey(this.name, ['LOCK.INFO', this.name]));
    const h = state.holders[0];
    return h === undefined ? null : { value: h.owner, term: h.token };
  }

  /**
   * An Observation of the leadership changes; the first is the state when it started (read from
   * LOCK.INFO, `resync: true`). Close it (or break out of `for await`) when done.
   */
  observe() {
    const feed = feedFor(this.client, this.name);
    return new Observation(feed, feed.observe(this.name));
  }
}

module.exports = { Election, Leadership, Observation, watch, DEFAULT_TTL_MS };
