package io.redislock.testing;

import io.redislock.LockClient;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.function.BooleanSupplier;
import org.junit.jupiter.api.extension.AfterAllCallback;
import org.junit.jupiter.api.extension.BeforeAllCallback;
import org.junit.jupiter.api.extension.ExtensionContext;
import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.Jedis;

/**
 * A JUnit 5 extension: one server with the module for a test class, started through
 * {@link Harness}; {@code @RegisterExtension static RedisServer server = new RedisServer();}.
 * Clients made with {@link #client()} are closed with the server.
 */
public final class RedisServer implements BeforeAllCallback, AfterAllCallback {
  private final String[] args;
  private Harness harness;
  private final List<AutoCloseable> clients = new ArrayList<>();

  public RedisServer(String... args) {
    this.args = args;
  }

  @Override
  public void beforeAll(ExtensionContext context) throws Exception {
    harness = Harness.server(args);
  }

  @Override
  public void afterAll(ExtensionContext context) {
    for (AutoCloseable c : clients) {
      try {
        c.close();
      } catch (Exception ignored) {
        // the server goes next
      }
    }
    clients.clear();
    if (harness != null) {
      harness.close();
    }
  }

  public HostAndPort address() {
    return new HostAndPort("127.0.0.1", harness.port());
  }

  public long pid() {
    return harness.pid();
  }

  /** A LockClient of this server (closed after the class). */
  public LockClient client() {
    LockClient c = LockClient.connect(address());
    clients.add(c);
    return c;
  }

  /** A LockClient whose pooled connections time out reads after {@code socketTimeout}. */
  public LockClient client(Duration socketTimeout) {
    LockClient c = LockClient.connect(address(),
        DefaultJedisClientConfig.builder().socketTimeoutMillis((int) socketTimeout.toMillis()).build());
    clients.add(c);
    return c;
  }

  /** A plain Jedis connection for checks (closed after the class). */
  public Jedis jedis() {
    Jedis j = new Jedis(address());
    clients.add(j);
    return j;
  }

  /** {@code blocked_clients} from INFO clients. */
  public static long blockedClients(Jedis jedis) {
    for (String line : jedis.info("clients").split("\r?\n")) {
      if (line.startsWith("blocked_clients:")) {
        return Long.parseLong(line.substring("blocked_clients:".length()).trim());
      }
    }
    throw new IllegalStateException("no blocked_clients in INFO clients");
  }

  /** Poll {@code condition} until it holds, or fail after {@code deadline}. */
  public static void waitUntil(String what, Duration deadline, BooleanSupplier condition) {
    long end = System.nanoTime() + deadline.toNanos();
    while (!condition.getAsBoolean()) {
      if (System.nanoTime() > end) {
        throw new AssertionError("timed out after " + deadline + " waiting for " + what);
      }
      try {
        Thread.sleep(2);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new AssertionError("interrupted waiting for " + what);
      }
    }
  }
}
