package io.redislock.shedlock.example;

import io.redislock.LockClient;
import io.redislock.shedlock.RedislockLockProvider;
import java.time.Duration;
import java.time.Instant;
import net.javacrumbs.shedlock.core.DefaultLockingTaskExecutor;
import net.javacrumbs.shedlock.core.LockConfiguration;
import net.javacrumbs.shedlock.core.LockProvider;
import net.javacrumbs.shedlock.core.LockingTaskExecutor;

/**
 * A ShedLock user's scheduled job: every worker calls {@link #runOnce()} on schedule and ShedLock
 * lets exactly one of them run it. The switch to this module is the one bean below.
 */
public final class NightlyReport {
  /** The one bean a ShedLock user changes (was {@code new RedisLockProvider(connectionFactory)}). */
  public static LockProvider lockProvider(LockClient client) {
    return new RedislockLockProvider(client);
  }

  private final LockingTaskExecutor executor;
  private final Runnable job;

  public NightlyReport(LockProvider lockProvider, Runnable job) {
    this.executor = new DefaultLockingTaskExecutor(lockProvider);
    this.job = job;
  }

  /** Run the job if no other worker is running it; true if this worker ran it. */
  public boolean runOnce() throws Throwable {
    LockConfiguration config = new LockConfiguration(Instant.now(), "nightly-report", Duration.ofMinutes(10), Duration.ZERO);
    return executor.executeWithLock(() -> {
      job.run();
      return Boolean.TRUE;
    }, config).wasExecuted();
  }
}
