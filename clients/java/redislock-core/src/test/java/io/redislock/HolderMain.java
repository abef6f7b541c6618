package io.redislock;

import java.time.Duration;
import redis.clients.jedis.HostAndPort;

/**
 * A holder process for the killed-holder test: opens a BOUND session on 127.0.0.1:PORT, takes
 * LOCK in it, prints "token N", and waits to be killed.
 */
public final class HolderMain {
  public static void main(String[] args) throws Exception {
    LockClient client = LockClient.connect(new HostAndPort("127.0.0.1", Integer.parseInt(args[0])));
    Session session = client.session(Duration.ofSeconds(60), Session.options().bound(true)).open();
    Lock lock = client.lock(args[1], Duration.ZERO, Lock.options().session(session).owner("holder-process"));
    lock.lock();
    System.out.println("token " + lock.token());
    System.out.flush();
    Thread.sleep(Long.MAX_VALUE);
  }
}
