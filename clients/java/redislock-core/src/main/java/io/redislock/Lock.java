package io.redislock;

import java.lang.management.ManagementFactory;
import java.time.Duration;
import java.util.List;
import java.util.Objects;
import java.util.UUID;
import java.util.concurrent.Callable;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.function.BiConsumer;
import redis.clients.jedis.CommandArguments;
import redis.clients.jedis.Connection;
import redis.clients.jedis.exceptions.JedisConnectionException;
import redis.clients.jedis.exceptions.JedisDataException;

/**
 * An exclusive lock held on the server ({@code LOCK.ACQUIRE}), as a
 * {@link java.util.concurrent.locks.Lock}.
 *
 * <p><b>Ownership is the handle's, not the thread's.</b> The hold belongs to this object: its
 * {@link #owner()} string (unique per handle) and the fencing {@link #token()} of the grant. Any
 * thread may unlock it, so it works from virtual threads, executors and reactive code; two
 * threads sharing one handle share one hold. Use one handle per holder. Not reentrant: a second
 * acquire on a handle that holds the lock is the server's idempotent retry (same token, deadline
 * moved), and one {@code unlock()} releases it.
 *
 * <p><b>Waiting</b> ({@link #tryLock(long, TimeUnit)}, {@link #lockInterruptibly()},
 * {@link #lock()}): one try first through the Jedis client, then one
 * {@code LOCK.ACQUIRE ... BLOCK ms} on a connection of its own: the server's FIFO queue does the
 * waiting, no polling, no pub/sub, and no socket timeout cuts and re-sends the wait. An interrupt
 * closes that connection; the server drops a disconnected waiter, and a grant that raced the
 * interrupt is released, so nothing is left held.
 *
 * <p><b>The default session</b>: a lock made without {@link Options#session} (and without
 * {@link Options#lockDelay}) holds in its client's default session ({@link LockClient}): it sends
 * {@code LOCK.ACQUIRE name owner ttl SESSION id}, so the hold keeps its own ttl as its deadline
 * (the watchdog, {@link #extend()} and {@code durable} work as ever) and also ends the grace
 * ({@link LockClient#DEFAULT_GRACE}) after the server saw this process's connection close: a
 * killed holder's lock is handed on within a second, not at its ttl. {@link Options#noSession()}
 * keeps the ttl-only hold.
 *
 * <p><b>Lifetime</b>: a hold lasts {@code ttl} from its grant. {@link #extend()} moves the
 * deadline; the watchdog ({@link Options#watchdog}) extends every third of the ttl; a loss (an
 * extend answered 0 or failed, the deadline passed, the session was lost, or the change feed
 * showed the hold gone, confirmed by LOCK.INFO) is reported once to {@link Options#onLost}.
 *
 * <p>{@link #newCondition()} is not supported: a condition would need the lock's waiters and
 * signals on the server, which the module does not have.
 */
public class Lock implements java.util.concurrent.locks.Lock {
  /** Settings of a lock handle; {@code Lock.options().watchdog(true)...}. */
  public static final class Options {
    String owner;
    boolean watchdog;
    Duration watchdogPeriod;
    BiConsumer<Lock, LockLostException> onLost;
    Session session;
    /** noSession(): no session at all, not even the client's default one. */
    boolean noSession;
    Duration lockDelay;
    int durable;
    Duration durableTimeout = Duration.ofSeconds(1);
    boolean feed = true;

    /** The owner string (default: host:pid:random UUID). Keep it unique per holder. */
    public Options owner(String owner) {
      this.owner = owner;
      return this;
    }

    /** Renew the hold every third of the ttl (or {@link #watchdogPeriod}) while held. */
    public Options watchdog(boolean on) {
      this.watchdog = on;
      return this;
    }

    public Options watchdogPeriod(Duration period) {
      this.watchdogPeriod = period;
      return this;
    }

    /** Called once when a hold is found lost, on a timer thread; keep it short. */
    public Options onLost(BiConsumer<Lock, LockLostException> onLost) {
      this.onLost = onLost;
      return this;
    }

