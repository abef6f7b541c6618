package io.redislock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.gson.GsonBuilder;
import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import io.redislock.testing.Harness;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.DynamicContainer;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;
import redis.clients.jedis.BuilderFactory;
import redis.clients.jedis.CommandArguments;
import redis.clients.jedis.CommandObject;
import redis.clients.jedis.Connection;
import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.commands.ProtocolCommand;
import redis.clients.jedis.exceptions.JedisDataException;

/**
 * The conformance suite (conformance/cases/*.json, conformance/README.md) run by the Java client:
 * a test per case ({@code topic/i: description}), every case unchanged. Each step of the
 * vocabulary is mapped to this client's API here, each error kind to its exception type
 * ({@link #errorKind}). A case whose needs this runner cannot meet, or with a step it does not
 * know, is skipped with the reason, never passed. Every step has a deadline (its wait plus
 * {@link #STEP_DEADLINE_MS}), run on a thread of the case's own so that nothing hangs: JUnit's
 * default timeout does not reach dynamic tests. The summary per topic goes to
 * {@code target/conformance/java.json} when the class ends (conformance/check_table.py reads it).
 *
 * <p>All cases share one server (flushed before each case); a case that needs a replica gets one
 * ({@code harness server --replica-of}), the cluster cases a 3-master cluster started on first use.
 */
class ConformanceTest {
  static final long STEP_DEADLINE_MS = 30_000;
  static final String CLIENT = "java";
  static final String RUNNER = "clients/java/redislock-core/src/test/java/io/redislock/ConformanceTest.java";

  static Harness server;
  static Harness cluster;
  /** topic -> its counts, skips and failures, as the other runners write them. */
  static final Map<String, JsonObject> RESULTS = new TreeMap<>();

  @BeforeAll
  static void start() throws IOException {
    server = Harness.server();
  }

  @AfterAll
  static void finish() throws IOException {
    try {
      JsonObject topics = new JsonObject();
      RESULTS.forEach(topics::add);
      JsonObject out = new JsonObject();
      out.addProperty("client", CLIENT);
      out.addProperty("runner", RUNNER);
      out.add("topics", topics);
      Path dir = Harness.workspace().resolve("target/conformance");
      Files.createDirectories(dir);
      Files.writeString(dir.resolve(CLIENT + ".json"),
          new GsonBuilder().setPrettyPrinting().create().toJson(out) + "\n", StandardCharsets.UTF_8);
    } finally {
      if (server != null) {
        server.close();
      }
      if (cluster != null) {
        cluster.close();
      }
    }
  }

  static List<JsonObject> topics() throws IOException {
    Path dir = Harness.workspace().resolve("conformance/cases");
    List<JsonObject> topics = new ArrayList<>();
    try (Stream<Path> files = Files.list(dir)) {
      for (Path f : files.filter(p -> p.toString().endsWith(".json")).sorted().toList()) {
        topics.add(JsonParser.parseString(Files.readString(f)).getAsJsonObject());
      }
    }
    return topics;
  }

  @TestFactory
  Stream<DynamicContainer> conformance() throws IOException {
    List<DynamicContainer> out = new ArrayList<>();
    for (JsonObject topic : topics()) {
      String name = topic.get("topic").getAsString();
      results(name); // every topic present, even one whose cases all skip
      List<DynamicTest> tests = new ArrayList<>();
      JsonArray cases = topic.getAsJsonArray("cases");
      for (int i = 0; i < cases.size(); i++) {
        JsonObject c = cases.get(i).getAsJsonObject();
        String description = c.get("description").getAsString();
        tests.add(DynamicTest.dynamicTest(name + "/" + i + ": " + description, () -> runCase(name, description, c)));
      }
      out.add(DynamicContainer.dynamicContainer(name, tests));
    }
    return out.stream();
  }

