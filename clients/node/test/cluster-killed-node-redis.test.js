'use strict';
// A killed master followed with a node-redis cluster client (`createCluster`, node-redis 5 and 4;
// issue 34), on a 3+3 cluster of this file's own, each test killing the master of a shard of its
// own: SIGKILL, then the replica promoted by the cluster itself (cluster-node-timeout 5 s in the
// harness). What test/cluster-failover.test.js asserts for an ioredis Cluster: 22 `durable: 1`
// grants kept with their tokens on the new master and released there, an unbound session's
// keepalives and a watchdog's renewals there, no loss reported, the feed subscribed there and an
// election observer's resync, then its next change. And more: the default session and a bound
// session re-attached on the new master, a waiter queued on the killed node granted on the new
// master without the caller sending again.
//
// node-redis reads its slot table again only when one of its own commands meets MOVED, and queues
// commands for a dead node until it comes back: the client asks a live master where the slot is
// now and makes node-redis read its table (lib/adapter.js, NodeRedisClusterAdapter.refresh).
// Until the cluster has promoted the replica, a command of the caller's own for that slot is
// refused at once with "redislock: the connection to HOST:PORT ... is lost".
// test/cluster-failover-node-redis.test.js: a planned CLUSTER FAILOVER.

const test = require('node:test');
const assert = require('node:assert/strict');
const redis5 = require('redis');
const redis4 = require('redis4');
const { startCluster, until } = require('./harness');
const { PATIENCE, node, role, shardOf, feedChannels, waiters, calls, tokens, attached, connect } = require('./failover-helpers');
const { Lock, Session, Election } = require('..');
const { slotOf } = require('../lib/slot');

let cluster;
test.before(async () => {
  cluster = await startCluster(['--masters', '3', '--replicas', '1']);
});
test.after(() => cluster.stop());

// The tags' slots: {kill-nr5-1} 3499 and {kill-nr4-3} 6873, on two of the harness's three even ranges.
for (const [kind, lib, tag] of [['node-redis@5', redis5, '{kill-nr5-1}'], ['node-redis@4', redis4, '{kill-nr4-3}']]) {
  test(`a killed master loses no durable grant; sessions, a waiter and the feed follow (${kind} createCluster)`, async (t) => {
    const client = await connect(t, cluster, lib);
    const { master: oldPort, replica: newPort } = await shardOf(cluster, client, tag);
    const fresh = node(t, newPort);
    const lost = [];
    const report = (what) => (x) => lost.push([what, x.lostReason]);

    // 20 grants in the client's default session (bound, ttl 10 s), each waited for by a replica.
    const locks = [];
    for (let i = 0; i < 20; i++) {
      const lock = new Lock(client, `${tag}d${i}`, 60000, { durable: 1 });
      assert.equal(await lock.acquire(), true);
      locks.push(lock);
    }
    const unbound = await new Session(client, 30000, { key: tag, onLost: report('unbound') }).open();
    const inUnbound = new Lock(client, tag + 's1', 0, { session: unbound, durable: 1, feed: false });
    assert.equal(await inUnbound.acquire(), true);
    const bound = await new Session(client, 30000, { key: tag, bound: true, onLost: report('bound') }).open();
    const inBound = new Lock(client, tag + 's2', 0, { session: bound, durable: 1, feed: false });
    assert.equal(await inBound.acquire(), true);
    // The watchdog hold watches its key through the feed (onLost, feed on by default).
    const dog = new Lock(client, tag + 'dog', 30000, { watchdog: true, watchdogPeriod: 1000, durable: 1, onLost: report('dog') });
    assert.equal(await dog.acquire(), true);
    const leader = await new Election(client, tag + 'leader', { ttl: 30000 }).campaign('a', { onLost: report('leader') });
    const observation = new Election(client, tag + 'leader').observe();
    t.after(() => observation.close());
    const first = await observation.get(PATIENCE);
    assert.deepEqual([first.leader, first.resync], [{ value: 'a', term: leader.term }, true]);

    const holder = new Lock(client, tag + 'busy', 60000, { durable: 1 });
    assert.equal(await holder.acquire(), true);
    const waiter = new Lock(client, tag + 'busy', 60000);
    const granted = waiter.acquire({ timeout: 2 * PATIENCE });
    const old = node(t, oldPort);
    await until('the waiter queued', async () => (await waiters(old, tag + 'busy')) === 1);
    await until('two feed channels on the master', async () => (await feedChannels(old)).length === 2);
    const channels = await feedChannels(old);
    const defaultSession = locks[0].session;
    assert.ok(locks.every((l) => l.session === defaultSession) && holder.session === defaultSession);
    const keepalives = await calls(fresh, 'lock.session|keepalive');
    const extends_ = await calls(fresh, 'lock.extend');
    old.disconnect();

    // SIGKILL; the cluster itself promotes the replica.
    process.kill(cluster.nodes.find((n) => n.port === oldPort).pid, 'SIGKILL');
    await until('the master dead', async () => (await role(oldPort)) === null, 10000);
    // Until the cluster promotes the replica (not before cluster-node-timeout), a command of the
    // caller's own is refused at once, where node-redis would queue it for the dead node, once
    // node-redis has seen the connection close (before that it is written there and fails with
    // node-redis's "Socket closed unexpectedly").
    const deadNode = client.getSlotMaster(slotOf(tag));
    await until('node-redis reconnecting to the dead node', () => deadNode.client.isReady === false, 10000);
    await assert.rejects(holder.owned(), { message: new RegExp(`^redislock: the connection to 127\\.0\\.0\\.1:${oldPort}, the master of .* is lost`) });
    await until('the replica promoted by the cluster', async () => ((await role(newPort)) || [])[0] === 'master', PATIENCE);

    for (const lock of [...locks, inUnbound, inBound, dog, holder, leader.lock]) {
      assert.deepEqual(await tokens(fresh, lock.name), [String(lock.token)], lock.name);
    }
    await until('a keepalive on the new master', async () => (await calls(fresh, 'lock.session|keepalive')) > keepalives, PATIENCE);
    await until('a renewal on the new master', async () => (await calls(fresh, 'lock.extend')) > extends_, PATIENCE);
    for (const session of [defaultSession, bound]) {
      await until('the bound session attached on the new master', () => attached(fresh, session.id), PATIENCE);
    }
    await until('the feed subscribed on the new master', async () => {
      return JSON.stringify(await feedChannels(fresh)) === JSON.stringify(channels);
    }, PATIENCE);
    const again = await observation.get(PATIENCE);
    assert.deepEqual([again.leader, again.resync], [{ value: 'a', term: leader.term }, true]);
    assert.deepEqual(lost, []);
    assert.equal(await leader.resign(), true);
    const none = await observation.get(PATIENCE);
    assert.deepEqual([none.leader, none.resync], [null, false]);

    // The waiter's connection died with the node: it queued again on the new master by itself.
    await until('the waiter queued again on the new master', async () => (await waiters(fresh, tag + 'busy')) === 1, PATIENCE);
    assert.equal(await holder.owned(), true);
    assert.equal(await holder.release(), true);
    assert.equal(await granted, true);
    assert.deepEqual(await tokens(fresh, tag + 'busy'), [String(waiter.token)]);

    for (const lock of [...locks, dog, inBound, waiter]) assert.equal(await lock.release(), true, lock.name);
    assert.equal(await unbound.close(), 1);
    assert.equal(await bound.close(), 0);
    assert.deepEqual(lost, []);
  });
}
