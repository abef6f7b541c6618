'use strict';
// A drop-in for node-redlock's v5 API as its README documents it: `new Redlock([client, ...],
// settings)`, `acquire(resources, duration)`, `release(lock)`, `extend(lock, duration)`,
// `using(resources, duration, [settings], routine)`, `lock.release()`, `lock.extend(duration)`,
// the "error" event, ResourceLockedError and ExecutionError (and v4's `lock`/`unlock`). Switch by
// changing the import:
//
//     import Redlock from "redislock-native/redlock";
//     const { default: Redlock } = require("redislock-native/redlock");
//
// Underneath, the module's commands instead of scripts over SET NX:
//
// - One client: every resource in one LOCK.MACQUIRE, all or none. While the resources are held,
//   the retry window (retryCount x retryDelay ms; retryCount -1: no limit) is spent as one
//   LOCK.MACQUIRE ... BLOCK in the server's FIFO queue, on a connection of its own, instead of
//   polling: the lock goes to the first waiter when it is released, not to whoever polls next.
// - Several clients (independent masters): the Redlock algorithm, as the module's Rust client
//   does it (clients/rust/src/redlock.rs): LOCK.MACQUIRE on every master at once, granted when a
//   majority (N/2 + 1) granted it and validity time is left (duration - elapsed - drift, drift =
//   driftFactor x duration + 2 ms); otherwise released everywhere and retried after
//   retryDelay +- retryJitter ms, up to retryCount times.
//
// Differences from node-redlock, all visible only through the module: the lock keys hold the
// module's type (GET on them answers WRONGTYPE; a resource whose key holds anything else counts
// as locked, as in node-redlock), `scripts` (the third constructor argument) is
// accepted and ignored, a release or extend that a master refused outright (not held there) is
// not retried, `using`'s extension loop stops when the routine ends, and an extension that finds
// the lock expired rejects instead of throwing out of a timer.

const crypto = require('node:crypto');
const { EventEmitter } = require('node:events');
const { adapt, isReplyError } = require('./lib/adapter');
const wire = require('./lib/wire');

const defaultSettings = Object.freeze({
  driftFactor: 0.01,
  retryCount: 10,
  retryDelay: 200,
  retryJitter: 100,
  automaticExtensionThreshold: 500,
});

const QUORUM_FAILED = 'The operation was unable to achieve a quorum during its retry window.';

/** A master answered that one or more of the resources is held by someone else. */
class ResourceLockedError extends Error {
  constructor(message) {
    super(message);
    this.name = 'ResourceLockedError';
  }
}

/** An operation did not pass with a quorum; `attempts` resolve to each attempt's stats. */
class ExecutionError extends Error {
  constructor(message, attempts) {
    super(message);
    this.name = 'ExecutionError';
    this.attempts = attempts;
  }
}

/** A held lock: `release()` and `extend(duration)` call the Redlock's. */
class Lock {
  constructor(redlock, resources, value, attempts, expiration, tokens = []) {
    this.redlock = redlock;
    this.resources = resources;
    /** The owner string, the same on every master. */
    this.value = value;
    this.attempts = attempts;
    /** When the lock's validity ends (ms since the epoch, this process's clock); 0 once released. */
    this.expiration = expiration;
    /** The module's fencing tokens: per client (in the order given), one per resource, or null. */
    this.tokens = tokens;
  }

  release() {
    return this.redlock.release(this);
  }

  extend(duration) {
    return this.redlock.extend(this, duration);
  }

  /** node-redlock v4's name for release(). */
  unlock() {
    return this.release();
  }
}

