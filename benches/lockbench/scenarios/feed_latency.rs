//! The change feed (issue 20): how soon a holder hears of a loss the server caused, and how
//! soon a leader's crash is a new leader and is observed; each at a raw subscriber (the feed's
//! floor) and through the Rust client (`holder.rs`: what a user's code sees).
//!
//! Loss notice: the server ends a hold: a `DEL`, the holder's `BOUND` session ended by
//! `CLIENT KILL`, or a takeover after expiry (another client acquires the key once the hold's
//! deadline passed). Timed on the benchmark's clock from just before the causing command (or
//! the deadline) to the message's arrival at a raw subscriber of the key (`LOCK.WATCH`, then
//! `SSUBSCRIBE`: the harness's `FeedSubscriber`), and, in a second set of runs, to the loss
//! signal of a client guard that watches its key (`Client::watch_losses`; `Guard::lost`, what
//! a loss callback waits on). Today's detection is renewal-based: a guard with a watchdog and no
//! watch learns of the loss at its next `LOCK.EXTEND`, every ttl/3: measured with a 9 s ttl
//! (0.9 s with `QUICK=1`), the `DEL` spread evenly over the renewal period.
//!
//! Leader failover: a leader holds the election key, a candidate waits in the queue, an
//! observer follows; the leader *process* is killed with SIGKILL. Timed from the kill to the
//! candidate's grant and to the observer's report; in a `BOUND` session against a plain lock
//! (10 s ttl; 1 s with `QUICK=1`), where the candidate waits out the ttl. Raw: the leader is
//! `redis-cli` fed through a pipe, the candidate a `LOCK.ACQUIRE ... BLOCK`, the observer a raw
//! subscriber. Client: the leader is this binary again campaigning through `Election`, the
//! candidate's `Election::campaign` returns, the observer is `Election::observe`.

mod holder;

pub use holder::{leader_process, LEADER_ENV};

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use harness::feed::{FeedMessage, FeedSubscriber};

use super::session_end::{renice, PRIORITY};
use super::{Env, Scenario};
use crate::config::Config;
use crate::report::{f, num, obj, s, Goal, Json};
use crate::server::{info_u64, wait_info, Server};
use crate::stats::{median, pct, sorted};

pub fn new() -> Box<dyn Scenario> {
    Box::new(FeedLatency {
        rows: Vec::new(),
        renewal_ttl_s: 9.0,
        reniced: false,
    })
}

pub struct FeedLatency {
    rows: Vec<Row>,
    /// The renewal-based row's ttl, in s.
    renewal_ttl_s: f64,
    /// The server's main thread and this benchmark's threads ran at nice [`PRIORITY`].
    reniced: bool,
}

struct Row {
    what: String,
    /// Measured at a raw subscriber (false: through the Rust client).
    raw: bool,
    /// What it is: "loss", "renewal", "failover bound", "failover plain".
    kind: &'static str,
    /// ms per run (negative: the signal came before the server's deadline).
    ms: Vec<f64>,
    /// For the failover rows: ms from the kill to the observer's message.
    observed_ms: Vec<f64>,
    /// For the client's loss rows: the reason each signal gave.
    reasons: Vec<&'static str>,
}

impl Row {
    fn new(what: impl Into<String>, raw: bool, kind: &'static str) -> Row {
        Row {
            what: what.into(),
            raw,
            kind,
            ms: vec![],
            observed_ms: vec![],
            reasons: vec![],
        }
    }
}

/// The loss kinds: (label, how).
const LOSSES: [(&str, &str); 3] = [
    ("`DEL` of the key", "del"),
    (
        "the holder's `BOUND` session ended (`CLIENT KILL`)",
        "session",
    ),
    (
        "taken by another client after the hold's deadline",
        "takeover",
    ),
];

/// The harness's raw subscriber: `LOCK.WATCH key` then `SSUBSCRIBE channel` on one socket.
struct Watcher {
    sub: FeedSubscriber,
}

impl Watcher {
    fn start(srv: &Server, key: &str) -> Watcher {
        let (sub, _seq) = FeedSubscriber::watching(srv.port, 0, key.as_bytes());
        Watcher { sub }
    }

