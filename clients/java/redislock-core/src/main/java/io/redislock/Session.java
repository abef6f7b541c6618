package io.redislock;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;
import redis.clients.jedis.CommandArguments;
import redis.clients.jedis.Connection;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.exceptions.JedisDataException;

/**
 * One lease for many holds ({@code LOCK.SESSION}), like an etcd lease or a ZooKeeper session,
 * kept alive by one keepalive every third of its ttl however many locks it holds. A lock made
 * with {@code Lock.options().session(s)} acquires with {@code SESSION id} and runs no watchdog;
 * its hold ends when the session ends (or at its own deadline; a ttl of 0 means none).
 *
 * <p>{@link Options#bound}: the session is opened {@code BOUND} on a connection of its own that
 * carries nothing else and is watched by a thread blocked reading it. The server ends a bound
 * session the moment that connection closes, so a holder process that dies (crash,
 * {@code kill -9}) hands its locks on at once, not at a ttl.
 *
 * <p>{@link Options#grace}: a bound session opened {@code BOUND GRACE ms}. When its connection
 * drops while this process lives ({@code CLIENT KILL}, a proxy or the network closing it) the
 * server keeps the session that long, <em>detached</em>; the watching thread sees the close at
 * once and binds the session to a new connection ({@code LOCK.SESSION ATTACH}), so every hold
 * keeps its token. A killed process's holds are handed on the grace after its connection closed.
 * The client's default session ({@link LockClient#DEFAULT_GRACE}) is one of these.
 *
 * <p>A loss is reported once ({@link #lostReason()}, {@link Options#onLost}, and each hold as
 * {@code "session lost: <reason>"}): {@code "ended"} (KEEPALIVE answered nil),
 * {@code "keepalive failed: ..."}, {@code "connection lost: ..."} (bound, without a grace, or
 * no re-ATTACH landed within it), {@code "grace ran out: ..."} (ATTACH answered nil).
 *
 * <p>In a cluster ({@link LockClient#cluster}) a bound session follows its slot's failover, with
 * a grace or without: the promoted replica has it unbound (it lives by its ttl) and the old
 * master, a replica now, keeps the old connection open and ends nothing. The first keepalive
 * routed to the new master (Jedis follows {@code MOVED}) sees the slot moved and the session is
 * re-{@code ATTACH}ed there, the old connection closed; a bound connection that drops (a killed
 * master) is re-ATTACHed on the slot's master, found again, within the ttl from the last
 * keepalive. Only ATTACH answering nil ({@code "ended: ..."} without a grace) or that ttl
 * passing is a loss.
 */
public final class Session implements AutoCloseable {
  /** Settings of a session: {@code Session.options().bound(true)...}. */
  public static final class Options {
    boolean bound;
    Duration lockDelay;
    String key;
    Consumer<Session> onLost;
    Duration keepalivePeriod;
    Duration grace;

    /** End the session the moment its connection closes (its holder died). */
    public Options bound(boolean bound) {
      this.bound = bound;
      return this;
    }

    /** After an unclean loss nobody gets what a hold had for this long (0 to 60 s). */
    public Options lockDelay(Duration delay) {
      this.lockDelay = delay;
      return this;
    }

    /** In a cluster: a key the session will lock; its node opens it (a session is one node's). */
    public Options key(String key) {
      this.key = key;
      return this;
    }

    /** Called once when the session is lost, on a timer or watcher thread. */
    public Options onLost(Consumer<Session> onLost) {
      this.onLost = onLost;
      return this;
    }

    public Options keepalivePeriod(Duration period) {
      this.keepalivePeriod = period;
      return this;
    }

    /**
     * With {@link #bound}: {@code GRACE ms}, how long the server keeps the session after its
     * connection drops, for this client to re-{@code ATTACH} it on a new connection (0 to 60 s,
     * at most the ttl; null or 0: none, a dropped connection ends the session).
     */
    public Options grace(Duration grace) {
      this.grace = grace;
      return this;
    }
  }

  public static Options options() {
    return new Options();
  }

