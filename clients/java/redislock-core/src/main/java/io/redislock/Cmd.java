package io.redislock;

import java.nio.charset.StandardCharsets;
import redis.clients.jedis.commands.ProtocolCommand;

/** A command by name, for the module's commands Jedis does not know (LOCK.ACQUIRE, ...). */
final class Cmd implements ProtocolCommand {
  private final byte[] raw;

  private Cmd(String name) {
    this.raw = name.getBytes(StandardCharsets.UTF_8);
  }

  static final Cmd ACQUIRE = new Cmd("LOCK.ACQUIRE");
  static final Cmd RELEASE = new Cmd("LOCK.RELEASE");
  static final Cmd EXTEND = new Cmd("LOCK.EXTEND");
  static final Cmd FENCE = new Cmd("LOCK.FENCE");
  static final Cmd INFO = new Cmd("LOCK.INFO");
  static final Cmd MACQUIRE = new Cmd("LOCK.MACQUIRE");
  static final Cmd MRELEASE = new Cmd("LOCK.MRELEASE");
  static final Cmd SESSION = new Cmd("LOCK.SESSION");
  static final Cmd WATCH = new Cmd("LOCK.WATCH");
  static final Cmd UNWATCH = new Cmd("LOCK.UNWATCH");
  static final Cmd EVAL = new Cmd("EVAL");
  static final Cmd CLIENT = new Cmd("CLIENT");
  static final Cmd MULTI = new Cmd("MULTI");
  static final Cmd EXEC = new Cmd("EXEC");
  static final Cmd WAIT = new Cmd("WAIT");
  static final Cmd PING = new Cmd("PING");

  @Override
  public byte[] getRaw() {
    return raw;
  }

  @Override
  public String toString() {
    return new String(raw, StandardCharsets.UTF_8);
  }
}