  static synchronized JsonObject results(String topic) {
    return RESULTS.computeIfAbsent(topic, t -> {
      JsonObject r = new JsonObject();
      r.addProperty("passed", 0);
      r.addProperty("skipped", 0);
      r.addProperty("failed", 0);
      r.add("skips", new JsonArray());
      r.add("failures", new JsonArray());
      return r;
    });
  }

  static synchronized void record(String topic, String description, String outcome, String detail, String kind) {
    JsonObject r = results(topic);
    r.addProperty(outcome, r.get(outcome).getAsInt() + 1);
    JsonObject entry = new JsonObject();
    entry.addProperty("case", description);
    if (outcome.equals("skipped")) {
      entry.addProperty("kind", kind);
      entry.addProperty("reason", detail);
      r.getAsJsonArray("skips").add(entry);
    } else if (outcome.equals("failed")) {
      entry.addProperty("error", detail);
      r.getAsJsonArray("failures").add(entry);
    }
  }

  /** A step no runner knows, or a need this runner cannot meet. */
  static final class Skip extends RuntimeException {
    final String kind;

    Skip(String kind, String reason) {
      super(reason);
      this.kind = kind;
    }
  }

  static void runCase(String topic, String description, JsonObject c) throws Throwable {
    Set<String> needs = new HashSet<>();
    if (c.has("needs")) {
      c.getAsJsonArray("needs").forEach(n -> needs.add(n.getAsString()));
    }
    LockClient client = null;
    Harness replica = null;
    Runner runner = null;
    try {
      client = clientFor(needs.contains("cluster"));
      runner = new Runner(client);
      if (needs.contains("replica")) {
        replica = Harness.server("--replica-of", String.valueOf(server.port()));
        Runner r = runner;
        poll("the replica online", STEP_DEADLINE_MS,
            () -> String.valueOf(r.raw(List.of("INFO", "replication"))).contains("state=online"));
      }
      runner.run(c.getAsJsonArray("steps"));
      record(topic, description, "passed", null, null);
    } catch (Skip s) {
      record(topic, description, "skipped", s.getMessage(), s.kind);
      Assumptions.abort(s.getMessage());
    } catch (Throwable e) {
      record(topic, description, "failed", String.valueOf(e), null);
      throw e;
    } finally {
      if (runner != null) {
        runner.cleanup();
      }
      if (replica != null) {
        replica.close();
      }
      if (client != null) {
        client.close();
      }
    }
  }

  /** A client of the shared server, or of the cluster (started on first use), its keyspace flushed. */
  static LockClient clientFor(boolean needsCluster) throws IOException {
    if (!needsCluster) {
      LockClient client = LockClient.connect(new HostAndPort("127.0.0.1", server.port()));
      flush(server.port());
      return client;
    }
    synchronized (ConformanceTest.class) {
      if (cluster == null) {
        cluster = Harness.cluster(3, 0);
      }
    }
    Set<HostAndPort> nodes = new HashSet<>();
    for (int port : cluster.ports()) {
      nodes.add(new HostAndPort("127.0.0.1", port));
      flush(port);
    }
    return LockClient.cluster(nodes, DefaultJedisClientConfig.builder().build());
  }

  static void flush(int port) {
    try (Connection c = new Connection(new HostAndPort("127.0.0.1", port), DefaultJedisClientConfig.builder().build())) {
      c.connect();
      c.executeCommand(new CommandObject<>(new CommandArguments(command("FLUSHALL")), BuilderFactory.ENCODED_OBJECT));
    }
  }

  /** Any command by name, for the raw steps. */
  static ProtocolCommand command(String name) {
    byte[] raw = name.getBytes(StandardCharsets.UTF_8);
    return () -> raw;
  }

