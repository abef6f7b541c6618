package io.redislock;

import static io.redislock.testing.RedisServer.waitUntil;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.redislock.testing.RedisServer;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.RegisterExtension;
import redis.clients.jedis.exceptions.JedisDataException;

/** ReadWriteLock, Semaphore and MultiLock: the shared holds and the multi-key lock. */
class SharedTest {
  @RegisterExtension static RedisServer server = new RedisServer();

  static LockClient client;

  @BeforeAll
  static void setUp() {
    client = server.client();
  }

  static String key(String what) {
    return what + ":" + System.nanoTime();
  }

  static CompletableFuture<Long> inThread(Lock lock) {
    CompletableFuture<Long> f = new CompletableFuture<>();
    Thread t = new Thread(() -> {
      try {
        lock.lockInterruptibly();
        f.complete(lock.token());
      } catch (Throwable e) {
        f.completeExceptionally(e);
      }
    });
    t.setDaemon(true);
    t.start();
    return f;
  }

  @Test
  void readersShareAWriterWaitsAndLaterReadersQueueBehindIt() throws Exception {
    String k = key("report");
    ReadWriteLock r1 = client.readWriteLock(k, Duration.ofSeconds(30));
    ReadWriteLock r2 = client.readWriteLock(k, Duration.ofSeconds(30));
    ReadWriteLock w = client.readWriteLock(k, Duration.ofSeconds(30), Lock.options().owner("writer"));
    assertTrue(r1.readLock().tryLock());
    assertTrue(r2.readLock().tryLock());
    LockInfo info = client.info(k);
    assertEquals("shared", info.mode());
    assertEquals(2, info.holders().size());
    assertEquals(r2.readLock().token(), info.token(), "the largest live token");
    assertFalse(w.writeLock().tryLock());
    CompletableFuture<Long> writer = inThread(w.writeLock());
    waitUntil("the writer queued", Duration.ofSeconds(10), () -> client.info(k).waiters() == 1);
    ReadWriteLock r3 = client.readWriteLock(k, Duration.ofSeconds(30));
    assertFalse(r3.readLock().tryLock(), "no reader overtakes a queued writer");
    // no upgrade: a reader asking for the write side of its own owner is refused by the server
    JedisDataException e = assertThrows(JedisDataException.class,
        () -> client.lock(k, Duration.ofSeconds(1), Lock.options().owner(r1.readLock().owner())).tryLock());
    assertEquals("ERR owner holds this lock SHARED; release it before acquiring it exclusively", e.getMessage());
    r1.readLock().unlock();
    assertFalse(writer.isDone());
    r2.readLock().unlock();
    long t = writer.get(10, TimeUnit.SECONDS);
    assertEquals(t, client.info(k).token());
    assertEquals("writer:write", client.info(k).owner());
    assertEquals("exclusive", client.info(k).mode());
    w.writeLock().unlock();
    assertNull(client.info(k));
  }

  @Test
  void aSemaphoreGrantsItsPermitsAndQueuesTheRest() throws Exception {
    String k = key("payments-api");
    Semaphore a = client.semaphore(k, 2, Duration.ofSeconds(30));
    Semaphore b = client.semaphore(k, 2, Duration.ofSeconds(30));
    Semaphore c = client.semaphore(k, 2, Duration.ofSeconds(30));
    assertTrue(a.tryLock());
    assertTrue(b.tryLock());
    assertTrue(b.token() > a.token());
    assertFalse(c.tryLock());
    Long limit = client.info(k).limit();
    assertEquals(2L, limit);
    JedisDataException e = assertThrows(JedisDataException.class, () -> client.semaphore(k, 3, Duration.ofSeconds(1)).tryLock());
    assertEquals("ERR this lock is held SHARED with LIMIT 2; acquire it with SHARED LIMIT 2", e.getMessage());
    CompletableFuture<Long> third = inThread(c);
    waitUntil("the third queued", Duration.ofSeconds(10), () -> client.info(k).waiters() == 1);
    a.unlock();
    long t = third.get(10, TimeUnit.SECONDS);
    assertTrue(t > b.token());
    assertEquals(2, client.info(k).holders().size());
    b.unlock();
    c.unlock();
    assertNull(client.info(k));
  }

  @Test
  void aMultiLockTakesEveryKeyOrNone() throws Exception {
    String tag = "{order:" + System.nanoTime() + "}";
    List<String> keys = List.of(tag + ":sku1", tag + ":sku2", tag + ":sku3");
    MultiLock m = client.multiLock(keys, Duration.ofSeconds(30));
    assertTrue(m.tryLock());
    assertEquals(3, m.tokens().size());
    for (int i = 0; i < 3; i++) {
      assertEquals(m.tokens().get(i), client.info(keys.get(i)).token());
      assertEquals(m.owner(), client.info(keys.get(i)).owner());
    }
    assertEquals(m.tokens().get(2), m.token(), "token() is the largest");
    MultiLock other = client.multiLock(List.of(tag + ":sku3", tag + ":sku4"), Duration.ofSeconds(30));
    assertFalse(other.tryLock());
    assertNull(client.info(tag + ":sku4"), "none: sku4 was not taken");
    assertTrue(m.extend(Duration.ofSeconds(60)));
    assertTrue(client.info(keys.get(1)).ttl() > 50_000);
    CompletableFuture<Long> waiting = inThread(other);
    waitUntil("the set queued", Duration.ofSeconds(10), () -> client.info(tag + ":sku3").waiters() == 1);
    m.unlock();
    waiting.get(10, TimeUnit.SECONDS);
    assertEquals(other.owner(), client.info(tag + ":sku4").owner());
    other.unlock();
    assertNull(client.info(tag + ":sku3"));
  }
}
