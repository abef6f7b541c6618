'use strict';
// A forged change feed (lib/feed.js): messages SPUBLISHed on a lock's channel by an ACL user with
// only `&* +spublish` fool no client. The leader's onLost does not fire and observers keep
// reporting the real leader, because a message that claims a change is confirmed with LOCK.INFO
// first; a real loss and a real new leader still arrive, confirmed by one state read. With every
// client library.

const test = require('node:test');
const assert = require('node:assert/strict');
const { ownServer, freshKeys, until, waiters } = require('./harness');
const { KINDS, connect, send, close } = require('./clients');
const { Election } = require('..');
const { parseInfo } = require('../lib/feed');

const fresh = freshKeys('forgery-');

/** INFO commandstats calls of `command` (0 if never called). */
async function calls(client, command) {
  const text = String(await send(client, 'INFO', 'commandstats'));
  const m = new RegExp(`cmdstat_${command.replace('.', '\\.')}:calls=(\\d+)`).exec(text);
  return m === null ? 0 : Number(m[1]);
}

/** The key's channel, from a watch that ends at once (the feed's own watch stays). */
async function channelOf(client, key) {
  const [channel] = await send(client, 'LOCK.WATCH', key);
  assert.equal(await send(client, 'LOCK.UNWATCH', key), 1);
  return String(channel);
}

for (const kind of KINDS) {
  test(`${kind}: forged messages depose nobody, real changes still arrive`, async (t) => {
    // It adds an ACL user and counts LOCK.INFO calls server-wide: a server of its own.
    const { server, a, b } = await ownServer(t, kind);
    await send(b, 'ACL', 'SETUSER', 'forger', 'on', '>pw', 'resetkeys', 'resetchannels', '&*', '-@all', '+spublish');
    const forger = await connect('ioredis', server.port, { username: 'forger', password: 'pw' });
    t.after(() => close(forger));
    const key = fresh('leader');
    const losses = [];
    const election = new Election(a, key, { ttl: 60000 }); // its watchdog renews every 20 s: no message meanwhile
    const changes = election.observe();
    t.after(() => changes.close());
    assert.deepEqual(await changes.get(5000), { leader: null, resync: true, seq: 0 });
    const la = await election.campaign('a', { onLost: (l) => losses.push([l.lostReason, performance.now()]) });
    const term = la.term;
    assert.deepEqual(await changes.get(5000), { leader: { value: 'a', term }, resync: false, seq: 1 });
    await until('the leadership synced with the feed', () => la.lock._feedSub !== null && la.lock._feedSub.checked.size === 1);
    const channel = await channelOf(b, key);
    const seq = parseInfo(await send(b, 'LOCK.INFO', key)).seq;
    const reads = await calls(b, 'lock.info');

    // Each claims a change; each makes the feed read the state once.
    const forged = [
      `${seq + 1} handoff ${term + 1000} 500 mallory`, // a new leader
      `${seq + 1} released ${term} 0 a`, // the leader's own release
      `${seq + 1} extended ${term} 500 a`, // claims nothing, takes seq + 1 ...
      `${seq + 1} expired ${term} 0 a`, // ... so that a second seq + 1 is a conflict
      `${seq + 100} deleted 0 0 `, // far ahead: read as a gap
      `${seq + 1} demoted 0 0 `, // the server answers as a primary
    ];
    for (const message of forged) assert.equal(await send(forger, 'SPUBLISH', channel, message), 1);
    // Until the feed has read the state for each claim (or, as before these were confirmed,
    // believed one).
    await until(
      'the feed to read the state for the forged claims',
      async () => (await calls(b, 'lock.info')) >= reads + 5 || losses.length > 0 || changes._observer.queue.length > 0,
    );
    assert.deepEqual(changes._observer.queue, [], 'an observer reported a change');
    assert.deepEqual(losses, []);
    assert.equal(la.lost, false);
    assert.deepEqual(await election.leader(), { value: 'a', term });

    // A real handoff: b waits, a's hold is released by the server's own command.
    const campaign = new Election(b, key).campaign('b', { timeout: 10000 });
    await waiters(a, key, 1);
    const released = performance.now();
    assert.equal(await send(b, 'LOCK.RELEASE', key, 'a'), 1);
    const lb = await campaign;
    assert.deepEqual(await changes.get(5000), { leader: { value: 'b', term: lb.term }, resync: false, seq: seq + 1 });
    await until('a told of its loss', () => losses.length > 0);
    assert.equal(losses.length, 1);
    const [reason, at] = losses[0];
    assert.equal(reason, 'feed: handoff to "b"');
    // The reason says the feed told it; how soon is `make bench`'s loss notice row.
    t.diagnostic(`loss reported ${(at - released).toFixed(1)} ms after the release`);
    assert.equal(await lb.resign(), true);
    assert.equal((await changes.get(5000)).leader, null);
  });
}
