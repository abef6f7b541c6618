package io.redislock;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import redis.clients.jedis.HostAndPort;

/**
 * A holder process made as README.md's first example makes its lock: {@code LockClient.connect},
 * {@code client.lock(KEY, 30 s)}, {@code tryLock(10 s)}; prints "token N" once it holds, then
 * waits to be killed. Arguments: PORT KEY [nosession] ({@code nosession}: the same lock with
 * {@code Lock.options().noSession()}, the ttl-only hold).
 */
public final class DefaultHolderMain {
  /** Start this main in a JVM of its own (the test classpath), holding {@code key} on {@code port}. */
  static Process start(int port, String key, String... more) throws IOException {
    String java = Paths.get(System.getProperty("java.home"), "bin", "java").toString();
    String cp = System.getProperty("surefire.test.class.path", System.getProperty("java.class.path"));
    List<String> cmd = new ArrayList<>(List.of(java, "-cp", cp, DefaultHolderMain.class.getName(), String.valueOf(port), key));
    cmd.addAll(List.of(more));
    return new ProcessBuilder(cmd).redirectError(ProcessBuilder.Redirect.INHERIT).start();
  }

  /** The token the holder printed (it holds the lock from then on); IOException if it did not. */
  static long token(Process holder) throws IOException {
    BufferedReader out = new BufferedReader(new InputStreamReader(holder.getInputStream(), StandardCharsets.UTF_8));
    String line = out.readLine();
    if (line == null || !line.startsWith("token ")) {
      throw new IOException("the holder process said " + line);
    }
    return Long.parseLong(line.substring(6));
  }

  public static void main(String[] args) throws Exception {
    try (LockClient client = LockClient.connect(new HostAndPort("127.0.0.1", Integer.parseInt(args[0])))) {
      boolean noSession = args.length > 2 && args[2].equals("nosession");
      Lock lock = noSession
          ? client.lock(args[1], Duration.ofSeconds(30), Lock.options().noSession())
          : client.lock(args[1], Duration.ofSeconds(30));
      if (lock.tryLock(10, TimeUnit.SECONDS)) {
        System.out.println("token " + lock.token());
        System.out.flush();
        Thread.sleep(Long.MAX_VALUE);
      }
      System.out.println("busy");
    }
  }
}
