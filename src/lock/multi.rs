//! `LOCK.MACQUIRE`: several keys, all or none, decided in one step.
//!
//! Pure: the caller reads every key's value and whether anyone is queued ahead on it, and
//! this decides; nothing is granted unless every key can be.
//!
//! # Why multi-key waiters cannot deadlock
//! A blocked `LOCK.MACQUIRE` joins the queue of every one of its keys within one command, so
//! no other waiter can arrive in between: if waiters `A` and `B` share keys and `A` arrived
//! first, `A` is ahead of `B` in *every* queue they share. Queue order is therefore one global
//! arrival order restricted to each key. The oldest waiter still queued has nobody ahead of it
//! on any of its keys (anyone ahead would be older), so it only waits for its keys' holders,
//! and every hold ends (release, or the deadline of its ttl). When it is granted (or leaves),
//! the next oldest is in the same position. A cycle "A waits behind B on one key, B behind A
//! on another" would need each to be older than the other. This holds because waiters never
//! hold a key while they wait: a waiter holds nothing it asked for until its whole set is
//! granted at once.

use super::value::{decide_acquire, Acquire, Conflict, Lock, Mode};
use super::{Millis, Serial};

/// What to do on one key of a multi-key grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyGrant {
    /// The owner already holds this key: keep its token, move its deadline.
    Retry { token: u64 },
    /// Free: mint a new token.
    New,
}

/// What `LOCK.MACQUIRE` should do.
#[derive(Debug, PartialEq, Eq)]
pub enum MultiAcquire {
    /// Every key can be taken now: one entry per key, in the order of the keys.
    Grant(Vec<KeyGrant>),
    /// Some key is held by another owner or has a waiter ahead of the caller: nothing changes.
    Busy,
}

/// One key as a multi-key acquire sees it.
#[derive(Clone, Copy, Debug)]
pub struct KeyState<'a> {
    /// The key's value (`None`: no such key).
    pub lock: Option<&'a Lock>,
    /// Somebody is queued ahead of the caller on this key: for a new call, any waiter; for a
    /// queued multi-key waiter, anyone before it in that key's queue.
    pub ahead: bool,
}

/// Decide an exclusive acquire of every key in `keys` by `owner`: a grant only if each key is
/// free or already held by `owner`, and nobody is queued ahead of the caller on any of them.
/// A key `owner` holds SHARED is an error (no upgrade), and so is one it holds in another
/// `session`, reported with the key's index.
pub fn decide_macquire(
    keys: &[KeyState],
    owner: &[u8],
    session: Serial,
    now: Millis,
) -> Result<MultiAcquire, (usize, Conflict)> {
    let mut grants = Vec::with_capacity(keys.len());
    let mut busy = false;
    for (i, key) in keys.iter().enumerate() {
        match decide_acquire(key.lock, owner, Mode::Exclusive, session, now, false)
            .map_err(|c| (i, c))?
        {
            Acquire::Retry { token } => grants.push(KeyGrant::Retry { token }),
            Acquire::Grant | Acquire::ServeQueue => grants.push(KeyGrant::New),
            Acquire::Busy => busy = true,
        }
        busy |= key.ahead;
    }
    Ok(if busy {
        MultiAcquire::Busy
    } else {
        MultiAcquire::Grant(grants)
    })
}

