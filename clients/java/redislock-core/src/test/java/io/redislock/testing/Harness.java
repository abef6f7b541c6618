package io.redislock.testing;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * Servers started by the workspace's {@code harness} program (harness/README.md): it prints one
 * JSON line and keeps the servers running until its standard input closes, as for the Python
 * (conftest.py) and Node (test/harness.js) suites. Each server runs on a port the OS chose, in a
 * directory of its own, ready once it answered PING; {@link #close()} stops it.
 *
 * <p>{@code HARNESS} names the program (default {@code <workspace>/target/debug/harness});
 * {@code REDIS_SERVER} and {@code REDIS_LOCK_MODULE} are read by the harness itself.
 */
public final class Harness implements AutoCloseable {
  private static final Pattern PORT = Pattern.compile("\"port\":(\\d+)");
  private static final Pattern PID = Pattern.compile("\"pid\":(\\d+)");

  private final Process process;
  private final List<Integer> ports = new ArrayList<>();
  private final List<Long> pids = new ArrayList<>();

  private Harness(List<String> args) throws IOException {
    List<String> cmd = new ArrayList<>();
    cmd.add(program().toString());
    cmd.addAll(args);
    process = new ProcessBuilder(cmd).redirectError(ProcessBuilder.Redirect.INHERIT).start();
    BufferedReader out = new BufferedReader(new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8));
    String line = out.readLine();
    if (line == null) {
      int status;
      try {
        status = process.waitFor();
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        status = -1;
      }
      throw new IOException("the harness did not start " + args + " (exit status " + status + ")");
    }
    Matcher m = PORT.matcher(line);
    while (m.find()) {
      ports.add(Integer.parseInt(m.group(1)));
    }
    Matcher p = PID.matcher(line);
    while (p.find()) {
      pids.add(Long.parseLong(p.group(1)));
    }
  }

  /** {@code harness server ARGS...}: one server with the module. */
  public static Harness server(String... args) throws IOException {
    List<String> a = new ArrayList<>(List.of("server"));
    a.addAll(List.of(args));
    return new Harness(a);
  }

  /** {@code harness cluster --masters M --replicas R}. */
  public static Harness cluster(int masters, int replicas) throws IOException {
    return new Harness(List.of("cluster", "--masters", String.valueOf(masters), "--replicas", String.valueOf(replicas)));
  }

  /**
   * {@code harness sentinel --primary-port P --master-name NAME}: one Sentinel (quorum 1,
   * {@code down-after-milliseconds 1000}, {@code failover-timeout 5000}) monitoring the server
   * on 127.0.0.1:P.
   */
  public static Harness sentinel(int primaryPort, String masterName) throws IOException {
    return new Harness(List.of("sentinel", "--primary-port", String.valueOf(primaryPort), "--master-name", masterName));
  }

  /** The (first) server's port. */
  public int port() {
    return ports.get(0);
  }

  public List<Integer> ports() {
    return ports;
  }

  /** The (first) server's own pid. */
  public long pid() {
    return pids.get(0);
  }

  /** The workspace root: the {@code redislock.workspace} property, or the folder with Cargo.toml above here. */
  public static Path workspace() {
    String prop = System.getProperty("redislock.workspace");
    if (prop != null && Files.exists(Paths.get(prop, "Cargo.toml"))) {
      return Paths.get(prop).toAbsolutePath().normalize();
    }
    Path dir = Paths.get("").toAbsolutePath();
    while (dir != null && !(Files.exists(dir.resolve("Cargo.toml")) && Files.isDirectory(dir.resolve("harness")))) {
      dir = dir.getParent();
    }
    if (dir == null) {
      throw new IllegalStateException("no workspace root (Cargo.toml and harness/) above " + Paths.get("").toAbsolutePath());
    }
    return dir;
  }

  static Path program() {
    String env = System.getenv("HARNESS");
    Path p = env != null ? Paths.get(env) : workspace().resolve("target/debug/harness");
    if (!Files.isExecutable(p)) {
      throw new IllegalStateException("no harness program at " + p + " (cargo build -p redis-lock-harness, or set HARNESS)");
    }
    return p;
  }

  /** Close the harness's stdin: it stops the servers and removes their directories. */
  @Override
  public void close() {
    try {
      process.getOutputStream().close();
      if (!process.waitFor(20, TimeUnit.SECONDS)) {
        process.destroyForcibly();
      }
    } catch (IOException | InterruptedException e) {
      process.destroyForcibly();
    }
  }
}
