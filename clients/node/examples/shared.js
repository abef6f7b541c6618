// examples/shared.js: node examples/shared.js
const { Redis } = require("ioredis");
const { Semaphore, ReadWriteLock } = require("redislock-native");

async function main() {
  const redis = new Redis(process.env.REDIS_URL ?? "redis://127.0.0.1:6379");

  const permit = new Semaphore(redis, "payments-api", 4, 30_000); // at most 4 holders at once
  await permit.using(async () => {
    console.log("one of 4 permits, token", permit.token);
  });

  const report = new ReadWriteLock(redis, "report", 30_000);
  await report.read.using(async () => {
    // any number of readers together
  });
  await report.write.using(async () => {
    // alone; not overtaken by readers that queue after it
  });
  await redis.quit();
}

main();
