package io.redislock;

import static io.redislock.testing.RedisServer.waitUntil;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.redislock.Election.Change;
import io.redislock.Election.Leadership;
import io.redislock.testing.RedisServer;
import java.time.Duration;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.RegisterExtension;
import redis.clients.jedis.Jedis;

class ElectionTest {
  @RegisterExtension static RedisServer server = new RedisServer();

  static LockClient client;
  static Jedis redis;

  @BeforeAll
  static void setUp() {
    client = server.client();
    redis = server.jedis();
  }

  static Change next(Election.Observation o) throws InterruptedException {
    Optional<Change> c = o.next(Duration.ofSeconds(10));
    assertTrue(c.isPresent(), "a change within 10 s");
    return c.get();
  }

  @Test
  void candidatesLeadInTurnAndTheObserverConfirmsEachMessage() throws Exception {
    String name = "leader:" + System.nanoTime();
    Election e = client.election(name);
    try (Election.Observation o = e.observe()) {
      Change first = next(o);
      assertTrue(first.resync());
      assertNull(first.leader());

      Leadership a = e.campaign("node-a", Duration.ofSeconds(1), null).orElseThrow();
      assertEquals(a.term(), client.info(name).token());
      assertEquals(new Election.Leader("node-a", a.term()), next(o).leader());
      assertEquals(Optional.of(new Election.Leader("node-a", a.term())), e.leader());

      Election other = client.election(name);
      assertTrue(other.campaign("node-b", Duration.ZERO, null).isEmpty(), "one try while node-a leads");
      CompletableFuture<Leadership> b = new CompletableFuture<>();
      Thread t = new Thread(() -> {
        try {
          b.complete(other.campaign("node-b", null, null).orElseThrow());
        } catch (Throwable x) {
          b.completeExceptionally(x);
        }
      });
      t.start();
      waitUntil("node-b queued", Duration.ofSeconds(10), () -> client.info(name).waiters() == 1);

      // a forged message is only a claim: the observer reads LOCK.INFO and reports nothing new
      java.util.List<?> watch = (java.util.List<?>) redis.sendCommand(() -> "LOCK.WATCH".getBytes(), name);
      String channel = new String((byte[]) watch.get(0), java.nio.charset.StandardCharsets.UTF_8);
      redis.sendCommand(() -> "SPUBLISH".getBytes(), channel, "999 acquired 1 0 mallory");

      assertTrue(a.resign());
      Leadership lb = b.get(10, TimeUnit.SECONDS);
      assertTrue(lb.term() > a.term());
      Change c = next(o);
      assertEquals(new Election.Leader("node-b", lb.term()), c.leader(), "not mallory");
      assertFalse(c.resync());
      assertThrows(StaleTokenException.class, () -> a.fenced("SET", name + ":data", "x"));
      assertTrue(lb.resign());
      assertNull(next(o).leader());
      assertTrue(e.leader().isEmpty());
    }
  }

  @Test
  void aLeadershipLostIsReportedToTheLeader() throws Exception {
    String name = "leader:" + System.nanoTime();
    CompletableFuture<LockLostException> lost = new CompletableFuture<>();
    Election e = client.election(name, Election.options().ttl(Duration.ofMillis(600)));
    Leadership a = e.campaign("node-a", Duration.ofSeconds(1), (l, x) -> lost.complete(x)).orElseThrow();
    redis.del(name);
    // two reporters race: the change feed (at once) and the watchdog's next LOCK.EXTEND
    String reason = lost.get(10, TimeUnit.SECONDS).reason();
    assertTrue(reason.equals("feed: deleted") || reason.equals("not held"), reason);
    assertTrue(a.isLost());
  }
}
