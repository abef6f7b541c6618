package io.redislock;

/**
 * The root of this package's exceptions. Error replies from the server (a bad argument,
 * WRONGTYPE, a SHARED limit mismatch) come through as Jedis's own {@code JedisDataException}, and
 * connection failures as {@code JedisConnectionException}, as in the other clients.
 */
public class LockException extends RuntimeException {
  public LockException(String message) {
    super(message);
  }

  public LockException(String message, Throwable cause) {
    super(message, cause);
  }
}
