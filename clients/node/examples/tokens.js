#!/usr/bin/env node
// redis-lock from Node with ioredis: the commands are sent with client.call(), and the
// fencing tokens arrive as JavaScript numbers that are exact (they stay below 2^53 until
// the year 2109, see the README's "Fencing tokens").
//
//   cd clients/node && npm install && node tokens.js --port 6379
//
// Takes a lock, checks its token against LOCK.INFO read as a decimal string, lets a
// second client wait in the queue (BLOCK) until the first releases, checks that the new
// token is larger, fences with both tokens, and prints
//
//   key=node-example:<uuid> first=<token> second=<token> exact=yes
//
// Exits 1 (with the failed assertion on stderr) if anything differs.
'use strict';

const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const Redis = require('ioredis');

function option(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

// LOCK.INFO's flat [field, value, ...] reply as an object.
async function lockInfo(client, key) {
  const reply = await client.call('LOCK.INFO', key);
  if (reply === null) return null;
  const info = {};
  for (let i = 0; i < reply.length; i += 2) info[reply[i]] = reply[i + 1];
  return info;
}

async function main() {
  const host = option('host', '127.0.0.1');
  const port = Number(option('port', '6379'));
  const key = `node-example:${crypto.randomUUID()}`;
  const a = new Redis({ host, port });
  const b = new Redis({ host, port });
  // The same server read with every integer as a decimal string: what the token is,
  // independent of JavaScript numbers.
  const exact = new Redis({ host, port, stringNumbers: true });
  try {
    const first = await a.call('LOCK.ACQUIRE', key, 'worker-a', 30000);
    assert.equal(typeof first, 'number');
    assert.ok(Number.isSafeInteger(first), `${first} is not a safe integer`);
    const info = await lockInfo(exact, key);
    assert.equal(info.owner, 'worker-a');
    assert.equal(String(first), info.token, 'the number differs from the token the server holds');
    assert.ok(BigInt(info.token) < 2n ** 53n, `token ${info.token} is not below 2^53`);

    // worker-b waits in the server's queue (ioredis sets no command timeout by default,
    // so the wait is one command) until worker-a releases.
    const waiting = b.call('LOCK.ACQUIRE', key, 'worker-b', 30000, 'BLOCK', 10000);
    while ((await lockInfo(exact, key)).waiters !== '1') {
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    assert.equal(await a.call('LOCK.RELEASE', key, 'worker-a'), 1);
    const second = await waiting;
    assert.ok(Number.isSafeInteger(second) && second > first, `${second} after ${first}`);
    assert.equal(String(second), (await lockInfo(exact, key)).token);

    // Pass tokens back as strings (as to a Lua script's ARGV): the live one is accepted.
    assert.equal(await a.call('LOCK.FENCE', key, String(second)), 1);
    assert.equal(await a.call('LOCK.FENCE', key, String(first)), 0);
    assert.equal(await b.call('LOCK.RELEASE', key, 'worker-b'), 1);
    console.log(`key=${key} first=${first} second=${second} exact=yes`);
  } finally {
    a.disconnect();
    b.disconnect();
    exact.disconnect();
  }
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
