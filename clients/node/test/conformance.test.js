'use strict';
// The conformance suite (<repo>/conformance/cases/*.json) run by the Node package, with each client
// library it supports: ioredis 5, node-redis 5 and node-redis 4.
//
// Every case of every topic file is one test per library (`ioredis topic/i: description`), run
// unchanged: each step
// of the vocabulary (conformance/README.md) is mapped to the package's API here, each error kind
// to its error class (`errorKind`). A case whose needs this runner cannot meet is skipped with the
// reason, never passed. Each step has its own deadline (its wait plus
// STEP_DEADLINE_MS), so no case hangs. The summary per topic (passed / skipped / failed) goes to
// target/conformance/node@<library>.json when the file's tests end.
//
// All cases share one server (flushed between cases), a case that needs a replica gets one for
// its run; the cluster cases a 3-master cluster,
// started on first use, through ioredis's Cluster (node-redis's is not wired here yet).

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const IORedis = require('ioredis');
const { startServer, startCluster } = require('./harness');
const { KINDS, connect, send, close } = require('./clients');
const {
  Lock,
  Semaphore,
  ReadWriteLock,
  MultiLock,
  Session,
  Election,
  watch,
  fencedScript,
  LockBusyError,
  StaleTokenError,
  DurabilityError,
  TimeoutError,
} = require('..');

const ROOT = path.resolve(__dirname, '..', '..', '..');
const CASES_DIR = path.join(ROOT, 'conformance', 'cases');
const RESULTS_DIR = path.join(ROOT, 'target', 'conformance');
const STEP_DEADLINE_MS = 30000;
const CLIENT = 'node';

const topics = fs
  .readdirSync(CASES_DIR)
  .filter((f) => f.endsWith('.json'))
  .sort()
  .map((f) => JSON.parse(fs.readFileSync(path.join(CASES_DIR, f), 'utf8')));

const summaries = {}; // library -> topic -> counts
function record(library, topic, description, outcome, detail, kind) {
  const summary = (summaries[library] ??= {});
  const t = (summary[topic] ??= { passed: 0, skipped: 0, failed: 0, skips: [], failures: [] });
  t[outcome] += 1;
  if (outcome === 'skipped') t.skips.push({ case: description, kind, reason: detail });
  if (outcome === 'failed') t.failures.push({ case: description, error: detail });
}

class Skip extends Error {
  constructor(kind, reason) {
    super(reason);
    this.kind = kind;
  }
}

/** The vocabulary's outcome kind of an error (conformance/README.md, "Errors"). */
function errorKind(e) {
  if (e instanceof LockBusyError) return 'busy';
  if (e instanceof StaleTokenError) return 'stale_token';
  if (e instanceof DurabilityError) return 'not_durable';
  if (e instanceof TimeoutError) return 'timeout';
  if (e instanceof RangeError || e instanceof TypeError) return 'invalid_argument';
  if (isReplyError(e)) return 'server';
  return `unexpected ${e && e.name}: ${e && e.message}`;
}

