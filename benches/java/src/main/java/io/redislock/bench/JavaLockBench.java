package io.redislock.bench;

import io.redislock.Lock;
import io.redislock.LockClient;
import io.redislock.Session;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.redisson.Redisson;
import org.redisson.api.RLock;
import org.redisson.api.RedissonClient;
import org.redisson.config.Config;
import redis.clients.jedis.ConnectionPoolConfig;
import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.HostAndPort;

/**
 * Handoffs per second and acquire latency (p50, p99) on one contended key, at 8 and 32 threads,
 * this client's {@code Lock} (one LOCK.ACQUIRE ... BLOCK per wait) against Redisson's
 * {@code RLock} (Lua scripts, a pub/sub wake-up, retries), on the same server in one run; then a
 * crashed holder (a child JVM killed with SIGKILL): how long until a waiter gets its lock.
 *
 * <p>Run by {@code make bench-java}; SECONDS=n per measured run (default 5), QUICK=1 for 1 s.
 */
public final class JavaLockBench {
  interface Locker {
    void lock() throws Exception;

    void unlock() throws Exception;
  }

  interface LockerFactory {
    Locker make(int thread);
  }

  record Result(String lib, int threads, double handoffsPerSec, double p50Ms, double p99Ms, long handoffs) {}

  public static void main(String[] args) throws Exception {
    if (args.length > 0 && args[0].startsWith("hold-")) {
      hold(args[0], Integer.parseInt(args[1]), args[2]);
      return;
    }
    boolean quick = "1".equals(System.getenv("QUICK"));
    int seconds = quick ? 1 : Integer.parseInt(System.getenv().getOrDefault("SECONDS", "5"));
    Path workspace = Paths.get(System.getProperty("redislock.workspace", "../..")).toAbsolutePath().normalize();
    Process harness = new ProcessBuilder(workspace.resolve("target/debug/harness").toString(), "server")
        .redirectError(ProcessBuilder.Redirect.INHERIT).start();
    String line = new BufferedReader(new InputStreamReader(harness.getInputStream(), StandardCharsets.UTF_8)).readLine();
    Matcher m = Pattern.compile("\"port\":(\\d+)").matcher(line);
    if (!m.find()) {
      throw new IOException("the harness printed " + line);
    }
    int port = Integer.parseInt(m.group(1));
    try {
      run(port, seconds, quick, workspace);
    } finally {
      harness.getOutputStream().close();
      harness.waitFor(20, TimeUnit.SECONDS);
    }
  }

