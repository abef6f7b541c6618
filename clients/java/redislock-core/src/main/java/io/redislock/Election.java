package io.redislock;

import java.time.Duration;
import java.util.List;
import java.util.Objects;
import java.util.Optional;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.function.BiConsumer;
import redis.clients.jedis.CommandArguments;
import redis.clients.jedis.Connection;
import redis.clients.jedis.JedisShardedPubSub;

/**
 * Leader election on one lock key, as the Python, Node and Rust clients' {@code Election}.
 *
 * <p>A candidate {@link #campaign campaigns} with {@code LOCK.ACQUIRE name value ttl BLOCK ...}:
 * it waits in the key's FIFO queue, one command, and leads once granted. The owner is the
 * candidate's <em>value</em> (an address, an id: keep values unique); the <em>term</em> is the
 * grant's fencing token, larger for every new leader, so a deposed leader's fenced writes are
 * refused. A leadership is a {@link Lock} with a watchdog held in the client's default session
 * (the leader's process dies: the next candidate leads the default grace later, not at the
 * ttl), or with {@link Options#session} a hold of that session, or with
 * {@link Options#noSession()} a ttl-only hold renewed by its watchdog.
 *
 * <p>{@link #leader()} reads LOCK.INFO. {@link #observe()} follows the key's change feed; every
 * message is only a claim (anyone allowed to SPUBLISH can forge one), so each makes the observer
 * read the state ({@code MULTI, LOCK.WATCH, LOCK.INFO, EXEC}) and report what LOCK.INFO shows,
 * and only when that differs from what it reported last.
 */
public final class Election {
  /** A leadership's hold time without a session of its own (renewed by its watchdog every third). */
  public static final Duration DEFAULT_TTL = Duration.ofSeconds(10);
  /** How long an observation whose feed ended tries to find the key's node again (failover clients). */
  public static final Duration FOLLOW_PATIENCE = Duration.ofSeconds(30);

  /** Settings: {@code Election.options().session(s)}. */
  public static final class Options {
    Duration ttl;
    Session session;
    boolean noSession;
    Duration watchdogPeriod;

    /** How long a leadership lasts unless renewed (default 10 s; with a session, 0: none). */
    public Options ttl(Duration ttl) {
      this.ttl = ttl;
      return this;
    }

    /**
     * Hold leaderships in this session (bound: takeover within ms of the leader's death);
     * {@code session(null)} is {@link #noSession()}.
     */
    public Options session(Session session) {
      this.session = session;
      this.noSession = session == null;
      return this;
    }

    /** Leaderships held by their ttl and watchdog alone, not in the client's default session. */
    public Options noSession() {
      return session(null);
    }

    public Options watchdogPeriod(Duration period) {
      this.watchdogPeriod = period;
      return this;
    }
  }

  public static Options options() {
    return new Options();
  }

  /** Who leads: the value it campaigned with and its term (the grant's fencing token). */
  public record Leader(String value, long term) {}

  /** One change seen by an observer: the leader (null: nobody), resync for a state read. */
  public record Change(Leader leader, boolean resync, long seq) {}

  private final LockClient client;
  private final String name;
  private final Options options;
  private volatile Leadership last;

  Election(LockClient client, String name, Options options) {
    this.client = client;
    this.name = Objects.requireNonNull(name, "name");
    this.options = options;
  }

  public String name() {
    return name;
  }

  /**
   * Wait in the queue until this candidate leads (null timeout: no limit); its Leadership, or
   * empty if the timeout passed first. {@code onLost} (may be null) is told once when the
   * leadership is found gone.
   */
  public Optional<Leadership> campaign(String value, Duration timeout, BiConsumer<Leadership, LockLostException> onLost)
      throws InterruptedException {
    Leadership[] self = new Leadership[1];
    Lock.Options o = Lock.options().owner(value).onLost((lock, error) -> {
      if (onLost != null) {
        onLost.accept(self[0], error);
      }
    });
    Duration ttl;
    if (options.session != null) {
      o.session(options.session);
      ttl = options.ttl != null ? options.ttl : Duration.ZERO;
    } else {
      if (options.noSession) {
        o.noSession();
      }
      o.watchdog(true).watchdogPeriod(options.watchdogPeriod);
      ttl = options.ttl != null ? options.ttl : DEFAULT_TTL;
    }
    Lock lock = new Lock(client, name, ttl, o);
    self[0] = new Leadership(lock);
    if (!lock.acquire(timeout)) {
      return Optional.empty();
    }
    self[0].term = lock.token();
    last = self[0];
    return Optional.of(self[0]);
  }

  /** Step down from the last leadership this object won; false if it was not live. */
  public boolean resign() {
    Leadership l = last;
    last = null;
    return l != null && l.resign();
  }

