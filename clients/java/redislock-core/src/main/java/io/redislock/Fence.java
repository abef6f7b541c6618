package io.redislock;

import java.util.List;
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

  /**
   * A script of your own behind the fence check, as Python's {@code fenced_script} and Node's
   * {@code fencedScript}: {@code body} runs only while {@code ARGV[1]} is the live token of
   * {@code KEYS[1]}. Call it with the lock first: {@code script.call(List.of(lock.name(), "out"),
   * List.of(lock.token(), "x"))}. A refused call is a StaleTokenException; other error replies
   * are Jedis's {@code JedisDataException}. In a cluster every key needs the lock's hash tag.
   */
  public static FencedScript script(LockClient client, String body) {
    return new FencedScript(client, FENCE_CHECK_LUA + body);
  }

  /** A fenced script made by {@link #script(LockClient, String)}. */
  public static final class FencedScript {
    private final LockClient client;
    private final String source;

    FencedScript(LockClient client, String source) {
      this.client = client;
      this.source = source;
    }

    /** The whole script: the fence check, then the body. */
    public String source() {
      return source;
    }

    /** EVAL it: {@code keys} the lock's key first, {@code args} its token first; the reply. */
    public Object call(List<String> keys, List<?> args) {
      if (keys.isEmpty() || args.isEmpty()) {
        throw new IllegalArgumentException("KEYS[1] must be the lock and ARGV[1] its token");
      }
      CommandArguments a = client.args(Cmd.EVAL).add(source).add(keys.size());
      for (String k : keys) {
        a.key(k);
      }
      for (Object arg : args) {
        a.add(arg);
      }
      try {
        return client.call(keys.get(0), a);
      } catch (JedisDataException e) {
        throw stale(e);
      }
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
