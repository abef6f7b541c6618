// examples/durable.js: node examples/durable.js
const { Redis } = require("ioredis");
const { Lock, DurabilityError } = require("redislock-native");

async function main() {
  const redis = new Redis(process.env.REDIS_URL ?? "redis://127.0.0.1:6379");
  // Granted only once 1 replica acknowledged it (WAIT 1 500 right after the grant).
  const lock = new Lock(redis, "ledger", 30_000, { durable: 1, durableTimeout: 500 });
  try {
    if (await lock.acquire({ timeout: 5_000 })) {
      console.log("held on the primary and 1 replica, token", lock.token);
      await lock.release();
    }
  } catch (error) {
    if (!(error instanceof DurabilityError)) throw error;
    // Not busy, not held: too few replicas answered. The grant was given back, unless
    // error.mayStayHeld (the release failed too: held until its ttl runs out).
    console.log(error.message, { released: error.released, mayStayHeld: error.mayStayHeld });
  }
  await redis.quit();
}

main();
