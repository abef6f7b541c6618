//! The lock state machine: plain Rust, no Redis types, no `unsafe`.
//!
//! Every decision takes `now` (milliseconds since the Unix epoch) as an argument so that the
//! unit tests choose the clock. The Redis side (`crate::redis`) stores a [`Lock`] (a mode and
//! its [`Hold`]s) as the value of the lock key and a [`WaitQueue`] per key in module memory; it
//! asks this module what to do and then does it.

use std::collections::VecDeque;

mod multi;
pub mod restore;
pub mod session;
mod value;
pub use multi::{
    busy_for, decide_macquire, decide_queued_set, first_duplicate, Ahead, KeyGrant, KeyState,
    MultiAcquire, DEFAULT_MAX_OVERTAKES,
};
pub use session::{Serial, Session, Sessions};
pub use value::{decide_acquire, held_by, Acquire, Conflict, Lock, Mode, INLINE_OWNER};

/// Milliseconds since the Unix epoch, as Redis keeps its own expiries.
pub type Millis = i64;

/// The largest deadline we accept. Redis adds the current time to relative expiries itself, so
/// leave room above it rather than letting a huge ttl wrap around into the past.
pub const MAX_DEADLINE: Millis = i64::MAX / 2;

/// A granted lock: who holds it, with which fencing token, until when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold {
    /// The owner string the client chose (binary-safe; non-empty). A boxed slice, not a
    /// `Vec`: no capacity word, so a `Hold` is 56 bytes and each shared holder 8 bytes less.
    pub owner: Box<[u8]>,
    /// The fencing token minted when this hold was granted; retries keep it.
    pub token: u64,
    /// Absolute deadline; the hold is free from this millisecond on.
    pub deadline: Millis,
    /// When this server granted it, for the hold-time statistic only; 0 when the hold came
    /// from a load or from replication. Not persisted.
    pub granted_at: Millis,
    /// The session the hold belongs to ([`Session::serial`], never the secret id); 0 for none.
    pub session: Serial,
    /// Lock-delay: after the deadline passes (an expiry, or the session's unclean end, which
    /// moves the deadline to that moment), nobody else gets what this hold had for this long.
    /// A clean release removes the hold, and with it the delay.
    pub delay: Millis,
}

/// The deadline of a session hold granted with `ttl-ms` 0: none of its own (the key gets no
/// Redis TTL); it ends with its session.
pub const NO_DEADLINE: Millis = MAX_DEADLINE;

impl Hold {
    /// The hold as [`Lock`] hands it out: borrowed owner, copied numbers.
    pub fn view(&self) -> HoldRef<'_> {
        HoldRef {
            owner: &self.owner,
            token: self.token,
            deadline: self.deadline,
            granted_at: self.granted_at,
            session: self.session,
            delay: self.delay,
        }
    }

    /// See [`HoldRef::is_live`].
    pub fn is_live(&self, now: Millis) -> bool {
        self.view().is_live(now)
    }

    /// See [`HoldRef::frees_at`].
    pub fn frees_at(&self) -> Millis {
        self.view().frees_at()
    }

    /// See [`HoldRef::occupies`].
    pub fn occupies(&self, now: Millis) -> bool {
        self.view().occupies(now)
    }

    /// See [`HoldRef::is_delayed`].
    pub fn is_delayed(&self, now: Millis) -> bool {
        self.view().is_delayed(now)
    }
}

/// A [`Hold`] read out of a [`Lock`]: the same fields, the owner borrowed from the value.
///
/// Why a view and not `&Hold`: the typical lock keeps its one holder packed inside the value
/// (see [`Lock`]), where there is no `Hold` to point at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HoldRef<'a> {
    /// [`Hold::owner`].
    pub owner: &'a [u8],
    /// [`Hold::token`].
    pub token: u64,
    /// [`Hold::deadline`].
    pub deadline: Millis,
    /// [`Hold::granted_at`].
    pub granted_at: Millis,
    /// [`Hold::session`].
    pub session: Serial,
    /// [`Hold::delay`].
    pub delay: Millis,
}

