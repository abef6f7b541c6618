//! `LOCKDELAY`: after a hold is lost uncleanly (its session expired or its connection closed,
//! or a plain hold expired), nobody gets what it had for that long. The queue keeps its order,
//! the key keeps its type and shows `delayed`; a clean release or `CLOSE` has no delay.

use super::*;

const DELAY: i64 = 400;

/// The lower bound on a delayed grant, measured from a moment the test takes *before* the
/// event that started the delay (so the server's start is later): the delay less 2 ms for
/// the two clocks' millisecond rounding.
fn assert_waited_the_delay(from: Instant, at: Instant, what: &str) {
    let waited = at - from;
    assert!(
        waited >= Duration::from_millis(DELAY as u64 - 2),
        "{what}: granted after {waited:?}, before the {DELAY} ms delay"
    );
}

#[test]
fn a_lost_session_keeps_its_keys_for_the_delay() {
    let (server, mut c) = start();
    let (key, other) = (new_key(), new_key());
    let mut holder = server.conn();
    let id = open(
        &mut holder,
        30_000,
        &["BOUND", "LOCKDELAY", &DELAY.to_string()],
    );
    let old = acquire_in(&mut holder, &key, "holder", 0, &id, &[]);
    acquire_in(&mut holder, &other, "holder", 0, &id, &[]);
    let w1 = Waiter::start(
        &server,
        &mut c,
        "LOCK.ACQUIRE",
        &[&key, "w1", "30000", "BLOCK", "20000"],
    );
    let w2 = Waiter::start(
        &server,
        &mut c,
        "LOCK.ACQUIRE",
        &[&key, "w2", "30000", "BLOCK", "20000"],
    );
    let victim = client_id(&mut holder);
    let before_kill = Instant::now();
    redis::cmd("CLIENT")
        .arg(&["KILL", "ID", &victim.to_string()])
        .query::<i64>(&mut c)
        .unwrap();
    wait_until("the session ended", Duration::from_secs(5), || {
        keepalive(&mut c, &id).is_none()
    });
    // In the delay: no holder, never free, the type stays, and a non-blocking acquire is nil.
    let Some(Value::Int(delayed)) = lock_info_field(&mut c, &key, "delayed") else {
        panic!(
            "LOCK.INFO shows no delay: {:?}",
            call(&mut c, "LOCK.INFO", &[&key])
        )
    };
    assert!((1..=DELAY).contains(&delayed), "{delayed}");
    assert_eq!(
        lock_info_field(&mut c, &key, "holders"),
        Some(Value::Array(vec![]))
    );
    assert_eq!(lock_info_field(&mut c, &key, "owner"), None);
    assert_eq!(fence(&mut c, &key), None, "a delayed key fences nothing");
    assert_eq!(key_type(&mut c, &key), "redislock");
    assert!((1..=DELAY).contains(&pttl(&mut c, &key)));
    assert_eq!(acquire(&mut c, &other, "someone", 1000), None);
    assert_eq!(info_int(&mut c, "lock", "lock_keys_in_lock_delay"), 2);
    // The queue is served in order when the delay ends.
    let (t1, at1) = w1.granted();
    assert_waited_the_delay(before_kill, at1, "w1");
    assert!(t1 > old);
    assert_eq!(release(&mut c, &key, "w1"), 1);
    assert!(w2.granted().0 > t1);
    wait_until("the other key is free", Duration::from_secs(5), || {
        acquire(&mut c, &other, "someone", 1000).is_some()
    });
    assert_eq!(info_int(&mut c, "lock", "lock_keys_in_lock_delay"), 0);
}

#[test]
fn close_and_release_have_no_delay() {
    let (server, mut c) = start();
    let id = open(&mut c, 30_000, &["LOCKDELAY", "60000"]);
    let (a, b) = (new_key(), new_key());
    acquire_in(&mut c, &a, "me", 0, &id, &[]);
    acquire_in(&mut c, &b, "me", 0, &id, &[]);
    assert_eq!(release(&mut c, &b, "me"), 1);
    assert!(
        acquire(&mut c, &b, "next", 1000).is_some(),
        "RELEASE: no delay"
    );
    let waiter = Waiter::start(
        &server,
        &mut c,
        "LOCK.ACQUIRE",
        &[&a, "next", "1000", "BLOCK", "20000"],
    );
    assert_eq!(session(&mut c, "CLOSE", &[&id]), Ok(Value::Int(1)));
    // A CLOSE starts no lock-delay: the key was never counted in one, and the waiter is granted.
    assert_eq!(
        info_int(&mut c, "lock", "lock_keys_in_lock_delay"),
        0,
        "CLOSE"
    );
    waiter.granted();
}

