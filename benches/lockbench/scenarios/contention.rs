//! Contention on one key: worker threads all after one key, each holding it 1 ms, with the
//! module's blocking acquire against polling strategies and `BLPOP` token passing (the fair
//! lower bound). Runs on the headline servers.

use std::fmt::Write as _;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::Connection;

use super::{Env, Scenario};
use crate::config::Config;
use crate::report::{f, max_wait, num, obj, ratio, s, Goal, Json};
use crate::stats::{pct, sorted};
use crate::workers::{grace, lock_block, lock_release, owner, rounds, Tally, Worker};

/// The wait-time chart's file name (in the report's chart folder).
const CHART: &str = "waits.svg";

pub fn new() -> Box<dyn Scenario> {
    Box::new(ContentionScenario {
        cont: Vec::new(),
        grace_secs: 0,
        chart: String::new(),
    })
}

pub struct ContentionScenario {
    cont: Vec<Contention>,
    /// How long a starved poller keeps trying after the run's time is up.
    grace_secs: u64,
    /// The wait-time chart as the report links it.
    chart: String,
}

impl ContentionScenario {
    fn find(&self, strategy: Strategy, workers: usize) -> Option<&Contention> {
        self.cont
            .iter()
            .find(|c| c.strategy == strategy && c.workers == workers)
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Strategy {
    /// `LOCK.ACQUIRE ... BLOCK`, released with `LOCK.RELEASE`.
    Block,
    /// `BLPOP` a token from a one-element list, `LPUSH` it back: the fair lower bound.
    Blpop,
    /// `SET NX PX`, sleep 10 ms on failure; released with the EVALSHA script.
    Retry10,
    /// As `Retry10` with 1 ms.
    Retry1,
    /// As `Retry10`, sleeping `d/2 + rand(0..=d/2)` with `d = min(100 ms, 1 ms * 2^failures)`.
    Backoff,
}

impl Strategy {
    pub const ALL: [Strategy; 5] = [
        Strategy::Block,
        Strategy::Blpop,
        Strategy::Retry10,
        Strategy::Retry1,
        Strategy::Backoff,
    ];
    pub fn label(self) -> &'static str {
        match self {
            Strategy::Block => "LOCK.ACQUIRE BLOCK",
            Strategy::Blpop => "BLPOP/LPUSH token",
            Strategy::Retry10 => "retry every 10 ms",
            Strategy::Retry1 => "retry every 1 ms",
            Strategy::Backoff => "exp. backoff 1-100 ms",
        }
    }
    fn id(self) -> &'static str {
        match self {
            Strategy::Block => "lock_block",
            Strategy::Blpop => "blpop_token",
            Strategy::Retry10 => "retry_10ms",
            Strategy::Retry1 => "retry_1ms",
            Strategy::Backoff => "exp_backoff",
        }
    }
    /// SVG stroke attributes: the lock thick, BLPOP dashed (it runs along the lock's line).
    pub fn stroke(self) -> &'static str {
        match self {
            Strategy::Block => r#"stroke-width="4""#,
            Strategy::Blpop => r#"stroke-width="2" stroke-dasharray="6 4""#,
            _ => r#"stroke-width="2""#,
        }
    }
    pub fn color(self) -> &'static str {
        match self {
            Strategy::Block => "#1f5fbf",
            Strategy::Blpop => "#2a9d3a",
            Strategy::Retry10 => "#e07b00",
            Strategy::Retry1 => "#c62828",
            Strategy::Backoff => "#7b3fa0",
        }
    }
}

/// One contender at one worker count, summed over its rounds.
#[derive(Clone, Debug)]
pub struct Contention {
    pub strategy: Strategy,
    pub workers: usize,
    /// Seconds from the start signal to the last release, summed over rounds.
    pub secs: f64,
    /// Every completed wait, in ms (from wanting the lock to holding it).
    pub waits: Vec<f64>,
    /// Waits still going when the run's hard limit hit (a starved worker gave up), in ms.
    pub unfinished: Vec<f64>,
    /// Acquisitions per worker.
    pub per_worker: Vec<u64>,
    /// Acquisitions whose holder differs from the previous holder
    /// ([`crate::workers::holder_changes`]).
    pub handoffs: u64,
    /// Commands the clients sent, and the acquire attempts among them.
    pub cmds: u64,
    pub acquire_cmds: u64,
    /// Server CPU seconds.
    pub cpu: f64,
}

