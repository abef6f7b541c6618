'use strict';
// The client libraries every test runs with: ioredis 5, node-redis 5 and node-redis 4 (installed
// as the alias `redis4`). `connect(kind, port)` gives a connected client; `close(client)` ends it.

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

module.exports = { KINDS, connect, send, close };
