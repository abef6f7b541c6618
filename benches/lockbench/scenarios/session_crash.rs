//! Crashed holder in a session (issue 19): a holder *process* takes a 30 s lock and is
//! `kill -9`ed while a `LOCK.ACQUIRE ... BLOCK` waiter is already queued; the time from the kill
//! to the waiter's grant, for a plain lock (the waiter sits out the ttl) against a lock in a
//! `BOUND` session (the server ends the session when it sees the holder's connection close).

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redis::Connection;

use super::session_end::{renice, PRIORITY};
use super::{Env, Scenario};
use crate::config::Config;
use crate::report::{f, num, obj, s, Goal, Json};
use crate::server::{info_u64, wait_info, Server};
use crate::stats::{median, pct, sorted};

/// The holder's lock ttl, and its session's ttl, in a full run.
const TTL_MS: u64 = 30_000;
/// The plain lock's ttl in a `QUICK=1` run (the waiter sits it out).
const QUICK_PLAIN_TTL_MS: u64 = 1_000;

pub fn new() -> Box<dyn Scenario> {
    Box::new(SessionCrash {
        rows: Vec::new(),
        reniced: false,
    })
}

pub struct SessionCrash {
    rows: Vec<Row>,
    /// The server's main thread and the waiter ran at nice [`PRIORITY`].
    reniced: bool,
}

struct Row {
    bound: bool,
    ttl_ms: u64,
    /// Per run: ms from the holder's SIGKILL to the waiter's grant reply (client clock).
    kill_to_grant: Vec<f64>,
    /// Per run: ms from the SIGKILL to `waitpid` returning (the kernel's part).
    kill_to_reap: Vec<f64>,
    /// Per run: the lock's `PTTL` just before the kill (ms).
    pttl_at_kill: Vec<f64>,
}

impl Row {
    fn label(&self) -> String {
        if self.bound {
            format!(
                "`BOUND` session (`LOCK.SESSION OPEN {} BOUND`, `LOCK.ACQUIRE key owner {} SESSION id`)",
                self.ttl_ms, self.ttl_ms
            )
        } else {
            format!("plain lock (`LOCK.ACQUIRE key owner {}`)", self.ttl_ms)
        }
    }
    /// Per run: ms from the holder reaped to the grant (negative when the server had seen
    /// the socket close and granted before `waitpid` returned).
    fn after_reap(&self) -> Vec<f64> {
        self.kill_to_grant
            .iter()
            .zip(&self.kill_to_reap)
            .map(|(g, r)| g - r)
            .collect()
    }
    fn worst(&self) -> f64 {
        self.kill_to_grant.iter().copied().fold(f64::NAN, f64::max)
    }
}

/// The holder child, started and holding: `redis-cli` fed through a pipe (a small C
/// process, so that its teardown after the kill is short), its process and its lock's token.
fn spawn_holder(srv: &Server, key: &str, ttl: u64, bound: bool) -> (Child, i64) {
    let mut child = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &srv.port.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("cannot start redis-cli for the holder process");
    let mut out = BufReader::new(child.stdout.take().expect("holder stdout"));
    let mut ask = |child: &mut Child, line: String| -> String {
        let stdin = child.stdin.as_mut().expect("holder stdin");
        writeln!(stdin, "{line}").expect("write to the holder");
        stdin.flush().expect("write to the holder");
        let mut reply = String::new();
        out.read_line(&mut reply).expect("holder stdout");
        reply.trim().to_string()
    };
    let mut acquire = format!("LOCK.ACQUIRE {key} holder {ttl}");
    if bound {
        let sid = ask(&mut child, format!("LOCK.SESSION OPEN {ttl} BOUND"));
        acquire.push_str(&format!(" SESSION {sid}"));
    }
    let reply = ask(&mut child, acquire);
    let token = reply.parse().unwrap_or_else(|_| {
        let _ = child.kill();
        panic!("the holder's LOCK.ACQUIRE answered {reply:?}")
    });
    (child, token)
}

