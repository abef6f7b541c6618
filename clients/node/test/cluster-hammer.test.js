'use strict';
// Refused acquires hammered through cluster clients leave no grant behind (issue 28): every
// command with a key goes to that key's master, so a Redlock round's LOCK.MRELEASE can no longer
// overtake its own LOCK.MACQUIRE (ioredis sent module commands to a random master and followed
// the MOVED: on main, grants were left held for their whole ttl with no owner).

const test = require('node:test');
const assert = require('node:assert/strict');
const IORedis = require('ioredis');
const redis5 = require('redis');
const redis4 = require('redis4');
const { startCluster, info } = require('./harness');
const { KINDS, ioredisOf, send } = require('./clients');
const { Lock } = require('..');
const Redlock = require('../redlock');
const { slotOf } = require('../lib/slot');

let cluster;
test.before(async () => {
  cluster = await startCluster(['--masters', '3', '--replicas', '0']);
});
test.after(() => cluster.stop());

async function clusterClient(t, kind) {
  const roots = cluster.nodes.map((n) => ({ host: '127.0.0.1', port: n.port }));
  if (ioredisOf(kind)) {
    const client = new (ioredisOf(kind).Cluster)(roots);
    t.after(() => client.disconnect());
    await new Promise((resolve) => client.once('ready', resolve));
    return { client, masterOf: (key) => client.nodes('master').find((n) => `${n.options.host}:${n.options.port}` === client.slots[slotOf(key)][0]) };
  }
  const lib = kind === 'node-redis@5' ? redis5 : redis4;
  const client = lib.createCluster({ rootNodes: roots.map((socket) => ({ socket })) });
  client.on('error', () => {});
  await client.connect();
  t.after(() => client.disconnect().catch(() => {}));
  return { client, masterOf: (key) => client.nodeClient(client.getSlotMaster(slotOf(key))) };
}

const TTL = 60000; // a grant left behind stays until the end of the test
const ROUNDS = 150; // tries per worker

for (const kind of KINDS) {
  test(`${kind} Cluster: refused acquires hammered leave no grant behind`, async (t) => {
    // Three cluster clients of the one cluster: a Redlock over them runs rounds (quorum 2 of 3)
    // that release as soon as two refused, while the third LOCK.MACQUIRE may be in flight.
    const conns = [];
    for (let i = 0; i < 3; i++) conns.push(await clusterClient(t, kind));
    const { masterOf } = conns[0];
    const keys = Array.from({ length: 6 }, (_, i) => `hammer:${kind}:${process.pid}:${i}`);
    assert.ok(new Set(keys.map((k) => masterOf(k))).size > 1, 'the keys are spread over masters');

    const counts = { tries: 0, granted: 0, refused: 0 };
    const pick = () => keys[Math.floor(Math.random() * keys.length)];
    const holdBriefly = () => new Promise((r) => setImmediate(r));
    const workers = [];
    // Redlock rounds over the three clients, no retries.
    for (let w = 0; w < 3; w++) {
      const redlock = new Redlock(conns.map((c) => c.client), { retryCount: 0 });
      workers.push(async () => {
        for (let i = 0; i < ROUNDS; i++) {
          counts.tries++;
          try {
            const lock = await redlock.acquire([pick()], TTL);
            counts.granted++;
            await holdBriefly();
            // One of the three (the first to arrive) releases it and the others answer 0: no
            // quorum, so release() rejects. The key is free all the same (checked at the end).
            await lock.release().catch(() => {});
            continue;
          } catch (e) {
            if (!(e instanceof Redlock.ExecutionError)) throw e;
            counts.refused++;
          }
        }
      });
    }
    // The drop-in on one cluster client (a short BLOCK in the queue) and the Lock class.
    for (let w = 0; w < 3; w++) {
      const { client } = conns[w];
      const redlock = new Redlock([client], { retryCount: 1, retryDelay: 3, retryJitter: 0 });
      workers.push(async () => {
        for (let i = 0; i < ROUNDS; i++) {
          counts.tries++;
          const key = pick();
          if (i % 2 === 0) {
            try {
              const lock = await redlock.acquire([key], TTL);
              counts.granted++;
              await holdBriefly();
              await lock.release();
            } catch (e) {
              if (!(e instanceof Redlock.ExecutionError)) throw e;
              counts.refused++;
            }
          } else {
            const lock = new Lock(client, key, TTL);
            if (await lock.acquire({ timeout: 3 })) {
              counts.granted++;
              await holdBriefly();
              assert.equal(await lock.release(), true);
            } else {
              counts.refused++;
            }
          }
        }
      });
    }
    await Promise.all(workers.map((w) => w()));
    assert.equal(counts.tries, 6 * ROUNDS);
    assert.equal(counts.granted + counts.refused, counts.tries, JSON.stringify(counts));
    assert.ok(counts.refused > 0 && counts.granted > 0, JSON.stringify(counts));

    // Every key free on its master: no grant outlived its release.
    const left = [];
    for (const key of keys) {
      const state = await info(masterOf(key), key);
      if (state !== null) left.push({ key, state });
    }
    assert.deepEqual(left, [], `${left.length} of ${keys.length} keys still held (${JSON.stringify(counts)})`);
  });
}

