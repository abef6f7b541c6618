use super::*;
use crate::lock::WaitQueue;

const T0: Millis = 1_700_000_000_000;
const X: Mode = Mode::Exclusive;
const S: Mode = Mode::Shared { limit: None };

fn sem(n: u64) -> Mode {
    Mode::Shared { limit: Some(n) }
}

fn hold(owner: &str, token: u64, deadline: Millis) -> Hold {
    Hold {
        owner: owner.as_bytes().into(),
        token,
        deadline,
        granted_at: 0,
        session: 0,
        delay: 0,
    }
}

/// A key held by `holders` (owner, deadline) in `mode`, tokens 1, 2, ...
fn held(mode: Mode, holders: &[(&str, Millis)]) -> Lock {
    let mut lock = Lock::new(mode, hold(holders[0].0, 1, holders[0].1));
    for (i, (o, d)) in holders.iter().enumerate().skip(1) {
        lock.admit(mode, hold(o, i as u64 + 1, *d));
    }
    lock
}

/// The queue scan as the server runs it: admit the head while it can be admitted, fail a
/// head that conflicts, stop at the first that must wait. Returns the owners granted.
fn serve(lock: &mut Option<Lock>, queue: &mut WaitQueue<(&str, Mode)>, now: Millis) -> Vec<String> {
    let mut granted = vec![];
    let mut token = 100;
    loop {
        let head = queue.iter().next().copied();
        let Some((owner, mode)) = head else { break };
        match decide_acquire(lock.as_ref(), owner.as_bytes(), mode, 0, now, false) {
            Ok(Acquire::Busy) => break,
            Err(_) => {}
            Ok(_) => {
                token += 1;
                let h = hold(owner, token, now + 1000);
                match lock {
                    Some(l) => l.admit(mode, h),
                    None => *lock = Some(Lock::new(mode, h)),
                }
                granted.push(owner.to_string());
            }
        }
        queue.pop_front();
    }
    granted
}

fn queue<'a>(waiters: &[(&'a str, Mode)]) -> WaitQueue<(&'a str, Mode)> {
    let mut q = WaitQueue::default();
    for w in waiters {
        q.push(*w, 100).unwrap();
    }
    q
}

#[test]
fn free_key_is_granted_in_any_mode() {
    for mode in [X, S, sem(1), sem(4)] {
        assert_eq!(
            decide_acquire(None, b"a", mode, 0, T0, false),
            Ok(Acquire::Grant)
        );
        assert_eq!(
            decide_acquire(None, b"a", mode, 0, T0, true),
            Ok(Acquire::ServeQueue)
        );
    }
}

#[test]
fn exclusive_excludes_everyone_and_is_excluded_by_everyone() {
    let x = held(X, &[("a", T0 + 100)]);
    let s = held(S, &[("r", T0 + 100)]);
    for mode in [X, S, sem(3)] {
        assert_eq!(
            decide_acquire(Some(&x), b"b", mode, 0, T0, false),
            Ok(Acquire::Busy)
        );
    }
    assert_eq!(
        decide_acquire(Some(&s), b"w", X, 0, T0, false),
        Ok(Acquire::Busy)
    );
}

#[test]
fn readers_share_and_a_semaphore_counts_permits() {
    let s = held(S, &[("r1", T0 + 100), ("r2", T0 + 100)]);
    assert_eq!(
        decide_acquire(Some(&s), b"r3", S, 0, T0, false),
        Ok(Acquire::Grant)
    );
    let full = held(sem(2), &[("p1", T0 + 100), ("p2", T0 + 200)]);
    assert_eq!(
        decide_acquire(Some(&full), b"p3", sem(2), 0, T0, false),
        Ok(Acquire::Busy)
    );
    let one_left = held(sem(3), &[("p1", T0 + 100), ("p2", T0 + 200)]);
    assert_eq!(
        decide_acquire(Some(&one_left), b"p3", sem(3), 0, T0, false),
        Ok(Acquire::Grant)
    );
}