/// One run: the holder holds, the waiter queues (seen in `blocked_clients`), the holder is
/// killed; returns ms from the kill to the grant and to the holder reaped, and the lock's PTTL
/// just before the kill.
fn one(srv: &Server, ctl: &mut Connection, key: &str, ttl: u64, bound: bool) -> (f64, f64, f64) {
    let (mut holder, _token) = spawn_holder(srv, key, ttl, bound);
    // Its exit (closing its socket) is on the timed path too.
    renice(holder.id(), PRIORITY);
    let blocked = info_u64(ctl, "clients", "blocked_clients");
    let mut waiter = srv.connect();
    let block_ms = ttl + 30_000;
    let key_w = key.to_string();
    let granted = thread::spawn(move || {
        renice(0, PRIORITY);
        let token: Option<i64> = redis::cmd("LOCK.ACQUIRE")
            .arg(&key_w)
            .arg("waiter")
            .arg(10_000)
            .arg("BLOCK")
            .arg(block_ms)
            .query(&mut waiter)
            .expect("LOCK.ACQUIRE ... BLOCK of the waiter");
        let at = Instant::now();
        let token = token.expect("the waiter timed out instead of getting the lock");
        let _: i64 = redis::cmd("LOCK.RELEASE")
            .arg(&key_w)
            .arg("waiter")
            .query(&mut waiter)
            .expect("LOCK.RELEASE of the waiter");
        (at, token)
    });
    let now = wait_info(
        ctl,
        "clients",
        "blocked_clients",
        Duration::from_secs(10),
        |v| v > blocked,
    );
    assert!(
        now > blocked,
        "the waiter was not seen queued (blocked_clients {now})"
    );
    let pttl: i64 = redis::cmd("PTTL").arg(key).query(ctl).expect("PTTL");
    let killed = Instant::now();
    holder.kill().expect("SIGKILL of the holder process");
    // When the kernel has torn the holder down (its socket is closed by then at the latest).
    let reaper = thread::spawn(move || {
        renice(0, PRIORITY);
        let _ = holder.wait();
        Instant::now()
    });
    let (at, _token) = granted.join().expect("the waiter thread panicked");
    let reaped = reaper.join().expect("the reaper thread panicked");
    let ms = |t: Instant| t.saturating_duration_since(killed).as_secs_f64() * 1000.0;
    (ms(at), ms(reaped), pttl as f64)
}

