'use strict';
// The node-redlock drop-in beyond its README: one server (LOCK.MACQUIRE, the retry window as one
// BLOCK in the FIFO queue) and several (quorum, release where granted, a master down).

const test = require('node:test');
const assert = require('node:assert/strict');
const { startServer, waiters } = require('./harness');
const { KINDS, connect, send, close } = require('./clients');
const Redlock = require('../redlock');
const { ExecutionError, ResourceLockedError } = Redlock;

const servers = [];
test.before(async () => {
  for (let i = 0; i < 3; i++) servers.push(await startServer());
});
test.after(() => Promise.all(servers.map((s) => s.stop())));

let n = 0;
const fresh = (what) => `${what}:${process.pid}:${++n}`;

for (const kind of KINDS) {
  test(`${kind}: one server`, async (t) => {
    const a = await connect(kind, servers[0].port);
    const b = await connect(kind, servers[0].port);
    t.after(async () => {
      await close(a);
      await close(b);
    });
    const key = fresh('rl');
    const first = new Redlock([a]);
    const second = new Redlock([b], { retryCount: 10, retryDelay: 200 });
    const lock = await first.acquire([key, `${key}:2`], 10000);
    assert.equal(lock.tokens.length, 1);
    assert.equal(await send(b, 'LOCK.FENCE', key), lock.tokens[0][0]);
    assert.equal(await send(b, 'LOCK.FENCE', `${key}:2`), lock.tokens[0][1]);

    // The second waits in the server's queue (one LOCK.MACQUIRE ... BLOCK 2000) and gets the
    // lock as soon as it is released, not at its next poll.
    const errors = [];
    second.on('error', (e) => errors.push(e));
    const waiting = second.acquire([key], 10000);
    await waiters(a, key, 1);
    await lock.release();
    const next = await waiting;
    assert.ok(next.tokens[0][0] > lock.tokens[0][0]);
    assert.deepEqual(errors, []);

    // Contended with no retries: ExecutionError, a ResourceLockedError event, nothing left.
    const impatient = new Redlock([a], { retryCount: 0 });
    const events = [];
    impatient.on('error', (e) => events.push(e));
    await assert.rejects(impatient.acquire([key], 1000), (e) => {
      assert.ok(e instanceof ExecutionError);
      assert.equal(e.message, 'The operation was unable to achieve a quorum during its retry window.');
      return true;
    });
    assert.equal(events.length, 1);
    assert.ok(events[0] instanceof ResourceLockedError);
    await next.release();
    assert.equal(await send(a, 'EXISTS', key), 0);

    // Extending an expired lock rejects (node-redlock #283 crashed there).
    const brief = await first.acquire([key], 200);
    brief.expiration = Date.now() - 1;
    await assert.rejects(brief.extend(1000), { message: 'Cannot extend an already-expired lock.' });
    await first.release(brief).catch(() => {});

    // v4 names.
    const v4 = await first.lock(key, 1000);
    await first.unlock(v4);
    assert.equal(await send(a, 'EXISTS', key), 0);
  });
}

