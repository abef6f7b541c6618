'use strict';
// The client follows a 3+3 cluster through failovers (issue 34), with an ioredis Cluster: a
// planned CLUSTER FAILOVER of the shard, and a killed master whose replica is promoted (CLUSTER
// FAILOVER FORCE). Holds kept with their tokens, sessions (bound or not) renewed on the new
// master, a queued waiter granted without the caller sending again, no loss reported; with
// `durable: 1` nothing acknowledged is lost. Every wait is on observable state with a deadline.

const test = require('node:test');
const assert = require('node:assert/strict');
const IORedis = require('ioredis');
const { startCluster, until } = require('./harness');
const { Lock, Session } = require('..');
const { slotOf } = require('../lib/slot');

const PATIENCE = 30000;

let cluster;
test.before(async () => {
  cluster = await startCluster(['--masters', '3', '--replicas', '1']);
});
test.after(() => cluster.stop());

/** A plain connection to one node (closed after the test). */
function node(t, port) {
  const c = new IORedis({ port, host: '127.0.0.1', lazyConnect: false, maxRetriesPerRequest: 0, retryStrategy: () => null });
  c.on('error', () => {});
  t.after(() => c.disconnect());
  return c;
}

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

/** The shard serving `key` now: { master, replica } ports. */
async function shardOf(client, key) {
  const master = Number(client.slots[slotOf(key)][0].split(':')[1]);
  for (const n of cluster.nodes) {
    const r = await role(n.port);
    if (r !== null && r[0] === 'slave' && Number(r[2]) === master) return { master, replica: n.port };
  }
  throw new Error(`no replica of ${master}`);
}

async function calls(c, command) {
  const m = new RegExp(`cmdstat_${command.replace('|', '\\|')}:calls=(\\d+)`).exec(await c.call('INFO', 'commandstats'));
  return m ? Number(m[1]) : 0;
}

/** LOCK.INFO on one node: { token of each holder, waiters }. */
async function lockInfo(c, key) {
  const reply = await c.call('LOCK.INFO', key);
  if (reply === null) return { tokens: [], waiters: 0 };
  const f = {};
  for (let i = 0; i < reply.length; i += 2) f[reply[i]] = reply[i + 1];
  const tokens = f.holders.map((h) => {
    const g = {};
    for (let i = 0; i < h.length; i += 2) g[h[i]] = h[i + 1];
    return String(g.token);
  });
  return { tokens, waiters: f.waiters };
}

async function connect(t) {
  const client = new IORedis.Cluster(cluster.nodes.map((n) => ({ host: '127.0.0.1', port: n.port })));
  client.on('error', () => {});
  t.after(() => client.disconnect());
  await new Promise((resolve) => client.once('ready', resolve));
  return client;
}

