// examples/using.js: node examples/using.js
const { Redis } = require("ioredis");
const { Locks, LockLostError } = require("redislock-native");

async function main() {
  const redis = new Redis(process.env.REDIS_URL ?? "redis://127.0.0.1:6379");
  const locks = new Locks(redis);

  // Acquire, renew from a watchdog every ttl/3, release on every exit path (return or throw).
  const total = await locks.using("report:daily", 10_000, async (signal) => {
    // `signal` aborts if the lock is lost (a renewal answered 0 or failed).
    signal.addEventListener("abort", () => {
      if (signal.reason instanceof LockLostError) console.log("lost:", signal.reason.reason);
    });
    return 6 * 7;
  });
  console.log("total", total);

  // Wait at most 2 s for it; LockBusyError if someone else kept it that long.
  await locks.using("report:daily", 10_000, { timeout: 2_000 }, async () => "done");
  await redis.quit();
}

main();
