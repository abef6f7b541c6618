package io.redislock;

import static io.redislock.testing.RedisServer.waitUntil;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.redislock.Election.Change;
import io.redislock.Election.Leader;
import io.redislock.testing.RedisServer;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.RegisterExtension;
import redis.clients.jedis.Jedis;

/**
 * A change feed's connection killed by the server ({@code CLIENT KILL}, as an administrator
 * would): the observer or the hold's feed connects again, watches again and reads
 * {@code LOCK.INFO} again, so the next change is reported and a hold is not reported lost by the
 * kill alone. A server of its own: {@code CLIENT KILL TYPE pubsub} ends every subscription on it.
 */
class FeedKillTest {
  @RegisterExtension static RedisServer server = new RedisServer();

  /** The ids ({@code CLIENT LIST}) of the connections named {@code name}. */
  static List<String> idsNamed(Jedis redis, String name) {
    List<String> ids = new ArrayList<>();
    for (String line : redis.clientList().split("\n")) {
      if ((" " + line.trim() + " ").contains(" name=" + name + " ")) {
        ids.add(line.split(" ")[0].substring("id=".length()));
      }
    }
    return ids;
  }

  /** {@code CLIENT KILL ID} each connection named {@code name}; how many there were. */
  static int killNamed(Jedis redis, String name) {
    List<String> ids = idsNamed(redis, name);
    for (String id : ids) {
      redis.sendCommand(() -> "CLIENT".getBytes(), "KILL", "ID", id);
    }
    return ids.size();
  }

  /** {@code LOCK.ACQUIRE name owner 60000} on a raw connection: the grant's token. */
  static long acquireRaw(Jedis redis, String name, String owner) {
    return (Long) redis.sendCommand(() -> "LOCK.ACQUIRE".getBytes(), name, owner, "60000");
  }

  /** The observer's changes until one names {@code expected} (within 10 s), which it returns. */
  static Change awaitLeader(Election.Observation o, Leader expected) throws InterruptedException {
    long end = System.nanoTime() + Duration.ofSeconds(10).toNanos();
    List<Change> seen = new ArrayList<>();
    while (System.nanoTime() < end) {
      Optional<Change> c = o.next(Duration.ofNanos(Math.max(1, end - System.nanoTime())));
      if (c.isEmpty()) {
        break;
      }
      seen.add(c.get());
      if (expected.equals(c.get().leader())) {
        return c.get();
      }
    }
    throw new AssertionError("no change to " + expected + " within 10 s; seen " + seen);
  }

  @Test
  void anObserverWhoseWatchConnectionIsKilledReportsTheNextHolder() throws Exception {
    LockClient client = server.client();
    Jedis redis = server.jedis();
    String name = "kill:watch:" + System.nanoTime();
    try (Election.Observation o = client.watch(name)) {
      assertNull(o.next(Duration.ofSeconds(10)).orElseThrow().leader());
      // the connection that LOCK.WATCHes: the server ends the key's watch with it, so nothing
      // is published for the key until the observer watches it again
      assertEquals(1, killNamed(redis, Feed.WATCH_NAME + "-" + o.id));
      long token = acquireRaw(redis, name, "raw-a");
      awaitLeader(o, new Leader("raw-a", token));
      assertEquals(1, idsNamed(redis, Feed.WATCH_NAME + "-" + o.id).size(), "watching again");
    }
  }

  @Test
  void anObserverWhoseSubscriptionIsKilledReportsTheNextHolder() throws Exception {
    LockClient client = server.client();
    Jedis redis = server.jedis();
    String name = "kill:sub:" + System.nanoTime();
    try (Election.Observation o = client.watch(name)) {
      assertNull(o.next(Duration.ofSeconds(10)).orElseThrow().leader());
      List<String> subscribed = idsNamed(redis, Feed.SUB_NAME + "-" + o.id);
      assertEquals(1, subscribed.size(), "one subscription");
      redis.sendCommand(() -> "CLIENT".getBytes(), "KILL", "TYPE", "pubsub");
      // that connection is gone (the observer may already have made its next one, same name:
      // CI saw it within the 21 ms to this check)
      List<String> now = idsNamed(redis, Feed.SUB_NAME + "-" + o.id);
      assertFalse(now.contains(subscribed.get(0)), "the subscription killed: " + now);
      long token = acquireRaw(redis, name, "raw-b");
      awaitLeader(o, new Leader("raw-b", token));
      // and the one after it, through the new subscription
      assertEquals(1L, redis.sendCommand(() -> "LOCK.RELEASE".getBytes(), name, "raw-b"));
      Change free = o.next(Duration.ofSeconds(10)).orElseThrow();
      assertNull(free.leader(), free.toString());
    }
  }

  @Test
  void aHoldWhoseFeedConnectionsAreKilledIsNotLostAndItsLossIsStillReported() throws Exception {
    LockClient client = server.client();
    Jedis redis = server.jedis();
    String name = "kill:hold:" + System.nanoTime();
    Lock lock = client.lock(name, Duration.ofSeconds(60), Lock.options().onLost((l, e) -> {}));
    assertTrue(lock.tryLock());
    String old = client.feedFor(name).id;
    assertEquals(1, killNamed(redis, Feed.WATCH_NAME + "-" + old));
    assertEquals(1, killNamed(redis, Feed.SUB_NAME + "-" + old));
    // the hold is watched again through the node's new feed (a new id), once it has subscribed
    waitUntil("the hold watched again", Duration.ofSeconds(10), () -> {
      String now = client.feedFor(name).id;
      if (now.equals(old)) {
        return false;
      }
      for (String line : redis.clientList().split("\n")) {
        if (line.contains(" name=" + Feed.SUB_NAME + "-" + now + " ") && line.contains(" ssub=1 ")) {
          return true;
        }
      }
      return false;
    });
    assertFalse(lock.isLost(), "lost by the kill alone: " + lock.lostReason());
    assertTrue(lock.isHeld());
    // the feed still reports (a 60 s ttl, no watchdog: nothing else would within the wait)
    assertEquals(1L, redis.del(name));
    waitUntil("the DEL reported through the feed", Duration.ofSeconds(10), lock::isLost);
    assertTrue(lock.lostReason().startsWith("feed: "), lock.lostReason());
  }
}
