package io.redislock;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.HashSet;
import java.util.List;
import redis.clients.jedis.CommandArguments;

/**
 * Exclusive locks on several keys, all or none ({@code LOCK.MACQUIRE} / {@code LOCK.MRELEASE}):
 * no deadlock whatever order callers name the keys in. In a cluster the keys need one hash tag
 * ({@code {order:7}:a}, {@code {order:7}:b}). There is no multi-key extend command: extend and
 * the watchdog run one script over the keys (one atomic step on the server).
 */
public class MultiLock extends Lock {
  /** KEYS the locks, ARGV[1] the owner, ARGV[2] the ttl: how many were extended. */
  static final String EXTEND_ALL_LUA =
      "local n = 0\n"
          + "for _, key in ipairs(KEYS) do\n"
          + "    n = n + redis.call('LOCK.EXTEND', key, ARGV[1], ARGV[2])\n"
          + "end\n"
          + "return n\n";

  private final List<String> names;
  private volatile List<Long> tokens;

  MultiLock(LockClient client, Collection<String> names, Duration ttl, Options options) {
    super(client, first(names), ttl, options);
    if (options.lockDelay != null) {
      throw new IllegalArgumentException("LOCK.MACQUIRE takes no LOCKDELAY");
    }
    if (new HashSet<>(names).size() != names.size()) {
      throw new IllegalArgumentException("a key is named twice: " + names);
    }
    this.names = List.copyOf(names);
  }

  private static String first(Collection<String> names) {
    if (names.isEmpty()) {
      throw new IllegalArgumentException("names must not be empty");
    }
    return names.iterator().next();
  }

  public List<String> names() {
    return names;
  }

  /** One fencing token per key, in the order of {@link #names()}; empty when not held. */
  public List<Long> tokens() {
    List<Long> t = tokens;
    return t == null ? List.of() : t;
  }

  @Override
  List<String> keys() {
    return names;
  }

  @Override
  CommandArguments acquireArgs(long blockMs) {
    CommandArguments args = client.args(Cmd.MACQUIRE).add(names.size());
    for (String n : names) {
      args.key(n);
    }
    args.add(owner).add(ttlMs);
    sessionArgs(args);
    if (blockMs >= 0) {
      args.add("BLOCK").add(blockMs);
    }
    return args;
  }

  @Override
  CommandArguments releaseArgs() {
    CommandArguments args = client.args(Cmd.MRELEASE).add(names.size());
    for (String n : names) {
      args.key(n);
    }
    return args.add(owner);
  }

  @Override
  CommandArguments extendArgs() {
    CommandArguments args = client.args(Cmd.EVAL).add(EXTEND_ALL_LUA).add(names.size());
    for (String n : names) {
      args.key(n);
    }
    return args.add(owner).add(ttlMs);
  }

  @Override
  boolean renewed(Object reply) {
    return Long.valueOf(names.size()).equals(reply);
  }

  @Override
  boolean released(Object reply) {
    return Long.valueOf(names.size()).equals(reply);
  }

  /** {@code token()} is the largest of the tokens. */
  @Override
  long granted(Object reply) {
    List<Long> t = new ArrayList<>();
    for (Object o : (List<?>) reply) {
      t.add((Long) o);
    }
    tokens = Collections.unmodifiableList(t);
    token = Collections.max(t);
    return token;
  }

  @Override
  long tokenFor(String key) {
    List<Long> t = tokens;
    int i = names.indexOf(key);
    return t == null || i < 0 ? 0 : t.get(i);
  }

  /**
   * True if this handle's hold is the live one on every key, each checked with its own token
   * ({@code LOCK.FENCE key token}; the tokens of one set differ from key to key).
   */
  @Override
  public boolean isOwned() {
    List<Long> t = tokens;
    if (t == null) {
      return false;
    }
    for (int i = 0; i < names.size(); i++) {
      String key = names.get(i);
      if (!Long.valueOf(1).equals(client.call(key, client.args(Cmd.FENCE).key(key).add(t.get(i))))) {
        return false;
      }
    }
    return true;
  }

  @Override
  void forget() {
    token = 0;
    tokens = null;
  }

  /** Fence each key with its own token: {@code Fence.call(client, key, tokens().get(i), ...)}. */
  @Override
  public Object fenced(String command, String key, Object... args) {
    throw new UnsupportedOperationException("fence each key with its own token: Fence.call(client, key, token, ...)");
  }
}
