//! Bounded overtaking (`LOCK.MACQUIRE ... BLOCK`): a set whose keys are all free is granted
//! ahead of sets queued before it that wait on a busy key, at most `lock.max-overtakes` (8)
//! times per overtaken set, and never with `lock.max-overtakes 0`; single-key waiters are never
//! passed; a non-blocking call never barges.

use super::*;

/// `lock.max-overtakes`' default: `DEFAULT_MAX_OVERTAKES` (src/lock/multi.rs), docs/commands.md.
const MAX_OVERTAKES: usize = 8;

/// `LOCK.MACQUIRE keys owner WAITER_TTL BLOCK 0` on `c`, which must be granted at once.
#[track_caller]
fn granted_at_once(c: &mut Connection, keys: &[String], owner: &str) -> Vec<i64> {
    let args = macquire_args(keys, owner, WAITER_TTL, &["BLOCK", "0"]);
    tokens(call(c, "LOCK.MACQUIRE", &args)).unwrap_or_else(|| panic!("{owner}: nil"))
}

#[test]
fn a_set_whose_keys_are_free_goes_ahead_of_a_set_waiting_on_a_busy_key() {
    let (server, mut c) = start();
    let ks = keys(3);
    let h = must_acquire(&mut c, &ks[0], "holder", LONG_TTL);
    // w waits for ks[0] (busy); ks[1] of its set is free.
    let w = Blocked::set(&server, &mut c, &ks[..2], "w", "0");
    // A later blocking set on the free ks[1] and ks[2] is granted at once, ahead of w.
    let mut c2 = server.conn();
    let got = granted_at_once(&mut c2, &ks[1..], "later");
    for (key, token) in ks[1..].iter().zip(&got) {
        assert_held(&mut c, key, *token, WAITER_TTL);
    }
    assert_eq!(blocked_clients(&mut c), 1);
    assert_eq!(lock_info_field(&mut c, "waiting_keys"), 2);
    assert_eq!(mrelease(&mut c, &ks[1..], "later"), 2);
    // A non-blocking call still never barges past the queued set.
    assert_eq!(macquire(&mut c, &ks[1..], "barger", LONG_TTL), None);
    assert_all_absent(&mut c, &ks[1..]);
    assert_eq!(release(&mut c, &ks[0], "holder"), 1);
    let t = w.tokens();
    assert!(t.iter().all(|t| *t > got[1] && *t > h));
    assert_eq!(mrelease(&mut c, &ks[..2], "w"), 2);
}

#[test]
fn with_max_overtakes_0_a_set_waiting_on_a_busy_key_keeps_its_free_keys() {
    let (server, mut c) = start();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("lock.max-overtakes")
        .arg("0")
        .query(&mut c)
        .unwrap();
    let ks = keys(3);
    let h = must_acquire(&mut c, &ks[0], "holder", LONG_TTL);
    let w = Blocked::set(&server, &mut c, &ks[..2], "w", "0"); // waits for ks[0]
                                                               // The later set on the free ks[1] and ks[2] queues behind w instead of passing it.
    let later = Blocked::set(&server, &mut c, &ks[1..], "later", "0");
    assert_eq!(blocked_clients(&mut c), 2);
    assert_all_absent(&mut c, &ks[1..]);
    assert_eq!(lock_info_field(&mut c, "sets_overtaken"), 0);
    // Arrival order: w first, then `later`.
    assert_eq!(release(&mut c, &ks[0], "holder"), 1);
    let t = w.tokens();
    assert!(t.iter().all(|t| *t > h));
    assert_eq!(blocked_clients(&mut c), 1);
    assert_eq!(mrelease(&mut c, &ks[..2], "w"), 2);
    let got = later.tokens();
    assert!(got[0] > t[1]);
    assert_eq!(mrelease(&mut c, &ks[1..], "later"), 2);
    assert_eq!(lock_info_field(&mut c, "sets_overtaken"), 0);
}

