'use strict';
// The change feed's loss reports (lib/feed.js) against a real server, with every client library:
// onLost for every reason the server can cause (deleted, flushed, swapped, demoted, a session
// that expired or was closed elsewhere, a release elsewhere handed to a waiter, taken after an
// expiry the holder could not foresee), the client's own deadline, a killed feed connection; and
// nothing for a live hold renewed by its watchdog through many periods.

const test = require('node:test');
const assert = require('node:assert/strict');
const { startServer, serverForFile, ownServer, freshKeys, sleep, until, waiters, clientId } = require('./harness');
const { KINDS, ioredisOf, connect, connectPair, send, close } = require('./clients');
const { Lock, Session, Semaphore, ReadWriteLock, MultiLock } = require('..');
const { feedFor, IDLE_CLOSE_MS } = require('../lib/feed');

const server = serverForFile();
const fresh = freshKeys('feed-');

/** An onLost that records every call: `[lock, reason, performance.now()]`. */
function losses() {
  const calls = [];
  const onLost = (lock, error) => calls.push([lock, error.reason, performance.now()]);
  onLost.calls = calls;
  onLost.first = () => until('a loss report', () => calls[0]);
  return onLost;
}

/** The lock's feed watch is checked against LOCK.INFO on every key (messages count from here). */
function synced(lock) {
  return until('the feed to check the hold', () => lock._feedSub !== null && lock._feedSub.checked.size === lock._feedSub.tokens.size);
}

const dbOption = (kind, db) => (ioredisOf(kind) ? { db } : { database: db });

