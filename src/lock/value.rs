//! The value of a lock key: its mode and its holders, and every decision taken from it.
//!
//! One type for exclusive locks, read/write locks and counting semaphores: an exclusive lock is
//! a key with exactly one holder; a shared key has any number of holders (at most `limit` when
//! it is a semaphore), each with its own token and deadline. Keeping one type means one queue,
//! one persistence format and one replication path for all three.
//!
//! Holders whose deadline passed may still be stored (nothing removes them until the key is
//! touched). Ownership (retry, release, extend, fencing) looks only at live holders; whether
//! someone else may come in looks at the holders that still *occupy* the key: the live ones and
//! the lost ones inside their lock-delay ([`Hold::occupies`]). [`Lock::prune`] drops the rest.

use super::{Hold, Millis, Serial};

/// How a key is held, or how a caller asks to hold it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// One holder, alone.
    Exclusive,
    /// Any number of holders at once, or at most `limit` (a counting semaphore).
    Shared { limit: Option<u64> },
}

impl Mode {
    pub fn is_shared(self) -> bool {
        matches!(self, Mode::Shared { .. })
    }

    /// The semaphore limit, if any (`None` for exclusive and unlimited shared).
    pub fn limit(self) -> Option<u64> {
        match self {
            Mode::Shared { limit } => limit,
            Mode::Exclusive => None,
        }
    }
}

/// The value stored under a lock key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lock {
    /// The mode of the current holders: fixed by the first grant after the key was free.
    pub mode: Mode,
    /// In grant order; exactly one when exclusive. May include expired holders (see module docs).
    pub holders: Vec<Hold>,
}

/// Why an acquire is refused with an error rather than a wait: nothing changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Conflict {
    /// The owner holds the key in the other mode. No upgrade or downgrade: two readers that
    /// both upgraded would wait for each other forever.
    OtherMode { held: Mode },
    /// A shared acquire whose limit differs from the one the key's shared holders (or queued
    /// shared waiters) have fixed.
    Limit { limit: Option<u64> },
    /// The owner holds the key in another session (or without one, or in one when the caller
    /// names none): one hold cannot belong to two leases.
    OtherSession,
}

/// What `LOCK.ACQUIRE` should do, decided from the current value of the key.
#[derive(Debug, PartialEq, Eq)]
pub enum Acquire {
    /// The caller already holds it in this mode: keep the token, move the deadline.
    Retry { token: u64 },
    /// Compatible with the live holders and nobody queued: grant a new token to the caller.
    Grant,
    /// Compatible, but waiters are queued: they go first (no barging), then the caller is
    /// refused or queued behind them.
    ServeQueue,
    /// The live holders exclude the caller (an exclusive holder, a full semaphore, or shared
    /// holders when the caller wants it alone).
    Busy,
}

impl Lock {
    /// A key's first holder.
    pub fn new(mode: Mode, hold: Hold) -> Lock {
        Lock {
            mode,
            holders: vec![hold],
        }
    }

    pub fn live(&self, now: Millis) -> impl Iterator<Item = &Hold> {
        self.holders.iter().filter(move |h| h.is_live(now))
    }

    pub fn live_count(&self, now: Millis) -> usize {
        self.live(now).count()
    }

    /// The holders that keep others out: live, or lost and inside their lock-delay.
    pub fn occupying(&self, now: Millis) -> impl Iterator<Item = &Hold> {
        self.holders.iter().filter(move |h| h.occupies(now))
    }

    /// When the last lock-delay on this key ends, if one is running and no holder is live
    /// (what `LOCK.INFO` shows as `delayed`).
    pub fn delayed_until(&self, now: Millis) -> Option<Millis> {
        self.holders
            .iter()
            .filter(|h| h.is_delayed(now))
            .map(Hold::frees_at)
            .max()
    }

    /// The live hold of `owner`.
    pub fn holder(&self, owner: &[u8], now: Millis) -> Option<&Hold> {
        self.live(now).find(|h| h.owner == owner)
    }

    /// The largest live token: what `LOCK.FENCE key` returns.
    pub fn max_token(&self, now: Millis) -> Option<u64> {
        self.live(now).map(|h| h.token).max()
    }

    /// `LOCK.FENCE key token`: is `token` the token of some live holder?
    pub fn fences(&self, token: u64, now: Millis) -> bool {
        self.live(now).any(|h| h.token == token)
    }

    /// The key's Redis expiry: when the last of its holders frees its place (deadline plus
    /// lock-delay), so the key disappears with its last holder and never looks free during a
    /// delay. [`crate::lock::NO_DEADLINE`] means the key gets no Redis expiry.
    pub fn key_deadline(&self) -> Option<Millis> {
        self.holders.iter().map(Hold::frees_at).max()
    }

    /// When the next occupying holder frees its place: the moment a waiter may be admitted next.
    pub fn next_expiry(&self, now: Millis) -> Option<Millis> {
        self.occupying(now).map(Hold::frees_at).min()
    }

