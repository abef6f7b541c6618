package io.redislock;

import static io.redislock.testing.RedisServer.waitUntil;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.redislock.testing.Harness;
import java.time.Duration;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.Jedis;

/** A 3-master cluster from {@code harness cluster}: every command goes to its key's node. */
class ClusterTest {
  static Harness cluster;
  static LockClient client;

  @BeforeAll
  static void start() throws Exception {
    cluster = Harness.cluster(3, 0);
    client = LockClient.cluster(Set.of(new HostAndPort("127.0.0.1", cluster.port())), DefaultJedisClientConfig.builder().build());
  }

  @AfterAll
  static void stop() {
    if (client != null) {
      client.close();
    }
    if (cluster != null) {
      cluster.close();
    }
  }

  /** The node (port) that holds {@code key}, asked of each node directly. */
  static int nodeHolding(String key) {
    for (int port : cluster.ports()) {
      try (Jedis j = new Jedis("127.0.0.1", port)) {
        try {
          if (j.exists(key)) {
            return port;
          }
        } catch (redis.clients.jedis.exceptions.JedisDataException moved) {
          // MOVED: not this node's key
        }
      }
    }
    return -1;
  }

  @Test
  void locksOnEveryNodeAndWaitsRoutedToTheirNode() throws Exception {
    Set<Integer> nodes = new HashSet<>();
    for (String k : List.of("alpha", "bravo", "charlie", "delta", "echo", "foxtrot")) {
      String key = k + ":" + System.nanoTime();
      Lock a = client.lock(key, Duration.ofSeconds(30));
      assertTrue(a.tryLock());
      assertEquals(a.token(), client.info(key).token());
      int port = nodeHolding(key);
      assertTrue(port > 0);
      nodes.add(port);
      Lock b = client.lock(key, Duration.ofSeconds(30));
      CompletableFuture<Boolean> waited = new CompletableFuture<>();
      Thread t = new Thread(() -> {
        try {
          waited.complete(b.tryLock(10, TimeUnit.SECONDS));
        } catch (Throwable e) {
          waited.completeExceptionally(e);
        }
      });
      t.start();
      waitUntil("the waiter queued on its node", Duration.ofSeconds(10), () -> client.info(key).waiters() == 1);
      a.unlock();
      assertTrue(waited.get(10, TimeUnit.SECONDS));
      assertEquals(b.owner(), client.info(key).owner());
      b.unlock();
      assertNull(client.info(key));
    }
    assertTrue(nodes.size() >= 2, "the keys spread over the masters: " + nodes);
  }

  @Test
  void multiLockAndSessionOnOneSlot() throws Exception {
    String tag = "{order:" + System.nanoTime() + "}";
    MultiLock m = client.multiLock(List.of(tag + ":a", tag + ":b"), Duration.ofSeconds(30));
    assertTrue(m.tryLock());
    assertEquals(2, m.tokens().size());
    assertEquals(m.owner(), client.info(tag + ":b").owner());
    assertTrue(m.extend());
    m.unlock();

    Session s = client.session(Duration.ofSeconds(30), Session.options().key(tag + ":a").bound(true)).open();
    Lock a = client.lock(tag + ":a", Duration.ZERO, Lock.options().session(s));
    Lock b = client.lock(tag + ":b", Duration.ZERO, Lock.options().session(s));
    assertTrue(a.tryLock());
    assertTrue(b.tryLock());
    assertEquals(2L, s.info().get("holds"));
    assertFalse(client.lock(tag + ":a", Duration.ofSeconds(1)).tryLock());
    s.end();
    waitUntil("the session's holds released", Duration.ofSeconds(10),
        () -> client.info(tag + ":a") == null && client.info(tag + ":b") == null);
  }

  @Test
  void anElectionObservedOnItsNode() throws Exception {
    String name = "cluster-leader:" + System.nanoTime();
    Election e = client.election(name);
    try (Election.Observation o = e.observe()) {
      assertNull(o.next(Duration.ofSeconds(10)).orElseThrow().leader());
      Election.Leadership l = e.campaign("node-a", Duration.ofSeconds(1), null).orElseThrow();
      assertEquals(new Election.Leader("node-a", l.term()), o.next(Duration.ofSeconds(10)).orElseThrow().leader());
      l.resign();
      assertNull(o.next(Duration.ofSeconds(10)).orElseThrow().leader());
    }
  }
}