for (const kind of KINDS) {
  test(`${kind}`, async (t) => {
    const [a, b] = await connectPair(t, kind, server.port);

    await t.test('a deleted key is reported at once, once', async () => {
      const key = fresh('del');
      const lost = losses();
      const lock = new Lock(a, key, 30000, { onLost: lost }); // no watchdog: nothing else would tell for 30 s
      assert.equal(await lock.acquire(), true);
      await synced(lock);
      const deleted = performance.now();
      assert.equal(await send(b, 'DEL', key), 1);
      const [reported, reason, at] = await lost.first();
      assert.equal(reported, lock);
      assert.equal(reason, 'feed: deleted');
      assert.equal(lock.lostReason, 'feed: deleted');
      assert.equal(lock.signal.aborted, true);
      // The reason says the feed told it (no watchdog, a 30 s ttl); how soon is make bench's.
      t.diagnostic(`loss reported ${(at - deleted).toFixed(1)} ms after the DEL`);
      assert.equal(await lock.release(), false);
      assert.equal(lost.calls.length, 1);
    });

    for (const how of ['FLUSHDB', 'FLUSHALL']) {
      await t.test(`${how} is reported as flushed`, async (st) => {
        // A flush empties the whole server (or database): on a server of its own.
        const own = (await ownServer(st, kind)).server;
        const c = await connect(kind, own.port, dbOption(kind, 3));
        const lost = losses();
        const lock = new Lock(c, fresh('flushed'), 30000, { onLost: lost });
        assert.equal(await lock.acquire(), true);
        await synced(lock);
        assert.equal(await send(c, how), 'OK');
        assert.equal((await lost.first())[1], 'feed: flushed');
        await close(c);
      });
    }

    await t.test('SWAPDB is reported as swapped', async () => {
      const c = await connect(kind, server.port, dbOption(kind, 5));
      const lost = losses();
      const key = fresh('swapped');
      const lock = new Lock(c, key, 30000, { onLost: lost });
      assert.equal(await lock.acquire(), true);
      await synced(lock);
      assert.equal(await send(c, 'SWAPDB', 5, 6), 'OK');
      assert.equal((await lost.first())[1], 'feed: swapped');
      assert.equal(await send(c, 'SWAPDB', 5, 6), 'OK');
      assert.equal(await send(c, 'DEL', key), 1);
      assert.equal(lost.calls.length, 1);
      await close(c);
    });

    await t.test('a session that expired is reported as lost', async () => {
      // A session nobody keeps alive: the server ends it after 300 ms and publishes `lost`.
      const session = new Session(a, 30000);
      session._id = String(await send(a, 'LOCK.SESSION', 'OPEN', 300));
      const lost = losses();
      const key = fresh('session-expired');
      const lock = new Lock(a, key, 0, { session, onLost: lost });
      assert.equal(await lock.acquire(), true);
      assert.equal((await lost.first())[1], 'feed: lost');
      assert.equal(await send(b, 'EXISTS', key), 0);
    });

    await t.test('a session closed elsewhere is reported as released; closed by its owner, nothing', async () => {
      const session = await new Session(a, 30000).open(); // a keepalive every 10 s: the feed tells first
      const lost = losses();
      const lock = new Lock(a, fresh('session-closed'), 0, { session, onLost: lost });
      assert.equal(await lock.acquire(), true);
      await synced(lock);
      assert.equal(await send(b, 'LOCK.SESSION', 'CLOSE', session.id), 1);
      assert.equal((await lost.first())[1], 'feed: released');
      assert.equal(lost.calls.length, 1);

      const own = await new Session(a, 30000).open();
      const quiet = losses();
      const held = new Lock(a, fresh('session-own'), 0, { session: own, onLost: quiet });
      assert.equal(await held.acquire(), true);
      await synced(held);
      assert.equal(await own.close(), 1);
      assert.equal(held.token, null);
      // The feed is still there: a probe through it, after the close, would come after a report.
      const probe = new Lock(a, fresh('probe'), 30000, { onLost: losses() });
      assert.equal(await probe.acquire(), true);
      await synced(probe);
      assert.equal(await probe.release(), true);
      assert.deepEqual(quiet.calls, []);
      assert.equal(held.lost, false);
    });

    await t.test('released elsewhere with a waiter: a handoff to another owner', async () => {
      const key = fresh('handoff');
      const lost = losses();
      const lock = new Lock(a, key, 30000, { owner: 'first', onLost: lost });
      assert.equal(await lock.acquire(), true);
      const waiting = new Lock(b, key, 30000, { owner: 'second' }).acquire({ timeout: 10000 });
      await waiters(b, key, 1);
      await synced(lock);
      assert.equal(await send(b, 'LOCK.RELEASE', key, 'first'), 1); // someone else, with its owner
      assert.equal(await waiting, true);
      assert.equal((await lost.first())[1], 'feed: handoff to "second"');
      assert.equal(await send(b, 'LOCK.RELEASE', key, 'second'), 1);
    });

    await t.test('taken after an expiry the holder could not foresee', async () => {
      // The server's deadline is cut short behind the holder's back (its own says 30 s).
      const key = fresh('taken');
      const lost = losses();
      const lock = new Lock(a, key, 30000, { owner: 'holder', onLost: lost });
      assert.equal(await lock.acquire(), true);
      await synced(lock);
      const waiting = new Lock(b, key, 30000, { owner: 'taker' }).acquire({ timeout: 10000 });
      await waiters(b, key, 1);
      assert.equal(await send(b, 'LOCK.EXTEND', key, 'holder', 50), 1);
      assert.equal(await waiting, true);
      assert.equal((await lost.first())[1], 'feed: handoff to "taker"');

      // With nobody queued, a later acquire finds the hold expired: `expired` comes first.
      const key2 = fresh('taken2');
      const lost2 = losses();
      const lock2 = new Lock(a, key2, 30000, { owner: 'holder', onLost: lost2 });
      assert.equal(await lock2.acquire(), true);
      await synced(lock2);
      assert.equal(await send(b, 'LOCK.EXTEND', key2, 'holder', 20), 1);
      await until('the hold to expire', async () => (await send(b, 'PTTL', key2)) < 0);
      const taker = new Lock(b, key2, 30000, { owner: 'taker' });
      assert.equal(await taker.acquire({ timeout: 0 }), true);
      assert.equal((await lost2.first())[1], 'feed: expired');
      assert.equal(lost2.calls.length, 1);
      assert.equal(await taker.release(), true);
      assert.equal(await send(b, 'LOCK.RELEASE', key, 'taker'), 1);
    });

    await t.test("expiry is reported at the client's own conservative deadline", async () => {
      const lost = losses();
      const lock = new Lock(a, fresh('deadline'), 300, { onLost: lost });
      const asked = performance.now();
      assert.equal(await lock.acquire(), true);
      const [, reason, at] = await lost.first();
      assert.equal(reason, 'deadline passed: no renewal succeeded');
      // Due 3 ms (the margin, 1 % of the ttl) before asked + 300 ms, less up to 1 ms: Node's
      // timers run on libuv's millisecond loop clock (one fired 295.95 ms after `asked`).
      // Not before its conservative deadline; how soon after it is a timing goal, measured by
      // `make bench` (the loss notice row), not asserted here.
      assert.ok(at - asked >= 295, `${at - asked} ms`);
      assert.equal(lost.calls.length, 1);
    });

    await t.test("extend moves the client's deadline", async () => {
      const lost = losses();
      const lock = new Lock(a, fresh('extend'), 400, { onLost: lost });
      assert.equal(await lock.acquire(), true);
      for (let i = 0; i < 4; i++) {
        await sleep(200); // 4 x 200 ms: twice the ttl, renewed by hand
        assert.equal(await lock.extend(), true);
      }
      assert.deepEqual(lost.calls, []);
      assert.equal(await lock.release(), true);
      assert.deepEqual(lost.calls, []);
    });

    await t.test("an idempotent retry of acquire moves the client's deadline as extend does", async () => {
      const lost = losses();
      const lock = new Lock(a, fresh('retry'), 400, { onLost: lost });
      assert.equal(await lock.acquire(), true);
      const token = lock.token;
      for (let i = 0; i < 4; i++) {
        await sleep(200); // 4 x 200 ms: twice the ttl, renewed by acquiring again
        assert.equal(await lock.acquire({ timeout: 0 }), true);
        assert.equal(lock.token, token);
      }
      assert.deepEqual(lost.calls.map((c) => c[1]), []);
      assert.equal(await lock.release(), true);
    });

    await t.test('a killed feed connection is reported, fail-safe', async () => {
      const key = fresh('killed');
      const lost = losses();
      const lock = new Lock(a, key, 30000, { onLost: lost });
      assert.equal(await lock.acquire(), true);
      await synced(lock);
      const feed = feedFor(a, key);
      const id = await clientId(b, `redislock-feed-sub-${feed.id}`);
      assert.equal(await send(b, 'CLIENT', 'KILL', 'ID', id), 1);
      assert.match((await lost.first())[1], /^feed connection lost: /);
      assert.equal(await lock.owned(), true); // held in fact: the holder only cannot count on it
      assert.equal(await lock.release(), true);
      assert.equal(lost.calls.length, 1);
    });

    await t.test('multi-key, semaphore, read and write locks report their loss', async () => {
      const key = fresh('kinds');
      const lost = { multi: losses(), sem: losses(), read: losses(), write: losses() };
      const multi = new MultiLock(a, [`{${key}}:a`, `{${key}}:b`], 30000, { onLost: lost.multi });
      const sem = new Semaphore(a, `${key}:sem`, 2, 30000, { onLost: lost.sem });
      const rw = new ReadWriteLock(a, `${key}:rw`, 30000, { onLost: lost.read });
      const rw2 = new ReadWriteLock(a, `${key}:rw2`, 30000, { onLost: lost.write });
      assert.equal(await multi.acquire(), true);
      assert.equal(await sem.acquire(), true);
      assert.equal(await rw.read.acquire(), true);
      assert.equal(await rw2.write.acquire(), true);
      for (const lock of [multi, sem, rw.read, rw2.write]) await synced(lock);
      assert.equal(await send(b, 'DEL', `{${key}}:b`, `${key}:sem`, `${key}:rw`, `${key}:rw2`), 4);
      for (const [name, l] of Object.entries(lost)) assert.equal((await l.first())[1], 'feed: deleted', name);
      assert.equal(await multi.release(), false); // one of its keys was gone
    });

    await t.test('a hold lost before the watch began is reported (the check against LOCK.INFO)', async () => {
      const key = fresh('before');
      const lost = losses();
      const lock = new Lock(a, key, 30000);
      assert.equal(await lock.acquire(), true);
      assert.equal(await send(b, 'DEL', key), 1);
      lock.onLost = lost; // what acquire() does after a grant, here after the key went
      lock._watchFeed(null);
      assert.equal((await lost.first())[1], 'feed: not held (LOCK.INFO)');
    });

    await t.test('shared holders coming and going are no loss', async () => {
      const key = fresh('shared');
      const lost = losses();
      const mine = new Semaphore(a, key, 3, 30000, { onLost: lost });
      assert.equal(await mine.acquire(), true);
      await synced(mine);
      for (let i = 0; i < 5; i++) {
        const other = new Semaphore(b, key, 3, 30000, { owner: `other-${i}` });
        assert.equal(await other.acquire(), true);
        assert.equal(await other.release(), true);
      }
      const probe = new Lock(a, fresh('probe'), 30000, { onLost: losses() }); // through the same feed, after them
      assert.equal(await probe.acquire(), true);
      await synced(probe);
      assert.equal(await probe.release(), true);
      assert.deepEqual(lost.calls, []);
      assert.equal(await mine.release(), true);
    });

    await t.test('never for a live hold: the watchdog through many periods reports nothing', async () => {
      const key = fresh('live');
      const lost = losses();
      // ttl 600 ms, a renewal every 200 ms, each with 200 ms to answer (room for a loaded machine).
      const lock = new Lock(a, key, 600, { watchdog: true, onLost: lost });
      assert.equal(await lock.acquire(), true);
      const token = lock.token;
      // Others come and go on other keys through the same feed, and the lock's own extends are
      // published: none of it is a loss.
      const started = performance.now();
      let rounds = 0;
      while (performance.now() - started < 3000) {
        // 5 ttls, 15 renewals
        const other = new Lock(a, `${key}:other`, 30000, { onLost: losses() });
        assert.equal(await other.acquire(), true);
        assert.equal(await other.release(), true);
        rounds++;
        await sleep(50);
      }
      assert.ok(rounds > 20, `${rounds} rounds`);
      assert.deepEqual(lost.calls.map((c) => c[1]), []);
      assert.equal(lock.lost, false);
      assert.equal(await send(b, 'LOCK.FENCE', key), token);
      assert.equal(await lock.release(), true);
      assert.deepEqual(lost.calls, []);
    });
  });
}

