//! kill -9 of a holder process to the next holder's grant, with the Rust client's defaults
//! (issue 29's measure; the same rows and shape as clients/python/bench/default_session_takeover.py).
//!
//! ```text
//! REDIS_SERVER=/usr/bin/redis-server REDIS_LOCK_MODULE=target/release/libredis_lock.so \
//!     cargo run --release -p redis-lock-client --example default_session_takeover [RUNS]
//! ```
//!
//! Starts one server with the module through the workspace's harness (as the tests do), then for
//! each run starts a holder process (this program, `holder URL KEY MODE`) that takes its lock as
//! the README shows, queues a waiter here (`LOCK.ACQUIRE ... BLOCK`, `without_session()`),
//! SIGKILLs the holder and times, on this process's monotonic clock, from the kill to the
//! waiter's `acquire_blocking` returning its guard. Rows:
//!
//! - `client.acquire(key, 10 s)`: clients/rust/README.md's first example (the default session).
//! - `client.acquire_with_watchdog(key, 5 s)`: a lock renewed by a watchdog, in the default session.
//! - the same with `client.without_session()`: the ttl alone, for reference (3 runs).
//!
//! Then RUNS blips: the holder process lives, its default session's bound connection is ended
//! with `CLIENT KILL`, and the row says in how many the hold was still the holder's two seconds
//! later (`LOCK.FENCE key token`) and how long the client took to `ATTACH` the session on a new
//! connection (`LOCK.SESSION LIST`'s `bound`, polled every millisecond).
//!
//! Prints p50, p99 (nearest rank: of 20 runs, the largest) and the largest.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use harness::{send_signal, unique_key, Server};
use redis::{Connection, Value};
use redis_lock_client::Client;

/// The holder process: the lock taken as `mode` says, `held <token>` printed, then waits.
fn holder(url: &str, key: &str, mode: &str) {
    let client = Client::open(url).unwrap();
    let guard = match mode {
        "default" => client.acquire(key, Duration::from_secs(10)),
        "watchdog" => client.acquire_with_watchdog(key, Duration::from_secs(5)),
        "none-watchdog" => client
            .without_session()
            .acquire_with_watchdog(key, Duration::from_secs(5)),
        other => panic!("mode {other}"),
    };
    let guard = guard.unwrap().expect("the key is free");
    println!("held {}", guard.token());
    thread::sleep(Duration::from_secs(120));
}

/// A holder process, killed when dropped.
struct Holder(Child);

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_holder(server: &Server, key: &str, mode: &str) -> (Holder, u64) {
    let mut child = Holder(
        Command::new(std::env::current_exe().unwrap())
            .args(["holder", &server.url(), key, mode])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let token = line
        .strip_prefix("held ")
        .unwrap_or_else(|| panic!("holder said {line:?}"));
    (child, token.trim().parse().unwrap())
}

/// One kill: ms from the SIGKILL to the waiter's grant.
fn one_run(server: &Server, waiter: &Client, mode: &str) -> f64 {
    let key = unique_key("bench");
    let (child, _token) = spawn_holder(server, &key, mode);
    let queued = {
        let (waiter, key) = (waiter.clone(), key.clone());
        thread::spawn(move || {
            let guard = waiter
                .acquire_blocking(&key, Duration::from_secs(30), Duration::from_secs(60))
                .unwrap()
                .expect("the waiter was not granted");
            (Instant::now(), guard)
        })
    };
    server.wait_blocked(1);
    let killed = Instant::now();
    send_signal(child.0.id(), "KILL");
    let (at, guard) = queued.join().unwrap();
    guard.release().unwrap();
    drop(child);
    (at - killed).as_secs_f64() * 1000.0
}

/// A flat `name value ...` entry's field `name`.
fn field<'a>(entry: &'a [Value], name: &str) -> Option<&'a Value> {
    entry
        .chunks(2)
        .find(|kv| matches!(&kv[0], Value::BulkString(b) if b == name.as_bytes()))
        .map(|kv| &kv[1])
}

