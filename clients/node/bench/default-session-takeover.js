'use strict';
// kill -9 of a holder process to the next holder's grant, with the Node client's defaults.
//
//     node bench/default-session-takeover.js [RUNS]      (from clients/node; default 20 runs)
//
// Starts one server with the module through the workspace's harness (as the tests do: HARNESS_BIN,
// REDIS_SERVER, REDIS_LOCK_MODULE), then for each run starts a holder process
// (test/default-holder.js, ioredis) that takes its lock as the README shows, queues a waiter here
// (LOCK.ACQUIRE ... BLOCK, `session: null`), SIGKILLs the holder and times, on this process's
// monotonic clock (performance.now()), from the kill to the waiter's acquire() resolving true.
// Rows:
//
// - `new Lock(redis, name, 30_000)`: clients/node/README.md's first example (the default session).
// - `new Lock(redis, name, 5_000, { watchdog: true })`: the watchdog on top of it.
// - `... { watchdog: true, session: null }`: the ttl alone, for reference (3 runs).
//
// Then RUNS blips: the holder process lives, its default session's bound connection is ended with
// CLIENT KILL (the server-side twin of a proxy or network reset), and the row says in how many the
// hold was still the holder's two seconds later (LOCK.FENCE key token) and how long the client took
// to ATTACH the session on a new connection (LOCK.SESSION LIST's `bound`).
//
// Prints p50, p99 (nearest rank: of 20 runs p99 is the largest) and the largest, in the shape of
// clients/python/bench/default_session_takeover.py.

const path = require('node:path');
const readline = require('node:readline');
const crypto = require('node:crypto');
const { spawn } = require('node:child_process');
const { Redis } = require('ioredis');
const { startServer } = require('../test/harness');
const { Lock } = require('..');

const HOLDER = path.join(__dirname, '..', 'test', 'default-holder.js');