  static void run(int port, int seconds, boolean quick, Path workspace) throws Exception {
    ConnectionPoolConfig pool = new ConnectionPoolConfig();
    pool.setMaxTotal(64); // as Redisson's default connectionPoolSize
    pool.setMaxIdle(64);
    LockClient client = LockClient.connect(new HostAndPort("127.0.0.1", port), DefaultJedisClientConfig.builder().build(), pool);
    Config config = new Config();
    config.useSingleServer().setAddress("redis://127.0.0.1:" + port);
    RedissonClient redisson = Redisson.create(config);
    List<Result> results = new ArrayList<>();
    try {
      for (int threads : new int[] {8, 32}) {
        String key = "bench:" + threads + ":" + System.nanoTime();
        results.add(measure("redislock Lock", threads, seconds, t -> {
          Lock lock = client.lock(key, Duration.ofSeconds(30));
          return new Locker() {
            public void lock() {
              lock.lock();
            }

            public void unlock() {
              lock.unlock();
            }
          };
        }));
        String rkey = "bench-redisson:" + threads + ":" + System.nanoTime();
        RLock rlock = redisson.getLock(rkey);
        results.add(measure("Redisson RLock", threads, seconds, t -> new Locker() {
          public void lock() {
            rlock.lock();
          }

          public void unlock() {
            rlock.unlock();
          }
        }));
      }
      StringBuilder out = new StringBuilder();
      out.append("| lock | threads | handoffs/s | acquire p50 (ms) | acquire p99 (ms) | handoffs |\n|---|---|---|---|---|---|\n");
      for (Result r : results) {
        out.append(String.format("| %s | %d | %.0f | %.3f | %.3f | %d |%n", r.lib, r.threads, r.handoffsPerSec, r.p50Ms, r.p99Ms, r.handoffs));
      }
      out.append("\n| a holder killed with SIGKILL | lock handed to the queued waiter after |\n|---|---|\n");
      out.append(String.format("| redislock Lock in a BOUND session | %s |%n", crash("hold-redislock", port, client, redisson, quick)));
      out.append(String.format("| Redisson RLock (watchdog lease 30 s) | %s |%n", crash("hold-redisson", port, client, redisson, quick)));
      System.out.print(out);
      Path file = workspace.resolve(quick ? "target/bench/java-handoffs.md" : "benches/results/java-handoffs.md");
      Files.createDirectories(file.getParent());
      Files.writeString(file, "# Java: redislock Lock vs Redisson RLock\n\n"
          + "`make bench-java` (benches/java/src/main/java/io/redislock/bench/JavaLockBench.java): one key, every thread\n"
          + "looping lock, unlock; " + seconds + " s per row after 1 s of warm-up, client and server on the same machine ("
          + Runtime.getRuntime().availableProcessors() + " cores, shared), Redis " + serverVersion(client) + ", Java "
          + System.getProperty("java.version") + ", Jedis 7.4.1, Redisson 3.52.0 (defaults; 64 pooled connections each).\n"
          + "Module: " + System.getenv().getOrDefault("REDIS_LOCK_MODULE", "(the harness's default)") + ".\n"
          + "Acquire latency: from the call to lock() to its return.\n\n" + out);
      System.out.println("written to " + file);
    } finally {
      redisson.shutdown();
      client.close();
    }
  }

  static String serverVersion(LockClient client) {
    for (String l : client.jedis().info("server").split("\r?\n")) {
      if (l.startsWith("redis_version:")) {
        return l.substring("redis_version:".length()).trim();
      }
    }
    return "?";
  }

  static Result measure(String lib, int threads, int seconds, LockerFactory factory) throws Exception {
    AtomicBoolean measuring = new AtomicBoolean(false);
    AtomicBoolean stop = new AtomicBoolean(false);
    long[][] samples = new long[threads][];
    int[] counts = new int[threads];
    CountDownLatch done = new CountDownLatch(threads);
    List<Thread> ts = new ArrayList<>();
    for (int i = 0; i < threads; i++) {
      int id = i;
      Locker locker = factory.make(i);
      Thread t = new Thread(() -> {
        long[] mine = new long[1 << 16];
        int n = 0;
        try {
          while (!stop.get()) {
            long t0 = System.nanoTime();
            locker.lock();
            long waited = System.nanoTime() - t0;
            locker.unlock();
            if (measuring.get()) {
              if (n == mine.length) {
                mine = Arrays.copyOf(mine, n * 2);
              }
              mine[n++] = waited;
            }
          }
        } catch (Exception e) {
          e.printStackTrace();
        } finally {
          samples[id] = mine;
          counts[id] = n;
          done.countDown();
        }
      });
      t.setDaemon(true);
      ts.add(t);
      t.start();
    }
    Thread.sleep(1000); // warm-up
    measuring.set(true);
    long start = System.nanoTime();
    Thread.sleep(seconds * 1000L);
    measuring.set(false);
    long elapsed = System.nanoTime() - start;
    stop.set(true);
    if (!done.await(60, TimeUnit.SECONDS)) {
      throw new IllegalStateException(lib + ": threads did not stop");
    }
    int total = Arrays.stream(counts).sum();
    long[] all = new long[total];
    int k = 0;
    for (int i = 0; i < threads; i++) {
      System.arraycopy(samples[i], 0, all, k, counts[i]);
      k += counts[i];
    }
    Arrays.sort(all);
    double p50 = total == 0 ? 0 : all[(int) (total * 0.50)] / 1e6;
    double p99 = total == 0 ? 0 : all[Math.min(total - 1, (int) (total * 0.99))] / 1e6;
    Result r = new Result(lib, threads, total / (elapsed / 1e9), p50, p99, total);
    System.err.printf("%s, %d threads: %.0f handoffs/s, p50 %.3f ms, p99 %.3f ms%n", lib, threads, r.handoffsPerSec, p50, p99);
    return r;
  }