impl Contention {
    fn acquisitions(&self) -> u64 {
        self.per_worker.iter().sum()
    }
    fn handoffs_per_s(&self) -> f64 {
        self.handoffs as f64 / self.secs
    }
    pub fn cpu_us_per_acq(&self) -> f64 {
        self.cpu * 1e6 / self.acquisitions() as f64
    }
    fn max_wait(&self) -> f64 {
        self.waits
            .iter()
            .chain(&self.unfinished)
            .copied()
            .fold(0.0, f64::max)
    }
}

const LOCK_KEY: &str = "bench:onekey";
const TOKEN_LIST: &str = "bench:token";
const HOLD: Duration = Duration::from_millis(1);

impl Contention {
    /// A strategy's rounds at one worker count, from the tally the worker threads kept.
    fn new(strategy: Strategy, workers: usize, t: Tally) -> Contention {
        Contention {
            strategy,
            workers,
            secs: t.secs,
            waits: t.waits(None),
            unfinished: t.logs.iter().flat_map(|l| l.unfinished.clone()).collect(),
            per_worker: t.per_worker(None),
            handoffs: t.holder_changes,
            cmds: t.logs.iter().map(|l| l.cmds).sum(),
            acquire_cmds: t.logs.iter().map(|l| l.acquire_cmds).sum(),
            cpu: t.cpu,
        }
    }
}

/// Worker `w` of `strategy`: what it sends to take and give back the key, and how long it sleeps
/// after a refusal.
fn worker(strategy: Strategy, w: usize, sha: &str) -> Worker {
    let me = owner(w);
    let o = me.clone();
    let attempt: Box<dyn FnMut(&mut Connection) -> bool + Send> = match strategy {
        Strategy::Block => Box::new(move |con| lock_block(con, LOCK_KEY, &o, 10_000, &[])),
        Strategy::Blpop => Box::new(|con| {
            redis::cmd("BLPOP")
                .arg(TOKEN_LIST)
                .arg(30)
                .query::<Option<(String, String)>>(con)
                .expect("BLPOP")
                .is_some()
        }),
        _ => Box::new(move |con| {
            redis::cmd("SET")
                .arg(LOCK_KEY)
                .arg(&o)
                .arg("NX")
                .arg("PX")
                .arg(10_000)
                .query::<Option<String>>(con)
                .expect("SET NX PX")
                .is_some()
        }),
    };
    let sha = sha.to_string();
    let release: Box<dyn FnMut(&mut Connection) + Send> = match strategy {
        Strategy::Block => Box::new(move |con| lock_release(con, LOCK_KEY, &me)),
        Strategy::Blpop => Box::new(|con| {
            let _: i64 = redis::cmd("LPUSH")
                .arg(TOKEN_LIST)
                .arg("token")
                .query(con)
                .expect("LPUSH");
        }),
        _ => Box::new(move |con| {
            let n: i64 = redis::cmd("EVALSHA")
                .arg(&sha)
                .arg(1)
                .arg(LOCK_KEY)
                .arg(&me)
                .query(con)
                .expect("EVALSHA");
            assert_eq!(n, 1, "release script on a held lock returned {n}");
        }),
    };
    let retry_after: Box<dyn FnMut(u32) -> Duration + Send> = match strategy {
        Strategy::Block | Strategy::Blpop => Box::new(|_| Duration::ZERO),
        Strategy::Retry10 => Box::new(|_| Duration::from_millis(10)),
        Strategy::Retry1 => Box::new(|_| Duration::from_millis(1)),
        Strategy::Backoff => {
            let mut rng = StdRng::from_entropy();
            Box::new(move |failures| {
                let d_us = (1000u64 << failures.min(7)).min(100_000);
                Duration::from_micros(d_us / 2 + rng.gen_range(0..=d_us / 2))
            })
        }
    };
    Worker {
        role: 0,
        key: 0,
        attempt,
        release,
        retry_after,
        hold: HOLD,
    }
}

