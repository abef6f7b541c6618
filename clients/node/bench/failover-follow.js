'use strict';
// How long the Node client takes to follow a planned CLUSTER FAILOVER (issue 34); the rows and
// shape of benches/failover/follow.py (the Python client's).
//
//     node bench/failover-follow.js      (from clients/node; QUICK=1: 1 round, else 4)
//
// On a 3-master, 3-replica cluster started by the workspace's harness (`harness cluster`, as
// test/cluster-failover.test.js does: HARNESS_BIN, REDIS_SERVER, REDIS_LOCK_MODULE), an ioredis
// Cluster with, as the README shows, a Session (ttl 3 s, keepalivePeriod 200 ms) holding a lock,
// and `watch(client, key)` of a second key of the same shard. Each round sends CLUSTER FAILOVER
// to the shard's replica (rounds alternate between the two nodes) and measures, from the moment
// that command answered:
//
// - promoted: the replica's ROLE says master (polled every 2 ms);
// - keepalive: the session's first keepalive answered by the new master: the new master's
//   INFO commandstats count of lock.session|keepalive first above its count before the failover
//   (polled every 2 ms; the session is the only one on the shard, checked with LOCK.SESSION LIST;
//   a keepalive that met MOVED there counts as rejected, not as a call);
// - observer: the watch's first change read from the new master. A raw connection takes the
//   watched key on the new master as soon as its ROLE says master (the Rust, Go and Java clients'
//   observers report only a state that differs from the last, so all four new programs make a
//   change there); this client's resync there reports it. The program also checks that the
//   observer reports that grant (its token).
//
// Then it checks that no hold was lost (the session and its lock not lost, the new master's
// LOCK.FENCE of the lock's token): a lost hold ends the program with exit code 1. Prints each
// round on stderr and the table on stdout. A measurement, not a test: `make bench-failover`.

const { execFileSync } = require('node:child_process');
const os = require('node:os');
const path = require('node:path');
const IORedis = require('ioredis');
const { startCluster } = require('../test/harness');
const { Lock, Session, watch } = require('..');

