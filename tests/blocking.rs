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

mod common;

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

fn config_get(c: &mut Connection, name: &str) -> String {
    let pair: Vec<String> = redis::cmd("CONFIG").arg("GET").arg(name).query(c).unwrap();
    assert_eq!(pair.len(), 2, "CONFIG GET {name}: {pair:?}");
    assert_eq!(pair[0], name);
    pair[1].clone()
}

fn ok(reply: RedisResult<Value>, what: &str) {
    match reply {
        Ok(Value::Okay) => {}
        other => panic!("{what}: expected OK, got {other:?}"),
    }
}

// --- Queue order and handoff on release --------------------------------------

#[test]
fn waiters_are_granted_in_arrival_order_with_increasing_tokens() {
    let server = Server::start();
    let mut c = server.conn();
    let key = new_key();
    let holder_token = must_acquire(&mut c, &key, "holder", LONG_TTL);

    let owners = ["w0", "w1", "w2", "w3", "w4", "w5"];
    let mut waiters: Vec<Waiter> = owners
        .iter()
        .map(|owner| Waiter::start(&server, &mut c, &key, owner, WAITER_TTL, "0"))
        .collect();
    assert_eq!(blocked_clients(&mut c), owners.len() as i64);
    // Still held by the holder: queueing changed nothing.
    assert_eq!(fence(&mut c, &key), Some(holder_token));

    let mut previous = ("holder".to_string(), holder_token);
    for (i, waiter) in waiters.drain(..).enumerate() {
        // Releasing by the previous owner's name only works if the previous grant
        // went to that owner, so this also checks who was granted.
        assert_eq!(
            release(&mut c, &key, previous.0.as_str()),
            1,
            "release by {}",
            previous.0
        );
        let owner = waiter.owner.clone();
        let token = waiter.token();
        assert!(
            token > previous.1,
            "grant {i} to {owner}: token {token} not above the previous {}",
            previous.1
        );
        assert_fresh_grant(&mut c, &key, token);
        assert_eq!(blocked_clients(&mut c), (owners.len() - i - 1) as i64);
        // Nobody else can take it while it is held.
        assert_eq!(acquire(&mut c, &key, "intruder", 1_000), None);
        previous = (owner, token);
    }

    assert_eq!(release(&mut c, &key, previous.0.as_str()), 1);
    assert_absent(&mut c, &key);
}

#[test]
fn non_blocking_acquire_never_barges_ahead_of_waiters() {
    let server = Server::start();
    let mut c = server.conn();
    let key = new_key();
    let holder_token = must_acquire(&mut c, &key, "holder", LONG_TTL);
    let waiter = Waiter::start(&server, &mut c, &key, "waiter", WAITER_TTL, "0");

    // Release and a foreign acquire in one pipeline: no other command (nor the
    // waiter's reply) can run between them on the server.
    let replies: Vec<Value> = redis::pipe()
        .cmd("LOCK.RELEASE")
        .arg(&key)
        .arg("holder")
        .cmd("LOCK.ACQUIRE")
        .arg(&key)
        .arg("intruder")
        .arg(1_000)
        .query(&mut c)
        .expect("pipeline");
    assert_eq!(replies, vec![Value::Int(1), Value::Nil]);

    let token = waiter.token();
    assert!(
        token > holder_token,
        "token {token} not above {holder_token}"
    );
    assert_fresh_grant(&mut c, &key, token);
    assert_eq!(release(&mut c, &key, "intruder"), 0);
    assert_eq!(release(&mut c, &key, "waiter"), 1);
    assert_absent(&mut c, &key);
}

