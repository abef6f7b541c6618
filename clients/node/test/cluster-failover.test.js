'use strict';
// The client follows a 3+3 cluster through failovers (issue 34), with an ioredis Cluster: a
// planned CLUSTER FAILOVER of the shard, and a killed master whose replica is promoted (CLUSTER
// FAILOVER FORCE). Holds kept with their tokens, sessions (bound or not) renewed on the new
// master, a queued waiter granted without the caller sending again, no loss reported; with
// `durable: 1` nothing acknowledged is lost. The change feed follows too: the server's unasked
// `sunsubscribe` (planned) or the lost connection (killed master) moves each hold and observer to
// the key's new master, where LOCK.INFO is read again: an observer reports that state
// (`resync: true`), a hold is lost only if the new master lacks its token. Every wait is on
// observable state with a deadline. The cluster client and the looks at one node are
// test/failover-helpers.js's, shared with the node-redis failover tests.

const test = require('node:test');
const assert = require('node:assert/strict');
const IORedis = require('ioredis');
const { ioredisOf } = require('./clients');
const { startCluster, until } = require('./harness');
const { PATIENCE, node, role, shardOf, feedChannels, waiters, calls, tokens, attached, connect: connectTo } = require('./failover-helpers');
const { Lock, Session, Election, watch } = require('..');

let cluster;
test.before(async () => {
  cluster = await startCluster(['--masters', '3', '--replicas', '1']);
});
test.after(() => cluster.stop());

/** The next change of `observation` that is not `skip(change)`, within PATIENCE. */
async function nextChange(observation, skip = () => false) {
  for (;;) {
    const change = await observation.get(PATIENCE);
    if (!skip(change)) return change;
  }
}

const connect = (t, lib = IORedis) => connectTo(t, cluster, lib);

test('a planned CLUSTER FAILOVER keeps holds, sessions and waiters (ioredis Cluster)', async (t) => {
  const client = await connect(t);
  const tag = '{fo-node-planned}';
  const { master: oldPort, replica: newPort } = await shardOf(cluster, client, tag);
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
  await until('the waiter queued', async () => (await waiters(old, tag + 'busy')) === 1);

  const keepalives = await calls(fresh, 'lock.session|keepalive');
  assert.equal(await fresh.call('CLUSTER', 'FAILOVER'), 'OK');
  await until('the replica promoted', async () => ((await role(newPort)) || [])[0] === 'master', PATIENCE);
  await until('keepalives on the new master', async () => (await calls(fresh, 'lock.session|keepalive')) >= keepalives + 4, PATIENCE);
  await until('an extend on the new master', async () => (await calls(fresh, 'lock.extend')) >= 2, PATIENCE);
  await until('the bound session attached there', () => attached(fresh, bound.id), PATIENCE);
  for (const lock of [plain, inUnbound, inBound]) {
    assert.deepEqual(await tokens(fresh, lock.name), [String(lock.token)], lock.name);
  }
  assert.deepEqual(lost, []);

  await until('the waiter queued again on the new master', async () => (await waiters(fresh, tag + 'busy')) === 1, PATIENCE);
  assert.equal(await holder.release(), true);
  assert.equal(await granted, true);
  assert.deepEqual(await tokens(fresh, tag + 'busy'), [String(waiter.token)]);

  for (const lock of [plain, inUnbound, inBound, waiter]) assert.equal(await lock.release(), true);
  assert.equal(await unbound.close(), 0);
  assert.equal(await bound.close(), 0);
  assert.deepEqual(lost, []);
});

