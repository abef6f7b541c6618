//! `LOCK.ACQUIRE ... BLOCK timeout-ms` against a real server: the FIFO waiter
//! queue, handoff on release / deadline / deletion, no barging, timeouts, waiters
//! that leave (disconnect, `CLIENT KILL`, `CLIENT UNBLOCK`), the waiter cap,
//! contexts that must not block (MULTI, Lua), replication of handoffs, demotion,
//! and keys renamed or overwritten under their waiters.
//!
//! Every blocked call runs on its own thread with its own connection. A waiter
//! is started only once the previous ones are known to be blocked (`INFO
//! clients` `blocked_clients`), so the arrival order is known. Nothing sleeps
//! to wait for the server; the one fixed wait is a lock ttl the test itself set.
//!
//! Layout: `queue_order.rs`, `timeouts.rs`, `leaving_waiters.rs`, `handoff_without_release.rs`,
//! `multi_and_lua.rs`, `waiter_cap.rs`, `arguments.rs`, `replication.rs`; the helpers they
//! share are below.

#[path = "../common/mod.rs"]
mod common;

mod arguments;
mod handoff_without_release;
mod leaving_waiters;
mod multi_and_lua;
mod queue_order;
mod replication;
mod timeouts;
mod waiter_cap;

use std::io::Write;
use std::net::TcpStream;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use common::*;
use redis::{Connection, RedisResult, Value};

/// A ttl long enough that no hold in these tests expires by accident.
const LONG_TTL: i64 = 100_000;

/// The ttl waiters ask for: long enough to outlive the test, short enough that
/// `PTTL` right after a grant shows the ttl was counted from the grant.
const WAITER_TTL: i64 = 10_000;

/// How close to `WAITER_TTL` a fresh grant's `PTTL` must be.
const PTTL_SLACK: i64 = 200;

fn new_key() -> String {
    unique_key("blocking")
}

/// A server, a connection to it, and a new key held by `holder` for `LONG_TTL`, with its token.
fn held_key() -> (Server, Connection, String, i64) {
    let (server, mut c) = start();
    let key = new_key();
    let token = must_acquire(&mut c, &key, "holder", LONG_TTL);
    (server, c, key, token)
}

// --- Helpers -----------------------------------------------------------------

/// `CLIENT ID` of `conn`.
fn client_id(conn: &mut Connection) -> i64 {
    redis::cmd("CLIENT")
        .arg("ID")
        .query(conn)
        .expect("CLIENT ID")
}

/// The arguments of `LOCK.ACQUIRE key owner ttl BLOCK timeout`.
fn block_args(key: &str, owner: &str, ttl: i64, timeout: &str) -> Vec<String> {
    vec![
        key.to_string(),
        owner.to_string(),
        ttl.to_string(),
        "BLOCK".to_string(),
        timeout.to_string(),
    ]
}

/// A client blocked in `LOCK.ACQUIRE ... BLOCK` on its own thread.
struct Waiter {
    owner: String,
    /// Its `CLIENT ID`, taken before it blocked.
    id: i64,
    /// The reply, and when it arrived.
    handle: JoinHandle<(RedisResult<Value>, Instant)>,
}

impl Waiter {
    /// Send `LOCK.ACQUIRE key owner ttl BLOCK timeout` on a new connection and
    /// return once the server counts one more blocked client than before.
    fn start(
        server: &Server,
        ctl: &mut Connection,
        key: &str,
        owner: &str,
        ttl: i64,
        timeout: &str,
    ) -> Waiter {
        let before = blocked_clients(ctl);
        let mut conn = server.conn();
        let id = client_id(&mut conn);
        let args = block_args(key, owner, ttl, timeout);
        let handle = thread::spawn(move || {
            let reply = call(&mut conn, "LOCK.ACQUIRE", &args);
            (reply, Instant::now())
        });
        wait_blocked(ctl, before + 1);
        Waiter {
            owner: owner.to_string(),
            id,
            handle,
        }
    }

    /// Wait for the reply (the connection's read timeout bounds the wait).
    fn reply(self) -> (RedisResult<Value>, Instant) {
        self.handle.join().expect("waiter thread panicked")
    }

    /// Wait for the reply, which must be a token; return it and when it arrived.
    #[track_caller]
    fn granted(self) -> (i64, Instant) {
        let owner = self.owner.clone();
        match self.reply() {
            (Ok(Value::Int(token)), at) => (token, at),
            (other, _) => panic!("waiter {owner}: expected a token, got {other:?}"),
        }
    }

    /// Wait for the reply, which must be a token.
    #[track_caller]
    fn token(self) -> i64 {
        self.granted().0
    }
}

/// Release `key` as `holder` and check that `waiter` is handed it: a token above `previous`
/// and a ttl counted from the handoff. Returns the waiter's token.
#[track_caller]
fn release_to(c: &mut Connection, key: &str, holder: &str, waiter: Waiter, previous: i64) -> i64 {
    assert_eq!(release(c, key, holder), 1);
    let token = waiter.token();
    assert!(token > previous, "handoff token {token} <= {previous}");
    assert_fresh_grant(c, key, token);
    token
}

/// Release `key` as `owner`, its last holder with no one queued: the key is gone.
#[track_caller]
fn release_last(c: &mut Connection, key: &str, owner: &str) {
    assert_eq!(release(c, key, owner), 1);
    assert_absent(c, key);
}

/// A waiter on a bare socket, so the test can close the connection while the
/// command is blocked: write `LOCK.ACQUIRE ... BLOCK` and return once blocked.
fn raw_waiter(
    server: &Server,
    ctl: &mut Connection,
    key: &str,
    owner: &str,
    timeout: &str,
) -> TcpStream {
    let before = blocked_clients(ctl);
    let mut stream = TcpStream::connect(("127.0.0.1", server.port())).expect("connect");
    let mut cmd = redis::cmd("LOCK.ACQUIRE");
    for arg in block_args(key, owner, WAITER_TTL, timeout) {
        cmd.arg(arg);
    }
    stream
        .write_all(&cmd.get_packed_command())
        .expect("write LOCK.ACQUIRE");
    wait_blocked(ctl, before + 1);
    stream
}

/// Assert a fresh hold of `key` with `token` whose ttl (`WAITER_TTL`) started
/// at the grant, not when the waiter queued.
#[track_caller]
fn assert_fresh_grant(c: &mut Connection, key: &str, token: i64) {
    assert_eq!(
        fence(c, key),
        Some(token),
        "LOCK.FENCE {key} after the grant"
    );
    let left = pttl(c, key);
    assert!(
        left > WAITER_TTL - PTTL_SLACK && left <= WAITER_TTL,
        "PTTL {key} = {left} right after the grant, expected in {}..={WAITER_TTL}",
        WAITER_TTL - PTTL_SLACK + 1
    );
}

fn ok(reply: RedisResult<Value>, what: &str) {
    match reply {
        Ok(Value::Okay) => {}
        other => panic!("{what}: expected OK, got {other:?}"),
    }
}