    /// Wait (60 s at most) for a message whose event is one of `events`; when it arrived.
    fn until(&mut self, events: &[&str]) -> Instant {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let body = self
                .sub
                .message_within(left)
                .unwrap_or_else(|| panic!("no {events:?} message within 60 s"));
            let at = Instant::now();
            if events.contains(&FeedMessage::parse(&body).event.as_str()) {
                return at;
            }
        }
    }
}

fn ms(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64() * 1000.0
}

fn open_bound(c: &mut redis::Connection, ttl: u64) -> String {
    redis::cmd("LOCK.SESSION")
        .arg("OPEN")
        .arg(ttl)
        .arg("BOUND")
        .query(c)
        .expect("LOCK.SESSION OPEN")
}

/// One loss notice: `how` is "del", "session" or "takeover".
fn loss(srv: &Server, key: &str, how: &str) -> f64 {
    let mut holder = srv.connect();
    let mut ctl = srv.connect();
    let mut sub = Watcher::start(srv, key);
    match how {
        "session" => {
            let id = open_bound(&mut holder, 30_000);
            let _: i64 = redis::cmd("LOCK.ACQUIRE")
                .arg(key)
                .arg("holder")
                .arg(0)
                .arg("SESSION")
                .arg(&id)
                .query(&mut holder)
                .unwrap();
        }
        "takeover" => {
            let _: i64 = redis::cmd("LOCK.ACQUIRE")
                .arg(key)
                .arg("holder")
                .arg(100)
                .query(&mut holder)
                .unwrap();
        }
        _ => {
            let _: i64 = redis::cmd("LOCK.ACQUIRE")
                .arg(key)
                .arg("holder")
                .arg(30_000)
                .query(&mut holder)
                .unwrap();
        }
    }
    sub.until(&["acquired"]);
    let start;
    match how {
        "session" => {
            let id: i64 = redis::cmd("CLIENT").arg("ID").query(&mut holder).unwrap();
            start = Instant::now();
            let _: i64 = redis::cmd("CLIENT")
                .arg("KILL")
                .arg("ID")
                .arg(id)
                .query(&mut ctl)
                .unwrap();
        }
        "takeover" => {
            // From the deadline, as the server's clock has it.
            let pttl: i64 = redis::cmd("PTTL").arg(key).query(&mut ctl).unwrap();
            start = Instant::now() + Duration::from_millis(pttl.max(0) as u64);
            thread::sleep(start.saturating_duration_since(Instant::now()));
            let mut got: Option<i64> = None;
            while got.is_none() {
                got = redis::cmd("LOCK.ACQUIRE")
                    .arg(key)
                    .arg("taker")
                    .arg(1_000)
                    .query(&mut ctl)
                    .unwrap();
            }
        }
        _ => {
            start = Instant::now();
            let _: i64 = redis::cmd("DEL").arg(key).query(&mut ctl).unwrap();
        }
    }
    let at = sub.until(&["deleted", "lost", "expired", "handoff"]);
    let _: i64 = redis::cmd("DEL").arg(key).query(&mut ctl).unwrap();
    ms(start, at)
}

/// One leader failover: (kill to the candidate's grant, kill to the observer's message).
fn failover(srv: &Server, key: &str, bound: bool, ttl: u64) -> (f64, f64) {
    let mut leader = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &srv.port.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start redis-cli for the leader");
    let mut out = BufReader::new(leader.stdout.take().unwrap());
    let mut ask = |leader: &mut std::process::Child, line: String| {
        let stdin = leader.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
        let mut reply = String::new();
        out.read_line(&mut reply).unwrap();
        reply.trim().to_string()
    };
    let mut acquire = format!(
        "LOCK.ACQUIRE {key} leader-1 {}",
        if bound { 0 } else { ttl }
    );
    if bound {
        let id = ask(&mut leader, format!("LOCK.SESSION OPEN {ttl} BOUND"));
        acquire.push_str(&format!(" SESSION {id}"));
    }
    let reply = ask(&mut leader, acquire);
    assert!(
        reply.parse::<i64>().is_ok(),
        "the leader's acquire: {reply}"
    );
    let mut sub = Watcher::start(srv, key);
    let mut ctl = srv.connect();
    let blocked = info_u64(&mut ctl, "clients", "blocked_clients");
    let mut candidate = srv.connect();
    let key_c = key.to_string();
    let granted = thread::spawn(move || {
        let _: i64 = redis::cmd("LOCK.ACQUIRE")
            .arg(&key_c)
            .arg("leader-2")
            .arg(30_000)
            .arg("BLOCK")
            .arg(120_000)
            .query(&mut candidate)
            .unwrap();
        Instant::now()
    });
    wait_info(
        &mut ctl,
        "clients",
        "blocked_clients",
        Duration::from_secs(10),
        |v| v > blocked,
    );
    let killed = Instant::now();
    leader.kill().unwrap();
    let _ = leader.wait();
    let observed = sub.until(&["handoff", "acquired"]);
    let at = granted.join().unwrap();
    let _: i64 = redis::cmd("DEL").arg(key).query(&mut ctl).unwrap();
    (ms(killed, at), ms(killed, observed))
}

