package io.redislock;

import static io.redislock.testing.RedisServer.waitUntil;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.redislock.testing.RedisServer;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.RegisterExtension;
import redis.clients.jedis.Jedis;
import redis.clients.jedis.Protocol;

/**
 * The client's default session (issue 29): every lock made without a session joins one BOUND
 * session with GRACE per client and server, so a killed holder's locks are handed on the grace
 * after its connection closed, a blip (CLIENT KILL of the bound connection) is re-ATTACHed with
 * every hold kept, and {@code noSession()} keeps the ttl-only hold.
 */
class DefaultSessionTest {
  @RegisterExtension static RedisServer server = new RedisServer();

  static Jedis redis;

  @BeforeAll
  static void setUp() {
    redis = server.jedis();
  }

  static String key(String what) {
    return what + ":" + System.nanoTime();
  }

  /** One field of INFO lock, as a number. */
  static long infoLock(String field) {
    for (String line : redis.info("lock").split("\r?\n")) {
      if (line.startsWith(field + ":")) {
        return Long.parseLong(line.substring(field.length() + 1).trim());
      }
    }
    throw new AssertionError("no " + field + " in INFO lock");
  }

  /** The server's clock (TIME), in ms. */
  static long serverMillis() {
    List<String> t = redis.time();
    return Long.parseLong(t.get(0)) * 1000 + Long.parseLong(t.get(1)) / 1000;
  }

  /** The session serial LOCK.INFO shows on {@code key}'s first holder (null: a hold in no session). */
  static Long holderSession(LockClient client, String key) {
    return client.info(key).holders().get(0).session();
  }

  /** The serials of every session on the server (LOCK.SESSION LIST, as an administrator). */
  static List<Long> sessionSerials() {
    List<Long> out = new ArrayList<>();
    String cursor = "0";
    do {
      List<?> page = (List<?>) redis.sendCommand(Cmd.SESSION, "LIST", cursor, "COUNT", "1000");
      cursor = new String((byte[]) page.get(0));
      for (Object entry : (List<?>) page.get(1)) {
        List<?> f = (List<?>) entry;
        for (int i = 0; i + 1 < f.size(); i += 2) {
          if (new String((byte[]) f.get(i)).equals("serial")) {
            out.add((Long) f.get(i + 1));
          }
        }
      }
    } while (!cursor.equals("0"));
    return out;
  }

  /** A waiter in this process, granted {@code key} later: the grant's server time in ms, or -1. */
  static CompletableFuture<Long> waitFor(Lock waiter, Duration timeout) {
    CompletableFuture<Long> granted = new CompletableFuture<>();
    Thread t = new Thread(() -> {
      try {
        granted.complete(waiter.tryLock(timeout.toMillis(), TimeUnit.MILLISECONDS) ? serverMillis() : -1L);
      } catch (Throwable e) {
        granted.completeExceptionally(e);
      }
    }, "default-session-test-waiter");
    t.setDaemon(true);
    t.start();
    return granted;
  }

  /**
   * A holder process made as README.md's first example (a 30 s ttl, nothing else) is killed
   * with SIGKILL: the waiter here is granted while the dead hold still had most of its 30 s (by
   * the server's clock), because its default session ended the grace after the kill.
   */
  @Test
  void aKilledHolderProcessHandsOnLongBeforeItsTtl() throws Exception {
    String k = key("killed");
    Process holder = DefaultHolderMain.start(server.address().getPort(), k);
    try {
      long holderToken = DefaultHolderMain.token(holder);
      assertNotNull(holderSession(server.client(), k), "the holder's lock is in its default session");
      LockClient client = server.client();
      Lock waiter = client.lock(k, Duration.ofSeconds(30));
      CompletableFuture<Long> granted = waitFor(waiter, Duration.ofSeconds(20));
      waitUntil("the waiter queued", Duration.ofSeconds(10), () -> client.info(k).waiters() == 1);
      long graceExpired = infoLock("lock_sessions_grace_expired");
      long ttlLeft = client.info(k).ttl();
      long killedAt = serverMillis();
      holder.destroyForcibly();
      long grantedAt = granted.get(20, TimeUnit.SECONDS);
      assertTrue(grantedAt > 0, "the waiter got the lock");
      assertTrue(ttlLeft > 15_000, "the dead hold had " + ttlLeft + " ms of its 30 s left when killed");
      assertTrue(grantedAt - killedAt < ttlLeft / 2,
          "granted " + (grantedAt - killedAt) + " ms after the kill (server clock), the dead hold had " + ttlLeft + " ms left");
      assertTrue(waiter.token() > holderToken);
      assertEquals(graceExpired + 1, infoLock("lock_sessions_grace_expired"), "the dead holder's session ran out its grace");
      waiter.unlock();
    } finally {
      holder.destroyForcibly();
      holder.waitFor(10, TimeUnit.SECONDS);
    }
  }

