'use strict';
// The client's default session (lib/default-session.js) against a real server, with every client
// library: a lock made without `session` joins its client's one bound session, so a holder
// *process* killed with SIGKILL hands its lock on when the server sees its connection close (plus
// the 500 ms grace), long before the hold's ttl; `session: null` keeps the ttl-only hold; one
// session per client whatever the number and kind of locks; a CLIENT KILL of its connection (the
// process alive) is re-ATTACHed and keeps every hold; closing the client closes it, and never keeps
// the process alive; an acquire whose session ended while it waited queues again in a new one.
//
// Whether a hold was handed on by the session or by its ttl is read from the server's clock (TIME)
// and the old hold's ttl (LOCK.INFO), never from how long the test waited.

const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const readline = require('node:readline');
const { spawn } = require('node:child_process');
const { serverForFile, ownServer, freshKeys, until, info, waiters } = require('./harness');
const { KINDS, connect, connectPair, send, close } = require('./clients');
const { Lock, Semaphore, ReadWriteLock, MultiLock, Election } = require('..');
const defaults = require('../lib/default-session');

const server = serverForFile();
const fresh = freshKeys('default-');

// --- reading the server ------------------------------------------------------------------

/** A flat map reply (RESP2 array, a Map or an object) as a plain object. */
function pairs(reply) {
  if (reply === null) return null;
  if (Array.isArray(reply)) {
    const out = {};
    for (let i = 0; i < reply.length; i += 2) out[String(reply[i])] = reply[i + 1];
    return out;
  }
  return reply instanceof Map ? Object.fromEntries(reply) : { ...reply };
}

async function sessionInfo(client, id) {
  return pairs(await send(client, 'LOCK.SESSION', 'INFO', id));
}

/** INFO lock as numbers by field. */
async function lockStats(client) {
  const out = {};
  for (const line of String(await send(client, 'INFO', 'lock')).split('\r\n')) {
    const m = /^(\w+):(\d+)$/.exec(line);
    if (m) out[m[1]] = Number(m[2]);
  }
  return out;
}

/** The server's clock in ms (TIME). */
async function serverMs(client) {
  const [seconds, micros] = (await send(client, 'TIME')).map(Number);
  return seconds * 1000 + Math.floor(micros / 1000);
}

/** The holders of `key` as objects (LOCK.INFO's `holders`). */
async function holders(client, key) {
  const i = await info(client, key);
  return i === null ? [] : i.holders.map(pairs);
}

async function namedConnections(client, name) {
  const list = String(await send(client, 'CLIENT', 'LIST'));
  return list.split('\n').filter((l) => l.includes(` name=${name} `));
}

async function commandCalls(client, name) {
  const m = new RegExp(`cmdstat_${name.replace('|', '\\|')}:calls=(\\d+)`).exec(String(await send(client, 'INFO', 'commandstats')));
  return m ? Number(m[1]) : 0;
}

// --- child processes ------------------------------------------------------------------------

