'use strict';
// Servers for the tests, started by the repository's `harness` binary (harness/src/bin/harness.rs):
// it prints one JSON line ({"port","pid","dir","url"}) and keeps the server until its standard
// input closes. Nothing here knows how to start a server; it only runs that binary.
//
// HARNESS_BIN (default: <repo>/target/debug/harness), REDIS_SERVER and REDIS_LOCK_MODULE (passed
// on to the harness) choose what runs.
//
// Below that, what the test files share: one server per file, fresh key names, polling for
// observable state instead of fixed sleeps, and the server's state read back (LOCK.INFO as an
// object, a key's waiter count, a named connection's client id).

const test = require('node:test');
const { spawn } = require('node:child_process');
const path = require('node:path');
const readline = require('node:readline');
const { send } = require('./clients');

const ROOT = path.resolve(__dirname, '..', '..', '..');
const BIN = process.env.HARNESS_BIN || path.join(ROOT, 'target', 'debug', 'harness');
const START_TIMEOUT_MS = 60000;

/**
 * Start `harness server ...args`; resolves to {port, pid, dir, url, stop()}. `stop()` closes the
 * harness's standard input and resolves once it has stopped the server and exited.
 */
function startServer(args = []) {
  return start(['server', ...args]);
}

/** `harness cluster ...args`: resolves to {nodes: [{port, pid, dir, url}, ...], stop()}. */
function startCluster(args = []) {
  return start(['cluster', ...args]);
}

function start(args) {
  const child = spawn(BIN, args, { stdio: ['pipe', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d) => (stderr += d));
  const exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGTERM');
      reject(new Error(`harness: no JSON line within ${START_TIMEOUT_MS} ms\n${stderr}`));
    }, START_TIMEOUT_MS);
    child.once('error', (e) => {
      clearTimeout(timer);
      reject(new Error(`harness: cannot run ${BIN} (cargo build -p redis-lock-harness --bin harness): ${e.message}`));
    });
    exited.then(({ code }) => {
      clearTimeout(timer);
      reject(new Error(`harness exited with ${code} before starting\n${stderr}`));
    });
    readline.createInterface({ input: child.stdout }).once('line', (line) => {
      clearTimeout(timer);
      const server = JSON.parse(line);
      server.stop = () => {
        child.stdin.end();
        return exited;
      };
      resolve(server);
    });
  });
}

// --- what the test files share ---

/**
 * One server for the whole file: started before its first test, stopped after its last. The
 * object returned gets the server's fields (`port`, `pid`, `dir`, `url`, `stop()`) once started.
 */
function serverForFile(args = []) {
  const server = {};
  test.before(async () => {
    Object.assign(server, await startServer(args));
  });
  test.after(() => server.stop?.()); // nothing to stop if it did not start
  return server;
}

/**
 * A server of the test's own, with a pair of clients of `kind` (connected through
 * `./clients`), for a test that changes server-wide state (configs, ACL users, flushes) or
 * asserts on it (command stats, `INFO lock` counters): the file's shared server stays as the
 * other tests expect it. The clients close, then the server stops, when the test ends.
 */
async function ownServer(t, kind, args = []) {
  const { connectPair } = require('./clients');
  const server = await startServer(args);
  let pair;
  try {
    pair = await connectPair(t, kind, server.port);
  } catch (e) {
    await server.stop();
    throw e;
  }
  t.after(() => server.stop()); // after the clients' own `after` (hooks run in order)
  return { server, a: pair[0], b: pair[1] };
}

/** `fresh(what)`: a key name no other test of the file (nor another run of it) uses. */
function freshKeys(prefix) {
  let n = 0;
  return (what) => `${prefix}${what}:${process.pid}:${++n}`;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Poll `fn` every 5 ms until it is truthy (no fixed sleeps); its value, or an error after `timeout` ms. */
async function until(what, fn, timeout = 10000) {
  const end = Date.now() + timeout;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(5);
  }
}

/** LOCK.INFO as an object (holders as the client library gives them), or null for a free key. */
async function info(client, key) {
  const reply = await send(client, 'LOCK.INFO', key);
  if (reply === null) return null;
  const out = {};
  for (let i = 0; i < reply.length; i += 2) out[reply[i]] = reply[i + 1];
  return out;
}

/** Poll until `key` has `count` waiters in its queue. */
function waiters(client, key, count) {
  return until(`${count} waiters on ${key}`, async () => {
    const i = await info(client, key);
    return i !== null && i.waiters === count;
  });
}

/** The client id of the connection named `name` (CLIENT LIST), or null if there is none. */
async function clientId(client, name) {
  const list = String(await send(client, 'CLIENT', 'LIST'));
  const line = list.split('\n').find((l) => l.includes(` name=${name} `));
  return line === undefined ? null : /id=(\d+)/.exec(line)[1];
}

module.exports = { startServer, startCluster, serverForFile, ownServer, freshKeys, sleep, until, info, waiters, clientId };
