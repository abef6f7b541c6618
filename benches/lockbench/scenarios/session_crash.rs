//! Crashed holder in a session (issue 19): a holder *process* takes a 30 s lock and is
//! `kill -9`ed while a `LOCK.ACQUIRE ... BLOCK` waiter is already queued; the time from the kill
//! to the waiter's grant, for a plain lock (the waiter sits out the ttl) against a lock in a
//! `BOUND` session (the server ends the session when it sees the holder's connection close).

use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redis::Connection;

use super::{Env, Scenario};
use crate::config::Config;
use crate::report::{f, num, obj, s, Goal, Json};
use crate::server::{info_u64, wait_info, Server};
use crate::stats::{median, pct, sorted};

/// The holder's lock ttl, and its session's ttl, in a full run.
const TTL_MS: u64 = 30_000;
/// The plain lock's ttl in a `QUICK=1` run (the waiter sits it out).
const QUICK_PLAIN_TTL_MS: u64 = 1_000;

/// The holder process: a raw RESP client (no library), so that nothing of the holder but its
/// socket and the kernel's teardown of a killed process is on the timed path. Arguments: port,
/// key, ttl, `bound` or `plain`. It prints the lock's token once held, then waits on stdin
/// until it is killed.
const HOLDER: &str = r#"
import socket, sys
port, key, ttl, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
s = socket.create_connection(("127.0.0.1", port))
f = s.makefile("rb")
def cmd(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        out.append(b"$%d\r\n%s\r\n" % (len(a.encode()), a.encode()))
    s.sendall(b"".join(out))
    line = f.readline()
    if line[:1] == b"$" and line[1:2] != b"-":
        return f.read(int(line[1:]) + 2)[:-2].decode()
    if line[:1] == b":":
        return line[1:].strip().decode()
    sys.exit("holder: %r answered %r" % (args[0], line))
args = [key, "holder", ttl]
if mode == "bound":
    args += ["SESSION", cmd("LOCK.SESSION", "OPEN", ttl, "BOUND")]
print(cmd("LOCK.ACQUIRE", *args), flush=True)
sys.stdin.read()
"#;

pub fn new() -> Box<dyn Scenario> {
    Box::new(SessionCrash { rows: Vec::new() })
}

pub struct SessionCrash {
    rows: Vec<Row>,
}

struct Row {
    bound: bool,
    ttl_ms: u64,
    /// Per run: ms from the holder's SIGKILL to the waiter's grant reply (client clock).
    kill_to_grant: Vec<f64>,
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
    fn worst(&self) -> f64 {
        self.kill_to_grant.iter().copied().fold(f64::NAN, f64::max)
    }
}

/// The holder child, started and holding: its process and its lock's token.
fn spawn_holder(srv: &Server, key: &str, ttl: u64, bound: bool) -> (Child, i64) {
    let mut child = Command::new("python3")
        .args(["-c", HOLDER, &srv.port.to_string(), key, &ttl.to_string()])
        .arg(if bound { "bound" } else { "plain" })
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("cannot start python3 for the holder process");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("holder stdout"))
        .read_line(&mut line)
        .expect("holder stdout");
    let token = line.trim().parse().unwrap_or_else(|_| {
        let _ = child.kill();
        panic!("the holder process did not print a token: {line:?}")
    });
    (child, token)
}

/// One run: the holder holds, the waiter queues (seen in `blocked_clients`), the holder is
/// killed; returns (ms from the kill to the grant, the lock's PTTL just before the kill).
fn one(srv: &Server, ctl: &mut Connection, key: &str, ttl: u64, bound: bool) -> (f64, f64) {
    let (mut holder, _token) = spawn_holder(srv, key, ttl, bound);
    let blocked = info_u64(ctl, "clients", "blocked_clients");
    let mut waiter = srv.connect();
    let block_ms = ttl + 30_000;
    let key_w = key.to_string();
    let granted = thread::spawn(move || {
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
    let (at, _token) = granted.join().expect("the waiter thread panicked");
    let _ = holder.wait();
    (
        at.saturating_duration_since(killed).as_secs_f64() * 1000.0,
        pttl as f64,
    )
}

impl Scenario for SessionCrash {
    fn run(&mut self, env: &mut Env) {
        let quick = env.cfg.quick;
        let (plain_runs, bound_runs) = if quick { (1, 5) } else { (1, 20) };
        let plain_ttl = if quick { QUICK_PLAIN_TTL_MS } else { TTL_MS };
        eprintln!(
            "[s1] session crash: holder process kill -9, {plain_runs} plain ({plain_ttl} ms ttl) \
             and {bound_runs} BOUND session runs ({TTL_MS} ms)"
        );
        let mut rows = vec![
            Row {
                bound: false,
                ttl_ms: plain_ttl,
                kill_to_grant: Vec::new(),
                pttl_at_kill: Vec::new(),
            },
            Row {
                bound: true,
                ttl_ms: TTL_MS,
                kill_to_grant: Vec::new(),
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
            let (ms, pttl) = one(env.srv, env.ctl, &key, row.ttl_ms, bound);
            row.kill_to_grant.push(ms);
            row.pttl_at_kill.push(pttl);
        }
        let sessions = info_u64(env.ctl, "lock", "lock_sessions");
        assert_eq!(sessions, 0, "a killed holder's session is still open");
        self.rows = rows;
    }
    fn intro(&self, o: &mut String, cfg: &Config) {
        let _ = writeln!(
            o,
            "A holder *process* (a raw RESP client in `python3`, started afresh each run) takes \
             a lock; a `LOCK.ACQUIRE key waiter 10000 BLOCK ...` on another connection is seen \
             queued in `INFO clients` `blocked_clients`; then the holder gets `SIGKILL` \
             (`kill -9`). Timed: from just before the kill to the waiter's grant reply, on the \
             benchmark's clock (so it includes the kernel's teardown of the process and its \
             socket). A plain lock waits out its ttl (the *PTTL at the kill* column); a `BOUND` \
             session ends when the server sees the holder's connection close, and its holds are \
             released as `LOCK.RELEASE` would.{}\n",
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
        let _ = writeln!(
            o,
            "| holder's lock | runs | kill to grant, median ms | worst ms | lock's PTTL at the kill, ms |\n|---|---|---|---|---|"
        );
        for r in &self.rows {
            let k = sorted(r.kill_to_grant.clone());
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} |",
                r.label(),
                k.len(),
                f(median(&k)),
                f(pct(&k, 100.0)),
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
                "worst {} ms, median {} ms; plain lock with a {} ms ttl: {} ms ({} the BOUND median)",
                f(worst),
                f(median(&bound.kill_to_grant)),
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
                            "pttl_at_kill_ms",
                            Json::Arr(r.pttl_at_kill.iter().map(|x| num(*x)).collect()),
                        ),
                    ])
                })
                .collect(),
        )
    }
}