    /**
     * Hold the lock in {@code session} ({@code SESSION id}): it ends when the session does.
     * {@code session(null)} is {@link #noSession()}.
     */
    public Options session(Session session) {
      this.session = session;
      this.noSession = session == null;
      return this;
    }

    /**
     * Hold by the ttl alone, in no session, not even the client's default one: the hold outlives
     * this process until its ttl (or a release) ends it, as before the default session.
     */
    public Options noSession() {
      return session(null);
    }

    /**
     * LOCKDELAY: after the hold expires, nobody gets the lock for this long (0 to 60 s). Such a
     * lock joins no default session: a hold in a session has its session's lock-delay, one for
     * all its holds, never one of its own, so it holds by its ttl alone.
     */
    public Options lockDelay(Duration delay) {
      this.lockDelay = delay;
      return this;
    }

    /**
     * With {@link #onLost}: watch the key through the client's change feed while held (default
     * true), so a loss (a DEL, a flush, another owner's grant) is reported at once, confirmed by
     * LOCK.INFO, rather than at the next renewal or the deadline.
     */
    public Options feed(boolean on) {
      this.feed = on;
      return this;
    }

    /** After a grant, WAIT until {@code replicas} acknowledged it (or DurabilityException). */
    public Options durable(int replicas, Duration timeout) {
      this.durable = replicas;
      this.durableTimeout = timeout;
      return this;
    }

    Options copy() {
      Options o = new Options();
      o.owner = owner;
      o.watchdog = watchdog;
      o.watchdogPeriod = watchdogPeriod;
      o.onLost = onLost;
      o.session = session;
      o.noSession = noSession;
      o.lockDelay = lockDelay;
      o.durable = durable;
      o.durableTimeout = durableTimeout;
      o.feed = feed;
      return o;
    }
  }

  public static Options options() {
    return new Options();
  }

  final LockClient client;
  final String name;
  final String owner;
  final Options options;
  /** The hold time in ms that acquire, extend and the watchdog ask for. */
  volatile long ttlMs;
  /** The current hold's token; 0 when not held. */
  volatile long token;
  private volatile String lostReason;
  private final Object state = new Object();
  private ScheduledFuture<?> watchdogTask;
  private ScheduledFuture<?> deadlineTask;
  /** True for a lock in its client's default session (no session given, no noSession, no lockDelay). */
  final boolean joinsDefault;
  /** The session of the current (or last) hold: the one given, the default one, or null. */
  volatile Session session;
  /** The feed watching this hold (with onLost), or null. */
  private volatile Feed feed;

  Lock(LockClient client, String name, Duration ttl, Options options) {
    this.client = Objects.requireNonNull(client, "client");
    this.name = Objects.requireNonNull(name, "name");
    this.options = options.copy();
    this.owner = options.owner != null ? options.owner : newOwner();
    if (owner.isEmpty()) {
      throw new IllegalArgumentException("owner must not be empty");
    }
    boolean inSession = options.session != null;
    this.session = options.session;
    this.joinsDefault = !inSession && !options.noSession && options.lockDelay == null;
    this.ttlMs = ttl.toMillis();
    if (ttlMs < 0 || (ttlMs == 0 && !inSession)) {
      throw new IllegalArgumentException("ttl must be a positive number of milliseconds (0 only in a session), got " + ttl);
    }
    if (inSession && options.watchdog) {
      throw new IllegalArgumentException("a lock in a session runs no watchdog: the session's keepalive covers it");
    }
    if (inSession && options.lockDelay != null) {
      throw new IllegalArgumentException("a lock in a session has its session's lockDelay");
    }
    if (options.watchdogPeriod != null && options.watchdogPeriod.toMillis() >= ttlMs) {
      throw new IllegalArgumentException("watchdogPeriod must be shorter than the ttl");
    }
  }

  static String newOwner() {
    return ManagementFactory.getRuntimeMXBean().getName() + ":" + UUID.randomUUID();
  }

  // --- what the other kinds change ---

