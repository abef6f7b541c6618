package io.redislock.spring.example;

import io.redislock.LockClient;
import io.redislock.spring.RedislockLockRegistry;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.integration.support.locks.LockRegistry;

/**
 * A Spring Integration user's configuration. The switch from {@code RedisLockRegistry} is the
 * {@code lockRegistry} bean; {@link OrderService} is unchanged.
 */
@Configuration
public class OrderConfig {
  @Bean
  public LockRegistry lockRegistry(LockClient client) {
    return new RedislockLockRegistry(client, "orders"); // was: new RedisLockRegistry(connectionFactory, "orders")
  }

  @Bean
  public OrderService orderService(LockRegistry lockRegistry) {
    return new OrderService(lockRegistry);
  }
}
