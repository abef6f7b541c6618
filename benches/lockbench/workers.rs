//! The contended load of the contention, semaphore and read/write scenarios: worker threads,
//! one connection each, that take a lock, hold it for a while and give it back, again and
//! again, for a fixed time. What a worker sends is up to the scenario (a [`Worker`] built on the worker's own thread); this
//! file times the waits, counts the grants and commands, and reads the server's CPU.

use std::sync::{Barrier, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use redis::Connection;

use crate::scenarios::Env;
use crate::server::{flushall, server_cpu, Server};
use crate::stats::{pct, sorted};

/// How long a starved poller keeps trying after a round's time is up.
pub fn grace(quick: bool) -> Duration {
    Duration::from_secs(if quick { 10 } else { 30 })
}

/// Contenders `0..contenders`, `workers` workers each (worker `w` of contender `i` is
/// `make(i, w)`), for `contention_rounds` rounds of `contention_secs`, each round on a flushed
/// server that `prepare(i, ctl)` then sets up, and the contenders' order reversed every other
/// round, so that the machine's drift hits them all alike. One tally per contender.
pub fn rounds<F, P>(
    env: &mut Env,
    contenders: usize,
    workers: usize,
    make: F,
    prepare: P,
) -> Vec<Tally>
where
    F: Fn(usize, usize) -> Worker + Sync,
    P: Fn(usize, &mut Connection),
{
    let sizes = env.sizes;
    let mut tallies = vec![Tally::default(); contenders];
    for r in 0..sizes.contention_rounds {
        let mut order: Vec<usize> = (0..contenders).collect();
        if r % 2 == 1 {
            order.reverse();
        }
        for i in order {
            flushall(env.ctl);
            prepare(i, env.ctl);
            round(
                env.srv,
                env.ctl,
                workers,
                sizes.contention_secs,
                grace(env.cfg.quick),
                |w| make(i, w),
                &mut tallies[i],
            );
        }
    }
    tallies
}

/// What one worker does, built on its own thread by the scenario's factory.
pub struct Worker {
    /// Which kind of worker (e.g. reader or writer): results are kept apart by role.
    pub role: usize,
    /// Which key it takes: real handoffs are counted per key.
    pub key: usize,
    /// One acquire attempt: `true` when granted.
    pub attempt: Box<dyn FnMut(&mut Connection) -> bool + Send>,
    /// Give back what `attempt` granted.
    pub release: Box<dyn FnMut(&mut Connection) + Send>,
    /// How long to sleep after the `n`th refused attempt of a wait in a row (from 0) before the
    /// next: a poller's interval, or its backoff.
    pub retry_after: Box<dyn FnMut(u32) -> Duration + Send>,
    /// How long to hold each grant.
    pub hold: Duration,
}

/// What one worker did over all rounds.
#[derive(Clone, Debug, Default)]
pub struct Log {
    pub role: usize,
    /// Every completed wait, in ms (from wanting the lock to the reply that grants it).
    pub waits: Vec<f64>,
    /// Waits still going when the round's hard limit hit (a starved poller gave up), in ms.
    pub unfinished: Vec<f64>,
    /// Commands sent, and the acquire attempts among them.
    pub cmds: u64,
    pub acquire_cmds: u64,
}

impl Log {
    pub fn grants(&self) -> u64 {
        self.waits.len() as u64
    }
}

/// One contender's rounds, merged: per-worker logs and the totals.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// Seconds from each round's start signal to its last release, summed.
    pub secs: f64,
    /// Server CPU seconds, summed.
    pub cpu: f64,
    /// Real handoffs: grants that did not go back to the worker whose release freed the
    /// permit (see [`real_handoffs`]).
    pub handoffs: u64,
    /// Grants whose worker differs from the previous grant's on the same key, in grant order
    /// (see [`holder_changes`]): on one exclusive key, the handoffs.
    pub holder_changes: u64,
    /// Indexed by worker.
    pub logs: Vec<Log>,
}

