'use strict';
// Session (lib/session.js) against a real server, with every client library: OPEN/INFO/CLOSE,
// one keepalive for many holds past the session's ttl, a session closed elsewhere (lost once,
// with its holds), a bound session whose connection is killed (lost at once, holds handed on),
// LOCKDELAY after an unclean loss, every lock kind in a session, arguments refused.

const test = require('node:test');
const assert = require('node:assert/strict');
const { serverForFile, ownServer, freshKeys, sleep, until, info } = require('./harness');
const { KINDS, connect, connectPair, send, close } = require('./clients');
const { Lock, Session, Semaphore, ReadWriteLock, MultiLock, LockError } = require('..');

const server = serverForFile();
const fresh = freshKeys('session-');

for (const kind of KINDS) {
  test(`${kind}`, async (t) => {
    const [a, b] = await connectPair(t, kind, server.port);

    await t.test('a bound session names its connection after its serial, never its id', async () => {
      const session = new Session(a, 30000, { bound: true });
      await session.open();
      const i = await session.info();
      assert.equal(session.serial, i.serial);
      const list = String(await send(b, 'CLIENT', 'LIST'));
      const line = list.split('\n').find((l) => l.startsWith(`id=${i.bound} `));
      assert.match(line, new RegExp(` name=redislock-session-${i.serial} `));
      assert.ok(!list.includes(session.id.slice(session.id.indexOf('}') + 1)));
      await session.close();
    });

    await t.test('open, info, close', async () => {
      const session = new Session(a, 30000);
      assert.equal(session.id, null);
      assert.equal(await session.open(), session);
      assert.match(session.id, /^\{[^}]+\}[0-9a-f]{32}$/);
      const i = await session.info();
      assert.deepEqual(Object.keys(i).sort(), ['bound', 'detached', 'grace', 'holds', 'lockdelay', 'serial', 'ttl']);
      assert.equal(i.bound, null);
      assert.equal(i.lockdelay, 0);
      assert.equal(i.holds, 0);
      assert.ok(i.ttl > 29000 && i.ttl <= 30000, String(i.ttl));
      const key = fresh('held');
      const lock = new Lock(a, key, 0, { session });
      assert.equal(await lock.acquire(), true);
      assert.equal(await send(b, 'PTTL', key), -1); // no deadline of its own
      assert.equal((await session.info()).holds, 1);
      assert.equal(await session.close(), 1);
      assert.equal(session.closed, true);
      assert.equal(lock.token, null);
      assert.equal(await send(b, 'EXISTS', key), 0);
      assert.equal(await session.close(), null);
      await assert.rejects(lock.acquire(), (e) => e instanceof LockError && e.message === 'the session is closed');
    });

    await t.test('one keepalive keeps many holds past the session ttl', async (st) => {
      // Counts commands server-wide: on a server of its own.
      const { a, b } = await ownServer(st, kind);
      const session = await new Session(a, 1500).open(); // a keepalive every 500 ms
      const locks = [];
      for (let i = 0; i < 3; i++) {
        const lock = new Lock(a, fresh('many'), 0, { session });
        assert.equal(await lock.acquire(), true);
        locks.push(lock);
      }
      const calls = (text, command) =>
        Number((new RegExp(`cmdstat_${command}:calls=(\\d+)`).exec(String(text)) || [0, 0])[1]);
      const stats = () => send(b, 'INFO', 'commandstats');
      const before = await stats();
      // Four keepalives: past the session's ttl, whatever the machine's load did to the timer.
      await until('four keepalives', async () => calls(await stats(), 'lock\\.session\\|keepalive') - calls(before, 'lock\\.session\\|keepalive') >= 4);
      for (const lock of locks) assert.equal(await send(b, 'LOCK.FENCE', lock.name), lock.token);
      assert.equal(session.lost, false);
      assert.equal((await session.info()).holds, 3);
      // The session's keepalive is the holds' only renewal: none of them is extended on its own.
      assert.equal(calls(await stats(), 'lock\\.extend') - calls(before, 'lock\\.extend'), 0);
      assert.equal(await session.close(), 3);
      for (const lock of locks) assert.equal(await send(b, 'EXISTS', lock.name), 0);
    });

    await t.test('closed elsewhere: lost once ("ended"), with its holds', async () => {
      const lostSessions = [];
      const session = await new Session(a, 600, { onLost: (s) => lostSessions.push(s.lostReason) }).open();
      const holds = [];
      const lock = new Lock(a, fresh('elsewhere'), 0, { session, feed: false, onLost: (_l, e) => holds.push(e.reason) });
      assert.equal(await lock.acquire(), true);
      assert.equal(await send(b, 'LOCK.SESSION', 'CLOSE', session.id), 1);
      await until('the session reported lost', () => session.lost);
      assert.equal(session.lostReason, 'ended');
      assert.deepEqual(lostSessions, ['ended']);
      assert.deepEqual(holds, ['session lost: ended']);
      assert.equal(lock.lostReason, 'session lost: ended');
      await assert.rejects(
        new Lock(a, fresh('after'), 0, { session }).acquire(),
        (e) => e instanceof LockError && e.message === 'the session was lost (ended): open a new one'
      );
      assert.equal(await session.close(), null);
    });

    await t.test('bound: its connection killed, the session is lost at once and its holds handed on', async (st) => {
      // Counts sessions ended by a disconnect server-wide: on a server of its own.
      const { a, b } = await ownServer(st, kind);
      const session = await new Session(a, 30000, { bound: true }).open();
      const i = await session.info();
      assert.equal(typeof i.bound, 'number');
      const key = fresh('bound');
      const holds = [];
      const lock = new Lock(a, key, 0, { session, feed: false, onLost: (_l, e) => holds.push(e.reason) });
      assert.equal(await lock.acquire(), true);
      const waiting = new Lock(b, key, 30000, { owner: 'next' });
      const granted = waiting.acquire({ timeout: 10000 });
      await until('a waiter', async () => (await info(b, key)).waiters === 1);
      const disconnected = async () =>
        Number(/lock_sessions_disconnected:(\d+)/.exec(String(await send(b, 'INFO', 'lock')))[1]);
      const before = await disconnected();
      assert.equal(await send(b, 'CLIENT', 'KILL', 'ID', i.bound), 1);
      // Granted within the waiter's 10 s: the session's 30 s ttl did not end it, its connection did.
      assert.equal(await granted, true);
      assert.equal(await disconnected(), before + 1);
      await until('the session reported lost', () => session.lost);
      assert.match(session.lostReason, /^connection lost: /);
      assert.deepEqual(holds, [`session lost: ${session.lostReason}`]);
      assert.equal((await info(b, key)).owner, 'next');
      assert.equal(await waiting.release(), true);
    });

    await t.test('LOCKDELAY after an unclean loss; none after close()', async () => {
      const session = await new Session(a, 30000, { bound: true, lockDelay: 400 }).open();
      assert.equal(session.lockDelay, 400);
      assert.equal((await session.info()).lockdelay, 400);
      const key = fresh('delay');
      const lock = new Lock(a, key, 0, { session, feed: false });
      assert.equal(await lock.acquire(), true);
      const { bound } = await session.info();
      assert.equal(await send(b, 'CLIENT', 'KILL', 'ID', bound), 1);
      const other = new Lock(b, key, 30000, { owner: 'other' });
      const delayed = await until('the lock-delay', async () => {
        const st = await info(b, key);
        return st !== null && st.delayed !== undefined ? st : null;
      });
      assert.ok(delayed.delayed > 0 && delayed.delayed <= 400, String(delayed.delayed));
      assert.deepEqual(delayed.holders, []);
      assert.equal(await other.acquire({ timeout: 0 }), false); // nobody in the delay
      assert.equal(await other.acquire({ timeout: 5000 }), true); // granted when it ends
      assert.equal(await other.release(), true);

      const clean = await new Session(a, 30000, { lockDelay: 400 }).open();
      const held = new Lock(a, key, 0, { session: clean });
      assert.equal(await held.acquire(), true);
      assert.equal(await clean.close(), 1);
      assert.equal(await other.acquire({ timeout: 0 }), true); // close() is clean: no delay
      assert.equal(await other.release(), true);
    });

    await t.test('every lock kind in a session', async () => {
      const session = await new Session(a, 30000).open();
      const key = fresh('kinds');
      const sem = new Semaphore(a, `${key}:sem`, 2, 0, { session });
      const rw = new ReadWriteLock(a, `${key}:rw`, 0, { session });
      const multi = new MultiLock(a, [`{${key}}:a`, `{${key}}:b`], 0, { session });
      const plain = new Lock(a, `${key}:plain`, 5000, { session }); // its own deadline too
      assert.equal(await sem.acquire(), true);
      assert.equal(await rw.read.acquire(), true);
      assert.equal(await multi.acquire(), true);
      assert.equal(await plain.acquire(), true);
      assert.equal((await session.info()).holds, 5);
      assert.equal(await send(b, 'PTTL', `{${key}}:a`), -1);
      const pttl = await send(b, 'PTTL', `${key}:plain`);
      assert.ok(pttl > 4000 && pttl <= 5000, String(pttl));
      assert.equal(await sem.release(), true);
      assert.equal((await session.info()).holds, 4);
      assert.equal(await session.close(), 4);
      for (const k of [`${key}:rw`, `{${key}}:a`, `{${key}}:b`, `${key}:plain`]) assert.equal(await send(b, 'EXISTS', k), 0);
    });
  });
}

