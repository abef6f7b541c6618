'use strict';
// An ioredis Cluster: commands routed by key, a wait on a connection to the key's master only.

const test = require('node:test');
const assert = require('node:assert/strict');
const IORedis = require('ioredis');
const { startCluster } = require('./harness');
const { Lock, MultiLock, Session, Election } = require('..');
const { feedFor } = require('../lib/feed');
const { slotOf } = require('../lib/slot');

let cluster;
test.before(async () => {
  cluster = await startCluster(['--masters', '3', '--replicas', '0']);
});
test.after(() => cluster.stop());

test('ioredis Cluster: acquire, a wait on the key master, abort, MultiLock with one hash tag', async (t) => {
  const client = new IORedis.Cluster(cluster.nodes.map((n) => ({ host: '127.0.0.1', port: n.port })));
  t.after(() => client.disconnect());
  await new Promise((resolve) => client.once('ready', resolve));
  // Waiter connections (named redislock-waiter) per master, once none is still closing.
  const waitersOn = async (expected) => {
    const deadline = Date.now() + 5000;
    for (;;) {
      const counts = [];
      for (const node of client.nodes('master')) {
        counts.push((String(await node.call('CLIENT', 'LIST')).match(/name=redislock-waiter /g) || []).length);
      }
      if (JSON.stringify(counts) === JSON.stringify(expected) || Date.now() > deadline) return counts;
      await new Promise((r) => setTimeout(r, 10));
    }
  };

  for (const key of ['alpha', 'beta', 'gamma', 'delta']) {
    const holder = new Lock(client, key, 30000);
    assert.equal(await holder.acquire({ timeout: 0 }), true);
    const waiter = new Lock(client, key, 30000);
    const got = waiter.acquire({ timeout: 10000 });
    const node = client.nodes('master').find((n) => `${n.options.host}:${n.options.port}` === client.slots[slotOf(key)][0]);
    for (;;) {
      const info = await node.call('LOCK.INFO', key);
      if (info[7] === 1) break;
      await new Promise((r) => setTimeout(r, 5));
    }
    // One waiter connection, on the key's master only.
    const expected = client.nodes('master').map((n) => (n === node ? 1 : 0));
    assert.deepEqual(await waitersOn(expected), expected);
    assert.equal(await holder.release(), true);
    assert.equal(await got, true);
    assert.equal(await node.call('LOCK.FENCE', key), waiter.token);
    assert.equal(await waiter.release(), true);

    // Abort: no grant left behind.
    await holder.acquire();
    const controller = new AbortController();
    const aborted = new Lock(client, key, 30000).acquire({ signal: controller.signal });
    for (;;) {
      const info = await node.call('LOCK.INFO', key);
      if (info[7] === 1) break;
      await new Promise((r) => setTimeout(r, 5));
    }
    controller.abort();
    await assert.rejects(aborted, { name: 'AbortError' });
    assert.equal(await holder.release(), true);
    assert.equal(await node.call('LOCK.INFO', key), null);
  }

  const m = new MultiLock(client, ['{order:7}:a', '{order:7}:b'], 30000);
  assert.equal(await m.acquire(), true);
  assert.equal(m.tokens.length, 2);
  assert.equal(await m.release(), true);
});

test('ioredis Cluster: the feed, a session and an election live on the key master', async (t) => {
  const client = new IORedis.Cluster(cluster.nodes.map((n) => ({ host: '127.0.0.1', port: n.port })));
  t.after(() => client.disconnect());
  await new Promise((resolve) => client.once('ready', resolve));
  const masterOf = (key) => client.nodes('master').find((n) => `${n.options.host}:${n.options.port}` === client.slots[slotOf(key)][0]);
  const until = async (what, fn) => {
    const deadline = Date.now() + 10000;
    for (;;) {
      const v = await fn();
      if (v) return v;
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
      await new Promise((r) => setTimeout(r, 5));
    }
  };
  // Keys with a hash tag, without one, and with braces that are not a tag, on different masters.
  for (const key of ['alpha', '{user:1}:lock', 'a{}b', 'gamma']) {
    const node = masterOf(key);
    const lost = [];
    const lock = new Lock(client, key, 30000, { onLost: (_l, e) => lost.push(e.reason) });
    assert.equal(await lock.acquire(), true);
    await until('the feed to check the hold', () => lock._feedSub !== null && lock._feedSub.checked.size === 1);
    // The feed's two connections are on the key's master.
    const feed = feedFor(client, key);
    const list = String(await node.call('CLIENT', 'LIST'));
    assert.equal(list.split('\n').filter((l) => l.includes(` name=redislock-feed-sub-${feed.id} `)).length, 1);
    assert.equal(await node.call('DEL', key), 1);
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
  assert.deepEqual(await changes.next(5000), { leader: null, resync: true, seq: 0 });
  const leadership = await election.campaign('leader-1');
  assert.deepEqual(await changes.next(5000), { leader: { value: 'leader-1', term: leadership.term }, resync: false, seq: 1 });
  assert.deepEqual(await election.leader(), { value: 'leader-1', term: leadership.term });
  assert.equal(await node.call('PTTL', key), -1);
  assert.equal(await session.close(), 1);
  assert.deepEqual(await changes.next(5000), { leader: null, resync: false, seq: 2 });
  assert.equal(leadership.lost, false); // closed by its own session: no loss
});
