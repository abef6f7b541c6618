// examples/redlock.ts
import Client from "ioredis";
import Redlock, { ResourceLockedError } from "redislock-native/redlock"; // was: from "redlock"

async function main() {
  const redis = new Client(process.env.REDIS_URL ?? "redis://127.0.0.1:6379");
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
