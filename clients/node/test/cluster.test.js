'use strict';
// A cluster client of every library (an ioredis Cluster, a node-redis 5 and 4 createCluster):
// commands routed by key, a wait on a connection to the key's master only, the feed, a bound
// session and an election on the key's master.

const test = require('node:test');
const assert = require('node:assert/strict');
const IORedis = require('ioredis');
const redis5 = require('redis');
const redis4 = require('redis4');
const { startCluster, until, info } = require('./harness');
const { KINDS, ioredisOf, send } = require('./clients');
const { Lock, MultiLock, Session, Election } = require('..');
const Redlock = require('../redlock');
const { feedFor } = require('../lib/feed');
const { slotOf } = require('../lib/slot');
const { adapt, IOREDIS_CLUSTER, NODE_REDIS_CLUSTER } = require('../lib/adapter');

let cluster;
test.before(async () => {
  cluster = await startCluster(['--masters', '3', '--replicas', '0']);
});
test.after(() => cluster.stop());

/**
 * A connected cluster client of `kind` on the test cluster, closed after the test `t`, with
 * `masters()` (the cluster's own client of each master, for `send`) and `masterOf(key)`.
 */
async function connectCluster(t, kind) {
  const roots = cluster.nodes.map((n) => ({ host: '127.0.0.1', port: n.port }));
  if (ioredisOf(kind)) {
    const client = new (ioredisOf(kind).Cluster)(roots);
    t.after(() => client.disconnect());
    await new Promise((resolve) => client.once('ready', resolve));
    assert.equal(adapt(client).kind, IOREDIS_CLUSTER);
    const masters = () => client.nodes('master');
    const masterOf = (key) => masters().find((n) => `${n.options.host}:${n.options.port}` === client.slots[slotOf(key)][0]);
    return { client, masters, masterOf };
  }
  const lib = kind === 'node-redis@5' ? redis5 : redis4;
  const client = lib.createCluster({ rootNodes: roots.map((socket) => ({ socket })) });
  client.on('error', () => {});
  await client.connect();
  t.after(() => client.disconnect().catch(() => {}));
  assert.equal(adapt(client).kind, NODE_REDIS_CLUSTER);
  const masters = () => client.masters.map((m) => client.nodeClient(m));
  const masterOf = (key) => client.nodeClient(client.getSlotMaster(slotOf(key)));
  return { client, masters, masterOf };
}

for (const kind of KINDS) {
  test(`${kind} Cluster: acquire, a wait on the key master, abort, MultiLock with one hash tag`, async (t) => {
    const { client, masters, masterOf } = await connectCluster(t, kind);
    // Waiter connections (named redislock-waiter) per master, once none is still closing.
    const waitersOn = async (expected) => {
      const deadline = Date.now() + 5000;
      for (;;) {
        const counts = [];
        for (const node of masters()) {
          counts.push((String(await send(node, 'CLIENT', 'LIST')).match(/name=redislock-waiter /g) || []).length);
        }
        if (JSON.stringify(counts) === JSON.stringify(expected) || Date.now() > deadline) return counts;
        await new Promise((r) => setTimeout(r, 10));
      }
    };
    const queued = (node, key) => until(`a waiter on ${key}`, async () => (await info(node, key)).waiters === 1);

    for (const key of ['alpha', 'beta', 'gamma', 'delta']) {
      const holder = new Lock(client, key, 30000);
      assert.equal(await holder.acquire({ timeout: 0 }), true);
      const waiter = new Lock(client, key, 30000);
      const got = waiter.acquire({ timeout: 10000 });
      const node = masterOf(key);
      await queued(node, key);
      // One waiter connection, on the key's master only.
      const expected = masters().map((n) => (n === node ? 1 : 0));
      assert.deepEqual(await waitersOn(expected), expected);
      assert.equal(await holder.release(), true);
      assert.equal(await got, true);
      assert.equal(await send(node, 'LOCK.FENCE', key), waiter.token);
      assert.equal(await waiter.release(), true);

      // Abort: no grant left behind.
      await holder.acquire();
      const controller = new AbortController();
      const aborted = new Lock(client, key, 30000).acquire({ signal: controller.signal });
      await queued(node, key);
      controller.abort();
      await assert.rejects(aborted, { name: 'AbortError' });
      assert.equal(await holder.release(), true);
      assert.equal(await send(node, 'LOCK.INFO', key), null);
    }

    const m = new MultiLock(client, ['{order:7}:a', '{order:7}:b'], 30000);
    assert.equal(await m.acquire(), true);
    assert.equal(m.tokens.length, 2);
    assert.equal(await m.extend(), true);
    assert.equal(await m.owned(), true);
    assert.equal(await m.release(), true);

    // What goes through the user's client (EVAL included) reaches the key's master.
    const lock = new Lock(client, '{order:7}:lock', 30000);
    assert.equal(await lock.acquire(), true);
    assert.equal(await lock.fenced('SET', '{order:7}:total', 100), 'OK');
    assert.equal(await send(masterOf('{order:7}:total'), 'GET', '{order:7}:total'), '100');
    assert.equal(await lock.extend(), true);
    assert.equal(await lock.owned(), true);
    assert.equal(await lock.locked(), true);
    assert.equal(await lock.release(), true);
    assert.equal(await send(masterOf('{order:7}:lock'), 'EXISTS', '{order:7}:lock'), 0);

    // The node-redlock drop-in on one cluster client: one LOCK.MACQUIRE on the keys' master.
    const redlock = new Redlock([client], { retryCount: 0 });
    const held = await redlock.acquire(['{order:7}:a', '{order:7}:b'], 5000);
    assert.equal(await send(masterOf('{order:7}:a'), 'LOCK.FENCE', '{order:7}:b'), held.tokens[0][1]);
    await held.release();
    assert.equal(await send(masterOf('{order:7}:a'), 'EXISTS', '{order:7}:a', '{order:7}:b'), 0);
  });
}

