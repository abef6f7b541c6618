package io.redislock;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedDeque;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.Function;
import org.apache.commons.pool2.impl.GenericObjectPoolConfig;
import redis.clients.jedis.BuilderFactory;
import redis.clients.jedis.ClusterCommandArguments;
import redis.clients.jedis.CommandArguments;
import redis.clients.jedis.CommandObject;
import redis.clients.jedis.Connection;
import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.JedisClientConfig;
import redis.clients.jedis.JedisSentineled;
import redis.clients.jedis.UnifiedJedis;
import redis.clients.jedis.exceptions.JedisConnectionException;
import redis.clients.jedis.exceptions.JedisDataException;
import redis.clients.jedis.providers.ClusterConnectionProvider;
import redis.clients.jedis.providers.PooledConnectionProvider;
import redis.clients.jedis.util.JedisClusterCRC16;

/**
 * The entry point: a Jedis {@link UnifiedJedis} (one server, or a Cluster) for the ordinary
 * commands, and connections of its own for what must not share the pool: a {@code BLOCK} wait
 * (one {@code LOCK.ACQUIRE ... BLOCK ms}, never cut by the pool's socket timeout and re-sent), a
 * {@code BOUND} session, an election's change feed. It also runs the timers (watchdogs, session
 * keepalives) on one small scheduler. Close it when done; it closes the Jedis client it made.
 *
 * <p><b>The default session.</b> A lock of any kind (and an election) made without a session of
 * its own joins the client's default session: one {@code BOUND} session with
 * {@code GRACE} {@link #DEFAULT_GRACE} per client and server (per node for a cluster client),
 * opened by the first acquire that needs it ({@code LOCK.SESSION OPEN 10000 BOUND GRACE 500}),
 * kept alive by one keepalive for all its holds, and closed ({@code LOCK.SESSION CLOSE}) by
 * {@link #close()}. A holder process that dies (exit, crash, {@code kill -9}) frees its holds
 * the grace after the server saw its connection close, not at each hold's ttl; a connection that
 * drops while the process lives is replaced within the grace ({@code LOCK.SESSION ATTACH}), so
 * nothing is lost. {@code Lock.options().noSession()} keeps the ttl-only hold.
 *
 * <pre>{@code
 * try (LockClient client = LockClient.connect(new HostAndPort("127.0.0.1", 6379))) {
 *   Lock lock = client.lock("invoice:42", Duration.ofSeconds(30));
 *   if (lock.tryLock(10, TimeUnit.SECONDS)) {   // one LOCK.ACQUIRE ... BLOCK 10000
 *     try { ... lock.token() ... } finally { lock.unlock(); }
 *   }
 * }
 * }</pre>
 */
public final class LockClient implements AutoCloseable {
  /** Idle wait connections kept per node for the next wait (each costs one socket). */
  private static final int MAX_IDLE_WAIT_CONNECTIONS = 64;
  /** The name (CLIENT SETNAME) of every wait connection, as the other clients name theirs. */
  static final String WAITER_NAME = "redislock-waiter";
  /**
   * The default session's ttl: a keepalive every third of it. It bounds only a holder whose
   * host vanished without closing its connection (the server hears of that from TCP alone); a
   * live process's holds never wait on it. One KEEPALIVE per client and node every 3.3 s.
   */
  public static final Duration DEFAULT_SESSION_TTL = Duration.ofSeconds(10);
  /**
   * The default session's {@code GRACE}: how long the server keeps it after its connection
   * drops, for this client to re-ATTACH it, and so how much later than its connection's close a
   * killed holder's locks are handed on. The module measured a re-ATTACH after CLIENT KILL at
   * 7.1 ms p99 on a loaded 2-core machine (docs/commands.md, GRACE), so 500 ms leaves room many
   * times over while a killed holder's locks still pass on within one second (issue 29).
   */
  public static final Duration DEFAULT_GRACE = Duration.ofMillis(500);
  /** How many times an acquire in the default session is made when the session ended under it. */
  static final int DEFAULT_SESSION_ATTEMPTS = 3;

