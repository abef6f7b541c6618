//! A replica sees the same holds as its primary: after a full sync (holds taken
//! before it attached) and through the replication stream (acquire, re-acquire,
//! extend, release). Replicas refuse lock writes and answer LOCK.FENCE.

mod common;

use std::time::{Duration, Instant};

use common::*;
use redis::Connection;

const LONG_TTL: i64 = 100_000;

/// How far apart PTTL on the primary and on the replica may be: the two reads
/// are not simultaneous, and the replica may have applied the write a little
/// later.
const PTTL_TOLERANCE: i64 = 1_000;

fn new_key() -> String {
    unique_key("replication")
}

/// Assert the replica answers for `key` exactly as the primary does.
#[track_caller]
fn assert_same_on_replica(p: &mut Connection, r: &mut Connection, key: &str) {
    let token = fence(p, key);
    assert_eq!(fence(r, key), token, "LOCK.FENCE {key} on the replica");
    assert_eq!(
        exists(r, key),
        exists(p, key),
        "EXISTS {key} on the replica"
    );
    if let Some(token) = token {
        assert_eq!(
            fence_check(r, key, token),
            1,
            "LOCK.FENCE {key} {token} on the replica"
        );
        assert_eq!(key_type(r, key), "redislock");
        let (pp, rp) = (pttl(p, key), pttl(r, key));
        assert!(
            rp > 0 && (rp - pp).abs() <= PTTL_TOLERANCE,
            "PTTL {key}: primary {pp}, replica {rp}"
        );
    } else {
        assert_eq!(exists(r, key), 0, "EXISTS {key} on the replica");
    }
}

#[test]
fn replica_matches_primary_after_acquire_extend_release() {
    let primary = Server::start();
    let mut p = primary.conn();
    let (before_sync, acquired, retried, extended, released) =
        (new_key(), new_key(), new_key(), new_key(), new_key());

    // Taken before the replica exists: reaches it through the full sync.
    let t0 = must_acquire(&mut p, &before_sync, "alice", LONG_TTL);

    let replica = Server::replica_of(&primary);
    wait_for_replica_sync(&primary, &replica);
    let mut r = replica.conn();
    assert_same_on_replica(&mut p, &mut r, &before_sync);
    assert_eq!(fence(&mut r, &before_sync), Some(t0));

    // Through the replication stream.
    let t1 = must_acquire(&mut p, &acquired, "alice", LONG_TTL);
    let t2 = must_acquire(&mut p, &retried, "bob", 1_000);
    assert_eq!(acquire(&mut p, &retried, "bob", LONG_TTL), Some(t2));
    let t3 = must_acquire(&mut p, &extended, "carol", 1_000);
    assert_eq!(extend(&mut p, &extended, "carol", 2 * LONG_TTL), 1);
    must_acquire(&mut p, &released, "dave", LONG_TTL);
    assert_eq!(release(&mut p, &released, "dave"), 1);
    // Replies that change nothing.
    assert_eq!(acquire(&mut p, &acquired, "mallory", LONG_TTL), None);
    assert_eq!(release(&mut p, &acquired, "mallory"), 0);
    assert_eq!(extend(&mut p, &acquired, "mallory", LONG_TTL), 0);

    wait_for_replica_sync(&primary, &replica);
    for key in [&before_sync, &acquired, &retried, &extended, &released] {
        assert_same_on_replica(&mut p, &mut r, key);
    }
    assert_eq!(fence(&mut r, &acquired), Some(t1));
    assert_eq!(fence(&mut r, &retried), Some(t2));
    assert_eq!(fence(&mut r, &extended), Some(t3));
    // The re-acquire and the extend moved the deadlines on the replica too.
    assert!(
        pttl(&mut r, &retried) > 1_000,
        "re-acquire's new deadline not replicated"
    );
    assert!(
        pttl(&mut r, &extended) > LONG_TTL,
        "extend's new deadline not replicated"
    );
    assert_eq!(exists(&mut r, &released), 0);

    // Release on the primary, then the replica sees it free.
    assert_eq!(release(&mut p, &acquired, "alice"), 1);
    wait_for_replica_sync(&primary, &replica);
    assert_same_on_replica(&mut p, &mut r, &acquired);
    assert_eq!(fence_check(&mut r, &acquired, t1), 0);
}