/// The client id the session `serial` is bound to (`LOCK.SESSION LIST`), or `None`.
fn bound_of(conn: &mut Connection, serial: i64) -> Option<i64> {
    let mut cursor = "0".to_string();
    loop {
        let (next, page): (String, Vec<Vec<Value>>) = redis::cmd("LOCK.SESSION")
            .arg("LIST")
            .arg(&cursor)
            .arg("COUNT")
            .arg(1000)
            .query(conn)
            .unwrap();
        for entry in &page {
            if field(entry, "serial") == Some(&Value::Int(serial)) {
                return match field(entry, "bound") {
                    Some(Value::Int(id)) => Some(*id),
                    _ => None,
                };
            }
        }
        if next == "0" {
            return None;
        }
        cursor = next;
    }
}

/// The session serial of `key`'s holder (`LOCK.INFO`).
fn serial_of(conn: &mut Connection, key: &str) -> i64 {
    let info: Vec<Value> = redis::cmd("LOCK.INFO").arg(key).query(conn).unwrap();
    let Some(Value::Array(holders)) = field(&info, "holders") else {
        panic!("no holders: {info:?}");
    };
    let Value::Array(holder) = &holders[0] else {
        panic!("holder: {holders:?}");
    };
    match field(holder, "session") {
        Some(Value::Int(serial)) => *serial,
        other => panic!("not in a session: {other:?}"),
    }
}

/// One blip: (the hold kept?, ms from the CLIENT KILL to the re-ATTACH).
fn one_blip(server: &Server, conn: &mut Connection) -> (bool, Option<f64>) {
    let key = unique_key("bench");
    let (child, token) = spawn_holder(server, &key, "default");
    let serial = serial_of(conn, &key);
    let old = bound_of(conn, serial).expect("bound");
    let killed = Instant::now();
    let n: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(old)
        .query(conn)
        .unwrap();
    assert_eq!(n, 1);
    let mut attached = None;
    while killed.elapsed() < Duration::from_secs(2) {
        // Four graces: long past the server's end of it.
        let now = bound_of(conn, serial);
        if attached.is_none() && now.is_some_and(|id| id != old) {
            attached = Some(killed.elapsed().as_secs_f64() * 1000.0);
        }
        thread::sleep(Duration::from_millis(1));
    }
    let kept: i64 = redis::cmd("LOCK.FENCE")
        .arg(&key)
        .arg(token)
        .query(conn)
        .unwrap();
    drop(child);
    (kept == 1 && attached.is_some(), attached)
}

/// The nearest-rank percentile.
fn percentile(values: &[f64], p: usize) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = (sorted.len() * p).div_ceil(100).max(1);
    sorted[rank - 1]
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n % 2 {
        1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("holder") {
        return holder(&args[2], &args[3], &args[4]);
    }
    let runs: usize = args.get(1).map_or(20, |n| n.parse().expect("RUNS"));
    let server = Server::start();
    let waiter = Client::open(&server.url()).unwrap().without_session();
    let rows = [
        ("client.acquire(key, 10 s)", "default", runs),
        ("client.acquire_with_watchdog(key, 5 s)", "watchdog", runs),
        (
            "without_session().acquire_with_watchdog(key, 5 s)",
            "none-watchdog",
            3,
        ),
    ];
    println!(
        "{:52} {:>4} {:>9} {:>9} {:>9}",
        "holder made as", "runs", "p50 ms", "p99 ms", "max ms"
    );
    for (label, mode, n) in rows {
        let took: Vec<f64> = (0..n).map(|_| one_run(&server, &waiter, mode)).collect();
        let max = took.iter().copied().fold(0.0, f64::max);
        println!(
            "{label:52} {n:>4} {:9.1} {:9.1} {max:9.1}",
            median(&took),
            percentile(&took, 99)
        );
    }
    let mut conn = server.conn();
    let blips: Vec<(bool, Option<f64>)> = (0..runs).map(|_| one_blip(&server, &mut conn)).collect();
    let kept = blips.iter().filter(|(ok, _)| *ok).count();
    let took: Vec<f64> = blips
        .iter()
        .filter(|(ok, _)| *ok)
        .filter_map(|(_, t)| *t)
        .collect();
    let label = "CLIENT KILL of its bound connection, process alive";
    if took.is_empty() {
        println!("{label:52} {runs:>4} holds kept 0/{runs}");
    } else {
        let max = took.iter().copied().fold(0.0, f64::max);
        println!(
            "{label:52} {runs:>4} holds kept {kept}/{runs}; re-attached p50 {:.1} ms, p99 {:.1} ms, max {max:.1} ms",
            median(&took),
            percentile(&took, 99)
        );
    }
}
