// One worker of the peers scenario (benches/lockbench/scenarios/peers.rs): node `redlock` 4,
// one master, default settings, used as its README shows (`redlock.lock(resource, ttl)` then
// `lock.unlock()`). After its retries run out `lock` rejects; the worker then asks again.
// Same protocol as worker.py: `ready`, wait for `go`, a JSON line at the end.
"use strict";
const Redis = require("ioredis");
const Redlock = require("redlock");

const arg = (name, dflt) => {
  const i = process.argv.indexOf("--" + name);
  return i < 0 ? dflt : process.argv[i + 1];
};
const mode = arg("mode");
const port = Number(arg("port"));
const key = arg("key");
const holdMs = Number(arg("hold-ms", "1"));
const ttlMs = Number(arg("ttl-ms", "10000"));
const secs = Number(arg("secs", "5"));
const grace = Number(arg("grace", "30"));

const client = new Redis({ host: "127.0.0.1", port });
const redlock = new Redlock([client]);
redlock.on("clientError", () => {});
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// Wall-clock ms with sub-ms resolution (Date.now() has whole ms only).
const nowMs = () => performance.timeOrigin + performance.now();

async function take(ttl) {
  for (;;) {
    try {
      return await redlock.lock(key, ttl);
    } catch (e) {
      if (e.name !== "LockError") throw e;
    }
  }
}

async function main() {
  await client.ping();
  process.stdout.write("ready\n");
  await new Promise((resolve) => process.stdin.once("data", resolve));
  if (mode === "hold-and-die") {
    await take(ttlMs);
    process.stdout.write(JSON.stringify({ held_at_ms: nowMs() }) + "\n", () => process.exit(0));
    return;
  }
  if (mode === "wait-once") {
    setTimeout(() => process.exit(1), 60000).unref(); // a bound, should it never grant
    const lock = await take(ttlMs);
    const at = nowMs();
    await lock.unlock();
    process.stdout.write(JSON.stringify({ granted_at_ms: at }) + "\n", () => process.exit(0));
    return;
  }
  const start = nowMs() / 1000;
  const stop = start + secs;
  const log = { grants: [], unfinished_ms: null, last_release: start };
  let want = start;
  setTimeout(() => {
    log.unfinished_ms = (nowMs() / 1000 - want) * 1000;
    process.stdout.write(JSON.stringify(log) + "\n", () => process.exit(0));
  }, (secs + grace) * 1000).unref();
  for (;;) {
    want = nowMs() / 1000;
    if (want >= stop) break;
    const lock = await take(ttlMs);
    const got = nowMs() / 1000;
    log.grants.push([got, (got - want) * 1000]);
    await sleep(holdMs);
    await lock.unlock();
    log.last_release = nowMs() / 1000;
  }
  process.stdout.write(JSON.stringify(log) + "\n", () => process.exit(0));
}
main().catch((e) => {
  process.stderr.write(String(e && e.stack) + "\n");
  process.exit(1);
});