test('three servers: quorum, one master stopped, using with auto-extension resolves', async (t) => {
  const clients = await Promise.all(servers.map((s) => connect('ioredis', s.port, { maxRetriesPerRequest: 0, commandTimeout: 300 })));
  t.after(() => clients.forEach((c) => c.disconnect()));
  const redlock = new Redlock(clients, { retryCount: 2, retryDelay: 50, retryJitter: 10, automaticExtensionThreshold: 200 });
  const key = fresh('quorum');

  // Held by someone else on two of three: no quorum, and the one grant is given back.
  for (const c of clients.slice(0, 2)) assert.equal(typeof (await c.call('LOCK.ACQUIRE', key, 'other', 30000)), 'number');
  await assert.rejects(redlock.acquire([key], 5000), ExecutionError);
  assert.equal(await clients[2].exists(key), 0);
  for (const c of clients.slice(0, 2)) await c.call('LOCK.RELEASE', key, 'other');

  // One master stopped: a majority still grants it.
  process.kill(servers[2].pid, 'SIGSTOP');
  try {
    const lock = await redlock.acquire([key], 5000);
    assert.equal(lock.tokens.filter((x) => x !== null).length, 2);
    await lock.release();
  } finally {
    process.kill(servers[2].pid, 'SIGCONT');
  }

  // using() with auto-extension (duration 500, threshold 200: extended every ~300 ms) resolves
  // when the routine ends (node-redlock #169), and extends no more after.
  const calls = async () => Number(/cmdstat_lock\.extend:calls=(\d+)/.exec(await clients[0].info('commandstats'))?.[1] ?? 0);
  const before = await calls();
  const result = await redlock.using([key], 500, async (signal) => {
    await new Promise((r) => setTimeout(r, 800));
    assert.equal(signal.aborted, false);
    return 'done';
  });
  assert.equal(result, 'done');
  const extended = (await calls()) - before;
  assert.ok(extended >= 2, `${extended} extensions`);
  await new Promise((r) => setTimeout(r, 700));
  assert.equal((await calls()) - before, extended);
  for (const c of clients) assert.equal(await c.exists(key), 0);
});

// node-redlock's own suite: a resource whose key holds something else (a string) counts as locked,
// a ResourceLockedError vote "applied to: 0 of the 1 requested resources" in every attempt, and
// the other key is left as it was. Here the module answered WRONGTYPE (a ReplyError vote).
const applied0 = 'The operation was applied to: 0 of the 1 requested resources.';

async function assertLockedVotes(promise, attempts) {
  const e = await promise.then(
    () => assert.fail('acquired'),
    (error) => error
  );
  assert.ok(e instanceof ExecutionError, String(e));
  assert.equal(e.attempts.length, attempts);
  for (const stats of await Promise.all(e.attempts)) {
    assert.ok(stats.votesAgainst.size > 0);
    for (const vote of stats.votesAgainst.values()) {
      assert.ok(vote instanceof ResourceLockedError, String(vote));
      assert.equal(vote.message, applied0);
    }
  }
}

for (const kind of KINDS) {
  test(`${kind}: a key holding another type counts as locked, as in node-redlock`, async (t) => {
    const a = await connect(kind, servers[0].port);
    t.after(() => close(a));
    const key = fresh('string');
    await send(a, 'SET', key, 'other');
    const redlock = new Redlock([a], { retryCount: 2, retryDelay: 50, retryJitter: 10 });
    const events = [];
    redlock.on('error', (e) => events.push(e));
    await assertLockedVotes(redlock.acquire([key], 1000), 3);
    assert.equal(events.length, 3);
    assert.ok(events.every((e) => e instanceof ResourceLockedError));
    assert.equal(await send(a, 'GET', key), 'other');
    // No retries: one attempt, one vote.
    await assertLockedVotes(new Redlock([a], { retryCount: 0 }).acquire([key], 1000), 1);

    // Deleted while the drop-in tries again: the next try takes it.
    const patient = new Redlock([a], { retryCount: 100, retryDelay: 20, retryJitter: 0 });
    const seen = new Promise((resolve) => patient.once('error', resolve));
    const later = patient.acquire([key], 1000);
    await seen;
    await send(a, 'DEL', key);
    const lock = await later;
    assert.equal(await send(a, 'LOCK.FENCE', key), lock.tokens[0][0]);
    await lock.release();
  });
}

test('three servers: a key holding another type on two of them votes ResourceLockedError there', async (t) => {
  const clients = await Promise.all(servers.map((s) => connect('ioredis', s.port)));
  t.after(() => clients.forEach((c) => c.disconnect()));
  const key = fresh('strings');
  await clients[1].set(key, 'other1');
  await clients[2].set(key, 'other2');
  const redlock = new Redlock(clients, { retryCount: 2, retryDelay: 50, retryJitter: 10 });
  await assertLockedVotes(redlock.acquire([key], 5000), 3);
  assert.equal(await clients[0].exists(key), 0);
  assert.equal(await clients[1].get(key), 'other1');
  assert.equal(await clients[2].get(key), 'other2');
});
