//! A waited-on key replaced by another lock (`RENAME`, `RESTORE ... REPLACE`, `MOVE`,
//! `SWAPDB` bringing a lock into the name): the queue belongs to the name, so its waiters keep
//! their place and wait for the new holder, exactly as they waited for the old one. They are
//! granted when the new holder's deadline passes, never answered early.

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use redis::{Connection, RedisResult, Value};

const LONG_TTL: i64 = 60_000;
/// The ttl of the lock brought into the waited-on name.
const NEW_HOLDER_TTL: i64 = 800;

/// A waiter on `key` in `LOCK.ACQUIRE key waiter 30000 BLOCK 20000`, on its own thread.
fn waiter(
    server: &Server,
    ctl: &mut Connection,
    key: &str,
) -> mpsc::Receiver<(RedisResult<Value>, Instant)> {
    let before = blocked_clients(ctl);
    let mut conn = server.conn();
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let key = key.to_string();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let reply = call(
            &mut conn,
            "LOCK.ACQUIRE",
            &[&key, "waiter", "30000", "BLOCK", "20000"],
        );
        let _ = tx.send((reply, Instant::now()));
    });
    wait_blocked(ctl, before + 1);
    rx
}

/// Hold `k` by "old", queue a waiter, then let `replace` put a lock held by "new" (ttl
/// `NEW_HOLDER_TTL`, its token returned by `replace`) under the name `k` in database 0.
/// The waiter must still be waiting afterwards, and be granted once "new"'s deadline passes.
fn waiter_keeps_waiting_on_the_new_holder(replace: impl FnOnce(&mut Connection, &str) -> i64) {
    let (server, mut c) = start();
    let k = unique_key("replaced");
    let old = must_acquire(&mut c, &k, "old", LONG_TTL);
    let reply = waiter(&server, &mut c, &k);
    let new = replace(&mut c, &k);
    let replaced_at = Instant::now();
    assert!(
        new > old,
        "the new holder's token {new} is above the old one's {old}"
    );
    assert_eq!(
        fence(&mut c, &k),
        Some(new),
        "LOCK.FENCE {k} after the replacement"
    );
    // The deferred look at the key has run by the time a later command is answered; give the
    // event loop a few turns on top.
    thread::sleep(Duration::from_millis(100));
    assert_eq!(blocked_clients(&mut c), 1, "the waiter is still queued");
    if let Ok(early) = reply.try_recv() {
        panic!("the waiter was answered when the key was replaced: {early:?}");
    }
    let (granted, at) = reply
        .recv_timeout(Duration::from_secs(20))
        .expect("no reply");
    let Ok(Value::Int(token)) = granted else {
        panic!("the waiter: expected a token, got {granted:?}")
    };
    assert!(
        at >= replaced_at + Duration::from_millis(NEW_HOLDER_TTL as u64 - 200),
        "granted {:?} after the replacement, before the new holder's deadline",
        at - replaced_at
    );
    assert!(token > new, "token {token} after the new holder's {new}");
    assert_eq!(fence(&mut c, &k), Some(token));
    assert_eq!(release(&mut c, &k, "waiter"), 1);
}

fn ok(reply: RedisResult<Value>, what: &str) {
    assert_eq!(reply, Ok(Value::Okay), "{what}");
}

/// The new holder's lock on `k` in database 1 (for `MOVE` or `SWAPDB` to bring in), then back
/// to database 0; its token.
fn new_lock_in_db1(c: &mut Connection, k: &str) -> i64 {
    ok(call(c, "SELECT", &["1"]), "SELECT 1");
    let t = must_acquire(c, k, "new", NEW_HOLDER_TTL);
    ok(call(c, "SELECT", &["0"]), "SELECT 0");
    t
}

#[test]
fn rename_of_another_lock_onto_the_key() {
    waiter_keeps_waiting_on_the_new_holder(|c, k| {
        let other = unique_key("other");
        let t = must_acquire(c, &other, "new", NEW_HOLDER_TTL);
        ok(call(c, "RENAME", &[&other, k]), "RENAME");
        t
    });
}

#[test]
fn restore_replace_of_another_lock_onto_the_key() {
    waiter_keeps_waiting_on_the_new_holder(|c, k| {
        let other = unique_key("other");
        let t = must_acquire(c, &other, "new", NEW_HOLDER_TTL);
        let dump = match call(c, "DUMP", &[&other]) {
            Ok(Value::BulkString(b)) => b,
            other => panic!("DUMP: {other:?}"),
        };
        let ttl = pttl(c, &other).to_string();
        let reply = redis::cmd("RESTORE")
            .arg(k)
            .arg(ttl)
            .arg(dump)
            .arg("REPLACE")
            .query(c);
        ok(reply, "RESTORE ... REPLACE");
        t
    });
}

#[test]
fn move_of_another_lock_into_the_name() {
    waiter_keeps_waiting_on_the_new_holder(|c, k| {
        let t = new_lock_in_db1(c, k);
        // The old lock goes and the new one comes in one step, so the name is never free.
        let replies: Vec<Value> = redis::pipe()
            .atomic()
            .cmd("DEL")
            .arg(k)
            .cmd("SELECT")
            .arg(1)
            .cmd("MOVE")
            .arg(k)
            .arg(0)
            .cmd("SELECT")
            .arg(0)
            .query(c)
            .expect("MULTI DEL, MOVE EXEC");
        assert_eq!(
            replies,
            [Value::Int(1), Value::Okay, Value::Int(1), Value::Okay]
        );
        t
    });
}

#[test]
fn swapdb_bringing_another_lock_into_the_name() {
    waiter_keeps_waiting_on_the_new_holder(|c, k| {
        let t = new_lock_in_db1(c, k);
        ok(call(c, "SWAPDB", &["0", "1"]), "SWAPDB 0 1");
        // The old lock is in database 1 now, with nobody waiting for it there.
        ok(call(c, "SELECT", &["1"]), "SELECT 1");
        assert_eq!(release(c, k, "old"), 1);
        ok(call(c, "SELECT", &["0"]), "SELECT 0");
        t
    });
}