  /** The keys the lock lives on (the first routes the command in a cluster). */
  List<String> keys() {
    return List.of(name);
  }

  /** SHARED [LIMIT n] for the shared kinds. */
  void modeArgs(CommandArguments args) {}

  CommandArguments acquireArgs(long blockMs) {
    CommandArguments args = client.args(Cmd.ACQUIRE).key(name).add(owner).add(ttlMs);
    modeArgs(args);
    sessionArgs(args);
    if (options.lockDelay != null) {
      args.add("LOCKDELAY").add(options.lockDelay.toMillis());
    }
    if (blockMs >= 0) {
      args.add("BLOCK").add(blockMs);
    }
    return args;
  }

  void sessionArgs(CommandArguments args) {
    Session s = session;
    if (s != null) {
      args.add("SESSION").add(s.usableId());
    }
  }

  CommandArguments releaseArgs() {
    return client.args(Cmd.RELEASE).key(name).add(owner);
  }

  CommandArguments extendArgs() {
    return client.args(Cmd.EXTEND).key(name).add(owner).add(ttlMs);
  }

  boolean renewed(Object reply) {
    return Long.valueOf(1).equals(reply);
  }

  boolean released(Object reply) {
    return Long.valueOf(1).equals(reply);
  }

  /** Record a grant's reply; the token. */
  long granted(Object reply) {
    token = (Long) reply;
    return token;
  }

  void forget() {
    token = 0;
  }

  /** The token this hold has on {@code key} (one per key for a MultiLock). */
  long tokenFor(String key) {
    return token;
  }

  // --- accessors ---

  /** The lock's key. */
  public String name() {
    return name;
  }

  /** Who holds it through this handle (the owner string sent to the server). */
  public String owner() {
    return owner;
  }

  /** The fencing token of the current hold; 0 when not held (tokens are >= 1). */
  public long token() {
    return token;
  }

  /** True while this handle has a grant it has not released or found lost (no round trip). */
  public boolean isHeld() {
    return token != 0 && lostReason == null;
  }

  /** The hold time acquire, extend and the watchdog ask for. */
  public Duration ttl() {
    return Duration.ofMillis(ttlMs);
  }

  /**
   * The session of the current (or last) hold: the one given in the options, the client's
   * default session once acquired in it, or null (noSession, lockDelay, not acquired yet).
   */
  public Session session() {
    return session;
  }

  /** True once the current hold was found lost. */
  public boolean isLost() {
    return lostReason != null;
  }

  /**
   * "not held", "expired", "extend failed: ...", "session lost: ...", "feed: EVENT" or
   * "feed: not held (LOCK.INFO)"; null while not lost.
   */
  public String lostReason() {
    return lostReason;
  }

  // --- acquire ---

  /**
   * Take the lock; true if granted, false if {@code timeout} passed first ({@code null}: no limit;
   * {@link Duration#ZERO}: one try). An interrupt ends the wait with InterruptedException and
   * leaves no grant behind.
   */
  public boolean acquire(Duration timeout) throws InterruptedException {
    if (Thread.interrupted()) {
      throw new InterruptedException();
    }
    long waitMs = timeout == null ? -1 : Math.max(0, timeout.toMillis());
    if (!client.followsFailover()) {
      return inDefaultSession(waitMs);
    }
    // Sentinel or a Cluster shard's failover: a wait queued on a primary that was demoted is
    // answered with an error there (UNBLOCKED, READONLY, MOVED, or its connection closed):
    // queue again, on the primary Jedis knows now, within the wait's own timeout. Sending
    // again is safe: the owner is the same, so a grant that did reach the new primary is
    // answered with its own token.
    long end = waitMs < 0 ? Long.MAX_VALUE : System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(waitMs);
    long pause = 20;
    while (true) {
      long left = waitMs < 0 ? -1 : Math.max(0, TimeUnit.NANOSECONDS.toMillis(end - System.nanoTime()));
      try {
        return inDefaultSession(left);
      } catch (JedisConnectionException | JedisDataException e) {
        boolean outOfTime = waitMs > 0 && System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(pause) >= end;
        if (!failoverError(e) || waitMs == 0 || outOfTime) {
          throw e;
        }
      }
      client.failoverSeen();
      Thread.sleep(pause); // an interrupt here leaves nothing: no command is on its way
      pause = Math.min(pause * 2, 500);
    }
  }

