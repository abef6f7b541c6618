'use strict';
// The errors this package raises. Every one is a LockError; error replies from the server (a bad
// argument, WRONGTYPE, a SHARED limit mismatch) come through as the client library's own error.

class LockError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = this.constructor.name;
  }
}

/**
 * The lock was lost while held: a renewal answered 0 or failed, its ttl ran out, its session was
 * lost, or the change feed reported it gone.
 */
class LockLostError extends LockError {
  constructor(message, reason) {
    super(message);
    /** The lock's lostReason: "not held", "expired", "session lost: ...", "feed: ...", ... */
    this.reason = reason;
  }
}

/** `using()` (or a lock used with `using`) could not take the lock within its timeout. */
class LockBusyError extends LockError {}

/**
 * A durable acquire was granted but fewer replicas than asked acknowledged it in time.
 *
 * - `acknowledged`: how many did (WAIT's reply), `wanted`: how many were asked for.
 * - `released`: the grant this call made was given back (the lock is not held).
 * - `heldBefore`: the call was an idempotent retry of a hold the caller already had; that hold
 *   was left as it was (still held, token unchanged).
 * - `mayStayHeld`: the release failed too: the lock may stay held until its ttl runs out.
 */
class DurabilityError extends LockError {
  constructor(message, fields, options) {
    super(message, options);
    Object.assign(this, fields);
  }
}

/** `durable` was asked of a server older than Redis 7.0.12. */
class DurableUnsupportedError extends LockError {}

/** A fenced write was refused: the token is not the live hold on the lock. */
class StaleTokenError extends LockError {}

/**
 * A wait with a timeout of its own ran out: `Observation.get(timeout)` with no change within
 * `timeout` ms. `code` is 'ETIMEDOUT', as it was before this class existed.
 */
class TimeoutError extends LockError {
  constructor(message) {
    super(message);
    this.code = 'ETIMEDOUT';
  }
}

module.exports = {
  LockError,
  LockLostError,
  LockBusyError,
  DurabilityError,
  DurableUnsupportedError,
  StaleTokenError,
  TimeoutError,
};
