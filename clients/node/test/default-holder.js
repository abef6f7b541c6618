'use strict';
// A holder process for default-session.test.js and bench/default-session-takeover.js: a lock taken
// as the README's first example takes it (examples/lock.js), then it waits to be killed.
//
//     node default-holder.js PORT KEY TTL_MS [default|none|watchdog|none-watchdog] [ioredis|node-redis] [NAME]
//
// `default` (the default): `new Lock(redis, KEY, TTL_MS)`, no `session` option: the client's
// default session. `watchdog`: the same with `watchdog: true`. `none`: `session: null`, the ttl
// alone; `none-watchdog`: that with `watchdog: true`. The client is an ioredis `Redis` (default) or
// a node-redis `createClient()`; NAME names its connections (CLIENT SETNAME). Prints `held TOKEN`, then exits 1 after 60 s if nobody killed it.

const { Lock } = require('..');

async function main() {
  const [port, key, ttl, mode = 'default', lib = 'ioredis', name] = process.argv.slice(2);
  const url = `redis://127.0.0.1:${port}`;
  let redis;
  if (lib === 'node-redis') {
    redis = require('redis').createClient({ url, name });
    await redis.connect();
  } else {
    const { Redis } = require('ioredis');
    redis = new Redis(url, { connectionName: name });
  }
  const options = {};
  if (mode === 'none' || mode === 'none-watchdog') options.session = null;
  if (mode === 'watchdog' || mode === 'none-watchdog') options.watchdog = true;
  const lock = new Lock(redis, key, Number(ttl), options);
  if (!(await lock.acquire({ timeout: 10_000 }))) process.exit(3);
  console.log('held', lock.token);
  setTimeout(() => process.exit(1), 60_000);
}

// `node --test test/` runs every file of the folder, this one too, with no arguments: nothing to do.
if (process.argv.length > 2) {
  main().catch((error) => {
    console.error(error);
    process.exit(2);
  });
}