impl HoldRef<'_> {
    /// A hold is live strictly before its deadline: at the deadline it is already free, so a
    /// waiter woken by a timer at exactly that millisecond gets the lock.
    pub fn is_live(&self, now: Millis) -> bool {
        now < self.deadline
    }

    /// When what this hold had is free for someone else: its deadline, plus its lock-delay.
    pub fn frees_at(&self) -> Millis {
        self.deadline.saturating_add(self.delay).min(MAX_DEADLINE)
    }

    /// Live, or lost and still in its lock-delay: either way nobody else may take its place.
    pub fn occupies(&self, now: Millis) -> bool {
        now < self.frees_at()
    }

    /// Lost (deadline passed) but inside its lock-delay.
    pub fn is_delayed(&self, now: Millis) -> bool {
        !self.is_live(now) && self.occupies(now)
    }

    /// An owned copy.
    pub fn to_hold(&self) -> Hold {
        Hold {
            owner: self.owner.into(),
            token: self.token,
            deadline: self.deadline,
            granted_at: self.granted_at,
            session: self.session,
            delay: self.delay,
        }
    }
}

/// A hold to store: owned ([`Hold`]) or borrowed ([`HoldRef`]).
///
/// Why both: the typical lock packs its owner into the value (see [`Lock`]), so an acquire
/// that hands over the owner it parsed, borrowed, stores it without allocating a copy that the
/// packed form would copy again and free; only a hold kept in the general form is made a
/// [`Hold`] (one allocation for its owner, as before).
pub trait IntoHold {
    /// The hold's fields, the owner borrowed.
    fn hold_ref(&self) -> HoldRef<'_>;
    /// The hold, owned (a copy of a borrowed owner).
    fn into_hold(self) -> Hold;
}

impl IntoHold for Hold {
    fn hold_ref(&self) -> HoldRef<'_> {
        self.view()
    }
    fn into_hold(self) -> Hold {
        self
    }
}

impl IntoHold for HoldRef<'_> {
    fn hold_ref(&self) -> HoldRef<'_> {
        *self
    }
    fn into_hold(self) -> Hold {
        self.to_hold()
    }
}

/// `now + ttl`, or `None` when that deadline would overflow (the caller reports `ttl-ms is too
/// large`).
pub fn deadline_after(now: Millis, ttl: Millis) -> Option<Millis> {
    now.checked_add(ttl).filter(|d| *d <= MAX_DEADLINE)
}

/// Token floor: the wall clock in milliseconds shifted left by this many bits.
///
/// Why a clock floor: a node that lost every bit of state (restart with no persistence, or a
/// replica promoted before it saw the newest grants) must still mint tokens larger than any it
/// or its old primary ever issued. Tokens are `max(high_water + 1, now_ms << CLOCK_SHIFT)`;
/// with 2^11 = 2048 tokens of room per millisecond, the counter outruns the clock only while
/// more than two million grants a second are sustained, which one Redis thread cannot do. So
/// every token issued at time `t` is below `(t + 1) << CLOCK_SHIFT`, and a node whose clock
/// reads later than `t + 1` starts above it. The one assumption: clocks do not step back
/// (across restart, or between a primary and the replica that replaces it) by more than the
/// time between the last grant and the first grant after the restart or failover.
///
/// Why 11 bits and not more: tokens must stay below 2^53, so that JavaScript numbers (ioredis,
/// node-redis), Lua numbers inside scripts, JSON and doubles hold them exactly. `now_ms` reaches
/// 2^42 in the year 2109; until then `now_ms << 11` is below 2^53.
pub const CLOCK_SHIFT: u32 = 11;

/// Tokens stay below this (2^53): exact in every client's number type.
pub const EXACT_NUMBER_LIMIT: u64 = 1 << 53;

/// Mints fencing tokens: one counter for the whole server, so every key's tokens increase.
#[derive(Debug, Default, Clone)]
pub struct TokenMint {
    high_water: u64,
}

impl TokenMint {
    pub const fn new() -> Self {
        TokenMint { high_water: 0 }
    }

    /// The lowest token the clock allows at `now`.
    pub fn floor(now: Millis) -> u64 {
        (now.max(0) as u64) << CLOCK_SHIFT
    }

