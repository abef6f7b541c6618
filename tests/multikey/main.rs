//! `LOCK.MACQUIRE` and `LOCK.MRELEASE` against a real server: all keys or none, the
//! idempotent retry on a partly held set, no barging past queued waiters, the errors (which
//! change nothing), key specs (`COMMAND GETKEYS`), replication and the AOF (one MULTI/EXEC per
//! set, so a replica never sees part of one), and, with `BLOCK`, the multi-key queue.
//!
//! Every blocked call runs on its own thread with its own connection, started only once the
//! previous ones are known to be blocked (`INFO clients` `blocked_clients`), so the arrival
//! order is known. Nothing sleeps to wait for the server.
//!
//! Layout: `all_or_none.rs`, `errors.rs`, `key_specs_and_acl.rs`, `replication_and_aof.rs`,
//! `overtaking.rs` (the bounded overtaking of `BLOCK` sets),
//! `blocking_sets.rs` (`BLOCK`); the helpers they share are below.

#[path = "../common/mod.rs"]
mod common;

mod all_or_none;
mod blocking_sets;
mod errors;
mod key_specs_and_acl;
mod overtaking;
mod replication_and_aof;

use std::thread::{self, JoinHandle};

use common::*;
use redis::{Connection, RedisResult, Value};

const LONG_TTL: i64 = 100_000;

fn keys(n: usize) -> Vec<String> {
    // One hash tag: the same slot, as a cluster requires (and harmless elsewhere).
    let tag = unique_key("multikey");
    (0..n).map(|i| format!("{{{tag}}}:{i}")).collect()
}

fn macquire_args(keys: &[String], owner: &str, ttl: i64, extra: &[&str]) -> Vec<String> {
    let mut args = vec![keys.len().to_string()];
    args.extend(keys.iter().cloned());
    args.push(owner.into());
    args.push(ttl.to_string());
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// The reply of `LOCK.MACQUIRE`: `Some(tokens)` or `None` for nil; panics on anything else.
#[track_caller]
fn tokens(reply: RedisResult<Value>) -> Option<Vec<i64>> {
    match reply {
        Ok(Value::Nil) => None,
        Ok(Value::Array(items)) => Some(
            items
                .into_iter()
                .map(|v| match v {
                    Value::Int(t) => t,
                    other => panic!("LOCK.MACQUIRE: a token must be an integer, got {other:?}"),
                })
                .collect(),
        ),
        other => panic!("LOCK.MACQUIRE: expected an array or nil, got {other:?}"),
    }
}

/// `LOCK.MACQUIRE n keys... owner ttl` -> tokens or `None`.
fn macquire(c: &mut Connection, keys: &[String], owner: &str, ttl: i64) -> Option<Vec<i64>> {
    tokens(call(
        c,
        "LOCK.MACQUIRE",
        &macquire_args(keys, owner, ttl, &[]),
    ))
}

/// `LOCK.MRELEASE n keys... owner` -> how many were released.
fn mrelease(c: &mut Connection, keys: &[String], owner: &str) -> i64 {
    let mut args = vec![keys.len().to_string()];
    args.extend(keys.iter().cloned());
    args.push(owner.into());
    match call(c, "LOCK.MRELEASE", &args) {
        Ok(Value::Int(n)) => n,
        other => panic!("LOCK.MRELEASE: expected an integer, got {other:?}"),
    }
}

#[track_caller]
fn assert_all_absent(c: &mut Connection, keys: &[String]) {
    for key in keys {
        assert_absent(c, key);
    }
}

/// A client blocked in `LOCK.MACQUIRE ... BLOCK` or `LOCK.ACQUIRE ... BLOCK` on its own thread.
struct Blocked {
    name: String,
    /// Its `CLIENT ID`, taken before it blocked.
    id: i64,
    handle: JoinHandle<RedisResult<Value>>,
}

impl Blocked {
    /// Send `command args...` on a new connection; return once one more client is blocked.
    fn start(server: &Server, ctl: &mut Connection, command: &str, args: Vec<String>) -> Blocked {
        let before = blocked_clients(ctl);
        let mut conn = server.conn();
        let id: i64 = redis::cmd("CLIENT").arg("ID").query(&mut conn).unwrap();
        let name = format!("{command} {}", args.join(" "));
        let command = command.to_string();
        let handle = thread::spawn(move || call(&mut conn, &command, &args));
        wait_blocked(ctl, before + 1);
        Blocked { name, id, handle }
    }

    /// `LOCK.MACQUIRE n keys... owner ttl BLOCK timeout`, blocked.
    fn set(server: &Server, ctl: &mut Connection, keys: &[String], owner: &str, t: &str) -> Self {
        let args = macquire_args(keys, owner, WAITER_TTL, &["BLOCK", t]);
        Blocked::start(server, ctl, "LOCK.MACQUIRE", args)
    }

    /// `LOCK.ACQUIRE key owner ttl BLOCK 0`, blocked.
    fn one(server: &Server, ctl: &mut Connection, key: &str, owner: &str) -> Self {
        let args = [key, owner, &WAITER_TTL.to_string(), "BLOCK", "0"].map(String::from);
        Blocked::start(server, ctl, "LOCK.ACQUIRE", args.to_vec())
    }

    fn reply(self) -> RedisResult<Value> {
        self.handle.join().expect("waiter thread panicked")
    }

    /// The reply, which must be an array of tokens.
    #[track_caller]
    fn tokens(self) -> Vec<i64> {
        let name = self.name.clone();
        tokens(self.reply()).unwrap_or_else(|| panic!("{name}: nil, expected tokens"))
    }

    /// The reply, which must be one token.
    #[track_caller]
    fn token(self) -> i64 {
        let name = self.name.clone();
        match self.reply() {
            Ok(Value::Int(t)) => t,
            other => panic!("{name}: expected a token, got {other:?}"),
        }
    }
}

/// The ttl blocked waiters ask for.
const WAITER_TTL: i64 = 10_000;

/// `INFO lock` `field` as a number.
fn lock_info_field(c: &mut Connection, field: &str) -> i64 {
    info_field(c, "lock", &format!("lock_{field}"))
        .unwrap_or_else(|| panic!("INFO lock has no {field}"))
        .parse()
        .unwrap()
}

/// The replication stream and the AOF are fed the same propagation: one MULTI/EXEC per set.
fn aof_incr(server: &Server) -> String {
    let dir = server.dir().join("appendonlydir");
    let manifest = std::fs::read_to_string(dir.join("appendonly.aof.manifest")).unwrap();
    let name = manifest
        .lines()
        // `file <name> seq <n> type i`; Redis 8 appends more fields (offsets) after the type.
        .find(|line| {
            line.split_whitespace()
                .collect::<Vec<_>>()
                .windows(2)
                .any(|w| w == ["type", "i"])
        })
        .and_then(|line| line.split_whitespace().nth(1))
        .expect("an incremental AOF file")
        .to_string();
    String::from_utf8_lossy(&std::fs::read(dir.join(name)).unwrap()).replace("\r\n", " ")
}

/// The commands of a RESP stream, as words (bulk strings only).
fn aof_commands(text: &str) -> Vec<Vec<String>> {
    let mut commands = vec![];
    let mut words = text.split(' ').filter(|w| !w.is_empty()).peekable();
    while let Some(w) = words.next() {
        if let Some(n) = w.strip_prefix('*') {
            let n: usize = n.parse().unwrap();
            let mut command = vec![];
            for _ in 0..n {
                words.next(); // $len
                command.push(words.next().unwrap_or_default().to_string());
            }
            commands.push(command);
        }
    }
    commands
}
