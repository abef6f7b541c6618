// examples/redlock.js: node examples/redlock.js
const { Redis } = require("ioredis");
const { default: Redlock, ResourceLockedError } = require("redislock-native/redlock"); // was: require("redlock")

async function main() {
  const redis = new Redis(process.env.REDIS_URL ?? "redis://127.0.0.1:6379");
  const redlock = new Redlock([redis], { retryCount: 10, retryDelay: 200 });
  redlock.on("error", (error) => {
    if (error instanceof ResourceLockedError) return;
    console.error(error);
  });

  let lock = await redlock.acquire(["a"], 5000);
  try {
    lock = await lock.extend(5000);
  } finally {
    await lock.release();
  }

  await redlock.using(["foo", "bar"], 5000, async (signal) => {
    if (signal.aborted) throw signal.error;
  });
  await redis.quit();
}

main();