  private final LockClient client;
  private final long ttlMs;
  private final Options options;
  private final Set<Lock> holds = ConcurrentHashMap.newKeySet();
  private volatile String id;
  private volatile Long serial;
  private volatile boolean closed;
  private volatile String lostReason;
  private volatile Connection conn;
  /** The node {@link #conn} goes to: a cluster's failover moves the slot away from it. */
  private volatile HostAndPort connNode;
  /** True while a re-ATTACH runs (after a drop, or a failover seen by a keepalive). */
  private final java.util.concurrent.atomic.AtomicBoolean following = new java.util.concurrent.atomic.AtomicBoolean();
  private ScheduledFuture<?> keepalive;
  /** How many times a dropped bound connection was replaced by a re-ATTACH. */
  private volatile int reattached;
  /** When a keepalive (or OPEN) was last answered: a failover's retries end a ttl after it. */
  private volatile long lastKept;

  Session(LockClient client, Duration ttl, Options options) {
    this.client = client;
    this.ttlMs = ttl.toMillis();
    this.options = options;
    if (ttlMs <= 0) {
      throw new IllegalArgumentException("ttl must be positive, got " + ttl);
    }
    if (client.isCluster() && options.key == null) {
      throw new IllegalArgumentException("a session in a cluster belongs to one node: name a key it will lock (key)");
    }
    if (options.keepalivePeriod != null && options.keepalivePeriod.toMillis() >= ttlMs) {
      throw new IllegalArgumentException("keepalivePeriod must be shorter than the ttl");
    }
    if (graceMs() > 0 && !options.bound) {
      throw new IllegalArgumentException("a grace needs a bound session (only a bound session outlives its connection)");
    }
  }

  private long graceMs() {
    return options.grace == null ? 0 : options.grace.toMillis();
  }

  /** The grace ({@code GRACE ms}) the session was opened with; zero without one. */
  public Duration grace() {
    return Duration.ofMillis(graceMs());
  }

  /** How many times this bound session was re-{@code ATTACH}ed on a new connection after a drop. */
  public int reattachCount() {
    return reattached;
  }

  /** The session id ({@code {tag}} and 32 hex digits), null before open(). A secret. */
  public String id() {
    return id;
  }

  public boolean isBound() {
    return options.bound;
  }

  public boolean isClosed() {
    return closed;
  }

  public boolean isLost() {
    return lostReason != null;
  }

  /** "ended", "keepalive failed: ..." or "connection lost: ..."; null while not lost. */
  public String lostReason() {
    return lostReason;
  }

  private String routeKey() {
    return options.key != null ? options.key : id;
  }

  private CommandArguments openArgs() {
    CommandArguments args = client.args(Cmd.SESSION).add("OPEN").add(ttlMs);
    if (options.bound) {
      args.add("BOUND");
      if (graceMs() > 0) {
        args.add("GRACE").add(graceMs());
      }
    }
    if (options.lockDelay != null) {
      args.add("LOCKDELAY").add(options.lockDelay.toMillis());
    }
    return args;
  }

  /** Open the session and start its keepalive; this. */
  public synchronized Session open() {
    if (id != null) {
      throw new LockException("this session was opened already; make a new one");
    }
    Object reply;
    if (options.bound) {
      HostAndPort node = client.nodeFor(options.key != null ? options.key : "");
      Connection c = client.dedicated(options.key != null ? options.key : "");
      try {
        reply = LockClient.on(c, openArgs());
        if (reply != null) {
          nameAfterSerial(c, reply.toString());
        }
      } catch (RuntimeException e) {
        c.close();
        throw e;
      }
      conn = c;
      connNode = node;
      watch(c);
    } else if (client.isCluster()) {
      // OPEN has no key: send it to the node of the key the session will lock
      try (Connection c = client.dedicated(options.key)) {
        reply = LockClient.on(c, openArgs());
      }
    } else {
      reply = client.call(null, openArgs());
    }
    if (reply == null) {
      throw new LockException("LOCK.SESSION OPEN answered nil");
    }
    id = reply.toString();
    lastKept = System.nanoTime();
    long period = options.keepalivePeriod != null ? options.keepalivePeriod.toMillis() : Math.max(1, ttlMs / 3);
    keepalive = client.scheduler().scheduleWithFixedDelay(this::keepalive, period, period, TimeUnit.MILLISECONDS);
    return this;
  }

  /**
   * Name the bound connection {@code redislock-session-<serial>} (the serial from {@code
   * LOCK.SESSION INFO}; never the id), so that {@code CLIENT LIST} says whose it is. Best effort:
   * a server without the serial, or a user refused {@code CLIENT SETNAME}, leaves it unnamed.
   */
  private void nameAfterSerial(Connection c, String sessionId) {
    Object info;
    try {
      info = LockClient.on(c, client.args(Cmd.SESSION).add("INFO").key(sessionId));
    } catch (JedisDataException refused) {
      return;
    }
    Object s = info == null ? null : LockInfo.fields(info).get("serial");
    if (s instanceof Long) {
      serial = (Long) s;
      LockClient.setName(c, "redislock-session-" + s);
    }
  }

