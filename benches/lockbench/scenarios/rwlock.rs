//! A read/write lock under contention: 16 readers and 2 writers on one key, each holding it
//! 1 ms and asking again at once. Readers take it `SHARED`, writers exclusively, all with
//! `BLOCK`; against the same workers all taking it exclusively. Reader throughput, and whether
//! writers starve (their grants and waits).

use std::fmt::Write as _;
use std::time::Duration;

use super::{Env, Scenario};
use crate::config::Config;
use crate::report::{f, num, obj, ratio, s, Goal, Json};
use crate::workers::{lock_block, lock_release, owner, rounds, Tally, Worker};

const READERS: usize = 16;
const WRITERS: usize = 2;
const HOLD: Duration = Duration::from_millis(1);
const TTL_MS: u64 = 10_000;
const KEY: &str = "bench:rw";
/// Roles of the workers.
const READER: usize = 0;
const WRITER: usize = 1;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Contender {
    /// Readers `SHARED BLOCK`, writers exclusive `BLOCK`.
    Shared,
    /// Everyone exclusive `BLOCK`.
    Exclusive,
}

const ALL: [Contender; 2] = [Contender::Shared, Contender::Exclusive];

impl Contender {
    fn label(self) -> &'static str {
        match self {
            Contender::Shared => "readers `SHARED BLOCK`, writers `BLOCK`",
            Contender::Exclusive => "everyone exclusive `BLOCK`",
        }
    }
    fn id(self) -> &'static str {
        match self {
            Contender::Shared => "readers_shared",
            Contender::Exclusive => "all_exclusive",
        }
    }
}

pub fn new() -> Box<dyn Scenario> {
    Box::new(RwLock {
        runs: Vec::new(),
        secs: 0.0,
        rounds: 0,
    })
}

pub struct RwLock {
    runs: Vec<(Contender, Tally)>,
    secs: f64,
    rounds: usize,
}

impl RwLock {
    fn get(&self, c: Contender) -> Option<&Tally> {
        self.runs.iter().find(|r| r.0 == c).map(|r| &r.1)
    }
}

/// Workers `0..READERS` read, the rest write.
fn worker(c: Contender, w: usize) -> Worker {
    let role = if w < READERS { READER } else { WRITER };
    let me = owner(w);
    let o = me.clone();
    let shared = c == Contender::Shared && role == READER;
    Worker {
        role,
        key: 0,
        attempt: Box::new(move |con| {
            lock_block(con, KEY, &o, TTL_MS, if shared { &["SHARED"] } else { &[] })
        }),
        release: Box::new(move |con| lock_release(con, KEY, &me)),
        retry_after: Box::new(|_| Duration::ZERO),
        hold: HOLD,
    }
}

impl Scenario for RwLock {
    fn run(&mut self, env: &mut Env) {
        self.secs = env.sizes.contention_secs;
        self.rounds = env.sizes.contention_rounds;
        eprintln!(
            "[rwlock] {READERS} readers, {WRITERS} writers, {} x {:.0} s per contender",
            self.rounds, self.secs
        );
        let tallies = rounds(
            env,
            ALL.len(),
            READERS + WRITERS,
            |i, w| worker(ALL[i], w),
            |_, _| {},
        );
        self.runs = ALL.into_iter().zip(tallies).collect();
    }

    fn intro(&self, o: &mut String, _cfg: &Config) {
        let _ = writeln!(
            o,
            "{READERS} reader and {WRITERS} writer threads on one key (`{KEY}`), one connection \
             each; every grant is held {} ms (a `sleep`), released with `LOCK.RELEASE`, and asked \
             for again at once, so writers always want the key (the hardest case for them). \
             Readers send `LOCK.ACQUIRE {KEY} owner {TTL_MS} SHARED BLOCK 30000`, writers the \
             same without `SHARED`; the comparison runs the same workers with every acquire \
             exclusive. {} rounds of {:.0} s per contender, the order reversed every other round. \
             *Wait* runs from wanting the key to the reply that grants it. Writers must not \
             starve: their grants per writer and their longest wait are shown.\n",
            HOLD.as_millis(),
            self.rounds,
            self.secs
        );
    }

