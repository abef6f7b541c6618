package io.redislock;

import static io.redislock.ClusterFailoverTest.clientNamed;
import static io.redislock.ClusterFailoverTest.command;
import static io.redislock.ClusterFailoverTest.fence;
import static io.redislock.ClusterFailoverTest.role;
import static io.redislock.ClusterFailoverTest.sessionInfo;
import static io.redislock.ClusterFailoverTest.text;
import static io.redislock.testing.RedisServer.waitUntil;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.redislock.testing.Harness;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.Jedis;

/**
 * Issue 34, an unplanned failover: a 3+3 cluster from the harness (a cluster of its own: the
 * shard loses its replica for good), grants taken {@code durable(1)} in the client's default
 * session, in an explicit {@code BOUND GRACE} session and in a {@code BOUND} one without a
 * grace, then {@code SIGKILL} of the shard's
 * master and {@code CLUSTER FAILOVER FORCE} on its replica. What is asserted: every
 * acknowledged grant is on the new master with its token, the three sessions are re-{@code ATTACH}ed
 * there (the server names the client's new connection as their binding), nothing is reported
 * lost, a {@code watch(name)} moves to the new master's feed reporting nothing until the hold is
 * released there, and a new grant there gets a larger token. Also here, on the same cluster: an
 * observer whose subscription connection alone is killed subscribes again.
 */
class ClusterKillTest {
  static final Duration PATIENCE = ClusterFailoverTest.PATIENCE;
  static final int GRANTS = 10;

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

  static int replicaOf(int master) {
    for (int port : cluster.ports()) {
      List<?> r = role(port);
      if (r != null && text(r.get(0)).equals("slave") && ((Long) r.get(2)).intValue() == master) {
        return port;
      }
    }
    throw new AssertionError("no replica of " + master);
  }

  static long pidOf(int port) {
    try (Jedis j = new Jedis("127.0.0.1", port)) {
      for (String line : j.info("server").split("\r?\n")) {
        if (line.startsWith("process_id:")) {
          return Long.parseLong(line.substring("process_id:".length()).trim());
        }
      }
    }
    throw new AssertionError("no process_id in INFO server of " + port);
  }