  private void watch(Connection c) {
    Thread watcher = new Thread(() -> watchConnection(c), "redislock-session-watch");
    watcher.setDaemon(true);
    watcher.start();
  }

  /** The bound connection carries nothing after OPEN: a read returns only when it closes. */
  private void watchConnection(Connection c) {
    String why;
    try {
      c.setTimeoutInfinite();
      c.getOne();
      why = "unexpected reply on the bound connection";
    } catch (RuntimeException e) {
      why = String.valueOf(e.getMessage());
    }
    if (conn != c) {
      return; // replaced by a re-ATTACH elsewhere (a failover): this close was ours
    }
    if ((graceMs() > 0 || client.isCluster()) && !closed && lostReason == null) {
      // a cluster's master killed: its replica, promoted, has the session unbound (grace or not)
      follow(why, c);
    } else {
      lose("connection lost: " + why);
    }
  }

  /**
   * Cluster clients: a keepalive (routed by Jedis, which follows {@code MOVED}) found that the session's slot is
   * served by another node than the one its bound connection goes to: a cluster failover. The
   * old master, a replica now, keeps that connection open and ends nothing, and the promoted
   * replica has the session unbound (it lives by its ttl there): bind it to a connection to the
   * new master ({@code ATTACH}), then close the old one. On a thread of its own: the tries sleep.
   */
  private void followIfMoved() {
    Connection c = conn;
    HostAndPort was = connNode;
    if (!options.bound || !client.isCluster() || c == null || was == null || closed || lostReason != null) {
      return;
    }
    HostAndPort now;
    try {
      now = client.nodeFor(routeKey());
    } catch (RuntimeException unknown) {
      return; // no slot table now: the next keepalive looks again
    }
    if (now == null || now.equals(was) || following.get()) {
      return;
    }
    Thread t = new Thread(() -> follow("the slot moved from " + was + " to " + now, c), "redislock-session-follow");
    t.setDaemon(true);
    t.start();
  }

  /**
   * {@link #reattach}, one at a time, for the connection {@code c} it replaces: a try under way
   * is waited for (it may have just replaced {@code c}, or be about to give up on another).
   */
  private void follow(String why, Connection c) {
    while (!following.compareAndSet(false, true)) {
      if (conn != c || closed || lostReason != null) {
        return;
      }
      try {
        Thread.sleep(10);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        return;
      }
    }
    try {
      if (conn == c) {
        reattach(why, c);
      }
    } finally {
      following.set(false);
    }
  }

  /**
   * The bound connection dropped and the server keeps the session its grace: bind it to a new
   * connection ({@code LOCK.SESSION ATTACH id}) before the grace ends. Tried again every 10 ms
   * while the server still lists the old connection (it may not have seen the close yet) or no
   * connection can be made; lost when ATTACH answers nil (the grace ran out) or the time is up.
   * The time is the grace from now (the drop was seen at once), or for a client that follows
   * failovers the session's ttl from its last keepalive (a promoted replica keeps the session,
   * unbound, that long).
   */
  private void reattach(String why, Connection old) {
    long deadline = client.followsFailover()
        ? lastKept + TimeUnit.MILLISECONDS.toNanos(ttlMs)
        : System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(graceMs());
    String last = why;
    int tries = 0;
    while (!closed && lostReason == null) {
      Connection c = null;
      if (client.isCluster() && tries++ % 5 == 0) {
        client.failoverSeen(); // the slot table learnt again: the slot's master now
      }
      try {
        HostAndPort node = client.nodeFor(routeKey());
        c = client.dedicated(routeKey());
        Object reply = LockClient.on(c, client.args(Cmd.SESSION).add("ATTACH").key(id));
        if (reply == null) {
          c.close();
          lose((graceMs() > 0 ? "grace ran out" : "ended")
              + ": ATTACH answered nil after the connection was lost (" + why + ")");
          return;
        }
        synchronized (this) {
          if (closed || lostReason != null) {
            c.close();
            return;
          }
          conn = c;
          connNode = node;
          reattached++;
        }
        old.close(); // a failover's old master keeps it open: the session is bound here now
        if (serial != null) {
          LockClient.setName(c, "redislock-session-" + serial);
        }
        lastKept = System.nanoTime();
        watch(c);
        return;
      } catch (RuntimeException e) {
        if (c != null) {
          c.close();
        }
        last = String.valueOf(e.getMessage());
      }
      if (System.nanoTime() - deadline >= 0) {
        break;
      }
      try {
        Thread.sleep(10);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        break;
      }
    }
    lose("connection lost: " + why + "; no ATTACH within the grace (" + last + ")");
  }

