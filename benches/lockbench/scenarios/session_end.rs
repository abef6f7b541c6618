//! Ending a session that holds 10,000 locks (issue 19): the longest time the server does not
//! answer a `PING` sent back to back from another connection while the session ends (by
//! `LOCK.SESSION CLOSE`, by `CLIENT KILL` of its bound connection, by its bound connection
//! closing), against `LOCK.MRELEASE` of 10,000 plain locks.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use redis::Connection;

use super::{Env, Scenario};
use crate::config::{Config, LONG_TTL_MS};
use crate::report::{f, num, obj, ratio, s, Goal, Json};
use crate::server::{commandstats, config_get, config_set, info_u64, reset_stats, Server};
use crate::stats::{median, pct, sorted};

/// Locks held by the session (and released by the `LOCK.MRELEASE` row).
const HOLDS: usize = 10_000;
/// The goal: no `PING` waits longer than this while a session ends.
const GOAL_MS: f64 = 20.0;

#[derive(Clone, Copy, PartialEq, Eq)]
enum How {
    Close,
    ClientKill,
    Disconnect,
    MRelease,
    /// Nothing ends: the pinger's own floor on this machine (the session is closed afterwards,
    /// unmeasured).
    Idle,
}

impl How {
    const ALL: [How; 5] = [
        How::Close,
        How::ClientKill,
        How::Disconnect,
        How::MRelease,
        How::Idle,
    ];
    fn label(self) -> &'static str {
        match self {
            How::Close => "`LOCK.SESSION CLOSE id` (from another connection)",
            How::ClientKill => "`CLIENT KILL ID` of the `BOUND` session's connection",
            How::Disconnect => {
                "the `BOUND` session's connection closes (the holder drops its socket)"
            }
            How::MRelease => "`LOCK.MRELEASE 10000 key ... owner` of 10,000 plain locks",
            How::Idle => "nothing ends (the same 10,000 holds, PINGs for 100 ms: the floor)",
        }
    }
    fn id(self) -> &'static str {
        match self {
            How::Close => "close",
            How::ClientKill => "client_kill",
            How::Disconnect => "disconnect",
            How::MRelease => "mrelease",
            How::Idle => "idle",
        }
    }
    fn session(self) -> bool {
        self != How::MRelease
    }
}

pub fn new() -> Box<dyn Scenario> {
    Box::new(SessionEnd {
        rows: Vec::new(),
        reniced: false,
    })
}

pub struct SessionEnd {
    rows: Vec<Row>,
    /// The server's main thread and the pinger ran at nice [`PRIORITY`].
    reniced: bool,
}

struct Row {
    how: How,
    /// Per run: the longest PING answered after the end began (ms).
    stall: Vec<f64>,
    /// Per run: ms from sending the end (or the kill, or the close) to every key gone.
    gone: Vec<f64>,
    /// Per run: PINGs answered after the end began, until every key was gone.
    pings: Vec<usize>,
    /// Per run: the ending command's time on the server (`INFO commandstats`, ms), for
    /// `CLOSE` and `LOCK.MRELEASE`.
    command: Vec<f64>,
}

/// The nice value of the server's main thread and of the pinger during the runs (when the
/// benchmark may set it): on 2 cores shared with other work, a pinger or server thread that
/// the kernel leaves waiting for a core shows as a stall as long as any the module causes.
pub(super) const PRIORITY: i32 = -10;

/// Set the nice value of thread `tid` (0: the calling thread); false when not allowed.
pub(super) fn renice(tid: u32, nice: i32) -> bool {
    // SAFETY: setpriority reads its arguments only.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) == 0 }
}

/// Poll `DBSIZE` until every key is gone (at most 30 s).
fn wait_empty(ctl: &mut Connection) {
    let limit = Instant::now() + Duration::from_secs(30);
    loop {
        let keys: usize = redis::cmd("DBSIZE").query(ctl).expect("DBSIZE");
        if keys == 0 {
            return;
        }
        assert!(
            Instant::now() < limit,
            "{keys} keys left 30 s after the end"
        );
        thread::sleep(Duration::from_micros(200));
    }
}

