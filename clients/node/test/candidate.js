'use strict';
// A candidate process for election.test.js: campaign, lead, write fenced, report a loss.
//
//     node candidate.js PORT NAME VALUE TTL_MS [bound|default]
//
// With `bound` the leadership is held in a bound session (ttl 30 s: only the process's death ends
// it); with `default` it is made without a `session` option (the client's default session: a lock
// of TTL_MS renewed by its watchdog, also ended by the process's death, after the grace); else
// (`session: null`) it is a lock of TTL_MS renewed by its watchdog alone. Prints `leader TERM` once it leads,
// then writes VALUE to NAME:data fenced by its term every 20 ms; prints `lost REASON` when the
// leadership is reported lost and `refused TERM` when a fenced write is refused, then exits 0.
// Exits 1 if it never leads within 60 s.

const IORedis = require('ioredis');
const { Election, Session, StaleTokenError } = require('..');

async function main() {
  const [port, name, value, ttl, mode] = process.argv.slice(2);
  const redis = new IORedis({ host: '127.0.0.1', port: Number(port) });
  const session = mode === 'bound' ? await new Session(redis, 30000, { bound: true }).open() : undefined;
  const election = new Election(
    redis,
    name,
    session ? { session } : mode === 'default' ? { ttl: Number(ttl) } : { ttl: Number(ttl), session: null }
  );
  let lost;
  const lostNow = new Promise((resolve) => (lost = resolve));
  const leadership = await election.campaign(value, { timeout: 60000, onLost: () => lost() });
  if (leadership === null) process.exit(1);
  console.log('leader', leadership.term);
  for (;;) {
    try {
      await leadership.fenced('SET', `${name}:data`, value);
    } catch (error) {
      if (!(error instanceof StaleTokenError)) throw error;
      await Promise.race([lostNow, new Promise((r) => setTimeout(r, 5000))]);
      console.log('lost', leadership.lostReason);
      console.log('refused', leadership.term);
      process.exit(0);
    }
    await new Promise((r) => setTimeout(r, 20));
  }
}

// `node --test test/` runs every file of the folder, this one too, with no arguments: nothing to do.
if (process.argv.length > 2) {
  main().catch((error) => {
    console.error(error);
    process.exit(2);
  });
}