  @Test
  @Timeout(value = 180, unit = TimeUnit.SECONDS)
  void killedMasterKeepsDurableGrantsAndReattachesSessions() throws Exception {
    String tag = "{kill-java}";
    int old = client.nodeFor(tag).getPort();
    int neu = replicaOf(old);
    AtomicReference<String> lost = new AtomicReference<>();

    // grants in the default session (onLost: watched through the feed too), each WAIT 1
    List<Lock> locks = new ArrayList<>();
    for (int i = 0; i < GRANTS; i++) {
      String n = "d" + i;
      Lock l = client.lock(tag + n, Duration.ofSeconds(60), Lock.options().durable(1, Duration.ofSeconds(10))
          .onLost((x, e) -> lost.compareAndSet(null, n + ": " + e.reason())));
      assertTrue(l.tryLock());
      locks.add(l);
    }
    Session dflt = locks.get(0).session();
    assertNotNull(dflt);
    // an explicit BOUND session with a grace, and a durable hold of it
    Session bound = client.session(Duration.ofSeconds(10), Session.options().bound(true).grace(Duration.ofSeconds(1))
        .key(tag).onLost(s -> lost.compareAndSet(null, "bound: " + s.lostReason()))).open();
    Lock inBound = client.lock(tag + "b", Duration.ZERO, Lock.options().session(bound).durable(1, Duration.ofSeconds(10))
        .onLost((x, e) -> lost.compareAndSet(null, "b: " + e.reason())));
    assertTrue(inBound.tryLock());
    locks.add(inBound);
    // and a BOUND session without a grace: on a live master its connection's close would end it
    Session strict = client.session(Duration.ofSeconds(10), Session.options().bound(true)
        .key(tag).onLost(s -> lost.compareAndSet(null, "strict: " + s.lostReason()))).open();
    Lock inStrict = client.lock(tag + "s", Duration.ZERO, Lock.options().session(strict).durable(1, Duration.ofSeconds(10))
        .onLost((x, e) -> lost.compareAndSet(null, "s: " + e.reason())));
    assertTrue(inStrict.tryLock());
    locks.add(inStrict);

    // a watch(name) on one of them: its feed connection dies with the master
    Election.Observation watcher = client.watch(tag + "d0");
    Election.Leader holder = new Election.Leader(locks.get(0).owner(), locks.get(0).token());
    assertEquals(holder, ClusterFailoverTest.next(watcher).leader());

    ProcessHandle master = ProcessHandle.of(pidOf(old)).orElseThrow();
    assertTrue(master.destroyForcibly()); // SIGKILL
    // (not onExit(): the harness, its parent, may not have reaped it yet)
    waitUntil("the killed master to stop answering", PATIENCE, () -> role(old) == null);
    try (Jedis j = new Jedis("127.0.0.1", neu)) {
      assertEquals("OK", text(j.sendCommand(command("CLUSTER"), "FAILOVER", "FORCE")));
    }
    waitUntil("the replica to become master", PATIENCE, () -> role(neu) != null && text(role(neu).get(0)).equals("master"));

    waitUntil("the default session re-attached", PATIENCE, () -> dflt.reattachCount() >= 1);
    waitUntil("the bound session re-attached", PATIENCE, () -> bound.reattachCount() >= 1);
    waitUntil("the session without a grace re-attached", PATIENCE, () -> strict.reattachCount() >= 1 || strict.isLost());
    for (Session s : List.of(dflt, bound, strict)) {
      Long conn = clientNamed(neu, "redislock-session-" + s.serial());
      assertNotNull(conn, "the session's connection on the new master");
      assertEquals(conn, sessionInfo(neu, s.id()).get("bound"));
    }
    assertEquals(1, dflt.reattachCount());
    assertEquals(1, bound.reattachCount());
    assertEquals(1, strict.reattachCount());
    for (Lock l : locks) {
      assertEquals(l.token(), fence(neu, l.name()), l.name());
      assertTrue(l.isHeld() && !l.isLost(), l.name());
    }
    assertNull(lost.get());
    assertFalse(dflt.isLost() || bound.isLost() || strict.isLost());
    // the watch moved to the new master's feed: the same holder there, so nothing reported
    waitUntil("the watch moved", PATIENCE, () -> watcher.movedCount() == 1);
    assertTrue(watcher.next(Duration.ZERO).isEmpty());

    // the holds go on there: released by their owners, and a new grant's token is larger
    long top = 0;
    for (Lock l : locks) {
      top = Math.max(top, l.token());
      assertTrue(l.release(), l.name());
    }
    Election.Change freed = ClusterFailoverTest.next(watcher);
    assertNull(freed.leader());
    assertFalse(freed.resync());
    watcher.close();
    Lock next = client.lock(tag + "d0", Duration.ofSeconds(10));
    assertTrue(next.tryLock());
    assertTrue(next.token() > top);
    assertTrue(next.release());
    assertNull(lost.get());
    assertEquals(0L, bound.end());
    assertEquals(0L, strict.end());
  }

  /**
   * An observer whose subscription connection alone is closed ({@code CLIENT KILL} on a master
   * that still serves the key): the observation subscribes again on the key's master, reads the
   * state there (the same holder: nothing reported), and reports the next changes.
   */
  @Test
  @Timeout(value = 120, unit = TimeUnit.SECONDS)
  void observerResubscribesAfterItsConnectionIsKilled() throws Exception {
    String name = "{obs-java}leader";
    int master = client.nodeFor(name).getPort();
    try (Election.Observation watcher = client.watch(name)) {
      assertNull(ClusterFailoverTest.next(watcher).leader());
      Lock l = client.lock(name, Duration.ofSeconds(30));
      assertTrue(l.tryLock());
      assertEquals(new Election.Leader(l.owner(), l.token()), ClusterFailoverTest.next(watcher).leader());
      try (Jedis j = new Jedis("127.0.0.1", master)) {
        long killed = 0;
        for (String line : j.clientList().split("\r?\n")) {
          if (line.contains(" name=" + Feed.SUB_NAME + "-")) {
            long id = Long.parseLong(line.substring(3, line.indexOf(' ')));
            killed += j.clientKill(redis.clients.jedis.params.ClientKillParams.clientKillParams().id(String.valueOf(id)));
          }
        }
        assertEquals(1L, killed, "the observer's one subscription on this master");
      }
      waitUntil("the observer subscribed again", PATIENCE, () -> watcher.movedCount() == 1);
      assertTrue(watcher.next(Duration.ZERO).isEmpty());
      assertTrue(l.release());
      Election.Change freed = ClusterFailoverTest.next(watcher);
      assertNull(freed.leader());
      assertFalse(freed.resync());
      assertTrue(l.tryLock());
      Election.Change again = ClusterFailoverTest.next(watcher);
      assertEquals(new Election.Leader(l.owner(), l.token()), again.leader());
      assertFalse(again.resync());
      assertTrue(l.release());
    }
  }
}
