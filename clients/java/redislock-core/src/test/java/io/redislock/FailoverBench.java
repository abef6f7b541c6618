package io.redislock;

import io.redislock.testing.Harness;
import java.nio.charset.StandardCharsets;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.Jedis;
import redis.clients.jedis.commands.ProtocolCommand;

/**
 * How long the Java client takes to follow a planned {@code CLUSTER FAILOVER} (issue 34); the
 * rows and shape of benches/failover/follow.py (the Python client's).
 *
 * <p>On a 3-master, 3-replica cluster started by the workspace's harness ({@link
 * Harness#cluster}, as {@link ClusterFailoverTest} does), a {@code LockClient.cluster} client
 * with, as the README shows, a session (ttl 3 s, {@code keepalivePeriod(200 ms)}) holding a lock,
 * and {@code client.watch(key)} of a second key of the same shard. Each round sends {@code
 * CLUSTER FAILOVER} to the shard's replica (rounds alternate between the two nodes) and measures,
 * from the moment that command answered:
 *
 * <ul>
 *   <li>promoted: the replica's {@code ROLE} says master (polled every 2 ms);
 *   <li>keepalive: the session's first keepalive answered by the new master: the new master's
 *       {@code INFO commandstats} count of {@code lock.session|keepalive} first above its count
 *       before the failover (polled every 2 ms; the session is the only one on the shard, checked
 *       with {@code LOCK.SESSION LIST}; a keepalive that met {@code MOVED} there counts as
 *       rejected, not as a call);
 *   <li>observer: the watch's first change read from the new master. This client's observer
 *       reports a state only when it differs from the last, so a raw connection takes the watched
 *       key on the new master as soon as its {@code ROLE} says master; the change is the first
 *       the observer reports after the failover (it must be that grant: its token).
 * </ul>
 *
 * <p>Then it checks that no hold was lost (the session and its lock not lost, the new master's
 * {@code LOCK.FENCE} of the lock's token): a lost hold ends the program with exit code 1. Prints
 * each round on stderr and the table on stdout. A measurement, not a test: {@code make
 * bench-failover} runs it from test-classes as {@code make bench-takeover} runs {@link
 * TakeoverBench}; {@code QUICK=1}: 1 round, else 4.
 */
public final class FailoverBench {
  /**
   * Redis spaces the failovers of one shard (see follow.py's VOTE_SPACING): a master votes for
   * one failover of a given master per cluster-node-timeout x 2, a replica that ran an election
   * waits x 4 before its next (the harness's timeout is 5 s).
   */
  static final long VOTE_SPACING_MS = 21_000;
  static final Duration KEEPALIVE = Duration.ofMillis(200);
  /** The bound on every wait: a wait that runs out ends the round with an error. */
  static final long PATIENCE_MS = 30_000;
  static final long POLL_MS = 2;
  static final String TAG = "{bench-failover}";

  record Seen(long at, Election.Change change) {}

  static ProtocolCommand command(String name) {
    byte[] raw = name.getBytes(StandardCharsets.UTF_8);
    return () -> raw;
  }

  static String text(Object o) {
    return o instanceof byte[] b ? new String(b, StandardCharsets.UTF_8) : String.valueOf(o);
  }

  static Jedis node(int port) {
    return new Jedis("127.0.0.1", port, 2000);
  }

  /** ROLE's reply, or null if the node does not answer. */
  static List<?> role(int port) {
    try (Jedis j = node(port)) {
      return (List<?>) j.sendCommand(command("ROLE"));
    } catch (RuntimeException down) {
      return null;
    }
  }

  static boolean isRole(int port, String kind) {
    List<?> r = role(port);
    return r != null && text(r.get(0)).equals(kind);
  }

  static long calls(Jedis j, String cmd) {
    String prefix = "cmdstat_" + cmd + ":calls=";
    for (String line : j.info("commandstats").split("\r?\n")) {
      if (line.startsWith(prefix)) {
        return Long.parseLong(line.substring(prefix.length()).split(",")[0]);
      }
    }
    return 0;
  }

