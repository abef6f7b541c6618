//! A counting semaphore under contention: 16 workers share 4 permits, each holding a permit for
//! 1 ms. The module's `SHARED LIMIT 4 BLOCK` against the classic sorted-set semaphore that
//! redis-semaphore and Redisson use (a Lua script over a ZSET of (deadline, owner), polling
//! every 10 ms when full), against 4 independent exclusive locks, and against one exclusive
//! lock (the handoff rate a semaphore of 4 should multiply).

use std::fmt::Write as _;
use std::time::Duration;

use super::{Env, Scenario};
use crate::config::Config;
use crate::report::{f, num, obj, ratio, s, Goal, Json};
use crate::stats::wall_ms;
use crate::workers::{lock_block, lock_release, owner, rounds, Tally, Worker};

const WORKERS: usize = 16;
const PERMITS: usize = 4;
const HOLD: Duration = Duration::from_millis(1);
const TTL_MS: u64 = 10_000;
/// The poll interval of the sorted-set semaphore (redis-semaphore's default `retryInterval`).
const POLL: Duration = Duration::from_millis(10);

/// The classic acquire: drop expired entries, then take a permit if fewer than `limit` are
/// taken. KEYS[1] the semaphore; ARGV: now (ms), limit, deadline (ms), owner, ttl (ms).
pub const ZSET_ACQUIRE: &str = "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1]) \
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then \
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4]) \
redis.call('PEXPIRE', KEYS[1], ARGV[5]) \
return 1 end return 0";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Contender {
    /// `LOCK.ACQUIRE sem owner ttl SHARED LIMIT 4 BLOCK 30000` / `LOCK.RELEASE`.
    Module,
    /// `EVALSHA <ZSET_ACQUIRE>`, polling every 10 ms / `ZREM`.
    Zset,
    /// Worker `w` takes exclusive lock `w % 4` with `BLOCK` (4 workers per key).
    FourLocks,
    /// All 16 workers on one exclusive lock with `BLOCK`.
    OneLock,
}

const ALL: [Contender; 4] = [
    Contender::Module,
    Contender::Zset,
    Contender::FourLocks,
    Contender::OneLock,
];

impl Contender {
    fn label(self) -> &'static str {
        match self {
            Contender::Module => "`LOCK.ACQUIRE ... SHARED LIMIT 4 BLOCK`",
            Contender::Zset => "sorted-set semaphore, Lua, poll 10 ms",
            Contender::FourLocks => "4 exclusive locks (`BLOCK`), 4 workers each",
            Contender::OneLock => "1 exclusive lock (`BLOCK`), 16 workers",
        }
    }
    fn id(self) -> &'static str {
        match self {
            Contender::Module => "lock_shared_limit_4",
            Contender::Zset => "zset_lua_poll_10ms",
            Contender::FourLocks => "four_exclusive_locks",
            Contender::OneLock => "one_exclusive_lock",
        }
    }
}

pub fn new() -> Box<dyn Scenario> {
    Box::new(Semaphore {
        runs: Vec::new(),
        secs: 0.0,
        rounds: 0,
    })
}

pub struct Semaphore {
    runs: Vec<(Contender, Tally)>,
    /// Seconds per round and rounds per contender.
    secs: f64,
    rounds: usize,
}

impl Semaphore {
    fn get(&self, c: Contender) -> Option<&Tally> {
        self.runs.iter().find(|r| r.0 == c).map(|r| &r.1)
    }
}

/// How worker `w` of contender `c` takes and gives back its permit.
fn worker(c: Contender, w: usize, sha: &str) -> Worker {
    let me = owner(w);
    let (key, retry_after) = match c {
        Contender::Module => ("bench:sem".to_string(), Duration::ZERO),
        Contender::Zset => ("bench:zsem".to_string(), POLL),
        Contender::FourLocks => (format!("bench:pool:{}", w % PERMITS), Duration::ZERO),
        Contender::OneLock => ("bench:onelock".to_string(), Duration::ZERO),
    };
    let (k, o) = (key.clone(), me.clone());
    let sha = sha.to_string();
    let limit = PERMITS.to_string();
    let attempt: Box<dyn FnMut(&mut redis::Connection) -> bool + Send> = match c {
        Contender::Module => {
            Box::new(move |con| lock_block(con, &k, &o, TTL_MS, &["SHARED", "LIMIT", &limit]))
        }
        Contender::Zset => Box::new(move |con| {
            let now = wall_ms() as u64;
            let n: i64 = redis::cmd("EVALSHA")
                .arg(&sha)
                .arg(1)
                .arg(&k)
                .arg(now)
                .arg(&limit)
                .arg(now + TTL_MS)
                .arg(&o)
                .arg(TTL_MS)
                .query(con)
                .expect("EVALSHA semaphore acquire");
            n == 1
        }),
        Contender::FourLocks | Contender::OneLock => {
            Box::new(move |con| lock_block(con, &k, &o, TTL_MS, &[]))
        }
    };
    let (k, o) = (key.clone(), me);
    let release: Box<dyn FnMut(&mut redis::Connection) + Send> = match c {
        Contender::Zset => Box::new(move |con| {
            let n: i64 = redis::cmd("ZREM").arg(&k).arg(&o).query(con).expect("ZREM");
            assert_eq!(n, 1, "ZREM of a held permit returned {n}");
        }),
        _ => Box::new(move |con| lock_release(con, &k, &o)),
    };
    Worker {
        role: 0,
        key: match c {
            Contender::FourLocks => w % PERMITS,
            _ => 0,
        },
        attempt,
        release,
        retry_after: Box::new(move |_| retry_after),
        hold: HOLD,
    }
}

