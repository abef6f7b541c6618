package io.redislock.spring.example;

import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Lock;
import org.springframework.integration.support.locks.LockRegistry;

/** Ships an order at most once at a time, whichever instance is asked: plain LockRegistry code. */
public class OrderService {
  private final LockRegistry locks;
  private final Map<String, Integer> shipped = new ConcurrentHashMap<>();

  public OrderService(LockRegistry locks) {
    this.locks = locks;
  }

  /** True if this call shipped the order; false if another holder had it for 5 s. */
  public boolean ship(String orderId, Runnable work) throws InterruptedException {
    Lock lock = locks.obtain(orderId);
    if (!lock.tryLock(5, TimeUnit.SECONDS)) {
      return false;
    }
    try {
      work.run();
      shipped.merge(orderId, 1, Integer::sum);
      return true;
    } finally {
      lock.unlock();
    }
  }

  public int shippedCount(String orderId) {
    return shipped.getOrDefault(orderId, 0);
  }
}