  /** noSession(): the killed holder's hold stays until its ttl, as before the default session. */
  @Test
  void noSessionKeepsTheTtlOnlyHold() throws Exception {
    String k = key("nosession");
    long sessions = infoLock("lock_sessions_opened");
    Process holder = DefaultHolderMain.start(server.address().getPort(), k, "nosession");
    long holderToken;
    try {
      holderToken = DefaultHolderMain.token(holder);
      assertNull(holderSession(server.client(), k), "a hold in no session");
      assertEquals(sessions, infoLock("lock_sessions_opened"), "the holder opened no session");
    } finally {
      holder.destroyForcibly();
      holder.waitFor(10, TimeUnit.SECONDS);
    }
    LockClient client = server.client();
    // a default session would have ended the grace after the kill: wait past it (time passing
    // is the point), the hold must still be there
    Thread.sleep(LockClient.DEFAULT_GRACE.toMillis() * 3);
    LockInfo info = client.info(k);
    assertNotNull(info, "still held");
    assertEquals(holderToken, info.token());
    assertTrue(info.ttl() > 20_000, "held by its ttl: " + info.ttl() + " ms left");
    assertFalse(client.lock(k, Duration.ofSeconds(30)).tryLock());

    // a lock given noSession() (or session(null)) in this process: no SESSION sent
    String k2 = key("nosession-here");
    Lock a = client.lock(k2, Duration.ofSeconds(30), Lock.options().session(null));
    assertTrue(a.tryLock());
    assertNull(a.session());
    assertNull(holderSession(client, k2));
    a.unlock();
    // lockDelay also means no default session (a session hold has its session's lock-delay)
    Lock d = client.lock(k2, Duration.ofSeconds(30), Lock.options().lockDelay(Duration.ofMillis(10)));
    assertTrue(d.tryLock());
    assertNull(d.session());
    assertNull(holderSession(client, k2));
    d.unlock();
  }

  /** Every kind of lock made without a session, and an election, share one default session. */
  @Test
  void oneDefaultSessionForEveryLockOfAClient() throws Exception {
    LockClient client = server.client();
    List<Long> before = sessionSerials();
    long opened = infoLock("lock_sessions_opened");
    String p = key("many");
    Lock lock = client.lock(p + ":lock", Duration.ofSeconds(30), Lock.options().watchdog(true));
    Semaphore sem = client.semaphore(p + ":sem", 2, Duration.ofSeconds(30));
    ReadWriteLock rw = client.readWriteLock(p + ":rw", Duration.ofSeconds(30));
    Lock write = client.readWriteLock(p + ":rw2", Duration.ofSeconds(30)).writeLock();
    MultiLock multi = client.multiLock(List.of(p + ":m1", p + ":m2"), Duration.ofSeconds(30));
    assertTrue(lock.tryLock());
    assertTrue(sem.tryLock());
    assertTrue(rw.readLock().tryLock());
    assertTrue(write.tryLock());
    assertTrue(multi.tryLock());
    Election.Leadership leader = client.election(p + ":leader").campaign("me", Duration.ZERO, null).orElseThrow();

    assertEquals(1, client.defaultSessions().size());
    Session s = client.defaultSessions().get(0);
    for (Lock l : List.of(lock, sem, rw.readLock(), write, multi, leader.lock())) {
      assertSame(s, l.session(), l.toString());
    }
    for (String k : List.of(p + ":lock", p + ":sem", p + ":rw", p + ":rw2", p + ":m1", p + ":m2", p + ":leader")) {
      assertEquals(s.serial(), holderSession(client, k), k);
    }
    assertEquals(opened + 1, infoLock("lock_sessions_opened"), "one OPEN for all of them");
    List<Long> after = sessionSerials();
    after.removeAll(before);
    assertEquals(List.of(s.serial()), after, "LOCK.SESSION LIST shows the one new session");
    Map<String, Object> info = s.info();
    assertEquals(7L, info.get("holds"));
    assertEquals(LockClient.DEFAULT_GRACE.toMillis(), info.get("grace"));
    assertNotNull(info.get("bound"));
    assertNull(info.get("detached"));
    // the hold keeps its own ttl as its deadline (the watchdog renews it as ever)
    long ttl = client.info(p + ":lock").ttl();
    assertTrue(ttl > 0 && ttl <= 30_000, String.valueOf(ttl));
    assertTrue(lock.extend(Duration.ofSeconds(40)));
    assertTrue(client.info(p + ":lock").ttl() > 30_000);
    lock.unlock();
    sem.unlock();
    rw.readLock().unlock();
    write.unlock();
    multi.unlock();
    assertTrue(leader.resign());
    assertEquals(0L, s.info().get("holds"));
  }