fn contention(env: &mut Env) -> Vec<Contention> {
    let mut out = Vec::new();
    for workers in [2, 8, 32] {
        eprintln!(
            "[2] contention on one key, {workers} workers, {} x {:.0} s per contender",
            env.sizes.contention_rounds, env.sizes.contention_secs
        );
        let sha = env.sha.to_string();
        let tallies = rounds(
            env,
            Strategy::ALL.len(),
            workers,
            |i, w| worker(Strategy::ALL[i], w, &sha),
            |i, ctl| {
                if Strategy::ALL[i] == Strategy::Blpop {
                    let _: () = redis::cmd("LPUSH")
                        .arg(TOKEN_LIST)
                        .arg("token")
                        .query(ctl)
                        .expect("LPUSH");
                }
            },
        );
        out.extend(
            Strategy::ALL
                .into_iter()
                .zip(tallies)
                .map(|(st, t)| Contention::new(st, workers, t)),
        );
    }
    out
}

impl Scenario for ContentionScenario {
    fn run(&mut self, env: &mut Env) {
        self.grace_secs = grace(env.cfg.quick).as_secs();
        self.chart = env.cfg.out.link_to(CHART);
        self.cont = contention(env);
    }

    fn goals(&self) -> Vec<Goal> {
        let mut g = Vec::new();
        for workers in [8, 32] {
            let (Some(lock), Some(blpop), Some(r10)) = (
                self.find(Strategy::Block, workers),
                self.find(Strategy::Blpop, workers),
                self.find(Strategy::Retry10, workers),
            ) else {
                continue;
            };
            let vs_blpop = lock.handoffs_per_s() / blpop.handoffs_per_s();
            g.push(Goal::ratio(
                format!("{workers} workers: handoffs/s >= 1.0x BLPOP token passing"),
                vs_blpop,
                (lock.handoffs_per_s(), blpop.handoffs_per_s()),
                "/s",
                vs_blpop >= 1.0,
            ));
            let cpu = lock.cpu_us_per_acq() / blpop.cpu_us_per_acq();
            g.push(Goal::ratio(
                format!(
                    "{workers} workers: server CPU per acquisition <= 1.1x BLPOP token passing"
                ),
                cpu,
                (lock.cpu_us_per_acq(), blpop.cpu_us_per_acq()),
                "us",
                cpu <= 1.1,
            ));
            let vs_r10 = lock.handoffs_per_s() / r10.handoffs_per_s();
            g.push(Goal::ratio(
                format!("{workers} workers: handoffs/s >= 5x retry every 10 ms"),
                vs_r10,
                (lock.handoffs_per_s(), r10.handoffs_per_s()),
                "/s",
                vs_r10 >= 5.0,
            ));
            g.push(Goal::spread(
                format!("{workers} workers: acquisitions per worker within 5% of each other"),
                lock.per_worker.iter().copied().min().unwrap_or(0),
                lock.per_worker.iter().copied().max().unwrap_or(0),
            ));
            let per = lock.acquire_cmds as f64 / lock.acquisitions() as f64;
            g.push(Goal {
                goal: format!("{workers} workers: exactly one acquire command per acquisition"),
                measured: format!(
                    "{} acquire commands for {} acquisitions ({per:.3})",
                    lock.acquire_cmds,
                    lock.acquisitions()
                ),
                met: lock.acquire_cmds == lock.acquisitions(),
            });
        }
        g
    }

    fn intro(&self, o: &mut String, _cfg: &Config) {
        let secs = self.cont.first().map_or(0.0, |c| c.secs);
        let _ = writeln!(
            o,
            "Worker threads, one connection each, all after one key; each holds the lock for 1 ms \
             (a `sleep` of 1 ms) and asks again at once. About {:.0} s per contender (two halves, \
             the contenders' order reversed in the second). *Wait* runs from the moment a worker \
             wants the lock to the reply that grants it. *Real handoffs* count grants whose holder \
             differs from the previous holder (a releaser that wins its own lock again is not a \
             handoff); per second of the whole run. *Commands per acquisition* counts every \
             command the clients sent (acquire attempts and releases), with the acquire attempts \
             alone in brackets. Polling strategies: `SET key owner NX PX 10000`, released with the \
             `EVALSHA` script; on failure sleep 10 ms, 1 ms, or (exponential backoff with equal \
             jitter) `d/2 + rand(0..d/2)` with `d = min(100 ms, 1 ms * 2^failures)`, reset after \
             each acquisition. `LOCK.ACQUIRE key owner 10000 BLOCK 30000` / `LOCK.RELEASE`. Token \
             passing: a list holds one token; `BLPOP list 30` acquires, `LPUSH` releases. A worker \
             starts no attempt after the run's time is up but finishes the one in progress (a \
             starved poller gives up {} s later: that wait is counted in *max* only, marked >=).\n",
            secs, self.grace_secs
        );
    }

