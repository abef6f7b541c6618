package io.redislock.spring;

import static io.redislock.testing.RedisServer.waitUntil;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNotSame;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.redislock.LockClient;
import io.redislock.testing.RedisServer;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Lock;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.RegisterExtension;

/** The behaviours Spring Integration's own registry tests check, against a real server. */
class RedislockLockRegistryTest {
  @RegisterExtension static RedisServer server = new RedisServer();

  static LockClient clientA;
  static LockClient clientB;

  @BeforeAll
  static void setUp() {
    clientA = server.client();
    clientB = server.client();
  }

  static String key() {
    return "k" + System.nanoTime();
  }

  /** The registry's holds are in the client's default session: a dead process frees them fast. */
  @Test
  void holdsAreInTheClientsDefaultSession() throws Exception {
    RedislockLockRegistry registry = new RedislockLockRegistry(clientA, "app");
    String k = key();
    Lock lock = registry.obtain(k);
    lock.lock();
    try {
      assertEquals(clientA.defaultSessions().get(0).serial(), clientA.info(registry.keyOf(k)).holders().get(0).session());
    } finally {
      lock.unlock();
    }
  }

  @Test
  void obtainReturnsOneLockPerKeyReentrantForItsThread() throws Exception {
    RedislockLockRegistry registry = new RedislockLockRegistry(clientA, "app");
    String k = key();
    Lock lock = registry.obtain(k);
    assertSame(lock, registry.obtain(k));
    assertNotSame(lock, registry.obtain(key()));
    lock.lock();
    lock.lock(); // reentrant
    assertNotNull(clientA.info(registry.keyOf(k)));
    CompletableFuture<Boolean> otherThread = CompletableFuture.supplyAsync(lock::tryLock);
    assertFalse(otherThread.get(5, TimeUnit.SECONDS), "another thread of this JVM waits its turn");
    CompletableFuture<Void> foreignUnlock = CompletableFuture.runAsync(lock::unlock);
    Exception e = assertThrows(Exception.class, () -> foreignUnlock.get(5, TimeUnit.SECONDS));
    assertTrue(e.getCause() instanceof IllegalStateException);
    lock.unlock();
    assertNotNull(clientA.info(registry.keyOf(k)), "held until the last unlock");
    lock.unlock();
    assertNull(clientA.info(registry.keyOf(k)));
  }

  @Test
  void twoRegistriesAsTwoProcessesExcludeEachOtherAndHandOverInOrder() throws Exception {
    RedislockLockRegistry a = new RedislockLockRegistry(clientA, "app");
    RedislockLockRegistry b = new RedislockLockRegistry(clientB, "app");
    String k = key();
    Lock la = a.obtain(k);
    Lock lb = b.obtain(k);
    assertTrue(la.tryLock(1, TimeUnit.SECONDS));
    assertFalse(lb.tryLock(100, TimeUnit.MILLISECONDS));
    CompletableFuture<Boolean> waiting = CompletableFuture.supplyAsync(() -> {
      try {
        return lb.tryLock(10, TimeUnit.SECONDS);
      } catch (InterruptedException e) {
        throw new RuntimeException(e);
      }
    });
    waitUntil("b queued on the server", Duration.ofSeconds(10), () -> clientA.info(a.keyOf(k)).waiters() == 1);
    la.unlock();
    assertTrue(waiting.get(10, TimeUnit.SECONDS));
  }

  @Test
  void executeLockedRunsUnderTheLock() throws Exception {
    RedislockLockRegistry registry = new RedislockLockRegistry(clientA, "app");
    String k = key();
    String seen = registry.executeLocked(k, () -> clientA.info(registry.keyOf(k)) != null ? "held" : "free");
    assertEquals("held", seen);
    assertNull(clientA.info(registry.keyOf(k)));
  }

  @Test
  void renewLockExtendsAndRefusesWhatTheThreadDoesNotHold() {
    RedislockLockRegistry registry = new RedislockLockRegistry(clientA, "app", Duration.ofSeconds(2));
    String k = key();
    Lock lock = registry.obtain(k);
    assertThrows(IllegalStateException.class, () -> registry.renewLock(k));
    lock.lock();
    RedislockLockRegistry longer = new RedislockLockRegistry(clientA, "app", Duration.ofSeconds(60));
    assertThrows(IllegalStateException.class, () -> longer.renewLock(k), "not this registry's hold");
    registry.renewLock(k);
    assertTrue(clientA.info(registry.keyOf(k)).ttl() > 1000);
    clientA.jedis().del(registry.keyOf(k));
    assertThrows(IllegalStateException.class, () -> registry.renewLock(k), "lost on the server");
    assertThrows(IllegalStateException.class, lock::unlock, "expired in the store");
  }

  @Test
  void anExpiredHoldIsReportedAtUnlock() {
    RedislockLockRegistry registry = new RedislockLockRegistry(clientA, "app", Duration.ofMillis(100));
    String k = key();
    Lock lock = registry.obtain(k);
    lock.lock();
    waitUntil("the hold expired", Duration.ofSeconds(10), () -> clientA.info(registry.keyOf(k)) == null);
    assertThrows(IllegalStateException.class, lock::unlock);
    assertTrue(lock.tryLock(), "released locally all the same");
    lock.unlock();
  }

  @Test
  void expireUnusedOlderThanForgetsUnlockedLocks() {
    RedislockLockRegistry registry = new RedislockLockRegistry(clientA, "app");
    String k1 = key();
    String k2 = key();
    Lock l1 = registry.obtain(k1);
    Lock l2 = registry.obtain(k2);
    l2.lock();
    registry.expireUnusedOlderThan(-1);
    assertNotSame(l1, registry.obtain(k1), "unused: forgotten");
    assertSame(l2, registry.obtain(k2), "held: kept");
    l2.unlock();
  }

  @Test
  void newConditionIsUnsupported() {
    RedislockLockRegistry registry = new RedislockLockRegistry(clientA, "app");
    assertThrows(UnsupportedOperationException.class, () -> registry.obtain(key()).newCondition());
  }
}
