'use strict';
// Election (lib/election.js) against a real server: campaign in FIFO order, leader(), resign,
// observe() (every change including "no leader", a resynchronisation after its pub/sub
// connection is killed), with every client library; a leader killed (SIGKILL, bound session: the
// next leads within milliseconds) and a leader paused (SIGSTOP) past its ttl (the next term is
// larger, the old leader's fenced writes are refused), candidates being child processes
// (test/candidate.js).

const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const readline = require('node:readline');
const { spawn } = require('node:child_process');
const { serverForFile, freshKeys, until, waiters, clientId } = require('./harness');
const { KINDS, connect, connectPair, send, close } = require('./clients');
const { Election, Session, StaleTokenError, fencedCall } = require('..');
const { feedFor } = require('../lib/feed');

const server = serverForFile();
const fresh = freshKeys('election-');

/**
 * Run `fn(changes, la)` with `changes` an observer of `election` that has reported its first
 * state ("no leader") and then the leadership `la` of candidate "a" (seq 1); the observer is
 * closed whatever `fn` does.
 */
async function observedFromA(election, fn) {
  const changes = election.observe();
  try {
    assert.deepEqual(await changes.get(5000), { leader: null, resync: true, seq: 0 }); // the state when it began
    const la = await election.campaign('a');
    assert.deepEqual(await changes.get(5000), { leader: { value: 'a', term: la.term }, resync: false, seq: 1 });
    await fn(changes, la);
  } finally {
    changes.close();
  }
}

for (const kind of KINDS) {
  test(`${kind}`, async (t) => {
    const [a, b] = await connectPair(t, kind, server.port);

    await t.test('campaign, leader, resign', async () => {
      const key = fresh('basic');
      assert.equal(await new Election(a, key).leader(), null);
      const ea = new Election(a, key);
      const eb = new Election(b, key);
      const first = await ea.campaign('node-a:7000');
      assert.equal(first.value, 'node-a:7000');
      assert.ok(first.term > 0);
      assert.equal(first.lost, false);
      assert.deepEqual(await ea.leader(), { value: 'node-a:7000', term: first.term });
      const campaign = eb.campaign('node-b:7000', { timeout: 10000 });
      await waiters(a, key, 1);
      assert.deepEqual(await eb.leader(), { value: 'node-a:7000', term: first.term }); // a waiting candidate does not lead
      assert.equal(await ea.resign(), true);
      const second = await campaign;
      assert.ok(second.term > first.term);
      assert.deepEqual(await ea.leader(), { value: 'node-b:7000', term: second.term });
      assert.equal(first.lost, false); // a resignation is no loss
      assert.equal(await new Election(a, key).campaign('node-c:7000', { timeout: 50 }), null); // timed out
      assert.equal(await second.resign(), true);
      assert.equal(await eb.leader(), null);
      assert.equal(await ea.resign(), false); // nothing left to resign
    });

    await t.test('campaign in a session: no deadline of its own, ended with the session', async () => {
      const key = fresh('session');
      const session = await new Session(a, 30000).open();
      const leadership = await new Election(a, key, { session }).campaign('in-session');
      assert.equal(await send(b, 'PTTL', key), -1);
      assert.deepEqual(await new Election(b, key).leader(), { value: 'in-session', term: leadership.term });
      assert.equal(await session.close(), 1);
      assert.equal(await new Election(b, key).leader(), null);
    });

    await t.test('observe reports every change, "no leader" included', async () => {
      const key = fresh('observe');
      const election = new Election(a, key);
      await observedFromA(election, async (changes, la) => {
        const campaign = new Election(b, key).campaign('b', { timeout: 10000 });
        await waiters(a, key, 1);
        assert.equal(await la.resign(), true);
        const lb = await campaign;
        // A handoff is one change: no "no leader" between a and b.
        assert.deepEqual(await changes.get(5000), { leader: { value: 'b', term: lb.term }, resync: false, seq: 2 });
        // b's hold is watched through its own client's feed once checked against LOCK.INFO.
        await until("b's feed to check its hold", () => lb.lock._feedSub !== null && lb.lock._feedSub.checked.size === 1);
        assert.equal(await send(a, 'DEL', key), 1);
        assert.deepEqual(await changes.get(5000), { leader: null, resync: false, seq: 3 });
        // And b heard of it, through its own client's feed.
        await until('b told of its loss', () => lb.lost);
        assert.equal(lb.lostReason, 'feed: deleted');
        const lc = await election.campaign('c');
        assert.deepEqual(await changes.get(5000), { leader: { value: 'c', term: lc.term }, resync: false, seq: 4 });
        assert.equal(await lc.resign(), true);
        assert.deepEqual(await changes.get(5000), { leader: null, resync: false, seq: 5 });
        await assert.rejects(changes.get(200), { code: 'ETIMEDOUT' }); // nothing else happened
      });
    });

    await t.test('observe resynchronises after a gap in the sequence numbers', async () => {
      const key = fresh('gap');
      await observedFromA(new Election(a, key), async (changes, la) => {
        // A message as if seq 2 had been lost on the way (pub/sub delivers at most once): the
        // feed reads the state again, and reports what it found.
        const feed = feedFor(a, key);
        const { channel } = feed._keys.get(key);
        feed._message(channel, `3 acquired ${la.term + 5} 1000 ghost`);
        // The state still shows a: nothing to report (the message alone is no proof).
        await until('the state read again', () => feed._keys.get(key).pending === null);
        assert.equal(changes._observer.queue.length, 0);
        assert.equal(await la.resign(), true);
        assert.deepEqual(await changes.get(5000), { leader: null, resync: false, seq: 2 });
      });
    });

    await t.test('observe resynchronises after its pub/sub connection is killed', async () => {
      const key = fresh('resync');
      await observedFromA(new Election(a, key), async (changes, la) => {
        const id = await clientId(b, `redislock-feed-sub-${feedFor(a, key).id}`);
        assert.equal(await send(b, 'CLIENT', 'KILL', 'ID', id), 1);
        // The feed reconnects and reads the state again: a resynchronisation, whatever changed
        // meanwhile (here the leader changes as soon as the kill is done; the watch ended with
        // the connection, so the new one starts the key's seq again).
        assert.equal(await la.resign(), true);
        const lb = await new Election(b, key).campaign('b');
        const seen = [];
        while (seen.length === 0 || seen[seen.length - 1].leader === null || seen[seen.length - 1].leader.term !== lb.term) {
          assert.ok(seen.length < 10, `b never reported as leader: ${JSON.stringify(seen)}`);
          seen.push(await changes.get(5000));
        }
        assert.ok(seen.some((c) => c.resync), JSON.stringify(seen));
        assert.deepEqual(seen[seen.length - 1].leader, { value: 'b', term: lb.term });
        assert.equal(await lb.resign(), true);
        assert.equal((await changes.get(5000)).leader, null);
      });
    });
  });
}

