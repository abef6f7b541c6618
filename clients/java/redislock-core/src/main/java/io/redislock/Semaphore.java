package io.redislock;

import java.time.Duration;
import redis.clients.jedis.CommandArguments;

/**
 * At most {@code permits} holders of one key at once ({@code LOCK.ACQUIRE ... SHARED LIMIT n}):
 * each handle is one permit, with an owner and token of its own, in the key's one FIFO queue.
 * Everyone using the key must give the same {@code permits} (else the server's ERR). Everything
 * {@link Lock} does holds: one command per wait, interrupts, the watchdog, sessions.
 */
public class Semaphore extends Lock {
  private final int permits;

  Semaphore(LockClient client, String name, int permits, Duration ttl, Options options) {
    super(client, name, ttl, options);
    if (permits < 1) {
      throw new IllegalArgumentException("permits must be >= 1, got " + permits);
    }
    this.permits = permits;
  }

  public int permits() {
    return permits;
  }

  @Override
  void modeArgs(CommandArguments args) {
    args.add("SHARED").add("LIMIT").add(permits);
  }
}