const QUICK = process.env.QUICK === '1';
const ROUNDS = QUICK ? 1 : 4;
// Redis spaces the failovers of one shard (see follow.py's VOTE_SPACING): a master votes for one
// failover of a given master per cluster-node-timeout x 2, a replica that ran an election waits
// x 4 before its next (the harness's timeout is 5 s).
const VOTE_SPACING = 21000;
const KEEPALIVE = 200;
const PATIENCE = 30000; // the bound on every wait: a wait that runs out ends the round with an error
const POLL = 2;
const TAG = '{bench-failover}';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Wait (every `every` ms) until `f()` resolves to something truthy, at most PATIENCE. */
async function until(what, f, every = POLL) {
  const deadline = performance.now() + PATIENCE;
  for (;;) {
    const v = await f();
    if (v) return v;
    if (performance.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(every);
  }
}

/** A plain connection to one node; every command fails at once when the node is gone. */
function node(port) {
  const c = new IORedis({ port, host: '127.0.0.1', maxRetriesPerRequest: 0, retryStrategy: () => null, commandTimeout: 2000 });
  c.on('error', () => {});
  return c;
}

async function role(c) {
  try {
    return await c.call('ROLE');
  } catch {
    return null;
  }
}

async function calls(c, command) {
  const m = new RegExp(`cmdstat_${command.replace('|', '\\|')}:calls=(\\d+)`).exec(await c.call('INFO', 'commandstats'));
  return m ? Number(m[1]) : 0;
}

/** The ports of the master serving TAG's slot now and of its replica. */
async function shard(conns) {
  let old = null;
  for (const [port, c] of conns) {
    const r = await role(c);
    if (r && r[0] === 'master') {
      try {
        await c.call('LOCK.FENCE', TAG);
        old = port;
      } catch {} // MOVED: another shard's master
    }
  }
  if (old === null) throw new Error('no master serves the tag');
  for (const [port, c] of conns) {
    const r = await role(c);
    if (r && r[0] === 'slave' && Number(r[2]) === old) return { old, fresh: port };
  }
  throw new Error('the tag\'s master has no replica');
}

/** Whether `master`'s CLUSTER NODES lists the node on `replicaPort` as its replica. */
async function knowsReplica(master, replicaPort) {
  const lines = String(await master.call('CLUSTER', 'NODES')).split('\n').map((l) => l.split(' '));
  const me = lines.find((f) => f.length > 3 && f[2].includes('myself'));
  return !!me && lines.some((f) => f.length > 3 && f[1].startsWith(`127.0.0.1:${replicaPort}@`) && f[2].includes('slave') && f[3] === me[0]);
}

/** The changes the watch reports, each with the time it came (performance.now()). */
class Changes {
  constructor(observation) {
    this.items = [];
    this.waiting = null;
    (async () => {
      for (;;) {
        let change;
        try {
          change = await observation.get();
        } catch (e) {
          change = { error: e };
        }
        this.items.push({ at: performance.now(), change });
        if (this.waiting) this.waiting();
        if (change.error) return;
      }
    })();
  }

  /** The next change, within `timeout` ms. */
  async next(timeout = PATIENCE) {
    const deadline = performance.now() + timeout;
    while (this.items.length === 0) {
      const left = deadline - performance.now();
      if (left <= 0) throw new Error(`the observer reported nothing within ${timeout} ms`);
      await new Promise((resolve) => {
        const timer = setTimeout(resolve, left);
        this.waiting = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      this.waiting = null;
    }
    const item = this.items.shift();
    if (item.change.error) throw item.change.error;
    return item;
  }
}

async function oneRound(conns, last, changes, checkHeld) {
  const { old, fresh } = await shard(conns);
  const o = conns.get(old);
  const n = conns.get(fresh);
  const since = Math.max(last.get(old) ?? -Infinity, last.get(fresh) ?? -Infinity);
  const wait = since + VOTE_SPACING - performance.now();
  if (wait > 0) await sleep(wait); // Redis's own vote spacing, not a wait for state (see VOTE_SPACING)
  // A random part of a keepalive period, so that the rounds do not all fall on one phase of the
  // session's keepalive (the spacing is a whole number of periods).
  await sleep(Math.random() * KEEPALIVE);
  await until('a replica in sync', async () => (await o.call('WAIT', 1, 1000)) === 1);
  const before = await calls(n, 'lock.session|keepalive');
  changes.items.length = 0;

  const ok = await n.call('CLUSTER', 'FAILOVER');
  const t0 = performance.now();
  if (ok !== 'OK') throw new Error(`CLUSTER FAILOVER answered ${ok}`);
  last.set(old, t0);
  last.set(fresh, t0);

  // Poll the promotion, then take the watched key there (once), and the keepalive count.
  let promoted = null;
  let probe = null;
  let kept = null;
  const probeKey = TAG + 'probe';
  await until('the promotion, the probe\'s grant and a keepalive on the new master', async () => {
    if (promoted === null && ((await role(n)) || [])[0] === 'master') promoted = performance.now() - t0;
    if (promoted !== null && probe === null) {
      probe = await n.call('LOCK.ACQUIRE', probeKey, 'bench-probe', 60000).catch(() => null);
    }
    if (kept === null && (await calls(n, 'lock.session|keepalive')) > before) kept = performance.now() - t0;
    return promoted !== null && probe !== null && kept !== null;
  });

  const first = await changes.next();
  let change = first.change;
  const deadline = performance.now() + PATIENCE;
  while (!(change.leader && change.leader.term === probe)) {
    change = (await changes.next(Math.max(1, deadline - performance.now()))).change;
  }
  const observed = first.at - t0;

  if ((await n.call('LOCK.RELEASE', probeKey, 'bench-probe')) !== 1) throw new Error('the probe\'s release answered 0');
  while ((await changes.next()).change.leader !== null);
  await checkHeld(n);

  await until('the old master a replica', async () => ((await role(o)) || [])[0] === 'slave');
  // The next round's replica must be in sync, or its CLUSTER FAILOVER times out ...
  await until('its link up', async () => /master_link_status:up/.test(await o.call('INFO', 'replication')));
  // ... and known as a replica to its new master.
  await until('the new master to know its replica', () => knowsReplica(n, old));
  return { promoted, kept, observed };
}

function line(name, values) {
  const v = [...values].sort((a, b) => a - b);
  const median = v.length % 2 ? v[(v.length - 1) / 2] : (v[v.length / 2 - 1] + v[v.length / 2]) / 2;
  return `| ${name} | ${median.toFixed(0)} | ${v[0].toFixed(0)} | ${v[v.length - 1].toFixed(0)} |`;
}

async function run(cluster) {
  const conns = new Map(cluster.nodes.map((x) => [x.port, node(x.port)]));
  const client = new IORedis.Cluster(cluster.nodes.map((x) => ({ host: '127.0.0.1', port: x.port })));
  client.on('error', () => {});
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('the ioredis Cluster was not ready within 30 s')), PATIENCE);
    client.once('ready', () => {
      clearTimeout(timer);
      resolve();
    });
  });
  try {
    const session = await new Session(client, 3000, { key: TAG, keepalivePeriod: KEEPALIVE }).open();
    const lock = new Lock(client, TAG + 'held', 0, { session });
    if (!(await lock.acquire())) throw new Error('the held key is taken');
    const observation = watch(client, TAG + 'probe');
    const changes = new Changes(observation);
    const start = (await changes.next()).change;
    if (start.leader !== null) throw new Error(`the probe key is held at the start: ${JSON.stringify(start)}`);

    const { old } = await shard(conns);
    const sessions = await conns.get(old).call('LOCK.SESSION', 'LIST');
    if (sessions[1].length !== 1) throw new Error(`the shard has ${sessions[1].length} sessions, not the session alone`);

    const checkHeld = async (n) => {
      const fenced = await n.call('LOCK.FENCE', lock.name, lock.token);
      if (fenced !== 1) throw new Error(`HOLD LOST: the new master's LOCK.FENCE of the hold answered ${fenced}`);
      if (session.lost || lock.lost) throw new Error(`HOLD LOST: the client reports ${session.lostReason} / ${lock.lostReason}`);
    };
    const last = new Map();
    const rows = [];
    for (let i = 1; i <= ROUNDS; i++) {
      const r = await oneRound(conns, last, changes, checkHeld);
      process.stderr.write(`round ${i}: ${r.promoted.toFixed(0)} / ${r.kept.toFixed(0)} / ${r.observed.toFixed(0)} ms\n`);
      rows.push(r);
    }
    observation.close();
    await lock.release();
    await session.close();
    return rows;
  } finally {
    client.disconnect();
    for (const c of conns.values()) c.disconnect();
  }
}