  private final UnifiedJedis jedis;
  private final JedisClientConfig config;
  private final Function<String, HostAndPort> nodeFor;
  private final boolean cluster;
  /** Sentinel-managed: the primary may change under the client (see {@link #sentinel}). */
  private final boolean sentineled;
  /** Learn the topology again after a failover error (a cluster's slot table; nothing for Sentinel). */
  private final Runnable relearn;
  private final ScheduledExecutorService scheduler;
  private final ExecutorService waiters;
  private final Map<HostAndPort, ConcurrentLinkedDeque<WaitConnection>> idle = new ConcurrentHashMap<>();
  private final Map<HostAndPort, Feed> feeds = new ConcurrentHashMap<>();
  /** The default sessions, by node; guarded by itself. */
  private final Map<HostAndPort, Session> defaults = new java.util.HashMap<>();
  /** Default sessions an acquire found gone before their watcher did: closed with the client. */
  private final List<Session> retired = new ArrayList<>();
  /** Nodes that answered GRACE with a syntax error (a module without it): bound, no grace. */
  private final Set<HostAndPort> noGrace = ConcurrentHashMap.newKeySet();
  private volatile boolean closed;

  private LockClient(UnifiedJedis jedis, JedisClientConfig config, Function<String, HostAndPort> nodeFor, boolean cluster) {
    this(jedis, config, nodeFor, cluster, false, () -> {});
  }

  private LockClient(UnifiedJedis jedis, JedisClientConfig config, Function<String, HostAndPort> nodeFor, boolean cluster,
      boolean sentineled, Runnable relearn) {
    this.jedis = jedis;
    this.config = config;
    this.nodeFor = nodeFor;
    this.cluster = cluster;
    this.sentineled = sentineled;
    this.relearn = relearn;
    ScheduledThreadPoolExecutor s = new ScheduledThreadPoolExecutor(2, daemon("redislock-timer"));
    s.setRemoveOnCancelPolicy(true);
    this.scheduler = s;
    this.waiters = Executors.newCachedThreadPool(daemon("redislock-wait"));
  }

  /** A client of one server. */
  public static LockClient connect(HostAndPort server) {
    return connect(server, DefaultJedisClientConfig.builder().build());
  }

  /** A client of one server, with Jedis's settings (auth, TLS, timeouts...). */
  public static LockClient connect(HostAndPort server, JedisClientConfig config) {
    UnifiedJedis jedis = new UnifiedJedis(new PooledConnectionProvider(server, config));
    return new LockClient(jedis, config, key -> server, false);
  }

  /**
   * A client of one server whose Jedis pool (for the single tries, releases and renewals; waits
   * have connections of their own) is sized by {@code pool} (Jedis's default: 8 connections).
   */
  public static LockClient connect(HostAndPort server, JedisClientConfig config, GenericObjectPoolConfig<Connection> pool) {
    UnifiedJedis jedis = new UnifiedJedis(new PooledConnectionProvider(server, config, pool));
    return new LockClient(jedis, config, key -> server, false);
  }

  /** A client of a Redis Cluster, from any of its nodes. */
  public static LockClient cluster(Set<HostAndPort> nodes, JedisClientConfig config) {
    ClusterConnectionProvider provider = new ClusterConnectionProvider(nodes, config);
    UnifiedJedis jedis = new UnifiedJedis(provider, 5, Duration.ofSeconds(10));
    // A shard's failover (issue 34): Jedis follows MOVED for the pooled commands (renewals,
    // keepalives); waits, feeds, observers and BOUND sessions (re-ATTACHed on the new master),
    // on connections of their own, re-learn the slot table.
    return new LockClient(jedis, config, key -> provider.getNode(JedisClusterCRC16.getSlot(key)), true, false, () -> {
      try {
        provider.renewSlotCache();
      } catch (RuntimeException unreachable) {
        // no node answered now: the next try asks again
      }
    });
  }

  /**
   * A client of the primary that the Sentinels at {@code sentinels} know as {@code masterName},
   * through Jedis's {@link JedisSentineled} ({@code config} for the primary's connections,
   * {@code sentinelConfig} for the Sentinels'). Every command, wait connection and feed goes to
   * the current primary, as Jedis learns it from the Sentinels ({@code +switch-master}).
   *
   * <p>Through a failover: holds are on the new primary with their owners and tokens if the
   * grant reached the replica promoted (take them {@code durable(1, timeout)} to be sure); a
   * wait queued on the old primary is answered with an error there ({@code UNBLOCKED ...}, or
   * its connection closed by Sentinel) and queues again on the new primary within its own
   * timeout; a watchdog renewal or a session keepalive that fails (a closed connection,
   * {@code READONLY}) is tried again at its next period until the hold's (session's) ttl from
   * its last success, and only an answer of the server (or that ttl passing) is a loss. A
   * {@code BOUND} session is lost (Sentinel closes its connection; it is not re-attached).
   */
  public static LockClient sentinel(String masterName, Set<HostAndPort> sentinels, JedisClientConfig config,
      JedisClientConfig sentinelConfig) {
    JedisSentineled jedis = new JedisSentineled(masterName, config, sentinels, sentinelConfig);
    return new LockClient(jedis, config, key -> jedis.getCurrentMaster(), false, true, () -> {});
  }