#[test]
fn holder_reacquiring_with_block_gets_its_own_token_at_once() {
    let server = Server::start();
    let mut c = server.conn();
    let key = new_key();

    // A free lock with BLOCK: granted at once (option name in any case).
    let token = match call(
        &mut c,
        "LOCK.ACQUIRE",
        &[&key, "holder", "5000", "block", "0"],
    ) {
        Ok(Value::Int(t)) => t,
        other => panic!("LOCK.ACQUIRE on a free key with BLOCK: expected a token, got {other:?}"),
    };
    assert_held(&mut c, &key, token, 5_000);

    // Someone else is queued; the holder's retry with BLOCK still answers at once
    // with the same token and resets the deadline.
    let waiter = Waiter::start(&server, &mut c, &key, "waiter", WAITER_TTL, "0");
    assert_eq!(
        call(
            &mut c,
            "LOCK.ACQUIRE",
            &[&key, "holder", &LONG_TTL.to_string(), "BLOCK", "0"]
        ),
        Ok(Value::Int(token))
    );
    let left = pttl(&mut c, &key);
    assert!(
        left > 5_000 && left <= LONG_TTL,
        "PTTL {left} after the retry with ttl {LONG_TTL}"
    );
    assert_eq!(
        blocked_clients(&mut c),
        1,
        "only the other waiter is blocked"
    );

    assert_eq!(release(&mut c, &key, "holder"), 1);
    let next = waiter.token();
    assert!(next > token);
    assert_eq!(release(&mut c, &key, "waiter"), 1);
    assert_absent(&mut c, &key);
}

// --- Timeouts ----------------------------------------------------------------

#[test]
fn timeout_replies_nil_and_leaves_the_queue() {
    let server = Server::start();
    let mut c = server.conn();
    let key = new_key();
    let holder_token = must_acquire(&mut c, &key, "holder", LONG_TTL);

    let sent = Instant::now();
    let waiter = Waiter::start(&server, &mut c, &key, "waiter", WAITER_TTL, "200");
    let (reply, at) = waiter.reply();
    assert_eq!(reply, Ok(Value::Nil));
    assert!(
        at - sent >= Duration::from_millis(200),
        "nil after {:?}, before the 200 ms timeout",
        at - sent
    );
    wait_blocked(&mut c, 0);
    assert_held(&mut c, &key, holder_token, LONG_TTL);

    // The timed-out waiter is not granted: the key is freed entirely.
    assert_eq!(release(&mut c, &key, "holder"), 1);
    assert_absent(&mut c, &key);
}

#[test]
fn block_zero_waits_without_limit() {
    let server = Server::start();
    let mut c = server.conn();
    let key = new_key();
    let holder_token = must_acquire(&mut c, &key, "holder", LONG_TTL);

    let patient = Waiter::start(&server, &mut c, &key, "patient", WAITER_TTL, "0");
    // A waiter queued later with a short timeout gives up; the BLOCK 0 one,
    // queued earlier, is still waiting after that.
    let hasty = Waiter::start(&server, &mut c, &key, "hasty", WAITER_TTL, "100");
    assert_eq!(hasty.reply().0, Ok(Value::Nil));
    wait_blocked(&mut c, 1);
    assert!(
        !patient.handle.is_finished(),
        "the BLOCK 0 waiter got a reply while the lock was held"
    );

    assert_eq!(release(&mut c, &key, "holder"), 1);
    let token = patient.token();
    assert!(token > holder_token);
    assert_fresh_grant(&mut c, &key, token);
    assert_eq!(release(&mut c, &key, "patient"), 1);
    assert_absent(&mut c, &key);
}

// --- Waiters that leave ------------------------------------------------------

#[test]
fn disconnected_waiter_is_skipped() {
    let server = Server::start();
    let mut c = server.conn();
    let key = new_key();
    let holder_token = must_acquire(&mut c, &key, "holder", LONG_TTL);

    let gone = raw_waiter(&server, &mut c, &key, "gone", "0");
    let next = Waiter::start(&server, &mut c, &key, "next", WAITER_TTL, "0");
    drop(gone);
    wait_blocked(&mut c, 1);

    assert_eq!(release(&mut c, &key, "holder"), 1);
    let token = next.token();
    assert!(token > holder_token);
    assert_fresh_grant(&mut c, &key, token);
    assert_eq!(release(&mut c, &key, "gone"), 0);

    // The disconnected waiter is not queued any more either: the key is freed.
    assert_eq!(release(&mut c, &key, "next"), 1);
    assert_absent(&mut c, &key);
}

