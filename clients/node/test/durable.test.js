'use strict';
// durable: n: an acquire succeeds only once n replicas acknowledged the grant (WAIT), against a
// primary with one replica; the replica SIGSTOPped shows the distinct outcome and no grant left.

const test = require('node:test');
const assert = require('node:assert/strict');
const { startServer, freshKeys, waiters } = require('./harness');
const { KINDS, connect, send, close } = require('./clients');
const { Lock, DurabilityError, DurableUnsupportedError } = require('..');

let primary;
let replica;
test.before(async () => {
  primary = await startServer();
  replica = await startServer(['--replica-of', String(primary.port)]);
});
test.after(async () => {
  process.kill(replica.pid, 'SIGCONT');
  await replica.stop();
  await primary.stop();
});

const fresh = freshKeys('');

for (const kind of KINDS) {
  test(`${kind}`, async (t) => {
    const a = await connect(kind, primary.port);
    const b = await connect(kind, primary.port);
    const onReplica = await connect(kind, replica.port);
    t.after(async () => {
      await close(a);
      await close(b);
      await close(onReplica);
    });

    await t.test('with the replica up, a durable grant is on the replica when acquire resolves', async () => {
      const key = fresh('durable');
      const lock = new Lock(a, key, 30000, { durable: 1, durableTimeout: 2000 });
      assert.equal(await lock.acquire({ timeout: 0 }), true);
      assert.equal(await send(onReplica, 'LOCK.FENCE', key), lock.token);
      assert.equal(await lock.release(), true);
    });

    await t.test('a durable grant handed over from the queue is waited for too', async () => {
      const key = fresh('durable-wait');
      const holder = new Lock(b, key, 30000);
      await holder.acquire();
      const lock = new Lock(a, key, 30000, { durable: 1, durableTimeout: 2000 });
      const got = lock.acquire({ timeout: 10000 });
      await waiters(b, key, 1);
      await holder.release();
      assert.equal(await got, true);
      assert.equal(await send(onReplica, 'LOCK.FENCE', key), lock.token);
      assert.equal(await lock.release(), true);
    });

    await t.test('replica stopped: DurabilityError, the grant released, a held lock kept', async () => {
      const key = fresh('durable-stop');
      const kept = new Lock(a, fresh('durable-kept'), 30000, { durable: 1, durableTimeout: 200 });
      assert.equal(await kept.acquire({ timeout: 0 }), true);
      const keptToken = kept.token;
      process.kill(replica.pid, 'SIGSTOP');
      try {
        const lock = new Lock(a, key, 30000, { durable: 1, durableTimeout: 200 });
        await assert.rejects(lock.acquire({ timeout: 0 }), (e) => {
          assert.ok(e instanceof DurabilityError, String(e));
          assert.equal(e.acknowledged, 0);
          assert.equal(e.wanted, 1);
          assert.equal(e.released, true);
          assert.equal(e.heldBefore, false);
          assert.equal(e.mayStayHeld, false);
          assert.equal(e.message, `"${key}": 0 of 1 replicas acknowledged the grant within 200 ms; the grant was released`);
          return true;
        });
        assert.equal(lock.token, null);
        assert.equal(await send(b, 'LOCK.INFO', key), null);
        assert.equal(await send(b, 'EXISTS', key), 0);

        // An idempotent retry of a hold this lock already had: that hold is not given back.
        await assert.rejects(kept.acquire({ timeout: 0 }), (e) => {
          assert.ok(e instanceof DurabilityError);
          assert.equal(e.heldBefore, true);
          assert.equal(e.released, false);
          return true;
        });
        assert.equal(kept.token, keptToken);
        assert.equal(await send(b, 'LOCK.FENCE', kept.name), keptToken);

        // The release fails too (this user may not LOCK.RELEASE): the error says so.
        const user = `durable-${kind.replace(/\W/g, '')}`;
        assert.equal(await send(b, 'ACL', 'SETUSER', user, 'on', '>pw', '~*', '&*', '+@all', '-lock.release'), 'OK');
        const limited = await connect(kind, primary.port, { username: user, password: 'pw' });
        t.after(() => close(limited));
        const stuck = new Lock(limited, fresh('durable-stuck'), 30000, { durable: 1, durableTimeout: 200 });
        await assert.rejects(stuck.acquire({ timeout: 0 }), (e) => {
          assert.ok(e instanceof DurabilityError);
          assert.equal(e.released, false);
          assert.equal(e.mayStayHeld, true);
          assert.match(e.message, /releasing it failed too \(NOPERM.*the lock may stay held until its ttl \(30000 ms\) runs out$/);
          return true;
        });
        assert.equal((await send(b, 'LOCK.INFO', stuck.name))[1], stuck.owner);
      } finally {
        process.kill(replica.pid, 'SIGCONT');
      }
      assert.equal(await kept.release(), true);
    });
  });
}

test('durable is refused below Redis 7.0.12, before anything is sent', async () => {
  const sent = [];
  // A stand-in for an old server: only INFO answers (no such server with the module here).
  const old = {
    call: async (...args) => {
      sent.push(args.join(' '));
      return args[0] === 'INFO' ? '# Server\r\nredis_version:7.0.11\r\n' : null;
    },
    duplicate() {
      throw new Error('not used');
    },
  };
  await assert.rejects(new Lock(old, 'k', 1000, { durable: 1 }).acquire(), (e) => {
    assert.ok(e instanceof DurableUnsupportedError);
    assert.equal(
      e.message,
      'durable needs Redis 7.0.12 or later (WAIT after a blocked grant counts it only from 7.0.12); this server reports redis_version 7.0.11'
    );
    return true;
  });
  assert.deepEqual(sent, ['INFO server']);
});