impl Scenario for SessionCrash {
    fn run(&mut self, env: &mut Env) {
        let quick = env.cfg.quick;
        let (plain_runs, bound_runs) = if quick { (1, 5) } else { (1, 20) };
        let plain_ttl = if quick { QUICK_PLAIN_TTL_MS } else { TTL_MS };
        // As in the session_end scenario: the server's main thread and the waiter at nice
        // PRIORITY, so that other work on the shared cores is not timed as the module's.
        let pid = info_u64(env.ctl, "server", "process_id") as u32;
        self.reniced = env.cfg.existing_port.is_none() && renice(pid, PRIORITY);
        eprintln!(
            "[s1] session crash: holder process kill -9, {plain_runs} plain ({plain_ttl} ms ttl) \
             and {bound_runs} BOUND session runs ({TTL_MS} ms)"
        );
        let mut rows = vec![
            Row {
                bound: false,
                ttl_ms: plain_ttl,
                kill_to_grant: Vec::new(),
                kill_to_reap: Vec::new(),
                pttl_at_kill: Vec::new(),
            },
            Row {
                bound: true,
                ttl_ms: TTL_MS,
                kill_to_grant: Vec::new(),
                kill_to_reap: Vec::new(),
                pttl_at_kill: Vec::new(),
            },
        ];
        // The plain runs in the middle of the bound ones, so that both see the same machine.
        let mut plan = vec![true; bound_runs / 2];
        plan.extend(vec![false; plain_runs]);
        plan.extend(vec![true; bound_runs - bound_runs / 2]);
        for (rep, bound) in plan.into_iter().enumerate() {
            let row = &mut rows[usize::from(bound)];
            let key = format!("bench:session_crash:{rep}");
            let (ms, reaped, pttl) = one(env.srv, env.ctl, &key, row.ttl_ms, bound);
            row.kill_to_grant.push(ms);
            row.kill_to_reap.push(reaped);
            row.pttl_at_kill.push(pttl);
        }
        let sessions = info_u64(env.ctl, "lock", "lock_sessions");
        assert_eq!(sessions, 0, "a killed holder's session is still open");
        if self.reniced {
            renice(pid, 0);
        }
        self.rows = rows;
    }
    fn intro(&self, o: &mut String, cfg: &Config) {
        let _ = writeln!(
            o,
            "A holder *process* (`redis-cli` fed through a pipe, started afresh each run) \
             takes a lock; a `LOCK.ACQUIRE key waiter 10000 BLOCK ...` on another connection is seen \
             queued in `INFO clients` `blocked_clients`; then the holder gets `SIGKILL` \
             (`kill -9`). Timed: from just before the kill to the waiter's grant reply, on the \
             benchmark's clock, so it includes the kernel's teardown of the process and its \
             socket: the *reaped* column is the kill to `waitpid` returning, the part of the \
             figure that is the kernel's and not the server's, and *grant after the reap* the \
             rest (negative when the grant came first). A plain lock waits out its ttl (the *PTTL at the kill* column); a `BOUND` \
             session ends when the server sees the holder's connection close, and its holds are \
             released as `LOCK.RELEASE` would. The server's main thread, the holder process and \
             the waiter's thread run at nice {PRIORITY} when the benchmark may set it (the cores are shared with \
             other work), as in the session-end scenario.{}\n",
            if cfg.quick {
                format!(
                    " This `QUICK=1` run gives the plain lock a {QUICK_PLAIN_TTL_MS} ms ttl \
                     instead of {TTL_MS} ms, so its figure is that ttl, not 30 s."
                )
            } else {
                String::new()
            }
        );
    }
    fn markdown(&self, o: &mut String) {
        if !self.reniced {
            let _ = writeln!(
                o,
                "The benchmark could not set the server's nice value: everything ran at its \
                 default priority.\n"
            );
        }
        let _ = writeln!(
            o,
            "| holder's lock | runs | kill to grant, median ms | worst ms | kill to the holder reaped (`waitpid`), median / worst ms | grant after the reap, median / worst ms | lock's PTTL at the kill, ms |\n|---|---|---|---|---|---|---|"
        );
        for r in &self.rows {
            let k = sorted(r.kill_to_grant.clone());
            let reap = sorted(r.kill_to_reap.clone());
            let after = sorted(r.after_reap());
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} / {} | {} / {} | {} |",
                r.label(),
                k.len(),
                f(median(&k)),
                f(pct(&k, 100.0)),
                f(median(&reap)),
                f(pct(&reap, 100.0)),
                f(median(&after)),
                f(pct(&after, 100.0)),
                f(median(&r.pttl_at_kill))
            );
        }
        if let [plain, bound] = &self.rows[..] {
            let _ = writeln!(
                o,
                "\nThe next waiter had the lock {} sooner in a `BOUND` session (median against \
                 median).\n",
                crate::report::ratio(median(&plain.kill_to_grant) / median(&bound.kill_to_grant))
            );
        }
    }
    fn goals(&self) -> Vec<Goal> {
        let [plain, bound] = &self.rows[..] else {
            return Vec::new();
        };
        let worst = bound.worst();
        vec![Goal {
            goal: format!(
                "crashed holder (kill -9) in a `BOUND` session: the queued waiter has the lock < 5 ms after the kill, worst of {} runs",
                bound.kill_to_grant.len()
            ),
            measured: format!(
                "worst {} ms, median {} ms (kill to `waitpid`, the kernel's part: worst {} ms); plain lock with a {} ms ttl: {} ms ({} the BOUND median)",
                f(worst),
                f(median(&bound.kill_to_grant)),
                f(bound.kill_to_reap.iter().copied().fold(f64::NAN, f64::max)),
                plain.ttl_ms,
                f(median(&plain.kill_to_grant)),
                crate::report::ratio(median(&plain.kill_to_grant) / median(&bound.kill_to_grant))
            ),
            met: worst < 5.0,
        }]
    }
    fn json(&self) -> Json {
        Json::Arr(
            self.rows
                .iter()
                .map(|r| {
                    obj(vec![
                        ("lock", s(if r.bound { "bound_session" } else { "plain" })),
                        ("ttl_ms", num(r.ttl_ms as f64)),
                        (
                            "kill_to_grant_ms",
                            Json::Arr(r.kill_to_grant.iter().map(|x| num(*x)).collect()),
                        ),
                        ("median_ms", num(median(&r.kill_to_grant))),
                        ("worst_ms", num(r.worst())),
                        (
                            "kill_to_reap_ms",
                            Json::Arr(r.kill_to_reap.iter().map(|x| num(*x)).collect()),
                        ),
                        (
                            "grant_after_reap_ms",
                            Json::Arr(r.after_reap().iter().map(|x| num(*x)).collect()),
                        ),
                        (
                            "pttl_at_kill_ms",
                            Json::Arr(r.pttl_at_kill.iter().map(|x| num(*x)).collect()),
                        ),
                    ])
                })
                .collect(),
        )
    }
}
