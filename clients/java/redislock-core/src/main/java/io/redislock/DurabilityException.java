package io.redislock;

/**
 * A durable acquire was granted but fewer replicas than asked acknowledged it in time.
 * {@link #released()}: the grant this call made was given back (the lock is not held).
 * {@link #heldBefore()}: the call was an idempotent retry of a hold the handle already had, which
 * was left as it was.
 */
public class DurabilityException extends LockException {
  private final long acknowledged;
  private final int wanted;
  private final boolean released;
  private final boolean heldBefore;

  public DurabilityException(String message, long acknowledged, int wanted, boolean released, boolean heldBefore) {
    super(message);
    this.acknowledged = acknowledged;
    this.wanted = wanted;
    this.released = released;
    this.heldBefore = heldBefore;
  }

  /** How many replicas acknowledged the grant (WAIT's reply). */
  public long acknowledged() {
    return acknowledged;
  }

  /** How many were asked for. */
  public int wanted() {
    return wanted;
  }

  public boolean released() {
    return released;
  }

  public boolean heldBefore() {
    return heldBefore;
  }
}