#[test]
fn each_holder_expires_at_its_own_deadline() {
    let full = held(sem(2), &[("p1", T0 + 100), ("p2", T0 + 200)]);
    assert_eq!(
        decide_acquire(Some(&full), b"p3", sem(2), 0, T0 + 99, false),
        Ok(Acquire::Busy)
    );
    // p1's deadline frees one permit, exactly at that millisecond.
    assert_eq!(
        decide_acquire(Some(&full), b"p3", sem(2), 0, T0 + 100, false),
        Ok(Acquire::Grant)
    );
    assert_eq!(full.live_count(T0 + 100), 1);
    assert_eq!(full.next_expiry(T0), Some(T0 + 100));
    assert_eq!(full.next_expiry(T0 + 100), Some(T0 + 200));
    assert_eq!(full.key_deadline(), Some(T0 + 200));
    // An exclusive acquire waits for every permit.
    assert_eq!(
        decide_acquire(Some(&full), b"w", X, 0, T0 + 150, false),
        Ok(Acquire::Busy)
    );
    assert_eq!(
        decide_acquire(Some(&full), b"w", X, 0, T0 + 200, false),
        Ok(Acquire::Grant)
    );
    // Fencing follows the live holders.
    assert!(full.fences(1, T0 + 99) && !full.fences(1, T0 + 100));
    assert_eq!(full.max_token(T0), Some(2));
    assert_eq!(full.max_token(T0 + 200), None);
}

#[test]
fn an_exclusive_hold_expires_at_the_exact_deadline() {
    let x = held(X, &[("a", T0 + 100)]);
    assert_eq!(
        decide_acquire(Some(&x), b"b", X, 0, T0 + 99, false),
        Ok(Acquire::Busy)
    );
    assert_eq!(
        decide_acquire(Some(&x), b"b", X, 0, T0 + 100, false),
        Ok(Acquire::Grant)
    );
    // The old owner's retry after expiry is a fresh grant, not a retry of the old token.
    assert_eq!(
        decide_acquire(Some(&x), b"a", X, 0, T0 + 100, false),
        Ok(Acquire::Grant)
    );
    assert!(held_by(Some(&x), b"a", T0 + 99) && !held_by(Some(&x), b"a", T0 + 100));
    assert!(!held_by(Some(&x), b"b", T0) && !held_by(None, b"a", T0));
    assert!(x.fences(1, T0 + 99) && !x.fences(1, T0 + 100) && !x.fences(2, T0));
    // Waiters queued on a free key go first.
    assert_eq!(
        decide_acquire(Some(&x), b"b", X, 0, T0 + 100, true),
        Ok(Acquire::ServeQueue)
    );
}

#[test]
fn retry_in_the_same_mode_keeps_the_token() {
    let s = held(sem(2), &[("p1", T0 + 100), ("p2", T0 + 100)]);
    // Even with the semaphore full and waiters queued: the holder is not a newcomer.
    assert_eq!(
        decide_acquire(Some(&s), b"p2", sem(2), 0, T0, true),
        Ok(Acquire::Retry { token: 2 })
    );
    let x = held(X, &[("a", T0 + 100)]);
    assert_eq!(
        decide_acquire(Some(&x), b"a", X, 0, T0, true),
        Ok(Acquire::Retry { token: 1 })
    );
}

#[test]
fn holding_in_the_other_mode_is_an_error() {
    let s = held(S, &[("a", T0 + 100)]);
    assert_eq!(
        decide_acquire(Some(&s), b"a", X, 0, T0, false),
        Err(Conflict::OtherMode { held: S })
    );
    let x = held(X, &[("a", T0 + 100)]);
    assert_eq!(
        decide_acquire(Some(&x), b"a", sem(2), 0, T0, false),
        Err(Conflict::OtherMode { held: X })
    );
    // After the hold expired there is nothing to conflict with.
    assert_eq!(
        decide_acquire(Some(&x), b"a", S, 0, T0 + 100, false),
        Ok(Acquire::Grant)
    );
}

