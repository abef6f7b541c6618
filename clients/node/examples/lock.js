// examples/lock.js: node examples/lock.js
const { Redis } = require("ioredis");
const { Lock } = require("redislock-native");

async function main() {
  const redis = new Redis(process.env.REDIS_URL ?? "redis://127.0.0.1:6379");
  const lock = new Lock(redis, "{invoice:42}", 30_000); // held for 30 s from each grant

  if (await lock.acquire({ timeout: 10_000 })) { // wait up to 10 s in the server's queue
    try {
      console.log("held with fencing token", lock.token);
      await lock.fenced("SET", "{invoice:42}:total", 100); // written only while the token is live
      await lock.extend(); // deadline = now + 30 s; false if the lock was lost
    } finally {
      await lock.release(); // true if it was still held
    }
  }

  // Give up waiting when the caller does: no grant is left behind.
  const other = new Lock(redis, "{invoice:42}", 30_000);
  await other.acquire({ signal: AbortSignal.timeout(5_000) });
  console.log("second holder, token", other.token);
  await other.release();
  await redis.quit();
}

main();