/** A process (test/default-holder.js or candidate.js) and the lines it prints. */
function spawnNode(t, file, args) {
  const proc = spawn(process.execPath, [path.join(__dirname, file), ...args.map(String)], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  proc.stderr.on('data', (d) => (stderr += d));
  const lines = [];
  let wake = null;
  readline.createInterface({ input: proc.stdout }).on('line', (line) => {
    lines.push(line);
    if (wake) wake();
  });
  proc.exited = new Promise((resolve) => proc.once('exit', (code, signal) => resolve(code === null ? signal : code)));
  proc.exited.then(() => wake && wake());
  proc.readLine = async (timeout = 30000) => {
    const end = Date.now() + timeout;
    while (lines.length === 0) {
      if (proc.exitCode !== null || proc.signalCode !== null || Date.now() > end) {
        throw new Error(`${file}: no line (exit ${proc.exitCode ?? proc.signalCode}) ${stderr}`);
      }
      await new Promise((resolve) => {
        wake = resolve;
        setTimeout(resolve, 100);
      });
    }
    return lines.shift().split(' ');
  };
  t.after(() => proc.kill('SIGKILL'));
  return proc;
}

/** A holder process that took `key` as the README's first example does; its token. */
async function spawnHolder(t, key, ttl, mode, lib, name) {
  const proc = spawnNode(t, 'default-holder.js', [server.port, key, ttl, mode, lib, ...(name ? [name] : [])]);
  const line = await proc.readLine();
  assert.equal(line[0], 'held', line.join(' '));
  return { proc, token: Number(line[1]) };
}

// --- a process killed ------------------------------------------------------------------------

for (const lib of ['ioredis', 'node-redis']) {
  test(`a killed holder process (${lib}) is handed on long before its ttl`, async (t) => {
    // The README's first example in a process of its own: new Lock(redis, name, 30_000), no
    // session option. SIGKILL: the waiter is granted while the dead hold had most of its 30 s.
    const [a] = await connectPair(t, 'ioredis', server.port);
    const key = fresh('killed');
    const { proc, token } = await spawnHolder(t, key, 30000, 'default', lib);
    assert.equal((await info(a, key)).token, token);
    const serial = (await holders(a, key))[0].session;
    assert.ok(serial !== undefined && serial !== null, 'the hold is in a session');
    const waiter = new Lock(a, key, 30000, { session: null });
    const granted = waiter.acquire({ timeout: 20000 });
    await waiters(a, key, 1);
    const left = (await info(a, key)).ttl;
    const at = await serverMs(a);
    const before = await lockStats(a);
    proc.kill('SIGKILL');
    assert.equal(await granted, true);
    const grantedAt = await serverMs(a);
    assert.ok(waiter.token > token);
    // The old hold's ttl left at the grant, by the server's clock: far from run out.
    assert.ok(left - (grantedAt - at) > 20000, `${left} - ${grantedAt - at}`);
    const after = await lockStats(a);
    assert.equal(after.lock_sessions_detached, before.lock_sessions_detached + 1);
    assert.equal(after.lock_sessions_grace_expired, before.lock_sessions_grace_expired + 1);
    assert.equal(await waiter.release(), true);
  });
}

test('session: null keeps the ttl behaviour: a killed holder frees nothing', async (t) => {
  const [a] = await connectPair(t, 'ioredis', server.port);
  const key = fresh('none');
  const name = `holder-${process.pid}-none`;
  const { proc, token } = await spawnHolder(t, key, 30000, 'none', 'ioredis', name);
  assert.equal((await holders(a, key))[0].session, undefined);
  proc.kill('SIGKILL');
  await proc.exited;
  // The server has seen every connection of the holder close.
  await until('the holder connections closed', async () => (await namedConnections(a, name)).length === 0);
  const i = await info(a, key);
  assert.equal(i.token, token);
  assert.ok(i.ttl > 20000, String(i.ttl));
  const waiter = new Lock(a, key, 30000, { session: null });
  assert.equal(await waiter.acquire({ timeout: 0 }), false);
  assert.equal(waiter.session, undefined);
  await send(a, 'DEL', key);
});

test('an election without a session elects the next leader promptly after a kill', async (t) => {
  const [a] = await connectPair(t, 'ioredis', server.port);
  const key = fresh('election');
  const first = spawnNode(t, 'candidate.js', [server.port, key, 'c1', 30000, 'default']);
  assert.equal((await first.readLine())[0], 'leader');
  const second = spawnNode(t, 'candidate.js', [server.port, key, 'c2', 30000, 'default']);
  await waiters(a, key, 1);
  const left = (await info(a, key)).ttl;
  const at = await serverMs(a);
  first.kill('SIGKILL');
  assert.equal((await second.readLine())[0], 'leader');
  // c2 leads while c1's 30 s leadership still had more than 20 s.
  assert.ok(left - ((await serverMs(a)) - at) > 20000);
  assert.equal((await new Election(a, key).leader()).value, 'c2');
  second.kill('SIGKILL');
  await second.exited;
});

// --- in one process, with every client library -------------------------------------------------

for (const kind of KINDS) {
  test(`${kind}`, async (t) => {
    const [a, b] = await connectPair(t, kind, server.port);

    for (const watchdog of [false, true]) {
      await t.test(`the hold keeps its own ttl in the default session (watchdog: ${watchdog})`, async () => {
        const key = fresh('ttl');
        const lock = new Lock(a, key, 5000, { watchdog, watchdogPeriod: watchdog ? 200 : undefined });
        assert.equal(await lock.acquire(), true);
        assert.ok(lock.session instanceof defaults.DefaultSession);
        assert.equal((await holders(b, key))[0].session, lock.session.serial);
        const pttl = Number(await send(b, 'PTTL', key));
        assert.ok(pttl > 4000 && pttl <= 5000, String(pttl));
        assert.equal(await lock.extend(20000), true);
        const extended = Number(await send(b, 'PTTL', key));
        assert.ok(extended > 19000 && extended <= 20000, String(extended));
        assert.equal(await lock.release(), true);
        assert.equal(await info(b, key), null);
      });
    }

    await t.test('session: null and lockDelay use no default session', async () => {
      for (const options of [{ session: null }, { lockDelay: 100 }]) {
        const key = fresh('plain');
        const lock = new Lock(a, key, 5000, options);
        assert.equal(await lock.acquire(), true);
        assert.equal(lock.session, undefined);
        assert.equal((await holders(b, key))[0].session, undefined);
        assert.equal(await lock.release(), true);
      }
      const election = new Election(a, fresh('plain-e'), { session: null, ttl: 5000 });
      const leader = await election.campaign('me', { timeout: 0 });
      assert.equal(leader.lock.session, undefined);
      assert.equal(leader.lock.watchdog, true);
      await leader.resign();
    });

    await t.test('a CLIENT KILL of the bound connection keeps every hold (re-ATTACHed)', async () => {
      const key = fresh('blip');
      const lost = [];
      const onLost = (lock) => lost.push(lock);
      const locks = [
        new Lock(a, `${key}:a`, 30000, { onLost }),
        new Semaphore(a, `${key}:s`, 2, 30000, { onLost }),
        new MultiLock(a, [`${key}:m1`, `${key}:m2`], 30000, { onLost }),
      ];
      for (const lock of locks) assert.equal(await lock.acquire({ timeout: 0 }), true);
      const session = locks[0].session;
      const before = await sessionInfo(b, session.id);
      assert.equal(before.grace, 500);
      assert.equal(before.detached, null);
      const stats = await lockStats(b);
      assert.equal(Number(await send(b, 'CLIENT', 'KILL', 'ID', before.bound)), 1);
      const now = await until('re-attached', async () => {
        const i = await sessionInfo(b, session.id);
        return i !== null && i.bound !== null && String(i.bound) !== String(before.bound) ? i : null;
      });
      assert.equal(now.detached, null);
      assert.deepEqual(await namedConnections(b, `redislock-session-${session.serial}`).then((l) => l.map((x) => /id=(\d+)/.exec(x)[1])), [String(now.bound)]);
      assert.equal((await lockStats(b)).lock_sessions_reattached, stats.lock_sessions_reattached + 1);
      // Every hold kept, same token (LOCK.FENCE), nothing reported lost.
      assert.equal(Number(await send(b, 'LOCK.FENCE', `${key}:a`, locks[0].token)), 1);
      assert.equal(Number(await send(b, 'LOCK.FENCE', `${key}:s`, locks[1].token)), 1);
      assert.equal(Number(await send(b, 'LOCK.FENCE', `${key}:m1`, locks[2].tokens[0])), 1);
      assert.equal(Number(await send(b, 'LOCK.FENCE', `${key}:m2`, locks[2].tokens[1])), 1);
      assert.equal(session.lost, false);
      assert.deepEqual(lost, []);
      // And the session lives on: a keepalive on the new connection, a new hold in it.
      assert.equal((await session._keepalive()) > 9000, true);
      const more = new Lock(a, `${key}:b`, 30000);
      assert.equal(await more.acquire({ timeout: 0 }), true);
      assert.equal(more.session, session);
      for (const lock of [...locks, more]) assert.equal(await lock.release(), true);
    });
  });

  test(`${kind}: one default session per client, closed with the client`, async (t) => {
    const { server: own, a, b } = await ownServer(t, kind);
    const key = fresh('one');
    const before = await lockStats(b);
    const locks = [
      new Lock(a, `${key}:a`, 5000),
      new Lock(a, `${key}:b`, 5000, { watchdog: true }),
      new Semaphore(a, `${key}:sem`, 2, 5000),
      new ReadWriteLock(a, `${key}:rw`, 5000).read,
      new MultiLock(a, [`${key}:m1`, `${key}:m2`], 5000),
    ];
    for (const lock of locks) assert.equal(await lock.acquire({ timeout: 0 }), true);
    const leader = await new Election(a, `${key}:e`).campaign('me', { timeout: 5000 });
    assert.notEqual(leader, null);
    // One session for all the holds of the client; another client has its own.
    assert.equal((await lockStats(b)).lock_sessions, before.lock_sessions + 1);
    const session = locks[0].session;
    assert.ok(locks.every((lock) => lock.session === session) && leader.lock.session === session);
    assert.equal((await sessionInfo(b, session.id)).holds, 7); // 5 locks (2 keys of the MultiLock), the leader
    assert.equal((await namedConnections(b, `redislock-session-${session.serial}`)).length, 1);
    const theirs = new Lock(b, `${key}:c`, 5000);
    assert.equal(await theirs.acquire({ timeout: 0 }), true);
    assert.notEqual(theirs.session, session);
    assert.equal((await lockStats(b)).lock_sessions, before.lock_sessions + 2);
    // Closing the client (quit) closes its default session first: every hold released at once.
    await a.quit();
    assert.equal(session.closed, true);
    const after = await lockStats(b);
    assert.equal(after.lock_sessions, before.lock_sessions + 1);
    assert.equal(after.lock_sessions_closed, before.lock_sessions_closed + 1);
    for (const name of ['a', 'b', 'sem', 'rw', 'm1', 'e']) assert.equal(await info(b, `${key}:${name}`), null, name);
    assert.ok(locks.every((lock) => lock.token === null));
    await theirs.release();
    // A client closed with disconnect() (ioredis) or destroy/disconnect (node-redis) too.
    const c = await connect(kind, own.port);
    const lock = new Lock(c, `${key}:d`, 30000);
    assert.equal(await lock.acquire({ timeout: 0 }), true);
    const id = lock.session.id;
    if (typeof c.call === 'function') c.disconnect();
    else await (typeof c.destroy === 'function' ? c.destroy() : c.disconnect());
    await until('the session closed', async () => (await sessionInfo(b, id)) === null);
    assert.equal((await lockStats(b)).lock_sessions_closed, before.lock_sessions_closed + 2);
    assert.equal(await info(b, `${key}:d`), null);
  });
}

// --- without a grace (a module without GRACE, or DEFAULT_GRACE_MS 0) ----------------------------

/** Run `fn` with the default sessions opened without GRACE. */
async function withoutGrace(fn) {
  const saved = defaults.DEFAULT_GRACE_MS;
  defaults.DEFAULT_GRACE_MS = 0;
  try {
    return await fn();
  } finally {
    defaults.DEFAULT_GRACE_MS = saved;
  }
}

for (const kind of KINDS) {
  test(`${kind}: without a grace`, async (t) => {
    const [a, b] = await connectPair(t, kind, server.port);

    await t.test('a killed connection ends the session: each hold reports it, the next acquire opens a new one', () =>
      withoutGrace(async () => {
        const key = fresh('nograce');
        const lost = [];
        const lock = new Lock(a, key, 30000, { onLost: (l) => lost.push(l), feed: false });
        assert.equal(await lock.acquire(), true);
        const session = lock.session;
        assert.equal(session.grace, null);
        assert.equal(Number(await send(b, 'CLIENT', 'KILL', 'ID', (await sessionInfo(b, session.id)).bound)), 1);
        await until('the loss reported', () => lost.length === 1);
        assert.equal(lost[0], lock);
        assert.match(lock.lostReason, /^session lost: connection lost/);
        assert.equal(await info(b, key), null);
        assert.equal(await lock.acquire({ timeout: 0 }), true);
        assert.notEqual(lock.session, session);
        assert.notEqual(lock.session.id, session.id);
        assert.equal(await lock.release(), true);
      })
    );

    await t.test('a re-ATTACH after a blip that the server answers nil reports the loss as "ended"', () =>
      withoutGrace(async () => {
        // The path a blip takes when the grace ran out: the session told it has a grace (the
        // server has none, so it ended the session with its connection), ATTACH answers nil.
        const key = fresh('nil');
        const lost = [];
        const lock = new Lock(a, key, 30000, { onLost: (l) => lost.push(l), feed: false });
        assert.equal(await lock.acquire(), true);
        lock.session.grace = 500;
        const attaches = await commandCalls(b, 'lock.session|attach');
        assert.equal(Number(await send(b, 'CLIENT', 'KILL', 'ID', (await sessionInfo(b, lock.session.id)).bound)), 1);
        await until('the loss reported', () => lost.length === 1);
        assert.equal(lock.lostReason, 'session lost: ended');
        assert.equal(await commandCalls(b, 'lock.session|attach'), attaches + 1);
        assert.equal(lock.session.lostReason, 'ended');
      })
    );

    await t.test('a waiter whose default session ends queues again in a new one', () =>
      withoutGrace(async () => {
        const key = fresh('requeue');
        const holder = new Lock(b, key, 30000, { session: null });
        assert.equal(await holder.acquire(), true);
        const old = await defaults.sessionFor(a, key); // opened before the wait, to kill it
        const waiter = new Lock(a, key, 30000);
        const granted = waiter.acquire({ timeout: 20000 });
        await waiters(b, key, 1);
        assert.equal(waiter.session, old);
        assert.equal(Number(await send(b, 'CLIENT', 'KILL', 'ID', (await sessionInfo(b, old.id)).bound)), 1);
        await until('the waiter queued again', () => waiter.session !== old);
        await waiters(b, key, 1);
        const first = holder.token;
        assert.equal(await holder.release(), true);
        assert.equal(await granted, true);
        assert.ok(waiter.token > first);
        assert.equal((await holders(b, key))[0].session, waiter.session.serial);
        assert.equal(await waiter.release(), true);
      })
    );
  });
}

// --- the process is never kept alive ---------------------------------------------------------------

for (const [lib, closing] of [
  ['ioredis', 'await redis.quit()'],
  ['ioredis', 'redis.disconnect()'],
  ['node-redis', 'await redis.quit()'],
  ['node-redis', 'await redis.disconnect()'],
]) {
  test(`a process that closed its client (${lib}, ${closing}) exits, holds released`, async (t) => {
    const [a] = await connectPair(t, 'ioredis', server.port);
    const key = fresh('exit');
    const make =
      lib === 'ioredis'
        ? `const redis = new (require('ioredis').Redis)(url);`
        : `const redis = require('redis').createClient({ url }); await redis.connect();`;
    const script = `
      const { Lock } = require(${JSON.stringify(path.resolve(__dirname, '..'))});
      (async () => {
        const url = 'redis://127.0.0.1:${server.port}';
        ${make}
        const lock = new Lock(redis, ${JSON.stringify(key)}, 30000, { watchdog: true });
        await lock.acquire();
        console.log('held', lock.token, lock.session.id);
        ${closing};
      })();`;
    const proc = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'inherit'], cwd: __dirname });
    t.after(() => proc.kill('SIGKILL'));
    let out = '';
    proc.stdout.on('data', (d) => (out += d));
    const code = await new Promise((resolve) => proc.once('exit', (c, s) => resolve(c === null ? s : c)));
    assert.equal(code, 0);
    const [word, , id] = out.trim().split(' ');
    assert.equal(word, 'held');
    assert.equal(await sessionInfo(a, id), null);
    assert.equal(await info(a, key), null);
  });
}

test('close() on a test client helper leaves nothing open', async () => {
  // (close() from ./clients: ioredis disconnect(), node-redis quit(); each closes the session.)
  for (const kind of KINDS) {
    const c = await connect(kind, server.port);
    const b = await connect(kind, server.port);
    const lock = new Lock(c, fresh('helper'), 30000);
    assert.equal(await lock.acquire(), true);
    const id = lock.session.id;
    await close(c);
    await until(`${kind}: the session closed`, async () => (await sessionInfo(b, id)) === null);
    await close(b);
  }
});