impl Tally {
    fn of(&self, role: Option<usize>) -> impl Iterator<Item = &Log> {
        self.logs
            .iter()
            .filter(move |l| role.is_none_or(|r| l.role == r))
    }
    /// Grants of the workers of `role` (all workers with `None`).
    pub fn grants(&self, role: Option<usize>) -> u64 {
        self.of(role).map(Log::grants).sum()
    }
    pub fn grants_per_s(&self, role: Option<usize>) -> f64 {
        self.grants(role) as f64 / self.secs
    }
    pub fn handoffs_per_s(&self) -> f64 {
        self.handoffs as f64 / self.secs
    }
    /// Sorted waits (ms) of the workers of `role`.
    pub fn waits(&self, role: Option<usize>) -> Vec<f64> {
        sorted(
            self.of(role)
                .flat_map(|l| l.waits.iter().copied())
                .collect(),
        )
    }
    pub fn wait_pct(&self, role: Option<usize>, p: f64) -> f64 {
        pct(&self.waits(role), p)
    }
    /// The longest wait, finished or not.
    pub fn max_wait(&self, role: Option<usize>) -> f64 {
        self.of(role)
            .flat_map(|l| l.waits.iter().chain(&l.unfinished))
            .copied()
            .fold(0.0, f64::max)
    }
    pub fn unfinished(&self, role: Option<usize>) -> usize {
        self.of(role).map(|l| l.unfinished.len()).sum()
    }
    /// Grants per worker of `role`.
    pub fn per_worker(&self, role: Option<usize>) -> Vec<u64> {
        self.of(role).map(Log::grants).collect()
    }
    /// (min, max) grants per worker of `role`.
    pub fn spread(&self, role: Option<usize>) -> (u64, u64) {
        let v = self.per_worker(role);
        (
            v.iter().copied().min().unwrap_or(0),
            v.iter().copied().max().unwrap_or(0),
        )
    }
    pub fn cmds_per_grant(&self) -> (f64, f64) {
        let g = self.grants(None) as f64;
        let cmds: u64 = self.logs.iter().map(|l| l.cmds).sum();
        let acq: u64 = self.logs.iter().map(|l| l.acquire_cmds).sum();
        (cmds as f64 / g, acq as f64 / g)
    }
    pub fn cpu_us_per_grant(&self) -> f64 {
        self.cpu * 1e6 / self.grants(None) as f64
    }

    /// Add one round (its logs in worker order).
    fn add(&mut self, secs: f64, cpu: f64, (handoffs, changes): (u64, u64), logs: Vec<Log>) {
        self.secs += secs;
        self.cpu += cpu;
        self.handoffs += handoffs;
        self.holder_changes += changes;
        if self.logs.is_empty() {
            self.logs = logs;
            return;
        }
        for (m, l) in self.logs.iter_mut().zip(logs) {
            m.waits.extend(l.waits);
            m.unfinished.extend(l.unfinished);
            m.cmds += l.cmds;
            m.acquire_cmds += l.acquire_cmds;
        }
    }
}

/// Run `workers` workers built by `make(w)` for `secs` seconds and add the round to `tally`. No
/// worker starts an attempt after that, but each finishes the one in progress; a poller that
/// still has nothing `grace` later gives up (its wait is kept as unfinished).
fn round<F>(
    srv: &Server,
    ctl: &mut Connection,
    workers: usize,
    secs: f64,
    grace: Duration,
    make: F,
    tally: &mut Tally,
) where
    F: Fn(usize) -> Worker + Sync,
{
    let connected = Barrier::new(workers + 1);
    let go = Barrier::new(workers + 1);
    let start: OnceLock<Instant> = OnceLock::new();
    let window = Duration::from_secs_f64(secs);
    let (connected, go, start, make) = (&connected, &go, &start, &make);
    // Per worker: its log, its key, its (grant, release) times in s since start, its last
    // release.
    let (ran, cpu0, t0) = thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                s.spawn(move || {
                    let mut con = srv.connect();
                    let mut wk = make(w);
                    let mut log = Log {
                        role: wk.role,
                        ..Log::default()
                    };
                    let mut at = Vec::new();
                    connected.wait();
                    go.wait();
                    let t0 = *start.get().expect("start time");
                    let (stop, hard_stop) = (t0 + window, t0 + window + grace);
                    let mut last_release = t0;
                    loop {
                        let want = Instant::now();
                        if want >= stop {
                            break;
                        }
                        let mut failures = 0;
                        let granted = loop {
                            log.cmds += 1;
                            log.acquire_cmds += 1;
                            if (wk.attempt)(&mut con) {
                                break true;
                            }
                            if Instant::now() >= hard_stop {
                                break false;
                            }
                            thread::sleep((wk.retry_after)(failures));
                            failures += 1;
                        };
                        let got = Instant::now();
                        let waited = (got - want).as_secs_f64() * 1000.0;
                        if !granted {
                            log.unfinished.push(waited);
                            break;
                        }
                        log.waits.push(waited);
                        thread::sleep(wk.hold);
                        log.cmds += 1;
                        (wk.release)(&mut con);
                        last_release = Instant::now();
                        at.push(((got - t0).as_secs_f64(), (last_release - t0).as_secs_f64()));
                    }
                    (log, wk.key, at, last_release)
                })
            })
            .collect();
        connected.wait();
        let cpu0 = server_cpu(ctl);
        let t0 = Instant::now();
        start.set(t0).expect("start set once");
        go.wait();
        let ran: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().expect("worker panicked"))
            .collect();
        (ran, cpu0, t0)
    });
    let cpu = server_cpu(ctl) - cpu0;
    let end = ran.iter().map(|r| r.3).max().unwrap_or(t0);
    let handoffs = real_handoffs(ran.iter().map(|r| (r.1, r.2.as_slice())));
    let changes = holder_changes(ran.iter().map(|r| (r.1, r.2.as_slice())));
    let logs = ran.into_iter().map(|r| r.0).collect();
    tally.add((end - t0).as_secs_f64(), cpu, (handoffs, changes), logs);
}

