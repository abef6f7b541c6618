// examples/node-redis.ts
import { createClient } from "redis";
import { Lock } from "redislock-native";

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