function checkDuration(duration) {
  if (Math.floor(duration) !== duration) {
    throw new Error('Duration must be an integer value in milliseconds.');
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

const lockedError = (n) => new ResourceLockedError(`The operation was applied to: 0 of the ${n} requested resources.`);

/**
 * A `WRONGTYPE` reply: a resource's key holds something other than a lock (a string, a hash...).
 * node-redlock's script counts any existing key as held, so that is a ResourceLockedError vote
 * here too; any other error is returned as it is.
 */
function asLocked(error, n) {
  return isReplyError(error) && /^WRONGTYPE\b/.test(error.message) ? lockedError(n) : error;
}

class Redlock extends EventEmitter {
  constructor(clients, settings = {}, _scripts = {}) {
    super();
    // As node-redlock: an "error" event without listeners must not crash the process.
    this.on('error', () => {});
    this.clients = new Set(clients);
    if (this.clients.size === 0) {
      throw new Error('Redlock must be instantiated with at least one redis client.');
    }
    this._members = [...this.clients].map((client) => ({ client, adapter: adapt(client) }));
    this.settings = {};
    for (const name of Object.keys(defaultSettings)) {
      this.settings[name] = typeof settings[name] === 'number' ? settings[name] : defaultSettings[name];
    }
  }

  /** `quit()` on every client. */
  async quit() {
    await Promise.all([...this.clients].map((client) => client.quit()));
  }

  _settings(overrides) {
    return overrides ? { ...this.settings, ...overrides } : this.settings;
  }

  _drift(settings, duration) {
    return Math.round(settings.driftFactor * duration) + 2;
  }

  /** Lock `resources` for `duration` ms on a quorum of the clients. */
  async acquire(resources, duration, overrides) {
    checkDuration(duration);
    const settings = this._settings(overrides);
    const value = crypto.randomBytes(16).toString('hex');
    const macquire = ['LOCK.MACQUIRE', resources.length, ...resources, value, duration];
    const mrelease = ['LOCK.MRELEASE', resources.length, ...resources, value];
    if (this._members.length === 1) return this._acquireOne(resources, duration, settings, value, macquire, mrelease);

    const tokens = new Array(this._members.length).fill(null);
    const perClient = async (member, i) => {
      let reply;
      try {
        // Not sent again after a MOVED/ASK: the round may release before this reply comes.
        reply = await member.adapter.call(macquire, resources[0], { redirects: false });
      } catch (error) {
        throw asLocked(error, resources.length);
      }
      if (reply === null) throw lockedError(resources.length);
      tokens[i] = reply.map(wire.toToken);
    };
    const attempts = [];
    const maxAttempts = settings.retryCount === -1 ? Infinity : settings.retryCount + 1;
    for (;;) {
      const round = await this._round(perClient);
      if (maxAttempts !== Infinity) attempts.push(round.stats);
      const expiration = round.start + duration - this._drift(settings, duration);
      if (round.vote === 'for' && expiration > Date.now()) {
        return new Lock(this, resources, value, attempts, expiration, tokens.slice());
      }
      // Give back whatever was granted, or may have been (a reply still on its way: the release
      // queues behind it on the same connection).
      tokens.fill(null);
      const releases = this._members.map((m) => m.adapter.call(mrelease, resources[0]).catch(() => {}));
      await Promise.race([Promise.all(releases), sleep(settings.retryDelay)]);
      if (attempts.length >= maxAttempts) throw new ExecutionError(QUORUM_FAILED, attempts);
      await sleep(this._retryPause(settings));
    }
  }

  _retryPause(settings) {
    return Math.max(0, settings.retryDelay + Math.floor((Math.random() * 2 - 1) * settings.retryJitter));
  }

  /**
   * One server: one LOCK.MACQUIRE, then the retry window as one BLOCK in the server's queue.
   * While a resource's key holds something other than a lock (no queue there), the window is
   * spent as node-redlock spends it: a ResourceLockedError vote, then another try after
   * retryDelay +- retryJitter, up to retryCount times.
   */
  async _acquireOne(resources, duration, settings, value, macquire, mrelease) {
    const { client, adapter } = this._members[0];
    const windowMs = settings.retryCount === -1 ? 0 : settings.retryCount * settings.retryDelay;
    const attempts = [];
    const maxAttempts = settings.retryCount === -1 ? Infinity : settings.retryCount + 1;
    const first = Date.now();
    for (;;) {
      const stats = { membershipSize: 1, quorumSize: 1, votesFor: new Set(), votesAgainst: new Map() };
      if (maxAttempts !== Infinity) attempts.push(Promise.resolve(stats));
      const start = Date.now();
      // What is left of the window (0 with retryCount -1: no limit).
      const blockMs = windowMs === 0 ? 0 : Math.max(1, windowMs - (start - first));
      try {
        let reply = await adapter.call(macquire, resources[0]);
        let granted = start;
        if (reply === null && settings.retryCount !== 0) {
          // The round trip just measured stands for the delay between the grant and its reply.
          const rtt = Date.now() - start;
          reply = await wire.blockingCall(adapter, resources[0], [...macquire, 'BLOCK', blockMs], {
            waitMs: blockMs === 0 ? null : blockMs,
            cleanup: () => adapter.call(mrelease, resources[0]),
          });
          granted = Date.now() - rtt;
        }
        if (reply === null) {
          const error = lockedError(resources.length);
          stats.votesAgainst.set(client, error);
          this.emit('error', error);
          throw new ExecutionError(QUORUM_FAILED, attempts);
        }
        stats.votesFor.add(client);
        const tokens = [reply.map(wire.toToken)];
        return new Lock(this, resources, value, attempts, granted + duration - this._drift(settings, duration), tokens);
      } catch (caught) {
        if (caught instanceof ExecutionError) throw caught;
        const error = asLocked(caught, resources.length);
        stats.votesAgainst.set(client, error);
        this.emit('error', error);
        const final = isReplyError(error) || attempts.length >= maxAttempts;
        if (final) throw new ExecutionError(QUORUM_FAILED, attempts);
        await sleep(this._retryPause(settings));
      }
    }
  }

  /**
   * Run `perClient(member, i)` on every client at once. Resolves as soon as a quorum voted for
   * (resolved) or against (rejected); `stats` resolves once every vote is in.
   */
  _round(perClient) {
    const start = Date.now();
    const n = this._members.length;
    const stats = {
      membershipSize: n,
      quorumSize: Math.floor(n / 2) + 1,
      votesFor: new Set(),
      votesAgainst: new Map(),
    };
    return new Promise((resolve) => {
      let done;
      const all = new Promise((r) => (done = () => r(stats)));
      let refusedOnly = true;
      const vote = () => {
        const result = { stats: all, start, refusedOnly };
        if (stats.votesFor.size === stats.quorumSize) resolve({ vote: 'for', ...result });
        if (stats.votesAgainst.size === stats.quorumSize) resolve({ vote: 'against', ...result });
        if (stats.votesFor.size + stats.votesAgainst.size === n) {
          resolve({ vote: 'against', ...result });
          done();
        }
      };
      this._members.forEach((member, i) => {
        perClient(member, i).then(
          () => {
            stats.votesFor.add(member.client);
            vote();
          },
          (error) => {
            if (!(error instanceof ResourceLockedError)) refusedOnly = false;
            stats.votesAgainst.set(member.client, error);
            this.emit('error', error);
            vote();
          }
        );
      });
    });
  }

  /** `perClient` on a quorum, retried per settings unless every master refused outright. */
  async _execute(perClient, overrides) {
    const settings = this._settings(overrides);
    const maxAttempts = settings.retryCount === -1 ? Infinity : settings.retryCount + 1;
    const attempts = [];
    for (;;) {
      const round = await this._round(perClient);
      if (maxAttempts !== Infinity) attempts.push(round.stats);
      if (round.vote === 'for') return { attempts, start: round.start };
      if (round.refusedOnly || attempts.length >= maxAttempts) throw new ExecutionError(QUORUM_FAILED, attempts);
      await sleep(this._retryPause(settings));
    }
  }

  /** Release the lock on every client still holding it; rejects unless a quorum released it. */
  release(lock, overrides) {
    lock.expiration = 0;
    const { resources, value } = lock;
    return this._execute(async ({ adapter }) => {
      const n = await adapter
        .call(['LOCK.MRELEASE', resources.length, ...resources, value], resources[0])
        .catch((error) => Promise.reject(asLocked(error, resources.length)));
      if (n !== resources.length) {
        throw new ResourceLockedError(`The operation was applied to: ${n} of the ${resources.length} requested resources.`);
      }
    }, overrides);
  }

  /** Extend a valid lock to `duration` ms from now; resolves to a new Lock. */
  async extend(existing, duration, overrides) {
    checkDuration(duration);
    if (existing.expiration < Date.now()) {
      throw new ExecutionError('Cannot extend an already-expired lock.', []);
    }
    const settings = this._settings(overrides);
    const { resources, value } = existing;
    const { attempts, start } = await this._execute(async ({ adapter }) => {
      const n = await adapter
        .call(['EVAL', wire.EXTEND_ALL_LUA, resources.length, ...resources, value, duration], resources[0])
        .catch((error) => Promise.reject(asLocked(error, resources.length)));
      if (n !== resources.length) {
        throw new ResourceLockedError(`The operation was applied to: ${n} of the ${resources.length} requested resources.`);
      }
    }, overrides);
    existing.expiration = 0;
    return new Lock(this, resources, value, attempts, start + duration - this._drift(settings, duration), existing.tokens);
  }

  /**
   * Run `routine(signal)` under an auto-extending lock and release it on every exit path. The lock
   * is extended when less than `automaticExtensionThreshold` ms of validity are left; if that
   * fails until the lock expires, `signal` aborts and `signal.error` says why.
   */
  async using(resources, duration, settingsOrRoutine, optionalRoutine) {
    checkDuration(duration);
    const settings =
      settingsOrRoutine && typeof settingsOrRoutine !== 'function'
        ? { ...this.settings, ...settingsOrRoutine }
        : this.settings;
    const routine = optionalRoutine ?? settingsOrRoutine;
    if (typeof routine !== 'function') throw new Error('INVARIANT: routine is not a function.');
    if (settings.automaticExtensionThreshold > duration - 100) {
      throw new Error(
        'A lock `duration` must be at least 100ms greater than the `automaticExtensionThreshold` setting.'
      );
    }
    const controller = new AbortController();
    const signal = controller.signal;
    let lock = await this.acquire(resources, duration, settings);
    let finished = false;
    let timeout;
    let extension;

    const queue = () => {
      if (finished) return;
      timeout = setTimeout(() => (extension = extend()), lock.expiration - Date.now() - settings.automaticExtensionThreshold);
    };
    const extend = async () => {
      timeout = undefined;
      while (!finished) {
        try {
          lock = await lock.extend(duration);
          queue();
          return;
        } catch (error) {
          if (finished) return;
          if (lock.expiration > Date.now()) {
            await sleep(this._retryPause(settings));
            continue;
          }
          signal.error = error instanceof Error ? error : new Error(String(error));
          controller.abort(signal.error);
          return;
        }
      }
    };

    queue();
    try {
      return await routine(signal);
    } finally {
      finished = true;
      clearTimeout(timeout);
      if (extension) await extension.catch(() => {});
      await lock.release();
    }
  }

  /** node-redlock v4: `lock(resource | resources, ttl)`. */
  lock(resource, ttl) {
    return this.acquire(Array.isArray(resource) ? resource : [resource], ttl);
  }

  /** node-redlock v4: `unlock(lock)`. */
  unlock(lock) {
    return this.release(lock);
  }
}

module.exports = Redlock;
module.exports.default = Redlock;
module.exports.Redlock = Redlock;
module.exports.Lock = Lock;
module.exports.ResourceLockedError = ResourceLockedError;
module.exports.ExecutionError = ExecutionError;
