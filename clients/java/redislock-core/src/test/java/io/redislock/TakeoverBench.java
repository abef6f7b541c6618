package io.redislock;

import io.redislock.testing.Harness;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import redis.clients.jedis.HostAndPort;

/**
 * Issue 29's measure for the Java client with its defaults: a holder process made as README.md's
 * first example ({@link DefaultHolderMain}: {@code client.lock(name, 30 s)}, {@code tryLock})
 * is killed with SIGKILL ({@code Process.destroyForcibly()}); the time from the kill to the
 * grant of a waiter queued in this process, on this process's clock. Each run starts a new
 * holder JVM on one server the harness started. Prints each run and then p50 and p99 (the
 * nearest rank; of 20 runs the p99 is the largest).
 *
 * <pre>
 * cd clients/java &amp;&amp; mvn -q -o install -DskipTests &amp;&amp; mvn -q -o -pl redislock-core test-compile \
 *   dependency:build-classpath -Dmdep.outputFile=target/cp.txt -Dmdep.includeScope=test
 * REDIS_SERVER=/usr/bin/redis-server REDIS_LOCK_MODULE=$PWD/../../target/debug/libredis_lock.so \
 *   java -cp redislock-core/target/test-classes:redislock-core/target/classes:$(cat redislock-core/target/cp.txt) \
 *   io.redislock.TakeoverBench [runs, default 20] [nosession]
 * </pre>
 */
public final class TakeoverBench {
  public static void main(String[] args) throws Exception {
    int runs = args.length > 0 ? Integer.parseInt(args[0]) : 20;
    String[] holderArgs = args.length > 1 && args[1].equals("nosession") ? new String[] {"nosession"} : new String[0];
    List<Double> ms = new ArrayList<>();
    try (Harness server = Harness.server();
        LockClient client = LockClient.connect(new HostAndPort("127.0.0.1", server.port()))) {
      for (int i = 0; i < runs; i++) {
        String key = "takeover:" + i;
        Process holder = DefaultHolderMain.start(server.port(), key, holderArgs);
        try {
          DefaultHolderMain.token(holder);
          Lock waiter = client.lock(key, Duration.ofSeconds(30));
          CompletableFuture<Long> granted = new CompletableFuture<>();
          Thread t = new Thread(() -> {
            try {
              granted.complete(waiter.tryLock(60, TimeUnit.SECONDS) ? System.nanoTime() : -1L);
            } catch (Throwable e) {
              granted.completeExceptionally(e);
            }
          });
          t.setDaemon(true);
          t.start();
          long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
          while (client.info(key).waiters() != 1) {
            if (System.nanoTime() > end) {
              throw new IllegalStateException("the waiter did not queue");
            }
            Thread.sleep(1);
          }
          long killed = System.nanoTime();
          holder.destroyForcibly();
          long at = granted.get(60, TimeUnit.SECONDS);
          if (at < 0) {
            throw new IllegalStateException("the waiter was not granted within 60 s");
          }
          double took = (at - killed) / 1e6;
          ms.add(took);
          System.out.printf("run %d: granted %.1f ms after SIGKILL%n", i + 1, took);
          waiter.unlock();
        } finally {
          holder.destroyForcibly();
          holder.waitFor(10, TimeUnit.SECONDS);
        }
      }
    }
    Collections.sort(ms);
    System.out.printf("kill -9 of the holder to the next grant, %d runs: p50 %.1f ms, p99 %.1f ms, min %.1f ms, max %.1f ms%n",
        ms.size(), rank(ms, 0.50), rank(ms, 0.99), ms.get(0), ms.get(ms.size() - 1));
  }

  /** The nearest-rank percentile of sorted {@code ms}. */
  static double rank(List<Double> ms, double p) {
    int i = (int) Math.ceil(p * ms.size()) - 1;
    return ms.get(Math.max(0, Math.min(ms.size() - 1, i)));
  }
}
