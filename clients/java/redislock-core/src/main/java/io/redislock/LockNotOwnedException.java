package io.redislock;

/**
 * {@code unlock()} on a handle that holds nothing: it was never acquired, or was released
 * already. An {@link IllegalMonitorStateException}, as {@code java.util.concurrent.locks.Lock}
 * implementations throw; but ownership is the handle's (its owner string and token), never the
 * thread's, so any thread may unlock a handle that holds the lock.
 */
public class LockNotOwnedException extends IllegalMonitorStateException {
  public LockNotOwnedException(String message) {
    super(message);
  }
}
