package io.redislock.shedlock.example;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.redislock.LockClient;
import io.redislock.testing.RedisServer;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.RegisterExtension;

/** The example as two workers (two clients, as two processes would have): one runs the job. */
class NightlyReportTest {
  @RegisterExtension static RedisServer server = new RedisServer();

  @Test
  void exactlyOneWorkerRunsTheJobWhileItRuns() throws Throwable {
    LockClient a = server.client();
    LockClient b = server.client();
    AtomicInteger runs = new AtomicInteger();
    CountDownLatch running = new CountDownLatch(1);
    CountDownLatch finish = new CountDownLatch(1);
    NightlyReport workerA = new NightlyReport(NightlyReport.lockProvider(a), () -> {
      runs.incrementAndGet();
      running.countDown();
      try {
        finish.await(30, TimeUnit.SECONDS);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
    });
    NightlyReport workerB = new NightlyReport(NightlyReport.lockProvider(b), runs::incrementAndGet);
    CompletableFuture<Boolean> ranA = CompletableFuture.supplyAsync(() -> {
      try {
        return workerA.runOnce();
      } catch (Throwable e) {
        throw new RuntimeException(e);
      }
    });
    assertTrue(running.await(10, TimeUnit.SECONDS));
    assertFalse(workerB.runOnce(), "worker B skips while A runs");
    finish.countDown();
    assertTrue(ranA.get(10, TimeUnit.SECONDS));
    assertEquals(1, runs.get());
    assertNull(a.info("shedlock:nightly-report"), "released after the run");
    assertTrue(workerB.runOnce(), "the next run goes ahead");
    assertEquals(2, runs.get());
  }
}
