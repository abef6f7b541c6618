// examples/multi.js: node examples/multi.js
const { Redis } = require("ioredis");
const { MultiLock } = require("redislock-native");

async function main() {
  const redis = new Redis(process.env.REDIS_URL ?? "redis://127.0.0.1:6379");
  const order = new MultiLock(redis, ["{order:7}:sku:1", "{order:7}:sku:2"], 30_000); // all or none
  if (await order.acquire({ timeout: 5_000 })) {
    console.log("tokens", order.tokens); // one per key, in order
    await order.release(); // one LOCK.MRELEASE
  }
  await redis.quit();
}

main();