#[test]
fn disconnected_only_waiter_leaves_the_key_free_after_release() {
    let server = Server::start();
    let mut c = server.conn();
    let key = new_key();
    must_acquire(&mut c, &key, "holder", LONG_TTL);

    let gone = raw_waiter(&server, &mut c, &key, "gone", "0");
    drop(gone);
    wait_blocked(&mut c, 0);

    assert_eq!(release(&mut c, &key, "holder"), 1);
    assert_absent(&mut c, &key);
}

#[test]
fn client_killed_waiter_is_skipped() {
    let server = Server::start();
    let mut c = server.conn();
    let key = new_key();
    let holder_token = must_acquire(&mut c, &key, "holder", LONG_TTL);

    let killed = Waiter::start(&server, &mut c, &key, "killed", WAITER_TTL, "0");
    let next = Waiter::start(&server, &mut c, &key, "next", WAITER_TTL, "0");
    assert_eq!(
        call(&mut c, "CLIENT", &["KILL", "ID", &killed.id.to_string()]),
        Ok(Value::Int(1))
    );
    match killed.reply().0 {
        Err(e) if e.is_io_error() || e.is_connection_dropped() => {}
        other => panic!("killed waiter: expected its connection closed, got {other:?}"),
    }
    wait_blocked(&mut c, 1);

    assert_eq!(release(&mut c, &key, "holder"), 1);
    let token = next.token();
    assert!(token > holder_token);
    assert_fresh_grant(&mut c, &key, token);
    assert_eq!(release(&mut c, &key, "killed"), 0);
    assert_eq!(release(&mut c, &key, "next"), 1);
    assert_absent(&mut c, &key);
}

#[test]
fn client_unblock_gives_nil_or_error_and_leaves_the_queue() {
    let server = Server::start();
    let mut c = server.conn();
    let key = new_key();
    let holder_token = must_acquire(&mut c, &key, "holder", LONG_TTL);

    let plain = Waiter::start(&server, &mut c, &key, "plain", WAITER_TTL, "0");
    let timeout = Waiter::start(&server, &mut c, &key, "timeout", WAITER_TTL, "0");
    let error = Waiter::start(&server, &mut c, &key, "error", WAITER_TTL, "0");
    let last = Waiter::start(&server, &mut c, &key, "last", WAITER_TTL, "0");

    let id = plain.id.to_string();
    assert_eq!(call(&mut c, "CLIENT", &["UNBLOCK", &id]), Ok(Value::Int(1)));
    assert_eq!(plain.reply().0, Ok(Value::Nil), "CLIENT UNBLOCK {id}");
    wait_blocked(&mut c, 3);

    let id = timeout.id.to_string();
    assert_eq!(
        call(&mut c, "CLIENT", &["UNBLOCK", &id, "TIMEOUT"]),
        Ok(Value::Int(1))
    );
    assert_eq!(
        timeout.reply().0,
        Ok(Value::Nil),
        "CLIENT UNBLOCK {id} TIMEOUT"
    );
    wait_blocked(&mut c, 2);

    let id = error.id.to_string();
    assert_eq!(
        call(&mut c, "CLIENT", &["UNBLOCK", &id, "ERROR"]),
        Ok(Value::Int(1))
    );
    assert_err_code(error.reply().0, "UNBLOCKED");
    wait_blocked(&mut c, 1);
    assert_held(&mut c, &key, holder_token, LONG_TTL);

    // None of the unblocked clients is still queued: the last one gets the lock,
    // and after it nobody.
    assert_eq!(release(&mut c, &key, "holder"), 1);
    let token = last.token();
    assert!(token > holder_token);
    assert_fresh_grant(&mut c, &key, token);
    assert_eq!(release(&mut c, &key, "last"), 1);
    assert_absent(&mut c, &key);
}

// --- Handoff without a release -----------------------------------------------