/// Real handoffs among the grants of a round, given per worker as (key, [(grant, release)]).
/// A grant at `t` to a worker whose previous release was at `t'` is a *re-grab* when no other
/// worker was granted the same key between `t'` and `t`: the permit that worker just freed
/// went straight back to it (a poller that releases and asks again at once wins against
/// pollers asleep). Every other grant is a real handoff. On one exclusive key this is exactly
/// "the holder differs from the previous holder", the contention section's definition.
/// The times are the clients' (after each reply), so a grant that raced the release's reply
/// may be stamped a few microseconds before it: that only matters when a key has two workers.
pub fn real_handoffs<'a>(workers: impl Iterator<Item = (usize, &'a [(f64, f64)])>) -> u64 {
    // (key, grant time, worker, the worker's previous release or -inf), sorted by key and time.
    let mut grants: Vec<(usize, f64, usize, f64)> = Vec::new();
    for (w, (key, held)) in workers.enumerate() {
        let mut prev = f64::NEG_INFINITY;
        for &(got, released) in held {
            grants.push((key, got, w, prev));
            prev = released;
        }
    }
    grants.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let mut real = 0;
    for (i, &(key, _, w, prev)) in grants.iter().enumerate() {
        let others = grants[..i]
            .iter()
            .rev()
            .take_while(|g| g.0 == key && g.1 > prev)
            .any(|g| g.2 != w);
        if others || prev == f64::NEG_INFINITY {
            real += 1;
        }
    }
    real
}

/// Grants whose worker differs from the previous grant's on the same key, in grant order, given
/// per worker as (key, [(grant, release)]). On one exclusive key these are the handoffs (the
/// holder changed), the contention section's measure; unlike [`real_handoffs`] it does not
/// compare a grant with a release, so the few microseconds by which a grant's reply can beat
/// the release's reply do not matter (they do with two workers on a key).
pub fn holder_changes<'a>(workers: impl Iterator<Item = (usize, &'a [(f64, f64)])>) -> u64 {
    let mut grants: Vec<(usize, f64, usize)> = Vec::new();
    for (w, (key, held)) in workers.enumerate() {
        grants.extend(held.iter().map(|&(got, _)| (key, got, w)));
    }
    grants.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    grants
        .windows(2)
        .filter(|p| p[0].0 == p[1].0 && p[0].2 != p[1].2)
        .count() as u64
}

/// `LOCK.ACQUIRE key owner ttl [extra...] BLOCK 30000`: granted, or nil after 30 s.
pub fn lock_block(
    con: &mut Connection,
    key: &str,
    owner: &str,
    ttl_ms: u64,
    extra: &[&str],
) -> bool {
    redis::cmd("LOCK.ACQUIRE")
        .arg(key)
        .arg(owner)
        .arg(ttl_ms)
        .arg(extra)
        .arg("BLOCK")
        .arg(30_000)
        .query::<Option<i64>>(con)
        .expect("LOCK.ACQUIRE")
        .is_some()
}

/// `LOCK.RELEASE key owner`, which must find the hold.
pub fn lock_release(con: &mut Connection, key: &str, owner: &str) {
    let n: i64 = redis::cmd("LOCK.RELEASE")
        .arg(key)
        .arg(owner)
        .query(con)
        .expect("LOCK.RELEASE");
    assert_eq!(n, 1, "LOCK.RELEASE of a held lock returned {n}");
}

/// A unique owner for worker `w`.
pub fn owner(w: usize) -> String {
    format!("worker-{w}-{}", uuid::Uuid::new_v4())
}