#[test]
fn a_queued_set_passes_when_its_last_busy_key_frees_from_a_release_or_a_deadline() {
    let (server, mut c) = start();
    let ks = keys(3);
    for how in ["release", "deadline"] {
        must_acquire(&mut c, &ks[0], "h0", LONG_TTL);
        let ttl = if how == "release" { LONG_TTL } else { 300 };
        must_acquire(&mut c, &ks[2], "h2", ttl);
        let w = Blocked::set(&server, &mut c, &ks[..2], "w", "0"); // waits for ks[0]
        let later = Blocked::set(&server, &mut c, &ks[1..], "later", "0"); // for ks[2]
        if how == "release" {
            assert_eq!(release(&mut c, &ks[2], "h2"), 1);
        }
        // ks[2] frees: `later` is granted ks[1] and ks[2] ahead of w, which still waits.
        let got = later.tokens();
        assert_held(&mut c, &ks[1], got[0], WAITER_TTL);
        assert_held(&mut c, &ks[2], got[1], WAITER_TTL);
        assert_eq!(blocked_clients(&mut c), 1, "{how}");
        // w now waits for ks[0] and for `later`'s ks[1]; it goes when both are free.
        assert_eq!(release(&mut c, &ks[0], "h0"), 1);
        assert_eq!(blocked_clients(&mut c), 1, "{how}");
        assert_absent(&mut c, &ks[0]);
        assert_eq!(mrelease(&mut c, &ks[1..], "later"), 2);
        let t = w.tokens();
        assert!(t[1] > got[0], "{how}");
        assert_eq!(mrelease(&mut c, &ks[..2], "w"), 2);
        assert_eq!(lock_info_field(&mut c, "waiting_keys"), 0, "{how}");
    }
}

#[test]
fn a_set_is_overtaken_at_most_max_overtakes_times_then_its_free_keys_wait_for_it() {
    let (server, mut c) = start();
    let ks = keys(3);
    must_acquire(&mut c, &ks[0], "holder", LONG_TTL);
    let w = Blocked::set(&server, &mut c, &ks[..2], "w", "0");
    let mut c2 = server.conn();
    let mut last = 0;
    for i in 0..MAX_OVERTAKES {
        let owner = format!("later-{i}");
        let got = granted_at_once(&mut c2, &ks[1..], &owner);
        assert!(got[0] > last, "overtake {i}");
        last = got[1];
        assert_eq!(mrelease(&mut c2, &ks[1..], &owner), 2);
    }
    assert_eq!(
        lock_info_field(&mut c, "sets_overtaken"),
        MAX_OVERTAKES as i64
    );
    // The bound is reached: the next set waits, and ks[1] stays free for w.
    let next = Blocked::set(&server, &mut c, &ks[1..], "next", "0");
    assert_eq!(blocked_clients(&mut c), 2);
    assert_eq!(
        lock_info_field(&mut c, "sets_overtaken"),
        MAX_OVERTAKES as i64
    );
    assert_all_absent(&mut c, &ks[1..]);
    assert_eq!(release(&mut c, &ks[0], "holder"), 1);
    let t = w.tokens();
    assert!(t[0] > last);
    assert_eq!(blocked_clients(&mut c), 1);
    assert_eq!(mrelease(&mut c, &ks[..2], "w"), 2);
    let n = next.tokens();
    assert!(n[0] > t[1]);
    assert_eq!(mrelease(&mut c, &ks[1..], "next"), 2);
}

#[test]
fn single_key_waiters_are_never_passed_and_never_pass() {
    let (server, mut c) = start();
    let ks = keys(3);
    must_acquire(&mut c, &ks[0], "holder", LONG_TTL);
    let w = Blocked::set(&server, &mut c, &ks[..2], "w", "0"); // waits for ks[0]
    let single = Blocked::one(&server, &mut c, &ks[1], "single"); // behind w on free ks[1]
                                                                  // A later set on the free ks[1] and ks[2] would pass w, but not the single-key waiter.
    let later = Blocked::set(&server, &mut c, &ks[1..], "later", "0");
    assert_eq!(blocked_clients(&mut c), 3);
    assert_all_absent(&mut c, &ks[1..]);
    // A single-key waiter on a free key behind a set does not pass it either.
    assert_eq!(release(&mut c, &ks[0], "holder"), 1);
    let t = w.tokens();
    assert_eq!(blocked_clients(&mut c), 2);
    assert_eq!(mrelease(&mut c, &ks[..2], "w"), 2);
    let s = single.token();
    assert!(s > t[1]);
    assert_eq!(blocked_clients(&mut c), 1);
    assert_eq!(release(&mut c, &ks[1], "single"), 1);
    let l = later.tokens();
    assert!(l[0] > s);
    assert_eq!(mrelease(&mut c, &ks[1..], "later"), 2);
}