/** The client library's error reply: ioredis's ReplyError, node-redis's ErrorReply (5: its subclasses). */
function isReplyError(e) {
  for (let p = e; p && p !== Error.prototype; p = Object.getPrototypeOf(p)) {
    if (['ReplyError', 'ErrorReply'].includes(p.constructor?.name)) return true;
  }
  return false;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function poll(what, fn, timeout) {
  const end = Date.now() + timeout;
  for (;;) {
    if (await fn()) return;
    if (Date.now() > end) throw new Error(`timed out after ${timeout} ms waiting for ${what}`);
    await sleep(5);
  }
}

function pairs(reply) {
  if (reply === null) return null;
  const out = {};
  for (let i = 0; i < reply.length; i += 2) out[String(reply[i])] = reply[i + 1];
  return out;
}

/** A reply as JSON holds it: Buffers as text, arrays as arrays. */
function norm(v) {
  if (Buffer.isBuffer(v)) return v.toString();
  if (Array.isArray(v)) return v.map(norm);
  return v === undefined ? null : v;
}

function same(got, want) {
  if (typeof want === 'number' && typeof got === 'string' && /^-?\d+$/.test(got)) return Number(got) === want;
  return JSON.stringify(got) === JSON.stringify(want);
}

/** Runs one case's steps on `client` (`cluster`: an ioredis Cluster). */
class Runner {
  constructor(client) {
    this.r = client;
    this.vars = {};
    this.objs = {};
    this.pending = {};
    this.watches = {};
    this.sessions = [];
  }

  subst(v) {
    if (typeof v === 'string' && v.startsWith('$')) {
      assert.ok(v.slice(1) in this.vars, `no saved value ${v}`);
      return this.vars[v.slice(1)];
    }
    return Array.isArray(v) ? v.map((x) => this.subst(x)) : v;
  }

  async raw(args) {
    return norm(await send(this.r, ...this.subst(args)));
  }

  lockOptions(step) {
    const o = {};
    if ('owner' in step) o.owner = step.owner;
    if ('session' in step) o.session = this.objs[step.session];
    if ('lock_delay' in step) o.lockDelay = step.lock_delay;
    if ('durable' in step) {
      o.durable = step.durable;
      o.durableTimeout = step.durable_timeout ?? 1000;
    }
    if (step.report_loss) o.onLost = () => {};
    if (step.watchdog) o.watchdog = true;
    return o;
  }

  async run(steps) {
    for (const step of steps) {
      let failed = null;
      try {
        await this.withinDeadline(step);
      } catch (e) {
        if (e instanceof Skip || e instanceof assert.AssertionError || !('error' in step)) throw e;
        failed = e;
      }
      if ('error' in step) {
        assert.ok(failed !== null, `${JSON.stringify(step)}: wanted a ${step.error} error, got none`);
        assert.equal(errorKind(failed), step.error, `${step.do}: ${failed}`);
        if ('code' in step) assert.equal(String(failed.message).split(' ')[0], step.code);
      }
    }
  }

  async withinDeadline(step) {
    let timer;
    const limit = (step.wait ?? 0) + STEP_DEADLINE_MS;
    const deadline = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new assert.AssertionError({ message: `${JSON.stringify(step)}: no outcome within ${limit} ms` })), limit);
    });
    try {
      return await Promise.race([this.step(step), deadline]);
    } finally {
      clearTimeout(timer);
    }
  }

  expect(step, got) {
    if ('expect' in step) assert.deepEqual(got, step.expect, `${JSON.stringify(step)}: got ${JSON.stringify(got)}`);
  }

  async step(step) {
    const o = this.objs;
    const v = this.vars;
    switch (step.do) {
      case 'lock':
        o[step.as] = new Lock(this.r, step.key, step.ttl, this.lockOptions(step));
        break;
      case 'semaphore':
        o[step.as] = new Semaphore(this.r, step.key, step.limit, step.ttl, this.lockOptions(step));
        break;
      case 'read_lock':
      case 'write_lock': {
        const rw = new ReadWriteLock(this.r, step.key, step.ttl, this.lockOptions(step));
        o[step.as] = step.do === 'read_lock' ? rw.read : rw.write;
        break;
      }
      case 'multilock':
        o[step.as] = new MultiLock(this.r, step.keys, step.ttl, this.lockOptions(step));
        break;
      case 'session': {
        const options = { bound: Boolean(step.bound) };
        if ('lock_delay' in step) options.lockDelay = step.lock_delay;
        const s = new Session(this.r, step.ttl, options);
        this.sessions.push(s);
        o[step.as] = await s.open();
        break;
      }
      case 'election': {
        const options = { ttl: step.ttl };
        if ('session' in step) options.session = o[step.session];
        o[step.as] = new Election(this.r, step.key, options);
        break;
      }
      case 'acquire':
        this.expect(step, await o[step.lock].acquire({ timeout: step.wait ?? 0 }));
        break;
      case 'start_acquire': {
        const controller = new AbortController();
        const promise = o[step.lock].acquire({ timeout: step.wait, signal: controller.signal });
        promise.catch(() => {}); // looked at by finish or cancel
        this.pending[step.as] = { promise, controller };
        break;
      }
      case 'finish': {
        const { promise } = this.pending[step.pending];
        delete this.pending[step.pending];
        this.expect(step, await promise);
        break;
      }
      case 'cancel': {
        const { promise, controller } = this.pending[step.pending];
        delete this.pending[step.pending];
        controller.abort();
        await assert.rejects(promise, 'the wait ended before it was cancelled');
        break;
      }
      case 'release':
        this.expect(step, await o[step.lock].release());
        break;
      case 'extend':
        this.expect(step, await o[step.lock].extend(step.ttl));
        break;
      case 'held':
        this.expect(step, await o[step.lock].owned());
        break;
      case 'token': {
        const token = o[step.lock].token;
        if ('expect' in step) assert.equal(token, step.expect);
        if ('greater_than' in step) assert.ok(token !== null && token > v[step.greater_than], `token ${token} not > ${v[step.greater_than]}`);
        if ('save' in step) v[step.save] = token;
        break;
      }
      case 'fenced': {
        const [command, key, ...args] = step.command;
        this.expect(step, norm(await o[step.lock].fenced(command, key, ...args)));
        break;
      }
      case 'fenced_script': {
        const lock = o[step.lock];
        const script = fencedScript(this.r, step.body);
        this.expect(step, norm(await script([lock.name, ...step.keys], [lock.token, ...step.args])));
        break;
      }
      case 'hold':
        await o[step.lock].using(async () => {}, { timeout: step.wait });
        break;
      case 'raw': {
        const got = await this.raw(step.command);
        if ('expect' in step) {
          const want = this.subst(step.expect);
          assert.ok(same(got, want), `${step.command}: got ${JSON.stringify(got)}, wanted ${JSON.stringify(want)}`);
        }
        if ('save' in step) v[step.save] = got;
        break;
      }
      case 'wait_raw': {
        // The reply `expect`, or a number `below` / `above` a bound.
        const want = this.subst(step.expect);
        const ok = (got) =>
          'expect' in step ? same(got, want) : typeof got === 'number' && !(got >= (step.below ?? Infinity)) && !(got <= (step.above ?? -Infinity));
        await poll(`${step.command} to answer ${JSON.stringify(step)}`, async () => ok(await this.raw(step.command)), step.timeout);
        break;
      }
      case 'wait_waiters':
        await poll(
          `${step.count} waiter(s) on ${step.key}`,
          async () => ((pairs(await send(this.r, 'LOCK.INFO', step.key)) || { waiters: 0 }).waiters === step.count),
          STEP_DEADLINE_MS,
        );
        break;
      case 'kill_session_connection': {
        const fields = pairs(await send(this.r, 'LOCK.SESSION', 'INFO', o[step.session].id));
        assert.ok(fields !== null && fields.bound !== null, 'the session is not bound');
        assert.equal(await send(this.r, 'CLIENT', 'KILL', 'ID', fields.bound), 1);
        break;
      }
      case 'wait_session_lost':
      case 'wait_lost': {
        const obj = o[step.session ?? step.lock];
        await poll(step.do, async () => obj.lost, step.timeout);
        break;
      }
      case 'close_session':
        this.expect(step, await o[step.session].close());
        break;
      case 'campaign': {
        const leadership = await o[step.election].campaign(step.value, { timeout: step.wait });
        this.expect(step, leadership !== null);
        if (leadership !== null) {
          o[step.as] = leadership;
          if ('save_term' in step) v[step.save_term] = leadership.term;
        }
        break;
      }
      case 'leader': {
        const leader = await o[step.election].leader();
        this.expect(step, leader === null ? null : leader.value);
        break;
      }
      case 'resign':
        this.expect(step, await o[step.leadership].resign());
        break;
      case 'watch':
        this.watches[step.as] = watch(this.r, step.key);
        break;
      case 'observe':
        this.watches[step.as] = o[step.election].observe();
        break;
      case 'next_change': {
        // The iterator protocol: next() resolves {value, done}.
        const result = await this.watches[step.watch].next(step.timeout);
        assert.deepEqual(Object.keys(result).sort(), ['done', 'value']);
        assert.equal(result.done, false);
        const holder = result.value.leader === null ? null : result.value.leader.value;
        if ('expect_holder' in step) assert.equal(holder, step.expect_holder);
        break;
      }
      case 'close_watch': {
        const w = this.watches[step.watch];
        delete this.watches[step.watch];
        w.close();
        assert.deepEqual(await w.next(), { value: undefined, done: true });
        break;
      }
      default:
        throw new Skip('unsupported', `the runner has no step ${JSON.stringify(step.do)}`);
    }
  }

  async cleanup() {
    for (const w of Object.values(this.watches)) w.close();
    for (const { controller, promise } of Object.values(this.pending)) {
      controller.abort();
      await promise.catch(() => {});
    }
    for (const s of this.sessions) await s.close().catch(() => {});
  }
}

