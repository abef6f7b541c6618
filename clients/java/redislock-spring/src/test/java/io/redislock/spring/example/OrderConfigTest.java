package io.redislock.spring.example;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.redislock.LockClient;
import io.redislock.testing.RedisServer;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.RegisterExtension;
import org.springframework.context.annotation.AnnotationConfigApplicationContext;
import org.springframework.integration.support.locks.LockRegistry;

/** Two Spring contexts (two "instances") of the example, each with its own client. */
class OrderConfigTest {
  @RegisterExtension static RedisServer server = new RedisServer();

  static AnnotationConfigApplicationContext instance(LockClient client) {
    AnnotationConfigApplicationContext ctx = new AnnotationConfigApplicationContext();
    ctx.registerBean(LockClient.class, () -> client);
    ctx.register(OrderConfig.class);
    ctx.refresh();
    return ctx;
  }

  @Test
  void twoInstancesNeverShipTheSameOrderAtOnce() throws Exception {
    try (AnnotationConfigApplicationContext a = instance(server.client());
        AnnotationConfigApplicationContext b = instance(server.client())) {
      assertTrue(a.getBean(LockRegistry.class) instanceof io.redislock.spring.RedislockLockRegistry);
      AtomicInteger inside = new AtomicInteger();
      AtomicInteger maxInside = new AtomicInteger();
      Runnable work = () -> {
        maxInside.accumulateAndGet(inside.incrementAndGet(), Math::max);
        Thread.onSpinWait();
        inside.decrementAndGet();
      };
      List<CompletableFuture<Boolean>> calls = new ArrayList<>();
      for (int i = 0; i < 20; i++) {
        OrderService s = (i % 2 == 0 ? a : b).getBean(OrderService.class);
        calls.add(CompletableFuture.supplyAsync(() -> {
          try {
            return s.ship("order-7", work);
          } catch (InterruptedException e) {
            throw new RuntimeException(e);
          }
        }));
      }
      for (CompletableFuture<Boolean> c : calls) {
        assertTrue(c.get());
      }
      assertEquals(1, maxInside.get(), "one holder at a time across both instances");
      assertEquals(20, a.getBean(OrderService.class).shippedCount("order-7") + b.getBean(OrderService.class).shippedCount("order-7"));
    }
  }
}