  /**
   * A blip: CLIENT KILL of the default session's bound connection while the process lives. The
   * session is re-ATTACHed on a new connection within the grace: every hold keeps its token, no
   * loss is reported, LOCK.SESSION INFO shows it bound to the new connection.
   */
  @Test
  void aKilledBoundConnectionIsReattachedAndEveryHoldKept() throws Exception {
    LockClient client = server.client();
    List<LockLostException> losses = new CopyOnWriteArrayList<>();
    String p = key("blip");
    List<Lock> locks = new ArrayList<>();
    for (int i = 0; i < 3; i++) {
      Lock l = client.lock(p + ":" + i, Duration.ofSeconds(30), Lock.options().onLost((lock, e) -> losses.add(e)));
      assertTrue(l.tryLock());
      locks.add(l);
    }
    Session s = client.defaultSessions().get(0);
    long oldBound = (Long) s.info().get("bound");
    long reattached = infoLock("lock_sessions_reattached");
    redis.sendCommand(Protocol.Command.CLIENT, "KILL", "ID", String.valueOf(oldBound));
    waitUntil("the session re-attached", Duration.ofSeconds(10), () -> s.reattachCount() == 1);
    Map<String, Object> info = s.info();
    assertNotEquals(oldBound, info.get("bound"));
    assertNotNull(info.get("bound"));
    assertNull(info.get("detached"));
    assertEquals(3L, info.get("holds"));
    assertEquals(reattached + 1, infoLock("lock_sessions_reattached"));
    assertTrue(redis.clientList().contains(" name=redislock-session-" + s.serial() + " "), "the new connection is named");
    for (Lock l : locks) {
      assertEquals(1L, redis.sendCommand(Cmd.FENCE, l.name(), String.valueOf(l.token())), l.name());
      assertTrue(l.isHeld());
    }
    assertSame(s, client.defaultSessions().get(0));
    assertEquals(List.of(), losses);
    for (Lock l : locks) {
      l.unlock();
    }
  }

  /**
   * The session ended under the client (an administrator's LOCK.SESSION KILL, then its
   * connection killed: ATTACH answers nil): each hold reports the loss once through onLost, and
   * the next acquire opens a new default session.
   */
  @Test
  void aDefaultSessionThatEndedReportsItsHoldsLost() throws Exception {
    LockClient client = server.client();
    CompletableFuture<LockLostException> lost = new CompletableFuture<>();
    String k = key("ended");
    Lock l = client.lock(k, Duration.ofSeconds(30), Lock.options().feed(false).onLost((lock, e) -> lost.complete(e)));
    assertTrue(l.tryLock());
    Session s = l.session();
    long bound = (Long) s.info().get("bound");
    assertEquals(1L, redis.sendCommand(Cmd.SESSION, "KILL", String.valueOf(s.serial())));
    redis.sendCommand(Protocol.Command.CLIENT, "KILL", "ID", String.valueOf(bound));
    LockLostException e = lost.get(10, TimeUnit.SECONDS);
    assertTrue(e.reason().startsWith("session lost: "), e.reason());
    assertTrue(s.isLost());
    assertTrue(l.isLost());
    Lock next = client.lock(key("after"), Duration.ofSeconds(30));
    assertTrue(next.tryLock());
    assertNotEquals(s.serial(), next.session().serial(), "a new default session");
    next.unlock();
  }

  /** Closing the client closes its default session: every hold released at once (CLOSE). */
  @Test
  void closingTheClientClosesItsDefaultSession() throws Exception {
    LockClient client = LockClient.connect(server.address());
    String k1 = key("close1");
    String k2 = key("close2");
    Lock a = client.lock(k1, Duration.ofSeconds(30));
    Lock b = client.lock(k2, Duration.ofSeconds(30));
    assertTrue(a.tryLock());
    assertTrue(b.tryLock());
    long serial = a.session().serial();
    assertTrue(sessionSerials().contains(serial));
    long closed = infoLock("lock_sessions_closed");
    client.close();
    assertEquals(closed + 1, infoLock("lock_sessions_closed"));
    assertFalse(sessionSerials().contains(serial));
    assertNull(server.client().info(k1));
    assertNull(server.client().info(k2));
    assertEquals(0, a.token());
  }
}