// --- servers --------------------------------------------------------------------------------

let server = null;
let cluster = null;

async function clientFor(library, needsCluster) {
  if (!needsCluster) {
    const client = await connect(library, server.port);
    await send(client, 'FLUSHALL');
    return client;
  }
  cluster ??= await startCluster(['--masters', '3', '--replicas', '0']);
  const client = new IORedis.Cluster(cluster.nodes.map((n) => ({ host: '127.0.0.1', port: n.port })));
  await client.call('PING');
  await Promise.all(client.nodes('master').map((n) => n.call('FLUSHALL')));
  return client;
}

/** A replica of the server (harness --replica-of), online; stopped after its case. */
async function replicaOf(client) {
  const replica = await startServer(['--replica-of', String(server.port)]);
  try {
    await poll('the replica online', async () => String(await send(client, 'INFO', 'replication')).includes('state=online'), STEP_DEADLINE_MS);
  } catch (e) {
    await replica.stop();
    throw e;
  }
  return replica;
}

test.before(async () => {
  server = await startServer();
});

test.after(async () => {
  fs.mkdirSync(RESULTS_DIR, { recursive: true });
  for (const [library, topics] of Object.entries(summaries)) {
    const out = { client: CLIENT, variant: library, runner: 'clients/node/test/conformance.test.js', topics };
    const file = path.join(RESULTS_DIR, `${CLIENT}@${library.replace('@', '-')}.json`);
    fs.writeFileSync(file, `${JSON.stringify(out, null, 2)}\n`);
  }
  await server?.stop();
  await cluster?.stop();
});

