package io.redislock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.redislock.testing.Harness;
import io.redislock.testing.RedisServer;
import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import javax.tools.JavaCompiler;
import javax.tools.ToolProvider;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.RegisterExtension;
import redis.clients.jedis.Jedis;

/**
 * The Java programs of README.md and clients/java/README.md compile and run as written (on the
 * test server's port instead of 6379), so the docs cannot drift from the client.
 */
class ReadmeTest {
  @RegisterExtension static RedisServer server = new RedisServer();

  static List<String> programs(String file) throws Exception {
    String text = Files.readString(Harness.workspace().resolve(file));
    List<String> out = new ArrayList<>();
    Matcher m = Pattern.compile("```java\n(.*?)```", Pattern.DOTALL).matcher(text);
    while (m.find()) {
      if (m.group(1).contains("public static void main")) {
        out.add(m.group(1));
      }
    }
    return out;
  }

  static final String CP = System.getProperty("surefire.test.class.path", System.getProperty("java.class.path"));
  static Path compiled;

  /** Every program of both READMEs, compiled in one javac run (6379 replaced by the test port). */
  static synchronized Path compiled() throws Exception {
    if (compiled != null) {
      return compiled;
    }
    Path dir = Files.createTempDirectory("readme");
    List<String> args = new ArrayList<>(List.of("-cp", CP, "-d", dir.toString()));
    List<String> all = new ArrayList<>(programs("README.md"));
    all.addAll(programs("clients/java/README.md"));
    for (String source : all) {
      Path file = dir.resolve(className(source) + ".java");
      Files.writeString(file, source.replace("6379", String.valueOf(server.address().getPort())));
      args.add(file.toString());
    }
    JavaCompiler javac = ToolProvider.getSystemJavaCompiler();
    ByteArrayOutputStream errors = new ByteArrayOutputStream();
    int rc = javac.run(null, null, errors, args.toArray(new String[0]));
    assertEquals(0, rc, errors.toString(StandardCharsets.UTF_8));
    compiled = dir;
    return dir;
  }

  static String className(String source) {
    Matcher cls = Pattern.compile("public class (\\w+)").matcher(source);
    assertTrue(cls.find());
    return cls.group(1);
  }

  /** Run the program {@code source} (compiled above) in a JVM of its own; its output. */
  static String run(String source) throws Exception {
    Path dir = compiled();
    String cp = CP;
    String javaBin = Paths.get(System.getProperty("java.home"), "bin", "java").toString();
    Process p = new ProcessBuilder(javaBin, "-cp", dir + java.io.File.pathSeparator + cp, className(source)).redirectErrorStream(true).start();
    String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    assertTrue(p.waitFor(30, TimeUnit.SECONDS));
    assertEquals(0, p.exitValue(), out);
    return out;
  }

  @Test
  void theReadmeFromJavaProgramRuns() throws Exception {
    List<String> programs = programs("README.md");
    assertEquals(1, programs.size());
    Jedis redis = server.jedis();
    redis.flushAll();
    String out = run(programs.get(0));
    assertTrue(out.lines().anyMatch(l -> l.matches("token \\d+")), out);
    assertEquals("100", redis.get("invoice:42:total"));
    assertFalse(redis.exists("invoice:42"));
  }

  @Test
  void theClientReadmeProgramsRun() throws Exception {
    List<String> programs = programs("clients/java/README.md");
    assertFalse(programs.isEmpty());
    for (String program : programs) {
      server.jedis().flushAll();
      run(program);
      assertNull(null);
    }
  }
}
