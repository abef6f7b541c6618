'use strict';
// The client libraries every test runs with: ioredis 5, node-redis 5 and node-redis 4 (installed
// as the alias `redis4`). `connect(kind, port)` gives a connected client; `close(client)` ends it;
// `connectPair(t, kind, port)` gives two, closed after the test `t`.

const IORedis = require('ioredis');
const redis5 = require('redis');
const redis4 = require('redis4');

const KINDS = ['ioredis', 'node-redis@5', 'node-redis@4'];

async function connect(kind, port, options = {}) {
  if (kind === 'ioredis') {
    const client = new IORedis({ host: '127.0.0.1', port, lazyConnect: true, ...options });
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

module.exports = { KINDS, connect, connectPair, send, close };