  /**
   * True for a client whose primary may move under it (Sentinel, or a Cluster shard's failover):
   * waits queue again, renewals and keepalives retry, feeds move.
   */
  boolean followsFailover() {
    return sentineled || cluster;
  }

  /** A command met a failover: learn where the keys are now (a cluster's slot table). */
  void failoverSeen() {
    relearn.run();
  }

  /** The Jedis client the ordinary commands go through: use it for your own commands too. */
  public UnifiedJedis jedis() {
    return jedis;
  }

  /** True for a Cluster client. */
  public boolean isCluster() {
    return cluster;
  }

  // --- the recipes ---

  /** An exclusive lock on {@code name}, held {@code ttl} from each grant. */
  public Lock lock(String name, Duration ttl) {
    return new Lock(this, name, ttl, Lock.options());
  }

  public Lock lock(String name, Duration ttl, Lock.Options options) {
    return new Lock(this, name, ttl, options);
  }

  /** At most {@code permits} holders of {@code name} at once (SHARED LIMIT n). */
  public Semaphore semaphore(String name, int permits, Duration ttl) {
    return new Semaphore(this, name, permits, ttl, Lock.options());
  }

  public Semaphore semaphore(String name, int permits, Duration ttl, Lock.Options options) {
    return new Semaphore(this, name, permits, ttl, options);
  }

  /** Readers share {@code name} (SHARED), a writer holds it alone. */
  public ReadWriteLock readWriteLock(String name, Duration ttl) {
    return new ReadWriteLock(this, name, ttl, Lock.options());
  }

  public ReadWriteLock readWriteLock(String name, Duration ttl, Lock.Options options) {
    return new ReadWriteLock(this, name, ttl, options);
  }

  /** Exclusive locks on every key of {@code names} or none (LOCK.MACQUIRE). */
  public MultiLock multiLock(Collection<String> names, Duration ttl) {
    return new MultiLock(this, names, ttl, Lock.options());
  }

  public MultiLock multiLock(Collection<String> names, Duration ttl, Lock.Options options) {
    return new MultiLock(this, names, ttl, options);
  }

  /** A session (not opened yet: {@link Session#open()}). */
  public Session session(Duration ttl, Session.Options options) {
    return new Session(this, ttl, options);
  }

  /**
   * The default session for {@code key}'s node, opened now if there is none that can take holds
   * (the first acquire, or the last one was lost or closed). See the class comment.
   */
  Session defaultSession(String key) {
    HostAndPort node = nodeFor(key);
    synchronized (defaults) {
      if (closed) {
        throw new LockException("the client is closed");
      }
      Session s = defaults.get(node);
      if (s != null && s.usable()) {
        return s;
      }
      if (s != null) {
        retired.add(s);
      }
      s = openDefault(node, key);
      defaults.put(node, s);
      return s;
    }
  }

  private Session openDefault(HostAndPort node, String key) {
    Session.Options o = Session.options().bound(true).key(key);
    if (!noGrace.contains(node)) {
      try {
        return new Session(this, DEFAULT_SESSION_TTL, o.grace(DEFAULT_GRACE)).open();
      } catch (JedisDataException e) {
        String m = String.valueOf(e.getMessage());
        if (!(m.contains("syntax") && m.contains("GRACE"))) {
          throw e;
        }
        noGrace.add(node); // a module without GRACE: a blip there ends the session
      }
    }
    return new Session(this, DEFAULT_SESSION_TTL, o.grace(null)).open();
  }

  /** An acquire was told {@code s} is gone: the next one opens a new default session. */
  void retireDefault(Session s) {
    synchronized (defaults) {
      if (defaults.values().remove(s)) {
        retired.add(s);
      }
    }
  }

  /** Whether an acquire's error says its session ended (before it, or while it waited). */
  static boolean sessionGone(RuntimeException e) {
    String m = String.valueOf(e.getMessage());
    return e instanceof JedisDataException
        && (m.contains("no such session") || m.contains("session ended while the client waited"));
  }

  /**
   * The default sessions open now (one per node used), for a look at them ({@code serial()},
   * {@code info()}); empty before the first acquire that joined one.
   */
  public List<Session> defaultSessions() {
    synchronized (defaults) {
      List<Session> out = new ArrayList<>();
      for (Session s : defaults.values()) {
        if (s.usable()) {
          out.add(s);
        }
      }
      return out;
    }
  }