impl FeedLatency {
    /// The rows of one side and kind.
    fn of<'a>(&'a self, raw: bool, kind: &'a str) -> impl Iterator<Item = &'a Row> + 'a {
        self.rows
            .iter()
            .filter(move |r| r.raw == raw && r.kind == kind)
    }

    /// Every run's ms of one side and kind, sorted.
    fn all(&self, raw: bool, kind: &str, observed: bool) -> Vec<f64> {
        sorted(
            self.of(raw, kind)
                .flat_map(|r| {
                    if observed { &r.observed_ms } else { &r.ms }
                        .iter()
                        .copied()
                })
                .collect(),
        )
    }
}

/// "Deleted 20" or "SessionEnded 12, BoundConnectionClosed 8": the reasons, counted.
fn counted(reasons: &[&str]) -> String {
    let mut seen: Vec<(&str, usize)> = vec![];
    for r in reasons {
        match seen.iter_mut().find(|(n, _)| n == r) {
            Some((_, c)) => *c += 1,
            None => seen.push((r, 1)),
        }
    }
    let parts: Vec<String> = seen.iter().map(|(n, c)| format!("{n} {c}")).collect();
    parts.join(", ")
}

impl Scenario for FeedLatency {
    fn run(&mut self, env: &mut Env) {
        let quick = env.cfg.quick;
        let runs = if quick { 5 } else { 20 };
        // As in the session scenarios: the server's main thread and this thread at nice
        // PRIORITY (the threads and the leader processes started from here inherit it), so
        // that other work on the shared cores is not timed as the feed's.
        let pid = info_u64(env.ctl, "server", "process_id") as u32;
        self.reniced =
            env.cfg.existing_port.is_none() && renice(pid, PRIORITY) && renice(0, PRIORITY);
        eprintln!(
            "[f1] feed latency: {runs} runs per loss kind (raw and through the client), renewal, leader failover"
        );
        for (what, how) in LOSSES {
            let mut raw = Row::new(what, true, "loss");
            let mut client = Row::new(what, false, "loss");
            // Alternating, so that the machine's drift hits both.
            for i in 0..runs {
                raw.ms
                    .push(loss(env.srv, &format!("bench:feed:{how}:{i}"), how));
                let (ms, reason) = holder::loss(env.srv, &format!("bench:feed:c:{how}:{i}"), how);
                client.ms.push(ms);
                client.reasons.push(reason);
            }
            self.rows.push(raw);
            self.rows.push(client);
        }
        // Renewal-based detection: the `DEL` at an even spread over the watchdog's period.
        let (ttl, renewals) = if quick {
            (Duration::from_millis(900), 3)
        } else {
            (Duration::from_secs(9), 6)
        };
        let mut renewal = Row::new(
            format!(
                "`DEL`, renewal-based: a watchdog's `LOCK.EXTEND` every ttl/3, {} s ttl, no watch",
                ttl.as_secs_f64()
            ),
            false,
            "renewal",
        );
        for i in 0..renewals {
            let offset = (ttl / 3).mul_f64((i as f64 + 0.5) / renewals as f64);
            let (ms, reason) =
                holder::renewal(env.srv, &format!("bench:feed:renewal:{i}"), ttl, offset);
            renewal.ms.push(ms);
            renewal.reasons.push(reason);
        }
        self.rows.push(renewal);
        self.renewal_ttl_s = ttl.as_secs_f64();

        let mut raw = Row::new(
            "leader failover, `BOUND` session (30 s ttl)",
            true,
            "failover bound",
        );
        let mut client = Row::new(
            "leader failover, `BOUND` session (30 s ttl)",
            false,
            "failover bound",
        );
        for i in 0..runs {
            let (g, o) = failover(env.srv, &format!("bench:feed:leader:{i}"), true, 30_000);
            raw.ms.push(g);
            raw.observed_ms.push(o);
            let (g, o) = holder::failover(
                env.srv,
                &format!("bench:feed:c:leader:{i}"),
                true,
                Duration::from_secs(30),
            );
            client.ms.push(g);
            client.observed_ms.push(o);
        }
        self.rows.push(raw);
        self.rows.push(client);
        let plain_ttl = if quick { 1_000 } else { 10_000 };
        let what = if quick {
            "leader failover, plain lock (1 s ttl in QUICK)"
        } else {
            "leader failover, plain 10 s lock"
        };
        let (g, o) = failover(env.srv, "bench:feed:leader:plain", false, plain_ttl);
        let mut raw = Row::new(what, true, "failover plain");
        raw.ms.push(g);
        raw.observed_ms.push(o);
        self.rows.push(raw);
        let (g, o) = holder::failover(
            env.srv,
            "bench:feed:c:leader:plain",
            false,
            Duration::from_millis(plain_ttl),
        );
        let mut client = Row::new(
            format!("{what}, renewed by its watchdog"),
            false,
            "failover plain",
        );
        client.ms.push(g);
        client.observed_ms.push(o);
        self.rows.push(client);
        if self.reniced {
            renice(0, 0);
            renice(pid, 0);
        }
    }
    fn intro(&self, o: &mut String, _cfg: &Config) {
        let _ = writeln!(
            o,
            "Loss notice: the time from a loss the server causes (a `DEL`, the holder's `BOUND` \
             session ended by `CLIENT KILL`, another client's acquire after the hold's deadline; \
             timed from the command's sending, or from the deadline as the server's `PTTL` put \
             it) to the `LOCK.WATCH` feed's message at a raw subscriber (the harness's \
             `FeedSubscriber`: the floor), and to the loss signal of a Rust client guard that \
             watches its key (`Client::watch_losses`, `Guard::lost`: what a loss callback waits \
             on). Beside it, today's renewal-based detection: a guard with a watchdog \
             (`LOCK.EXTEND` every ttl/3) and no watch, the `DEL` spread evenly over the renewal \
             period. Leader failover: the leader process is killed with SIGKILL while a \
             candidate waits in the queue; timed from the kill to the candidate's grant and to \
             the observer's report. Raw: `redis-cli` through a pipe as the leader, a \
             `LOCK.ACQUIRE ... BLOCK` candidate, a raw subscriber. Client: this benchmark's \
             binary as the leader (campaigning through `Election`), `Election::campaign` \
             returning, and `Election::observe`'s change naming the new leader. The server's main \
             thread and the benchmark's threads (the client's, and the leader processes, \
             started from them) run at nice {PRIORITY} when the benchmark may set it: the cores \
             are shared with other work.\n"
        );
    }
    fn markdown(&self, o: &mut String) {
        if !self.reniced {
            let _ = writeln!(
                o,
                "The benchmark could not set the nice values: everything ran at its default \
                 priority.\n"
            );
        }
        for raw in [true, false] {
            let _ = writeln!(
                o,
                "{}\n\n| event | runs | median ms | p99 ms | worst ms | observer's report, median / worst ms |{}\n|---|---|---|---|---|---|{}",
                if raw {
                    "At a raw subscriber (the feed's floor):"
                } else {
                    "Through the Rust client (the guard's loss signal; `Election`):"
                },
                if raw { "" } else { " signal's reason |" },
                if raw { "" } else { "---|" },
            );
            for r in self.rows.iter().filter(|r| r.raw == raw) {
                let v = sorted(r.ms.clone());
                let seen = if r.observed_ms.is_empty() {
                    "-".to_string()
                } else {
                    let s = sorted(r.observed_ms.clone());
                    format!("{} / {}", f(median(&s)), f(pct(&s, 100.0)))
                };
                let _ = write!(
                    o,
                    "| {} | {} | {} | {} | {} | {} |",
                    r.what,
                    v.len(),
                    f(median(&v)),
                    f(pct(&v, 99.0)),
                    f(pct(&v, 100.0)),
                    seen
                );
                if !raw {
                    let reasons = if r.reasons.is_empty() {
                        "-".to_string()
                    } else {
                        counted(&r.reasons)
                    };
                    let _ = write!(o, " {reasons} |");
                }
                o.push('\n');
            }
            o.push('\n');
        }
        let _ = writeln!(
            o,
            "The client's takeover row: a guard that watches its key fires at the feed's \
             message or at its own conservative deadline (the grant's sending plus the ttl), \
             whichever comes first; both report `Expired`. `Election::campaign` returns once \
             the new leader's own watch of the key is set up (`LOCK.WATCH`, `SSUBSCRIBE`, \
             `LOCK.INFO`), which is why the observer may report the new leader first.\n"
        );
    }
    fn goals(&self) -> Vec<Goal> {
        let mut goals = vec![];
        let losses = self.all(false, "loss", false);
        if !losses.is_empty() {
            let floor = self.all(true, "loss", false);
            let renewal = self.all(false, "renewal", false);
            let ttl_s = self.renewal_ttl_s;
            // Detection scales with the ttl (a renewal every ttl/3): a shorter ttl's figures
            // times 9 / ttl are the 9 s ttl's.
            let scaled = if ttl_s == 9.0 || renewal.is_empty() {
                String::new()
            } else {
                format!(
                    "; scaled to a 9 s ttl: median {} ms, worst {} ms",
                    f(median(&renewal) * 9.0 / ttl_s),
                    f(pct(&renewal, 100.0) * 9.0 / ttl_s)
                )
            };
            goals.push(Goal {
                goal: "loss notice (a `DEL`, a session ended, a takeover after expiry) at the holder's callback (the Rust guard's loss signal): p99 < 5 ms".into(),
                measured: format!(
                    "p99 {} ms, median {} ms over {} losses (at a raw subscriber: p99 {} ms); \
                     renewal-based (a watchdog every ttl/3, {ttl_s} s ttl, no watch): median {} \
                     ms, worst {} ms over {} runs{scaled}",
                    f(pct(&losses, 99.0)),
                    f(median(&losses)),
                    losses.len(),
                    f(pct(&floor, 99.0)),
                    f(median(&renewal)),
                    f(pct(&renewal, 100.0)),
                    renewal.len(),
                ),
                met: pct(&losses, 99.0) < 5.0,
            });
        }
        let led = self.all(false, "failover bound", false);
        let seen = self.all(false, "failover bound", true);
        if !led.is_empty() {
            let raw = self.all(true, "failover bound", true);
            let plain = self.all(false, "failover plain", false);
            let plain_seen = self.all(false, "failover plain", true);
            let worst = pct(&led, 100.0).max(pct(&seen, 100.0));
            goals.push(Goal {
                goal: "leader failover with a `BOUND` session: the next candidate leads and an observer reports it < 10 ms after the leader's kill -9 (Rust client `Election`)".into(),
                measured: format!(
                    "worst {} ms to `campaign` returning (median {}), worst {} ms to the \
                     observer's report (median {}), {} runs (raw observer's message: worst {} \
                     ms); plain lock: {} ms / {} ms",
                    f(pct(&led, 100.0)),
                    f(median(&led)),
                    f(pct(&seen, 100.0)),
                    f(median(&seen)),
                    led.len(),
                    f(pct(&raw, 100.0)),
                    f(pct(&plain, 100.0)),
                    f(pct(&plain_seen, 100.0)),
                ),
                met: worst < 10.0,
            });
        }
        goals
    }
    fn json(&self) -> Json {
        Json::Arr(
            self.rows
                .iter()
                .map(|r| {
                    obj(vec![
                        ("event", s(&r.what)),
                        ("at", s(if r.raw { "raw subscriber" } else { "client" })),
                        ("kind", s(r.kind)),
                        ("ms", Json::Arr(r.ms.iter().map(|x| num(*x)).collect())),
                        (
                            "observed_ms",
                            Json::Arr(r.observed_ms.iter().map(|x| num(*x)).collect()),
                        ),
                        (
                            "reasons",
                            Json::Arr(r.reasons.iter().map(|x| s(*x)).collect()),
                        ),
                    ])
                })
                .collect(),
        )
    }
}
