//! `BLOCK` timeouts: nil on timeout and out of the queue; `BLOCK 0` waits without limit; a
//! wait behind a hold of centuries still times out; each waiter times out at its own timeout
//! whatever the order of the timeouts and whoever left the queue before (the module runs one
//! timer for all of them).

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
fn each_waiter_times_out_at_its_own_timeout_in_any_order() {
    let (server, mut c, key, holder_token) = held_key();

    // A later waiter with a shorter timeout: the timer armed for the first must be moved
    // earlier for it, and the first still waits for its own.
    let sent_slow = Instant::now();
    let slow = Waiter::start(&server, &mut c, &key, "slow", WAITER_TTL, "1500");
    let sent_quick = Instant::now();
    let quick = Waiter::start(&server, &mut c, &key, "quick", WAITER_TTL, "100");
    let (reply, at) = quick.reply();
    assert_eq!(reply, Ok(Value::Nil));
    assert!(
        at - sent_quick >= Duration::from_millis(100),
        "quick: nil after {:?}, before its 100 ms timeout",
        at - sent_quick
    );
    wait_blocked(&mut c, 1);
    assert!(
        !slow.handle.is_finished(),
        "the 1500 ms waiter got a reply at the 100 ms waiter's timeout"
    );
    let (reply, at) = slow.reply();
    assert_eq!(reply, Ok(Value::Nil));
    assert!(
        at - sent_slow >= Duration::from_millis(1500),
        "slow: nil after {:?}, before its 1500 ms timeout",
        at - sent_slow
    );
    wait_blocked(&mut c, 0);

    // A waiter granted before its timeout: the timer armed for it finds nothing due, and the
    // waiter queued after it (a later timeout) still gets its nil on time.
    let granted = Waiter::start(&server, &mut c, &key, "granted", WAITER_TTL, "200");
    let sent_late = Instant::now();
    let late = Waiter::start(&server, &mut c, &key, "late", WAITER_TTL, "600");
    let token = release_to(&mut c, &key, "holder", granted, holder_token);
    let (reply, at) = late.reply();
    assert_eq!(reply, Ok(Value::Nil));
    assert!(
        at - sent_late >= Duration::from_millis(600),
        "late: nil after {:?}, before its 600 ms timeout",
        at - sent_late
    );
    assert_held(&mut c, &key, token, WAITER_TTL);
    assert_eq!(
        info_field(&mut c, "lock", "lock_timed_out").as_deref(),
        Some("3")
    );
    release_last(&mut c, &key, "granted");
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
