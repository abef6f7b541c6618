//! Replication of handoffs, and demotion to replica failing the waiters.

use super::*;

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
    let (primary, replica) = primary_and_replica(&[]);
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