/// One run: take the holds, start the pinger, end them, wait until every key is gone.
fn one(srv: &Server, ctl: &mut Connection, how: How, rep: usize) -> (f64, f64, usize, f64) {
    let owner = "session-end-owner";
    let keys: Vec<String> = (0..HOLDS)
        .map(|i| format!("bench:session_end:{rep}:{i:05}"))
        .collect();
    let mut holder = srv.connect();
    let holder_id: i64 = redis::cmd("CLIENT")
        .arg("ID")
        .query(&mut holder)
        .expect("CLIENT ID");
    let mut open = redis::cmd("LOCK.SESSION");
    open.arg("OPEN").arg(LONG_TTL_MS);
    if matches!(how, How::ClientKill | How::Disconnect) {
        open.arg("BOUND");
    }
    let sid: String = if how.session() {
        open.query(&mut holder).expect("LOCK.SESSION OPEN")
    } else {
        String::new()
    };
    let mut p = redis::pipe();
    for k in &keys {
        let c = p.cmd("LOCK.ACQUIRE").arg(k).arg(owner).arg(LONG_TTL_MS);
        if how.session() {
            c.arg("SESSION").arg(&sid);
        }
    }
    let tokens: Vec<Option<i64>> = p.query(&mut holder).expect("the 10,000 acquires");
    assert!(
        tokens.iter().all(Option::is_some),
        "an acquire of a free key was refused"
    );
    let dbsize: usize = redis::cmd("DBSIZE").query(ctl).expect("DBSIZE");
    assert_eq!(dbsize, HOLDS, "DBSIZE after the acquires");

    reset_stats(ctl);
    let stop = AtomicBool::new(false);
    let pinged = AtomicUsize::new(0);
    let t0 = Instant::now();
    let (begun, gone, samples) = thread::scope(|sc| {
        let (stop, pinged) = (&stop, &pinged);
        let pinger = sc.spawn(move || {
            // Back-to-back PINGs on a raw socket, as the scale scenario does.
            renice(0, PRIORITY);
            let mut sock = srv.raw();
            let mut samples: Vec<(f64, f64)> = Vec::with_capacity(1 << 16);
            let mut buf = [0u8; 7];
            while !stop.load(Ordering::Relaxed) {
                let sent = Instant::now();
                sock.write_all(b"*1\r\n$4\r\nPING\r\n").expect("PING");
                sock.read_exact(&mut buf).expect("PONG");
                let back = Instant::now();
                samples.push((
                    (back - t0).as_secs_f64() * 1000.0,
                    (back - sent).as_secs_f64() * 1000.0,
                ));
                pinged.fetch_add(1, Ordering::Relaxed);
            }
            samples
        });
        let limit = Instant::now() + Duration::from_secs(10);
        while pinged.load(Ordering::Relaxed) < 200 && Instant::now() < limit {
            thread::yield_now();
        }
        let begun = (Instant::now() - t0).as_secs_f64() * 1000.0;
        match how {
            How::Close => {
                let n: Option<i64> = redis::cmd("LOCK.SESSION")
                    .arg("CLOSE")
                    .arg(&sid)
                    .query(ctl)
                    .expect("LOCK.SESSION CLOSE");
                assert_eq!(n, Some(HOLDS as i64), "LOCK.SESSION CLOSE's count");
            }
            How::ClientKill => {
                let n: i64 = redis::cmd("CLIENT")
                    .arg("KILL")
                    .arg("ID")
                    .arg(holder_id)
                    .query(ctl)
                    .expect("CLIENT KILL ID");
                assert_eq!(n, 1, "CLIENT KILL ID killed no client");
            }
            How::Disconnect => drop(holder),
            How::MRelease => {
                let n: i64 = redis::cmd("LOCK.MRELEASE")
                    .arg(HOLDS)
                    .arg(&keys)
                    .arg(owner)
                    .query(ctl)
                    .expect("LOCK.MRELEASE");
                assert_eq!(n, HOLDS as i64, "LOCK.MRELEASE's count");
            }
            How::Idle => thread::sleep(Duration::from_millis(100)),
        }
        if how != How::Idle {
            wait_empty(ctl);
        }
        let gone = (Instant::now() - t0).as_secs_f64() * 1000.0;
        stop.store(true, Ordering::Relaxed);
        (begun, gone, pinger.join().expect("the pinger panicked"))
    });
    if how == How::Idle {
        let n: Option<i64> = redis::cmd("LOCK.SESSION")
            .arg("CLOSE")
            .arg(&sid)
            .query(ctl)
            .expect("LOCK.SESSION CLOSE after the idle run");
        assert_eq!(n, Some(HOLDS as i64), "LOCK.SESSION CLOSE's count");
        wait_empty(ctl);
    }
    if how.session() {
        assert_eq!(
            info_u64(ctl, "lock", "lock_sessions"),
            0,
            "the session is still open after its holds are gone"
        );
    }
    let after: Vec<f64> = samples
        .iter()
        .filter(|(back, _)| *back > begun)
        .map(|(_, lat)| *lat)
        .collect();
    let stall = after.iter().copied().fold(0.0, f64::max);
    // The ending command's own time on the server (the disconnects release from a timer).
    let stats = commandstats(ctl);
    let own = match how {
        How::Close => stats.get("lock.session"),
        How::MRelease => stats.get("lock.mrelease"),
        _ => None,
    }
    .map_or(f64::NAN, |(_, usec)| usec / 1000.0);
    (stall, gone - begun, after.len(), own)
}

