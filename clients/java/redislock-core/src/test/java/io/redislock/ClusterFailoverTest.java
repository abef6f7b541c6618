package io.redislock;

import static io.redislock.testing.RedisServer.waitUntil;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.redislock.testing.Harness;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.Jedis;
import redis.clients.jedis.commands.ProtocolCommand;
import redis.clients.jedis.exceptions.JedisConnectionException;

/**
 * Issue 34 for Java: a 3+3 cluster from the harness, then {@code CLUSTER FAILOVER} of the shard
 * that serves the test's hash tag. Jedis follows {@code MOVED} for the pooled commands
 * (renewals, keepalives); the client queues a waiter answered {@code UNBLOCKED} by the old master
 * again on the new one, and moves a hold's change feed there when the old master's server ends
 * the subscription ({@code sunsubscribe}). What is asserted: the holds are on the new master with
 * their tokens, the watchdog and the session's keepalive renew them there, no loss is reported,
 * and the waiter is granted on the new master without the caller sending anything again.
 */
class ClusterFailoverTest {
  /** How long the cluster may take to carry out a failover. */
  static final Duration PATIENCE = Duration.ofSeconds(30);

  static Harness cluster;
  static LockClient client;

  @BeforeAll
  static void start() throws Exception {
    cluster = Harness.cluster(3, 1);
    Set<HostAndPort> nodes = new HashSet<>();
    for (int port : cluster.ports()) {
      nodes.add(new HostAndPort("127.0.0.1", port));
    }
    client = LockClient.cluster(nodes, DefaultJedisClientConfig.builder().build());
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

  static ProtocolCommand command(String name) {
    byte[] raw = name.getBytes(StandardCharsets.UTF_8);
    return () -> raw;
  }

  static String text(Object o) {
    return o instanceof byte[] ? new String((byte[]) o, StandardCharsets.UTF_8) : String.valueOf(o);
  }

  /** ROLE's first word ("master", "slave"), and for a replica its master's port; null if down. */
  static List<?> role(int port) {
    try (Jedis j = new Jedis("127.0.0.1", port)) {
      return (List<?>) j.sendCommand(command("ROLE"));
    } catch (JedisConnectionException down) {
      return null;
    }
  }

  static int replicaOf(int master) {
    for (int port : cluster.ports()) {
      List<?> r = role(port);
      if (r != null && text(r.get(0)).equals("slave") && ((Long) r.get(2)).intValue() == master) {
        return port;
      }
    }
    throw new AssertionError("no replica of " + master);
  }

  static long calls(int port, String cmd) {
    try (Jedis j = new Jedis("127.0.0.1", port)) {
      for (String line : j.info("commandstats").split("\r?\n")) {
        if (line.startsWith("cmdstat_" + cmd + ":calls=")) {
          return Long.parseLong(line.substring(("cmdstat_" + cmd + ":calls=").length()).split(",")[0]);
        }
      }
      return 0;
    }
  }

  static Object fence(int port, String key) {
    try (Jedis j = new Jedis("127.0.0.1", port)) {
      return j.sendCommand(command("LOCK.FENCE"), key);
    }
  }

  static long waiters(int port, String key) {
    try (Jedis j = new Jedis("127.0.0.1", port)) {
      Object info = j.sendCommand(command("LOCK.INFO"), key);
      return info == null ? 0 : (Long) LockInfo.fields(redis.clients.jedis.util.SafeEncoder.encodeObject(info)).get("waiters");
    }
  }

  @Test
  @Timeout(value = 180, unit = TimeUnit.SECONDS)
  void plannedFailoverKeepsHoldsSessionsAndWaiters() throws Exception {
    String tag = "{fo-java}";
    int old = client.nodeFor(tag).getPort();
    int neu = replicaOf(old);
    AtomicReference<String> lost = new AtomicReference<>();

    // a watchdog hold watched through the feed, and an (unbound) session with a hold, ttl 3 s
    Lock plain = client.lock(tag + "plain", Duration.ofSeconds(3), Lock.options().watchdog(true)
        .onLost((l, e) -> lost.compareAndSet(null, "plain: " + e.reason())));
    assertTrue(plain.tryLock());
    Session session = client.session(Duration.ofSeconds(3), Session.options().key(tag)
        .onLost(s -> lost.compareAndSet(null, "session: " + s.lostReason()))).open();
    Lock inSession = client.lock(tag + "s1", Duration.ZERO, Lock.options().session(session)
        .onLost((l, e) -> lost.compareAndSet(null, "s1: " + e.reason())));
    assertTrue(inSession.tryLock());

    // a waiter queued behind a holder
    Lock holder = client.lock(tag + "busy", Duration.ofSeconds(60));
    assertTrue(holder.tryLock());
    Lock waiter = client.lock(tag + "busy", Duration.ofSeconds(60));
    CompletableFuture<Boolean> granted = new CompletableFuture<>();
    Thread w = new Thread(() -> {
      try {
        granted.complete(waiter.acquire(Duration.ofSeconds(240)));
      } catch (Throwable e) {
        granted.completeExceptionally(e);
      }
    });
    w.setDaemon(true);
    w.start();
    waitUntil("the waiter queued on the old master", PATIENCE, () -> waiters(old, tag + "busy") == 1);

    long keepalives = calls(neu, "lock.session|keepalive");
    try (Jedis j = new Jedis("127.0.0.1", neu)) {
      assertEquals("OK", j.sendCommand(command("CLUSTER"), "FAILOVER") instanceof byte[] b ? new String(b, StandardCharsets.UTF_8) : "?");
    }
    waitUntil("the replica to become master", PATIENCE, () -> role(neu) != null && text(role(neu).get(0)).equals("master"));
    waitUntil("the old master to become a replica", PATIENCE, () -> role(old) != null && text(role(old).get(0)).equals("slave"));

    // renewed on the new master: keepalives and extends counted there
    waitUntil("keepalives on the new master", PATIENCE, () -> calls(neu, "lock.session|keepalive") >= keepalives + 3);
    waitUntil("extends on the new master", PATIENCE, () -> calls(neu, "lock.extend") >= 2);
    assertEquals(plain.token(), fence(neu, tag + "plain"));
    assertEquals(inSession.token(), fence(neu, tag + "s1"));
    assertNull(lost.get());
    assertFalse(plain.isLost() || session.isLost() || inSession.isLost());

    // the waiter was answered by the old master and queued again on the new one by the client
    waitUntil("the waiter queued on the new master", PATIENCE, () -> waiters(neu, tag + "busy") == 1);
    assertFalse(granted.isDone());
    assertTrue(holder.release());
    assertTrue(granted.get(30, TimeUnit.SECONDS));
    assertEquals(waiter.token(), fence(neu, tag + "busy"));

    // the feed moved to the new master: a DEL there is reported at once as the loss it is
    try (Jedis j = new Jedis("127.0.0.1", neu)) {
      assertEquals(1L, j.del(tag + "plain"));
    }
    // (isLost() turns true a moment before onLost is called: wait for the callback)
    waitUntil("the DEL on the new master reported", PATIENCE, () -> lost.get() != null);
    assertTrue(plain.lostReason().startsWith("feed: "), plain.lostReason());
    assertTrue(lost.get().startsWith("plain: feed: "), lost.get());

    assertTrue(waiter.release());
    assertEquals(1L, session.end());
  }
}
