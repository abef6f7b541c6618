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

use std::num::NonZeroU8;

use super::{Hold, HoldRef, IntoHold, Millis, Serial};

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
///
/// Two forms, one meaning. Memory is the reason: a held lock should cost about what the
/// `SET key owner NX PX ttl` string it replaces costs, and most locks are one exclusive holder
/// with a short owner (a UUID is 36 bytes), no session and no lock-delay. That lock is stored
/// as `Inline`: token, deadline and grant time beside the owner bytes, in the value itself,
/// so the key's value is a single 64-byte allocation (jemalloc's 64-byte class; the test
/// `the_typical_lock_is_one_64_byte_value` holds it there). Everything else (shared holders,
/// a session or a lock-delay, an owner longer than [`INLINE_OWNER`] bytes, a key emptied for a
/// handoff) is a mode and a `Vec<Hold>`, as before. The form is canonical: every mutation that
/// leaves one plain exclusive hold goes back to `Inline`, so the derived equality is
/// equality of mode and holders.
///
/// Measured with `make bench ONLY=memory` (100,000 locks, 36-byte owners), beside the string
/// and the bench-only floor module's one-allocation value (token, deadline, owner: 17 + 36
/// bytes): see BENCHMARKS.md, "Memory per held lock", and the Goals rows on memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lock(Repr);

#[derive(Clone, Debug, PartialEq, Eq)]
enum Repr {
    /// One exclusive hold, no session, no lock-delay, owner of at most [`INLINE_OWNER`] bytes.
    One(Inline),
    /// Any other value, in grant order; may be empty (a release about to hand off).
    Many { mode: Mode, holders: Vec<Hold> },
}

/// The longest owner kept inside the value: what fits beside the three numbers and the length
/// byte in 64 bytes.
pub const INLINE_OWNER: usize = 39;

/// A plain exclusive hold packed into the value. Why `granted_at` keeps a full word: it is a
/// wall-clock time (hold-time statistic), and the 39 bytes left for the owner already cover the
/// UUIDs (36) and `host:pid:thread` strings clients use.
///
/// `repr(C)` puts the length byte last, and it is stored plus one, so that its value 0 never
/// occurs: the compiler keeps [`Repr`]'s tag in that byte and lays `Repr::Many` (40 bytes)
/// out before it, which keeps `Lock` at 64 bytes rather than 72 with a tag of its own.
#[derive(Clone, Debug, PartialEq, Eq)]
#[repr(C)]
struct Inline {
    token: u64,
    deadline: Millis,
    granted_at: Millis,
    /// The owner, zero after its end.
    owner: [u8; INLINE_OWNER],
    /// The owner's length plus one.
    len_plus_one: NonZeroU8,
}

impl Inline {
    /// `hold` packed, if it is a hold this form can keep.
    fn of(mode: Mode, hold: &HoldRef) -> Option<Inline> {
        if mode != Mode::Exclusive
            || hold.session != 0
            || hold.delay != 0
            || hold.owner.len() > INLINE_OWNER
        {
            return None;
        }
        let mut owner = [0; INLINE_OWNER];
        owner[..hold.owner.len()].copy_from_slice(hold.owner);
        Some(Inline {
            token: hold.token,
            deadline: hold.deadline,
            granted_at: hold.granted_at,
            owner,
            len_plus_one: NonZeroU8::MIN.saturating_add(hold.owner.len() as u8),
        })
    }