impl Scenario for SessionEnd {
    fn run(&mut self, env: &mut Env) {
        let runs = if env.cfg.quick { 2 } else { 5 };
        eprintln!(
            "[s3] session end: {HOLDS} holds, longest PING while they go, {runs} runs per way"
        );
        // The server's main thread (its pid) runs the event loop.
        let pid = info_u64(env.ctl, "server", "process_id") as u32;
        self.reniced = env.cfg.existing_port.is_none() && renice(pid, PRIORITY);
        let old = config_get(env.ctl, "lock.max-multi-keys");
        config_set(env.ctl, "lock.max-multi-keys", &HOLDS.to_string());
        let mut rows: Vec<Row> = How::ALL
            .iter()
            .map(|&how| Row {
                how,
                stall: Vec::new(),
                gone: Vec::new(),
                pings: Vec::new(),
                command: Vec::new(),
            })
            .collect();
        for rep in 0..runs {
            // The order turns every run, so that no way always runs first.
            for i in 0..rows.len() {
                let row = &mut rows[(i + rep) % How::ALL.len()];
                let (stall, gone, pings, command) = one(env.srv, env.ctl, row.how, rep);
                row.command.push(command);
                row.stall.push(stall);
                row.gone.push(gone);
                row.pings.push(pings);
            }
        }
        config_set(env.ctl, "lock.max-multi-keys", &old);
        if self.reniced {
            renice(pid, 0);
        }
        self.rows = rows;
    }
    fn intro(&self, o: &mut String, _cfg: &Config) {
        let _ = writeln!(
            o,
            "A connection takes {} locks on distinct keys (each with a {LONG_TTL_MS} ms ttl) in \
             a session, through one pipeline; another connection sends `PING` back to back on a \
             raw socket and times each; then the session ends, and the benchmark polls `DBSIZE` \
             until every key is gone. *Longest PING* is the longest any `PING` answered after \
             the end began waited: the longest time the server did not answer. The \
             `LOCK.MRELEASE` row is the same for 10,000 plain locks of one owner released by one \
             command (`lock.max-multi-keys` raised to 10,000 for it). The *nothing ends* row \
             is the floor: the longest `PING` of 100 ms with the holds in place and nothing \
             ending, on a machine whose cores other work shares. To keep that floor low, the \
             server's main thread and the pinger thread run at nice {PRIORITY} when the \
             benchmark may set it (it says below when it could not). The last column is the \
             ending command's own time on the server (`INFO commandstats` of that one call), \
             which a descheduled pinger does not inflate; the bound connections' ends release \
             from a zero-delay timer, outside any command, so they have none.\n",
            f(HOLDS as f64)
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
            "| how the 10,000 holds end | runs | longest PING, median ms | worst ms | until every key is gone, median ms | PINGs answered meanwhile, median | the command's own time on the server, median / max ms |\n|---|---|---|---|---|---|---|"
        );
        for r in &self.rows {
            let st = sorted(r.stall.clone());
            let pings: Vec<f64> = r.pings.iter().map(|&n| n as f64).collect();
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {} |",
                r.how.label(),
                st.len(),
                f(median(&st)),
                f(pct(&st, 100.0)),
                if r.how == How::Idle {
                    "-".to_string()
                } else {
                    f(median(&r.gone))
                },
                f(median(&pings)),
                if r.command.iter().all(|x| x.is_finite()) {
                    let c = sorted(r.command.clone());
                    format!("{} / {}", f(median(&c)), f(pct(&c, 100.0)))
                } else {
                    "-".to_string()
                }
            );
        }
        o.push('\n');
    }
    fn goals(&self) -> Vec<Goal> {
        let Some(mrel) = self.rows.iter().find(|r| r.how == How::MRelease) else {
            return Vec::new();
        };
        let m = pct(&sorted(mrel.stall.clone()), 100.0);
        let floor = self
            .rows
            .iter()
            .find(|r| r.how == How::Idle)
            .map_or(f64::NAN, |r| pct(&sorted(r.stall.clone()), 100.0));
        self.rows
            .iter()
            .filter(|r| r.how.session() && r.how != How::Idle)
            .map(|r| {
                let worst = pct(&sorted(r.stall.clone()), 100.0);
                Goal {
                    goal: format!(
                        "ending a session of 10,000 holds ({}) never keeps a PING waiting > 20 ms",
                        match r.how {
                            How::Close => "`LOCK.SESSION CLOSE`",
                            How::ClientKill => "`CLIENT KILL` of its bound connection",
                            _ => "its bound connection closing",
                        }
                    ),
                    measured: format!(
                        "worst of {} runs {} ms; `LOCK.MRELEASE` of 10,000 keys {} ms ({}); \
                         nothing ending {} ms",
                        r.stall.len(),
                        f(worst),
                        f(m),
                        ratio(worst / m),
                        f(floor)
                    ),
                    met: worst <= GOAL_MS,
                }
            })
            .collect()
    }
    fn json(&self) -> Json {
        Json::Arr(
            self.rows
                .iter()
                .map(|r| {
                    obj(vec![
                        ("end", s(r.how.id())),
                        ("holds", num(HOLDS as f64)),
                        (
                            "longest_ping_ms",
                            Json::Arr(r.stall.iter().map(|x| num(*x)).collect()),
                        ),
                        (
                            "until_all_gone_ms",
                            Json::Arr(r.gone.iter().map(|x| num(*x)).collect()),
                        ),
                        (
                            "command_ms",
                            Json::Arr(r.command.iter().map(|x| num(*x)).collect()),
                        ),
                        (
                            "pings",
                            Json::Arr(r.pings.iter().map(|x| num(*x as f64)).collect()),
                        ),
                    ])
                })
                .collect(),
        )
    }
}
