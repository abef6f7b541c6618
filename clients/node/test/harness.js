'use strict';
// Servers for the tests, started by the repository's `harness` binary (harness/src/bin/harness.rs):
// it prints one JSON line ({"port","pid","dir","url"}) and keeps the server until its standard
// input closes. Nothing here knows how to start a server; it only runs that binary.
//
// HARNESS_BIN (default: <repo>/target/debug/harness), REDIS_SERVER and REDIS_LOCK_MODULE (passed
// on to the harness) choose what runs.

const { spawn } = require('node:child_process');
const path = require('node:path');
const readline = require('node:readline');

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

module.exports = { startServer, startCluster };
