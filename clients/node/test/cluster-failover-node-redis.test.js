'use strict';
// Sessions and keepalives follow a planned CLUSTER FAILOVER with a node-redis cluster client
// (`createCluster`, node-redis 5 and 4; issue 34), on a 3+3 cluster of this file's own (a shard
// failed over twice within seconds was seen not to complete its second failover, so each test
// here fails over a shard of its own): holds of an unbound and a bound session and a watchdog
// hold kept with their tokens on the new master, renewed there, no loss reported; a queued waiter
// queued again on the new master and granted there without the caller sending again; the feed
// (node-redis's 'sharded-channel-moved' for the server's unasked sunsubscribe) moved to the new
// master: an election observer's resync there, then its next change.
// test/cluster-killed-node-redis.test.js: a killed master; test/cluster-failover.test.js does the
// same and more with an ioredis Cluster.

const test = require('node:test');
const assert = require('node:assert/strict');
const redis5 = require('redis');
const redis4 = require('redis4');
const { startCluster, until } = require('./harness');
const { PATIENCE, node, role, shardOf, feedChannels, waiters, calls, tokens, attached, connect: connectTo } = require('./failover-helpers');
const { Lock, Session, Election } = require('..');

let cluster;
test.before(async () => {
  cluster = await startCluster(['--masters', '3', '--replicas', '1']);
});
test.after(() => cluster.stop());

const connect = (t, lib) => connectTo(t, cluster, lib);

// The tags' slots: {fo-nr5} 10419 and {fo-nr4-1} 14607, on two of the harness's three even ranges.
for (const [kind, lib, tag] of [['node-redis@5', redis5, '{fo-nr5}'], ['node-redis@4', redis4, '{fo-nr4-1}']]) {
  test(`a planned CLUSTER FAILOVER keeps sessions, renewals, a waiter and the feed (${kind} createCluster)`, async (t) => {
    const client = await connect(t, lib);
    const { master: oldPort, replica: newPort } = await shardOf(cluster, client, tag);
    const fresh = node(t, newPort);
    const lost = [];
    const report = (what) => (x) => lost.push([what, x.lostReason]);

    // Watched through the feed (onLost): reported lost only if the new master lacks it.
    const plain = new Lock(client, tag + 'plain', 3000, { watchdog: true, onLost: report('plain') });
    assert.equal(await plain.acquire(), true);
    const leader = await new Election(client, tag + 'leader').campaign('a', { onLost: report('leader') });
    const observation = new Election(client, tag + 'leader').observe();
    t.after(() => observation.close());
    const first = await observation.get(PATIENCE);
    assert.deepEqual([first.leader, first.resync], [{ value: 'a', term: leader.term }, true]);
    const unbound = await new Session(client, 3000, { key: tag, onLost: report('unbound') }).open();
    const inUnbound = new Lock(client, tag + 's1', 0, { session: unbound, feed: false });
    assert.equal(await inUnbound.acquire(), true);
    const bound = await new Session(client, 3000, { key: tag, bound: true, onLost: report('bound') }).open();
    const inBound = new Lock(client, tag + 's2', 0, { session: bound, feed: false });
    assert.equal(await inBound.acquire(), true);

    // A bound session alone on a cluster client of its own: nothing else meets the MOVED that
    // makes node-redis read its slot table again (its re-attach has to).
    const loneClient = await connect(t, lib);
    const lone = await new Session(loneClient, 3000, { key: tag, bound: true, onLost: report('lone') }).open();
    const inLone = new Lock(loneClient, tag + 's3', 0, { session: lone, feed: false });
    assert.equal(await inLone.acquire(), true);
    const holder = new Lock(client, tag + 'busy', 60000);
    assert.equal(await holder.acquire(), true);
    const waiter = new Lock(client, tag + 'busy', 60000);
    const granted = waiter.acquire({ timeout: PATIENCE });
    const old = node(t, oldPort);
    await until('the waiter queued', async () => (await waiters(old, tag + 'busy')) === 1);
    await until('two feed channels on the old master', async () => (await feedChannels(old)).length === 2);
    const channels = await feedChannels(old);

    const keepalives = await calls(fresh, 'lock.session|keepalive');
    assert.equal(await fresh.call('CLUSTER', 'FAILOVER'), 'OK');
    await until('the replica promoted', async () => ((await role(newPort)) || [])[0] === 'master', PATIENCE);
    await until('keepalives on the new master', async () => (await calls(fresh, 'lock.session|keepalive')) >= keepalives + 4, PATIENCE);
    await until('an extend on the new master', async () => (await calls(fresh, 'lock.extend')) >= 2, PATIENCE);
    for (const session of [bound, lone]) {
      await until('the bound session attached there', () => attached(fresh, session.id), PATIENCE);
    }
    for (const lock of [plain, inUnbound, inBound, inLone]) {
      assert.deepEqual(await tokens(fresh, lock.name), [String(lock.token)], lock.name);
    }
    await until('the feed subscribed on the new master', async () => {
      return JSON.stringify(await feedChannels(fresh)) === JSON.stringify(channels);
    }, PATIENCE);
    const again = await observation.get(PATIENCE);
    assert.deepEqual([again.leader, again.resync], [{ value: 'a', term: leader.term }, true]);
    assert.equal(await leader.resign(), true);
    const none = await observation.get(PATIENCE);
    assert.deepEqual([none.leader, none.resync], [null, false]);
    assert.deepEqual(lost, []);

    await until('the waiter queued again on the new master', async () => (await waiters(fresh, tag + 'busy')) === 1, PATIENCE);
    assert.equal(await holder.release(), true);
    assert.equal(await granted, true);
    assert.deepEqual(await tokens(fresh, tag + 'busy'), [String(waiter.token)]);

    for (const lock of [plain, inUnbound, inBound, inLone, waiter]) assert.equal(await lock.release(), true);
    assert.equal(await unbound.close(), 0);
    assert.equal(await bound.close(), 0);
    assert.equal(await lone.close(), 0);
    assert.deepEqual(lost, []);
  });
}
