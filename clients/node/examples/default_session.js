// examples/default_session.js: node examples/default_session.js
const { Redis } = require("ioredis");
const { Lock } = require("redislock-native");

async function main() {
  const redis = new Redis(process.env.REDIS_URL ?? "redis://127.0.0.1:6379");
  const lock = new Lock(redis, "{invoice:42}:default", 30_000); // no session option: the default session
  await lock.acquire(); // LOCK.ACQUIRE {invoice:42}:default owner 30000 SESSION id
  const info = await lock.session?.info(); // LOCK.SESSION INFO: one bound session for the client
  console.log("session", lock.session?.serial === info?.serial, "grace", info?.grace, "holds", info?.holds);

  const plain = new Lock(redis, "{invoice:42}:plain", 30_000, { session: null }); // its ttl alone
  await plain.acquire();
  console.log("plain lock in a session:", plain.session !== undefined);
  await plain.release();
  await lock.release();
  await redis.quit(); // LOCK.SESSION CLOSE of the default session first, then QUIT
}

main();
