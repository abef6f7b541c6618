'use strict';
// The README's examples: every ```ts block of README.md is a file of examples/ (its first line
// names it), `tsc` accepts them (npm run typecheck), and compiled they run against a real server.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { execFileSync } = require('node:child_process');
const { startServer } = require('./harness');

const ROOT = path.resolve(__dirname, '..');
const EXAMPLES = path.join(ROOT, 'examples');

function readmeBlocks() {
  const text = fs.readFileSync(path.join(ROOT, 'README.md'), 'utf8');
  return [...text.matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1]);
}

test('every ts block of the README is an examples/ file, and every example is in the README', () => {
  const blocks = readmeBlocks();
  const named = new Map();
  for (const block of blocks) {
    const m = /^\/\/ (examples\/[\w-]+\.ts)\n/.exec(block);
    assert.ok(m, `a README ts block does not start with "// examples/NAME.ts":\n${block.slice(0, 80)}`);
    named.set(m[1], block);
  }
  const files = fs.readdirSync(EXAMPLES).filter((f) => f.endsWith('.ts')).map((f) => `examples/${f}`);
  assert.deepEqual([...named.keys()].sort(), files.sort());
  for (const [file, block] of named) {
    assert.equal(block, fs.readFileSync(path.join(ROOT, file), 'utf8'), `${file} differs from the README`);
  }
});

test('the examples run as pasted against a server with the module', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'redislock-examples-'));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const tsc = path.join(ROOT, 'node_modules', '.bin', 'tsc');
  execFileSync(tsc, ['-p', path.join(ROOT, 'tsconfig.json'), '--noEmit', 'false', '--rootDir', ROOT, '--outDir', path.join(dir, 'out')]);
  // `redislock-native` resolves to this folder, as it would once installed.
  fs.mkdirSync(path.join(dir, 'modules'));
  fs.symlinkSync(ROOT, path.join(dir, 'modules', 'redislock-native'));
  const server = await startServer();
  t.after(() => server.stop());
  const run = (name) =>
    execFileSync(process.execPath, [path.join(dir, 'out', 'examples', `${name}.js`)], {
      env: { ...process.env, REDIS_URL: server.url, NODE_PATH: `${path.join(dir, 'modules')}:${path.join(ROOT, 'node_modules')}` },
      encoding: 'utf8',
      timeout: 30000,
    });
  assert.match(run('lock'), /^held with fencing token \d+\nsecond holder, token \d+\n$/);
  assert.equal(run('using'), 'total 42\n');
  assert.match(run('shared'), /^one of 4 permits, token \d+\n$/);
  assert.match(run('multi'), /^tokens \[ \d+, \d+ \]\n$/);
  // No replica here: the distinct outcome, the grant given back.
  assert.equal(
    run('durable'),
    '"ledger": 0 of 1 replicas acknowledged the grant within 500 ms; the grant was released { released: true, mayStayHeld: false }\n'
  );
  assert.match(run('node-redis'), /^held with fencing token \d+ lost yet: false\n$/);
  assert.equal(run('redlock'), '');
  // Three candidate processes; the leader is killed (SIGKILL) and the next one takes over.
  const election = run('leader_election');
  const m = /^no leader\nleader: (candidate-[123]), term (\d+)\nkilled \1\nleader: (candidate-[123]), term (\d+)\n$/.exec(election);
  assert.ok(m, election);
  assert.notEqual(m[3], m[1]);
  assert.ok(Number(m[4]) > Number(m[2]), election);
});
