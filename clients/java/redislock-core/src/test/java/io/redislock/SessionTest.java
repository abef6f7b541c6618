package io.redislock;

import static io.redislock.testing.RedisServer.waitUntil;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.redislock.testing.RedisServer;
import java.io.BufferedReader;
import java.io.File;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.RegisterExtension;
import redis.clients.jedis.Jedis;
import redis.clients.jedis.Protocol;

class SessionTest {
  @RegisterExtension static RedisServer server = new RedisServer();

  static LockClient client;
  static Jedis redis;

  @BeforeAll
  static void setUp() {
    client = server.client();
    redis = server.jedis();
  }

  static String key(String what) {
    return what + ":" + System.nanoTime();
  }

  @Test
  void holdsInASessionEndWithItsClose() throws Exception {
    Session s = client.session(Duration.ofSeconds(30), Session.options()).open();
    assertTrue(s.id().matches("\\{[^}]+\\}[0-9a-f]{32}"), s.id());
    String k1 = key("s1");
    String k2 = key("s2");
    Lock a = client.lock(k1, Duration.ZERO, Lock.options().session(s));
    Lock b = client.lock(k2, Duration.ofSeconds(30), Lock.options().session(s));
    assertTrue(a.tryLock());
    assertTrue(b.tryLock());
    assertEquals(-1, client.info(k1).holders().get(0).ttl(), "a session hold with no deadline of its own");
    assertEquals(2L, s.info().get("holds"));
    assertEquals(2L, s.end());
    assertNull(client.info(k1));
    assertNull(client.info(k2));
    assertEquals(0, a.token());
    LockException e = assertThrows(LockException.class, () -> client.lock(k1, Duration.ZERO, Lock.options().session(s)).tryLock());
    assertEquals("the session is closed", e.getMessage());
  }

  @Test
  void aBoundSessionIsLostWhenItsConnectionIsKilled() throws Exception {
    CompletableFuture<Session> sessionLost = new CompletableFuture<>();
    CompletableFuture<LockLostException> lockLost = new CompletableFuture<>();
    Session s = client.session(Duration.ofSeconds(30), Session.options().bound(true).onLost(sessionLost::complete)).open();
    String k = key("bound");
    Lock a = client.lock(k, Duration.ZERO, Lock.options().session(s).feed(false).onLost((l, e) -> lockLost.complete(e)));
    assertTrue(a.tryLock());
    Map<String, Object> info = s.info();
    long boundId = (Long) info.get("bound");
    redis.sendCommand(Protocol.Command.CLIENT, "KILL", "ID", String.valueOf(boundId));
    assertTrue(sessionLost.get(10, TimeUnit.SECONDS).lostReason().startsWith("connection lost"));
    assertTrue(lockLost.get(10, TimeUnit.SECONDS).reason().startsWith("session lost: connection lost"));
    waitUntil("the hold gone", Duration.ofSeconds(10), () -> client.info(k) == null);
  }


  /** A holder process killed with SIGKILL: its BOUND session ends, its lock passes on at once. */
  @Test
  void aKilledHolderProcessHandsItsLockOnAtOnce() throws Exception {
    String k = key("job");
    String java = Paths.get(System.getProperty("java.home"), "bin", "java").toString();
    String cp = System.getProperty("surefire.test.class.path", System.getProperty("java.class.path"));
    Process holder = new ProcessBuilder(java, "-cp", cp, HolderMain.class.getName(), String.valueOf(server.address().getPort()), k)
        .redirectError(ProcessBuilder.Redirect.INHERIT)
        .start();
    try {
      BufferedReader out = new BufferedReader(new InputStreamReader(holder.getInputStream(), StandardCharsets.UTF_8));
      String line = out.readLine();
      assertTrue(line != null && line.startsWith("token "), String.valueOf(line));
      long holderToken = Long.parseLong(line.substring(6));
      assertEquals("holder-process", client.info(k).owner());
      Lock waiter = client.lock(k, Duration.ofSeconds(30));
      CompletableFuture<Long> granted = new CompletableFuture<>();
      Thread t = new Thread(() -> {
        try {
          granted.complete(waiter.tryLock(20, TimeUnit.SECONDS) ? System.nanoTime() : -1L);
        } catch (Throwable e) {
          granted.completeExceptionally(e);
        }
      });
      t.start();
      waitUntil("the waiter queued", Duration.ofSeconds(10), () -> client.info(k).waiters() == 1);
      long killed = System.nanoTime();
      holder.destroyForcibly();
      long at = granted.get(20, TimeUnit.SECONDS);
      assertTrue(at > 0, "the waiter got the lock");
      long ms = TimeUnit.NANOSECONDS.toMillis(at - killed);
      System.out.println("killed holder: lock handed on " + ms + " ms after SIGKILL (session ttl 60 s)");
      assertTrue(ms < 10_000, "handed on by the connection's close, not the 60 s ttl: " + ms + " ms");
      assertTrue(waiter.token() > holderToken);
      waiter.unlock();
    } finally {
      holder.destroyForcibly();
      holder.waitFor(10, TimeUnit.SECONDS);
    }
  }
}
