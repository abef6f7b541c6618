package io.redislock;

import static io.redislock.testing.RedisServer.waitUntil;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.redislock.testing.Harness;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.Jedis;
import redis.clients.jedis.exceptions.JedisConnectionException;
import redis.clients.jedis.exceptions.JedisDataException;

/**
 * The client through Jedis's Sentinel-backed {@code JedisSentineled} ({@link LockClient#sentinel}):
 * a primary, a replica and one Sentinel from the harness, then {@code SENTINEL FAILOVER}. What
 * docs/scaling-out.md ("Primary, replicas and Sentinel") and clients/java/README.md promise: a
 * hold acknowledged by the replica is on the new primary with its token, new grants go to the new
 * primary, a waiter queued on the old primary is answered with an error there and, queued again
 * by the client, granted on the new primary.
 */
class SentinelTest {
  static final String MASTER = "mymaster";

  Harness primary;
  Harness replica;
  Harness sentinel;
  LockClient client;

  @AfterEach
  void stop() {
    if (client != null) {
      client.close();
    }
    for (Harness h : new Harness[] {sentinel, replica, primary}) {
      if (h != null) {
        h.close();
      }
    }
  }

  static Jedis at(int port) {
    return new Jedis("127.0.0.1", port);
  }

  /** The fields of one entry of SENTINEL REPLICAS (a flat list of names and values). */
  static Map<String, String> fields(List<?> flat) {
    Map<String, String> m = new java.util.HashMap<>();
    for (int i = 0; i + 1 < flat.size(); i += 2) {
      m.put(String.valueOf(flat.get(i)), String.valueOf(flat.get(i + 1)));
    }
    return m;
  }

  /** The Sentinel lists the replica, its link to the primary up: a SENTINEL FAILOVER can pick it. */
  static boolean sentinelSeesReplica(Jedis s, int replicaPort) {
    Object reply = s.sendCommand(redis.clients.jedis.Protocol.Command.SENTINEL, "REPLICAS", MASTER);
    for (Object r : (List<?>) reply) {
      List<String> entry = new java.util.ArrayList<>();
      for (Object x : (List<?>) r) {
        entry.add(x instanceof byte[] ? new String((byte[]) x) : String.valueOf(x));
      }
      Map<String, String> f = fields(entry);
      if (String.valueOf(replicaPort).equals(f.get("port")) && "slave".equals(f.get("flags"))
          && "ok".equals(f.get("master-link-status"))) {
        return true;
      }
    }
    return false;
  }

