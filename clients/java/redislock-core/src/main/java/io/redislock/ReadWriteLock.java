package io.redislock;

import java.time.Duration;
import redis.clients.jedis.CommandArguments;

/**
 * A read/write lock on one key: {@link #readLock()} is a SHARED hold (any number of readers),
 * {@link #writeLock()} an exclusive one, both in the key's one FIFO queue (readers that come
 * after a waiting writer wait behind it: no writer starvation). Each side is a holder with an
 * owner of its own ({@code owner:read}, {@code owner:write} when an owner is given). No upgrade
 * or downgrade: holding one side and asking for the other is the server's ERR.
 */
public class ReadWriteLock implements java.util.concurrent.locks.ReadWriteLock {
  private final Lock read;
  private final Lock write;

  ReadWriteLock(LockClient client, String name, Duration ttl, Lock.Options options) {
    Lock.Options r = options.copy();
    Lock.Options w = options.copy();
    if (options.owner != null) {
      r.owner(options.owner + ":read");
      w.owner(options.owner + ":write");
    }
    this.read = new ReadLock(client, name, ttl, r);
    this.write = new Lock(client, name, ttl, w);
  }

  @Override
  public Lock readLock() {
    return read;
  }

  @Override
  public Lock writeLock() {
    return write;
  }

  /** The read side: SHARED, no limit. */
  static final class ReadLock extends Lock {
    ReadLock(LockClient client, String name, Duration ttl, Options options) {
      super(client, name, ttl, options);
    }

    @Override
    void modeArgs(CommandArguments args) {
      args.add("SHARED");
    }
  }
}
