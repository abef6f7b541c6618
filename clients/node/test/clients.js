'use strict';
// The client libraries every test runs with, one per major version the package's peer ranges
// accept: ioredis 5 and 6 (6 installed as the alias `ioredis6`), node-redis 5 and 4 (4 as the
// alias `redis4`). `connect(kind, port)` gives a connected client; `close(client)` ends it;
// `connectPair(t, kind, port)` gives two, closed after the test `t`; `ioredisOf(kind)` is the
// ioredis library of an ioredis kind (its `Redis` class, with `.Cluster`), else null.

const IORedis = require('ioredis');
const IORedis6 = require('ioredis6');
const redis5 = require('redis');
const redis4 = require('redis4');

const KINDS = ['ioredis', 'ioredis@6', 'node-redis@5', 'node-redis@4'];

function ioredisOf(kind) {
  if (kind === 'ioredis') return IORedis;
  if (kind === 'ioredis@6') return IORedis6;
  return null;
}

async function connect(kind, port, options = {}) {
  const ioredis = ioredisOf(kind);
  if (ioredis) {
    const client = new ioredis({ host: '127.0.0.1', port, lazyConnect: true, ...options });
    await client.connect();
    return client;
  }
  const lib = kind === 'node-redis@5' ? redis5 : redis4;
  const client = lib.createClient({ socket: { host: '127.0.0.1', port }, ...options });
  client.on('error', () => {});
  await client.connect();
  return client;
}

/** Send a raw command through any of them. */
function send(client, ...args) {
  args = args.map(String);
  return typeof client.call === 'function' ? client.call(...args) : client.sendCommand(args);
}

async function close(client) {
  if (typeof client.call === 'function') client.disconnect();
  else await client.quit().catch(() => {});
}

/** Two connected clients of `kind` (`a` and `b`), closed after the test `t` ends. */
async function connectPair(t, kind, port) {
  const a = await connect(kind, port);
  const b = await connect(kind, port);
  t.after(async () => {
    await close(a);
    await close(b);
  });
  return [a, b];
}

module.exports = { KINDS, ioredisOf, connect, connectPair, send, close };