test('a planned CLUSTER FAILOVER keeps holds, sessions and waiters (ioredis Cluster)', async (t) => {
  const client = await connect(t);
  const tag = '{fo-node-planned}';
  const { master: oldPort, replica: newPort } = await shardOf(client, tag);
  const fresh = node(t, newPort);
  const lost = [];
  const report = (what) => (x) => lost.push([what, x.lostReason]);

  const plain = new Lock(client, tag + 'plain', 3000, { watchdog: true, onLost: report('plain'), feed: false });
  assert.equal(await plain.acquire(), true);
  const unbound = await new Session(client, 3000, { key: tag, onLost: report('unbound') }).open();
  const inUnbound = new Lock(client, tag + 's1', 0, { session: unbound, feed: false });
  assert.equal(await inUnbound.acquire(), true);
  const bound = await new Session(client, 3000, { key: tag, bound: true, onLost: report('bound') }).open();
  const inBound = new Lock(client, tag + 's2', 0, { session: bound, feed: false });
  assert.equal(await inBound.acquire(), true);

  const holder = new Lock(client, tag + 'busy', 60000);
  assert.equal(await holder.acquire(), true);
  const waiter = new Lock(client, tag + 'busy', 60000);
  const granted = waiter.acquire({ timeout: PATIENCE });
  const old = node(t, oldPort);
  await until('the waiter queued', async () => (await lockInfo(old, tag + 'busy')).waiters === 1);

  const keepalives = await calls(fresh, 'lock.session|keepalive');
  assert.equal(await fresh.call('CLUSTER', 'FAILOVER'), 'OK');
  await until('the replica promoted', async () => ((await role(newPort)) || [])[0] === 'master', PATIENCE);
  await until('keepalives on the new master', async () => (await calls(fresh, 'lock.session|keepalive')) >= keepalives + 4, PATIENCE);
  await until('an extend on the new master', async () => (await calls(fresh, 'lock.extend')) >= 2, PATIENCE);
  await until('the bound session attached there', async () => {
    const i = await fresh.call('LOCK.SESSION', 'INFO', bound.id);
    return i !== null && i[i.indexOf('bound') + 1] !== null;
  }, PATIENCE);
  for (const lock of [plain, inUnbound, inBound]) {
    assert.deepEqual((await lockInfo(fresh, lock.name)).tokens, [String(lock.token)], lock.name);
  }
  assert.deepEqual(lost, []);

  await until('the waiter queued again on the new master', async () => (await lockInfo(fresh, tag + 'busy')).waiters === 1, PATIENCE);
  assert.equal(await holder.release(), true);
  assert.equal(await granted, true);
  assert.deepEqual((await lockInfo(fresh, tag + 'busy')).tokens, [String(waiter.token)]);

  for (const lock of [plain, inUnbound, inBound, waiter]) assert.equal(await lock.release(), true);
  assert.equal(await unbound.close(), 0);
  assert.equal(await bound.close(), 0);
  assert.deepEqual(lost, []);
});

test('a killed master loses no durable grant; sessions and renewals follow (ioredis Cluster)', async (t) => {
  const client = await connect(t);
  const tag = '{fo-node-killed}';
  const { master: oldPort, replica: newPort } = await shardOf(client, tag);
  const fresh = node(t, newPort);
  const lost = [];
  const locks = [];
  for (let i = 0; i < 20; i++) {
    const lock = new Lock(client, `${tag}d${i}`, 60000, { durable: 1 });
    assert.equal(await lock.acquire(), true);
    locks.push(lock);
  }
  const session = await new Session(client, 30000, { key: tag, onLost: (s) => lost.push(s.lostReason) }).open();
  const inSession = new Lock(client, tag + 's', 0, { session, durable: 1, feed: false });
  assert.equal(await inSession.acquire(), true);
  const dog = new Lock(client, tag + 'dog', 30000, {
    watchdog: true, watchdogPeriod: 1000, durable: 1, feed: false, onLost: (l) => lost.push(l.lostReason),
  });
  assert.equal(await dog.acquire(), true);

  const pid = cluster.nodes.find((n) => n.port === oldPort).pid;
  process.kill(pid, 'SIGKILL');
  await until('the master dead', async () => (await role(oldPort)) === null, 10000);
  assert.equal(await fresh.call('CLUSTER', 'FAILOVER', 'FORCE'), 'OK');
  await until('the replica promoted', async () => ((await role(newPort)) || [])[0] === 'master', PATIENCE);

  for (const lock of [...locks, inSession, dog]) {
    assert.deepEqual((await lockInfo(fresh, lock.name)).tokens, [String(lock.token)], lock.name);
  }
  await until('a keepalive on the new master', async () => (await calls(fresh, 'lock.session|keepalive')) >= 1, PATIENCE);
  await until('a renewal on the new master', async () => (await calls(fresh, 'lock.extend')) >= 1, PATIENCE);
  assert.deepEqual(lost, []);
  assert.equal(await dog.release(), true);
  assert.equal(await session.close(), 1);
  for (const lock of locks) assert.equal(await lock.release(), true);
});