    /// Drop holders whose place was free at or before `before`; returns how many went.
    pub fn prune(&mut self, before: Millis) -> usize {
        let n = self.holders.len();
        self.holders.retain(|h| h.frees_at() > before);
        n - self.holders.len()
    }

    /// Store `hold` in `mode` after [`decide_acquire`] allowed it (or a replica applies the
    /// primary's decision): an exclusive hold replaces every holder; a shared one replaces the
    /// same owner's entry or joins the others. The mode (and limit) become `mode`.
    pub fn admit(&mut self, mode: Mode, hold: Hold) {
        if mode.is_shared() && self.mode.is_shared() {
            match self.holders.iter_mut().find(|h| h.owner == hold.owner) {
                Some(h) => *h = hold,
                None => self.holders.push(hold),
            }
        } else {
            self.holders.clear();
            self.holders.push(hold);
        }
        self.mode = mode;
    }

    /// Remove `owner`'s entry, live or not.
    pub fn remove(&mut self, owner: &[u8]) -> Option<Hold> {
        let at = self.holders.iter().position(|h| h.owner == owner)?;
        Some(self.holders.remove(at))
    }

    /// Move `owner`'s live deadline; false if it holds nothing live.
    pub fn set_deadline(&mut self, owner: &[u8], deadline: Millis, now: Millis) -> bool {
        match self
            .holders
            .iter_mut()
            .find(|h| h.owner == owner && h.is_live(now))
        {
            Some(h) => {
                h.deadline = deadline;
                true
            }
            None => false,
        }
    }

    /// Can a caller that holds nothing here be admitted in `mode` beside the holders that
    /// occupy the key?
    fn compatible(&self, mode: Mode, now: Millis) -> bool {
        let live = self.occupying(now).count();
        match (mode, self.mode) {
            _ if live == 0 => true,
            (Mode::Shared { limit }, Mode::Shared { .. }) => {
                limit.is_none_or(|n| (live as u64) < n)
            }
            _ => false,
        }
    }
}

/// Decide an acquire by `owner` in `mode`, in `session` (0: none). `queued` says whether
/// waiters are queued on the key (a queue scan asks with `false` for its head). Errors change
/// nothing.
pub fn decide_acquire(
    current: Option<&Lock>,
    owner: &[u8],
    mode: Mode,
    session: Serial,
    now: Millis,
    queued: bool,
) -> Result<Acquire, Conflict> {
    let Some(lock) = current.filter(|l| l.occupying(now).next().is_some()) else {
        return Ok(if queued {
            Acquire::ServeQueue
        } else {
            Acquire::Grant
        });
    };
    if let Some(held) = lock.holder(owner, now) {
        if held.session != session {
            return Err(Conflict::OtherSession);
        }
        if lock.mode.is_shared() != mode.is_shared() {
            return Err(Conflict::OtherMode { held: lock.mode });
        }
        if lock.mode != mode {
            return Err(Conflict::Limit {
                limit: lock.mode.limit(),
            });
        }
        return Ok(Acquire::Retry { token: held.token });
    }
    if mode.is_shared() && lock.mode.is_shared() && lock.mode != mode {
        return Err(Conflict::Limit {
            limit: lock.mode.limit(),
        });
    }
    Ok(match lock.compatible(mode, now) {
        true if queued => Acquire::ServeQueue,
        true => Acquire::Grant,
        false => Acquire::Busy,
    })
}

/// True when `owner` holds a live lock: the condition for `LOCK.RELEASE` and `LOCK.EXTEND`.
pub fn held_by(current: Option<&Lock>, owner: &[u8], now: Millis) -> bool {
    current.is_some_and(|l| l.holder(owner, now).is_some())
}

#[cfg(test)]
mod tests {
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
            owner: owner.as_bytes().to_vec(),
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
    fn serve(
        lock: &mut Option<Lock>,
        queue: &mut WaitQueue<(&str, Mode)>,
        now: Millis,
    ) -> Vec<String> {
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
        assert_eq!(l.holders.len(), 2);
        assert_eq!(l.holder(b"r1", T0).map(|h| h.token), Some(6));
        assert_eq!(l.key_deadline(), Some(T0 + 300));
        l.admit(X, hold("w", 7, T0 + 10));
        assert_eq!((l.mode, l.holders.len()), (X, 1));
        l.admit(sem(2), hold("p", 8, T0 + 10));
        assert_eq!((l.mode, l.holders.len()), (sem(2), 1));
    }

    #[test]
    fn prune_remove_and_set_deadline() {
        let mut l = held(S, &[("a", T0 + 100), ("b", T0 + 200), ("c", T0 + 300)]);
        assert_eq!(l.prune(T0 + 200), 2);
        assert_eq!(l.holders.len(), 1);
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
}