// ioredis 5 reports the server's unasked `sunsubscribe` as an 'error', ioredis 6 as 'moved'.
// Each test of this file fails over a shard of its own (the tags' slots: {fo-node-planned} 10418,
// {fo-node-feed-3} 2515, {fo-node-feed6-0} 16088, on the harness's three even slot ranges), the
// killed master's test the one failed over first: a shard failed over again seconds later was
// seen not to complete its CLUSTER FAILOVER within 30 s.
for (const [kind, tag] of [['ioredis', '{fo-node-feed-3}'], ['ioredis@6', '{fo-node-feed6-0}']]) test(`the change feed follows a planned CLUSTER FAILOVER: observers, watch() and onLost (${kind} Cluster)`, async (t) => {
  const client = await connect(t, ioredisOf(kind));
  const { master: oldPort, replica: newPort } = await shardOf(cluster, client, tag);
  const old = node(t, oldPort);
  const fresh = node(t, newPort);
  const lost = [];
  const report = (what) => (x) => lost.push([what, x.lostReason]);

  const name = tag + 'leader';
  const a = await new Election(client, name).campaign('a', { onLost: report('a') });
  const observation = new Election(client, name).observe();
  t.after(() => observation.close());
  const first = await observation.get(PATIENCE);
  assert.deepEqual([first.leader, first.resync], [{ value: 'a', term: a.term }, true]);
  let b = null;
  let resigned = false;
  const campaign = new Election(client, name).campaign('b', { timeout: 240000, onLost: report('b') }).then((l) => {
    // Never two leaders: b is granted only once a has stepped down.
    assert.equal(resigned, true, 'b leads while a has not resigned');
    b = l;
    return l;
  });
  await until('b queued', async () => (await waiters(old, name)) === 1);

  const watched = tag + 'watched';
  const changes = watch(client, watched);
  t.after(() => changes.close());
  const start = await changes.get(PATIENCE);
  assert.deepEqual([start.leader, start.resync], [null, true]);
  const held = new Lock(client, tag + 'held', 3000, { watchdog: true, onLost: report('held') });
  assert.equal(await held.acquire(), true);
  await until('three feed channels on the old master', async () => (await feedChannels(old)).length === 3);
  const channels = await feedChannels(old);

  assert.equal(await fresh.call('CLUSTER', 'FAILOVER'), 'OK');
  await until('the replica promoted', async () => ((await role(newPort)) || [])[0] === 'master', PATIENCE);
  await until('the feed subscribed on the new master', async () => {
    return JSON.stringify(await feedChannels(fresh)) === JSON.stringify(channels);
  }, PATIENCE);

  // The resynchronisations: the same states, read on the new master (whose seq starts at 0).
  const again = await observation.get(PATIENCE);
  assert.deepEqual(again.leader, { value: 'a', term: a.term });
  assert.equal(again.resync, true);
  const none = await changes.get(PATIENCE);
  assert.deepEqual([none.leader, none.resync], [null, true]);

  // watch() goes on with the new master's changes.
  const other = new Lock(client, watched, 60000);
  assert.equal(await other.acquire(), true);
  const taken = await changes.get(PATIENCE);
  assert.deepEqual([taken.leader, taken.resync], [{ value: other.owner, term: other.token }, false]);
  assert.equal(await other.release(), true);
  const freed = await changes.get(PATIENCE);
  assert.deepEqual([freed.leader, freed.resync], [null, false]);

  // The waiting candidate re-queued on the new master; a resigns there, b leads, the observer sees it.
  await until('b queued on the new master', async () => (await waiters(fresh, name)) === 1, PATIENCE);
  assert.equal(a.lost, false);
  resigned = true;
  assert.equal(await a.resign(), true);
  await campaign;
  assert.ok(b.term > a.term);
  const next = await nextChange(observation, (c) => c.leader === null);
  assert.deepEqual(next.leader, { value: 'b', term: b.term });

  assert.equal(await held.extend(), true);
  assert.deepEqual(await tokens(fresh, held.name), [String(held.token)]);
  assert.deepEqual(lost, []);
  assert.equal(await held.release(), true);
  assert.equal(await b.resign(), true);
  assert.deepEqual(lost, []);
});

test('a killed master loses no durable grant; sessions, renewals and the feed follow (ioredis Cluster)', async (t) => {
  const client = await connect(t);
  const tag = '{fo-node-killed-3}'; // slot 8089: the shard of {fo-node-planned}
  const { master: oldPort, replica: newPort } = await shardOf(cluster, client, tag);
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
  // The watchdog hold watches its key through the feed (onLost, feed on by default).
  const dog = new Lock(client, tag + 'dog', 30000, {
    watchdog: true, watchdogPeriod: 1000, durable: 1, onLost: (l) => lost.push(l.lostReason),
  });
  assert.equal(await dog.acquire(), true);
  const leader = await new Election(client, tag + 'leader', { ttl: 30000 }).campaign('a', {
    onLost: (l) => lost.push(l.lostReason),
  });
  const observation = new Election(client, tag + 'leader').observe();
  t.after(() => observation.close());
  const first = await observation.get(PATIENCE);
  assert.deepEqual([first.leader, first.resync], [{ value: 'a', term: leader.term }, true]);
  const old = node(t, oldPort);
  await until('two feed channels on the master', async () => (await feedChannels(old)).length === 2);
  const channels = await feedChannels(old);
  old.disconnect();

  // SIGKILL; the cluster itself promotes the replica (cluster-node-timeout 5 s in the harness).
  const pid = cluster.nodes.find((n) => n.port === oldPort).pid;
  process.kill(pid, 'SIGKILL');
  await until('the master dead', async () => (await role(oldPort)) === null, 10000);
  await until('the replica promoted by the cluster', async () => ((await role(newPort)) || [])[0] === 'master', PATIENCE);

  for (const lock of [...locks, inSession, dog, leader.lock]) {
    assert.deepEqual(await tokens(fresh, lock.name), [String(lock.token)], lock.name);
  }
  await until('a keepalive on the new master', async () => (await calls(fresh, 'lock.session|keepalive')) >= 1, PATIENCE);
  await until('a renewal on the new master', async () => (await calls(fresh, 'lock.extend')) >= 1, PATIENCE);
  await until('the feed subscribed on the new master', async () => {
    return JSON.stringify(await feedChannels(fresh)) === JSON.stringify(channels);
  }, PATIENCE);
  const again = await observation.get(PATIENCE);
  assert.deepEqual([again.leader, again.resync], [{ value: 'a', term: leader.term }, true]);
  assert.deepEqual(lost, []);
  assert.equal(await leader.resign(), true);
  const none = await observation.get(PATIENCE);
  assert.deepEqual([none.leader, none.resync], [null, false]);
  assert.equal(await dog.release(), true);
  assert.equal(await session.close(), 1);
  for (const lock of locks) assert.equal(await lock.release(), true);
});
