//! The same losses and failovers as the holder and the observer see them through the Rust
//! client (`redis-lock-client`): a guard's loss signal ([`Guard::lost`], what a loss callback
//! waits on) after the server ends its hold, the watchdog's renewal-based detection beside it,
//! and an [`Election`] candidate and observer after a leader process's SIGKILL.
//!
//! The leader is a process of its own: this benchmark's binary started again with
//! `LOCKBENCH_LEADER` set ([`leader_process`]), campaigning through the client's `Election`
//! (in a `BOUND` session, or as a plain lock renewed by its watchdog), so that the kill ends a
//! real client's connections.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redis_lock_client::{Client, Election, Guard, LossReason, Session};

use crate::server::{info_u64, wait_info, Server};

/// The variable that makes the benchmark's binary a leader process: `port name bound ttl_ms`.
pub const LEADER_ENV: &str = "LOCKBENCH_LEADER";

/// How long a loss or a change may take before the run counts as broken.
const PATIENCE: Duration = Duration::from_secs(30);

fn url(srv: &Server) -> String {
    format!("redis://127.0.0.1:{}/", srv.port)
}

/// ms from `from` to `to`, negative when `to` came first.
fn signed_ms(from: Instant, to: Instant) -> f64 {
    if to >= from {
        (to - from).as_secs_f64() * 1000.0
    } else {
        -((from - to).as_secs_f64() * 1000.0)
    }
}

/// A loss's name in the report.
pub fn reason_name(reason: &LossReason) -> &'static str {
    match reason {
        LossReason::NotHeld => "NotHeld",
        LossReason::SessionEnded => "SessionEnded",
        LossReason::BoundConnectionClosed(_) => "BoundConnectionClosed",
        LossReason::Deleted => "Deleted",
        LossReason::Expired => "Expired",
        LossReason::Taken { .. } => "Taken",
        LossReason::Released => "Released",
        LossReason::ExtendFailed(_) => "ExtendFailed",
        _ => "other",
    }
}

/// Wait for `guard`'s loss signal; (when it came, its reason).
fn lost_at(guard: &Guard) -> (Instant, &'static str) {
    let reason = guard
        .lost()
        .recv_timeout(PATIENCE)
        .expect("the guard's loss signal");
    (Instant::now(), reason_name(&reason))
}

/// One loss at the holder's signal: `how` is "del", "session" or "takeover". The causing
/// command runs on a thread of its own while this one waits on the signal. Returns ms from the
/// cause (the command's sending, or the hold's deadline on the server's clock) to the signal,
/// and the reason it gave.
pub fn loss(srv: &Server, key: &str, how: &str) -> (f64, &'static str) {
    let client = Client::open(&url(srv)).expect("client").watch_losses();
    let mut ctl = srv.connect();
    let mut session = None;
    let guard = match how {
        "session" => {
            let s = Session::builder(&client, Duration::from_secs(30))
                .bound(true)
                .open()
                .expect("LOCK.SESSION OPEN ... BOUND");
            let g = s.client().acquire(key, Duration::ZERO);
            session = Some(s);
            g
        }
        "takeover" => client.acquire(key, Duration::from_millis(200)),
        _ => client.acquire(key, Duration::from_secs(30)),
    }
    .expect("acquire")
    .expect("granted");
    assert!(guard.is_watching());
    let key_c = key.to_string();
    let cause = match how {
        "session" => {
            let bound = session
                .as_ref()
                .unwrap()
                .info()
                .expect("LOCK.SESSION INFO")
                .and_then(|i| i.bound)
                .expect("the bound connection's id");
            thread::spawn(move || {
                let start = Instant::now();
                let n: i64 = redis::cmd("CLIENT")
                    .arg("KILL")
                    .arg("ID")
                    .arg(bound)
                    .query(&mut ctl)
                    .unwrap();
                assert_eq!(n, 1, "CLIENT KILL of the bound connection");
                start
            })
        }
        "takeover" => {
            // From the deadline, as the server's clock has it.
            let pttl: i64 = redis::cmd("PTTL").arg(key).query(&mut ctl).unwrap();
            let deadline = Instant::now() + Duration::from_millis(pttl.max(0) as u64);
            thread::spawn(move || {
                thread::sleep(deadline.saturating_duration_since(Instant::now()));
                let mut got: Option<i64> = None;
                while got.is_none() {
                    got = redis::cmd("LOCK.ACQUIRE")
                        .arg(&key_c)
                        .arg("taker")
                        .arg(1_000)
                        .query(&mut ctl)
                        .unwrap();
                }
                deadline
            })
        }
        _ => thread::spawn(move || {
            let start = Instant::now();
            let _: i64 = redis::cmd("DEL").arg(&key_c).query(&mut ctl).unwrap();
            start
        }),
    };
    let (at, reason) = lost_at(&guard);
    let start = cause.join().unwrap();
    drop(guard);
    if let Some(s) = session {
        let _ = s.close();
    }
    let _: i64 = redis::cmd("DEL")
        .arg(key)
        .query(&mut srv.connect())
        .unwrap();
    (signed_ms(start, at), reason)
}

