'use strict';
// What the cluster failover tests share (cluster-failover.test.js with an ioredis Cluster,
// cluster-failover-node-redis.test.js and cluster-killed-node-redis.test.js with a node-redis
// cluster client): the cluster client, connected within PATIENCE, and the test's own looks at
// one node (plain ioredis connections, closed after the test).
// `node --test test/` runs this file too: it defines no test.

const IORedis = require('ioredis');
const { until } = require('./harness');
const { slotOf } = require('../lib/slot');

const PATIENCE = 30000;

/** A plain ioredis connection to one node, for the test's own looks (closed after the test). */
function node(t, port) {
  const c = new IORedis({ port, host: '127.0.0.1', maxRetriesPerRequest: 0, retryStrategy: () => null });
  c.on('error', () => {});
  t.after(() => c.disconnect());
  return c;
}

/** ROLE of the node at `port`, or null if it does not answer (dead). */
async function role(port) {
  const c = new IORedis({ port, host: '127.0.0.1', maxRetriesPerRequest: 0, retryStrategy: () => null, lazyConnect: true });
  c.on('error', () => {});
  try {
    await c.connect();
    return await c.call('ROLE');
  } catch {
    return null;
  } finally {
    c.disconnect();
  }
}

/**
 * The shard serving `key` in `client`'s slot table (a node-redis cluster's getSlotMaster, as
 * lib/adapter.js tells them apart, else an ioredis Cluster's `slots`): { master, replica } ports,
 * once the replica's link to its master is up (after an earlier test's failover of the same
 * shard the demoted master resyncs first, and a CLUSTER FAILOVER sent before that times out
 * unanswered).
 */
async function shardOf(cluster, client, key) {
  const slot = slotOf(key);
  const master = typeof client.getSlotMaster === 'function'
    ? Number(client.getSlotMaster(slot).port)
    : Number(client.slots[slot][0].split(':')[1]);
  return until(`a replica of ${master} in sync`, async () => {
    for (const n of cluster.nodes) {
      const r = await role(n.port);
      if (r !== null && r[0] === 'slave' && Number(r[2]) === master && String(r[3]) === 'connected') {
        return { master, replica: n.port };
      }
    }
    return null;
  }, PATIENCE);
}

/** The shard channels (the change feed's) subscribed on one node. */
async function feedChannels(c) {
  return (await c.call('PUBSUB', 'SHARDCHANNELS', 'lock.feed:*')).map(String).sort();
}

/** The number of waiters queued on `key` on one node. */
async function waiters(c, key) {
  const reply = await c.call('LOCK.INFO', key);
  return reply === null ? 0 : reply[reply.indexOf('waiters') + 1];
}

/** How many times one node ran `command` (INFO commandstats). */
async function calls(c, command) {
  const m = new RegExp(`cmdstat_${command.replace('|', '\\|')}:calls=(\\d+)`).exec(await c.call('INFO', 'commandstats'));
  return m ? Number(m[1]) : 0;
}

/** The tokens of `key`'s holders on one node. */
async function tokens(c, key) {
  const reply = await c.call('LOCK.INFO', key);
  if (reply === null) return [];
  const holders = reply[reply.indexOf('holders') + 1];
  return holders.map((h) => String(h[h.indexOf('token') + 1]));
}

/** Whether the session `id` is bound to a connection on one node (LOCK.SESSION INFO's `bound`). */
async function attached(c, id) {
  const i = await c.call('LOCK.SESSION', 'INFO', id);
  return i !== null && i[i.indexOf('bound') + 1] !== null;
}

/**
 * A connected cluster client of `lib` on `cluster` (closed after the test): node-redis's
 * (`createCluster`, 4 or 5) or ioredis's (`Cluster`, 5 or 6; its 'ready'). Within PATIENCE:
 * node-redis connects to every master the slot table names, retrying forever, a killed one too
 * while no replica has replaced it (an earlier test that failed before the promotion), and an
 * ioredis Cluster that never gets ready would wait for the test's timeout.
 */
async function connect(t, cluster, lib) {
  let client;
  let connected;
  if (typeof lib.createCluster === 'function') {
    client = lib.createCluster({ rootNodes: cluster.nodes.map((n) => ({ socket: { host: '127.0.0.1', port: n.port } })) });
    client.on('error', () => {});
    t.after(() => client.disconnect().catch(() => {}));
    connected = client.connect();
  } else {
    client = new lib.Cluster(cluster.nodes.map((n) => ({ host: '127.0.0.1', port: n.port })));
    client.on('error', () => {});
    t.after(() => client.disconnect());
    connected = new Promise((resolve) => client.once('ready', resolve));
  }
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`the cluster client not connected within ${PATIENCE} ms`)), PATIENCE);
  });
  try {
    await Promise.race([connected, late]);
  } finally {
    clearTimeout(timer);
  }
  return client;
}

module.exports = { PATIENCE, node, role, shardOf, feedChannels, waiters, calls, tokens, attached, connect };
