package io.redislock.shedlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.redislock.LockClient;
import io.redislock.LockInfo;
import io.redislock.testing.RedisServer;
import java.time.Duration;
import java.time.Instant;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import net.javacrumbs.shedlock.core.LockConfiguration;
import net.javacrumbs.shedlock.core.SimpleLock;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.RegisterExtension;

/**
 * The behaviours of ShedLock's provider test kit (AbstractLockProviderIntegrationTest and
 * AbstractExtensibleLockProviderIntegrationTest, which are not published), against a real
 * server: lock/unlock, a second lock refused while held, lockAtMostFor expiry, lockAtLeastFor
 * kept after unlock, extend, and what this provider adds (owner checks, waiting).
 */
class RedislockLockProviderTest {
  @RegisterExtension static RedisServer server = new RedisServer();

  static LockClient client;
  static RedislockLockProvider provider;

  @BeforeAll
  static void setUp() {
    client = server.client();
    provider = new RedislockLockProvider(client);
  }

  static String name() {
    return "task-" + System.nanoTime();
  }

  static LockConfiguration config(String name, Duration atMost, Duration atLeast) {
    return new LockConfiguration(Instant.now(), name, atMost, atLeast);
  }

  static LockInfo info(String name) {
    return client.info("shedlock:" + name);
  }

  /**
   * A run without lockAtLeastFor holds in the client's default session (a node that dies
   * mid-run frees it the grace after); one with lockAtLeastFor holds by its ttl alone, since
   * that tail must outlive the run and the process.
   */
  @Test
  void aRunWithoutLockAtLeastForIsInTheDefaultSessionOneWithItIsNot() {
    String n = name();
    SimpleLock lock = provider.lock(config(n, Duration.ofSeconds(30), Duration.ZERO)).orElseThrow();
    assertEquals(client.defaultSessions().get(0).serial(), info(n).holders().get(0).session());
    lock.unlock();
    String m = name();
    SimpleLock tail = provider.lock(config(m, Duration.ofSeconds(30), Duration.ofSeconds(20))).orElseThrow();
    assertNull(info(m).holders().get(0).session());
    tail.unlock();
    client.closeDefaultSessions(); // as the LockClient's close() does: the tail is kept
    long ttl = info(m).ttl();
    assertTrue(ttl > 10_000 && ttl <= 20_000, "held for lockAtLeastFor: " + ttl);
  }

  @Test
  void lockAndUnlock() {
    String n = name();
    SimpleLock lock = provider.lock(config(n, Duration.ofSeconds(30), Duration.ZERO)).orElseThrow();
    assertNotNull(info(n));
    lock.unlock();
    assertNull(info(n));
    assertTrue(provider.lock(config(n, Duration.ofSeconds(30), Duration.ZERO)).isPresent(), "lockable again");
  }

  @Test
  void aSecondLockIsRefusedWhileHeld() {
    String n = name();
    SimpleLock lock = provider.lock(config(n, Duration.ofSeconds(30), Duration.ZERO)).orElseThrow();
    assertTrue(provider.lock(config(n, Duration.ofSeconds(30), Duration.ZERO)).isEmpty());
    lock.unlock();
  }

  @Test
  void differentNamesDoNotInterfere() {
    SimpleLock a = provider.lock(config(name(), Duration.ofSeconds(30), Duration.ZERO)).orElseThrow();
    SimpleLock b = provider.lock(config(name(), Duration.ofSeconds(30), Duration.ZERO)).orElseThrow();
    a.unlock();
    b.unlock();
  }

  @Test
  void lockAtMostForExpires() {
    String n = name();
    provider.lock(config(n, Duration.ofMillis(100), Duration.ZERO)).orElseThrow();
    // the server hands an expired hold on: wait until it shows the key free
    io.redislock.testing.RedisServer.waitUntil("the hold expired", Duration.ofSeconds(10), () -> info(n) == null);
    assertTrue(provider.lock(config(n, Duration.ofSeconds(30), Duration.ZERO)).isPresent());
  }

