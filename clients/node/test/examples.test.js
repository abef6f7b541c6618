'use strict';
// The docs' JavaScript runs as pasted. Every ```js block of every Markdown file in the repository
// (README.md, docs/, each client's README, and any added later) is written to a file and run with
// `node` against a fresh server whose address is in REDIS_URL, with `redislock-native` and the
// client libraries resolvable as after `npm install ./clients/node ioredis redis`; it must exit 0.
// Every ```ts block is type-checked with the package's tsc. The README's blocks are the files of
// examples/ their first line names (so `npm run typecheck` checks them too), and what the package
// README's examples print is checked below. A failure names the Markdown file and line of the block.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { execFileSync } = require('node:child_process');
const { startServer } = require('./harness');
const { connect, send, close } = require('./clients');
const { markdownFiles, blocks } = require('./markdown');

const ROOT = path.resolve(__dirname, '..');
const EXAMPLES = path.join(ROOT, 'examples');
const JS = new Set(['js', 'javascript', 'cjs', 'mjs']);
const TS = new Set(['ts', 'typescript', 'mts']);

const all = () => markdownFiles().flatMap(blocks);
const where = (b) => `${b.file}:${b.line}`;
/** A file name that says where the block comes from: README.md:36 -> README.md_L36. */
const fileName = (b, ext) => `${b.file.replace(/[^\w.-]/g, '_')}_L${b.line}.${ext}`;

// What the package README's examples print (the terms, tokens and leaders vary).
const OUTPUT = {
  lock: /^held with fencing token \d+\nsecond holder, token \d+\n$/,
  using: /^total 42\n$/,
  default_session: /^session true grace 500 holds 1\nplain lock in a session: false\n$/,
  shared: /^one of 4 permits, token \d+\n$/,
  multi: /^tokens \[ \d+, \d+ \]\n$/,
  // No replica here: the distinct outcome, the grant given back.
  durable: /^"ledger": 0 of 1 replicas acknowledged the grant within 500 ms; the grant was released \{ released: true, mayStayHeld: false \}\n$/,
  'node-redis': /^held with fencing token \d+ lost yet: false\n$/,
  redlock: /^$/,
  // Three candidate processes; the leader is killed (SIGKILL) and the next one takes over.
  leader_election: /^no leader\nleader: (candidate-[123]), term (\d+)\nkilled \1\nleader: (candidate-[123]), term (\d+)\n$/,
};

test("the package README's js blocks are the examples/ files they name, and every example is in it", () => {
  const named = new Map();
  for (const b of blocks('clients/node/README.md').filter((b) => JS.has(b.lang) && !b.skip)) {
    const m = /^\/\/ (examples\/[\w-]+\.js)\b/.exec(b.code);
    assert.ok(m, `${where(b)}: a js block does not start with "// examples/NAME.js"`);
    assert.equal(b.code, fs.readFileSync(path.join(ROOT, m[1]), 'utf8'), `${where(b)} differs from ${m[1]}`);
    named.set(m[1], b);
  }
  // tokens.js is the raw-command example (no package), run by tests/examples.rs.
  const files = fs.readdirSync(EXAMPLES).filter((f) => f.endsWith('.js') && f !== 'tokens.js');
  assert.deepEqual([...named.keys()].sort(), files.map((f) => `examples/${f}`).sort());
  assert.deepEqual(Object.keys(OUTPUT).sort(), files.map((f) => path.basename(f, '.js')).sort());
});

test('every js block of every Markdown file runs with node against a server with the module', async (t) => {
  const runnable = all().filter((b) => JS.has(b.lang) && !b.skip);
  t.diagnostic(`${runnable.length} js blocks`);
  assert.ok(runnable.length >= 9, `only ${runnable.length} js blocks found`);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'redislock-docs-js-'));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  // `redislock-native` resolves to this folder, as it would once installed.
  fs.mkdirSync(path.join(dir, 'modules'));
  fs.symlinkSync(ROOT, path.join(dir, 'modules', 'redislock-native'));
  const server = await startServer();
  t.after(() => server.stop());
  const admin = await connect('ioredis', server.port);
  t.after(() => close(admin));
  for (const b of runnable) {
    await send(admin, 'FLUSHALL'); // the blocks use fixed key names
    const file = path.join(dir, fileName(b, b.lang === 'mjs' ? 'mjs' : 'js'));
    fs.writeFileSync(file, b.code);
    let out;
    try {
      out = execFileSync(process.execPath, [file], {
        cwd: dir,
        env: { ...process.env, REDIS_URL: server.url, NODE_PATH: `${path.join(dir, 'modules')}:${path.join(ROOT, 'node_modules')}` },
        encoding: 'utf8',
        timeout: 60000,
        stdio: ['ignore', 'pipe', 'pipe'],
      });
    } catch (e) {
      assert.fail(`${where(b)}: the js block failed (${e.signal ?? `exit ${e.status}`}):\n${e.stderr}${e.stdout}`);
    }
    const name = /^\/\/ examples\/([\w-]+)\.js\b/.exec(b.code)?.[1];
    if (name && b.file === 'clients/node/README.md') assert.match(out, OUTPUT[name], `${where(b)} printed`);
    if (name === 'leader_election') {
      const m = OUTPUT.leader_election.exec(out);
      assert.notEqual(m[3], m[1], out);
      assert.ok(Number(m[4]) > Number(m[2]), out);
    }
  }
});

test('every ts block of every Markdown file passes the package tsc', (t) => {
  const typed = all().filter((b) => TS.has(b.lang) && !b.skip);
  t.diagnostic(`${typed.length} ts blocks`);
  if (typed.length === 0) return;
  // Inside the package, so `redislock-native` resolves to it (a package's own name) and the
  // client libraries to its node_modules.
  const dir = fs.mkdtempSync(path.join(ROOT, 'test', '.docs-ts-'));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  for (const b of typed) fs.writeFileSync(path.join(dir, fileName(b, b.lang === 'mts' ? 'mts' : 'ts')), b.code);
  fs.writeFileSync(
    path.join(dir, 'tsconfig.json'),
    JSON.stringify({ extends: '../../tsconfig.json', include: ['*.ts', '*.mts'], exclude: [] })
  );
  try {
    execFileSync(path.join(ROOT, 'node_modules', '.bin', 'tsc'), ['-p', dir], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  } catch (e) {
    // The file names say the Markdown file and line: README.md_L36.ts(3,7): error ...
    assert.fail(`ts blocks that tsc refuses (file_Lline.ts is the block at file:line):\n${e.stdout}${e.stderr}`);
  }
});
