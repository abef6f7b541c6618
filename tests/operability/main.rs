//! What an operator sees of the module, against a real server: `LOCK.INFO`, the `INFO lock`
//! section, the `lock.*` configs, `COMMAND DOCS` / `COMMAND INFO` metadata, keyspace events of
//! class `d`, and ACL key permissions.
//!
//! Each test has its own server, so the `INFO lock` counters start at zero and every value is
//! asserted exactly after each step. Blocked calls run on their own thread (or a bare socket
//! whose reply is never read) and a waiter is started only once the previous ones are counted in
//! `INFO clients` `blocked_clients`. Nothing sleeps to wait for the server: tests poll
//! observable state or wait for a reply; the only fixed ttls are ones the test set itself.
//!
//! Layout: `lock_info.rs`, `info_section.rs` (`INFO lock`), `configs.rs`, `command_metadata.rs`,
//! `keyspace_events.rs`, `acl.rs`; the helpers they share are below.

#[path = "../common/mod.rs"]
mod common;

mod acl;
mod command_metadata;
mod configs;
mod info_section;
mod keyspace_events;
mod lock_info;
mod waiters;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::TcpStream;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use common::*;
use redis::{Connection, RedisResult, Value};

/// A ttl long enough that no hold in these tests expires by accident.
const LONG_TTL: i64 = 100_000;

/// The ttl waiters ask for: far longer than the test needs them to hold.
const WAITER_TTL: i64 = 10_000;

/// How long to wait for the server to reach an observable state. Generous, so a slow (shared,
/// two-core) machine does not fail the tests; a healthy run never comes near it.
const PATIENCE: Duration = Duration::from_secs(10);

/// The `WRONGTYPE` reply, as the server words it.
const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

// --- Helpers -----------------------------------------------------------------

/// The packed `LOCK.ACQUIRE key owner ttl BLOCK timeout`.
fn block_cmd(key: &str, owner: &str, ttl: i64, timeout: i64) -> redis::Cmd {
    let mut cmd = redis::cmd("LOCK.ACQUIRE");
    cmd.arg(key).arg(owner).arg(ttl).arg("BLOCK").arg(timeout);
    cmd
}

/// Run `LOCK.ACQUIRE key owner ttl BLOCK timeout` on a new connection on its own thread and
/// return once the server counts one more blocked client. The handle yields the reply.
fn start_waiter(
    server: &Server,
    ctl: &mut Connection,
    key: &str,
    owner: &str,
    ttl: i64,
    timeout: i64,
) -> JoinHandle<RedisResult<Value>> {
    let before = blocked_clients(ctl);
    let mut conn = server.conn();
    let cmd = block_cmd(key, owner, ttl, timeout);
    let handle = thread::spawn(move || cmd.query(&mut conn));
    wait_blocked(ctl, before + 1);
    handle
}

/// A waiter on a bare socket whose reply the test never reads: write the blocking
/// `LOCK.ACQUIRE` and return once the server counts it as blocked. No thread is left behind.
fn raw_waiter(server: &Server, ctl: &mut Connection, key: &str, owner: &str) -> TcpStream {
    let before = blocked_clients(ctl);
    let mut stream = TcpStream::connect(("127.0.0.1", server.port())).expect("connect");
    stream
        .write_all(&block_cmd(key, owner, 1_000, 0).get_packed_command())
        .expect("write LOCK.ACQUIRE");
    wait_blocked(ctl, before + 1);
    stream
}

/// Join a waiter whose reply must be a token.
#[track_caller]
fn granted(waiter: JoinHandle<RedisResult<Value>>) -> i64 {
    match waiter.join().expect("waiter thread panicked") {
        Ok(Value::Int(token)) => token,
        other => panic!("waiter: expected a token, got {other:?}"),
    }
}

/// `LOCK.INFO key`, raw reply.
fn lock_info(conn: &mut Connection, key: &str) -> RedisResult<Value> {
    redis::cmd("LOCK.INFO").arg(key).query(conn)
}

fn bulk(s: impl AsRef<[u8]>) -> Value {
    Value::BulkString(s.as_ref().to_vec())
}
