//! Sessions against a real server: `LOCK.SESSION OPEN/KEEPALIVE/CLOSE/ATTACH/INFO`, holds taken
//! `SESSION id`, `BOUND` sessions ended by their connection closing (a holder process killed
//! with SIGKILL, `CLIENT KILL`, idle `timeout`), `LOCKDELAY`, persistence and replication,
//! client pauses, and every refusal.
//!
//! Layout: `commands.rs` (replies and refusals), `ending.rs` (how a session ends and who is
//! served), `grace.rs` (`BOUND GRACE`: detached, re-attached, or ended after the grace), `holds_cap.rs` (`lock.max-session-holds`), `lock_delay.rs`, `durability.rs` (restart, reload, rewrite, replica, promotion),
//! `pause.rs`; the helpers they share are below.

#[path = "../common/mod.rs"]
mod common;

mod admin;
mod commands;
mod durability;
mod ending;
mod grace;
mod holds_cap;
mod lock_delay;
mod pause;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use common::*;
use redis::{Connection, RedisResult, Value};

fn new_key() -> String {
    unique_key("session")
}

/// `LOCK.SESSION OPEN ttl [options...]` -> the id.
#[track_caller]
fn open(c: &mut Connection, ttl: i64, options: &[&str]) -> String {
    let mut args = vec!["OPEN".to_string(), ttl.to_string()];
    args.extend(options.iter().map(|o| o.to_string()));
    match call(c, "LOCK.SESSION", &args) {
        Ok(Value::BulkString(id)) => String::from_utf8(id).expect("ascii id"),
        other => panic!("LOCK.SESSION OPEN: expected a bulk string, got {other:?}"),
    }
}

/// `LOCK.SESSION sub args...`, raw.
fn session(c: &mut Connection, sub: &str, args: &[&str]) -> RedisResult<Value> {
    let mut all = vec![sub];
    all.extend_from_slice(args);
    call(c, "LOCK.SESSION", &all)
}

/// `LOCK.SESSION KEEPALIVE id` -> remaining ms, or `None` for nil.
#[track_caller]
fn keepalive(c: &mut Connection, id: &str) -> Option<i64> {
    match session(c, "KEEPALIVE", &[id]) {
        Ok(Value::Int(ms)) => Some(ms),
        Ok(Value::Nil) => None,
        other => panic!("KEEPALIVE: expected an integer or nil, got {other:?}"),
    }
}

/// `LOCK.SESSION INFO id` as (field, value) pairs, or `None` for nil.
#[track_caller]
fn session_info(c: &mut Connection, id: &str) -> Option<Vec<(String, Value)>> {
    match session(c, "INFO", &[id]) {
        Ok(Value::Nil) => None,
        Ok(Value::Array(items)) => Some(
            items
                .chunks(2)
                .map(|kv| match &kv[0] {
                    Value::BulkString(k) => (String::from_utf8_lossy(k).into(), kv[1].clone()),
                    other => panic!("INFO field name {other:?}"),
                })
                .collect(),
        ),
        Ok(Value::Map(items)) => Some(
            items
                .into_iter()
                .map(|(k, v)| match k {
                    Value::BulkString(k) => (String::from_utf8_lossy(&k).into(), v),
                    other => panic!("INFO field name {other:?}"),
                })
                .collect(),
        ),
        other => panic!("LOCK.SESSION INFO: unexpected {other:?}"),
    }
}

/// One field of `LOCK.SESSION INFO` (panics if the session is gone).
#[track_caller]
fn info_of(c: &mut Connection, id: &str, field: &str) -> Value {
    session_info(c, id)
        .unwrap_or_else(|| panic!("session {id} is gone"))
        .into_iter()
        .find(|(k, _)| k == field)
        .unwrap_or_else(|| panic!("no field {field}"))
        .1
}