  @Test
  @Timeout(value = 120, unit = TimeUnit.SECONDS)
  void sentinelFailoverKeepsHoldsAndRequeuesTheWaiter() throws Exception {
    primary = Harness.server();
    replica = Harness.server("--replica-of", String.valueOf(primary.port()));
    sentinel = Harness.sentinel(primary.port(), MASTER);
    try (Jedis s = at(sentinel.port())) {
      waitUntil("the Sentinel to see the replica online", Duration.ofSeconds(30), () -> sentinelSeesReplica(s, replica.port()));
    }
    client = LockClient.sentinel(MASTER, Set.of(new HostAndPort("127.0.0.1", sentinel.port())),
        DefaultJedisClientConfig.builder().build(), DefaultJedisClientConfig.builder().build());
    assertEquals(primary.port(), client.nodeFor("k").getPort());

    // a hold the replica acknowledged (WAIT 1), and one waiter of this client queued behind it.
    // A ttl-only hold (noSession): Sentinel demotes the old primary only some 8 s after the
    // switch, and there the client's default session gets no keepalive (they go to the new
    // primary), so a hold of it could end there first and hand "k" to the raw waiter below on
    // the doomed primary; this scenario is about what that waiter is answered.
    Lock holder = client.lock("k", Duration.ofSeconds(60), Lock.options().noSession().durable(1, Duration.ofSeconds(5)));
    assertTrue(holder.tryLock());
    long t1 = holder.token();
    // a watchdog hold and a session's hold (ttl 10 s, renewed every 3.3 s), both acknowledged
    java.util.concurrent.atomic.AtomicReference<String> lost = new java.util.concurrent.atomic.AtomicReference<>();
    Lock renewed = client.lock("wd", Duration.ofSeconds(10), Lock.options().watchdog(true)
        .durable(1, Duration.ofSeconds(5)).onLost((l, e) -> lost.set("wd: " + e.reason())));
    assertTrue(renewed.tryLock());
    Session session = client.session(Duration.ofSeconds(10), Session.options().onLost(x -> lost.set("session: " + x.lostReason()))).open();
    Lock inSession = client.lock("sk", Duration.ZERO, Lock.options().session(session).durable(1, Duration.ofSeconds(5)));
    assertTrue(inSession.tryLock());
    Lock waiter = client.lock("k", Duration.ofSeconds(60));
    CompletableFuture<Boolean> queued = new CompletableFuture<>();
    Thread w = new Thread(() -> {
      try {
        queued.complete(waiter.acquire(Duration.ofSeconds(90)));
      } catch (Throwable e) {
        queued.completeExceptionally(e);
      }
    });
    w.setDaemon(true);
    w.start();
    // and a raw waiter on the old primary, to see what a waiter there is answered
    CompletableFuture<Object> raw = new CompletableFuture<>();
    Thread r = new Thread(() -> {
      try (Jedis j = at(primary.port())) {
        raw.complete(j.sendBlockingCommand(command("LOCK.ACQUIRE"), "k", "raw-waiter", "60000", "BLOCK", "90000"));
      } catch (Throwable e) {
        raw.completeExceptionally(e);
      }
    });
    r.setDaemon(true);
    r.start();
    try (Jedis p = at(primary.port())) {
      waitUntil("two waiters on the old primary", Duration.ofSeconds(30), () -> waiters(p, "k") == 2);
    }

    try (Jedis s = at(sentinel.port())) {
      Object ok = s.sendCommand(redis.clients.jedis.Protocol.Command.SENTINEL, "FAILOVER", MASTER);
      assertEquals("OK", new String((byte[]) ok, java.nio.charset.StandardCharsets.UTF_8));
    }
    waitUntil("Jedis to follow the failover to the replica", Duration.ofSeconds(60),
        () -> client.nodeFor("k").getPort() == replica.port());

    // the raw waiter on the old primary was answered with an error there, not granted
    Throwable rawError = assertThrows(java.util.concurrent.ExecutionException.class, () -> raw.get(30, TimeUnit.SECONDS)).getCause();
    if (rawError instanceof JedisDataException) {
      assertTrue(rawError.getMessage().startsWith("UNBLOCKED"), rawError.getMessage());
    } else {
      // Sentinel closes the demoted primary's connections: the reply may be that close
      assertInstanceOf(JedisConnectionException.class, rawError);
    }

    try (Jedis n = at(replica.port())) {
      waitUntil("the new primary to answer as one", Duration.ofSeconds(30), () -> n.info("replication").contains("role:master"));
      // the hold is there with its token; the client's waiter queued again there (the raw one did not)
      assertEquals(t1, n.sendCommand(command("LOCK.FENCE"), "k"));
      waitUntil("the waiter queued again on the new primary", Duration.ofSeconds(30), () -> waiters(n, "k") == 1);
      assertFalse(queued.isDone(), "the waiter ended: " + queued);
      assertTrue(holder.isOwned());
      assertTrue(holder.extend());

      // a new grant goes to the new primary
      Lock other = client.lock("other", Duration.ofSeconds(60));
      assertTrue(other.tryLock());
      assertEquals(other.token(), n.sendCommand(command("LOCK.FENCE"), "other"));
      assertTrue(other.token() > t1, "a token of the new primary after the old one's: " + other.token() + " vs " + t1);

      // the watchdog and the keepalive went on there: the ttls fall, then go back up on the new primary
      assertEquals(null, lost.get());
      waitUntil("the watchdog renewing on the new primary", Duration.ofSeconds(30), () -> n.pttl("wd") < 8500);
      waitUntil("the watchdog renewing on the new primary", Duration.ofSeconds(30), () -> n.pttl("wd") > 9000);
      waitUntil("the keepalive on the new primary", Duration.ofSeconds(30), () -> sessionTtl(n, session.id()) < 8500);
      waitUntil("the keepalive on the new primary", Duration.ofSeconds(30), () -> sessionTtl(n, session.id()) > 9000);
      assertEquals(null, lost.get());
      // the watchdog hold is in the client's default session: kept through the failover
      assertTrue(renewed.session() != null && renewed.session().usable(), String.valueOf(renewed.session()));
      assertEquals(renewed.token(), n.sendCommand(command("LOCK.FENCE"), "wd"));
      assertEquals(inSession.token(), n.sendCommand(command("LOCK.FENCE"), "sk"));
      assertEquals(1L, session.end());
      assertTrue(renewed.release());

      // the release hands the lock to the waiter there
      assertTrue(holder.release());
      assertTrue(queued.get(30, TimeUnit.SECONDS));
      assertTrue(waiter.token() > t1);
      assertEquals(waiter.token(), n.sendCommand(command("LOCK.FENCE"), "k"));
      assertTrue(waiter.release());
      assertTrue(other.release());
    }
  }

  /** LOCK.SESSION INFO's ttl (ms left). */
  static long sessionTtl(Jedis j, String id) {
    List<?> l = (List<?>) j.sendCommand(command("LOCK.SESSION"), "INFO", id);
    for (int i = 0; i + 1 < l.size(); i += 2) {
      if ("ttl".equals(new String((byte[]) l.get(i), java.nio.charset.StandardCharsets.UTF_8))) {
        return (Long) l.get(i + 1);
      }
    }
    throw new AssertionError("no ttl in LOCK.SESSION INFO");
  }

  static long waiters(Jedis j, String key) {
    Object info = j.sendCommand(command("LOCK.INFO"), key);
    if (info == null) {
      return 0;
    }
    List<?> l = (List<?>) info;
    for (int i = 0; i + 1 < l.size(); i += 2) {
      Object name = l.get(i);
      if ("waiters".equals(name instanceof byte[] ? new String((byte[]) name) : String.valueOf(name))) {
        return (Long) l.get(i + 1);
      }
    }
    throw new AssertionError("no waiters in LOCK.INFO " + key);
  }

  static redis.clients.jedis.commands.ProtocolCommand command(String name) {
    byte[] raw = name.getBytes(java.nio.charset.StandardCharsets.UTF_8);
    return () -> raw;
  }
}