/** The cluster's own client of each master, and its node id. */
async function mastersWithIds(client) {
  const out = [];
  for (const node of client.nodes('master')) {
    out.push({ node, address: `${node.options.host}:${node.options.port}`, id: await node.call('CLUSTER', 'MYID') });
  }
  return out;
}

test('ioredis Cluster: ASK and MOVED are followed by Lock, and a Redlock round takes a MOVED as a vote against', async (t) => {
  const { client } = await clusterClient(t, 'ioredis');
  const key = `{moving-${process.pid}}:lock`;
  const slot = slotOf(key);
  const masters = await mastersWithIds(client);
  const source = masters.find((m) => m.address === client.slots[slot][0]);
  const target = masters.find((m) => m !== source);

  // The slot migrating: the key is not on the source, which answers ASK; the Lock follows it
  // (ASKING, then the command, on the target's connection).
  await target.node.call('CLUSTER', 'SETSLOT', slot, 'IMPORTING', source.id);
  await source.node.call('CLUSTER', 'SETSLOT', slot, 'MIGRATING', target.id);
  // A ttl-only hold (session: null): a session lives on one node, so a hold in the default
  // session (opened on the slot's owner in the client's table, the source) cannot follow an ASK to
  // the importing node, which answers "no such session" (README, the default session).
  const lock = new Lock(client, key, 30000, { session: null });
  assert.equal(await lock.acquire({ timeout: 0 }), true);
  target.node.call('ASKING');
  assert.equal(await target.node.call('LOCK.FENCE', key), lock.token);
  assert.equal(await lock.release(), true);

  // The slot moved to the target; the client's slot table still names the source (as it would
  // until its next refresh): the source answers MOVED and the Lock follows it.
  for (const m of [target, source, ...masters.filter((x) => x !== source && x !== target)]) {
    await m.node.call('CLUSTER', 'SETSLOT', slot, 'NODE', target.id);
  }
  client.slots[slot] = [source.address];
  assert.equal(await lock.acquire({ timeout: 0 }), true);
  assert.equal(client.slots[slot][0], target.address); // refreshed
  assert.equal(await target.node.call('LOCK.FENCE', key), lock.token);
  assert.equal(await lock.release(), true);
  // The same in the default session: the MOVED is followed, and the table then names the target.
  client.slots[slot] = [source.address];
  const inSession = new Lock(client, key, 30000);
  assert.equal(await inSession.acquire({ timeout: 0 }), true);
  assert.equal(client.slots[slot][0], target.address);
  const holder = await target.node.call('LOCK.INFO', key);
  const fields = holder[holder.indexOf('holders') + 1][0];
  assert.equal(Number(fields[fields.indexOf('session') + 1]), inSession.session.serial);
  assert.equal(await inSession.release(), true);

  // A Redlock round (three cluster clients of this cluster) does not send its LOCK.MACQUIRE
  // again after a MOVED: a vote against, and the next try goes to the right master.
  const others = [client, (await clusterClient(t, 'ioredis')).client, (await clusterClient(t, 'ioredis')).client];
  for (const c of others) c.slots[slot] = [source.address];
  const redlock = new Redlock(others, { retryCount: 0 });
  const refused = await redlock.acquire([key], 30000).then(() => null, (e) => e);
  assert.ok(refused instanceof Redlock.ExecutionError, String(refused));
  const votes = [...(await refused.attempts[0]).votesAgainst.values()];
  assert.ok(votes.length >= 2 && votes.every((v) => /^MOVED /.test(v.message)), votes.join());
  assert.equal(await target.node.call('EXISTS', key), 0);
  const held = await redlock.acquire([key], 30000);
  // (A member whose vote came after the quorum has no token.)
  assert.equal(await target.node.call('LOCK.FENCE', key), held.tokens.find((x) => x !== null)[0]);
  await held.release().catch(() => {}); // one of the three releases it (see above)
  assert.equal(await target.node.call('EXISTS', key), 0);
});

test('ioredis Cluster: a Lock used before the cluster client is ready waits for it, as cluster.call() queues', async (t) => {
  const roots = cluster.nodes.map((n) => ({ host: '127.0.0.1', port: n.port }));
  for (const lazyConnect of [false, true]) {
    const client = new IORedis.Cluster(roots, { lazyConnect });
    t.after(() => client.disconnect());
    assert.notEqual(client.status, 'ready');
    const lock = new Lock(client, `early:${lazyConnect}:${process.pid}`, 30000);
    assert.equal(await lock.acquire({ timeout: 0 }), true);
    assert.equal(await lock.release(), true);
  }
});