/// Today's renewal-based detection: a guard with a watchdog (`LOCK.EXTEND` every ttl/3) and no
/// watch of the feed; the key is deleted `offset` after the grant, and the watchdog's next
/// renewal tells. ms from the `DEL` to the signal.
pub fn renewal(srv: &Server, key: &str, ttl: Duration, offset: Duration) -> (f64, &'static str) {
    let client = Client::open(&url(srv)).expect("client");
    let guard = client
        .acquire_with_watchdog(key, ttl)
        .expect("acquire")
        .expect("granted");
    let granted = Instant::now();
    let mut ctl = srv.connect();
    thread::sleep((granted + offset).saturating_duration_since(Instant::now()));
    let start = Instant::now();
    let _: i64 = redis::cmd("DEL").arg(key).query(&mut ctl).unwrap();
    let (at, reason) = lost_at(&guard);
    (signed_ms(start, at), reason)
}

/// A leader process (the benchmark's binary with [`LEADER_ENV`]): campaign through the
/// client's `Election`, print `leading TERM`, then keep the leadership until killed (at most
/// ten minutes).
pub fn leader_process(spec: &str) {
    let parts: Vec<&str> = spec.split(' ').collect();
    let [port, name, bound, ttl_ms] = parts.as_slice() else {
        panic!("{LEADER_ENV}={spec}: want `port name bound ttl_ms`");
    };
    let client = Client::open(&format!("redis://127.0.0.1:{port}/")).expect("client");
    let ttl = Duration::from_millis(ttl_ms.parse().expect("ttl_ms"));
    let _session;
    let election = if *bound == "1" {
        let session = Session::builder(&client, ttl)
            .bound(true)
            .open()
            .expect("LOCK.SESSION OPEN ... BOUND");
        let e = Election::new(&session.client(), name, Duration::ZERO);
        _session = Some(session);
        e
    } else {
        _session = None;
        Election::new(&client, name, ttl)
    };
    let leadership = election.campaign("leader-1").expect("campaign");
    let mut out = std::io::stdout();
    writeln!(out, "leading {}", leadership.term()).unwrap();
    out.flush().unwrap();
    thread::sleep(Duration::from_secs(600));
}

/// Start a leader process on `name` and wait until it leads.
fn start_leader(srv: &Server, name: &str, bound: bool, ttl: Duration) -> Child {
    let exe = std::env::current_exe().expect("the benchmark's own binary");
    let mut child = Command::new(exe)
        .env(
            LEADER_ENV,
            format!(
                "{} {name} {} {}",
                srv.port,
                u8::from(bound),
                ttl.as_millis()
            ),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the leader process");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .expect("the leader's first line");
    assert!(line.starts_with("leading "), "the leader said {line:?}");
    child
}

/// One failover through the client: a leader process leads `name`, a candidate campaigns
/// (queued, seen in `blocked_clients`), an observer follows; the leader gets SIGKILL. Returns
/// ms from the kill to the candidate's `campaign` returning and to the observer's change that
/// names it.
pub fn failover(srv: &Server, name: &str, bound: bool, ttl: Duration) -> (f64, f64) {
    let mut leader = start_leader(srv, name, bound, ttl);
    let client = Client::open(&url(srv)).expect("client");
    let observer = Election::new(&client, name, ttl)
        .observe()
        .expect("observe");
    let first = observer
        .next_timeout(PATIENCE)
        .expect("the observer's first report");
    assert_eq!(
        first.leader.as_ref().map(|l| l.value.as_str()),
        Some("leader-1"),
        "{first:?}"
    );
    let mut ctl = srv.connect();
    let blocked = info_u64(&mut ctl, "clients", "blocked_clients");
    let (tx, rx) = mpsc::channel();
    let name_c = name.to_string();
    let candidate = thread::spawn(move || {
        let session = bound.then(|| {
            Session::builder(&client, Duration::from_secs(30))
                .bound(true)
                .open()
                .expect("LOCK.SESSION OPEN ... BOUND")
        });
        let election = match &session {
            Some(s) => Election::new(&s.client(), &name_c, Duration::ZERO),
            None => Election::new(&client, &name_c, ttl),
        };
        tx.send(()).unwrap();
        let leadership = election.campaign("leader-2").expect("campaign");
        let at = Instant::now();
        assert!(leadership.resign().expect("resign"));
        if let Some(s) = session {
            let _ = s.close();
        }
        at
    });
    rx.recv().unwrap();
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
    let observed = loop {
        let change = observer
            .next_timeout(PATIENCE)
            .expect("the observer's report of the new leader");
        if change
            .leader
            .as_ref()
            .is_some_and(|l| l.value == "leader-2")
        {
            break Instant::now();
        }
    };
    let led = candidate.join().unwrap();
    drop(observer);
    let _: i64 = redis::cmd("DEL").arg(name).query(&mut ctl).unwrap();
    (signed_ms(killed, led), signed_ms(killed, observed))
}
