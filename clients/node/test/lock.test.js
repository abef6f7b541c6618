'use strict';
// Lock, Semaphore, ReadWriteLock, MultiLock against a real server, with every client library.

const test = require('node:test');
const assert = require('node:assert/strict');
const { startServer, serverForFile, ownServer, freshKeys, until, info, waiters } = require('./harness');
const { KINDS, ioredisOf, connect, connectPair, send, close } = require('./clients');
const {
  Lock,
  Locks,
  Semaphore,
  ReadWriteLock,
  MultiLock,
  Session,
  LockLostError,
  LockBusyError,
  StaleTokenError,
} = require('..');

const server = serverForFile();
const fresh = freshKeys('');

async function commandCalls(client, command) {
  const text = String(await send(client, 'INFO', 'commandstats'));
  const m = new RegExp(`cmdstat_${command}:calls=(\\d+)`).exec(text);
  return m ? Number(m[1]) : 0;
}

for (const kind of KINDS) {
  test(`${kind}`, async (t) => {
    const [a, b] = await connectPair(t, kind, server.port);

    await t.test('acquire returns the exact token, an idempotent retry the same one', async () => {
      const key = fresh('lock');
      const lock = new Lock(a, key, 30000, { owner: 'worker-a' });
      assert.equal(await lock.acquire({ timeout: 0 }), true);
      assert.equal(typeof lock.token, 'number');
      assert.ok(Number.isSafeInteger(lock.token));
      // The token the server holds, read as a decimal string (ioredis stringNumbers), is the number.
      const exact = await connect('ioredis', server.port, { stringNumbers: true });
      const held = await exact.call('LOCK.INFO', key);
      exact.disconnect();
      assert.equal(held[0], 'owner');
      assert.equal(held[1], 'worker-a');
      assert.equal(held[3], String(lock.token));
      const first = lock.token;
      assert.equal(await lock.acquire({ timeout: 0 }), true);
      assert.equal(lock.token, first);
      assert.equal(await new Lock(b, key, 30000, { owner: 'worker-b' }).acquire({ timeout: 0 }), false);
      assert.equal(await lock.owned(), true);
      assert.equal(await lock.locked(), true);
      assert.equal(await lock.extend(20000), true);
      assert.equal(lock.ttl, 20000);
      assert.equal(await lock.release(), true);
      assert.equal(await lock.release(), false);
      assert.equal(await info(a, key), null);
    });

    await t.test('blocking waiters are granted in FIFO order, one LOCK.ACQUIRE each', async (st) => {
      // Counts LOCK.ACQUIRE calls server-wide: on a server of its own.
      const { server, a, b } = await ownServer(st, kind);
      const key = fresh('fifo');
      const holder = new Lock(a, key, 30000);
      assert.equal(await holder.acquire(), true);
      const order = [];
      const lockers = [1, 2, 3].map((i) => new Lock(b, key, 30000, { owner: `w${i}` }));
      const before = await commandCalls(a, 'lock.acquire');
      const waits = [];
      for (const [i, l] of lockers.entries()) {
        waits.push(l.acquire({ timeout: 20000 }).then((ok) => order.push([l.owner, ok])));
        await waiters(a, key, i + 1);
      }
      let previous = holder.token;
      assert.equal(await holder.release(), true);
      for (const l of lockers) {
        await until(`${l.owner} granted`, () => l.token !== null);
        assert.ok(l.token > previous, `${l.token} after ${previous}`);
        previous = l.token;
        assert.equal((await info(a, key)).owner, l.owner);
        assert.equal(await l.release(), true);
      }
      await Promise.all(waits);
      assert.deepEqual(order, [['w1', true], ['w2', true], ['w3', true]]);
      // Each waiter: one try, then one LOCK.ACQUIRE ... BLOCK. Counted once all have ended:
      // Redis 7.2+ and Valkey count a blocked command when it is answered, 7.0 when it blocks.
      assert.equal((await commandCalls(a, 'lock.acquire')) - before, 6);
    });

    await t.test('a wait longer than the client command timeout stays one command', async (st) => {
      if (!ioredisOf(kind)) {
        st.skip('node-redis has no client-wide command timeout');
        return;
      }
      // Counts LOCK.ACQUIRE calls server-wide: on a server of its own.
      const { server, a } = await ownServer(st, kind);
      const key = fresh('timeout');
      const short = await connect(kind, server.port, { commandTimeout: 300 });
      st.after(() => short.disconnect());
      const holder = new Lock(a, key, 30000);
      await holder.acquire();
      const before = await commandCalls(a, 'lock.acquire');
      const waiter = new Lock(short, key, 30000);
      const got = waiter.acquire({ timeout: 1200 });
      await waiters(a, key, 1);
      assert.equal(await got, false);
      assert.equal((await commandCalls(a, 'lock.acquire')) - before, 2);
      await holder.release();
    });

    await t.test('a waiter whose connection is killed is not re-sent and leaves no grant', async (st) => {
      // Counts LOCK.ACQUIRE calls server-wide: on a server of its own.
      const { server, a, b } = await ownServer(st, kind);
      const key = fresh('killed');
      const holder = new Lock(a, key, 30000);
      await holder.acquire();
      // Every LOCK.ACQUIRE of the victim, as the server runs it (MONITOR shows a command when
      // it runs, blocked or not, on every server; INFO commandstats counts a blocked one when
      // it blocks on 7.0, when it is answered on 7.2+, and a killed one not at all there).
      const sent = [];
      const watcher = await connect('ioredis', server.port);
      const monitor = await watcher.monitor();
      st.after(() => {
        monitor.disconnect();
        watcher.disconnect();
      });
      let pinged = false;
      monitor.on('monitor', (_time, args) => {
        const name = String(args[0]).toLowerCase();
        if (name === 'lock.acquire' && args[2] === 'victim') sent.push(args.slice(3));
        if (name === 'ping' && args[1] === 'victim-done') pinged = true;
      });
      const got = new Lock(b, key, 30000, { owner: 'victim' }).acquire({ timeout: 20000 });
      await waiters(a, key, 1);
      const list = String(await send(a, 'CLIENT', 'LIST'));
      const id = /id=(\d+) .*name=redislock-waiter /.exec(list)[1];
      assert.equal(await send(a, 'CLIENT', 'KILL', 'ID', id), 1);
      // The client library's own word for a connection closed under a command: never a grant,
      // never re-sent (ioredis: "Connection is closed."; node-redis: SocketClosedUnexpectedlyError).
      await assert.rejects(got, (e) => /^(Connection is closed\.|Socket closed unexpectedly)$/.test(e.message));
      assert.equal((await info(a, key)).waiters, 0);
      assert.equal(await holder.release(), true);
      assert.equal(await info(a, key), null);
      // One try and one wait; a re-send would be a third (and would have taken the free key).
      await send(a, 'PING', 'victim-done'); // MONITOR shows commands in order: after any re-send
      await until('the PING seen by MONITOR', () => pinged);
      assert.equal(sent.length, 2, JSON.stringify(sent));
      assert.ok(!sent[0].includes('BLOCK') && sent[1].includes('BLOCK'), JSON.stringify(sent));
    });

    await t.test('aborting a wait answers it at once and leaves no grant', async () => {
      const key = fresh('abort');
      const holder = new Lock(a, key, 30000);
      await holder.acquire();
      const waiter = new Lock(b, key, 30000);
      const controller = new AbortController();
      const got = waiter.acquire({ signal: controller.signal });
      await waiters(a, key, 1);
      controller.abort(new Error('caller gave up'));
      await assert.rejects(got, { message: 'caller gave up' });
      assert.equal((await info(a, key)).waiters, 0);
      assert.equal(await holder.release(), true);
      assert.equal(await info(a, key), null);
      assert.equal(waiter.token, null);
    });

    await t.test('an abort that races the grant leaves no grant either', async () => {
      const key = fresh('race');
      for (let i = 0; i < 20; i++) {
        const holder = new Lock(a, key, 30000);
        await holder.acquire();
        const waiter = new Lock(b, key, 30000);
        const controller = new AbortController();
        const got = waiter.acquire({ signal: controller.signal }).then(
          (ok) => ({ ok }),
          (error) => ({ error })
        );
        await waiters(a, key, 1);
        const released = holder.release();
        controller.abort();
        await released;
        const outcome = await got;
        if ('ok' in outcome) {
          // The grant won: the caller holds it and must release it.
          assert.equal(outcome.ok, true);
          assert.equal(await waiter.release(), true);
        } else {
          assert.equal(outcome.error.name, 'AbortError', String(outcome.error.stack));
        }
        assert.equal(await info(a, key), null, `round ${i}: ${JSON.stringify(outcome)}`);
      }
    });

    await t.test('lock.signal aborts when the watchdog finds the lock gone (DEL)', async () => {
      const key = fresh('lost');
      const lost = [];
      // feed: false, so that the watchdog's own report is what this tests (feed.test.js has the feed's).
      const lock = new Lock(a, key, 600, { watchdog: true, feed: false, onLost: (_l, e) => lost.push(e.reason) });
      await lock.acquire();
      const signal = lock.signal;
      assert.equal(signal.aborted, false);
      assert.equal(await send(b, 'DEL', key), 1);
      await new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }));
      assert.ok(signal.reason instanceof LockLostError);
      assert.equal(signal.reason.reason, 'not held');
      assert.equal(lock.lostReason, 'not held');
      assert.deepEqual(lost, ['not held']);
      assert.equal(await lock.release(), false);
    });

    await t.test('the watchdog keeps a lock past its ttl; without it the signal aborts at the ttl', async () => {
      const key = fresh('dog');
      const lock = new Lock(a, key, 300, { watchdog: true });
      await lock.acquire();
      const token = lock.token;
      await new Promise((r) => setTimeout(r, 900));
      assert.equal(lock.signal.aborted, false);
      assert.equal(await send(b, 'LOCK.FENCE', key), token);
      assert.equal(await lock.release(), true);

      const plain = new Lock(a, fresh('plain'), 200);
      await plain.acquire();
      await new Promise((resolve) => plain.signal.addEventListener('abort', resolve, { once: true }));
      assert.equal(plain.lostReason, 'expired');
      assert.equal(await send(b, 'LOCK.FENCE', plain.name), null);
    });

    await t.test('using releases on return and on throw', async () => {
      const key = fresh('using');
      const locks = new Locks(a);
      assert.equal(await locks.using(key, 30000, async (signal) => {
        assert.equal(signal.aborted, false);
        assert.notEqual(await info(b, key), null);
        return 42;
      }), 42);
      assert.equal(await info(b, key), null);
      await assert.rejects(
        locks.using(key, 30000, async () => {
          throw new Error('boom');
        }),
        { message: 'boom' }
      );
      assert.equal(await info(b, key), null);
      const holder = new Lock(b, key, 30000);
      await holder.acquire();
      await assert.rejects(locks.using(key, 30000, { timeout: 50 }, async () => 1), LockBusyError);
      assert.equal((await info(b, key)).waiters, 0);
      await holder.release();
    });

    await t.test('fenced writes go through only with the live token', async () => {
      const key = fresh('fence');
      const lock = new Lock(a, key, 30000);
      await lock.acquire();
      assert.equal(await lock.fenced('SET', `${key}:total`, 100), 'OK');
      const old = lock.token;
      await send(b, 'DEL', key);
      const next = new Lock(b, key, 30000);
      await next.acquire();
      await assert.rejects(lock.fenced('SET', `${key}:total`, 1), (e) => {
        assert.ok(e instanceof StaleTokenError);
        assert.equal(e.message, `STALE token ${old} is not the live hold on ${key}`);
        return true;
      });
      assert.equal(await send(b, 'GET', `${key}:total`), '100');
      await next.release();
    });

    await t.test('Semaphore: at most limit holders; a different limit is the server error', async () => {
      const key = fresh('sem');
      const s1 = new Semaphore(a, key, 2, 30000);
      const s2 = new Semaphore(b, key, 2, 30000);
      const s3 = new Semaphore(b, key, 2, 30000);
      assert.equal(await s1.acquire({ timeout: 0 }), true);
      assert.equal(await s2.acquire({ timeout: 0 }), true);
      assert.equal(await s3.acquire({ timeout: 0 }), false);
      await assert.rejects(new Semaphore(b, key, 3, 30000).acquire({ timeout: 0 }), {
        message: 'ERR this lock is held SHARED with LIMIT 2; acquire it with SHARED LIMIT 2',
      });
      const third = s3.acquire({ timeout: 10000 });
      await waiters(a, key, 1);
      assert.equal(await s1.release(), true);
      assert.equal(await third, true);
      assert.equal(await send(a, 'LOCK.FENCE', key), s3.token);
      await s2.release();
      await s3.release();
    });

    await t.test('ReadWriteLock: readers together, a writer alone and not overtaken', async () => {
      const key = fresh('rw');
      const r1 = new ReadWriteLock(a, key, 30000, { owner: 'r1' });
      const r2 = new ReadWriteLock(b, key, 30000, { owner: 'r2' });
      const w = new ReadWriteLock(b, key, 30000, { owner: 'w' });
      assert.equal(r1.read.owner, 'r1:read');
      assert.equal(await r1.read.acquire({ timeout: 0 }), true);
      assert.equal(await r2.read.acquire({ timeout: 0 }), true);
      const writing = w.write.acquire({ timeout: 10000 });
      await waiters(a, key, 1);
      assert.equal(await new ReadWriteLock(a, key, 30000).read.acquire({ timeout: 0 }), false);
      await r1.read.release();
      await r2.read.release();
      assert.equal(await writing, true);
      assert.equal((await info(a, key)).owner, 'w:write');
      await w.write.release();
    });

    await t.test('lockDelay: after the hold expires nobody gets the key for the delay; a release has none', async () => {
      const key = fresh('delay');
      const lock = new Lock(a, key, 300, { lockDelay: 1000 });
      assert.equal(lock.lockDelay, 1000);
      const asked = performance.now();
      assert.equal(await lock.acquire(), true);
      const waiter = new Lock(b, key, 30000, { owner: 'waiter' });
      const granted = waiter.acquire({ timeout: 10000 }).then((got) => [got, performance.now()]);
      await waiters(a, key, 1);
      // The hold expires at 300 ms; for 1000 ms more the key has no holder, token 0, the waiter
      // still queued, and nobody is granted it.
      const delayed = await until('the lock-delay', async () => {
        const i = await info(a, key);
        return i !== null && i.delayed !== undefined ? i : null;
      });
      assert.ok(delayed.delayed > 0 && delayed.delayed <= 1000, String(delayed.delayed));
      // Each queue entry: mode, owner, then the waiter's client id, ms waited and ms left
      // (issue 32), which change from run to run.
      const [entry] = delayed.queue;
      assert.deepEqual(entry.slice(0, 6), ['mode', 'exclusive', 'owner', 'waiter', 'client', entry[5]]);
      assert.deepEqual(entry.slice(6, 8), ['waited', entry[7]]);
      assert.deepEqual(entry.slice(8), ['timeout', entry[9]]);
      assert.ok(Number.isInteger(entry[5]) && entry[7] >= 0 && entry[9] > 0, JSON.stringify(entry));
      assert.deepEqual(
        { ...delayed, delayed: 'ms', queue: 'checked above' },
        {
          token: 0,
          ttl: 0,
          waiters: 1,
          mode: 'exclusive',
          limit: null,
          holders: [],
          queue: 'checked above',
          delayed: 'ms',
        }
      );
      const pttl = await send(a, 'PTTL', key); // the key's TTL runs to the end of the delay
      assert.ok(pttl > 0 && pttl <= delayed.delayed, `${pttl} ms`);
      assert.equal(await new Lock(b, key, 30000).acquire({ timeout: 0 }), false);
      assert.equal(await send(b, 'LOCK.ACQUIRE', key, 'someone', 30000), null);
      const [got, at] = await granted;
      assert.equal(got, true);
      // Granted when the delay ends: 300 + 1000 ms after the grant, which came after `asked`
      // (less up to a millisecond of the server's millisecond clock).
      assert.ok(at - asked >= 1299, `${at - asked} ms`);
      assert.equal(await send(a, 'LOCK.FENCE', key), waiter.token);
      assert.equal(await waiter.release(), true);

      // A release is clean: the next acquire is granted at once.
      const clean = new Lock(a, fresh('delay-clean'), 30000, { lockDelay: 1000 });
      assert.equal(await clean.acquire(), true);
      assert.equal(await clean.release(), true);
      assert.equal(await info(b, clean.name), null);
      const next = new Lock(b, clean.name, 30000);
      assert.equal(await next.acquire({ timeout: 0 }), true);
      assert.equal(await next.release(), true);
    });

    await t.test('lockDelay on a Semaphore keeps only the permit its hold had', async () => {
      const key = fresh('delay-sem');
      const mine = new Semaphore(a, key, 2, 300, { lockDelay: 1000 });
      const other = new Semaphore(b, key, 2, 30000, { owner: 'other' });
      assert.equal(await mine.acquire({ timeout: 0 }), true);
      assert.equal(await other.acquire({ timeout: 0 }), true);
      const delayed = await until('the lock-delay', async () => {
        const i = await info(a, key);
        return i !== null && i.delayed !== undefined ? i : null;
      });
      assert.equal(delayed.mode, 'shared');
      assert.equal(delayed.limit, 2);
      assert.deepEqual(delayed.holders.map((h) => h[h.indexOf('owner') + 1]), ['other']); // mine expired
      // Its permit stays taken: a third holder is refused while `other` holds the second.
      assert.equal(await new Semaphore(b, key, 2, 30000).acquire({ timeout: 0 }), false);
      assert.equal(await other.release(), true);
      // With `other` gone, its permit is free again; the delayed one still is not.
      const third = new Semaphore(b, key, 2, 30000, { owner: 'third' });
      assert.equal(await third.acquire({ timeout: 0 }), true);
      assert.equal(await new Semaphore(b, key, 2, 30000).acquire({ timeout: 0 }), false);
      assert.equal(await third.release(), true);
    });

    await t.test('MultiLock: every key or none, one token per key', async () => {
      const k1 = fresh('{m}:sku');
      const k2 = fresh('{m}:sku');
      const m = new MultiLock(a, [k1, k2], 30000);
      assert.equal(await m.acquire({ timeout: 0 }), true);
      assert.equal(m.tokens.length, 2);
      assert.equal(await send(b, 'LOCK.FENCE', k1), m.tokens[0]);
      assert.equal(await send(b, 'LOCK.FENCE', k2), m.tokens[1]);
      assert.equal(m.token, Math.max(...m.tokens));
      const other = new MultiLock(b, [k2, fresh('{m}:sku')], 30000);
      assert.equal(await other.acquire({ timeout: 0 }), false);
      const waiting = other.acquire({ timeout: 10000 });
      await waiters(a, k2, 1);
      assert.equal(await m.extend(), true);
      assert.equal(await m.owned(), true);
      assert.equal(await m.release(), true);
      assert.equal(await waiting, true);
      assert.equal(await other.release(), true);
      assert.equal(await m.locked(), false);
    });
  });
}

