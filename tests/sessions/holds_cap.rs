//! `lock.max-session-holds` counts the holds a session has, exactly (issue 28, items 7 and 8):
//! a shared hold that expired on its own no longer counts, `LOCK.MACQUIRE` cannot pass the cap,
//! and a retry of a hold the session already has gets its token back at the cap.

use super::*;

const CAP_ERROR: &str = "ERR the session has too many holds (lock.max-session-holds is 2)";

fn capped() -> (Server, Connection) {
    let server = Server::start_with_module_args(&["max-session-holds", "2"], &[]);
    let c = server.conn();
    (server, c)
}

#[test]
fn expired_shared_holds_do_not_count_against_the_cap() {
    let (_server, mut c) = capped();
    let id = open(&mut c, 60_000, &[]);
    let (a, b) = (new_key(), new_key());
    // Others keep both keys held, so the session's entries expire inside live keys.
    for k in [&a, &b] {
        must_token(acquire_with(&mut c, k, "other", 60_000, &["SHARED"]));
        acquire_in(&mut c, k, "me", 50, &id, &["SHARED"]);
    }
    wait_until(
        "the session's shared holds expire",
        Duration::from_secs(10),
        || info_of(&mut c, &id, "holds") == Value::Int(0),
    );
    // Zero live holds: two new ones fit, a third does not.
    acquire_in(&mut c, &new_key(), "me", 0, &id, &[]);
    acquire_in(&mut c, &new_key(), "me", 0, &id, &[]);
    assert_err(
        acquire_with(&mut c, &new_key(), "me", 0, &["SESSION", &id]),
        CAP_ERROR,
    );
    assert_eq!(info_of(&mut c, &id, "holds"), Value::Int(2));
}

#[test]
fn a_touched_key_drops_the_expired_entry_from_its_session() {
    let (_server, mut c) = capped();
    let id = open(&mut c, 60_000, &[]);
    let k = new_key();
    must_token(acquire_with(&mut c, &k, "other", 60_000, &["SHARED"]));
    acquire_in(&mut c, &k, "me", 50, &id, &["SHARED"]);
    acquire_in(&mut c, &new_key(), "me", 0, &id, &[]);
    wait_until("the shared hold expires", Duration::from_secs(10), || {
        info_of(&mut c, &id, "holds") == Value::Int(1)
    });
    // Another holder's acquire prunes the expired entry and the session's record of it (were
    // the record left, the cap's sweep of dead records would drop it at the next acquire).
    must_token(acquire_with(&mut c, &k, "third", 60_000, &["SHARED"]));
    acquire_in(&mut c, &new_key(), "me", 0, &id, &[]);
    assert_eq!(info_of(&mut c, &id, "holds"), Value::Int(2));
}

#[test]
fn macquire_cannot_pass_the_cap() {
    let (_server, mut c) = capped();
    let id = open(&mut c, 60_000, &[]);
    let (a, b, d) = (new_key(), new_key(), new_key());
    let ta = acquire_in(&mut c, &a, "me", 0, &id, &[]);
    assert_err(
        call(
            &mut c,
            "LOCK.MACQUIRE",
            &["2", &b, &d, "me", "0", "SESSION", &id],
        ),
        CAP_ERROR,
    );
    assert_eq!(exists(&mut c, &b) + exists(&mut c, &d), 0);
    assert_eq!(info_of(&mut c, &id, "holds"), Value::Int(1));
    // One held already and one new: two in all, within the cap.
    match call(
        &mut c,
        "LOCK.MACQUIRE",
        &["2", &a, &b, "me", "0", "SESSION", &id],
    ) {
        Ok(Value::Array(tokens)) => {
            assert_eq!(tokens[0], Value::Int(ta));
            assert!(matches!(tokens[1], Value::Int(t) if t > ta));
        }
        other => panic!("LOCK.MACQUIRE: {other:?}"),
    }
    assert_eq!(info_of(&mut c, &id, "holds"), Value::Int(2));
}

#[test]
fn a_retry_at_the_cap_gets_its_token_back() {
    let (_server, mut c) = capped();
    let id = open(&mut c, 60_000, &[]);
    let (a, b) = (new_key(), new_key());
    let ta = acquire_in(&mut c, &a, "me", 0, &id, &[]);
    let tb = acquire_in(&mut c, &b, "me", 0, &id, &[]);
    assert_eq!(acquire_in(&mut c, &a, "me", 0, &id, &[]), ta);
    assert_eq!(
        call(
            &mut c,
            "LOCK.MACQUIRE",
            &["2", &b, &a, "me", "0", "SESSION", &id]
        ),
        Ok(Value::Array(vec![Value::Int(tb), Value::Int(ta)]))
    );
    assert_err(
        acquire_with(&mut c, &new_key(), "me", 0, &["SESSION", &id]),
        CAP_ERROR,
    );
}

#[test]
fn a_waiter_whose_session_filled_up_meanwhile_is_refused_at_its_turn() {
    let server = Server::start_with_module_args(&["max-session-holds", "2"], &[]);
    let mut c = server.conn();
    let id = open(&mut c, 60_000, &[]);
    let (x, y, z, w) = (new_key(), new_key(), new_key(), new_key());
    acquire_in(&mut c, &w, "me", 0, &id, &[]);
    must_token(acquire_with(&mut c, &x, "other", 60_000, &[]));
    must_token(acquire_with(&mut c, &z, "other", 60_000, &[]));
    // Room for one more when they queue: a single-key waiter and a set waiter.
    let single = Waiter::start(
        &server,
        &mut c,
        "LOCK.ACQUIRE",
        &[&x, "me", "0", "BLOCK", "20000", "SESSION", &id],
    );
    let set = Waiter::start(
        &server,
        &mut c,
        "LOCK.MACQUIRE",
        &["1", &z, "me", "0", "BLOCK", "20000", "SESSION", &id],
    );
    // Meanwhile the session takes its last hold.
    acquire_in(&mut c, &y, "me", 0, &id, &[]);
    assert_eq!(release(&mut c, &x, "other"), 1);
    assert_eq!(release(&mut c, &z, "other"), 1);
    for waiter in [single, set] {
        assert_err(waiter.reply().0, CAP_ERROR);
    }
    assert_eq!(info_of(&mut c, &id, "holds"), Value::Int(2));
    assert_eq!(exists(&mut c, &x) + exists(&mut c, &z), 0);
}

#[track_caller]
fn must_token(reply: RedisResult<Value>) -> i64 {
    match reply {
        Ok(Value::Int(t)) if t > 0 => t,
        other => panic!("expected a token, got {other:?}"),
    }
}