#[test]
fn waiter_gets_the_lock_when_the_holder_deadline_passes() {
    let server = Server::start();
    let mut c = server.conn();
    // The handoff must come from the module's own deadline, not Redis deleting
    // the expired key.
    ok(
        call(&mut c, "DEBUG", &["SET-ACTIVE-EXPIRE", "0"]),
        "DEBUG SET-ACTIVE-EXPIRE 0",
    );
    let key = new_key();
    const HOLDER_TTL: i64 = 400;

    let sent = Instant::now();
    let holder_token = must_acquire(&mut c, &key, "holder", HOLDER_TTL);
    let waiter = Waiter::start(&server, &mut c, &key, "waiter", WAITER_TTL, "0");

    let (token, at) = waiter.granted();
    assert!(
        at - sent >= Duration::from_millis(HOLDER_TTL as u64),
        "granted {:?} after the holder's acquire, before its {HOLDER_TTL} ms deadline",
        at - sent
    );
    assert!(
        token > holder_token,
        "token {token} not above {holder_token}"
    );
    // The waiter's ttl counts from the grant, not from when it queued (that
    // would leave at most WAITER_TTL - HOLDER_TTL).
    assert_fresh_grant(&mut c, &key, token);
    assert_eq!(release(&mut c, &key, "holder"), 0);
    assert_eq!(blocked_clients(&mut c), 0);
    assert_eq!(release(&mut c, &key, "waiter"), 1);
    assert_absent(&mut c, &key);
}

/// Hold a key, queue a waiter, run `cmd` (which must reply `reply`) to delete
/// the key, and check the waiter gets a larger token.
fn deletion_hands_the_lock_to_the_first_waiter(cmd: &[&str], reply: Value) {
    let server = Server::start();
    let mut c = server.conn();
    let key = new_key();
    let holder_token = must_acquire(&mut c, &key, "holder", LONG_TTL);
    let first = Waiter::start(&server, &mut c, &key, "first", WAITER_TTL, "0");
    let second = Waiter::start(&server, &mut c, &key, "second", WAITER_TTL, "0");

    let args: Vec<String> = cmd[1..].iter().map(|a| a.replace("{key}", &key)).collect();
    assert_eq!(call(&mut c, cmd[0], &args), Ok(reply), "{cmd:?}");

    let token = first.token();
    assert!(
        token > holder_token,
        "{cmd:?}: token {token} not above the deleted hold's {holder_token}"
    );
    assert_fresh_grant(&mut c, &key, token);
    assert_eq!(release(&mut c, &key, "holder"), 0);
    assert_eq!(
        blocked_clients(&mut c),
        1,
        "{cmd:?}: the second waiter is still queued"
    );

    assert_eq!(release(&mut c, &key, "first"), 1);
    let next = second.token();
    assert!(next > token);
    assert_eq!(release(&mut c, &key, "second"), 1);
    assert_absent(&mut c, &key);
}

#[test]
fn del_hands_the_lock_to_the_first_waiter() {
    deletion_hands_the_lock_to_the_first_waiter(&["DEL", "{key}"], Value::Int(1));
}

#[test]
fn unlink_hands_the_lock_to_the_first_waiter() {
    deletion_hands_the_lock_to_the_first_waiter(&["UNLINK", "{key}"], Value::Int(1));
}

#[test]
fn flushdb_hands_the_lock_to_the_first_waiter() {
    deletion_hands_the_lock_to_the_first_waiter(&["FLUSHDB"], Value::Okay);
}

#[test]
fn flushall_hands_the_lock_to_the_first_waiter() {
    deletion_hands_the_lock_to_the_first_waiter(&["FLUSHALL"], Value::Okay);
}