  /**
   * Close the default sessions now ({@code LOCK.SESSION CLOSE}: their holds released at once,
   * each such Lock then holds nothing); the next acquire that needs one opens a new one.
   * {@link #close()} does it first.
   */
  public void closeDefaultSessions() {
    List<Session> all;
    synchronized (defaults) {
      all = new ArrayList<>(defaults.values());
      all.addAll(retired);
      defaults.clear();
      retired.clear();
    }
    for (Session s : all) {
      try {
        s.end();
      } catch (RuntimeException unreachable) {
        // its connection is closed all the same: the server ends it after its grace
      }
    }
  }

  /** Leader election on the lock key {@code name}. */
  public Election election(String name) {
    return new Election(this, name, Election.options());
  }

  public Election election(String name, Election.Options options) {
    return new Election(this, name, options);
  }

  /**
   * {@code watch(name)} on any lock, as the other clients' {@code watch}: the changes of its
   * holder, through the key's change feed (the same Observation an election's
   * {@link Election#observe()} gives: {@code change.leader()} is the holder's owner and token,
   * null when free; the first change is the state when it started). Close it when done.
   */
  public Election.Observation watch(String name) throws InterruptedException {
    return new Election(this, name, Election.options()).observe();
  }

  /** LOCK.INFO: who holds {@code name}, or null when nobody does. */
  public LockInfo info(String name) {
    return LockInfo.parse(call(name, args(Cmd.INFO).key(name)));
  }

  // --- plumbing for the recipes ---

  /** A command's arguments, of the kind the Jedis client routes (by slot in a cluster). */
  CommandArguments args(Cmd cmd) {
    return cluster ? new ClusterCommandArguments(cmd) : new CommandArguments(cmd);
  }

  /** Run a command through the Jedis client (routed by its keys); the reply decoded. */
  Object call(String routeKey, CommandArguments args) {
    return jedis.executeCommand(new CommandObject<>(args, BuilderFactory.ENCODED_OBJECT));
  }

  ScheduledExecutorService scheduler() {
    return scheduler;
  }

  ExecutorService executor() {
    return waiters;
  }

  HostAndPort nodeFor(String key) {
    return nodeFor.apply(key);
  }

  /** A new connection of its own to the node serving {@code key}, never pooled. */
  Connection dedicated(String key) {
    Connection conn = new Connection(nodeFor(key), config);
    conn.connect();
    return conn;
  }

  /**
   * As {@link #dedicated(String)}, named {@code name} ({@code CLIENT SETNAME}) so that
   * {@code CLIENT LIST} says whose it is.
   */
  Connection dedicated(String key, String name) {
    Connection conn = dedicated(key);
    try {
      setName(conn, name);
    } catch (RuntimeException e) {
      conn.close();
      throw e;
    }
    return conn;
  }

  /**
   * {@code CLIENT SETNAME name} on {@code conn}. Best effort: a server or user that refuses it
   * (an ACL without {@code CLIENT}) leaves the connection unnamed; a lost connection throws.
   */
  static void setName(Connection conn, String name) {
    try {
      on(conn, new CommandArguments(Cmd.CLIENT).add("SETNAME").add(name));
    } catch (JedisDataException refused) {
      // unnamed, and still usable
    }
  }

  /** The change feed of the node serving {@code key} (made on first use, again if it broke). */
  Feed feedFor(String key) {
    return feeds.compute(nodeFor(key), (node, f) -> f == null || f.isClosed() ? new Feed(this, key) : f);
  }

  /** A wait connection: one that carries only blocking commands, with its client id. */
  static final class WaitConnection {
    final Connection conn;
    final long id;
    final HostAndPort node;

    WaitConnection(Connection conn, long id, HostAndPort node) {
      this.conn = conn;
      this.id = id;
      this.node = node;
    }
  }

  private WaitConnection takeWaitConnection(String key) {
    HostAndPort node = nodeFor(key);
    ConcurrentLinkedDeque<WaitConnection> pool = idle.get(node);
    WaitConnection w = pool == null ? null : pool.pollFirst();
    if (w != null && w.conn.isConnected() && !w.conn.isBroken()) {
      return w;
    }
    if (w != null) {
      w.conn.close();
    }
    Connection conn = new Connection(node, config);
    try {
      Object id = conn.executeCommand(new CommandObject<>(new CommandArguments(Cmd.CLIENT).add("ID"), BuilderFactory.ENCODED_OBJECT));
      setName(conn, WAITER_NAME);
      return new WaitConnection(conn, (Long) id, node);
    } catch (RuntimeException e) {
      conn.close();
      throw e;
    }
  }