  private void keepalive() {
    try {
      Object remaining = client.call(routeKey(), client.args(Cmd.SESSION).add("KEEPALIVE").key(id));
      if (remaining == null) {
        lose("ended");
      } else {
        lastKept = System.nanoTime();
        followIfMoved();
      }
    } catch (RuntimeException e) {
      // Sentinel: a keepalive that met a failover (a closed connection, READONLY) is tried
      // again at the next period on the primary Jedis knows then, until the ttl from the last
      // one answered has passed.
      boolean retry = client.followsFailover() && Lock.failoverError(e)
          && System.nanoTime() - lastKept < TimeUnit.MILLISECONDS.toNanos(ttlMs);
      if (!retry) {
        lose("keepalive failed: " + e.getMessage());
      } else {
        client.failoverSeen();
        followIfMoved();
      }
    }
  }

  /**
   * The session's serial (what {@code LOCK.SESSION LIST} and {@code LOCK.INFO} show, never the
   * id), learnt by a BOUND session when it opens; its connection is named {@code
   * redislock-session-<serial>}. Null for an unbound session, or a server that does not say it.
   */
  public Long serial() {
    return serial;
  }

  /** The id for an acquire's {@code SESSION id}; LockException if the session cannot take holds. */
  String usableId() {
    if (id == null) {
      throw new LockException("the session is not open: call open() first");
    }
    if (closed) {
      throw new LockException("the session is closed");
    }
    if (lostReason != null) {
      throw new LockException("the session was lost (" + lostReason + "): open a new one");
    }
    return id;
  }

  /** True while acquires may join it: open, not closed, not lost. */
  boolean usable() {
    return id != null && !closed && lostReason == null;
  }

  /** LOCK.SESSION INFO as a map (bound, holds, lockdelay, ttl, serial, grace, detached), or null. */
  public Map<String, Object> info() {
    Object reply = client.call(routeKey(), client.args(Cmd.SESSION).add("INFO").key(usableIdOrOpen()));
    return reply == null ? null : LockInfo.fields(reply);
  }

  private String usableIdOrOpen() {
    if (id == null) {
      throw new LockException("the session is not open: call open() first");
    }
    return id;
  }

  /**
   * End the session (CLOSE): its holds are released with no lock-delay. The number released, or
   * null if the server had no such session (or it was closed or lost already).
   */
  public synchronized Long end() {
    if (id == null || closed) {
      return null;
    }
    closed = true;
    if (keepalive != null) {
      keepalive.cancel(false);
    }
    List<Lock> held = new ArrayList<>(holds);
    holds.clear();
    for (Lock l : held) {
      l.sessionClosed();
    }
    try {
      if (lostReason != null) {
        return null;
      }
      return (Long) client.call(routeKey(), client.args(Cmd.SESSION).add("CLOSE").key(id));
    } finally {
      Connection c = conn;
      if (c != null) {
        c.close();
      }
    }
  }

  /** {@link #end()}, for try-with-resources. */
  @Override
  public void close() {
    end();
  }

  /** A lock of this session was granted; true if the session was lost already. */
  boolean hold(Lock lock) {
    holds.add(lock);
    return lostReason != null;
  }

  void forget(Lock lock) {
    holds.remove(lock);
  }

  private void lose(String reason) {
    synchronized (this) {
      if (lostReason != null || closed) {
        return;
      }
      lostReason = reason;
      if (keepalive != null) {
        keepalive.cancel(false);
      }
    }
    Connection c = conn;
    if (c != null) {
      c.close(); // the server ends (or, with a grace, detaches) a bound session it still had
    }
    List<Lock> held = new ArrayList<>(holds);
    holds.clear();
    if (options.onLost != null) {
      try {
        options.onLost.accept(this);
      } catch (RuntimeException ignored) {
        // each hold hears of it even if the session's callback threw
      }
    }
    for (Lock l : held) {
      l.lose("session lost: " + reason);
    }
  }
}