#[test]
fn rename_frees_the_old_name_for_its_waiters_and_keeps_the_hold() {
    let server = Server::start();
    let mut c = server.conn();
    let (old, new) = (new_key(), new_key());
    let holder_token = must_acquire(&mut c, &old, "holder", LONG_TTL);
    let waiter = Waiter::start(&server, &mut c, &old, "waiter", WAITER_TTL, "0");

    ok(call(&mut c, "RENAME", &[&old, &new]), "RENAME");

    let token = waiter.token();
    assert!(
        token > holder_token,
        "token {token} not above {holder_token}"
    );
    assert_fresh_grant(&mut c, &old, token);
    // The hold moved with the key.
    assert_held(&mut c, &new, holder_token, LONG_TTL);
    assert_eq!(release(&mut c, &new, "holder"), 1);
    assert_absent(&mut c, &new);
    assert_eq!(release(&mut c, &old, "waiter"), 1);
    assert_absent(&mut c, &old);
}

#[test]
fn overwriting_the_key_fails_its_waiters_with_wrongtype() {
    let server = Server::start();
    let mut c = server.conn();
    let key = new_key();
    must_acquire(&mut c, &key, "holder", LONG_TTL);
    let waiter = Waiter::start(&server, &mut c, &key, "waiter", WAITER_TTL, "0");

    ok(call(&mut c, "SET", &[&key, "x"]), "SET");

    assert_err_code(waiter.reply().0, "WRONGTYPE");
    wait_blocked(&mut c, 0);
    assert_eq!(
        call(&mut c, "GET", &[&key]),
        Ok(Value::BulkString(b"x".to_vec()))
    );
}

// --- Contexts that never block -----------------------------------------------

#[test]
fn block_inside_multi_behaves_as_without_block() {
    let server = Server::start();
    let mut c = server.conn();
    let (held, free) = (new_key(), new_key());
    let holder_token = must_acquire(&mut c, &held, "holder", LONG_TTL);

    let replies: Vec<Value> = redis::pipe()
        .atomic()
        .cmd("LOCK.ACQUIRE")
        .arg(&held)
        .arg("other")
        .arg(1_000)
        .arg("BLOCK")
        .arg(0)
        .cmd("LOCK.ACQUIRE")
        .arg(&free)
        .arg("other")
        .arg(1_000)
        .arg("BLOCK")
        .arg(0)
        .query(&mut c)
        .expect("MULTI/EXEC");
    assert_eq!(replies.len(), 2, "EXEC replies {replies:?}");
    assert_eq!(replies[0], Value::Nil, "held key inside MULTI");
    let token = match replies[1] {
        Value::Int(t) => t,
        ref other => panic!("free key inside MULTI: expected a token, got {other:?}"),
    };
    assert_held(&mut c, &free, token, 1_000);
    assert_eq!(blocked_clients(&mut c), 0);

    // Nothing was queued: the release frees the key entirely.
    assert_held(&mut c, &held, holder_token, LONG_TTL);
    assert_eq!(release(&mut c, &held, "holder"), 1);
    assert_absent(&mut c, &held);
}

#[test]
fn block_inside_lua_behaves_as_without_block() {
    let server = Server::start();
    let mut c = server.conn();
    let key = new_key();
    let holder_token = must_acquire(&mut c, &key, "holder", LONG_TTL);
    let script = "return redis.call('LOCK.ACQUIRE', KEYS[1], ARGV[1], ARGV[2], 'BLOCK', '0')";

    assert_eq!(
        call(&mut c, "EVAL", &[script, "1", &key, "other", "1000"]),
        Ok(Value::Nil)
    );
    assert_eq!(blocked_clients(&mut c), 0);
    // The holder itself gets its token back from Lua too.
    assert_eq!(
        call(&mut c, "EVAL", &[script, "1", &key, "holder", "1000"]),
        Ok(Value::Int(holder_token))
    );

    // Nothing was queued: the release frees the key entirely.
    assert_eq!(release(&mut c, &key, "holder"), 1);
    assert_absent(&mut c, &key);
}

// --- Waiter cap --------------------------------------------------------------