  /** A child JVM takes the lock and is killed; ms until a waiter queued here gets it. */
  static String crash(String mode, int port, LockClient client, RedissonClient redisson, boolean quick) throws Exception {
    String key = "crash:" + mode + ":" + System.nanoTime();
    String java = Paths.get(System.getProperty("java.home"), "bin", "java").toString();
    Process holder = new ProcessBuilder(java, "-cp", System.getProperty("java.class.path"), JavaLockBench.class.getName(), mode,
        String.valueOf(port), key).redirectError(ProcessBuilder.Redirect.INHERIT).start();
    try {
      String line = new BufferedReader(new InputStreamReader(holder.getInputStream(), StandardCharsets.UTF_8)).readLine();
      if (!"held".equals(line)) {
        return "the holder failed: " + line;
      }
      long[] grantedAt = {0};
      CountDownLatch granted = new CountDownLatch(1);
      Thread waiter = new Thread(() -> {
        try {
          if (mode.equals("hold-redislock")) {
            Lock l = client.lock(key, Duration.ofSeconds(30));
            if (l.tryLock(60, TimeUnit.SECONDS)) {
              grantedAt[0] = System.nanoTime();
              l.unlock();
            }
          } else {
            RLock l = redisson.getLock(key);
            if (l.tryLock(60, TimeUnit.SECONDS)) {
              grantedAt[0] = System.nanoTime();
              l.unlock();
            }
          }
        } catch (Exception e) {
          e.printStackTrace();
        } finally {
          granted.countDown();
        }
      });
      waiter.setDaemon(true);
      waiter.start();
      // wait until the waiter is queued on the server (Redisson's: subscribed to its lock's channel)
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
      while (System.nanoTime() < deadline && !waiting(mode, key, client)) {
        Thread.sleep(1);
      }
      long killed = System.nanoTime();
      holder.destroyForcibly();
      if (quick && mode.equals("hold-redisson")) {
        return "not measured with QUICK=1 (waits out the lease, about 30 s)";
      }
      if (!granted.await(70, TimeUnit.SECONDS) || grantedAt[0] == 0) {
        return "not within 60 s";
      }
      return String.format("%.0f ms", (grantedAt[0] - killed) / 1e6);
    } finally {
      holder.destroyForcibly();
      holder.waitFor(10, TimeUnit.SECONDS);
    }
  }

  static boolean waiting(String mode, String key, LockClient client) {
    if (mode.equals("hold-redislock")) {
      io.redislock.LockInfo info = client.info(key);
      return info != null && info.waiters() == 1;
    }
    Object n = client.jedis().sendCommand(redis.clients.jedis.Protocol.Command.PUBSUB, "NUMSUB", "redisson_lock__channel:{" + key + "}");
    List<?> reply = (List<?>) n;
    return reply.size() == 2 && ((Long) reply.get(1)) >= 1;
  }

  /** The child: take the lock and wait to be killed. */
  static void hold(String mode, int port, String key) throws Exception {
    if (mode.equals("hold-redislock")) {
      LockClient client = LockClient.connect(new HostAndPort("127.0.0.1", port));
      Session s = client.session(Duration.ofSeconds(60), Session.options().bound(true)).open();
      client.lock(key, Duration.ZERO, Lock.options().session(s)).lock();
    } else {
      Config config = new Config();
      config.useSingleServer().setAddress("redis://127.0.0.1:" + port);
      Redisson.create(config).getLock(key).lock(); // the watchdog's 30 s lease, renewed every 10 s
    }
    System.out.println("held");
    System.out.flush();
    Thread.sleep(Long.MAX_VALUE);
  }
}
