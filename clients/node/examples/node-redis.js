// examples/node-redis.js: node examples/node-redis.js
const { createClient } = require("redis");
const { Lock } = require("redislock-native");

async function main() {
  const client = createClient({ url: process.env.REDIS_URL ?? "redis://127.0.0.1:6379" });
  await client.connect();
  const lock = new Lock(client, "{invoice:42}", 30_000, { watchdog: true });
  await lock.using(async (signal) => {
    console.log("held with fencing token", lock.token, "lost yet:", signal.aborted);
  });
  await client.quit();
}

main();