  /** An error of a primary that is being demoted, or of its closed connection: worth queueing again. */
  static boolean failoverError(RuntimeException e) {
    if (e instanceof JedisConnectionException) {
      return true;
    }
    String m = String.valueOf(e.getMessage());
    return m.startsWith("UNBLOCKED") || m.startsWith("READONLY") || m.startsWith("MOVED") || m.startsWith("CLUSTERDOWN");
  }

  /**
   * {@link #attempt}, in the client's default session if this lock joins it: an acquire that
   * meets that session's end ({@code ERR no such session}, or a waiter answered {@code ERR the
   * session ended while the client waited}) tries again in a new default session, at the back
   * of the queue, within what is left of {@code waitMs}.
   */
  private boolean inDefaultSession(long waitMs) throws InterruptedException {
    if (!joinsDefault) {
      return attempt(waitMs);
    }
    long end = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(Math.max(0, waitMs));
    for (int i = 1; ; i++) {
      Session s = session;
      if (token == 0 || s == null || !s.usable()) {
        s = client.defaultSession(keys().get(0));
        session = s;
      }
      long left = waitMs <= 0 ? waitMs : Math.max(1, TimeUnit.NANOSECONDS.toMillis(end - System.nanoTime()));
      try {
        return attempt(left);
      } catch (JedisDataException e) {
        if (!LockClient.sessionGone(e) || i == LockClient.DEFAULT_SESSION_ATTEMPTS) {
          throw e;
        }
        client.retireDefault(s);
        session = null;
      }
    }
  }

  /** One acquire: one try, then (waitMs != 0) one BLOCK wait of waitMs (-1: no limit). */
  private boolean attempt(long waitMs) throws InterruptedException {
    long before = token;
    Object reply;
    String key = keys().get(0);
    if (options.durable > 0) {
      return acquireDurable(key, waitMs, before);
    }
    reply = client.call(key, acquireArgs(-1)); // one try: most acquires are granted at once
    if (reply == null && waitMs != 0) {
      // Then one LOCK.ACQUIRE ... BLOCK on a connection of its own. The try above answered nil,
      // so this handle holds nothing there: the cleanup may release what a racing grant gave.
      CommandArguments blockArgs = acquireArgs(waitMs < 0 ? 0 : waitMs);
      reply = client.blockingCall(key, conn -> LockClient.blocking(conn, blockArgs), conn -> LockClient.on(conn, releaseArgs()));
    }
    if (reply == null) {
      return false;
    }
    granted(reply);
    held();
    return true;
  }

  private boolean acquireDurable(String key, long waitMs, long before) throws InterruptedException {
    CommandArguments args = acquireArgs(waitMs < 0 ? 0 : waitMs);
    long[] acked = {-1};
    Object reply = client.blockingCall(key, conn -> {
      Object r = LockClient.blocking(conn, args);
      if (r != null) {
        acked[0] = (Long) LockClient.on(conn, client.args(Cmd.WAIT).add(options.durable).add(options.durableTimeout.toMillis()));
      }
      return r;
    }, conn -> before != 0 ? null : LockClient.on(conn, releaseArgs()));
    if (reply == null) {
      return false;
    }
    long t = granted(reply);
    if (acked[0] < options.durable) {
      String what = name + ": " + acked[0] + " of " + options.durable + " replicas acknowledged the grant within "
          + options.durableTimeout.toMillis() + " ms";
      if (before != 0 && t == before) {
        held();
        throw new DurabilityException(what + "; the hold this lock already had is kept", acked[0], options.durable, false, true);
      }
      forget();
      client.call(key, releaseArgs());
      throw new DurabilityException(what + "; the grant was released", acked[0], options.durable, true, false);
    }
    held();
    return true;
  }