test('a demoted primary is reported as demoted', async (t) => {
  const primary = await startServer();
  const other = await startServer();
  t.after(async () => {
    await primary.stop();
    await other.stop();
  });
  const c = await connect('ioredis', primary.port);
  t.after(() => close(c));
  const lost = losses();
  const lock = new Lock(c, fresh('demoted'), 30000, { onLost: lost });
  assert.equal(await lock.acquire(), true);
  await synced(lock);
  assert.equal(await send(c, 'REPLICAOF', '127.0.0.1', other.port), 'OK');
  const [reported, reason] = await lost.first();
  assert.equal(reported, lock);
  assert.equal(reason, 'feed: demoted');
  assert.equal(await send(c, 'REPLICAOF', 'NO', 'ONE'), 'OK');
  assert.equal(lost.calls.length, 1);
});

test('a stopped server is reported as a lost feed connection (fail-safe)', async (t) => {
  const own = await startServer();
  const c = await connect('ioredis', own.port, { maxRetriesPerRequest: 0, retryStrategy: () => null });
  t.after(() => close(c));
  const lost = losses();
  const lock = new Lock(c, fresh('stopped'), 30000, { onLost: lost });
  assert.equal(await lock.acquire(), true);
  await synced(lock);
  await own.stop();
  assert.match((await lost.first())[1], /^feed connection lost: /);
  assert.equal(lost.calls.length, 1);
});

test('one watch and one pub/sub connection per client, closed when idle', async (t) => {
  const c = await connect('ioredis', server.port);
  t.after(() => close(c));
  const key = fresh('conns');
  const feed = feedFor(c, key);
  const names = async () => {
    const list = String(await send(c, 'CLIENT', 'LIST'));
    const count = (name) => list.split('\n').filter((l) => l.includes(` name=${name} `)).length;
    return [count(`redislock-feed-watch-${feed.id}`), count(`redislock-feed-sub-${feed.id}`)];
  };
  const locks = [];
  for (let i = 0; i < 5; i++) locks.push(new Lock(c, `${key}:${i}`, 30000, { onLost: losses() }));
  for (const lock of locks) assert.equal(await lock.acquire(), true);
  for (const lock of locks) await synced(lock);
  assert.deepEqual(await names(), [1, 1]);
  for (const lock of locks) assert.equal(await lock.release(), true);
  await until('the feed to close its connections', async () => (await names()).join() === '0,0', IDLE_CLOSE_MS + 5000);
});
