'use strict';
// Shared holders on the same server-side queue: a counting semaphore and a read/write lock
// (LOCK.ACQUIRE key owner ttl SHARED [LIMIT n]). Everything Lock does holds for them: one command
// per wait, FIFO order, a token per holder, the watchdog, cancellation, durable.

const { Lock } = require('./lock');
const wire = require('./wire');

function checkLimit(limit) {
  if (!Number.isInteger(limit) || limit < 1) {
    throw new RangeError(`limit must be an integer >= 1, got ${String(limit)}`);
  }
  return limit;
}

/** At most `limit` holders at once; everyone using the key must give the same limit. */
class Semaphore extends Lock {
  constructor(client, name, limit, ttl, options) {
    super(client, name, ttl, options);
    this.limit = checkLimit(limit);
  }

  _modeArgs() {
    return ['SHARED', 'LIMIT', this.limit];
  }
}

/** The read side of a ReadWriteLock: shared, no limit. */
class ReadLock extends Lock {
  _modeArgs() {
    return ['SHARED'];
  }
}

/**
 * `.read` (a ReadLock) and `.write` (a Lock) on one key, each a holder with an owner of its own
 * (a given `owner` becomes `owner:read` and `owner:write`). No upgrade or downgrade.
 */
class ReadWriteLock {
  constructor(client, name, ttl, options = {}) {
    const { owner, ...rest } = options;
    this.name = name;
    this.read = new ReadLock(client, name, ttl, {
      ...rest,
      owner: owner === undefined ? wire.newOwner() : `${owner}:read`,
    });
    this.write = new Lock(client, name, ttl, {
      ...rest,
      owner: owner === undefined ? wire.newOwner() : `${owner}:write`,
    });
  }
}

module.exports = { Semaphore, ReadLock, ReadWriteLock };
