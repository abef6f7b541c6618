//! `BLOCK` timeouts: nil on timeout and out of the queue; `BLOCK 0` waits without limit; a
//! wait behind a hold of centuries still times out.

use super::*;

#[test]
fn timeout_replies_nil_and_leaves_the_queue() {
    let (server, mut c, key, holder_token) = held_key();

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
    release_last(&mut c, &key, "holder");
}

#[test]
fn block_zero_waits_without_limit() {
    let (server, mut c, key, holder_token) = held_key();

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

    release_to(&mut c, &key, "holder", patient, holder_token);
    release_last(&mut c, &key, "patient");
}

#[test]
fn waiting_behind_a_hold_of_centuries_times_out_cleanly() {
    // A holder's deadline far in the future (the largest ttl accepted is about 146 million
    // years) must not break the timer armed at it: the waiter gets its nil at its timeout.
    let (server, mut c) = start();
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