/// The first key that appears twice in `keys`, if any.
pub fn first_duplicate<'a>(keys: &[&'a [u8]]) -> Option<&'a [u8]> {
    let mut seen = std::collections::HashSet::with_capacity(keys.len());
    keys.iter().copied().find(|k| !seen.insert(*k))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::Hold;
    use std::collections::{HashMap, VecDeque};

    const T0: Millis = 1_700_000_000_000;

    fn held(owner: &str, token: u64, deadline: Millis) -> Lock {
        Lock::new(
            Mode::Exclusive,
            Hold {
                owner: owner.as_bytes().to_vec(),
                token,
                deadline,
                granted_at: 0,
                session: 0,
                delay: 0,
            },
        )
    }

    fn free() -> KeyState<'static> {
        KeyState {
            lock: None,
            ahead: false,
        }
    }

    fn on(lock: &Lock) -> KeyState<'_> {
        KeyState {
            lock: Some(lock),
            ahead: false,
        }
    }

    #[test]
    fn free_keys_are_all_granted_in_key_order() {
        assert_eq!(
            decide_macquire(&[free(), free(), free()], b"me", 0, T0),
            Ok(MultiAcquire::Grant(vec![KeyGrant::New; 3]))
        );
    }

    #[test]
    fn one_busy_key_refuses_the_whole_set() {
        let other = held("other", 7, T0 + 100);
        for busy_at in 0..3 {
            let mut keys = [free(), free(), free()];
            keys[busy_at] = on(&other);
            assert_eq!(
                decide_macquire(&keys, b"me", 0, T0),
                Ok(MultiAcquire::Busy),
                "busy key at {busy_at}"
            );
        }
    }

    #[test]
    fn an_expired_holder_does_not_count() {
        let gone = held("other", 7, T0);
        assert_eq!(
            decide_macquire(&[on(&gone), free()], b"me", 0, T0),
            Ok(MultiAcquire::Grant(vec![KeyGrant::New; 2]))
        );
    }

    #[test]
    fn a_waiter_ahead_on_any_key_refuses_the_whole_set() {
        // The head-of-every-queue rule: free keys are not enough.
        let mut keys = [free(), free(), free()];
        keys[2].ahead = true;
        assert_eq!(decide_macquire(&keys, b"me", 0, T0), Ok(MultiAcquire::Busy));
        keys[2].ahead = false;
        assert!(matches!(
            decide_macquire(&keys, b"me", 0, T0),
            Ok(MultiAcquire::Grant(_))
        ));
    }

    #[test]
    fn a_partly_held_set_is_an_idempotent_retry() {
        let mine = held("me", 42, T0 + 100);
        assert_eq!(
            decide_macquire(&[free(), on(&mine), free()], b"me", 0, T0),
            Ok(MultiAcquire::Grant(vec![
                KeyGrant::New,
                KeyGrant::Retry { token: 42 },
                KeyGrant::New
            ]))
        );
        // ... but only as a whole: another owner on one key still refuses it.
        let other = held("other", 7, T0 + 100);
        assert_eq!(
            decide_macquire(&[on(&other), on(&mine)], b"me", 0, T0),
            Ok(MultiAcquire::Busy)
        );
    }

    #[test]
    fn a_key_held_shared_by_the_owner_is_a_conflict() {
        let shared = Lock::new(
            Mode::Shared { limit: None },
            Hold {
                owner: b"me".to_vec(),
                token: 3,
                deadline: T0 + 100,
                granted_at: 0,
                session: 0,
                delay: 0,
            },
        );
        assert_eq!(
            decide_macquire(&[free(), on(&shared)], b"me", 0, T0),
            Err((
                1,
                Conflict::OtherMode {
                    held: Mode::Shared { limit: None }
                }
            ))
        );
    }

    #[test]
    fn duplicates_are_found() {
        assert_eq!(first_duplicate(&[b"a", b"b", b"c"]), None);
        assert_eq!(first_duplicate(&[b"a", b"b", b"a"]), Some(&b"a"[..]));
    }

    /// A model of the server's queues: every waiter (single- or multi-key) joins the queue of
    /// each of its keys at once; a key's queue is scanned whenever that key frees up, and a
    /// head is granted only when `decide_macquire` says so for its whole set (with `ahead`
    /// from every queue). Holders release in an arbitrary order. Every waiter must be granted
    /// (no deadlock), never two holders on a key, and, on every key, in arrival order.
    #[test]
    fn overlapping_waiters_are_granted_in_arrival_order_without_deadlock() {
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut rand = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        for _round in 0..200 {
            let keys = 1 + rand(5);
            let waiters: Vec<Vec<usize>> = (0..1 + rand(8))
                .map(|_| {
                    let mut set: Vec<usize> = (0..keys).filter(|_| rand(2) == 0).collect();
                    if set.is_empty() {
                        set.push(rand(keys));
                    }
                    set
                })
                .collect();
            let mut queues: Vec<VecDeque<usize>> = vec![VecDeque::new(); keys];
            for (w, set) in waiters.iter().enumerate() {
                for &k in set {
                    queues[k].push_back(w);
                }
            }
            let mut locks: Vec<Option<Lock>> = vec![None; keys];
            let mut holding: HashMap<usize, Vec<usize>> = HashMap::new();
            let mut order: Vec<Vec<usize>> = vec![vec![]; keys];
            let mut done = 0;
            for _step in 0..10_000 {
                // Grant every head that can go now (repeat until nothing changes).
                loop {
                    let mut progressed = false;
                    for k in 0..keys {
                        let Some(&w) = queues[k].front() else {
                            continue;
                        };
                        let owner = format!("w{w}");
                        let states: Vec<KeyState> = waiters[w]
                            .iter()
                            .map(|&k| KeyState {
                                lock: locks[k].as_ref(),
                                ahead: queues[k].front() != Some(&w),
                            })
                            .collect();
                        if let Ok(MultiAcquire::Grant(_)) =
                            decide_macquire(&states, owner.as_bytes(), 0, T0)
                        {
                            for &k in &waiters[w] {
                                assert!(locks[k].is_none(), "two holders on key {k}");
                                locks[k] = Some(held(&owner, 1, T0 + 1));
                                assert_eq!(queues[k].pop_front(), Some(w));
                                order[k].push(w);
                            }
                            holding.insert(w, waiters[w].clone());
                            progressed = true;
                        }
                    }
                    if !progressed {
                        break;
                    }
                }
                if holding.is_empty() {
                    break;
                }
                // Some holder releases everything it holds.
                let mut holders: Vec<usize> = holding.keys().copied().collect();
                holders.sort();
                let w = holders[rand(holders.len())];
                for k in holding.remove(&w).unwrap() {
                    locks[k] = None;
                }
                done += 1;
            }
            assert_eq!(done, waiters.len(), "deadlock: {waiters:?}");
            for (k, granted) in order.iter().enumerate() {
                let arrival: Vec<usize> = (0..waiters.len())
                    .filter(|w| waiters[*w].contains(&k))
                    .collect();
                assert_eq!(granted, &arrival, "key {k} out of arrival order");
            }
        }
    }
}
