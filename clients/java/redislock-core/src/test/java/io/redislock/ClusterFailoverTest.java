package io.redislock;

import static io.redislock.testing.RedisServer.waitUntil;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.redislock.testing.Harness;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Optional;
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
 * and the waiter is granted on the new master without the caller sending anything again. The
 * second test: BOUND sessions re-attached there and observers moved (its own comment). A killed
 * master: {@link ClusterKillTest}.
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

  /** LOCK.SESSION INFO {@code id} on the node at {@code port}, as a map; null if it has none. */
  static Map<String, Object> sessionInfo(int port, String id) {
    try (Jedis j = new Jedis("127.0.0.1", port)) {
      Object info = j.sendCommand(command("LOCK.SESSION"), "INFO", id);
      return info == null ? null : LockInfo.fields(redis.clients.jedis.util.SafeEncoder.encodeObject(info));
    }
  }

  /** The client id of the connection named {@code name} on the node at {@code port}, or null. */
  static Long clientNamed(int port, String name) {
    try (Jedis j = new Jedis("127.0.0.1", port)) {
      for (String line : j.clientList().split("\r?\n")) {
        if ((" " + line + " ").contains(" name=" + name + " ")) {
          return Long.parseLong(line.substring(3, line.indexOf(' ')));
        }
      }
      return null;
    }
  }

  static Election.Change next(Election.Observation o) throws InterruptedException {
    Optional<Election.Change> c = o.next(Duration.ofSeconds(30));
    assertTrue(c.isPresent(), "a change within 30 s");
    return c.get();
  }

  /**
   * Issue 34's rest: after {@code CLUSTER FAILOVER} the old master keeps a BOUND session's
   * connection open and ends nothing, and the promoted replica has the session unbound. The
   * client re-ATTACHes the default session (GRACE 500) and an explicit BOUND session without a
   * grace on the new master: the server there names the session's new connection as its binding.
   * An election's observer and a {@code watch(name)} move to the new master's feed, report no
   * second leader and no repeat, and then report the queued candidate granted there.
   */
  @Test
  @Timeout(value = 180, unit = TimeUnit.SECONDS)
  void plannedFailoverReattachesBoundSessionsAndMovesObservers() throws Exception {
    String tag = "{fo-java-bound}";
    int old = client.nodeFor(tag).getPort();
    int neu = replicaOf(old);
    AtomicReference<String> lost = new AtomicReference<>();

    // a hold of the default session (a watchdog lock: it joins the client's default session)
    Lock inDefault = client.lock(tag + "d", Duration.ofSeconds(10), Lock.options().watchdog(true)
        .onLost((l, e) -> lost.compareAndSet(null, "d: " + e.reason())));
    assertTrue(inDefault.tryLock());
    Session dflt = inDefault.session();
    assertNotNull(dflt);
    assertEquals(LockClient.DEFAULT_GRACE, dflt.grace());
    // an explicit BOUND session without a grace, ttl 3 s, and a hold of it
    Session bound = client.session(Duration.ofSeconds(3), Session.options().bound(true).key(tag)
        .onLost(s -> lost.compareAndSet(null, "bound: " + s.lostReason()))).open();
    Lock inBound = client.lock(tag + "b", Duration.ZERO, Lock.options().session(bound)
        .onLost((l, e) -> lost.compareAndSet(null, "b: " + e.reason())));
    assertTrue(inBound.tryLock());
    for (Session s : List.of(dflt, bound)) {
      assertEquals(clientNamed(old, "redislock-session-" + s.serial()), sessionInfo(old, s.id()).get("bound"));
    }

    // an election: a leader, a candidate queued behind it, an observer and a watch(name)
    String name = tag + "leader";
    Election election = client.election(name);
    Election.Observation observer = election.observe();
    Election.Observation watcher = client.watch(name);
    assertNull(next(observer).leader());
    assertNull(next(watcher).leader());
    Election.Leadership a = election.campaign("node-a", Duration.ofSeconds(5),
        (l, e) -> lost.compareAndSet(null, "node-a: " + e.reason())).orElseThrow();
    Election.Leader leaderA = new Election.Leader("node-a", a.term());
    assertEquals(leaderA, next(observer).leader());
    assertEquals(leaderA, next(watcher).leader());
    CompletableFuture<Election.Leadership> b = new CompletableFuture<>();
    Thread candidate = new Thread(() -> {
      try {
        b.complete(client.election(name).campaign("node-b", Duration.ofSeconds(240), null).orElseThrow());
      } catch (Throwable e) {
        b.completeExceptionally(e);
      }
    });
    candidate.setDaemon(true);
    candidate.start();
    waitUntil("node-b queued on the old master", PATIENCE, () -> waiters(old, name) == 1);

    try (Jedis j = new Jedis("127.0.0.1", neu)) {
      assertEquals("OK", text(j.sendCommand(command("CLUSTER"), "FAILOVER")));
    }
    waitUntil("the replica to become master", PATIENCE, () -> role(neu) != null && text(role(neu).get(0)).equals("master"));

    // both sessions bound again, on the new master, to the connections the client made there
    waitUntil("the default session re-attached", PATIENCE, () -> dflt.reattachCount() >= 1);
    waitUntil("the bound session re-attached", PATIENCE, () -> bound.reattachCount() >= 1);
    for (Session s : List.of(dflt, bound)) {
      Long conn = clientNamed(neu, "redislock-session-" + s.serial());
      assertNotNull(conn, "the session's connection on the new master");
      assertEquals(conn, sessionInfo(neu, s.id()).get("bound"));
      waitUntil("the old master's session connection closed", PATIENCE,
          () -> clientNamed(old, "redislock-session-" + s.serial()) == null);
    }
    assertEquals(1, dflt.reattachCount());
    assertEquals(1, bound.reattachCount());
    assertEquals(inDefault.token(), fence(neu, tag + "d"));
    assertEquals(inBound.token(), fence(neu, tag + "b"));
    assertEquals(a.term(), fence(neu, name));

    // the observers moved to the new master's feed: the same leader, so nothing reported
    waitUntil("the observer moved", PATIENCE, () -> observer.movedCount() == 1);
    waitUntil("the watch moved", PATIENCE, () -> watcher.movedCount() == 1);
    waitUntil("node-b queued on the new master", PATIENCE, () -> waiters(neu, name) == 1);
    assertFalse(b.isDone());
    assertTrue(observer.next(Duration.ZERO).isEmpty());
    assertTrue(watcher.next(Duration.ZERO).isEmpty());

    // node-a steps down on the new master: both report node-b, granted there unasked
    assertTrue(a.resign());
    Election.Leadership lb = b.get(30, TimeUnit.SECONDS);
    Election.Leader leaderB = new Election.Leader("node-b", lb.term());
    assertTrue(lb.term() > a.term());
    for (Election.Observation o : List.of(observer, watcher)) {
      Election.Change c = next(o);
      if (c.leader() == null) {
        c = next(o); // the release seen before the handoff: free, then node-b
      }
      assertEquals(leaderB, c.leader());
      assertFalse(c.resync());
    }
    assertEquals(lb.term(), fence(neu, name));

    assertNull(lost.get());
    assertFalse(dflt.isLost() || bound.isLost() || inDefault.isLost() || inBound.isLost());
    observer.close();
    watcher.close();
    assertTrue(lb.resign());
    assertTrue(inDefault.release());
    assertEquals(1L, bound.end());
  }
}
