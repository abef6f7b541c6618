package io.redislock;

import redis.clients.jedis.CommandArguments;
import redis.clients.jedis.exceptions.JedisDataException;

/**
 * Fenced writes: a write that happens only while a fencing token is the live hold on a lock.
 * {@code LOCK.FENCE} inside a Lua script checks the token, and the write runs in the same atomic
 * step (the same scripts as the Python, Node and Rust clients).
 */
public final class Fence {
  private Fence() {}

  /** The check to put first in a script of your own: KEYS[1] the lock, ARGV[1] the token. */
  public static final String FENCE_CHECK_LUA =
      "if redis.call('LOCK.FENCE', KEYS[1], ARGV[1]) ~= 1 then\n"
          + "    return redis.error_reply('STALE token ' .. ARGV[1] .. ' is not the live hold on ' .. KEYS[1])\n"
          + "end\n";

  /** One command on one key behind the check: KEYS[2] the key, ARGV[2] the command, ARGV[3..]. */
  public static final String FENCED_CALL_LUA =
      FENCE_CHECK_LUA
          + "-- KEYS[2] the key written, ARGV[2] the command, ARGV[3..] its other arguments.\n"
          + "return redis.call(ARGV[2], KEYS[2], unpack(ARGV, 3))\n";

  /**
   * Run {@code command key args...} only while {@code token} is the live hold on {@code lockKey};
   * the command's reply, or StaleTokenException. In a cluster both keys need one hash tag.
   */
  public static Object call(LockClient client, String lockKey, long token, String command, String key, Object... args) {
    if (token <= 0) {
      throw new StaleTokenException("no token: the lock " + lockKey + " is not held");
    }
    CommandArguments a = client.args(Cmd.EVAL).add(FENCED_CALL_LUA).add(2).key(lockKey).key(key).add(token).add(command);
    for (Object arg : args) {
      a.add(arg);
    }
    try {
      return client.call(lockKey, a);
    } catch (JedisDataException e) {
      throw stale(e);
    }
  }

  static RuntimeException stale(JedisDataException e) {
    String m = String.valueOf(e.getMessage());
    if (m.startsWith("STALE ")) {
      return new StaleTokenException(m, e);
    }
    return e;
  }
}