    fn view(&self) -> HoldRef<'_> {
        HoldRef {
            owner: &self.owner[..usize::from(self.len_plus_one.get() - 1)],
            token: self.token,
            deadline: self.deadline,
            granted_at: self.granted_at,
            session: 0,
            delay: 0,
        }
    }
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
    /// A key's first holder (borrowed when it comes packed: see [`IntoHold`]).
    pub fn new(mode: Mode, hold: impl IntoHold) -> Lock {
        Lock(match Inline::of(mode, &hold.hold_ref()) {
            Some(inline) => Repr::One(inline),
            None => Repr::Many {
                mode,
                holders: vec![hold.into_hold()],
            },
        })
    }

    /// A value with these holders in `mode` (a load): exclusive takes exactly one.
    pub fn from_holders(mode: Mode, holders: Vec<Hold>) -> Lock {
        let mut lock = Lock(Repr::Many { mode, holders });
        lock.settle();
        lock
    }

    /// Back to the packed form when what is left is one plain exclusive hold (see [`Lock`]).
    fn settle(&mut self) {
        if let Repr::Many { mode, holders } = &self.0 {
            if let [only] = holders.as_slice() {
                if let Some(inline) = Inline::of(*mode, &only.view()) {
                    self.0 = Repr::One(inline);
                }
            }
        }
    }

    /// The mode of the current holders: fixed by the first grant after the key was free.
    pub fn mode(&self) -> Mode {
        match &self.0 {
            Repr::One(_) => Mode::Exclusive,
            Repr::Many { mode, .. } => *mode,
        }
    }

    /// How many holders are stored, expired ones included.
    pub fn len(&self) -> usize {
        match &self.0 {
            Repr::One(_) => 1,
            Repr::Many { holders, .. } => holders.len(),
        }
    }

    /// No holder stored (a release left the key for a handoff or a delete).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every stored holder, in grant order; exactly one when exclusive. May include expired
    /// holders (see module docs).
    pub fn holders(&self) -> impl Iterator<Item = HoldRef<'_>> + '_ {
        let (one, many) = match &self.0 {
            Repr::One(inline) => (Some(inline.view()), &[][..]),
            Repr::Many { holders, .. } => (None, holders.as_slice()),
        };
        one.into_iter().chain(many.iter().map(Hold::view))
    }

    /// Heap bytes the value owns beyond `size_of::<Lock>()` (for `MEMORY USAGE`).
    pub fn heap_bytes(&self) -> usize {
        match &self.0 {
            Repr::One(_) => 0,
            Repr::Many { holders, .. } => {
                holders.capacity() * std::mem::size_of::<Hold>()
                    + holders.iter().map(|h| h.owner.len()).sum::<usize>()
            }
        }
    }

    pub fn live(&self, now: Millis) -> impl Iterator<Item = HoldRef<'_>> + '_ {
        self.holders().filter(move |h| h.is_live(now))
    }

    pub fn live_count(&self, now: Millis) -> usize {
        self.live(now).count()
    }

    /// The holders that keep others out: live, or lost and inside their lock-delay.
    pub fn occupying(&self, now: Millis) -> impl Iterator<Item = HoldRef<'_>> + '_ {
        self.holders().filter(move |h| h.occupies(now))
    }

    /// When the last lock-delay on this key ends, if one is running and no holder is live
    /// (what `LOCK.INFO` shows as `delayed`).
    pub fn delayed_until(&self, now: Millis) -> Option<Millis> {
        self.holders()
            .filter(|h| h.is_delayed(now))
            .map(|h| h.frees_at())
            .max()
    }

    /// The live hold of `owner`.
    pub fn holder(&self, owner: &[u8], now: Millis) -> Option<HoldRef<'_>> {
        self.live(now).find(|h| h.owner == owner)
    }

    /// `owner`'s stored hold, live or not.
    pub fn entry(&self, owner: &[u8]) -> Option<HoldRef<'_>> {
        self.holders().find(|h| h.owner == owner)
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
        self.holders().map(|h| h.frees_at()).max()
    }

    /// When the next occupying holder frees its place: the moment a waiter may be admitted next.
    pub fn next_expiry(&self, now: Millis) -> Option<Millis> {
        self.occupying(now).map(|h| h.frees_at()).min()
    }

    /// The session holds [`Lock::prune`] at `before` would drop, as (session, owner): their
    /// sessions must forget them, or the records of expired shared holds pile up against
    /// `lock.max-session-holds` until the session ends.
    pub fn session_holds_freed_by(&self, before: Millis) -> Vec<(Serial, Vec<u8>)> {
        match &self.0 {
            Repr::One(_) => Vec::new(), // the packed form has no session
            Repr::Many { holders, .. } => holders
                .iter()
                .filter(|h| h.session != 0 && h.frees_at() <= before)
                .map(|h| (h.session, h.owner.to_vec()))
                .collect(),
        }
    }

    /// Drop holders whose place was free at or before `before`; returns how many went.
    pub fn prune(&mut self, before: Millis) -> usize {
        match &mut self.0 {
            Repr::One(inline) if inline.view().frees_at() <= before => {
                self.0 = Repr::Many {
                    mode: Mode::Exclusive,
                    holders: Vec::new(),
                };
                1
            }
            Repr::One(_) => 0,
            Repr::Many { holders, .. } => {
                let n = holders.len();
                holders.retain(|h| h.frees_at() > before);
                let gone = n - holders.len();
                self.settle();
                gone
            }
        }
    }

    /// Store `hold` in `mode` after [`decide_acquire`] allowed it (or a replica applies the
    /// primary's decision): an exclusive hold replaces every holder; a shared one replaces the
    /// same owner's entry or joins the others. The mode (and limit) become `mode`.
    pub fn admit(&mut self, mode: Mode, hold: impl IntoHold) {
        match &mut self.0 {
            Repr::Many {
                mode: held,
                holders,
            } if mode.is_shared() && held.is_shared() => {
                let owner = hold.hold_ref().owner;
                match holders.iter_mut().position(|h| *h.owner == *owner) {
                    Some(at) => holders[at] = hold.into_hold(),
                    None => holders.push(hold.into_hold()),
                }
                *held = mode;
            }
            _ => *self = Lock::new(mode, hold),
        }
    }

    /// Remove `owner`'s entry, live or not.
    pub fn remove(&mut self, owner: &[u8]) -> Option<Hold> {
        let removed = match &mut self.0 {
            Repr::One(inline) if inline.view().owner == owner => {
                let hold = inline.view().to_hold();
                self.0 = Repr::Many {
                    mode: Mode::Exclusive,
                    holders: Vec::new(),
                };
                return Some(hold);
            }
            Repr::One(_) => return None,
            Repr::Many { holders, .. } => {
                let at = holders.iter().position(|h| *h.owner == *owner)?;
                holders.remove(at)
            }
        };
        self.settle();
        Some(removed)
    }

    /// [`Lock::remove`] for a caller that needs only the removed hold's session (a release):
    /// `Some(session)`, 0 for none. The packed form's owner is not copied out to be dropped.
    pub fn discard(&mut self, owner: &[u8]) -> Option<Serial> {
        match &self.0 {
            Repr::One(inline) if inline.view().owner == owner => {
                self.0 = Repr::Many {
                    mode: Mode::Exclusive,
                    holders: Vec::new(),
                };
                Some(0)
            }
            Repr::One(_) => None,
            Repr::Many { .. } => self.remove(owner).map(|hold| hold.session),
        }
    }

    /// Move `owner`'s live deadline; false if it holds nothing live.
    pub fn set_deadline(&mut self, owner: &[u8], deadline: Millis, now: Millis) -> bool {
        match &mut self.0 {
            Repr::One(inline) => {
                let held = inline.view();
                let mine = held.owner == owner && held.is_live(now);
                if mine {
                    inline.deadline = deadline;
                }
                mine
            }
            Repr::Many { holders, .. } => {
                match holders
                    .iter_mut()
                    .find(|h| *h.owner == *owner && h.is_live(now))
                {
                    Some(h) => {
                        h.deadline = deadline;
                        true
                    }
                    None => false,
                }
            }
        }
    }

    /// The session `serial` ended at `at`: `owner`'s hold in it is removed (`clean`) or lost
    /// (its deadline moves to `at` and it leaves the session, so its lock-delay starts then),
    /// and the holders whose place was free by `at` go. `None` when there is no such hold;
    /// else its token, and whether it was still live at `at`: one whose own deadline had
    /// passed is cleaned up the same way, but the session's end released nothing there (what
    /// `LOCK.SESSION CLOSE` counts and the events announce, as `LOCK.SESSION INFO` counts only
    /// live holds).
    pub fn end_session_hold(
        &mut self,
        owner: &[u8],
        serial: Serial,
        at: Millis,
        clean: bool,
    ) -> Option<(u64, bool)> {
        let Repr::Many { holders, .. } = &mut self.0 else {
            return None; // the packed form has no session
        };
        let hold = holders
            .iter_mut()
            .find(|h| *h.owner == *owner && h.session == serial)?;
        let (token, live) = (hold.token, hold.is_live(at));
        if clean {
            self.remove(owner);
        } else {
            hold.deadline = hold.deadline.min(at);
            hold.session = 0;
        }
        // Not the session's other holds here, even those whose place is free by `at` (an
        // expired one): each is ended by its own call, which must find it whatever order the
        // caller visits the session's holds in (a hash set's order). Pruning them here made
        // `LOCK.SESSION CLOSE`'s count, and its events, depend on that order.
        if let Repr::Many { holders, .. } = &mut self.0 {
            holders.retain(|h| h.session == serial || h.frees_at() > at);
        }
        self.settle();
        Some((token, live))
    }

    /// Change each hold that belongs to a session with `f` (which may take it out of its
    /// session: `session` 0).
    pub fn update_session_holds(&mut self, mut f: impl FnMut(&mut Hold)) {
        if let Repr::Many { holders, .. } = &mut self.0 {
            holders
                .iter_mut()
                .filter(|h| h.session != 0)
                .for_each(&mut f);
            self.settle();
        }
    }

    /// Can a caller that holds nothing here be admitted in `mode` beside the holders that
    /// occupy the key?
    fn compatible(&self, mode: Mode, now: Millis) -> bool {
        let live = self.occupying(now).count();
        match (mode, self.mode()) {
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
        let held_mode = lock.mode();
        if held_mode.is_shared() != mode.is_shared() {
            return Err(Conflict::OtherMode { held: held_mode });
        }
        if held_mode != mode {
            return Err(Conflict::Limit {
                limit: held_mode.limit(),
            });
        }
        return Ok(Acquire::Retry { token: held.token });
    }
    let held_mode = lock.mode();
    if mode.is_shared() && held_mode.is_shared() && held_mode != mode {
        return Err(Conflict::Limit {
            limit: held_mode.limit(),
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
mod tests;
