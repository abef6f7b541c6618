//! Redis Cluster: six `redis-server` processes (3 masters, 3 replicas), the module loaded on
//! every node, created with `redis-cli --cluster create ... --cluster-replicas 1`.
//!
//! - Locks on keys of every master are acquired, waited for, handed off and released on the
//!   owning master, and each master's replica answers `LOCK.FENCE`/`LOCK.INFO` as it does.
//! - A lock command sent to the wrong node gets the same `MOVED` (or `ASK`) as `SET`/`GET` on the
//!   same key; transactions and scripts over keys of two slots get the same `CROSSSLOT` as
//!   built-in commands (`LOCK.MACQUIRE`/`LOCK.MRELEASE` over two slots: the same as `MSET`).
//! - Waiters whose key's slot is migrated away get an error or a redirect instead of hanging,
//!   and the migrated lock keeps exactly one owner, on exactly one node.
//! - `throughput_one_master_vs_three` (ignored: a measurement, not a check) prints the aggregate
//!   acquire/release rate with every client on one master, then spread over three.
//!
//! Each test starts its own cluster; one at a time, to keep the machine light. No client-side
//! cluster support: the tests route by `CLUSTER KEYSLOT` and the topology read from
//! `CLUSTER NODES`, and look at the redirect errors themselves.
//!
//! - `manual_failover_while_handoffs_are_due_keeps_every_node_up`: a manual `CLUSTER FAILOVER`
//!   whose write pause outlasts the holds' deadlines (issue 17).
//!
//! Layout: `topology.rs` (starting the cluster, reading `CLUSTER NODES`), `manual_failover.rs`,
//! `masters_and_replicas.rs`, `redirects.rs`, `slot_migration.rs`, `throughput.rs`; the
//! helpers they share are below. (`start.sh` beside them is `make cluster`, not a test.)

#[path = "../common/mod.rs"]
mod common;
#[path = "../nodes/mod.rs"]
mod nodes;

mod atomic_migration;
mod failover_feed;
mod feed;
mod grace;
mod manual_failover;
mod masters_and_replicas;
mod redirects;
mod session_cap;
mod sessions;
mod slot_migration;
mod throughput;
mod topology;

use topology::*;

use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Barrier, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use common::{acquire, fence, fence_check, must_acquire, release};
use nodes::Node;
use redis::{Connection, RedisError, RedisResult, Value};

const MASTERS: usize = 3;
const NODES: usize = 6;

/// A ttl long enough that no hold expires during a test.
const LONG_TTL: i64 = 100_000;

/// How long the cluster may take to reach an observable state (convergence, a replica link,
/// a blocked client). A healthy run never comes near it.
const PATIENCE: Duration = Duration::from_secs(30);

/// How long a waiter whose slot moved away may take to be answered.
const PROMPT: Duration = Duration::from_secs(5);

/// Six servers per test is plenty for a 2-core machine: the tests take turns.
static ONE_CLUSTER_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    ONE_CLUSTER_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

// --- Helpers ----------------------------------------------------------------------

/// `CLUSTER KEYSLOT key`.
fn keyslot(conn: &mut Connection, key: &str) -> u16 {
    redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query(conn)
        .expect("CLUSTER KEYSLOT")
}

/// Run a command given as words and return the raw reply.
fn run(conn: &mut Connection, words: &[&str]) -> RedisResult<Value> {
    let mut cmd = redis::cmd(words[0]);
    for w in &words[1..] {
        cmd.arg(*w);
    }
    cmd.query(conn)
}

/// An error reply as the server sent it (`MOVED 3999 127.0.0.1:7001`); panics on a non-error.
#[track_caller]
fn error_text(what: &str, reply: RedisResult<Value>) -> String {
    match reply {
        Err(e) => match (e.code(), e.detail()) {
            (Some(code), Some(detail)) => format!("{code} {detail}"),
            (Some(code), None) => code.to_string(),
            _ => format!("{e}"),
        },
        Ok(v) => panic!("{what}: expected an error reply, got {v:?}"),
    }
}

/// Any reply, errors included, as text for comparisons and messages: `OK`, `QUEUED`, `42`,
/// `nil`, `[1, 2]`, `MOVED 3999 127.0.0.1:7001`.
fn reply_text(reply: RedisResult<Value>) -> String {
    match reply {
        Err(e) => match (e.code(), e.detail()) {
            (Some(code), Some(detail)) => format!("{code} {detail}"),
            (Some(code), None) => code.to_string(),
            _ => format!("{e}"),
        },
        Ok(v) => value_text(&v),
    }
}

fn value_text(v: &Value) -> String {
    match v {
        Value::Nil => "nil".to_string(),
        Value::Int(n) => n.to_string(),
        Value::Okay => "OK".to_string(),
        Value::SimpleString(s) => s.clone(),
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(value_text).collect();
            format!("[{}]", items.join(", "))
        }
        other => format!("{other:?}"),
    }
}