  /** One try: true if granted now. */
  @Override
  public boolean tryLock() {
    try {
      return acquire(Duration.ZERO);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return false;
    }
  }

  /** Wait up to {@code time} in the server's queue (one BLOCK command); false if it passed. */
  @Override
  public boolean tryLock(long time, TimeUnit unit) throws InterruptedException {
    return acquire(Duration.ofNanos(unit.toNanos(Math.max(0, time))));
  }

  /** Wait without limit; an interrupt ends the wait and leaves no grant behind. */
  @Override
  public void lockInterruptibly() throws InterruptedException {
    acquire(null);
  }

  /**
   * Wait without limit, not interruptible (as {@code java.util.concurrent.locks.Lock#lock}): an
   * interrupt during the wait ends that wait cleanly, the wait starts again, and the interrupt
   * status is set again on return.
   */
  @Override
  public void lock() {
    boolean interrupted = false;
    while (true) {
      try {
        acquire(null);
        break;
      } catch (InterruptedException e) {
        interrupted = true;
      }
    }
    if (interrupted) {
      Thread.currentThread().interrupt();
    }
  }

  /**
   * Acquire (waiting up to {@code timeout}, null: no limit), run {@code body}, release on every
   * exit path. LockBusyException if the wait ran out.
   */
  public <T> T using(Duration timeout, Callable<T> body) throws Exception {
    if (!acquire(timeout)) {
      throw new LockBusyException("could not acquire " + name + " within " + timeout);
    }
    try {
      return body.call();
    } finally {
      try {
        release();
      } catch (RuntimeException ignored) {
        // the body's result or error is what the caller wants to see
      }
    }
  }

  /** A grant arrived: the deadline, the watchdog, the session's record. */
  void held() {
    synchronized (state) {
      lostReason = null;
      if (ttlMs > 0) {
        armDeadline(System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(ttlMs));
      }
      if (options.watchdog && watchdogTask == null) {
        long period = options.watchdogPeriod != null ? options.watchdogPeriod.toMillis() : Math.max(1, ttlMs / 3);
        watchdogTask = client.scheduler().scheduleWithFixedDelay(this::renew, period, period, TimeUnit.MILLISECONDS);
      }
    }
    Session s = session;
    if (s != null && s.hold(this)) {
      lose("session lost: " + s.lostReason());
      return;
    }
    if (options.onLost != null && options.feed) {
      try {
        Feed f;
        do {
          f = client.feedFor(keys().get(0));
          feed = f;
        } while (!f.hold(this)); // closed meanwhile (its last hold left): the next one
      } catch (RuntimeException e) {
        // The grant stands: a feed that cannot watch leaves the report to the watchdog and the
        // deadline, as with feed(false), rather than failing an acquire that succeeded.
        feed = null;
      }
    }
  }

  /** Watch this hold through {@code f} (its feed broke in a failover: the new primary's). */
  boolean watchThrough(Feed f) {
    if (!isHeld()) {
      return true;
    }
    feed = f;
    return f.hold(this);
  }

  private void unwatch() {
    Feed f = feed;
    feed = null;
    if (f != null) {
      f.drop(this);
    }
  }

  private void armDeadline(long atNanos) {
    synchronized (state) {
      if (deadlineTask != null) {
        deadlineTask.cancel(false);
      }
      long delay = Math.max(0, atNanos - System.nanoTime());
      deadlineTask = client.scheduler().schedule(() -> lose("expired"), delay, TimeUnit.NANOSECONDS);
    }
  }

  /** The watchdog's tick: LOCK.EXTEND; a 0 or an error is a loss. */
  private void renew() {
    long sent = System.nanoTime();
    boolean ok;
    try {
      ok = renewed(client.call(keys().get(0), extendArgs()));
    } catch (RuntimeException e) {
      if (client.followsFailover() && (e instanceof JedisConnectionException || e instanceof JedisDataException)
          && failoverError(e)) {
        return; // a failover under way: the next tick tries the new primary; the deadline still ends it
      }
      lose("extend failed: " + e.getMessage());
      return;
    }
    if (!ok) {
      lose("not held");
      return;
    }
    synchronized (state) {
      if (watchdogTask != null && lostReason == null && token != 0) {
        armDeadline(sent + TimeUnit.MILLISECONDS.toNanos(ttlMs));
      }
    }
  }