/** A holder process that took `key`; resolves to {proc, token}. */
function spawnHolder(port, key, ttl, mode) {
  const proc = spawn(process.execPath, [HOLDER, String(port), key, String(ttl), mode], { stdio: ['ignore', 'pipe', 'inherit'] });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('holder: no line within 30 s')), 30000);
    proc.once('exit', (code) => reject(new Error(`holder exited with ${code}`)));
    readline.createInterface({ input: proc.stdout }).once('line', (line) => {
      clearTimeout(timer);
      const [word, token] = line.split(' ');
      if (word !== 'held') reject(new Error(`holder: ${line}`));
      resolve({ proc, token: Number(token) });
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function fields(reply) {
  const out = {};
  for (let i = 0; i < reply.length; i += 2) out[String(reply[i])] = reply[i + 1];
  return out;
}

async function waiters(r, key, count) {
  for (const end = performance.now() + 10000; performance.now() < end; await sleep(1)) {
    const info = await r.call('LOCK.INFO', key);
    if (info !== null && fields(info).waiters === count) return;
  }
  throw new Error(`no ${count} waiters on ${key}`);
}

async function killed(proc) {
  if (proc.exitCode === null && proc.signalCode === null) {
    const exited = new Promise((resolve) => proc.once('exit', resolve));
    proc.kill('SIGKILL');
    await exited;
  }
}

async function oneRun(port, r, ttl, mode) {
  const key = `bench:${crypto.randomBytes(6).toString('hex')}`;
  const { proc } = await spawnHolder(port, key, ttl, mode);
  try {
    const waiter = new Lock(r, key, 30000, { session: null });
    let at;
    const granted = waiter.acquire({ timeout: 60000 }).then((ok) => {
      at = performance.now();
      return ok;
    });
    await waiters(r, key, 1);
    const t0 = performance.now();
    proc.kill('SIGKILL');
    if ((await granted) !== true) throw new Error('the waiter was not granted');
    await waiter.release();
    return at - t0;
  } finally {
    await killed(proc);
  }
}

/** The client id the session `serial` is bound to (LOCK.SESSION LIST), or null. */
async function boundOf(r, serial) {
  let cursor = '0';
  do {
    const [next, entries] = await r.call('LOCK.SESSION', 'LIST', cursor, 'COUNT', '1000');
    for (const entry of entries) {
      const f = fields(entry);
      if (Number(f.serial) === serial) return f.bound;
    }
    cursor = String(next);
  } while (cursor !== '0');
  return null;
}

/** CLIENT KILL of a live holder's bound connection: [hold kept?, ms to the re-ATTACH]. */
async function oneBlip(port, r) {
  const key = `bench:${crypto.randomBytes(6).toString('hex')}`;
  const { proc, token } = await spawnHolder(port, key, 30000, 'default');
  try {
    const holder = fields(fields(await r.call('LOCK.INFO', key)).holders[0]);
    const serial = Number(holder.session);
    const old = await boundOf(r, serial);
    const t0 = performance.now();
    if ((await r.call('CLIENT', 'KILL', 'ID', String(old))) !== 1) throw new Error('CLIENT KILL killed nothing');
    let attached = null;
    while (performance.now() - t0 < 2000) {
      // four graces: long past the server's end of it
      const now = await boundOf(r, serial);
      if (attached === null && now !== null && String(now) !== String(old)) attached = performance.now() - t0;
      await sleep(1);
    }
    const kept = (await r.call('LOCK.FENCE', key, String(token))) === 1;
    return [kept && attached !== null, attached];
  } finally {
    await killed(proc);
  }
}

/** The nearest-rank percentile. */
function percentile(values, p) {
  const ordered = [...values].sort((x, y) => x - y);
  return ordered[Math.max(0, Math.ceil((ordered.length * p) / 100) - 1)];
}

const median = (values) => {
  const o = [...values].sort((x, y) => x - y);
  const m = Math.floor(o.length / 2);
  return o.length % 2 ? o[m] : (o[m - 1] + o[m]) / 2;
};

const f1 = (x) => x.toFixed(1);

async function main() {
  const runs = Number(process.argv[2] || 20);
  const server = await startServer();
  const r = new Redis({ host: '127.0.0.1', port: server.port, maxRetriesPerRequest: 0 });
  const rows = [
    ['new Lock(redis, name, 30_000)', 30000, 'default', runs],
    ['new Lock(redis, name, 5_000, { watchdog: true })', 5000, 'watchdog', runs],
    ['new Lock(redis, name, 5_000, { watchdog: true, session: null })', 5000, 'none-watchdog', 3],
  ];
  try {
    console.log(`${'holder made as'.padEnd(64)} ${'runs'.padStart(4)} ${'p50 ms'.padStart(9)} ${'p99 ms'.padStart(9)} ${'max ms'.padStart(9)}`);
    for (const [label, ttl, mode, n] of rows) {
      const took = [];
      for (let i = 0; i < n; i++) took.push(await oneRun(server.port, r, ttl, mode));
      console.log(
        `${label.padEnd(64)} ${String(n).padStart(4)} ${f1(median(took)).padStart(9)} ${f1(percentile(took, 99)).padStart(9)} ${f1(Math.max(...took)).padStart(9)}`
      );
    }
    const blips = [];
    for (let i = 0; i < runs; i++) blips.push(await oneBlip(server.port, r));
    const kept = blips.filter(([ok]) => ok).length;
    const took = blips.filter(([ok]) => ok).map(([, t]) => t);
    const label = 'CLIENT KILL of its bound connection, process alive';
    console.log(
      took.length > 0
        ? `${label.padEnd(64)} ${String(runs).padStart(4)} holds kept ${kept}/${runs}; re-attached p50 ` +
            `${f1(median(took))} ms, p99 ${f1(percentile(took, 99))} ms, max ${f1(Math.max(...took))} ms`
        : `${label.padEnd(64)} ${String(runs).padStart(4)} holds kept 0/${runs}`
    );
  } finally {
    r.disconnect();
    await server.stop();
  }
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