  /** Who leads now (LOCK.INFO). */
  public Optional<Leader> leader() {
    return Optional.ofNullable(leaderOf(client.info(name)));
  }

  static Leader leaderOf(LockInfo info) {
    if (info == null || info.holders().isEmpty()) {
      return null;
    }
    LockInfo.Holder h = info.holders().get(0);
    return new Leader(h.owner(), h.token());
  }

  /**
   * An Observation of the leadership changes; the first is the state when it started
   * ({@code resync} true). Close it when done.
   */
  public Observation observe() throws InterruptedException {
    return new Observation();
  }

  /** A won leadership. */
  public static final class Leadership {
    private final Lock lock;
    private volatile long term;

    Leadership(Lock lock) {
      this.lock = lock;
    }

    /** What this leader published (its owner string). */
    public String value() {
      return lock.owner();
    }

    /** The term: the grant's fencing token. */
    public long term() {
      return term;
    }

    public boolean isLost() {
      return lock.isLost();
    }

    public String lostReason() {
      return lock.lostReason();
    }

    /** The underlying lock (its token is the term). */
    public Lock lock() {
      return lock;
    }

    /** {@code command key args...}, only while this term is live; else StaleTokenException. */
    public Object fenced(String command, String key, Object... args) {
      return Fence.call(lock.client, lock.name(), term, command, key, args);
    }

    /** Step down (LOCK.RELEASE): the next candidate leads. True if this leadership was live. */
    public boolean resign() {
      return lock.release();
    }
  }

  /**
   * The changes of one election, in order: {@link #next(Duration)}.
   *
   * <p>When the feed ends (a connection closed by the server, {@code CLIENT KILL} by an
   * administrator, or lost with a killed master; in a cluster, the old master ending the
   * subscription unasked, {@code sunsubscribe}, as it gives the slot up in a failover), the
   * observation connects again to the node that serves the key now (for a Cluster client the
   * slot table learnt again): it watches and subscribes there, reads {@code LOCK.INFO} there and
   * reports a change ({@code resync} true) only if the leader differs from the last one
   * reported: never two leaders for one moment, nothing repeated (leaders in between may be
   * missed: the resync says so). The watch connection is read only for state reads, and the
   * server ends the key's watch when it closes (nothing is published then), so it is checked
   * with a {@code PING} every second. It tries every 100 ms for {@link #FOLLOW_PATIENCE}; then (or at
   * once, for a Sentinel client: its demoted primary still answers, issue 34) it reports a
   * resync with no leader and stops.
   */
  public final class Observation implements AutoCloseable {
    private final BlockingQueue<Change> changes = new LinkedBlockingQueue<>();
    /** Names its connections: {@code redislock-feed-watch-<id>}, {@code redislock-feed-sub-<id>}. */
    final String id = Feed.newId();
    private volatile Connection watchConn;
    private volatile Connection subConn;
    private volatile JedisShardedPubSub pubsub;
    private Leader reported;
    private boolean first = true;
    private volatile boolean closed;
    /** How many times the observation connected again (to another node's feed, or the same). */
    private volatile int moved;
    /** The watch connection's check ({@link #check}). */
    private final ScheduledFuture<?> checking;

    Observation() throws InterruptedException {
      connect();
      refresh(false); // the state once subscribed: nothing can fall between the read and the feed
      long period = Feed.CHECK_PERIOD.toMillis();
      checking = client.scheduler().scheduleWithFixedDelay(this::check, period, period, TimeUnit.MILLISECONDS);
    }

    /**
     * One server or a cluster: a feed that ended is connected again. A Sentinel client's is not
     * yet (issue 34): its demoted primary still answers until it is reconfigured.
     */
    private boolean reconnects() {
      return client.isCluster() || !client.followsFailover();
    }

    /**
     * {@code PING} on the watch connection: killed, it would end the key's watch and nothing
     * would be published any more, unseen (it is read only for state reads). Its failure ends
     * the feed's connection too, whose end ({@link #ended}) connects again.
     */
    private synchronized void check() {
      if (closed) {
        return;
      }
      try {
        LockClient.on(watchConn, new CommandArguments(Cmd.PING));
      } catch (RuntimeException lost) {
        Connection sub = subConn;
        if (!closed && sub != null) {
          sub.close();
        }
      }
    }

