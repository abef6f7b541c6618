package io.redislock;

/** A fenced write was refused: the token is not the live hold on the lock. */
public class StaleTokenException extends LockException {
  public StaleTokenException(String message) {
    super(message);
  }

  public StaleTokenException(String message, Throwable cause) {
    super(message, cause);
  }
}