    /// A new token, larger than every token minted or observed before and than the clock floor.
    pub fn next(&mut self, now: Millis) -> u64 {
        let token = self.high_water.saturating_add(1).max(Self::floor(now));
        self.high_water = token;
        token
    }

    /// Remember a token issued elsewhere (loaded from RDB/AOF or replicated) so ours stay larger.
    pub fn observe(&mut self, token: u64) {
        self.high_water = self.high_water.max(token);
    }

    pub fn high_water(&self) -> u64 {
        self.high_water
    }

    /// After a promotion, or a start that may have missed the newest grants: move the
    /// high-water mark forward by `margin` ms worth of tokens, to at least
    /// `max(floor(now + margin), high_water + (margin << CLOCK_SHIFT))`, so that the next token
    /// exceeds every token the previous primary (or this server before its restart) can have
    /// issued, unless that server's clock was ahead of this one's by more than `margin` plus
    /// the time the failover took. `margin` 0 changes nothing (`next` applies the clock floor
    /// anyway).
    ///
    /// Two terms, because each covers what the other misses:
    /// - `floor(now + margin)`: a server that knows nothing (fresh start, a replica that never
    ///   synced) starts `margin` ms of clock ahead of its own clock. It covers lost tokens
    ///   minted at most `margin` (plus the failover time) after this server's clock.
    /// - `high_water + (margin << CLOCK_SHIFT)`: a replica knows the last token it replicated,
    ///   which was minted from the old primary's clock or high-water mark, not its own. The
    ///   grants it missed carry tokens above that by at most 2048 per ms (see `CLOCK_SHIFT`),
    ///   so jumping `margin` ms of tokens past it covers a replication lag of up to `margin`,
    ///   whatever this server's clock says, and also a failover back to a server that was
    ///   promoted less than `margin` ago (whose tokens run ahead of its clock).
    ///
    /// Cost: each call puts tokens at most `margin` ms ahead of `max(clock, high_water)`.
    /// Calls more than `margin` apart do not add up (the clock catches up in between); calls in
    /// quick succession do. The mark never goes past [`RAISE_CEILING`]: there the jump is cut
    /// short (the result is `false`, the caller logs it) and tokens go on by one per grant,
    /// still below 2^53 for another 2^40 grants, rather than leaving the range doubles hold
    /// exactly. From 2026 to the ceiling there is room for about 43 million jumps of 60 s in a
    /// row (`failover_jumps_fit_below_2_53` computes it); the room shrinks as the clock nears
    /// 2^42 ms in 2109.
    pub fn skip_ahead(&mut self, now: Millis, margin: Millis) -> bool {
        let margin = margin.clamp(0, MAX_MARGIN);
        let by_clock = Self::floor(now.saturating_add(margin));
        let by_history = self
            .high_water
            .saturating_add((margin as u64) << CLOCK_SHIFT);
        let want = by_clock.max(by_history).max(self.high_water);
        let ceiling = RAISE_CEILING.max(self.high_water);
        self.high_water = want.min(ceiling);
        want <= ceiling
    }
}

/// The largest margin [`TokenMint::skip_ahead`] applies: one day (`lock.failover-token-margin-ms`
/// has the same maximum).
pub const MAX_MARGIN: Millis = 86_400_000;

/// [`TokenMint::skip_ahead`] never raises the high-water mark past this: 2^40 grants below
/// [`EXACT_NUMBER_LIMIT`].
pub const RAISE_CEILING: u64 = EXACT_NUMBER_LIMIT - (1 << 40);

#[cfg(test)]
mod mint_tests {
    use super::*;

    const T0: Millis = 1_700_000_000_000;
    const MARGIN: Millis = 60_000;

    #[test]
    fn skip_ahead_moves_past_the_clock_plus_margin() {
        let mut mint = TokenMint::new();
        assert!(mint.skip_ahead(T0, MARGIN));
        assert_eq!(mint.high_water(), TokenMint::floor(T0 + MARGIN));
        assert_eq!(mint.next(T0), TokenMint::floor(T0 + MARGIN) + 1);
    }