impl Scenario for Semaphore {
    fn run(&mut self, env: &mut Env) {
        self.secs = env.sizes.contention_secs;
        self.rounds = env.sizes.contention_rounds;
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(ZSET_ACQUIRE)
            .query(env.ctl)
            .expect("SCRIPT LOAD semaphore");
        eprintln!(
            "[semaphore] {WORKERS} workers, {PERMITS} permits, {} x {:.0} s per contender",
            self.rounds, self.secs
        );
        let tallies = rounds(
            env,
            ALL.len(),
            WORKERS,
            |i, w| worker(ALL[i], w, &sha),
            |_, _| {},
        );
        self.runs = ALL.into_iter().zip(tallies).collect();
    }

    fn intro(&self, o: &mut String, _cfg: &Config) {
        let _ = writeln!(
            o,
            "{WORKERS} worker threads, one connection each; a worker that gets a permit holds it \
             {} ms (a `sleep`), releases it and asks again at once. {} rounds of {:.0} s per \
             contender, the order reversed every other round. *Grants/s* counts every permit \
             granted. *Real handoffs/s* leaves out re-grabs: a grant to the worker whose own \
             release freed the permit, with no other worker granted in between (a poller that \
             releases and asks again at once beats the pollers asleep in their 10 ms). On one \
             exclusive key these are exactly its handoffs (the holder changed), as in the \
             contention section. The handoff goal compares real handoffs. *Wait* runs from wanting a permit to the reply that grants it. Contenders:\n\n\
             - `LOCK.ACQUIRE bench:sem owner {TTL_MS} SHARED LIMIT {PERMITS} BLOCK 30000`, \
             released with `LOCK.RELEASE`.\n\
             - The sorted-set semaphore of redis-semaphore and Redisson: `EVALSHA` of a script \
             that runs `ZREMRANGEBYSCORE key -inf now` (expired permits), then, if `ZCARD key < \
             {PERMITS}`, `ZADD key now+ttl owner` and `PEXPIRE key ttl` (now from the client's \
             clock); released with `ZREM key owner`; when full the worker sleeps {} ms and tries \
             again.\n\
             - {PERMITS} independent exclusive locks with `BLOCK`: worker `w` always takes key \
             `w % {PERMITS}`: a fixed split, so each key always has {} workers after it (random \
             picks would leave a key idle while workers queue on another).\n\
             - One exclusive lock with `BLOCK` and all {WORKERS} workers: the handoff rate the \
             semaphore's goal multiplies.\n",
            HOLD.as_millis(),
            self.rounds,
            self.secs,
            POLL.as_millis(),
            WORKERS / PERMITS
        );
    }

