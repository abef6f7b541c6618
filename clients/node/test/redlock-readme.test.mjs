// node-redlock's README examples (v5, mike-marcacci/node-redlock README.md), run unchanged apart
// from the import and the servers' addresses (three harness servers instead of
// a/b/c.redis.example.com); `something` and `somethingElse` are defined here.

import test from "node:test";
import assert from "node:assert/strict";
import { createRequire } from "node:module";
import Client from "ioredis";
import Redlock from "redislock-native/redlock"; // was: import Redlock from "redlock";
import { ResourceLockedError } from "redislock-native/redlock"; // was: from "redlock"

const require = createRequire(import.meta.url);
const { startServer } = require("./harness.js");

const servers = [];
test.before(async () => {
  for (let i = 0; i < 3; i++) servers.push(await startServer());
});
test.after(() => Promise.all(servers.map((s) => s.stop())));

const seen = [];
const something = async (resource) => seen.push(`something ${resource ?? ""}`.trim());
const somethingElse = async (resource) => seen.push(`somethingElse ${resource ?? ""}`.trim());

test("node-redlock README: configuration, using, acquire/extend/release, error event", async () => {
  const [a, b, c] = servers;
  // Configuration (README "Configuration"; hosts replaced by the local servers).
  const redisA = new Client({ host: "127.0.0.1", port: a.port });
  const redisB = new Client({ host: "127.0.0.1", port: b.port });
  const redisC = new Client({ host: "127.0.0.1", port: c.port });

  const redlock = new Redlock(
    // You should have one client for each independent redis node
    // or cluster.
    [redisA, redisB, redisC],
    {
      // The expected clock drift; for more details see:
      // http://redis.io/topics/distlock
      driftFactor: 0.01, // multiplied by lock ttl to determine drift time

      // The max number of times Redlock will attempt to lock a resource
      // before erroring.
      retryCount: 10,

      // the time in ms between attempts
      retryDelay: 200, // time in ms

      // the max time in ms randomly added to retries
      // to improve performance under high contention
      // see https://www.awsarchitectureblog.com/2015/03/backoff.html
      retryJitter: 200, // time in ms

      // The minimum remaining time on a lock before an extension is automatically
      // attempted with the `using` API.
      automaticExtensionThreshold: 500, // time in ms
    }
  );

  // README "Error Handling".
  const logged = [];
  redlock.on("error", (error) => {
    // Ignore cases where a resource is explicitly marked as locked on a client.
    if (error instanceof ResourceLockedError) {
      return;
    }

    // Log all other errors.
    logged.push(error);
  });

  // README "Usage": using.
  await redlock.using(["foo", "bar"], 5000, async (signal) => {
    // Do something...
    await something("foo");

    // Make sure any attempted lock extension has not failed.
    if (signal.aborted) {
      // Note: The error thrown out of `redlock.using` will not be `signal.error` but rather "The operation was unable to achieve a quorum during its retry window."
      //       and that's after retrying to release the lock (after 2-3 seconds if you use the default settings).
      throw signal.error;
    }

    // Do something else...
    await somethingElse("bar");
  });

  // README "Usage": acquire, extend, release.
  // Acquire a lock.
  let lock = await redlock.acquire(["a"], 5000);
  try {
    // Do something...
    await something();

    // Extend the lock. Note that this returns a new `Lock` instance.
    lock = await lock.extend(5000);

    // Do something else...
    await somethingElse();
  } finally {
    // Release the lock.
    await lock.release();
  }

  assert.deepEqual(seen, ["something foo", "somethingElse bar", "something", "somethingElse"]);
  assert.deepEqual(logged, []);
  // Nothing left behind on any server.
  for (const client of [redisA, redisB, redisC]) {
    assert.equal(await client.exists("foo", "bar", "a"), 0);
  }
  assert.equal(lock.expiration, 0);

  // README "Use in CommonJS Projects".
  const { default: RedlockCjs } = require("redislock-native/redlock");
  assert.equal(RedlockCjs, Redlock);

  await redlock.quit();
});