#[test]
fn a_plain_lock_with_lockdelay_stays_taken_after_it_expires() {
    let (server, mut c) = start();
    let key = new_key();
    let ttl = 150;
    let granted = Instant::now();
    match acquire_with(
        &mut c,
        &key,
        "holder",
        ttl,
        &["LOCKDELAY", &DELAY.to_string()],
    ) {
        Ok(Value::Int(t)) if t > 0 => {}
        other => panic!("{other:?}"),
    }
    let waiter = Waiter::start(
        &server,
        &mut c,
        "LOCK.ACQUIRE",
        &[&key, "next", "1000", "BLOCK", "20000"],
    );
    wait_until("the hold expired", Duration::from_secs(5), || {
        fence(&mut c, &key).is_none()
    });
    assert_eq!(acquire(&mut c, &key, "barger", 1000), None);
    assert!(matches!(lock_info_field(&mut c, &key, "delayed"), Some(Value::Int(d)) if d > 0));
    let (_, at) = waiter.granted();
    let waited = at - granted;
    assert!(
        waited >= Duration::from_millis((ttl + DELAY - 2) as u64),
        "granted {waited:?} after the grant, before ttl + delay"
    );
    // A clean release of a plain hold with LOCKDELAY: no delay.
    let k2 = new_key();
    acquire_with(&mut c, &k2, "holder", 10_000, &["LOCKDELAY", "60000"]).unwrap();
    assert_eq!(release(&mut c, &k2, "holder"), 1);
    assert!(acquire(&mut c, &k2, "next", 1000).is_some());
}

#[test]
fn a_delayed_permit_blocks_only_itself() {
    let (server, mut c) = start();
    let sem = new_key();
    let mut holder = server.conn();
    let id = open(
        &mut holder,
        30_000,
        &["BOUND", "LOCKDELAY", &DELAY.to_string()],
    );
    acquire_in(&mut holder, &sem, "lost", 0, &id, &["SHARED", "LIMIT", "3"]);
    must_shared(&mut c, &sem, "kept");
    let victim = client_id(&mut holder);
    redis::cmd("CLIENT")
        .arg(&["KILL", "ID", &victim.to_string()])
        .query::<i64>(&mut c)
        .unwrap();
    wait_until("the session ended", Duration::from_secs(5), || {
        keepalive(&mut c, &id).is_none()
    });
    // Three permits: one delayed, one held, one free.
    must_shared(&mut c, &sem, "third");
    assert_eq!(
        acquire_with(&mut c, &sem, "fourth", 1000, &["SHARED", "LIMIT", "3"]),
        Ok(Value::Nil)
    );
    wait_until(
        "the delayed permit comes back",
        Duration::from_secs(5),
        || {
            acquire_with(&mut c, &sem, "fourth", 1000, &["SHARED", "LIMIT", "3"])
                .is_ok_and(|v| matches!(v, Value::Int(_)))
        },
    );
}

#[test]
fn a_multi_key_waiter_waits_for_a_delayed_key() {
    let (server, mut c) = start();
    let (a, b) = (new_key(), new_key());
    let mut holder = server.conn();
    let id = open(
        &mut holder,
        30_000,
        &["BOUND", "LOCKDELAY", &DELAY.to_string()],
    );
    acquire_in(&mut holder, &a, "holder", 0, &id, &[]);
    let waiter = Waiter::start(
        &server,
        &mut c,
        "LOCK.MACQUIRE",
        &["2", &a, &b, "next", "5000", "BLOCK", "20000"],
    );
    let victim = client_id(&mut holder);
    let before_kill = Instant::now();
    redis::cmd("CLIENT")
        .arg(&["KILL", "ID", &victim.to_string()])
        .query::<i64>(&mut c)
        .unwrap();
    match waiter.reply() {
        (Ok(Value::Array(tokens)), at) => {
            assert_eq!(tokens.len(), 2);
            assert_waited_the_delay(before_kill, at, "MACQUIRE");
        }
        other => panic!("{other:?}"),
    }
}

#[track_caller]
fn must_shared(c: &mut Connection, key: &str, owner: &str) {
    match acquire_with(c, key, owner, 30_000, &["SHARED", "LIMIT", "3"]) {
        Ok(Value::Int(t)) if t > 0 => {}
        other => panic!("{owner}: {other:?}"),
    }
}