#[test]
fn the_first_shared_grant_fixes_the_limit() {
    let s = held(sem(2), &[("p1", T0 + 100)]);
    for (mode, owner) in [(sem(3), "p9"), (S, "p9"), (sem(3), "p1")] {
        assert_eq!(
            decide_acquire(Some(&s), owner.as_bytes(), mode, 0, T0, false),
            Err(Conflict::Limit { limit: Some(2) }),
            "{mode:?} by {owner}"
        );
    }
    let unlimited = held(S, &[("r", T0 + 100)]);
    assert_eq!(
        decide_acquire(Some(&unlimited), b"p", sem(2), 0, T0, false),
        Err(Conflict::Limit { limit: None })
    );
    // Exclusive acquires take no limit: they just wait.
    assert_eq!(
        decide_acquire(Some(&s), b"w", X, 0, T0, false),
        Ok(Acquire::Busy)
    );
    // Once every shared holder is gone, a new limit is fine.
    assert_eq!(
        decide_acquire(Some(&s), b"p9", sem(5), 0, T0 + 100, false),
        Ok(Acquire::Grant)
    );
}

#[test]
fn admit_replaces_joins_or_takes_over() {
    let mut l = held(S, &[("r1", T0 + 100)]);
    l.admit(S, hold("r2", 5, T0 + 50));
    l.admit(S, hold("r1", 6, T0 + 300)); // same owner: its entry, not a second one
    assert_eq!(l.len(), 2);
    assert_eq!(l.holder(b"r1", T0).map(|h| h.token), Some(6));
    assert_eq!(l.key_deadline(), Some(T0 + 300));
    l.admit(X, hold("w", 7, T0 + 10));
    assert_eq!((l.mode(), l.len()), (X, 1));
    l.admit(sem(2), hold("p", 8, T0 + 10));
    assert_eq!((l.mode(), l.len()), (sem(2), 1));
}

#[test]
fn prune_remove_and_set_deadline() {
    let mut l = held(S, &[("a", T0 + 100), ("b", T0 + 200), ("c", T0 + 300)]);
    assert_eq!(l.prune(T0 + 200), 2);
    assert_eq!(l.len(), 1);
    assert!(l.set_deadline(b"c", T0 + 50, T0));
    assert!(
        !l.set_deadline(b"c", T0 + 60, T0 + 50),
        "expired: nothing to extend"
    );
    assert!(!l.set_deadline(b"zz", T0 + 60, T0));
    assert_eq!(l.remove(b"c").map(|h| h.token), Some(3));
    assert_eq!(l.remove(b"c"), None);
    assert!(!held_by(Some(&l), b"c", T0));
}

#[test]
fn the_typical_lock_is_one_64_byte_value() {
    // jemalloc's 64-byte class: one owner byte more inline and it would take 72 (in the
    // 80-byte class).
    assert_eq!(std::mem::size_of::<Lock>(), 64);
    let uuid = "0b8f2c2e-6c1a-4f7e-9d0a-3f5b6e7c8d9e";
    let mut h = hold(uuid, 7, T0 + 100);
    h.granted_at = T0;
    let l = Lock::new(X, h.clone());
    assert_eq!(l.heap_bytes(), 0, "owner inline, no other allocation");
    assert_eq!(l.holders().collect::<Vec<_>>(), [h.view()]);
    assert_eq!((l.mode(), l.len()), (X, 1));
    let longest = "o".repeat(INLINE_OWNER);
    assert_eq!(Lock::new(X, hold(&longest, 1, T0)).heap_bytes(), 0);
}

#[test]
fn other_values_keep_their_holders_in_a_vec() {
    // Each shared holder: 56 bytes in the holders' buffer (plus its owner's allocation).
    assert_eq!(std::mem::size_of::<Hold>(), 56);
    let long = "o".repeat(INLINE_OWNER + 1);
    let mut in_session = hold("a", 1, T0 + 100);
    in_session.session = 9;
    let mut delayed = hold("a", 1, T0 + 100);
    delayed.delay = 50;
    for (mode, h) in [
        (X, hold(&long, 1, T0 + 100)),
        (X, in_session),
        (X, delayed),
        (S, hold("a", 1, T0 + 100)),
    ] {
        let l = Lock::new(mode, h.clone());
        assert!(l.heap_bytes() > 0, "{mode:?} {h:?}");
        assert_eq!(l.holders().collect::<Vec<_>>(), [h.view()]);
        assert_eq!(l.entry(&h.owner), Some(h.view()));
    }
}