for (const library of KINDS) {
  for (const topic of topics) {
    topic.cases.forEach((c, i) => {
      test(`${library} ${topic.topic}/${i}: ${c.description}`, async (t) => {
        const needs = c.needs || [];
        const can = library === 'ioredis' ? ['cluster', 'replica'] : ['replica'];
        const missing = needs.filter((n) => !can.includes(n));
        if (missing.length > 0) {
          const reason =
            missing[0] === 'cluster' ? `needs a cluster: this runner makes its cluster client with ioredis only` : `needs a ${missing[0]}: this runner starts none`;
          record(library, topic.topic, c.description, 'skipped', reason, 'needs');
          t.skip(reason);
          return;
        }
        let client = null;
        let runner = null;
        let replica = null;
        try {
          client = await clientFor(library, needs.includes('cluster'));
          if (needs.includes('replica')) replica = await replicaOf(client);
          runner = new Runner(client);
          await runner.run(c.steps);
          record(library, topic.topic, c.description, 'passed');
        } catch (e) {
          if (e instanceof Skip) {
            record(library, topic.topic, c.description, 'skipped', e.message, e.kind);
            t.skip(e.message);
            return;
          }
          record(library, topic.topic, c.description, 'failed', String(e && e.stack ? e.message : e));
          throw e;
        } finally {
          await replica?.stop();
          await runner?.cleanup();
          if (client !== null) {
            if (client instanceof IORedis.Cluster) client.disconnect();
            else await close(client);
          }
        }
      });
    });
  }
}
