package io.redislock;

import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * A lock's state as {@code LOCK.INFO} shows it (docs/commands.md, "LOCK.INFO").
 *
 * @param owner the holder of an exclusive lock, or null for a shared one
 * @param token the holder's token (the largest live one when shared)
 * @param ttl ms until the (last) holder's deadline
 * @param waiters clients queued with BLOCK
 * @param mode "exclusive" or "shared"
 * @param limit the semaphore's n, or null
 * @param holders every live holder, in grant order
 */
public record LockInfo(String owner, long token, long ttl, long waiters, String mode, Long limit, List<Holder> holders) {

  /**
   * One holder: its owner, token, ms to its deadline (-1: a session hold with none), and the
   * serial of its session (as {@link Session#serial()} and {@code LOCK.SESSION LIST} show it;
   * null for a hold in no session).
   */
  public record Holder(String owner, long token, long ttl, Long session) {}

  /** LOCK.INFO's reply (decoded), or null for nil. */
  static LockInfo parse(Object reply) {
    if (reply == null) {
      return null;
    }
    Map<String, Object> f = fields(reply);
    List<Holder> holders = new ArrayList<>();
    Object hs = f.get("holders");
    if (hs instanceof List<?>) {
      for (Object h : (List<?>) hs) {
        Map<String, Object> hf = fields(h);
        holders.add(new Holder((String) hf.get("owner"), (Long) hf.get("token"), (Long) hf.get("ttl"), (Long) hf.get("session")));
      }
    }
    Object token = f.get("token");
    Object ttl = f.get("ttl");
    Object waiters = f.get("waiters");
    return new LockInfo(
        (String) f.get("owner"),
        token == null ? 0 : (Long) token,
        ttl == null ? 0 : (Long) ttl,
        waiters == null ? 0 : (Long) waiters,
        (String) f.get("mode"),
        (Long) f.get("limit"),
        Collections.unmodifiableList(holders));
  }

  /** A RESP2 flat field/value array (or a RESP3 map) as a map. */
  @SuppressWarnings("unchecked")
  static Map<String, Object> fields(Object reply) {
    if (reply instanceof Map<?, ?>) {
      return (Map<String, Object>) reply;
    }
    List<?> list = (List<?>) reply;
    Map<String, Object> out = new HashMap<>();
    for (int i = 0; i + 1 < list.size(); i += 2) {
      out.put(String.valueOf(list.get(i)), list.get(i + 1));
    }
    return out;
  }
}