/// With `lock.max-waiters` 2: two waiters queue, a third is refused at once and
/// never queued.
fn cap_of_two_is_enforced(server: &Server) {
    let mut c = server.conn();
    assert_eq!(config_get(&mut c, "lock.max-waiters"), "2");
    let key = new_key();
    let holder_token = must_acquire(&mut c, &key, "holder", LONG_TTL);
    let first = Waiter::start(server, &mut c, &key, "first", WAITER_TTL, "0");
    let second = Waiter::start(server, &mut c, &key, "second", WAITER_TTL, "0");

    let mut third = server.conn();
    assert_err(
        call(
            &mut third,
            "LOCK.ACQUIRE",
            &block_args(&key, "third", WAITER_TTL, "0"),
        ),
        "ERR too many waiters on this key (lock.max-waiters is 2)",
    );
    assert_eq!(blocked_clients(&mut c), 2);
    assert_held(&mut c, &key, holder_token, LONG_TTL);

    // Another key has a queue of its own.
    let other = new_key();
    must_acquire(&mut c, &other, "holder", LONG_TTL);
    let elsewhere = Waiter::start(server, &mut c, &other, "third", WAITER_TTL, "0");

    assert_eq!(release(&mut c, &key, "holder"), 1);
    let t1 = first.token();
    assert_eq!(release(&mut c, &key, "first"), 1);
    let t2 = second.token();
    assert!(holder_token < t1 && t1 < t2);
    assert_eq!(release(&mut c, &key, "third"), 0);
    assert_eq!(release(&mut c, &key, "second"), 1);
    assert_absent(&mut c, &key);

    assert_eq!(release(&mut c, &other, "holder"), 1);
    elsewhere.token();
}

#[test]
fn waiter_cap_set_with_config_set() {
    let server = Server::start();
    let mut c = server.conn();
    assert_eq!(config_get(&mut c, "lock.max-waiters"), "10000");
    ok(
        call(&mut c, "CONFIG", &["SET", "lock.max-waiters", "2"]),
        "CONFIG SET",
    );
    cap_of_two_is_enforced(&server);
}

#[test]
fn waiter_cap_set_as_module_argument() {
    let server = Server::start_with_module_args(&["max-waiters", "2"], &[]);
    cap_of_two_is_enforced(&server);
}

// --- Argument errors ---------------------------------------------------------

#[test]
fn block_argument_errors_are_rejected_and_change_nothing() {
    let server = Server::start();
    let mut c = server.conn();
    let (held, free) = (new_key(), new_key());
    let holder_token = must_acquire(&mut c, &held, "holder", LONG_TTL);

    let invalid = "ERR BLOCK timeout-ms must be a non-negative integer";
    let cases: &[(&[&str], &str)] = &[
        (&["BLOCK", "-1"], invalid),
        (&["BLOCK", "-1000"], invalid),
        (&["BLOCK", "x"], invalid),
        (&["BLOCK", "1.5"], invalid),
        (&["BLOCK", ""], invalid),
        (
            &["BLOCK"],
            "ERR syntax error: BLOCK needs a timeout in milliseconds",
        ),
        (
            &["block"],
            "ERR syntax error: BLOCK needs a timeout in milliseconds",
        ),
        (
            &["BLOCK", "1", "BLOCK", "2"],
            "ERR syntax error: BLOCK given more than once",
        ),
        (
            &["BLOCK", "0", "block", "0"],
            "ERR syntax error: BLOCK given more than once",
        ),
    ];
    for key in [&held, &free] {
        for (opts, want) in cases {
            let mut args = vec![key.as_str(), "other", "1000"];
            args.extend_from_slice(opts);
            assert_err(call(&mut c, "LOCK.ACQUIRE", &args), want);
        }
    }

    assert_eq!(blocked_clients(&mut c), 0);
    assert_held(&mut c, &held, holder_token, LONG_TTL);
    assert_absent(&mut c, &free);
    assert_eq!(release(&mut c, &held, "holder"), 1);
    assert_absent(&mut c, &held);
}

// --- Replication and demotion ------------------------------------------------

/// Assert the replica answers `LOCK.FENCE` and `EXISTS` for `key` as the primary does.
#[track_caller]
fn assert_same_on_replica(p: &mut Connection, r: &mut Connection, key: &str) {
    assert_eq!(
        fence(r, key),
        fence(p, key),
        "LOCK.FENCE {key} on the replica"
    );
    assert_eq!(
        exists(r, key),
        exists(p, key),
        "EXISTS {key} on the replica"
    );
}

