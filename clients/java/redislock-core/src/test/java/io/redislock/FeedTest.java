package io.redislock;

import static io.redislock.testing.RedisServer.waitUntil;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.redislock.testing.RedisServer;
import java.time.Duration;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.RegisterExtension;
import redis.clients.jedis.Jedis;

/** The client's change feed across holds: one feed per node, its subscriptions coming and going. */
class FeedTest {
  @RegisterExtension static RedisServer server = new RedisServer();

  @Test
  void aFeedWhoseOnlyHoldWasReleasedStillReportsTheNextHoldsLoss() {
    LockClient client = server.client();
    Jedis jedis = server.jedis();
    // the first hold subscribes the feed to its key's channel; its release leaves no key watched
    Lock a = client.lock("feed:a", Duration.ofSeconds(60), Lock.options().onLost((l, e) -> {}));
    assertTrue(a.tryLock());
    assertTrue(a.release());
    // the next hold, on another key, through the same feed: a DEL is reported by the feed
    // (no watchdog, a 60 s ttl: nothing else could report it within the wait)
    Lock b = client.lock("feed:b", Duration.ofSeconds(60), Lock.options().onLost((l, e) -> {}));
    assertTrue(b.tryLock());
    assertEquals(1L, jedis.del("feed:b"));
    waitUntil("the DEL reported through the feed", Duration.ofSeconds(10), b::isLost);
    assertTrue(b.lostReason().startsWith("feed: "), b.lostReason());
  }
}
