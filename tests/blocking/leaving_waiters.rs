//! Waiters that leave (disconnect, `CLIENT KILL`, `CLIENT UNBLOCK`) are skipped by the handoff.

use super::*;

#[test]
fn disconnected_waiter_is_skipped() {
    let (server, mut c, key, holder_token) = held_key();

    let gone = raw_waiter(&server, &mut c, &key, "gone", "0");
    let next = Waiter::start(&server, &mut c, &key, "next", WAITER_TTL, "0");
    drop(gone);
    wait_blocked(&mut c, 1);

    release_to(&mut c, &key, "holder", next, holder_token);
    assert_eq!(release(&mut c, &key, "gone"), 0);

    // The disconnected waiter is not queued any more either: the key is freed.
    release_last(&mut c, &key, "next");
}

#[test]
fn disconnected_only_waiter_leaves_the_key_free_after_release() {
    let (server, mut c, key, _) = held_key();

    let gone = raw_waiter(&server, &mut c, &key, "gone", "0");
    drop(gone);
    wait_blocked(&mut c, 0);

    release_last(&mut c, &key, "holder");
}

#[test]
fn client_killed_waiter_is_skipped() {
    let (server, mut c, key, holder_token) = held_key();

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

    release_to(&mut c, &key, "holder", next, holder_token);
    assert_eq!(release(&mut c, &key, "killed"), 0);
    release_last(&mut c, &key, "next");
}

#[test]
fn client_unblock_gives_nil_or_error_and_leaves_the_queue() {
    let (server, mut c, key, holder_token) = held_key();

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
    release_to(&mut c, &key, "holder", last, holder_token);
    release_last(&mut c, &key, "last");
}