    fn markdown(&self, o: &mut String) {
        let _ = writeln!(
            o,
            "| contender | reader grants/s | reader wait p50 / p99 ms | grants per reader min / max | writer grants/s | writer wait p50 / p99 / max ms | grants per writer | server CPU us/grant |\n|---|---|---|---|---|---|---|---|"
        );
        for (c, t) in &self.runs {
            let (rmin, rmax) = t.spread(Some(READER));
            let writers: Vec<String> = t
                .per_worker(Some(WRITER))
                .iter()
                .map(u64::to_string)
                .collect();
            let _ = writeln!(
                o,
                "| {} | {} | {} / {} | {rmin} / {rmax} | {} | {} / {} / {}{} | {} | {} |",
                c.label(),
                f(t.grants_per_s(Some(READER))),
                f(t.wait_pct(Some(READER), 50.0)),
                f(t.wait_pct(Some(READER), 99.0)),
                f(t.grants_per_s(Some(WRITER))),
                f(t.wait_pct(Some(WRITER), 50.0)),
                f(t.wait_pct(Some(WRITER), 99.0)),
                if t.unfinished(Some(WRITER)) > 0 {
                    ">= "
                } else {
                    ""
                },
                f(t.max_wait(Some(WRITER))),
                writers.join(" / "),
                f(t.cpu_us_per_grant())
            );
        }
        if let (Some(sh), Some(ex)) = (self.get(Contender::Shared), self.get(Contender::Exclusive))
        {
            let _ = writeln!(
                o,
                "\nReader throughput with `SHARED`: {} the all-exclusive run's. Writer wait p99: \
                 {} ms with `SHARED` readers, {} ms when everyone is exclusive.\n",
                ratio(sh.grants_per_s(Some(READER)) / ex.grants_per_s(Some(READER))),
                f(sh.wait_pct(Some(WRITER), 99.0)),
                f(ex.wait_pct(Some(WRITER), 99.0))
            );
        }
    }

    fn goals(&self) -> Vec<Goal> {
        let (Some(sh), Some(ex)) = (self.get(Contender::Shared), self.get(Contender::Exclusive))
        else {
            return Vec::new();
        };
        let (p_sh, p_ex) = (
            sh.wait_pct(Some(WRITER), 99.0),
            ex.wait_pct(Some(WRITER), 99.0),
        );
        let (wmin, _) = sh.spread(Some(WRITER));
        vec![Goal {
            goal: "read/write, 16 readers + 2 writers: writers not starved (every writer granted; \
                   writer wait p99 no worse than with everyone exclusive)"
                .into(),
            measured: format!(
                "writer p99 {} vs {} ms, max {} ms; fewest grants of a writer {wmin}",
                f(p_sh),
                f(p_ex),
                f(sh.max_wait(Some(WRITER)))
            ),
            met: wmin > 0 && sh.unfinished(Some(WRITER)) == 0 && p_sh <= p_ex,
        }]
    }

    fn json(&self) -> Json {
        Json::Arr(
            self.runs
                .iter()
                .map(|(c, t)| {
                    let side = |role: usize| {
                        obj(vec![
                            ("grants", num(t.grants(Some(role)) as f64)),
                            ("grants_per_s", num(t.grants_per_s(Some(role)))),
                            ("wait_ms_p50", num(t.wait_pct(Some(role), 50.0))),
                            ("wait_ms_p99", num(t.wait_pct(Some(role), 99.0))),
                            ("wait_ms_max", num(t.max_wait(Some(role)))),
                            ("unfinished_waits", num(t.unfinished(Some(role)) as f64)),
                            (
                                "grants_per_worker",
                                Json::Arr(
                                    t.per_worker(Some(role))
                                        .iter()
                                        .map(|x| num(*x as f64))
                                        .collect(),
                                ),
                            ),
                        ])
                    };
                    obj(vec![
                        ("contender", s(c.id())),
                        ("seconds", num(t.secs)),
                        ("readers", side(READER)),
                        ("writers", side(WRITER)),
                        ("server_cpu_us_per_grant", num(t.cpu_us_per_grant())),
                    ])
                })
                .collect(),
        )
    }
}
