'use strict';
// Fenced writes: a write that happens only while a fencing token is the live hold on a lock.
// LOCK.FENCE inside a Lua script checks the token, and the write runs in the same atomic step.

const { adapt, isReplyError } = require('./adapter');
const { StaleTokenError } = require('./errors');

/** The check to put first in a script of your own: KEYS[1] the lock, ARGV[1] the token. */
const FENCE_CHECK_LUA = `if redis.call('LOCK.FENCE', KEYS[1], ARGV[1]) ~= 1 then
    return redis.error_reply('STALE token ' .. ARGV[1] .. ' is not the live hold on ' .. KEYS[1])
end
`;

/** One command on one key behind the check: KEYS[2] the key, ARGV[2] the command, ARGV[3..]. */
const FENCED_CALL_LUA =
  FENCE_CHECK_LUA +
  `-- KEYS[2] the key written, ARGV[2] the command, ARGV[3..] its other arguments.
return redis.call(ARGV[2], KEYS[2], unpack(ARGV, 3))
`;

function stale(error) {
  if (isReplyError(error) && String(error.message).startsWith('STALE ')) {
    return new StaleTokenError(error.message, { cause: error });
  }
  return error;
}

/**
 * Run `command key ...args` only while `token` is the live hold on `lockKey`; the command's
 * reply, or a StaleTokenError.
 */
async function fencedCall(client, lockKey, token, command, key, ...args) {
  if (token === null || token === undefined) {
    throw new StaleTokenError(`no token: the lock ${JSON.stringify(lockKey)} is not held`);
  }
  try {
    return await adapt(client).call(['EVAL', FENCED_CALL_LUA, 2, lockKey, key, token, command, ...args], lockKey);
  } catch (error) {
    throw stale(error);
  }
}

/**
 * A function that runs `body` (Lua) behind the check: call it as
 * `script([lockKey, ...keys], [token, ...args])`. A refusal rejects with StaleTokenError.
 */
function fencedScript(client, body) {
  const source = FENCE_CHECK_LUA + body;
  const adapter = adapt(client);
  return async (keys, args) => {
    try {
      return await adapter.call(['EVAL', source, keys.length, ...keys, ...args], keys[0]);
    } catch (error) {
      throw stale(error);
    }
  };
}

module.exports = { FENCE_CHECK_LUA, FENCED_CALL_LUA, fencedCall, fencedScript };
