'use strict';
// What every lock shares: owners, times, tokens, the one-command blocking wait and its
// cancellation, and the durable check (WAIT after the grant).

const crypto = require('node:crypto');
const os = require('node:os');
const { isReplyError } = require('./adapter');
const { DurableUnsupportedError } = require('./errors');

/** How long to wait for the reply of a waiter just answered with CLIENT UNBLOCK (sent at once). */
const UNBLOCKED_REPLY_MS = 2000;

/**
 * How long past the wait itself a blocking call's reply may take before it counts as lost: the
 * server answers at the end of the wait, so this is only network and scheduling slack.
 */
const REPLY_MARGIN_MS = 10000;

/** A fresh owner: host, pid and a random UUID, so LOCK.INFO says who holds it. */
function newOwner() {
  return `${os.hostname()}:${process.pid}:${crypto.randomUUID()}`;
}

/** A time in milliseconds for the server: a positive integer (fractions are rounded up). */
function toMs(value, what, allowZero = false) {
  if (typeof value !== 'number' || !Number.isFinite(value) || value < 0 || (value === 0 && !allowZero)) {
    throw new RangeError(`${what} must be a positive number of milliseconds, got ${String(value)}`);
  }
  return value === 0 ? 0 : Math.max(1, Math.ceil(value));
}

/** `LOCKDELAY ms` (LOCK.ACQUIRE of a plain hold, LOCK.SESSION OPEN): the server refuses more. */
const MAX_LOCK_DELAY_MS = 60000;

/** A `lockDelay` option: ms from 0 to 60000, or undefined when not given. */
function toLockDelay(value) {
  if (value === undefined) return undefined;
  const ms = toMs(value, 'lockDelay', true);
  if (ms > MAX_LOCK_DELAY_MS) {
    throw new RangeError(`lockDelay must be at most ${MAX_LOCK_DELAY_MS} ms, got ${value}`);
  }
  return ms;
}

/**
 * A token from a reply, as an exact JavaScript number. The module mints tokens below 2^53 (until
 * the year 2109, see "Fencing tokens" in the module's README), so a number holds every token
 * exactly; one that does not fit is refused rather than rounded.
 */
function toToken(reply) {
  let n;
  if (typeof reply === 'number') n = reply;
  else if (typeof reply === 'bigint') n = Number(reply);
  else if (typeof reply === 'string' && /^[0-9]+$/.test(reply)) n = Number(reply);
  else throw new TypeError(`redislock: expected a token, got ${String(reply)}`);
  if (!Number.isSafeInteger(n) || n <= 0 || (typeof reply !== 'number' && String(n) !== String(reply))) {
    throw new RangeError(`redislock: token ${String(reply)} is not exact as a JavaScript number`);
  }
  return n;
}

function abortReason(signal) {
  if (signal.reason !== undefined) return signal.reason;
  const e = new Error('This operation was aborted');
  e.name = 'AbortError';
  return e;
}

