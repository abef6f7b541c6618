package io.redislock;

import java.time.Duration;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import redis.clients.jedis.CommandArguments;
import redis.clients.jedis.Connection;
import redis.clients.jedis.JedisShardedPubSub;

/**
 * The change feed of one node, for the holds whose loss must be reported at once (a lock made
 * with {@code onLost}): one connection for {@code LOCK.WATCH} and the state reads, one for
 * {@code SSUBSCRIBE}, shared by every such hold of the client on that node.
 *
 * <p>A message is only a claim: each one makes the feed read {@code MULTI, LOCK.WATCH, LOCK.INFO,
 * EXEC} for its key, and a hold is reported lost only when LOCK.INFO no longer lists its token
 * (with the message's event as the reason, {@code "feed: <event>"}).
 *
 * <p>A feed whose connection closes ({@code CLIENT KILL}, a failover) ends, and each of its holds
 * is watched again through a new feed, which reads LOCK.INFO before anything is reported: a hold
 * lost meanwhile is reported then, a hold still listed is not. The watch connection is read only
 * for state reads, and the server ends its watches when it closes (nothing is published then),
 * so it is checked with a {@code PING} every {@link #CHECK_PERIOD}.
 */
final class Feed {
  private static final Set<String> ENDINGS = Set.of("released", "expired", "lost", "deleted", "flushed", "swapped", "demoted", "handoff", "acquired");

  private static final AtomicLong IDS = new AtomicLong();
  /** Prefixes of the feed's connection names, as in the other clients. */
  static final String WATCH_NAME = "redislock-feed-watch";
  static final String SUB_NAME = "redislock-feed-sub";
  /**
   * How often a watch connection (a feed's, an observer's) is checked with {@code PING}: how
   * late, at most, a watch connection closed by the server is noticed (one round trip a second
   * per feed and per observer).
   */
  static final Duration CHECK_PERIOD = Duration.ofSeconds(1);

  private final LockClient client;
  private final String routeKey;
  /** The node this feed's connections go to. */
  private final redis.clients.jedis.HostAndPort node;
  /** Names its connections: {@code redislock-feed-watch-<id>}, {@code redislock-feed-sub-<id>}. */
  final String id = newId();
  private Connection watchConn;
  private Connection subConn;
  private JedisShardedPubSub pubsub;
  /** The watch connection's check, once it is made. */
  private ScheduledFuture<?> checking;
  private volatile boolean closed;
  /** key -> the holds watched there. */
  private final Map<String, Set<Lock>> holds = new HashMap<>();
  /** channel -> key, and back. */
  private final Map<String, String> keyOf = new HashMap<>();
  private final Map<String, String> channelOf = new HashMap<>();

  /** A feed id: the process id and a counter (never a session id). */
  static String newId() {
    return ProcessHandle.current().pid() + "-" + IDS.incrementAndGet();
  }

  Feed(LockClient client, String routeKey) {
    this.client = client;
    this.routeKey = routeKey;
    this.node = client.nodeFor(routeKey);
  }

  /** Watch {@code lock}'s keys; report it lost at once if LOCK.INFO shows it gone already. */
  synchronized boolean hold(Lock lock) {
    if (closed) {
      return false;
    }
    for (String key : lock.keys()) {
      Object[] state = stateRead(key);
      String channel = (String) state[0];
      holds.computeIfAbsent(key, k -> new HashSet<>()).add(lock);
      if (!keyOf.containsKey(channel)) {
        keyOf.put(channel, key);
        channelOf.put(key, channel);
        subscribe(channel);
        // read again once subscribed: a change between the first read and the subscription
        // was published to nobody here
        state = stateRead(key);
      }
      if (!listed((LockInfo) state[1], lock.tokenFor(key))) {
        lose(lock, "feed: not held (LOCK.INFO)");
        return true;
      }
    }
    return true;
  }

