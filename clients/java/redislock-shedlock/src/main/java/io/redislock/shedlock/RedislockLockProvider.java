package io.redislock.shedlock;

import io.redislock.Lock;
import io.redislock.LockClient;
import java.time.Duration;
import java.time.Instant;
import java.util.Objects;
import java.util.Optional;
import net.javacrumbs.shedlock.core.ExtensibleLockProvider;
import net.javacrumbs.shedlock.core.LockConfiguration;
import net.javacrumbs.shedlock.core.SimpleLock;

/**
 * A ShedLock {@link net.javacrumbs.shedlock.core.LockProvider} on the redis-lock module: a user
 * of ShedLock's {@code RedisLockProvider} switches by changing one bean.
 *
 * <pre>{@code
 * @Bean LockProvider lockProvider(LockClient client) {
 *   return new RedislockLockProvider(client);          // was: new RedisLockProvider(connectionFactory)
 * }
 * }</pre>
 *
 * <p>What differs from {@code SET NX PX}: the hold has an owner and a fencing token on the
 * server, so {@code unlock()} and {@code extend()} are checked against the owner by the server
 * itself (a run that outlived {@code lockAtMostFor} never deletes the next run's lock), and with
 * {@link #waiting(Duration)} a caller waits in the server's FIFO queue (one
 * {@code LOCK.ACQUIRE ... BLOCK}) instead of skipping the run.
 *
 * <p>{@code lockAtMostFor} is the hold's ttl. {@code lockAtLeastFor}: {@code unlock()} before it
 * passed does not release; it sets the hold's deadline to {@code lockAtLeastUntil}
 * ({@code LOCK.EXTEND} with the time left), so nobody runs the task again before then.
 *
 * <p>Sessions: a run with no {@code lockAtLeastFor} holds in the client's default session (see
 * {@link LockClient}), so a node that dies mid-run frees the task's lock the default grace after
 * its connection closed, not at {@code lockAtMostFor}. A run with a {@code lockAtLeastFor} holds
 * by its ttl alone ({@code Lock.options().noSession()}): that hold must outlive the run, and
 * possibly the process (its {@code LockClient} closing releases every hold of the default
 * session), and the server cannot move a hold out of a session; so there, as with ShedLock's own
 * providers, a dead node's lock lasts until {@code lockAtMostFor}.
 */
public class RedislockLockProvider implements ExtensibleLockProvider {
  private final LockClient client;
  private final String prefix;
  private final Duration wait;

  /** Locks named {@code shedlock:<name>}, never waiting (ShedLock's own behaviour). */
  public RedislockLockProvider(LockClient client) {
    this(client, "shedlock:", Duration.ZERO);
  }

  private RedislockLockProvider(LockClient client, String prefix, Duration wait) {
    this.client = Objects.requireNonNull(client, "client");
    this.prefix = Objects.requireNonNull(prefix, "prefix");
    this.wait = wait;
  }

  /** The same provider with keys named {@code prefix + name}. */
  public RedislockLockProvider withPrefix(String prefix) {
    return new RedislockLockProvider(client, prefix, wait);
  }

  /** The same provider waiting up to {@code wait} in the lock's queue when it is held. */
  public RedislockLockProvider waiting(Duration wait) {
    return new RedislockLockProvider(client, prefix, wait);
  }

  @Override
  public Optional<SimpleLock> lock(LockConfiguration config) {
    Duration atMost = config.getLockAtMostFor();
    if (atMost.toMillis() <= 0) {
      throw new IllegalArgumentException("lockAtMostFor must be at least 1 ms, got " + atMost);
    }
    Lock.Options options = Lock.options();
    if (!config.getLockAtLeastFor().isZero()) {
      options.noSession(); // the lockAtLeastFor tail must outlive the run, even the process
    }
    Lock lock = client.lock(prefix + config.getName(), atMost, options);
    try {
      if (!lock.acquire(wait)) {
        return Optional.empty();
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return Optional.empty();
    }
    return Optional.of(new Held(lock, config.getLockAtLeastUntil()));
  }

  /** A hold; after {@code extend} or {@code unlock} this object is spent (as ShedLock requires). */
  private static final class Held implements SimpleLock {
    private final Lock lock;
    private final Instant atLeastUntil;
    private boolean valid = true;

    Held(Lock lock, Instant atLeastUntil) {
      this.lock = lock;
      this.atLeastUntil = atLeastUntil;
    }

    @Override
    public synchronized void unlock() {
      check();
      valid = false;
      long leftMs = Duration.between(Instant.now(), atLeastUntil).toMillis();
      if (leftMs > 0) {
        lock.extend(Duration.ofMillis(leftMs)); // owner-checked: a lost hold changes nothing
      } else {
        lock.release();
      }
    }

    @Override
    public synchronized Optional<SimpleLock> extend(Duration lockAtMostFor, Duration lockAtLeastFor) {
      check();
      valid = false;
      Instant now = Instant.now();
      if (lockAtMostFor.toMillis() <= 0 || !lock.extend(lockAtMostFor)) {
        return Optional.empty();
      }
      return Optional.of(new Held(lock, now.plus(lockAtLeastFor)));
    }

    private void check() {
      if (!valid) {
        throw new IllegalStateException("this lock was unlocked or extended already");
      }
    }
  }
}