/** `promise`, or a rejection after `ms` (an Error with `code: 'ETIMEDOUT'`). */
function withTimeout(promise, ms, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => {
      const e = new Error(`${what}: no reply within ${ms} ms`);
      e.code = 'ETIMEDOUT';
      reject(e);
    }, ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

async function quietly(fn) {
  try {
    await fn();
  } catch {
    // best effort: the caller reports the original outcome
  }
}

/** A token reply (LOCK.ACQUIRE) or an array of them (LOCK.MACQUIRE): a grant. */
function isGrant(reply) {
  return typeof reply === 'number' || typeof reply === 'string' || Array.isArray(reply);
}

/**
 * One blocking acquire (`args` ends with `BLOCK ms`) on a connection of its own.
 *
 * - `waitMs`: the wait (null: no limit). If no reply comes within the wait plus a margin, the
 *   connection is closed (which takes the waiter out of the queue) and `cleanup()` gives back a
 *   grant whose reply may have been lost.
 * - `signal`: aborting it answers the waiter at once with `CLIENT UNBLOCK` (its id was read in the
 *   same round trip as the command); a grant that raced the abort is given back with `cleanup()`.
 *   If the id is unknown or CLIENT UNBLOCK is refused (it is in @admin), the connection is closed
 *   and `cleanup()` runs anyway. Then the call rejects with the signal's reason.
 * - `after(reply, conn)`: runs on the same connection once the reply is a grant (the durable
 *   WAIT), before the connection is closed.
 */
async function blockingCall(adapter, key, args, { waitMs, signal, cleanup, after }) {
  if (signal && signal.aborted) throw abortReason(signal);
  const conn = await adapter.waiter(key);
  try {
    if (signal && signal.aborted) throw abortReason(signal);
    const idPromise = conn.call(['CLIENT', 'ID']).catch(() => null);
    const replyPromise = conn.call(args);
    const settled = replyPromise.then(
      (reply) => ({ reply }),
      (error) => ({ error })
    );
    let timer;
    let onAbort;
    const outcome = await new Promise((resolve) => {
      settled.then(resolve);
      if (waitMs !== null) {
        timer = setTimeout(() => resolve({ lost: true }), waitMs + REPLY_MARGIN_MS);
      }
      if (signal) {
        onAbort = () => resolve({ aborted: true });
        signal.addEventListener('abort', onAbort, { once: true });
      }
    });
    clearTimeout(timer);
    if (signal) signal.removeEventListener('abort', onAbort);

    if ('reply' in outcome) {
      if (after && isGrant(outcome.reply)) await after(outcome.reply, conn);
      return outcome.reply;
    }
    if ('error' in outcome) {
      if (!isReplyError(outcome.error)) await quietly(cleanup);
      throw outcome.error;
    }
    if (outcome.lost) {
      conn.close();
      await quietly(cleanup);
      const e = new Error(`redislock: no reply to ${args[0]} within ${waitMs + REPLY_MARGIN_MS} ms`);
      e.code = 'ETIMEDOUT';
      throw e;
    }
    // Aborted: answer the waiter now and give back a grant that beat the abort.
    const id = await idPromise;
    let reply = 'unknown';
    if (id !== null) {
      try {
        await adapter.callOnKey(key, ['CLIENT', 'UNBLOCK', id]);
        const answered = await withTimeout(settled, UNBLOCKED_REPLY_MS, 'CLIENT UNBLOCK');
        if ('reply' in answered) reply = answered.reply;
      } catch {
        // refused (ACL) or no answer: close the connection below
      }
    }
    if (reply !== null) {
      conn.close(); // takes the waiter out of the queue if it is still in it
      await quietly(cleanup);
    }
    throw abortReason(signal);
  } finally {
    conn.close();
  }
}

/** Redis version strings ("7.0.15") compared as numbers. */
function versionAtLeast(version, wanted) {
  const a = version.split('.').map(Number);
  for (let i = 0; i < wanted.length; i++) {
    const x = a[i] || 0;
    if (x !== wanted[i]) return x > wanted[i];
  }
  return true;
}

/** The first version whose WAIT counts a grant made while the caller was blocked. */
const DURABLE_MIN_VERSION = [7, 0, 12];
const durableChecked = new WeakMap();

/** Refuse `durable` on a server older than 7.0.12 (INFO server redis_version), once per client. */
async function checkDurable(adapter, key) {
  let check = durableChecked.get(adapter);
  if (check === undefined) {
    check = adapter.callOnKey(key, ['INFO', 'server']).then((info) => {
      const text = Buffer.isBuffer(info) ? info.toString() : String(info);
      const m = /redis_version:([0-9.]+)/.exec(text);
      const version = m ? m[1] : 'unknown';
      if (!m || !versionAtLeast(version, DURABLE_MIN_VERSION)) {
        throw new DurableUnsupportedError(
          `durable needs Redis 7.0.12 or later (WAIT after a blocked grant counts it only from ` +
            `7.0.12); this server reports redis_version ${version}`
        );
      }
    });
    check.catch(() => durableChecked.delete(adapter));
    durableChecked.set(adapter, check);
  }
  return check;
}

// There is no multi-key extend command: MultiLock and the Redlock drop-in extend their keys with
// this script, one atomic step on the server. KEYS the locks, ARGV[1] the owner, ARGV[2] ttl-ms:
// how many keys were extended.
const EXTEND_ALL_LUA = `local n = 0
for _, key in ipairs(KEYS) do
    n = n + redis.call('LOCK.EXTEND', key, ARGV[1], ARGV[2])
end
return n
`;

// --- following a cluster through a failover (issue 34) --------------------------------------

/** ms between two looks at the slot table while a slot has no reachable master. */
const FOLLOW_BACKOFF_MS = 50;
/** How long a single try (no wait of its own) looks for the slot's master before failing. */
const FOLLOW_TRY_MS = 5000;

/**
 * Whether `error` says the node asked no longer serves the slot as a master: MOVED, READONLY
 * (a replica now), CLUSTERDOWN, TRYAGAIN, a waiter's UNBLOCKED after a role change (Redis's
 * "instance state changed (master -> replica?)" or the module's "this server became a replica"),
 * or no reply at all (a connection lost or timed out: a killed master). In a cluster these mean
 * "ask the slot's master again"; they say nothing about whether a hold or a session still exists.
 */
function movedAway(error) {
  if (!error) return false;
  if (!isReplyError(error)) return true;
  const m = String(error.message || '');
  if (/^(MOVED|READONLY|CLUSTERDOWN|TRYAGAIN) /.test(m)) return true;
  return /^UNBLOCKED /.test(m) && /(master -> replica|became a replica)/.test(m);
}

/**
 * `call()` within `perTryMs`; in a cluster, after an error that `movedAway` explains, the slot
 * table is read again (`key`'s slot: a node-redis cluster looks up that slot's master) and `call()`
 * sent again (to the slot's master now) until `untilMono` (performance.now() scale). `stopped()`
 * ends the retries early.
 */
async function following(adapter, call, { key, perTryMs, untilMono, what, stopped = () => false }) {
  for (;;) {
    try {
      const p = call();
      return await (perTryMs === undefined ? p : withTimeout(p, perTryMs, what));
    } catch (error) {
      if (!adapter.isCluster || !movedAway(error) || performance.now() >= untilMono || stopped()) throw error;
    }
    await adapter.refresh(key);
    await new Promise((resolve) => setTimeout(resolve, FOLLOW_BACKOFF_MS));
  }
}

module.exports = {
  movedAway,
  following,
  FOLLOW_BACKOFF_MS,
  FOLLOW_TRY_MS,
  newOwner,
  toMs,
  toLockDelay,
  MAX_LOCK_DELAY_MS,
  toToken,
  abortReason,
  withTimeout,
  quietly,
  blockingCall,
  checkDurable,
  versionAtLeast,
  REPLY_MARGIN_MS,
  EXTEND_ALL_LUA,
};
