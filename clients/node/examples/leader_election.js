// examples/leader_election.js: node examples/leader_election.js
const { spawn } = require("node:child_process");
const { Redis } = require("ioredis");
const { Election, Session } = require("redislock-native");

const url = process.env.REDIS_URL ?? "redis://127.0.0.1:6379";
const name = "scheduler-leader";

// A candidate is a process of its own. Its bound session ends the moment the process dies (its
// connection closes), and with it the leadership: the next candidate in the queue leads.
/** @param {string} value */
async function candidate(value) {
  process.stdin.on("end", () => process.exit(0)).resume(); // gone with the example
  const redis = new Redis(url);
  const session = await new Session(redis, 30_000, { bound: true }).open();
  const leadership = await new Election(redis, name, { session }).campaign(value);
  if (leadership === null) return;
  setInterval(() => leadership.fenced("SET", "scheduler:owner", value).catch(() => {}), 50);
}

/**
 * How many candidates wait in the key's queue (LOCK.INFO's `waiters`).
 * @param {Redis} redis
 */
async function waiting(redis) {
  const info = /** @type {unknown[]} */ (await redis.call("LOCK.INFO", name));
  return Number(info[info.indexOf("waiters") + 1]);
}

async function main() {
  if (process.argv[2] === "candidate") return candidate(process.argv[3]);
  const redis = new Redis(url);
  const changes = new Election(redis, name).observe();
  const first = await changes.get(); // the state when observing began
  console.log(first.leader === null ? "no leader" : `leader: ${first.leader.value}`);

  const candidates = new Map();
  for (const value of ["candidate-1", "candidate-2", "candidate-3"]) {
    candidates.set(value, spawn(process.execPath, [__filename, "candidate", value], { stdio: ["pipe", "inherit", "inherit"] }));
  }
  let killed = false;
  for await (const { leader } of changes) { // every change: a new term, or "no leader"
    console.log(leader === null ? "no leader" : `leader: ${leader.value}, term ${leader.term}`);
    if (leader === null) continue;
    if (killed) break; // the next one took over
    while ((await waiting(redis)) < 2) await new Promise((r) => setTimeout(r, 10)); // the others queue
    candidates.get(leader.value).kill("SIGKILL"); // kill -9 the leader
    console.log(`killed ${leader.value}`);
    killed = true;
  }
  for (const child of candidates.values()) child.kill("SIGKILL");
  await redis.quit();
}

main();