    #[test]
    fn skip_ahead_moves_past_the_replicated_high_water_mark() {
        // The old primary's clock was 60 s ahead of ours: its tokens are far above our clock.
        let mut old = TokenMint::new();
        let replicated = old.next(T0 + 60_000);
        let lost: Vec<u64> = (0..5000).map(|_| old.next(T0 + 60_500)).collect();
        let mut new = TokenMint::new();
        new.observe(replicated);
        new.skip_ahead(T0 + 1000, MARGIN);
        let first = new.next(T0 + 1000);
        assert!(
            lost.iter().all(|t| *t < first),
            "{first} not above {lost:?}"
        );
        assert_eq!(first, replicated + ((MARGIN as u64) << CLOCK_SHIFT) + 1);
    }

    #[test]
    fn skewed_failover_without_margin_reuses_lost_tokens() {
        // The failure the margin prevents: replica 10 s behind, grants lost in the failover.
        let mut old = TokenMint::new();
        let replicated = old.next(T0);
        let lost = old.next(T0 + 5);
        let mut new = TokenMint::new();
        new.observe(replicated);
        assert!(new.skip_ahead(T0 - 10_000 + 100, 0));
        assert!(new.next(T0 - 10_000 + 100) <= lost);
    }

    #[test]
    fn skip_ahead_is_bounded_by_the_margin_and_the_ceiling() {
        let mut mint = TokenMint::new();
        mint.observe(RAISE_CEILING - 10);
        assert!(!mint.skip_ahead(T0, MARGIN));
        assert_eq!(mint.high_water(), RAISE_CEILING);
        // Never lowers, even past the ceiling.
        mint.observe(RAISE_CEILING + 5);
        assert!(!mint.skip_ahead(T0, MARGIN));
        assert_eq!(mint.high_water(), RAISE_CEILING + 5);
        assert!(mint.next(T0) < EXACT_NUMBER_LIMIT);
        // Negative and huge margins are clamped.
        let mut mint = TokenMint::new();
        mint.skip_ahead(T0, -5);
        assert_eq!(mint.high_water(), TokenMint::floor(T0));
        mint.skip_ahead(T0, Millis::MAX);
        assert_eq!(mint.high_water(), TokenMint::floor(T0 + MAX_MARGIN));
    }

    #[test]
    fn skip_ahead_calls_far_apart_do_not_add_up() {
        let mut mint = TokenMint::new();
        mint.skip_ahead(T0, MARGIN);
        mint.next(T0);
        // Two margins later the clock has overtaken the first jump.
        mint.skip_ahead(T0 + 2 * MARGIN, MARGIN);
        assert_eq!(mint.high_water(), TokenMint::floor(T0 + 3 * MARGIN));
    }

    #[test]
    fn failover_jumps_fit_below_2_53() {
        // Back-to-back failovers at the default margin, starting 2026-12-01.
        let dec_2026: Millis = 1_796_083_200_000;
        let per_jump = (MARGIN as u64) << CLOCK_SHIFT;
        let jumps = (RAISE_CEILING - TokenMint::floor(dec_2026)) / per_jump;
        assert_eq!(jumps / 1_000_000, 43); // about 43 million
        let mut mint = TokenMint::new();
        mint.observe(TokenMint::floor(dec_2026) + (jumps - 1) * per_jump);
        assert!(mint.skip_ahead(dec_2026, MARGIN));
        assert!(!mint.skip_ahead(dec_2026, MARGIN));
        assert!(mint.next(dec_2026) < EXACT_NUMBER_LIMIT);
    }
}

/// A per-key FIFO queue of waiters. `W` is whatever the Redis side needs to reach the blocked
/// client; the queue only keeps order, a cap, and removal of waiters that went away.
#[derive(Debug)]
pub struct WaitQueue<W> {
    waiters: VecDeque<W>,
}

/// Returned by [`WaitQueue::push`] when the queue is at its cap: nothing was queued, and the
/// waiter comes back so the caller can release what it holds.
#[derive(Debug, PartialEq, Eq)]
pub struct QueueFull<W>(pub W);

impl<W> Default for WaitQueue<W> {
    fn default() -> Self {
        WaitQueue {
            waiters: VecDeque::new(),
        }
    }
}

