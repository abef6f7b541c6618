//! Handoff without a release: the holder's deadline passes, the key is deleted (`DEL`,
//! `UNLINK`, `FLUSHDB`, `FLUSHALL`), renamed, or overwritten under its waiters.

use super::*;

#[test]
fn waiter_gets_the_lock_when_the_holder_deadline_passes() {
    let (server, mut c) = start();
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
    release_last(&mut c, &key, "waiter");
}

/// Hold a key, queue a waiter, run `cmd` (which must reply `reply`) to delete
/// the key, and check the waiter gets a larger token.
fn deletion_hands_the_lock_to_the_first_waiter(cmd: &[&str], reply: Value) {
    let (server, mut c, key, holder_token) = held_key();
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
    release_last(&mut c, &key, "second");
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
    let (server, mut c) = start();
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
    release_last(&mut c, &new, "holder");
    release_last(&mut c, &old, "waiter");
}

#[test]
fn overwriting_the_key_fails_its_waiters_with_wrongtype() {
    let (server, mut c, key, _) = held_key();
    let waiter = Waiter::start(&server, &mut c, &key, "waiter", WAITER_TTL, "0");

    ok(call(&mut c, "SET", &[&key, "x"]), "SET");

    assert_err_code(waiter.reply().0, "WRONGTYPE");
    wait_blocked(&mut c, 0);
    assert_eq!(
        call(&mut c, "GET", &[&key]),
        Ok(Value::BulkString(b"x".to_vec()))
    );
}