  private void stopTimers() {
    synchronized (state) {
      if (watchdogTask != null) {
        watchdogTask.cancel(false);
        watchdogTask = null;
      }
      if (deadlineTask != null) {
        deadlineTask.cancel(false);
        deadlineTask = null;
      }
    }
  }

  /** The hold is gone: stop renewing, report once. */
  void lose(String reason) {
    synchronized (state) {
      if (token == 0 || lostReason != null) {
        return;
      }
      lostReason = reason;
    }
    stopTimers();
    unwatch();
    Session s = session;
    if (s != null) {
      s.forget(this);
    }
    LockLostException error = new LockLostException("lost " + name + ": " + reason, reason);
    if (options.onLost != null) {
      try {
        options.onLost.accept(this, error);
      } catch (RuntimeException ignored) {
        // a throwing callback must not stop the timer thread
      }
    }
  }

  /** Its session was closed: the server released the hold cleanly; nothing to report. */
  void sessionClosed() {
    stopTimers();
    unwatch();
    forget();
  }

  // --- release, extend, queries ---

  /** Give the lock back; true if this handle held it, false if it was lost already. */
  public boolean release() {
    stopTimers();
    unwatch();
    Session s = session;
    if (s != null) {
      s.forget(this);
    }
    forget();
    return released(client.call(keys().get(0), releaseArgs()));
  }

  /**
   * Release the hold. LockNotOwnedException (an IllegalMonitorStateException) if this handle
   * holds nothing; LockLostException if it held a grant that was lost meanwhile (the server had
   * no hold to release).
   */
  @Override
  public void unlock() {
    if (token == 0) {
      throw new LockNotOwnedException(name + " is not held by this handle (owner " + owner + ")");
    }
    String reason = lostReason;
    if (!release()) {
      String why = reason != null ? reason : "not held";
      throw new LockLostException("lost " + name + " before unlock: " + why, why);
    }
  }

  /** LOCK.EXTEND with the lock's ttl: true if still held (the deadline moved), false if lost. */
  public boolean extend() {
    return extend(null);
  }

  /** Set the deadline to now + {@code ttl} (which replaces the lock's ttl, also for the watchdog). */
  public boolean extend(Duration ttl) {
    if (ttl != null) {
      if (ttl.toMillis() <= 0) {
        throw new IllegalArgumentException("ttl must be positive, got " + ttl);
      }
      ttlMs = ttl.toMillis();
    }
    long sent = System.nanoTime();
    boolean ok = renewed(client.call(keys().get(0), extendArgs()));
    if (ok && token != 0 && lostReason == null) {
      armDeadline(sent + TimeUnit.MILLISECONDS.toNanos(ttlMs));
    }
    if (!ok) {
      lose("not held");
    }
    return ok;
  }

  /** True if anyone holds the lock (LOCK.FENCE key). */
  public boolean isLocked() {
    return client.call(name, client.args(Cmd.FENCE).key(name)) != null;
  }

  /** True if this handle's hold is the live one (LOCK.FENCE key token). */
  public boolean isOwned() {
    long t = token;
    return t != 0 && Long.valueOf(1).equals(client.call(name, client.args(Cmd.FENCE).key(name).add(t)));
  }

  /**
   * Run {@code command key args...} only while this hold is live (LOCK.FENCE and the command in
   * one script); its reply, or StaleTokenException.
   */
  public Object fenced(String command, String key, Object... args) {
    return Fence.call(client, name, token, command, key, args);
  }

  /** Not supported: the module has no condition variables. */
  @Override
  public Condition newCondition() {
    throw new UnsupportedOperationException("redislock locks have no conditions: use a queue or the change feed");
  }

  @Override
  public String toString() {
    return getClass().getSimpleName() + "[" + name + ", owner=" + owner + ", token=" + token + "]";
  }
}