  /** Poll {@code condition} every 5 ms until it holds, or fail after {@code timeoutMs}. */
  static void poll(String what, long timeoutMs, Check condition) throws Exception {
    long end = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMs);
    while (!condition.holds()) {
      if (System.nanoTime() > end) {
        throw new AssertionError("timed out after " + timeoutMs + " ms waiting for " + what);
      }
      Thread.sleep(5);
    }
  }

  interface Check {
    boolean holds() throws Exception;
  }

  /**
   * The vocabulary's outcome kind of an exception (conformance/README.md, "Outcome kinds of
   * errors"); the Java column of its table.
   */
  static String errorKind(Throwable e) {
    if (e instanceof LockBusyException) {
      return "busy";
    }
    if (e instanceof TimeoutException) {
      return "timeout"; // what the runner makes of Observation.next's empty Optional
    }
    if (e instanceof StaleTokenException) {
      return "stale_token";
    }
    if (e instanceof DurabilityException) {
      return "not_durable";
    }
    if (e instanceof IllegalArgumentException) {
      return "invalid_argument";
    }
    if (e instanceof JedisDataException) {
      return "server";
    }
    return "unexpected " + e;
  }

  /** Runs one case's steps. */
  static final class Runner {
    final LockClient client;
    final Map<String, Object> vars = new LinkedHashMap<>();
    final Map<String, Object> objs = new LinkedHashMap<>();
    final Map<String, Pending> pending = new LinkedHashMap<>();
    final Map<String, Election.Observation> watches = new LinkedHashMap<>();
    final List<Session> sessions = new ArrayList<>();
    /** The steps run here, one at a time, each waited on with its deadline. */
    final ExecutorService steps = Executors.newCachedThreadPool(r -> {
      Thread t = new Thread(r, "conformance-step");
      t.setDaemon(true);
      return t;
    });

    Runner(LockClient client) {
      this.client = client;
    }

    /** A background acquire: its thread and outcome. */
    record Pending(Thread thread, CompletableFuture<Boolean> outcome) {}

    void run(JsonArray steps) throws Throwable {
      for (JsonElement e : steps) {
        JsonObject step = e.getAsJsonObject();
        Throwable failed = null;
        try {
          withinDeadline(step);
        } catch (Skip | AssertionError s) {
          throw s;
        } catch (Throwable t) {
          if (!step.has("error")) {
            throw t;
          }
          failed = t;
        }
        if (step.has("error")) {
          assertNotNull(failed, step + ": wanted a " + step.get("error").getAsString() + " error, got none");
          assertEquals(step.get("error").getAsString(), errorKind(failed), step + ": " + failed);
          if (step.has("code")) {
            assertEquals(step.get("code").getAsString(), String.valueOf(failed.getMessage()).split(" ")[0]);
          }
        }
      }
    }

    void withinDeadline(JsonObject step) throws Throwable {
      long limit = num(step, "wait", 0) + STEP_DEADLINE_MS;
      Future<?> f = steps.submit(() -> {
        step(step);
        return null;
      });
      try {
        f.get(limit, TimeUnit.MILLISECONDS);
      } catch (TimeoutException e) {
        f.cancel(true);
        throw new AssertionError(step + ": no outcome within " + limit + " ms");
      } catch (ExecutionException e) {
        throw e.getCause();
      }
    }

    static long num(JsonObject step, String field, long otherwise) {
      return step.has(field) && !step.get(field).isJsonNull() ? step.get(field).getAsLong() : otherwise;
    }

    static String str(JsonObject step, String field) {
      return step.get(field).getAsString();
    }

    static Duration ms(JsonObject step, String field) {
      return Duration.ofMillis(num(step, field, 0));
    }

    Lock lock(JsonObject step) {
      return (Lock) objs.get(str(step, "lock"));
    }

    Lock.Options lockOptions(JsonObject step) {
      Lock.Options o = Lock.options();
      if (step.has("owner")) {
        o.owner(str(step, "owner"));
      }
      if (step.has("session")) {
        o.session((Session) objs.get(str(step, "session")));
      }
      if (step.has("lock_delay")) {
        o.lockDelay(ms(step, "lock_delay"));
      }
      if (step.has("durable")) {
        o.durable((int) num(step, "durable", 0), Duration.ofMillis(num(step, "durable_timeout", 1000)));
      }
      if (step.has("report_loss") && step.get("report_loss").getAsBoolean()) {
        o.onLost((lock, error) -> {});
      }
      if (step.has("watchdog") && step.get("watchdog").getAsBoolean()) {
        o.watchdog(true);
      }
      return o;
    }

    /** The JSON value as Java: null, Long, Double, String, Boolean, List; "$name" is a saved value. */
    Object value(JsonElement e) {
      if (e == null || e.isJsonNull()) {
        return null;
      }
      if (e.isJsonArray()) {
        List<Object> l = new ArrayList<>();
        e.getAsJsonArray().forEach(x -> l.add(value(x)));
        return l;
      }
      if (e.getAsJsonPrimitive().isBoolean()) {
        return e.getAsBoolean();
      }
      if (e.getAsJsonPrimitive().isNumber()) {
        double d = e.getAsDouble();
        return d == Math.rint(d) ? (Object) e.getAsLong() : (Object) d;
      }
      String s = e.getAsString();
      if (s.startsWith("$")) {
        assertTrue(vars.containsKey(s.substring(1)), "no saved value " + s);
        return vars.get(s.substring(1));
      }
      return s;
    }

    /** A reply against a JSON value: an integer may come as its digits. */
    static boolean same(Object got, Object want) {
      if (want instanceof Long && got instanceof String && ((String) got).matches("-?\\d+")) {
        return Long.parseLong((String) got) == (Long) want;
      }
      if (want instanceof List && got instanceof List) {
        List<?> g = (List<?>) got;
        List<?> w = (List<?>) want;
        if (g.size() != w.size()) {
          return false;
        }
        for (int i = 0; i < g.size(); i++) {
          if (!same(g.get(i), w.get(i))) {
            return false;
          }
        }
        return true;
      }
      return want == null ? got == null : want.equals(got);
    }

    void expect(JsonObject step, Object got) {
      if (step.has("expect")) {
        Object want = value(step.get("expect"));
        assertTrue(same(got, want), step + ": got " + got + ", wanted " + want);
      }
    }

    /**
     * A command sent as is. In a cluster it is routed by its keys: every argument of DEL and
     * EXISTS, the session id of LOCK.SESSION INFO, else the first argument (none for CLIENT,
     * INFO).
     */
    Object raw(List<?> command) {
      List<String> args = new ArrayList<>();
      for (Object a : command) {
        args.add(String.valueOf(a));
      }
      String name = args.get(0).toUpperCase();
      CommandArguments a = client.isCluster()
          ? new redis.clients.jedis.ClusterCommandArguments(command(args.get(0)))
          : new CommandArguments(command(args.get(0)));
      for (int i = 1; i < args.size(); i++) {
        boolean key = switch (name) {
          case "DEL", "EXISTS" -> true;
          case "LOCK.SESSION" -> i == 2;
          case "CLIENT", "INFO", "FLUSHALL" -> false;
          default -> i == 1;
        };
        if (key) {
          a.key(args.get(i));
        } else {
          a.add(args.get(i));
        }
      }
      return client.jedis().executeCommand(new CommandObject<>(a, BuilderFactory.ENCODED_OBJECT));
    }

    Object rawStep(JsonObject step) {
      return raw((List<?>) value(step.get("command")));
    }

    void step(JsonObject step) throws Exception {
      String what = str(step, "do");
      switch (what) {
        case "lock" -> objs.put(str(step, "as"), client.lock(str(step, "key"), ms(step, "ttl"), lockOptions(step)));
        case "semaphore" -> objs.put(str(step, "as"),
            client.semaphore(str(step, "key"), (int) num(step, "limit", 0), ms(step, "ttl"), lockOptions(step)));
        case "read_lock", "write_lock" -> {
          ReadWriteLock rw = client.readWriteLock(str(step, "key"), ms(step, "ttl"), lockOptions(step));
          objs.put(str(step, "as"), what.equals("read_lock") ? rw.readLock() : rw.writeLock());
        }
        case "multilock" -> {
          List<String> keys = new ArrayList<>();
          step.getAsJsonArray("keys").forEach(k -> keys.add(k.getAsString()));
          objs.put(str(step, "as"), client.multiLock(keys, ms(step, "ttl"), lockOptions(step)));
        }
        case "session" -> {
          Session.Options o = Session.options().bound(step.has("bound") && step.get("bound").getAsBoolean());
          if (step.has("lock_delay")) {
            o.lockDelay(ms(step, "lock_delay"));
          }
          Session s = client.session(ms(step, "ttl"), o);
          sessions.add(s);
          objs.put(str(step, "as"), s.open());
        }
        case "election" -> {
          Election.Options o = Election.options().ttl(ms(step, "ttl"));
          if (step.has("session")) {
            o.session((Session) objs.get(str(step, "session")));
          }
          objs.put(str(step, "as"), client.election(str(step, "key"), o));
        }
        case "acquire" -> expect(step, lock(step).acquire(ms(step, "wait")));
        case "start_acquire" -> {
          Lock l = lock(step);
          Duration wait = ms(step, "wait");
          CompletableFuture<Boolean> outcome = new CompletableFuture<>();
          Thread t = new Thread(() -> {
            try {
              outcome.complete(l.acquire(wait));
            } catch (Throwable e) {
              outcome.completeExceptionally(e);
            }
          }, "conformance-acquire");
          t.setDaemon(true);
          t.start();
          pending.put(str(step, "as"), new Pending(t, outcome));
        }
        case "finish" -> {
          Pending p = pending.remove(str(step, "pending"));
          try {
            expect(step, p.outcome.get());
          } catch (ExecutionException e) {
            throw e.getCause() instanceof Exception ? (Exception) e.getCause() : e;
          }
        }
        case "cancel" -> {
          // Java's way: interrupt the waiting thread; the acquire must end with InterruptedException.
          Pending p = pending.remove(str(step, "pending"));
          p.thread.interrupt();
          try {
            Boolean got = p.outcome.get();
            throw new AssertionError("the wait ended before it was cancelled: " + got);
          } catch (ExecutionException e) {
            if (!(e.getCause() instanceof InterruptedException)) {
              throw new AssertionError("the cancelled wait ended with " + e.getCause(), e.getCause());
            }
          }
        }
        case "release" -> expect(step, lock(step).release());
        case "extend" -> expect(step, lock(step).extend(ms(step, "ttl")));
        case "held" -> expect(step, lock(step).isOwned());
        case "token" -> {
          long t = lock(step).token();
          Long token = t == 0 ? null : t;
          expect(step, token);
          if (step.has("greater_than")) {
            Long earlier = (Long) vars.get(str(step, "greater_than"));
            assertTrue(token != null && token > earlier, "token " + token + " not > " + earlier);
          }
          if (step.has("save")) {
            vars.put(str(step, "save"), token);
          }
        }
        case "fenced" -> {
          List<?> cmd = (List<?>) value(step.get("command"));
          Object[] rest = cmd.subList(2, cmd.size()).toArray();
          expect(step, lock(step).fenced(String.valueOf(cmd.get(0)), String.valueOf(cmd.get(1)), rest));
        }
        case "fenced_script" -> {
          Lock l = lock(step);
          List<String> keys = new ArrayList<>(List.of(l.name()));
          step.getAsJsonArray("keys").forEach(k -> keys.add(k.getAsString()));
          List<Object> args = new ArrayList<>(List.of(l.token()));
          step.getAsJsonArray("args").forEach(x -> args.add(x.getAsString()));
          expect(step, Fence.script(client, str(step, "body")).call(keys, args));
        }
        case "hold" -> lock(step).using(ms(step, "wait"), () -> null);
        case "raw" -> {
          Object got = rawStep(step);
          expect(step, got);
          if (step.has("save")) {
            vars.put(str(step, "save"), got);
          }
        }
        case "wait_raw" -> {
          Object want = step.has("expect") ? value(step.get("expect")) : null;
          poll(step.get("command") + " to answer " + step, num(step, "timeout", 0), () -> {
            Object got = rawStep(step);
            if (step.has("expect")) {
              return same(got, want);
            }
            if (!(got instanceof Long)) {
              return false;
            }
            long n = (Long) got;
            return (!step.has("below") || n < num(step, "below", 0)) && (!step.has("above") || n > num(step, "above", 0));
          });
        }
        case "wait_waiters" -> {
          long count = num(step, "count", 0);
          poll(count + " waiter(s) on " + str(step, "key"), STEP_DEADLINE_MS, () -> {
            Object info = raw(List.of("LOCK.INFO", str(step, "key")));
            long waiters = info == null ? 0 : (Long) LockInfo.fields(info).get("waiters");
            return waiters == count;
          });
        }
        case "kill_session_connection" -> {
          Session s = (Session) objs.get(str(step, "session"));
          Object info = raw(List.of("LOCK.SESSION", "INFO", s.id()));
          assertNotNull(info, "no such session");
          Object bound = LockInfo.fields(info).get("bound");
          assertNotNull(bound, "the session is not bound");
          assertEquals(1L, raw(List.of("CLIENT", "KILL", "ID", bound)));
        }
        case "wait_session_lost" -> {
          Session s = (Session) objs.get(str(step, "session"));
          poll(what, num(step, "timeout", 0), s::isLost);
        }
        case "wait_lost" -> {
          Lock l = lock(step);
          poll(what, num(step, "timeout", 0), l::isLost);
        }
        case "close_session" -> expect(step, ((Session) objs.get(str(step, "session"))).end());
        case "campaign" -> {
          Election e = (Election) objs.get(str(step, "election"));
          Optional<Election.Leadership> l = e.campaign(str(step, "value"), ms(step, "wait"), null);
          expect(step, l.isPresent());
          if (l.isPresent()) {
            objs.put(str(step, "as"), l.get());
            if (step.has("save_term")) {
              vars.put(str(step, "save_term"), l.get().term());
            }
          }
        }
        case "leader" -> expect(step, ((Election) objs.get(str(step, "election"))).leader().map(Election.Leader::value).orElse(null));
        case "resign" -> expect(step, ((Election.Leadership) objs.get(str(step, "leadership"))).resign());
        case "watch" -> watches.put(str(step, "as"), client.watch(str(step, "key")));
        case "observe" -> watches.put(str(step, "as"), ((Election) objs.get(str(step, "election"))).observe());
        case "next_change" -> {
          Optional<Election.Change> change = watches.get(str(step, "watch")).next(ms(step, "timeout"));
          if (change.isEmpty()) {
            throw new TimeoutException("no change within " + num(step, "timeout", 0) + " ms");
          }
          Election.Leader leader = change.get().leader();
          String holder = leader == null ? null : leader.value();
          if (step.has("expect_holder")) {
            Object want = value(step.get("expect_holder"));
            assertEquals(want, holder, "next change: holder");
          }
        }
        case "close_watch" -> watches.remove(str(step, "watch")).close();
        default -> throw new Skip("unsupported", "the runner has no step \"" + what + "\"");
      }
    }

    /** Watches closed, background acquires interrupted, sessions ended: within a deadline each. */
    void cleanup() {
      for (Election.Observation w : watches.values()) {
        w.close();
      }
      for (Pending p : pending.values()) {
        p.thread.interrupt();
        try {
          p.outcome.get(STEP_DEADLINE_MS, TimeUnit.MILLISECONDS);
        } catch (Exception ignored) {
          // interrupted, or it had ended: either way it is over
        }
      }
      Future<?> ends = steps.submit(() -> {
        for (Session s : sessions) {
          try {
            s.end();
          } catch (RuntimeException ignored) {
            // lost already
          }
        }
      });
      try {
        ends.get(STEP_DEADLINE_MS, TimeUnit.MILLISECONDS);
      } catch (Exception ignored) {
        ends.cancel(true);
      }
      steps.shutdownNow();
    }
  }
}