async function main() {
  const cluster = await startCluster(['--masters', '3', '--replicas', '1']);
  let rows;
  try {
    rows = await run(cluster);
  } finally {
    await cluster.stop();
  }
  const server = execFileSync(process.env.REDIS_SERVER || 'redis-server', ['--version']).toString().split(' ')[2].replace('v=', '');
  const build = process.env.REDIS_LOCK_MODULE ? path.basename(path.dirname(process.env.REDIS_LOCK_MODULE)) : 'debug';
  const ioredis = require('ioredis/package.json').version;
  console.log([
    `Node client (ioredis ${ioredis} Cluster) following a planned \`CLUSTER FAILOVER\` (${rows.length} round${rows.length === 1 ? '' : 's'}, ` +
      `Redis ${server}, 3 masters + 3 replicas on one ${os.availableParallelism()}-core machine, module ${build} build, ` +
      `session ttl 3 s, keepalive every ${KEEPALIVE / 1000} s, each failover at a random point of that period; ms from the command's reply; no hold lost in any round). ` +
      'Keepalive: the new master\'s `INFO commandstats` count of `lock.session|keepalive` first above its count before ' +
      'the failover, polled every 2 ms. Observer: `watch(client, key)`\'s first change after the failover, the key taken ' +
      'on the new master by a raw `LOCK.ACQUIRE` as soon as its `ROLE` said master (reported by the resync there).',
    '',
    '| from `CLUSTER FAILOVER` answered to | median ms | min | max |',
    '|---|---|---|---|',
    line('the replica\'s `ROLE` is master', rows.map((r) => r.promoted)),
    line('the session\'s first keepalive answered by the new master', rows.map((r) => r.kept)),
    line('the observer\'s first change read from the new master', rows.map((r) => r.observed)),
  ].join('\n'));
}

main().then(
  () => process.exit(0),
  (e) => {
    console.error(`failover-follow: ${e.stack || e}`);
    process.exit(1);
  },
);