/// `LOCK.ACQUIRE key owner ttl [extra...]` raw.
fn acquire_with(
    c: &mut Connection,
    key: &str,
    owner: &str,
    ttl: i64,
    extra: &[&str],
) -> RedisResult<Value> {
    let mut args = vec![key.to_string(), owner.to_string(), ttl.to_string()];
    args.extend(extra.iter().map(|e| e.to_string()));
    call(c, "LOCK.ACQUIRE", &args)
}

/// `LOCK.ACQUIRE key owner ttl SESSION id [extra...]` that must grant.
#[track_caller]
fn acquire_in(
    c: &mut Connection,
    key: &str,
    owner: &str,
    ttl: i64,
    id: &str,
    extra: &[&str],
) -> i64 {
    let mut all = vec!["SESSION", id];
    all.extend_from_slice(extra);
    match acquire_with(c, key, owner, ttl, &all) {
        Ok(Value::Int(token)) if token > 0 => token,
        other => panic!("LOCK.ACQUIRE {key} SESSION: expected a token, got {other:?}"),
    }
}

/// A field of `LOCK.INFO key` (RESP2 flat pairs), or `None` when the reply is nil.
fn lock_info_field(c: &mut Connection, key: &str, field: &str) -> Option<Value> {
    match call(c, "LOCK.INFO", &[key]).expect("LOCK.INFO") {
        Value::Nil => None,
        Value::Array(items) => items.chunks(2).find_map(|kv| match &kv[0] {
            Value::BulkString(k) if k == field.as_bytes() => Some(kv[1].clone()),
            _ => None,
        }),
        other => panic!("LOCK.INFO: unexpected {other:?}"),
    }
}

fn client_id(c: &mut Connection) -> i64 {
    redis::cmd("CLIENT").arg("ID").query(c).expect("CLIENT ID")
}

/// A client blocked in `LOCK.ACQUIRE`/`LOCK.MACQUIRE ... BLOCK` on its own thread.
struct Waiter {
    handle: JoinHandle<(RedisResult<Value>, Instant)>,
}

impl Waiter {
    /// Send `command args...` on a new connection and return once the server counts one
    /// more blocked client than before.
    fn start(server: &Server, ctl: &mut Connection, command: &str, args: &[&str]) -> Waiter {
        let before = blocked_clients(ctl);
        let mut conn = server.conn();
        let (command, args): (String, Vec<String>) =
            (command.into(), args.iter().map(|a| a.to_string()).collect());
        let handle = thread::spawn(move || {
            let reply = call(&mut conn, &command, &args);
            (reply, Instant::now())
        });
        wait_blocked(ctl, before + 1);
        Waiter { handle }
    }

    fn reply(self) -> (RedisResult<Value>, Instant) {
        self.handle.join().expect("waiter thread panicked")
    }

    /// The reply, which must be a token, and when it came.
    #[track_caller]
    fn granted(self) -> (i64, Instant) {
        match self.reply() {
            (Ok(Value::Int(token)), at) => (token, at),
            (other, _) => panic!("expected a token, got {other:?}"),
        }
    }
}

/// A holder in a process of its own: `redis-cli` reading commands from a pipe, so that the
/// test can kill it with SIGKILL as a crash would, and the server sees its connection close.
struct HolderProcess {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl HolderProcess {
    fn start(server: &Server) -> HolderProcess {
        let mut child = Command::new(cli_bin())
            .args(["-p", &server.port().to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start redis-cli");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        HolderProcess {
            child,
            stdin,
            stdout,
        }
    }

    /// Send one command line and read its one-line reply (`redis-cli` without a terminal
    /// prints bare values).
    fn send(&mut self, line: &str) -> String {
        writeln!(self.stdin, "{line}").expect("write to redis-cli");
        self.stdin.flush().expect("flush");
        let mut reply = String::new();
        self.stdout
            .read_line(&mut reply)
            .expect("read from redis-cli");
        reply.trim_end().to_string()
    }

    fn kill9(mut self) {
        self.child.kill().expect("SIGKILL redis-cli");
        self.child.wait().expect("reap redis-cli");
    }
}

impl Drop for HolderProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