test('lock.signal aborts when renewals get no answer (server stopped)', async (t) => {
  const own = await startServer();
  t.after(() => own.stop());
  const client = await connect('ioredis', own.port);
  t.after(() => close(client));
  // The ttl and its watchdog alone (session: null): no default session's keepalive in the race.
  const lock = new Lock(client, fresh('stopped'), 900, { watchdog: true, session: null });
  await lock.acquire();
  process.kill(own.pid, 'SIGSTOP');
  try {
    await new Promise((resolve) => lock.signal.addEventListener('abort', resolve, { once: true }));
    assert.equal(lock.lostReason, 'extend failed: LOCK.EXTEND: no reply within 300 ms');
  } finally {
    process.kill(own.pid, 'SIGCONT');
  }
});

test('lockDelay arguments refused by the constructors', async (t) => {
  const a = await connect('ioredis', server.port);
  t.after(() => close(a));
  assert.equal(new Lock(a, 'x', 1000, { lockDelay: 0 }).lockDelay, 0);
  assert.equal(new Lock(a, 'x', 1000, { lockDelay: 60000 }).lockDelay, 60000);
  assert.equal(new Lock(a, 'x', 1000).lockDelay, undefined);
  assert.throws(() => new Lock(a, 'x', 1000, { lockDelay: 60001 }), {
    name: 'RangeError',
    message: 'lockDelay must be at most 60000 ms, got 60001',
  });
  assert.throws(() => new Semaphore(a, 'x', 2, 1000, { lockDelay: -1 }), {
    name: 'RangeError',
    message: 'lockDelay must be a positive number of milliseconds, got -1',
  });
  assert.throws(() => new Lock(a, 'x', 0, { session: new Session(a, 1000), lockDelay: 100 }), {
    name: 'RangeError',
    message: "a lock in a session has its session's lockDelay",
  });
  assert.throws(() => new MultiLock(a, ['{m}:a', '{m}:b'], 1000, { lockDelay: 100 }), {
    name: 'RangeError',
    message: 'LOCK.MACQUIRE takes no LOCKDELAY: lockDelay is for Lock, Semaphore and ReadWriteLock',
  });
  assert.equal(new ReadWriteLock(a, 'x', 1000, { lockDelay: 100 }).write.lockDelay, 100);
});