/** A candidate process (test/candidate.js) and the lines it prints. */
function spawnCandidate(key, value, ttl, ...extra) {
  const proc = spawn(process.execPath, [path.join(__dirname, 'candidate.js'), String(server.port), key, value, String(ttl), ...extra], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  proc.stderr.on('data', (d) => (stderr += d));
  const lines = [];
  const waiting = [];
  readline.createInterface({ input: proc.stdout }).on('line', (line) => {
    const w = waiting.shift();
    if (w) w(line.split(' '));
    else lines.push(line.split(' '));
  });
  proc.readLine = (timeout = 20000) =>
    lines.length > 0
      ? Promise.resolve(lines.shift())
      : new Promise((resolve, reject) => {
          const timer = setTimeout(() => reject(new Error(`no line from ${value} within ${timeout} ms (exit ${proc.exitCode}): ${stderr}`)), timeout);
          waiting.push((l) => {
            clearTimeout(timer);
            resolve(l);
          });
        });
  proc.exited = new Promise((resolve) => proc.once('exit', (code) => resolve(code)));
  return proc;
}

test('the leader killed (bound session): the next leads within milliseconds', async (t) => {
  const a = await connect('ioredis', server.port);
  t.after(() => close(a));
  const key = fresh('killed');
  const election = new Election(a, key);
  const candidates = [];
  t.after(() => candidates.forEach((p) => p.kill('SIGKILL')));
  const changes = election.observe();
  t.after(() => changes.close());
  assert.equal((await changes.get(5000)).leader, null);
  let first;
  for (const [i, value] of ['c1', 'c2', 'c3'].entries()) {
    // One at a time: the queue order is known.
    candidates.push(spawnCandidate(key, value, 30000, 'bound'));
    if (i === 0) {
      assert.equal((await candidates[0].readLine())[0], 'leader');
      first = (await changes.get(10000)).leader;
      assert.equal(first.value, 'c1');
    } else {
      await waiters(a, key, i);
    }
  }
  const disconnected = async () =>
    Number(/lock_sessions_disconnected:(\d+)/.exec(String(await send(a, 'INFO', 'lock')))[1]);
  const before = await disconnected();
  const killed = performance.now();
  candidates[0].kill('SIGKILL');
  const second = await changes.get(10000);
  const took = performance.now() - killed;
  assert.equal(second.leader.value, 'c2');
  assert.ok(second.leader.term > first.term);
  assert.equal(second.resync, false);
  assert.deepEqual(await candidates[1].readLine(), ['leader', String(second.leader.term)]);
  assert.deepEqual(await election.leader(), second.leader);
  // The leader's session (ttl 30 s) ended with its connection; how soon is make bench's row.
  assert.equal(await disconnected(), before + 1);
  t.diagnostic(`takeover observed ${took.toFixed(1)} ms after SIGKILL`);
  candidates[1].kill('SIGKILL');
  const third = (await changes.get(10000)).leader;
  assert.equal(third.value, 'c3');
  assert.ok(third.term > second.leader.term);
});

test('the leader paused past its ttl: the next term is larger, the old fenced writes are refused', async (t) => {
  const a = await connect('ioredis', server.port);
  t.after(() => close(a));
  const key = fresh('paused');
  const candidates = [spawnCandidate(key, 'p1', 600)];
  t.after(() =>
    candidates.forEach((p) => {
      p.kill('SIGCONT');
      p.kill('SIGKILL');
    })
  );
  assert.equal((await candidates[0].readLine())[0], 'leader');
  const old = await new Election(a, key).leader();
  assert.equal(old.value, 'p1');
  candidates.push(spawnCandidate(key, 'p2', 600));
  await waiters(a, key, 1);
  candidates[0].kill('SIGSTOP'); // no renewal, no write, past the 600 ms ttl
  const line = await candidates[1].readLine();
  assert.equal(line[0], 'leader');
  assert.ok(Number(line[1]) > old.term);
  assert.deepEqual(await new Election(a, key).leader(), { value: 'p2', term: Number(line[1]) });
  // The old term's writes are refused from now on, wherever they come from.
  await assert.rejects(fencedCall(a, key, old.term, 'SET', `${key}:data`, 'stale'), StaleTokenError);
  candidates[0].kill('SIGCONT');
  assert.equal((await candidates[0].readLine())[0], 'lost');
  assert.deepEqual(await candidates[0].readLine(), ['refused', String(old.term)]);
  assert.equal(await candidates[0].exited, 0);
  await until('the new leader to write', async () => (await send(a, 'GET', `${key}:data`)) === 'p2');
});