test('arguments refused before anything is sent', async (t) => {
  const a = await connect('ioredis', server.port);
  t.after(() => close(a));
  const session = new Session(a, 1000);
  assert.throws(() => new Lock(a, 'x', 0), RangeError); // ttl 0 only in a session
  assert.throws(() => new Lock(a, 'x', 1000, { session, watchdog: true }), {
    name: 'RangeError',
    message: "a lock in a session runs no watchdog: the session's keepalive covers it",
  });
  assert.throws(() => new Session(a, 1000, { lockDelay: 60001 }), {
    name: 'RangeError',
    message: 'lockDelay must be at most 60000 ms, got 60001',
  });
  assert.throws(() => new Session(a, 1000, { keepalivePeriod: 1000 }), {
    name: 'RangeError',
    message: 'keepalivePeriod must be shorter than the ttl',
  });
  await assert.rejects(new Lock(a, 'x', 0, { session }).acquire(), {
    name: 'LockError',
    message: 'the session is not open: call open() first',
  });
  await session.open();
  await assert.rejects(session.open(), { name: 'LockError', message: 'this session object was opened already; make a new one' });
  assert.equal(await session.close(), 0);
});

test('a server error from OPEN is passed on as the client library reports it', async (t) => {
  const a = await connect('ioredis', server.port);
  t.after(() => close(a));
  await assert.rejects(new Session(a, 1e12).open(), (e) => /^ERR /.test(e.message));
});
