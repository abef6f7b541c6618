package io.redislock;

/**
 * A hold was lost while held: a renewal answered 0 or failed, its ttl ran out, or its session was
 * lost. {@link #reason()} is the lock's lost reason ("not held", "expired", "extend failed: ...",
 * "session lost: ...").
 */
public class LockLostException extends LockException {
  private final String reason;

  public LockLostException(String message, String reason) {
    super(message);
    this.reason = reason;
  }

  /** Why the hold was lost. */
  public String reason() {
    return reason;
  }
}