    fn markdown(&self, o: &mut String) {
        let _ = writeln!(
            o,
            "| workers | strategy | real handoffs/s | acquisitions/s | wait p50 ms | wait p99 ms | wait max ms | acquisitions per worker min / max | commands per acquisition (acquire) | server CPU us/acquisition |\n|---|---|---|---|---|---|---|---|---|---|"
        );
        for c in &self.cont {
            let w = sorted(c.waits.clone());
            let max = max_wait(&w, &c.unfinished);
            let acq = c.acquisitions() as f64;
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {} | {} / {} | {} ({}) | {} |",
                c.workers,
                c.strategy.label(),
                f(c.handoffs_per_s()),
                f(acq / c.secs),
                f(pct(&w, 50.0)),
                f(pct(&w, 99.0)),
                max,
                c.per_worker.iter().min().unwrap_or(&0),
                c.per_worker.iter().max().unwrap_or(&0),
                f(c.cmds as f64 / acq),
                f(c.acquire_cmds as f64 / acq),
                f(c.cpu * 1e6 / acq)
            );
        }
        let _ = writeln!(o, "\nRatios of `LOCK.ACQUIRE BLOCK` real handoffs/s:\n");
        let _ = writeln!(o, "| workers | vs BLPOP token | vs retry 10 ms | vs retry 1 ms | vs backoff |\n|---|---|---|---|---|");
        for workers in [2, 8, 32] {
            let Some(lock) = self.find(Strategy::Block, workers) else {
                continue;
            };
            let r = |s: Strategy| {
                self.find(s, workers).map_or("-".into(), |c| {
                    ratio(lock.handoffs_per_s() / c.handoffs_per_s())
                })
            };
            let _ = writeln!(
                o,
                "| {workers} | {} | {} | {} | {} |",
                r(Strategy::Blpop),
                r(Strategy::Retry10),
                r(Strategy::Retry1),
                r(Strategy::Backoff)
            );
        }
        let _ = writeln!(
            o,
            "\n![Wait-time distribution per strategy, 8 and 32 workers]({})\n",
            self.chart
        );
    }

    fn json(&self) -> Json {
        let cont: Vec<Json> = self
            .cont
            .iter()
            .map(|c| {
                let w = sorted(c.waits.clone());
                let acq = c.acquisitions() as f64;
                obj(vec![
                    ("workers", num(c.workers as f64)),
                    ("strategy", s(c.strategy.id())),
                    ("label", s(c.strategy.label())),
                    ("seconds", num(c.secs)),
                    ("acquisitions", num(acq)),
                    ("real_handoffs", num(c.handoffs as f64)),
                    ("real_handoffs_per_s", num(c.handoffs_per_s())),
                    ("wait_ms_p50", num(pct(&w, 50.0))),
                    ("wait_ms_p99", num(pct(&w, 99.0))),
                    ("wait_ms_max", num(c.max_wait())),
                    (
                        "unfinished_waits_ms",
                        Json::Arr(c.unfinished.iter().copied().map(num).collect()),
                    ),
                    (
                        "acquisitions_per_worker",
                        Json::Arr(c.per_worker.iter().map(|x| num(*x as f64)).collect()),
                    ),
                    ("commands_per_acquisition", num(c.cmds as f64 / acq)),
                    (
                        "acquire_commands_per_acquisition",
                        num(c.acquire_cmds as f64 / acq),
                    ),
                    ("server_cpu_us_per_acquisition", num(c.cpu * 1e6 / acq)),
                ])
            })
            .collect();
        Json::Arr(cont)
    }

    fn files(&self) -> Vec<(String, String)> {
        vec![(
            CHART.into(),
            crate::waits_svg::svg(|st, w| self.find(st, w)),
        )]
    }
}