#[test]
fn replica_matches_primary_after_handoffs() {
    let primary = Server::start();
    let replica = Server::replica_of(&primary);
    wait_for_replica_sync(&primary, &replica);
    let mut p = primary.conn();
    let mut r = replica.conn();
    let (released, expired) = (new_key(), new_key());

    // Handoffs on release: holder -> a -> b -> c.
    let mut token = must_acquire(&mut p, &released, "holder", LONG_TTL);
    let waiters: Vec<Waiter> = ["a", "b", "c"]
        .iter()
        .map(|owner| Waiter::start(&primary, &mut p, &released, owner, LONG_TTL, "0"))
        .collect();
    let mut previous = "holder".to_string();
    for waiter in waiters {
        assert_eq!(release(&mut p, &released, previous.as_str()), 1);
        previous = waiter.owner.clone();
        let next = waiter.token();
        assert!(next > token);
        token = next;
        wait_for_replica_sync(&primary, &replica);
        assert_same_on_replica(&mut p, &mut r, &released);
        assert_eq!(fence(&mut r, &released), Some(token));
    }

    // Handoff on the holder's deadline.
    let short = must_acquire(&mut p, &expired, "holder", 300);
    let waiter = Waiter::start(&primary, &mut p, &expired, "waiter", LONG_TTL, "0");
    let granted = waiter.token();
    assert!(granted > short);
    wait_for_replica_sync(&primary, &replica);
    assert_same_on_replica(&mut p, &mut r, &expired);
    assert_eq!(fence(&mut r, &expired), Some(granted));

    // The last release with nobody queued removes the key on both.
    assert_eq!(release(&mut p, &released, "c"), 1);
    wait_for_replica_sync(&primary, &replica);
    assert_same_on_replica(&mut p, &mut r, &released);
    assert_eq!(exists(&mut r, &released), 0);
    assert_same_on_replica(&mut p, &mut r, &expired);
}

#[test]
fn demotion_to_replica_fails_the_waiters() {
    let server = Server::start();
    let other = Server::start();
    let mut c = server.conn();
    let key = new_key();
    must_acquire(&mut c, &key, "holder", LONG_TTL);
    let first = Waiter::start(&server, &mut c, &key, "first", WAITER_TTL, "0");
    let second = Waiter::start(&server, &mut c, &key, "second", WAITER_TTL, "0");

    let port = other.port().to_string();
    ok(
        call(&mut c, "REPLICAOF", &["127.0.0.1", &port]),
        "REPLICAOF",
    );

    for waiter in [first, second] {
        let owner = waiter.owner.clone();
        match waiter.reply().0 {
            // Any error reply will do; a closed connection without one would
            // show up as an I/O error (no code).
            Err(e) if e.code().is_some() => {}
            other => {
                panic!("waiter {owner} after demotion: expected an error reply, got {other:?}")
            }
        }
    }
    wait_blocked(&mut c, 0);
}

#[test]
fn waiting_behind_a_hold_of_centuries_times_out_cleanly() {
    // A holder's deadline far in the future (the largest ttl accepted is about 146 million
    // years) must not break the timer armed at it: the waiter gets its nil at its timeout.
    let server = Server::start();
    let mut c = server.conn();
    let key = unique_key("centuries");
    must_acquire(&mut c, &key, "holder", 4_000_000_000_000_000_000);
    let reply: Value = redis::cmd("LOCK.ACQUIRE")
        .arg(&key)
        .arg("waiter")
        .arg(WAITER_TTL)
        .arg("BLOCK")
        .arg(50)
        .query(&mut c)
        .unwrap();
    assert_eq!(reply, Value::Nil);
    assert_eq!(
        info_field(&mut c, "lock", "lock_timed_out").as_deref(),
        Some("1")
    );
    assert!(!server.log().contains("panicked"), "{}", server.log());
}
