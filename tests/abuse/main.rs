//! Abuse against a live server: every bad input each command can get, random command
//! sequences mixed with the keyspace commands that pull locks out from under the module,
//! thousands of blocked waiters on one key, and many locks at once (with their memory cost).
//!
//! Every test starts its own server. Environment knobs (all optional):
//! - `ABUSE_SEED`: seed of the random sequence test (printed by every run; set it to replay).
//! - `ABUSE_OPS`: commands in the random sequence test (default 5000).
//! - `WAITERS`: blocked clients in the waiter test (default 2000; capped by the fd limit).
//! - `LOCK_COUNT`: locks in the many-locks test (default 100000; the torture run uses
//!   `LOCK_COUNT=1000000 cargo test --test abuse many_locks -- --nocapture`).
//!
//! The memory figures are printed; run with `--nocapture` to see them.
//!
//! Layout: `arguments.rs` (the bad-input matrix), `newer_commands.rs` (the same for SHARED/LIMIT,
//! SESSION, LOCKDELAY, LOCK.MACQUIRE/MRELEASE, LOCK.SESSION, LOCK.WATCH/UNWATCH), `scripts.rs`
//! (every command and option from EVAL and FCALL, and as an ACL user with narrow key and channel
//! patterns), `random_sequences.rs` (and `random_newer.rs`, the same with sessions, lock-delay,
//! shared holds, sets and watches), `scale.rs` (many waiters, many locks); the helpers they
//! share are below.

#[path = "../common/mod.rs"]
mod common;

mod acl_user;
mod arguments;
mod newer_commands;
mod random_newer;
mod random_sequences;
mod scale;
mod scripts;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::{Connection, RedisResult, Value};

/// Long enough that no hold in these tests expires by accident.
const LONG_TTL: i64 = 600_000;

/// How long to wait for the server to reach a state (blocked count, expiry of many keys...).
const PATIENCE: Duration = Duration::from_secs(60);

// --- Helpers -------------------------------------------------------------------

fn used_memory(c: &mut Connection) -> i64 {
    info_int(c, "memory", "used_memory")
}

fn lock_stat(c: &mut Connection, name: &str) -> i64 {
    info_int(c, "lock", &format!("lock_{name}"))
}

fn dbsize(c: &mut Connection) -> i64 {
    redis::cmd("DBSIZE").query(c).expect("DBSIZE")
}

/// `LOCK.INFO key` as (owner, token, ttl, waiters), or `None` for nil.
fn lock_info(c: &mut Connection, key: &str) -> Option<(Vec<u8>, i64, i64, i64)> {
    let reply = redis::cmd("LOCK.INFO").arg(key).query(c);
    parse_lock_info(&reply.unwrap_or_else(|e| panic!("LOCK.INFO {key}: {e}")))
}

/// Parse a RESP2 `LOCK.INFO` reply of an exclusive lock (flat array `owner o token t ttl l
/// waiters w mode m limit l holders h queue q`) or nil. The first four fields are what this
/// suite compares; the rest describe the same hold again (checked in
/// tests/operability/lock_info.rs).
fn parse_lock_info(reply: &Value) -> Option<(Vec<u8>, i64, i64, i64)> {
    let items = match reply {
        Value::Nil => return None,
        Value::Array(items) if items.len() == 16 => items,
        other => panic!("LOCK.INFO: expected nil or 16 elements, got {other:?}"),
    };
    let name = |i: usize| match &items[i] {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        other => panic!("LOCK.INFO field name: {other:?}"),
    };
    let int = |i: usize| match items[i] {
        Value::Int(n) => n,
        ref other => panic!(
            "LOCK.INFO {}: expected an integer, got {other:?}",
            name(i - 1)
        ),
    };
    let names: Vec<String> = [0, 2, 4, 6].into_iter().map(name).collect();
    assert_eq!(
        names,
        ["owner", "token", "ttl", "waiters"],
        "LOCK.INFO fields"
    );
    let owner = match &items[1] {
        Value::BulkString(b) => b.clone(),
        other => panic!("LOCK.INFO owner: expected a bulk string, got {other:?}"),
    };
    Some((owner, int(3), int(5), int(7)))
}

/// The soft limit on open files of this process, from `/proc/self/limits`.
fn fd_soft_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

fn env_usize(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|e| panic!("{name}={v:?} is not a number: {e}")),
        Err(_) => default,
    }
}

/// The server log must show no panic, assertion or crash report.
#[track_caller]
fn assert_clean_log(server: &Server) {
    let log = server.log();
    for bad in [
        "panicked",
        "ASSERTION",
        "crashed",
        "BUG REPORT",
        "Guru Meditation",
    ] {
        assert!(
            !log.contains(bad),
            "server log contains {bad:?}:\n{}",
            log.lines()
                .filter(|l| !l.starts_with("*** Preparing"))
                .take(80)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// The server still answers and its process is the one we started.
#[track_caller]
fn assert_alive(server: &Server, pid: &str) {
    let mut c = server.conn();
    let pong: String = redis::cmd("PING").query(&mut c).expect("PING");
    assert_eq!(pong, "PONG");
    assert_eq!(
        info_field(&mut c, "server", "process_id").as_deref(),
        Some(pid),
        "a different process answers on the port"
    );
    assert!(
        std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "server process {pid} is gone"
    );
}

/// True if the server accepts a connection and answers `PING`.
fn answers_ping(server: &Server) -> bool {
    let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{}/", server.port())) else {
        return false;
    };
    let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_secs(2)) else {
        return false;
    };
    redis::cmd("PING")
        .query::<String>(&mut conn)
        .is_ok_and(|p| p == "PONG")
}

/// One line of RESP from a raw socket (without the CRLF).
fn read_resp_line(reader: &mut BufReader<TcpStream>) -> String {
    let mut line = String::new();
    reader.read_line(&mut line).expect("read reply");
    assert!(line.ends_with("\r\n"), "truncated reply {line:?}");
    line.truncate(line.len() - 2);
    line
}