  static void until(String what, BooleanSupplier f) throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(PATIENCE_MS);
    while (!f.getAsBoolean()) {
      if (System.nanoTime() > deadline) {
        throw new IllegalStateException("timed out waiting for " + what);
      }
      Thread.sleep(POLL_MS);
    }
  }

  /** The ports of the master serving TAG's slot now and of its replica. */
  static int[] shard(List<Integer> ports) {
    Integer old = null;
    for (int p : ports) {
      if (isRole(p, "master")) {
        try (Jedis j = node(p)) {
          j.sendCommand(command("LOCK.FENCE"), TAG);
          old = p;
        } catch (RuntimeException moved) {
          // another shard's master
        }
      }
    }
    if (old == null) {
      throw new IllegalStateException("no master serves the tag");
    }
    for (int p : ports) {
      List<?> r = role(p);
      if (r != null && text(r.get(0)).equals("slave") && ((Long) r.get(2)).intValue() == old) {
        return new int[] {old, p};
      }
    }
    throw new IllegalStateException("the tag's master has no replica");
  }

  /** Whether the master on {@code master}'s CLUSTER NODES lists the node on {@code replica} as its replica. */
  static boolean knowsReplica(int master, int replica) {
    try (Jedis j = node(master)) {
      List<String[]> lines = new ArrayList<>();
      String me = null;
      for (String l : j.clusterNodes().split("\n")) {
        String[] f = l.trim().split(" ");
        if (f.length > 3) {
          lines.add(f);
          if (f[2].contains("myself")) {
            me = f[0];
          }
        }
      }
      for (String[] f : lines) {
        if (f[1].startsWith("127.0.0.1:" + replica + "@") && f[2].contains("slave") && f[3].equals(me)) {
          return true;
        }
      }
      return false;
    } catch (RuntimeException e) {
      return false;
    }
  }

  static Seen next(LinkedBlockingQueue<Seen> changes, long timeoutMs) throws InterruptedException {
    Seen s = changes.poll(Math.max(1, timeoutMs), TimeUnit.MILLISECONDS);
    if (s == null) {
      throw new IllegalStateException("the observer reported nothing within " + timeoutMs + " ms");
    }
    return s;
  }

  public static void main(String[] args) throws Exception {
    int rounds = "1".equals(System.getenv("QUICK")) ? 1 : 4;
    List<double[]> rows;
    try (Harness cluster = Harness.cluster(3, 1)) {
      rows = run(cluster.ports(), rounds);
    } catch (Exception e) {
      System.err.println("FailoverBench: " + e);
      e.printStackTrace();
      System.exit(1);
      return;
    }
    String server = "?";
    Process p = new ProcessBuilder(System.getenv().getOrDefault("REDIS_SERVER", "redis-server"), "--version").start();
    String[] f = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8).split(" ");
    if (f.length > 2) {
      server = f[2].replace("v=", "");
    }
    String module = System.getenv("REDIS_LOCK_MODULE");
    String build = module == null ? "debug" : Paths.get(module).getParent().getFileName().toString();
    System.out.printf("Java client (Jedis %s, LockClient.cluster) following a planned `CLUSTER FAILOVER` (%d round%s, Redis %s, "
        + "3 masters + 3 replicas on one %d-core machine, module %s build, session ttl 3 s, keepalive every 0.2 s, each failover at a random point of that period; "
        + "ms from the command's reply; no hold lost in any round). Keepalive: the new master's `INFO commandstats` "
        + "count of `lock.session|keepalive` first above its count before the failover, polled every 2 ms. Observer: "
        + "`client.watch(key)`'s first change after the failover, the key taken on the new master by a raw "
        + "`LOCK.ACQUIRE` as soon as its `ROLE` said master (this client reports only a state that differs from the last).%n%n",
        jedisVersion(), rows.size(), rows.size() == 1 ? "" : "s", server, Runtime.getRuntime().availableProcessors(), build);
    System.out.println("| from `CLUSTER FAILOVER` answered to | median ms | min | max |");
    System.out.println("|---|---|---|---|");
    line("the replica's `ROLE` is master", rows, 0);
    line("the session's first keepalive answered by the new master", rows, 1);
    line("the observer's first change read from the new master", rows, 2);
    System.exit(0);
  }

  static String jedisVersion() {
    // The jar's name (jedis-7.4.0.jar): Jedis's manifest has no Implementation-Version.
    String jar = Paths.get(Jedis.class.getProtectionDomain().getCodeSource().getLocation().getPath()).getFileName().toString();
    return jar.startsWith("jedis-") && jar.endsWith(".jar") ? jar.substring(6, jar.length() - 4) : "?";
  }

  static void line(String name, List<double[]> rows, int i) {
    List<Double> v = new ArrayList<>();
    for (double[] r : rows) {
      v.add(r[i]);
    }
    Collections.sort(v);
    int n = v.size();
    double median = n % 2 == 1 ? v.get(n / 2) : (v.get(n / 2 - 1) + v.get(n / 2)) / 2;
    System.out.printf("| %s | %.0f | %.0f | %.0f |%n", name, median, v.get(0), v.get(n - 1));
  }

  static double ms(long nanos) {
    return nanos / 1e6;
  }

  static List<double[]> run(List<Integer> ports, int rounds) throws Exception {
    Set<HostAndPort> nodes = new HashSet<>();
    for (int port : ports) {
      nodes.add(new HostAndPort("127.0.0.1", port));
    }
    try (LockClient client = LockClient.cluster(nodes, DefaultJedisClientConfig.builder().build())) {
      Session session = client.session(Duration.ofSeconds(3), Session.options().key(TAG).keepalivePeriod(KEEPALIVE)).open();
      String heldKey = TAG + "held";
      Lock held = client.lock(heldKey, Duration.ZERO, Lock.options().session(session));
      if (!held.tryLock()) {
        throw new IllegalStateException("the held key is taken");
      }
      String probeKey = TAG + "probe";
      Election.Observation observation = client.watch(probeKey);
      LinkedBlockingQueue<Seen> changes = new LinkedBlockingQueue<>();
      Thread reader = new Thread(() -> {
        try {
          while (!Thread.currentThread().isInterrupted()) {
            observation.next(Duration.ofSeconds(1)).ifPresent(c -> changes.add(new Seen(System.nanoTime(), c)));
          }
        } catch (InterruptedException stop) {
          // closed
        }
      });
      reader.setDaemon(true);
      reader.start();
      Seen start = next(changes, PATIENCE_MS);
      if (start.change().leader() != null) {
        throw new IllegalStateException("the probe key is held at the start: " + start.change());
      }
      try (Jedis j = node(shard(ports)[0])) {
        List<?> list = (List<?>) j.sendCommand(command("LOCK.SESSION"), "LIST");
        int count = ((List<?>) list.get(1)).size();
        if (count != 1) {
          throw new IllegalStateException("the shard has " + count + " sessions, not the session alone");
        }
      }

      Map<Integer, Long> last = new HashMap<>();
      List<double[]> rows = new ArrayList<>();
      for (int i = 1; i <= rounds; i++) {
        int[] s = shard(ports);
        int old = s[0];
        int neu = s[1];
        long since = Math.max(last.getOrDefault(old, Long.MIN_VALUE), last.getOrDefault(neu, Long.MIN_VALUE));
        if (since != Long.MIN_VALUE) {
          long wait = TimeUnit.NANOSECONDS.toMillis(since + TimeUnit.MILLISECONDS.toNanos(VOTE_SPACING_MS) - System.nanoTime());
          if (wait > 0) {
            Thread.sleep(wait); // Redis's own vote spacing, not a wait for state (see VOTE_SPACING_MS)
          }
        }
        // A random part of a keepalive period, so that the rounds do not all fall on one phase of
        // the session's keepalive (the spacing is a whole number of periods).
        Thread.sleep(ThreadLocalRandom.current().nextLong(KEEPALIVE.toMillis()));
        try (Jedis o = node(old); Jedis n = node(neu)) {
          until("a replica in sync", () -> Long.valueOf(1).equals(o.sendCommand(command("WAIT"), "1", "1000")));
          long before = calls(n, "lock.session|keepalive");
          changes.clear();

          String ok = text(n.sendCommand(command("CLUSTER"), "FAILOVER"));
          long t0 = System.nanoTime();
          if (!ok.equals("OK")) {
            throw new IllegalStateException("CLUSTER FAILOVER answered " + ok);
          }
          last.put(old, t0);
          last.put(neu, t0);

          // Poll the promotion, then take the watched key there (once), and the keepalive count.
          long[] at = {0, 0, 0}; // promoted, probe's token, keepalive
          try {
            until("the promotion, the probe's grant and a keepalive on the new master", () -> {
              if (at[0] == 0 && isRole(neu, "master")) {
                at[0] = System.nanoTime() - t0;
              }
              if (at[0] != 0 && at[1] == 0) {
                try {
                  Object token = n.sendCommand(command("LOCK.ACQUIRE"), probeKey, "bench-probe", "60000");
                  at[1] = token instanceof Long l ? l : 0;
                } catch (RuntimeException notYet) {
                  // MOVED: not serving the slot yet
                }
              }
              if (at[2] == 0 && calls(n, "lock.session|keepalive") > before) {
                at[2] = System.nanoTime() - t0;
              }
              return at[0] != 0 && at[1] != 0 && at[2] != 0;
            });
          } catch (IllegalStateException e) {
            throw new IllegalStateException(e.getMessage() + " (promoted " + at[0] + " ns, probe " + at[1] + ", keepalive " + at[2] + " ns)");
          }
          long probe = at[1];
          Seen first = next(changes, PATIENCE_MS);
          long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(PATIENCE_MS);
          for (Seen c = first; c.change().leader() == null || c.change().leader().term() != probe; ) {
            c = next(changes, TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime()));
          }
          long observed = first.at() - t0;

          if (!Long.valueOf(1).equals(n.sendCommand(command("LOCK.RELEASE"), probeKey, "bench-probe"))) {
            throw new IllegalStateException("the probe's release answered 0");
          }
          while (next(changes, PATIENCE_MS).change().leader() != null) {
            // until the release is reported
          }
          Object fenced = n.sendCommand(command("LOCK.FENCE"), heldKey, String.valueOf(held.token()));
          if (!Long.valueOf(1).equals(fenced)) {
            throw new IllegalStateException("HOLD LOST: the new master's LOCK.FENCE of the hold answered " + fenced);
          }
          if (session.isLost() || held.isLost()) {
            throw new IllegalStateException("HOLD LOST: the client reports " + session.lostReason() + " / " + held.lostReason());
          }

          until("the old master a replica", () -> isRole(old, "slave"));
          // The next round's replica must be in sync, or its CLUSTER FAILOVER times out ...
          until("its link up", () -> o.info("replication").contains("master_link_status:up"));
          // ... and known as a replica to its new master.
          until("the new master to know its replica", () -> knowsReplica(neu, old));
          double[] row = {ms(at[0]), ms(at[2]), ms(observed)};
          System.err.printf("round %d: %.0f / %.0f / %.0f ms%n", i, row[0], row[1], row[2]);
          rows.add(row);
        }
      }
      reader.interrupt();
      observation.close();
      held.release();
      session.end();
      return rows;
    }
  }
}
