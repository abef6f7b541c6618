'use strict';
// An ioredis Cluster: commands routed by key, a wait on a connection to the key's master only.

const test = require('node:test');
const assert = require('node:assert/strict');
const IORedis = require('ioredis');
const { startCluster } = require('./harness');
const { Lock, MultiLock } = require('..');
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
