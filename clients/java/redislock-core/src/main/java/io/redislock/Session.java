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
 * <p>A loss is reported once ({@link #lostReason()}, {@link Options#onLost}, and each hold as
 * {@code "session lost: <reason>"}): {@code "ended"} (KEEPALIVE answered nil),
 * {@code "keepalive failed: ..."}, {@code "connection lost: ..."} (bound). No re-ATTACH.
 */
public final class Session implements AutoCloseable {
  /** Settings of a session: {@code Session.options().bound(true)...}. */
  public static final class Options {
    boolean bound;
    Duration lockDelay;
    String key;
    Consumer<Session> onLost;
    Duration keepalivePeriod;

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
  private Connection conn;
  private ScheduledFuture<?> keepalive;
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
      Thread watcher = new Thread(this::watchConnection, "redislock-session-watch");
      watcher.setDaemon(true);
      watcher.start();
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

  /** The bound connection carries nothing after OPEN: a read returns only when it closes. */
  private void watchConnection() {
    Connection c = conn;
    try {
      c.setTimeoutInfinite();
      c.getOne();
      lose("connection lost: unexpected reply on the bound connection");
    } catch (RuntimeException e) {
      lose("connection lost: " + e.getMessage());
    }
  }

  private void keepalive() {
    try {
      Object remaining = client.call(routeKey(), client.args(Cmd.SESSION).add("KEEPALIVE").key(id));
      if (remaining == null) {
        lose("ended");
      } else {
        lastKept = System.nanoTime();
      }
    } catch (RuntimeException e) {
      // Sentinel: a keepalive that met a failover (a closed connection, READONLY) is tried
      // again at the next period on the primary Jedis knows then, until the ttl from the last
      // one answered has passed.
      boolean retry = client.followsFailover() && Lock.failoverError(e)
          && System.nanoTime() - lastKept < TimeUnit.MILLISECONDS.toNanos(ttlMs);
      if (!retry) {
        lose("keepalive failed: " + e.getMessage());
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

  /** LOCK.SESSION INFO as a map (ttl, bound, lockdelay, holds), or null. */
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
      if (conn != null) {
        conn.close();
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
    if (conn != null) {
      conn.close(); // the server ends a bound session it still had
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
