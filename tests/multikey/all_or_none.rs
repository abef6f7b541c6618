//! Without `BLOCK`: all keys or none, in key order with increasing tokens; the idempotent retry
//! on a partly held set; no barging past a queued waiter; `LOCK.MRELEASE` releases only what
//! the owner holds.

use super::*;

#[test]
fn free_keys_are_all_granted_with_increasing_tokens_in_key_order() {
    let (_server, mut c) = start();
    let ks = keys(3);
    let got = macquire(&mut c, &ks, "order-1", LONG_TTL).expect("a grant");
    assert_eq!(got.len(), 3);
    assert!(got.windows(2).all(|w| w[0] < w[1]), "tokens {got:?}");
    for (key, token) in ks.iter().zip(&got) {
        assert_held(&mut c, key, *token, LONG_TTL);
        assert_eq!(acquire(&mut c, key, "other", LONG_TTL), None);
    }
    // One deadline for the set: the keys' expiries were set from the same `now`.
    let ttls: Vec<i64> = ks.iter().map(|k| pttl(&mut c, k)).collect();
    assert!(
        ttls.iter().max().unwrap() - ttls.iter().min().unwrap() <= 5,
        "{ttls:?}"
    );

    assert_eq!(mrelease(&mut c, &ks, "order-1"), 3);
    assert_all_absent(&mut c, &ks);
    assert_eq!(mrelease(&mut c, &ks, "order-1"), 0);
}

#[test]
fn one_busy_key_refuses_the_whole_set_and_changes_nothing() {
    let (_server, mut c) = start();
    let ks = keys(3);
    let held = must_acquire(&mut c, &ks[2], "someone", LONG_TTL);
    assert_eq!(macquire(&mut c, &ks, "order-1", LONG_TTL), None);
    assert_all_absent(&mut c, &ks[..2]);
    assert_held(&mut c, &ks[2], held, LONG_TTL);
    assert_eq!(mrelease(&mut c, &ks, "order-1"), 0);
    assert_held(&mut c, &ks[2], held, LONG_TTL);
    // Once it is free the set is granted.
    assert_eq!(release(&mut c, &ks[2], "someone"), 1);
    let got = macquire(&mut c, &ks, "order-1", LONG_TTL).expect("a grant");
    assert!(got.iter().all(|t| *t > held));
}

#[test]
fn a_partly_held_set_is_an_idempotent_retry() {
    let (_server, mut c) = start();
    let ks = keys(3);
    let mine = must_acquire(&mut c, &ks[1], "order-1", 1_000);
    let got = macquire(&mut c, &ks, "order-1", LONG_TTL).expect("a grant");
    assert_eq!(got[1], mine, "the held key keeps its token");
    assert!(got[0] > mine && got[2] > got[0]);
    // Its deadline moved with the others.
    assert!(pttl(&mut c, &ks[1]) > 1_000);
    // The whole retry again: the same tokens.
    assert_eq!(
        macquire(&mut c, &ks, "order-1", LONG_TTL),
        Some(got.clone())
    );
    // Single-key retries agree.
    assert_eq!(acquire(&mut c, &ks[0], "order-1", LONG_TTL), Some(got[0]));
}

#[test]
fn a_freed_key_goes_to_its_queued_waiter_not_to_a_later_set() {
    let (server, mut c) = start();
    let ks = keys(2);
    must_acquire(&mut c, &ks[1], "holder", LONG_TTL);
    let waiter = Blocked::one(&server, &mut c, &ks[1], "waiter");
    // Freed by its holder: the waiter is granted it, not the set.
    assert_eq!(release(&mut c, &ks[1], "holder"), 1);
    let token = waiter.token();
    assert_eq!(macquire(&mut c, &ks, "order-1", LONG_TTL), None);
    assert_held(&mut c, &ks[1], token, WAITER_TTL);
    assert_absent(&mut c, &ks[0]);
}

#[test]
fn mrelease_releases_only_what_owner_holds_and_hands_keys_to_waiters() {
    let (server, mut c) = start();
    let ks = keys(3);
    macquire(&mut c, &ks[..2], "order-1", LONG_TTL).expect("a grant");
    let other = must_acquire(&mut c, &ks[2], "order-2", LONG_TTL);
    let waiter = Blocked::one(&server, &mut c, &ks[0], "waiter");
    assert_eq!(mrelease(&mut c, &ks, "order-1"), 2);
    let token = waiter.token();
    assert_held(&mut c, &ks[0], token, WAITER_TTL);
    assert_absent(&mut c, &ks[1]);
    assert_held(&mut c, &ks[2], other, LONG_TTL);
}