#[test]
fn replica_refuses_lock_writes_and_answers_fence() {
    let primary = Server::start();
    let replica = Server::replica_of(&primary);
    let mut p = primary.conn();
    let key = new_key();
    let token = must_acquire(&mut p, &key, "alice", LONG_TTL);
    wait_for_replica_sync(&primary, &replica);
    let mut r = replica.conn();

    let free = new_key();
    assert_err_code(
        call(&mut r, "LOCK.ACQUIRE", &[&free, "alice", "10000"]),
        "READONLY",
    );
    assert_err_code(
        call(&mut r, "LOCK.ACQUIRE", &[&key, "alice", "10000"]),
        "READONLY",
    );
    assert_err_code(call(&mut r, "LOCK.RELEASE", &[&key, "alice"]), "READONLY");
    assert_err_code(
        call(&mut r, "LOCK.EXTEND", &[&key, "alice", "10000"]),
        "READONLY",
    );

    assert_eq!(fence(&mut r, &key), Some(token));
    assert_eq!(fence_check(&mut r, &key, token), 1);
    assert_eq!(fence_check(&mut r, &key, token + 1), 0);
    assert_eq!(fence(&mut r, &free), None);
    assert_eq!(exists(&mut r, &free), 0);

    // Nothing changed on either side.
    wait_for_replica_sync(&primary, &replica);
    assert_held(&mut p, &key, token, LONG_TTL);
    assert_same_on_replica(&mut p, &mut r, &key);
}

#[test]
fn replica_reports_an_expired_hold_as_free() {
    // The stream is live before the hold exists, so the hold reaches the
    // replica well before its deadline (a replica may rightly drop a hold that
    // is already past its deadline when it arrives).
    let (primary, replica) = primary_and_replica(&[]);
    let mut p = primary.conn();
    // The primary never deletes the key on its own (no active expiry, and this
    // test does not touch the key there), so the replica keeps an expired hold.
    redis::cmd("DEBUG")
        .arg("SET-ACTIVE-EXPIRE")
        .arg(0)
        .query::<()>(&mut p)
        .unwrap();
    let key = new_key();
    const TTL: i64 = 200;
    let token = must_acquire(&mut p, &key, "alice", TTL);
    let deadline = Instant::now() + Duration::from_millis(TTL as u64 + 5);
    wait_for_replica_sync(&primary, &replica);
    let mut r = replica.conn();
    sleep_until(deadline);

    let dbsize: i64 = redis::cmd("DBSIZE").query(&mut r).unwrap();
    assert_eq!(dbsize, 1, "the replica should still store the expired hold");
    assert_eq!(
        fence(&mut r, &key),
        None,
        "LOCK.FENCE of an expired hold on the replica"
    );
    assert_eq!(fence_check(&mut r, &key, token), 0);
}

#[test]
fn promoted_replica_issues_larger_tokens() {
    let primary = Server::start();
    let replica = Server::replica_of(&primary);
    let mut p = primary.conn();
    let key = new_key();
    let mut last = 0;
    for i in 0..50 {
        last = must_acquire(&mut p, &key, "alice", LONG_TTL);
        if i < 49 {
            assert_eq!(release(&mut p, &key, "alice"), 1);
        }
    }
    wait_for_replica_sync(&primary, &replica);
    promote(&replica);
    let mut r = replica.conn();

    // The promoted replica keeps the hold and continues the token order.
    assert_eq!(fence(&mut r, &key), Some(last));
    assert_eq!(acquire(&mut r, &key, "bob", LONG_TTL), None);
    assert_eq!(release(&mut r, &key, "alice"), 1);
    let next = must_acquire(&mut r, &key, "bob", LONG_TTL);
    assert!(
        next > last,
        "token {next} on the promoted replica not above {last}"
    );
}