#[test]
fn the_inline_form_behaves_like_any_other() {
    let mut h = hold("a", 3, T0 + 100);
    h.granted_at = T0;
    let mut l = Lock::new(X, h.clone());
    assert!(l.set_deadline(b"a", T0 + 200, T0));
    assert!(!l.set_deadline(b"b", T0 + 300, T0));
    assert!(!l.set_deadline(b"a", T0 + 300, T0 + 200), "expired");
    assert_eq!(l.key_deadline(), Some(T0 + 200));
    assert_eq!(l.prune(T0 + 199), 0);
    assert_eq!(l.remove(b"b"), None);
    let out = l.remove(b"a").unwrap();
    assert_eq!((out.token, out.deadline, out.granted_at), (3, T0 + 200, T0));
    assert!(l.is_empty() && l.key_deadline().is_none());
    // Refilled for a handoff, then expired by a prune.
    l.admit(X, hold("b", 4, T0 + 300));
    assert_eq!(l, Lock::new(X, hold("b", 4, T0 + 300)));
    assert_eq!(l.prune(T0 + 300), 1);
    assert!(l.is_empty() && l.mode() == X);
    // An exclusive grant over shared holders, and shared over exclusive.
    let mut l = held(S, &[("r1", T0 + 100), ("r2", T0 + 100)]);
    l.admit(X, hold("w", 5, T0 + 100));
    assert_eq!((l.heap_bytes(), l.mode()), (0, X));
    l.admit(S, hold("r", 6, T0 + 100));
    assert_eq!((l.mode(), l.len()), (S, 1));
}

#[test]
fn discard_removes_like_remove_and_tells_the_session() {
    let mut in_session = hold("s", 2, T0 + 100);
    in_session.session = 9;
    for (mode, h, session) in [
        (X, hold("a", 1, T0 + 100), 0),
        (X, in_session, 9),
        (S, hold("a", 1, T0 + 100), 0),
    ] {
        let mut l = Lock::new(mode, h.clone());
        assert_eq!(l.discard(b"zz"), None, "{h:?}");
        assert_eq!(l, Lock::new(mode, h.clone()), "nothing removed");
        let mut removed = l.clone();
        assert_eq!(l.discard(&h.owner), Some(session), "{h:?}");
        assert_eq!(removed.remove(&h.owner), Some(h.clone()));
        assert_eq!(l, removed, "the same value as after remove");
        assert!(l.is_empty() && l.key_deadline().is_none());
        assert_eq!(l.discard(&h.owner), None);
    }
    // Out of several holders: the others stay.
    let mut l = held(S, &[("r1", T0 + 100), ("r2", T0 + 200)]);
    assert_eq!(l.discard(b"r1"), Some(0));
    assert_eq!(l.holders().map(|h| h.owner).collect::<Vec<_>>(), [b"r2"]);
}

#[test]
fn the_form_is_canonical() {
    let plain = hold("a", 1, T0 + 100);
    let packed = Lock::new(X, plain.clone());
    assert_eq!(Lock::from_holders(X, vec![plain.clone()]), packed);
    // A hold that leaves its session (its key renamed) is a plain hold again.
    let mut in_session = plain.clone();
    in_session.session = 9;
    let mut l = Lock::new(X, in_session.clone());
    assert_eq!(
        l.end_session_hold(b"a", 8, T0, false),
        None,
        "other session"
    );
    // Lost at T0 + 50 with no lock-delay: free at once, so the prune takes it.
    assert_eq!(l.end_session_hold(b"a", 9, T0 + 50, false), Some((1, true)));
    assert!(l.is_empty());
    let mut l = Lock::new(X, in_session.clone());
    assert_eq!(l.end_session_hold(b"a", 9, T0, true), Some((1, true)));
    assert!(l.is_empty());
    let mut l = Lock::new(X, in_session);
    l.update_session_holds(|h| h.session = 0);
    assert_eq!(l, packed);
    // The last shared holder going leaves a shared key, not an exclusive one.
    let mut l = held(S, &[("r1", T0 + 100), ("r2", T0 + 100)]);
    l.remove(b"r1");
    assert_eq!((l.mode(), l.len()), (S, 1));
}