fn blocked_clients(conn: &mut Connection) -> i64 {
    nodes::info_int(conn, "clients", "blocked_clients")
}

/// Wait until the node behind `conn` has exactly `n` blocked clients.
fn wait_blocked(conn: &mut Connection, n: i64) {
    nodes::wait_for(&format!("{n} blocked clients"), PATIENCE, || {
        (blocked_clients(conn) == n).then_some(())
    });
}

/// `WAIT 1 1000`: how many replicas acknowledged every write so far.
fn wait_one_replica(conn: &mut Connection) -> i64 {
    redis::cmd("WAIT")
        .arg(1)
        .arg(1000)
        .query(conn)
        .expect("WAIT 1 1000")
}

/// `CLUSTER COUNTKEYSINSLOT slot`: the keys this node itself holds in `slot`.
fn keys_in_slot(conn: &mut Connection, slot: u16) -> i64 {
    redis::cmd("CLUSTER")
        .arg("COUNTKEYSINSLOT")
        .arg(slot)
        .query(conn)
        .expect("CLUSTER COUNTKEYSINSLOT")
}

/// `LOCK.INFO key` as (owner, token, waiters), `None` for nil.
fn lock_info(conn: &mut Connection, key: &str) -> Option<(String, i64, i64)> {
    match redis::cmd("LOCK.INFO").arg(key).query(conn) {
        Ok(Value::Nil) => None,
        Ok(Value::Array(items)) => {
            let mut owner = None;
            let (mut token, mut waiters) = (None, None);
            for pair in items.chunks(2) {
                match (&pair[0], &pair[1]) {
                    (Value::BulkString(f), Value::BulkString(v)) if f == b"owner" => {
                        owner = Some(String::from_utf8_lossy(v).into_owned())
                    }
                    (Value::BulkString(f), Value::Int(n)) if f == b"token" => token = Some(*n),
                    (Value::BulkString(f), Value::Int(n)) if f == b"waiters" => waiters = Some(*n),
                    _ => {}
                }
            }
            match (owner, token, waiters) {
                (Some(o), Some(t), Some(w)) => Some((o, t, w)),
                _ => panic!("LOCK.INFO {key}: incomplete reply {items:?}"),
            }
        }
        other => panic!("LOCK.INFO {key}: expected an array or nil, got {other:?}"),
    }
}

/// A blocked `LOCK.ACQUIRE key owner ttl BLOCK block_ms` on its own thread and connection to
/// `port`. The receiver gets the reply and when it came. With `follow_moved`, a `MOVED` reply
/// is followed (once per hop, up to 3 hops) the way a cluster client would.
fn spawn_waiter(
    port: u16,
    key: &str,
    owner: &str,
    block_ms: i64,
    follow_moved: bool,
) -> Receiver<(RedisResult<Value>, Instant)> {
    let (tx, rx) = mpsc::channel();
    let (key, owner) = (key.to_string(), owner.to_string());
    thread::spawn(move || {
        let mut port = port;
        let mut reply;
        let mut hops = 0;
        loop {
            let mut conn = nodes::connect(port);
            conn.set_read_timeout(Some(Duration::from_millis(block_ms as u64) + PATIENCE))
                .expect("set_read_timeout");
            reply = redis::cmd("LOCK.ACQUIRE")
                .arg(&key)
                .arg(&owner)
                .arg(LONG_TTL)
                .arg("BLOCK")
                .arg(block_ms)
                .query(&mut conn);
            match &reply {
                Err(e) if follow_moved && e.code() == Some("MOVED") && hops < 3 => {
                    hops += 1;
                    port = redirect_port(e).expect("MOVED without an address");
                }
                _ => break,
            }
        }
        let _ = tx.send((reply, Instant::now()));
    });
    rx
}

/// The port of the node a `MOVED <slot> <host>:<port>` (or `ASK`) error names.
fn redirect_port(e: &RedisError) -> Option<u16> {
    let (_slot, addr) = e.detail()?.split_once(' ')?;
    addr.rsplit_once(':')?.1.parse().ok()
}

/// Send `words` to `port`, following `MOVED` like a cluster client (up to 3 hops).
fn run_routed(port: u16, words: &[&str]) -> RedisResult<Value> {
    let mut port = port;
    for _ in 0..3 {
        let reply = run(&mut nodes::connect(port), words);
        match reply {
            Err(ref e) if e.code() == Some("MOVED") => {
                port = redirect_port(e).expect("MOVED without an address")
            }
            _ => return reply,
        }
    }
    panic!("{words:?}: more than 3 MOVED hops");
}