impl<W> WaitQueue<W> {
    pub fn len(&self) -> usize {
        self.waiters.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiters.is_empty()
    }

    /// Queue at the back, unless `cap` waiters are already queued.
    pub fn push(&mut self, waiter: W, cap: usize) -> Result<(), QueueFull<W>> {
        if self.waiters.len() >= cap {
            return Err(QueueFull(waiter));
        }
        self.waiters.push_back(waiter);
        Ok(())
    }

    /// The longest-waiting waiter, removed from the queue.
    pub fn pop_front(&mut self) -> Option<W> {
        self.waiters.pop_front()
    }

    /// Remove the first waiter matching `is`; O(n), and n is capped by `lock.max-waiters`.
    pub fn remove(&mut self, is: impl Fn(&W) -> bool) -> Option<W> {
        let at = self.waiters.iter().position(is)?;
        self.waiters.remove(at)
    }

    pub fn iter(&self) -> impl Iterator<Item = &W> {
        self.waiters.iter()
    }

    pub fn drain(&mut self) -> impl Iterator<Item = W> + '_ {
        self.waiters.drain(..)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Millis = 1_700_000_000_000;

    #[test]
    fn tokens_increase_and_follow_the_clock() {
        let mut mint = TokenMint::new();
        let a = mint.next(T0);
        let b = mint.next(T0);
        let c = mint.next(T0 + 1);
        assert_eq!(a, TokenMint::floor(T0));
        assert_eq!(b, a + 1);
        assert_eq!(c, TokenMint::floor(T0 + 1));
        assert!(a < b && b < c);
    }

    #[test]
    fn tokens_never_go_back_when_the_clock_does() {
        let mut mint = TokenMint::new();
        let a = mint.next(T0 + 1000);
        let b = mint.next(T0);
        assert_eq!(b, a + 1);
    }

    #[test]
    fn observed_tokens_raise_the_high_water_mark() {
        let mut mint = TokenMint::new();
        let far = TokenMint::floor(T0 + 10_000) + 5;
        mint.observe(far);
        mint.observe(3); // lower observations never lower it
        assert_eq!(mint.next(T0), far + 1);
    }

    #[test]
    fn a_fresh_mint_outranks_tokens_from_before_a_restart() {
        // A server that issued tokens at T0 restarts with nothing persisted a moment later.
        let mut before = TokenMint::new();
        let last = (0..1000).map(|_| before.next(T0)).last().unwrap();
        let mut after = TokenMint::new();
        assert!(after.next(T0 + 2) > last);
    }

    #[test]
    fn tokens_stay_exact_as_doubles_until_2109() {
        let late_2108: Millis = 4_386_000_000_000; // 2108-12-26
        assert!(TokenMint::floor(late_2108) < EXACT_NUMBER_LIMIT);
        assert!(TokenMint::floor(T0) as f64 as u64 == TokenMint::floor(T0));
        assert!(TokenMint::floor(T0) + 1 == (TokenMint::floor(T0) + 1) as f64 as u64);
    }

    #[test]
    fn deadline_overflow_is_refused() {
        assert_eq!(deadline_after(T0, 10), Some(T0 + 10));
        assert_eq!(deadline_after(T0, i64::MAX), None);
        assert_eq!(deadline_after(T0, MAX_DEADLINE), None);
        assert_eq!(deadline_after(T0, MAX_DEADLINE - T0), Some(MAX_DEADLINE));
    }

    #[test]
    fn queue_is_fifo_with_a_cap_and_removal() {
        let mut q = WaitQueue::default();
        for w in 1..=5 {
            q.push(w, 5).unwrap();
        }
        assert_eq!(q.push(6, 5), Err(QueueFull(6)));
        assert_eq!(q.len(), 5);
        assert_eq!(q.remove(|w| *w == 3), Some(3));
        assert_eq!(q.remove(|w| *w == 3), None);
        let order: Vec<_> = std::iter::from_fn(|| q.pop_front()).collect();
        assert_eq!(order, vec![1, 2, 4, 5]);
        assert!(q.is_empty());
    }
}
