package io.redislock;

import static io.redislock.testing.RedisServer.waitUntil;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.redislock.testing.RedisServer;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.RegisterExtension;
import redis.clients.jedis.Jedis;

/**
 * Issue 32: CLIENT LIST says whose each connection is. A server of its own, so that every named
 * connection on it is this test's.
 */
class ConnectionNamesTest {
  @RegisterExtension static RedisServer server = new RedisServer();

  static List<String> names(String clientList) {
    List<String> out = new ArrayList<>();
    for (String line : clientList.split("\n")) {
      for (String field : line.trim().split(" ")) {
        if (field.startsWith("name=") && field.length() > "name=".length()) {
          out.add(field.substring("name=".length()));
        }
      }
    }
    Collections.sort(out);
    return out;
  }

  /** The line of the connection blocked in LOCK.ACQUIRE, or null. */
  static String blocked(String clientList) {
    for (String line : clientList.split("\n")) {
      if (line.contains(" flags=b ") && line.contains(" cmd=lock.acquire ")) {
        return line;
      }
    }
    return null;
  }

  @Test
  void theBoundSessionTheFeedAndTheWaiterAreNamedNeverWithTheSessionId() throws Exception {
    LockClient client = server.client();
    Jedis redis = server.jedis();
    String key = "names:" + System.nanoTime();
    Session s = client.session(Duration.ofSeconds(30), Session.options().bound(true)).open();
    Long serial = s.serial();
    assertNotNull(serial, "a bound session learns its serial");
    assertEquals(serial, s.info().get("serial"));
    Lock held = client.lock(key, Duration.ZERO, Lock.options().session(s).onLost((l, e) -> { }));
    assertTrue(held.tryLock());
    String feedId = client.feedFor(key).id;

    Lock other = client.lock(key, Duration.ofSeconds(30));
    CompletableFuture<Boolean> waited = CompletableFuture.supplyAsync(() -> {
      try {
        return other.acquire(Duration.ofSeconds(20));
      } catch (InterruptedException e) {
        throw new IllegalStateException(e);
      }
    });
    waitUntil("the waiter blocked", Duration.ofSeconds(10), () -> blocked(redis.clientList()) != null);

    String list = redis.clientList();
    List<String> expected = new ArrayList<>(List.of(
        "redislock-feed-sub-" + feedId,
        "redislock-feed-watch-" + feedId,
        "redislock-session-" + serial,
        // the waiter's lock has no session given: the client's default session, named alike
        "redislock-session-" + other.session().serial(),
        "redislock-waiter"));
    Collections.sort(expected);
    assertTrue(blocked(list).contains(" name=redislock-waiter "), list);
    assertEquals(expected, names(list), list);
    for (String line : list.split("\n")) {
      if (line.contains(" name=redislock-session-" + serial + " ")) {
        assertEquals(s.info().get("bound"), Long.parseLong(line.replaceAll("^id=(\\d+) .*$", "$1").trim()), line);
      }
    }
    String secret = s.id().substring(s.id().indexOf('}') + 1);
    assertFalse(list.contains(s.id()), list);
    assertFalse(list.contains(secret), list);

    held.release();
    assertTrue(waited.get(10, TimeUnit.SECONDS));
    other.release();
    s.end();
  }
}