  private void giveBack(WaitConnection w) {
    ConcurrentLinkedDeque<WaitConnection> pool = idle.computeIfAbsent(w.node, n -> new ConcurrentLinkedDeque<>());
    if (pool.size() < MAX_IDLE_WAIT_CONNECTIONS && !scheduler.isShutdown()) {
      pool.addFirst(w);
    } else {
      w.conn.close();
    }
  }

  /**
   * Send a blocking command ({@code LOCK.ACQUIRE ... BLOCK ms}) on a wait connection and wait for
   * its one reply, however long the server's queue takes. The calling thread waits in an
   * interruptible {@code Future.get}; the socket is read by a helper thread (a socket read does
   * not see {@code Thread.interrupt}).
   *
   * <p>On an interrupt: the wait connection is closed (the server drops a disconnected waiter,
   * and revokes a grant whose reply it could not deliver), then, once the server shows that
   * client gone ({@code CLIENT LIST ID}), {@code cleanup} runs there, so a grant whose reply was
   * already on its way when the interrupt landed is given back too. Then InterruptedException.
   */
  Object blockingCall(String key, Function<Connection, Object> body, Function<Connection, Object> cleanup)
      throws InterruptedException {
    if (Thread.interrupted()) {
      throw new InterruptedException();
    }
    WaitConnection w = takeWaitConnection(key);
    Future<Object> reply = waiters.submit(() -> body.apply(w.conn));
    try {
      Object r = reply.get();
      giveBack(w);
      return r;
    } catch (ExecutionException e) {
      w.conn.close();
      Throwable cause = e.getCause();
      if (cause instanceof RuntimeException) {
        throw (RuntimeException) cause;
      }
      throw new LockException("the wait failed", cause);
    } catch (InterruptedException e) {
      w.conn.close();
      try {
        reply.get(); // returns or fails at once: its socket is closed
      } catch (ExecutionException | InterruptedException ignored) {
        // a closed socket, or a reply that came first: the cleanup below covers both
      }
      afterDisconnect(w, cleanup);
      throw e;
    }
  }

  /** {@code args} as one blocking command on {@code conn} (no socket timeout while it waits). */
  static Object blocking(Connection conn, CommandArguments args) {
    return conn.executeCommand(new CommandObject<>(args.blocking(), BuilderFactory.ENCODED_OBJECT));
  }

  /** Wait (up to 5 s) until the server no longer lists client {@code w.id}, then run cleanup. */
  private void afterDisconnect(WaitConnection w, Function<Connection, Object> cleanup) {
    try (Connection conn = new Connection(w.node, config)) {
      long deadline = System.nanoTime() + Duration.ofSeconds(5).toNanos();
      while (System.nanoTime() < deadline) {
        Object listed = conn.executeCommand(
            new CommandObject<>(new CommandArguments(Cmd.CLIENT).add("LIST").add("ID").add(w.id), BuilderFactory.ENCODED_OBJECT));
        if (listed == null || listed.toString().isEmpty()) {
          break;
        }
        Thread.onSpinWait();
      }
      cleanup.apply(conn);
    } catch (JedisConnectionException ignored) {
      // the server is unreachable: a grant left there ends at its ttl
    }
  }

  /** A command on a connection the caller holds; the reply decoded. */
  static Object on(Connection conn, CommandArguments args) {
    return conn.executeCommand(new CommandObject<>(args, BuilderFactory.ENCODED_OBJECT));
  }

  @Override
  public void close() {
    synchronized (defaults) {
      closed = true;
    }
    closeDefaultSessions();
    for (Feed f : feeds.values()) {
      f.close();
    }
    scheduler.shutdownNow();
    waiters.shutdownNow();
    for (ConcurrentLinkedDeque<WaitConnection> pool : idle.values()) {
      WaitConnection w;
      while ((w = pool.pollFirst()) != null) {
        w.conn.close();
      }
    }
    jedis.close();
  }

  private static ThreadFactory daemon(String name) {
    AtomicInteger n = new AtomicInteger();
    return r -> {
      Thread t = new Thread(r, name + "-" + n.incrementAndGet());
      t.setDaemon(true);
      return t;
    };
  }

  static List<String> strings(Collection<String> c) {
    return new ArrayList<>(c);
  }
}
