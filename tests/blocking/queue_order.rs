//! The FIFO queue: waiters are granted in arrival order with increasing tokens, a non-blocking
//! acquire never barges ahead of them, and the holder itself never waits.

use super::*;

#[test]
fn waiters_are_granted_in_arrival_order_with_increasing_tokens() {
    let (server, mut c, key, holder_token) = held_key();

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
    let (server, mut c, key, holder_token) = held_key();
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
    release_last(&mut c, &key, "waiter");
}

#[test]
fn holder_reacquiring_with_block_gets_its_own_token_at_once() {
    let (server, mut c) = start();
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
    release_last(&mut c, &key, "waiter");
}