for (const kind of KINDS) {
  test(`${kind} Cluster: the feed, a session and an election live on the key master`, async (t) => {
    const { client, masterOf } = await connectCluster(t, kind);
    // Keys with a hash tag, without one, and with braces that are not a tag, on different masters.
    for (const key of ['alpha', '{user:1}:lock', 'a{}b', 'gamma']) {
      const node = masterOf(key);
      const lost = [];
      const lock = new Lock(client, key, 30000, { onLost: (_l, e) => lost.push(e.reason) });
      assert.equal(await lock.acquire(), true);
      await until('the feed to check the hold', () => lock._feedSub !== null && lock._feedSub.checked.size === 1);
      // The feed's two connections are on the key's master.
      const feed = feedFor(client, key);
      const list = String(await send(node, 'CLIENT', 'LIST'));
      assert.equal(list.split('\n').filter((l) => l.includes(` name=redislock-feed-sub-${feed.id} `)).length, 1);
      assert.equal(await send(node, 'DEL', key), 1);
      await until('the loss report', () => lost.length > 0);
      assert.deepEqual(lost, ['feed: deleted']);
    }

    const key = '{election}:leader';
    const node = masterOf(key);
    const session = await new Session(client, 30000, { bound: true, key }).open();
    assert.equal(typeof (await session.info()).bound, 'number');
    const election = new Election(client, key, { session });
    const changes = election.observe();
    t.after(() => changes.close());
    assert.deepEqual(await changes.get(5000), { leader: null, resync: true, seq: 0 });
    const leadership = await election.campaign('leader-1');
    assert.deepEqual(await changes.get(5000), { leader: { value: 'leader-1', term: leadership.term }, resync: false, seq: 1 });
    assert.deepEqual(await election.leader(), { value: 'leader-1', term: leadership.term });
    assert.equal(await send(node, 'PTTL', key), -1);
    assert.equal(await session.close(), 1);
    assert.deepEqual(await changes.get(5000), { leader: null, resync: false, seq: 2 });
    assert.equal(leadership.lost, false); // closed by its own session: no loss
  });
}

for (const kind of KINDS) {
  test(`${kind} Cluster: one default session per master, closed with the cluster client`, async (t) => {
    const { client, masters, masterOf } = await connectCluster(t, kind);
    // A plain client of each master, to look after the cluster client is closed.
    const plain = cluster.nodes.map((n) => new IORedis({ host: '127.0.0.1', port: n.port }));
    t.after(() => plain.forEach((c) => c.disconnect()));
    // Keys on every master: a lock made without `session` joins its master's default session.
    const keys = [];
    for (let i = 0; keys.length < 3 * 2 && i < 1000; i++) {
      const key = `def:${kind}:${i}`;
      const node = masterOf(key);
      if (keys.filter((k) => masterOf(k) === node).length < 2) keys.push(key);
    }
    const locks = keys.map((key) => new Lock(client, key, 30000));
    for (const lock of locks) assert.equal(await lock.acquire({ timeout: 0 }), true);
    const where = new Map(); // key -> the plain client of its master
    for (const key of keys) {
      const found = [];
      for (const c of plain) {
        const reply = await c.call('LOCK.INFO', key).catch((e) => (/^MOVED /.test(e.message) ? null : Promise.reject(e)));
        if (reply !== null) found.push(c);
      }
      assert.equal(found.length, 1);
      where.set(key, found[0]);
    }
    for (const node of masters()) {
      const mine = locks.filter((lock) => masterOf(lock.name) === node);
      assert.equal(mine.length, 2);
      assert.equal(mine[0].session, mine[1].session); // one per master
      const holder = (await info(node, mine[0].name)).holders[0];
      assert.equal(Number(holder[holder.indexOf('session') + 1]), mine[0].session.serial);
      const list = String(await send(node, 'CLIENT', 'LIST'));
      assert.equal(list.split('\n').filter((l) => l.includes(` name=redislock-session-${mine[0].session.serial} `)).length, 1);
    }
    assert.equal(new Set(locks.map((lock) => lock.session)).size, 3);
    // Closing the cluster client closes each master's default session: every hold released.
    const ids = locks.map((lock) => [lock.session.id, where.get(lock.name)]);
    if (ioredisOf(kind)) await client.quit();
    else await client.disconnect();
    for (const [id, c] of ids) {
      await until('the session closed', async () => (await c.call('LOCK.SESSION', 'INFO', id)) === null);
    }
    for (const key of keys) assert.equal(await where.get(key).call('LOCK.INFO', key), null);
  });
}
