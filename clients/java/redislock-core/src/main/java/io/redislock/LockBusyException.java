package io.redislock;

/**
 * {@link Lock#using} could not take the lock within its timeout. The other calls report a busy
 * lock as {@code false} ({@code tryLock}, {@code acquire}) or an empty {@code Optional}.
 */
public class LockBusyException extends LockException {
  public LockBusyException(String message) {
    super(message);
  }
}