  /** Stop watching {@code lock}; a key nobody here holds any more is unwatched. */
  synchronized void drop(Lock lock) {
    if (closed) {
      return;
    }
    for (String key : lock.keys()) {
      Set<Lock> set = holds.get(key);
      if (set == null || !set.remove(lock) || !set.isEmpty()) {
        continue;
      }
      holds.remove(key);
      String channel = channelOf.remove(key);
      keyOf.remove(channel);
      try {
        if (!keyOf.isEmpty()) {
          // Not the last channel: at 0 channels Jedis's reader would return, and the next
          // hold's SSUBSCRIBE would go unread. The last one stays subscribed, its messages
          // ignored (no key is watched for it).
          pubsub.sunsubscribe(channel);
        }
        LockClient.on(watchConn, client.args(Cmd.UNWATCH).key(key));
      } catch (RuntimeException ignored) {
        // the connection is gone: so is the watch
      }
    }
  }

  private void subscribe(String channel) {
    if (pubsub != null) {
      pubsub.ssubscribe(channel);
      return;
    }
    subConn = client.dedicated(routeKey, SUB_NAME + "-" + id);
    CountDownLatch subscribed = new CountDownLatch(1);
    pubsub = new JedisShardedPubSub() {
      @Override
      public void onSSubscribe(String ch, int count) {
        subscribed.countDown();
      }

      @Override
      public void onSMessage(String ch, String message) {
        message(ch, message);
      }

      @Override
      public void onSUnsubscribe(String ch, int count) {
        unsubscribed(ch);
      }
    };
    Thread t = new Thread(() -> {
      try {
        pubsub.proceed(subConn, channel);
        ended(); // every channel unsubscribed: by the server (its slot moved), or at close
      } catch (RuntimeException lost) {
        broken(); // the connection is gone: so are its watches
      }
    }, "redislock-feed");
    t.setDaemon(true);
    t.start();
    try {
      if (!subscribed.await(10, TimeUnit.SECONDS)) {
        throw new LockException("SSUBSCRIBE " + channel + " got no answer within 10 s");
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new LockException("interrupted while subscribing to " + channel);
    }
  }

  /** MULTI, LOCK.WATCH, LOCK.INFO, EXEC on the watch connection: {channel, info, seq}. */
  private Object[] stateRead(String key) {
    if (watchConn == null) {
      watchConn = client.dedicated(routeKey, WATCH_NAME + "-" + id);
      long period = CHECK_PERIOD.toMillis();
      checking = client.scheduler().scheduleWithFixedDelay(this::check, period, period, TimeUnit.MILLISECONDS);
    }
    LockClient.on(watchConn, client.args(Cmd.MULTI));
    LockClient.on(watchConn, client.args(Cmd.WATCH).key(key));
    LockClient.on(watchConn, client.args(Cmd.INFO).key(key));
    List<?> exec = (List<?>) LockClient.on(watchConn, client.args(Cmd.EXEC));
    List<?> watch = (List<?>) exec.get(0);
    return new Object[] {watch.get(0), LockInfo.parse(exec.get(1)), watch.get(1)};
  }

  /** {@code PING} on the watch connection; its failure breaks the feed ({@link #broken}). */
  private synchronized void check() {
    if (closed) {
      return;
    }
    try {
      LockClient.on(watchConn, new CommandArguments(Cmd.PING));
    } catch (RuntimeException lost) {
      broken(); // the connection is gone: so are its watches
    }
  }

  private static boolean listed(LockInfo info, long token) {
    if (info == null) {
      return false;
    }
    for (LockInfo.Holder h : info.holders()) {
      if (h.token() == token) {
        return true;
      }
    }
    return false;
  }

  /** A message (a claim): read the key's state and report the holds LOCK.INFO no longer lists. */
  private void message(String channel, String message) {
    if (client.followsFailover() && !client.nodeFor(routeKey).equals(node)) {
      // Sentinel moved the primary: this node's news (its copy of a hold expiring, unrenewed,
      // while it is not reconfigured yet) is not the hold's; watch through the new primary.
      broken();
      return;
    }
    List<Lock> gone = new java.util.ArrayList<>();
    String reason;
    synchronized (this) {
      String key = keyOf.get(channel);
      if (key == null || closed) {
        return;
      }
      String[] words = message.split(" ", 5);
      String event = words.length > 1 && ENDINGS.contains(words[1]) ? words[1] : null;
      Object[] state;
      try {
        state = stateRead(key);
      } catch (RuntimeException lost) {
        broken(); // the connection is gone: so are its watches
        return;
      }
      LockInfo info = (LockInfo) state[1];
      // The message's words are used only when it is the key's latest change (its seq is the
      // state's): anyone may SPUBLISH, so an older or forged message names no reason.
      boolean latest = words[0].equals(String.valueOf(state[2]));
      reason = event != null && latest ? "feed: " + event : "feed: not held (LOCK.INFO)";
      for (Lock lock : holds.getOrDefault(key, Set.of())) {
        if (!listed(info, lock.tokenFor(key))) {
          gone.add(lock);
        }
      }
    }
    for (Lock lock : gone) {
      lose(lock, reason);
    }
  }

  /**
   * A connection of the feed broke (or its node is no longer the primary): each hold watched
   * here is watched again through a new feed (through Sentinel or a cluster, the new primary's:
   * there a broken feed is the failover's mark), where LOCK.INFO is read before anything is
   * reported; its watchdog, deadline and session still stand meanwhile. Not a loss by itself: a
   * killed connection is no news of the hold.
   */
  private synchronized void broken() {
    if (closed) {
      return;
    }
    closed = true;
    Set<Lock> all = new HashSet<>();
    holds.values().forEach(all::addAll);
    for (Lock lock : all) {
      rewatch(lock, 0);
    }
    close();
  }

  /**
   * {@code sunsubscribe channel} that this feed did not ask for: in a cluster the server sends it
   * when the slot's master gives the slot up (a failover, a migration). Its holds are watched
   * again on the slot's master now (or, for a client that follows no failover, reported).
   */
  private void unsubscribed(String channel) {
    Set<Lock> moved;
    synchronized (this) {
      String key = keyOf.get(channel);
      if (key == null || closed) {
        return; // ours (drop), or closing
      }
      keyOf.remove(channel);
      channelOf.remove(key);
      moved = holds.remove(key);
      try {
        LockClient.on(watchConn, client.args(Cmd.UNWATCH).key(key));
      } catch (RuntimeException ignored) {
        // the node is going: so is the watch
      }
    }
    if (moved == null) {
      return;
    }
    for (Lock lock : moved) {
      if (client.followsFailover()) {
        rewatch(lock, 0);
      } else {
        lose(lock, "feed: unsubscribed by the server");
      }
    }
  }

  /** Jedis's reader returned (no channel left): nothing to watch here any more. */
  private void ended() {
    boolean empty;
    synchronized (this) {
      empty = holds.isEmpty();
    }
    if (empty) {
      close();
    } else {
      broken(); // unsubscribed by the server: watched again
    }
  }

  /**
   * Try {@code lock} on a new feed of the key's node, every 100 ms while it is held: for a client
   * that follows failovers, once Jedis names the new primary (or 2 s passed).
   */
  private void rewatch(Lock lock, int attempt) {
    client.scheduler().schedule(() -> {
      if (!lock.isHeld()) {
        return;
      }
      if (attempt % 5 == 0) {
        client.failoverSeen(); // a cluster's slot table learnt again
      }
      if (client.followsFailover() && client.nodeFor(lock.keys().get(0)).equals(node) && attempt < 20) {
        rewatch(lock, attempt + 1); // Jedis has not heard of the new primary yet
        return;
      }
      try {
        if (!lock.watchThrough(client.feedFor(lock.keys().get(0)))) {
          rewatch(lock, attempt + 1);
        }
      } catch (RuntimeException e) {
        rewatch(lock, attempt + 1); // not reachable yet: the hold's deadline still ends this
      }
    }, 100, TimeUnit.MILLISECONDS);
  }

  /** Report on a timer thread: the loss callback must not run inside the feed's lock. */
  private void lose(Lock lock, String reason) {
    client.scheduler().execute(() -> lock.lose(reason));
  }

  boolean isClosed() {
    return closed;
  }

  synchronized void close() {
    closed = true;
    if (checking != null) {
      checking.cancel(false);
    }
    try {
      if (pubsub != null && pubsub.isSubscribed()) {
        pubsub.sunsubscribe();
      }
    } catch (RuntimeException ignored) {
      // closing anyway
    }
    if (subConn != null) {
      subConn.close();
    }
    if (watchConn != null) {
      watchConn.close();
    }
  }
}
