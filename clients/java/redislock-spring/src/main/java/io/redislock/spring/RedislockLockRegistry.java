package io.redislock.spring;

import io.redislock.LockClient;
import io.redislock.LockLostException;
import java.time.Duration;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.Lock;
import java.util.concurrent.locks.ReentrantLock;
import org.springframework.integration.support.locks.ExpirableLockRegistry;
import org.springframework.integration.support.locks.RenewableLockRegistry;

/**
 * A Spring Integration {@code LockRegistry} on the redis-lock module: a user of
 * {@code RedisLockRegistry} switches by changing one bean.
 *
 * <pre>{@code
 * @Bean LockRegistry lockRegistry(LockClient client) {
 *   return new RedislockLockRegistry(client, "orders");  // was: new RedisLockRegistry(connectionFactory, "orders")
 * }
 * }</pre>
 *
 * <p>As in Spring's registries, {@link #obtain} returns one lock per key, reentrant and owned by
 * the thread that locked it within this JVM (a local {@link ReentrantLock}), and held across
 * processes on the server while its first hold lasts. What differs from {@code RedisLockRegistry}:
 * a wait is one {@code LOCK.ACQUIRE ... BLOCK} in the server's FIFO queue (no 100 ms polling, no
 * pub/sub), an interrupt leaves no grant behind, the hold has a fencing token, and release and
 * renewal are checked against the owner by the server.
 *
 * <p>Each hold lasts {@code expireAfter} (default 60 s, as {@code RedisLockRegistry}) from its
 * grant; {@link #renewLock} extends it, or {@link #withWatchdog()} renews every third of it.
 * {@link #expireUnusedOlderThan} forgets unlocked locks not used for that long.
 *
 * <p>The holds are in the {@link LockClient}'s default session: a process that dies (crash,
 * {@code kill -9}) frees its locks the default grace (500 ms) after the server saw its
 * connection close, not at {@code expireAfter}; closing the {@code LockClient} releases them.
 */
public class RedislockLockRegistry implements ExpirableLockRegistry, RenewableLockRegistry {
  /** RedisLockRegistry's default expireAfter. */
  public static final Duration DEFAULT_EXPIRE_AFTER = Duration.ofSeconds(60);

  private final LockClient client;
  private final String registryKey;
  private final Duration expireAfter;
  private final boolean watchdog;
  private final Map<String, RegistryLock> locks = new ConcurrentHashMap<>();

  public RedislockLockRegistry(LockClient client, String registryKey) {
    this(client, registryKey, DEFAULT_EXPIRE_AFTER, false);
  }

  public RedislockLockRegistry(LockClient client, String registryKey, Duration expireAfter) {
    this(client, registryKey, expireAfter, false);
  }

  private RedislockLockRegistry(LockClient client, String registryKey, Duration expireAfter, boolean watchdog) {
    this.client = Objects.requireNonNull(client, "client");
    this.registryKey = Objects.requireNonNull(registryKey, "registryKey");
    this.expireAfter = expireAfter;
    this.watchdog = watchdog;
  }

  /** The same registry whose holds are renewed by the watchdog while held. */
  public RedislockLockRegistry withWatchdog() {
    return new RedislockLockRegistry(client, registryKey, expireAfter, true);
  }

  /** The server key of {@code lockKey}: {@code registryKey:lockKey}. */
  public String keyOf(Object lockKey) {
    return registryKey + ":" + lockKey;
  }

  @Override
  public Lock obtain(Object lockKey) {
    Objects.requireNonNull(lockKey, "lockKey");
    return locks.computeIfAbsent(keyOf(lockKey), RegistryLock::new);
  }

  @Override
  public void expireUnusedOlderThan(long age) {
    long now = System.currentTimeMillis();
    locks.values().removeIf(l -> !l.local.isLocked() && now - l.lastUsed > age);
  }

  /**
   * Extend the hold of {@code lockKey} by {@code expireAfter}. IllegalStateException if the
   * current thread does not hold it, or the server says its hold is gone.
   */
  @Override
  public void renewLock(Object lockKey) {
    RegistryLock l = locks.get(keyOf(lockKey));
    if (l == null || !l.local.isHeldByCurrentThread()) {
      throw new IllegalStateException("the lock " + lockKey + " is not held by the current thread");
    }
    if (!l.remote.extend()) {
      throw new IllegalStateException("the lock " + lockKey + " was lost on the server (expired or taken)");
    }
  }

  /** A registry lock: a local ReentrantLock for the threads of this JVM, the module's lock for everyone. */
  private final class RegistryLock implements Lock {
    final ReentrantLock local = new ReentrantLock();
    final io.redislock.Lock remote;
    volatile long lastUsed = System.currentTimeMillis();

    RegistryLock(String key) {
      this.remote = client.lock(key, expireAfter, io.redislock.Lock.options().watchdog(watchdog));
    }

    @Override
    public void lock() {
      local.lock();
      if (local.getHoldCount() > 1) {
        return;
      }
      try {
        remote.lock();
      } catch (RuntimeException e) {
        local.unlock();
        throw e;
      }
      lastUsed = System.currentTimeMillis();
    }

    @Override
    public void lockInterruptibly() throws InterruptedException {
      local.lockInterruptibly();
      if (local.getHoldCount() > 1) {
        return;
      }
      try {
        remote.lockInterruptibly();
      } catch (InterruptedException | RuntimeException e) {
        local.unlock();
        throw e;
      }
      lastUsed = System.currentTimeMillis();
    }

    @Override
    public boolean tryLock() {
      if (!local.tryLock()) {
        return false;
      }
      if (local.getHoldCount() > 1) {
        return true;
      }
      boolean ok = false;
      try {
        ok = remote.tryLock();
        return ok;
      } finally {
        if (!ok) {
          local.unlock();
        } else {
          lastUsed = System.currentTimeMillis();
        }
      }
    }

    @Override
    public boolean tryLock(long time, TimeUnit unit) throws InterruptedException {
      long deadline = System.nanoTime() + unit.toNanos(time);
      if (!local.tryLock(time, unit)) {
        return false;
      }
      if (local.getHoldCount() > 1) {
        return true;
      }
      boolean ok = false;
      try {
        ok = remote.tryLock(Math.max(0, deadline - System.nanoTime()), TimeUnit.NANOSECONDS);
        return ok;
      } finally {
        if (!ok) {
          local.unlock();
        } else {
          lastUsed = System.currentTimeMillis();
        }
      }
    }

    /**
     * Release; IllegalStateException (after releasing locally) if the server's hold had expired,
     * as RedisLockRegistry reports it.
     */
    @Override
    public void unlock() {
      if (!local.isHeldByCurrentThread()) {
        throw new IllegalStateException("you do not own the lock " + remote.name());
      }
      if (local.getHoldCount() > 1) {
        local.unlock();
        return;
      }
      try {
        remote.unlock();
      } catch (LockLostException e) {
        throw new IllegalStateException("the lock " + remote.name() + " was released in the store due to expiration: " + e.reason(), e);
      } finally {
        local.unlock();
        lastUsed = System.currentTimeMillis();
      }
    }

    @Override
    public Condition newCondition() {
      throw new UnsupportedOperationException("conditions are not supported by distributed locks");
    }

    @Override
    public String toString() {
      return "RedislockLockRegistry.RegistryLock[" + remote.name() + ", token=" + remote.token() + "]";
    }
  }
}