    fn markdown(&self, o: &mut String) {
        let _ = writeln!(
            o,
            "| contender | grants/s | real handoffs/s | wait p50 ms | wait p99 ms | wait max ms | grants per worker min / max | commands per grant (acquire) | server CPU us/grant |\n|---|---|---|---|---|---|---|---|---|"
        );
        for (c, t) in &self.runs {
            let (min, max) = t.spread(None);
            let (cmds, acq) = t.cmds_per_grant();
            let unfinished = if t.unfinished(None) > 0 { ">= " } else { "" };
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {unfinished}{} | {min} / {max} | {} ({}) | {} |",
                c.label(),
                f(t.grants_per_s(None)),
                f(t.handoffs_per_s()),
                f(t.wait_pct(None, 50.0)),
                f(t.wait_pct(None, 99.0)),
                f(t.max_wait(None)),
                f(cmds),
                f(acq),
                f(t.cpu_us_per_grant())
            );
        }
        if let Some(m) = self.get(Contender::Module) {
            let _ = writeln!(
                o,
                "\nRatios of the module semaphore's figures to each contender's:\n"
            );
            let _ = writeln!(o, "| to | real handoffs/s | grants/s |\n|---|---|---|");
            for c in [Contender::Zset, Contender::FourLocks, Contender::OneLock] {
                if let Some(t) = self.get(c) {
                    let _ = writeln!(
                        o,
                        "| {} | {} | {} |",
                        c.label(),
                        ratio(m.handoffs_per_s() / t.handoffs_per_s()),
                        ratio(m.grants_per_s(None) / t.grants_per_s(None))
                    );
                }
            }
            let ceiling = PERMITS as f64 / HOLD.as_secs_f64();
            if let Some(z) = self.get(Contender::Zset) {
                let _ = writeln!(
                    o,
                    "\nCeiling: {PERMITS} permits each held {} ms allow at most {} grants/s, before \
                     any round trip, whoever grants them. The module semaphore reached {:.0}% of \
                     it and the sorted-set semaphore's real handoffs {:.0}%; so the goals compare \
                     what the poller costs: its wait (a worker that finds the set full sleeps {} \
                     ms) and the server CPU its failed attempts burn, per grant: wait p99 {} ms \
                     against {} ms ({}), server CPU {} us against {} us per grant ({}).\n",
                    HOLD.as_millis(),
                    f(ceiling),
                    m.handoffs_per_s() / ceiling * 100.0,
                    z.handoffs_per_s() / ceiling * 100.0,
                    POLL.as_millis(),
                    f(m.wait_pct(None, 99.0)),
                    f(z.wait_pct(None, 99.0)),
                    ratio(m.wait_pct(None, 99.0) / z.wait_pct(None, 99.0)),
                    f(m.cpu_us_per_grant()),
                    f(z.cpu_us_per_grant()),
                    ratio(m.cpu_us_per_grant() / z.cpu_us_per_grant()),
                );
            }
            let _ = writeln!(o);
        }
    }

    fn goals(&self) -> Vec<Goal> {
        let (Some(m), Some(z), Some(one)) = (
            self.get(Contender::Module),
            self.get(Contender::Zset),
            self.get(Contender::OneLock),
        ) else {
            return Vec::new();
        };
        let mine = m.handoffs_per_s();
        let r1 = mine / one.handoffs_per_s();
        let (min, max) = m.spread(None);
        vec![
            Goal::ratio(
                "semaphore of 4, 16 workers: real handoffs/s >= 3.5x those of one exclusive \
                 lock with the same 16 workers (BLOCK)",
                r1,
                (mine, one.handoffs_per_s()),
                "/s",
                r1 >= 3.5,
            ),
            // What the poller costs (issue 22): the 5x throughput goal it replaces could not be
            // met by anyone, since 4 permits held 1 ms cap every contender at 4,000 grants/s.
            Goal::ratio(
                format!(
                    "semaphore of 4, 16 workers: wait p99 <= 0.1x that of the sorted-set \
                     semaphore polling every {} ms",
                    POLL.as_millis()
                ),
                m.wait_pct(None, 99.0) / z.wait_pct(None, 99.0),
                (m.wait_pct(None, 99.0), z.wait_pct(None, 99.0)),
                "ms",
                m.wait_pct(None, 99.0) <= 0.1 * z.wait_pct(None, 99.0),
            ),
            Goal::ratio(
                format!(
                    "semaphore of 4, 16 workers: server CPU per grant <= 0.5x that of the \
                     sorted-set semaphore polling every {} ms",
                    POLL.as_millis()
                ),
                m.cpu_us_per_grant() / z.cpu_us_per_grant(),
                (m.cpu_us_per_grant(), z.cpu_us_per_grant()),
                "us",
                m.cpu_us_per_grant() <= 0.5 * z.cpu_us_per_grant(),
            ),
            Goal::spread(
                "semaphore of 4, 16 workers: permits per worker within 5% of each other",
                min,
                max,
            ),
        ]
    }

    fn json(&self) -> Json {
        Json::Arr(
            self.runs
                .iter()
                .map(|(c, t)| {
                    let (cmds, acq) = t.cmds_per_grant();
                    obj(vec![
                        ("contender", s(c.id())),
                        ("workers", num(WORKERS as f64)),
                        ("permits", num(PERMITS as f64)),
                        ("seconds", num(t.secs)),
                        ("grants", num(t.grants(None) as f64)),
                        ("grants_per_s", num(t.grants_per_s(None))),
                        ("real_handoffs_per_s", num(t.handoffs_per_s())),
                        ("wait_ms_p50", num(t.wait_pct(None, 50.0))),
                        ("wait_ms_p99", num(t.wait_pct(None, 99.0))),
                        ("wait_ms_max", num(t.max_wait(None))),
                        ("unfinished_waits", num(t.unfinished(None) as f64)),
                        (
                            "grants_per_worker",
                            Json::Arr(t.per_worker(None).iter().map(|x| num(*x as f64)).collect()),
                        ),
                        ("commands_per_grant", num(cmds)),
                        ("acquire_commands_per_grant", num(acq)),
                        ("server_cpu_us_per_grant", num(t.cpu_us_per_grant())),
                    ])
                })
                .collect(),
        )
    }
}