  @Test
  void lockAtLeastForIsKeptAfterUnlock() {
    String n = name();
    SimpleLock lock = provider.lock(config(n, Duration.ofSeconds(30), Duration.ofSeconds(20))).orElseThrow();
    lock.unlock();
    LockInfo held = info(n);
    assertNotNull(held, "still held until lockAtLeastUntil");
    assertTrue(held.ttl() > 15_000 && held.ttl() <= 20_000, "ttl " + held.ttl());
    assertTrue(provider.lock(config(n, Duration.ofSeconds(30), Duration.ZERO)).isEmpty());
  }

  @Test
  void lockAtLeastForShorterThanTheRunReleasesAtOnce() {
    String n = name();
    SimpleLock lock = provider.lock(new LockConfiguration(Instant.now().minusSeconds(5), n, Duration.ofSeconds(30), Duration.ofSeconds(1)))
        .orElseThrow();
    lock.unlock();
    assertNull(info(n));
  }

  @Test
  void extendMovesTheDeadlineAndSpendsTheOldLock() {
    String n = name();
    SimpleLock lock = provider.lock(config(n, Duration.ofSeconds(2), Duration.ZERO)).orElseThrow();
    long token = info(n).token();
    SimpleLock extended = lock.extend(Duration.ofSeconds(60), Duration.ZERO).orElseThrow();
    assertTrue(info(n).ttl() > 50_000);
    assertEquals(token, info(n).token(), "the same hold");
    assertThrows(IllegalStateException.class, lock::unlock);
    assertThrows(IllegalStateException.class, () -> lock.extend(Duration.ofSeconds(1), Duration.ZERO));
    extended.unlock();
    assertNull(info(n));
  }

  @Test
  void extendOfAnExpiredLockFailsAndUnlockLeavesTheNextHolderAlone() {
    String n = name();
    SimpleLock stale = provider.lock(config(n, Duration.ofMillis(100), Duration.ZERO)).orElseThrow();
    io.redislock.testing.RedisServer.waitUntil("the hold expired", Duration.ofSeconds(10), () -> info(n) == null);
    SimpleLock next = provider.lock(config(n, Duration.ofSeconds(30), Duration.ZERO)).orElseThrow();
    long token = info(n).token();
    assertEquals(Optional.empty(), stale.extend(Duration.ofSeconds(30), Duration.ZERO), "owner-checked extend");
    SimpleLock stale2 = provider.lock(config(n + "-other", Duration.ofMillis(100), Duration.ZERO)).orElseThrow();
    stale2.unlock();
    assertEquals(token, info(n).token(), "the next run's lock is untouched");
    next.unlock();
  }

  @Test
  void anUnlockAfterExpiryDoesNotDeleteTheNextRunsLock() {
    String n = name();
    SimpleLock first = provider.lock(config(n, Duration.ofMillis(100), Duration.ZERO)).orElseThrow();
    io.redislock.testing.RedisServer.waitUntil("the hold expired", Duration.ofSeconds(10), () -> info(n) == null);
    SimpleLock second = provider.lock(config(n, Duration.ofSeconds(30), Duration.ZERO)).orElseThrow();
    long token = info(n).token();
    first.unlock(); // SET NX PX's DEL would delete the second run's lock here
    assertEquals(token, info(n).token());
    second.unlock();
  }

  @Test
  void waitingProviderQueuesInsteadOfSkipping() throws Exception {
    String n = name();
    SimpleLock held = provider.lock(config(n, Duration.ofSeconds(30), Duration.ZERO)).orElseThrow();
    RedislockLockProvider waiting = provider.waiting(Duration.ofSeconds(10));
    CompletableFuture<Optional<SimpleLock>> second = CompletableFuture.supplyAsync(
        () -> waiting.lock(config(n, Duration.ofSeconds(30), Duration.ZERO)));
    io.redislock.testing.RedisServer.waitUntil("the second run queued", Duration.ofSeconds(10), () -> info(n).waiters() == 1);
    assertFalse(second.isDone());
    held.unlock();
    SimpleLock got = second.get(10, TimeUnit.SECONDS).orElseThrow();
    got.unlock();
    assertNull(info(n));
  }
}