    /** Connections to the node serving the key now, subscribed to its channel there. */
    private void connect() throws InterruptedException {
      Connection w = client.dedicated(name, Feed.WATCH_NAME + "-" + id);
      Connection sub;
      try {
        sub = client.dedicated(name, Feed.SUB_NAME + "-" + id);
      } catch (RuntimeException e) {
        w.close();
        throw e;
      }
      synchronized (this) {
        watchConn = w;
        subConn = sub;
      }
      String channel;
      try {
        channel = (String) stateRead()[0];
      } catch (RuntimeException e) {
        w.close();
        sub.close();
        throw e;
      }
      CountDownLatch subscribed = new CountDownLatch(1);
      JedisShardedPubSub ps = new JedisShardedPubSub() {
        @Override
        public void onSSubscribe(String ch, int count) {
          subscribed.countDown();
        }

        @Override
        public void onSMessage(String ch, String message) {
          refresh(false);
        }
      };
      pubsub = ps;
      Thread t = new Thread(() -> {
        String why;
        try {
          ps.proceed(sub, channel);
          why = "unsubscribed by the server";
        } catch (RuntimeException e) {
          why = String.valueOf(e.getMessage());
        }
        ended(sub, why);
      }, "redislock-observe");
      t.setDaemon(true);
      t.start();
      if (!subscribed.await(10, TimeUnit.SECONDS)) {
        w.close();
        sub.close();
        throw new LockException("SSUBSCRIBE " + channel + " got no answer within 10 s");
      }
    }

    /** The feed on {@code sub} ended: follow the key to its node now, or report a resync and stop. */
    private void ended(Connection sub, String why) {
      if (closed || sub != subConn) {
        return;
      }
      if (!reconnects()) {
        broken(); // Sentinel, whose demoted primary still answers reads: stop
        return;
      }
      watchConn.close();
      sub.close();
      long deadline = System.nanoTime() + FOLLOW_PATIENCE.toNanos();
      for (int attempt = 0; !closed; attempt++) {
        if (attempt % 5 == 0) {
          client.failoverSeen(); // a cluster's slot table learnt again
        }
        try {
          connect();
          if (closed) {
            close(); // closed while it moved: the new connections too
            return;
          }
          refresh(true); // LOCK.INFO there: reported (a resync) only if the leader changed
          moved++; // after the report, so that one who sees the count sees what was reported
          return;
        } catch (RuntimeException e) {
          // the node is not reachable yet, or still not a master (READONLY, MOVED): again
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          break;
        }
        if (System.nanoTime() - deadline >= 0) {
          break;
        }
        try {
          Thread.sleep(100);
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          break;
        }
      }
      broken();
    }

    /** The feed is gone for good: a resync with no leader (see LOCK.INFO yourself). */
    private void broken() {
      if (!closed) {
        changes.add(new Change(null, true, -1));
      }
    }

    /**
     * How many times this observation subscribed again, on the key's master then: after a
     * failover, or after one of its connections was lost (not for a Sentinel client).
     */
    public int movedCount() {
      return moved;
    }

    /** MULTI, LOCK.WATCH, LOCK.INFO, EXEC: {channel, seq, info}, one moment. */
    private synchronized Object[] stateRead() {
      LockClient.on(watchConn, client.args(Cmd.MULTI));
      LockClient.on(watchConn, client.args(Cmd.WATCH).key(name));
      LockClient.on(watchConn, client.args(Cmd.INFO).key(name));
      List<?> exec = (List<?>) LockClient.on(watchConn, client.args(Cmd.EXEC));
      List<?> watch = (List<?>) exec.get(0);
      return new Object[] {watch.get(0), watch.get(1), LockInfo.parse(exec.get(1))};
    }

    /**
     * A message arrived (or we start, or connected again: {@code resync}): read the state, report
     * it if it changed. A failed read closes the feed's connection too, whose end
     * ({@link #ended}) then connects again; for a Sentinel client it is reported as a resync.
     */
    private synchronized void refresh(boolean resync) {
      if (closed) {
        return;
      }
      Object[] s;
      try {
        s = stateRead();
      } catch (RuntimeException e) {
        if (closed) {
          return;
        }
        if (reconnects()) {
          // the read connection failed (a failover, or it alone was closed): end the feed's
          // too, so that the feed's end follows the key to its master now and reads it there
          Connection sub = subConn;
          if (sub != null) {
            sub.close();
          }
        } else {
          changes.add(new Change(null, true, -1));
        }
        return;
      }
      Leader now = leaderOf((LockInfo) s[2]);
      if (first || !Objects.equals(now, reported)) {
        changes.add(new Change(now, first || resync, (Long) s[1]));
        reported = now;
        first = false;
      }
    }

    /** The next change, or empty if none came within {@code timeout}. */
    public Optional<Change> next(Duration timeout) throws InterruptedException {
      return Optional.ofNullable(changes.poll(timeout.toNanos(), TimeUnit.NANOSECONDS));
    }

    @Override
    public void close() {
      closed = true;
      checking.cancel(false);
      try {
        JedisShardedPubSub ps = pubsub;
        if (ps != null && ps.isSubscribed()) {
          ps.sunsubscribe();
        }
      } catch (RuntimeException ignored) {
        // closing anyway
      }
      Connection sub = subConn;
      Connection w = watchConn;
      if (sub != null) {
        sub.close();
      }
      if (w != null) {
        w.close();
      }
    }
  }
}