#[test]
fn readers_behind_a_writer_are_admitted_together() {
    let mut lock = Some(held(X, &[("w", T0 + 100)]));
    let mut q = queue(&[("r1", S), ("r2", S), ("r3", S), ("w2", X), ("r4", S)]);
    assert_eq!(serve(&mut lock, &mut q, T0), Vec::<String>::new());
    // The writer's deadline: every reader at the head goes in one step; w2 stops the scan,
    // so r4 (behind it) is not admitted even though it could share with r1..r3.
    assert_eq!(serve(&mut lock, &mut q, T0 + 100), ["r1", "r2", "r3"]);
    assert_eq!(q.iter().map(|w| w.0).collect::<Vec<_>>(), ["w2", "r4"]);
}

#[test]
fn a_queued_writer_is_not_overtaken_by_later_readers() {
    let lock = held(S, &[("r1", T0 + 100)]);
    // A reader arriving while a writer is queued must queue too (no barging).
    assert_eq!(
        decide_acquire(Some(&lock), b"r2", S, 0, T0, true),
        Ok(Acquire::ServeQueue)
    );
    let mut lock = Some(lock);
    let mut q = queue(&[("w", X), ("r2", S)]);
    assert!(
        serve(&mut lock, &mut q, T0).is_empty(),
        "w waits for r1, r2 waits for w"
    );
    assert_eq!(serve(&mut lock, &mut q, T0 + 100), ["w"]);
}

#[test]
fn a_semaphore_admits_up_to_its_limit_then_one_per_freed_permit() {
    let mut lock = None;
    let mut q = queue(&[("a", sem(2)), ("b", sem(2)), ("c", sem(2)), ("d", sem(2))]);
    assert_eq!(serve(&mut lock, &mut q, T0), ["a", "b"]);
    assert_eq!(lock.as_ref().unwrap().live_count(T0), 2);
    lock.as_mut().unwrap().remove(b"a");
    assert_eq!(serve(&mut lock, &mut q, T0), ["c"]);
    assert_eq!(serve(&mut lock, &mut q, T0), Vec::<String>::new());
    assert_eq!(q.len(), 1);
}

#[test]
fn a_conflicting_waiter_is_failed_and_the_scan_goes_on() {
    let mut lock = Some(held(sem(2), &[("a", T0 + 100)]));
    let mut q = queue(&[("x", sem(5)), ("b", sem(2))]);
    assert_eq!(serve(&mut lock, &mut q, T0), ["b"]);
    assert!(q.is_empty());
}

#[test]
fn pruning_names_the_session_holds_it_drops() {
    let mut a = hold("a", 1, T0 + 100);
    a.session = 7;
    let mut b = hold("b", 2, T0 + 300);
    b.session = 8;
    let mut l = Lock::new(S, a);
    l.admit(S, b);
    l.admit(S, hold("c", 3, T0 + 50));
    // "c" is no session's; "b" is still live at T0 + 200.
    assert_eq!(l.session_holds_freed_by(T0 + 200), vec![(7, b"a".to_vec())]);
    assert_eq!(l.prune(T0 + 200), 2);
    assert!(l.session_holds_freed_by(T0 + 200).is_empty());
    // The packed form never has a session.
    assert!(held(X, &[("x", T0)])
        .session_holds_freed_by(T0 + 1)
        .is_empty());
}

#[test]
fn ending_a_session_finds_each_of_its_holds_in_any_order() {
    // Two holds of session 9 on one shared key, one of them expired by its own ttl (and free:
    // no lock-delay). However the caller orders the session's holds, each end finds its hold:
    // ending one must not prune the other away first (found by the fuzz test
    // `sessions_lock_delay_shared_and_sets_match_a_simple_model`: CLOSE counted 1 or 2; now 1,
    // the live one, as LOCK.SESSION INFO counts).
    for (first, second) in [("old", "new"), ("new", "old")] {
        for clean in [true, false] {
            let mut old = hold("old", 1, T0 + 10);
            let mut new = hold("new", 2, T0 + 500);
            old.session = 9;
            new.session = 9;
            let mut l = Lock::from_holders(S, vec![old, new]);
            let at = T0 + 100;
            let ended = [first, second].map(|o| l.end_session_hold(o.as_bytes(), 9, at, clean));
            // The expired one is found and cleaned up, but was not live any more.
            let want = |o: &str| Some(if o == "old" { (1, false) } else { (2, true) });
            assert_eq!(
                ended,
                [want(first), want(second)],
                "{first} first, clean {clean}"
            );
            assert!(l.is_empty(), "{first} first, clean {clean}: {l:?}");
        }
    }
}
