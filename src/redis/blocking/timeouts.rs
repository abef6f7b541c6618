//! The waiters' `BLOCK` timeouts: every waiter's deadline in one ordered map, and ONE module
//! timer armed at the earliest of them (or before it), instead of a module timer per waiter.
//!
//! Under contention a new waiter times out after every one queued before it, so a block finds
//! the timer already armed earlier and creates none; a waiter that leaves (granted, failed,
//! gone) only leaves the map, and the timer is not stopped: when it fires with nothing due it
//! arms itself again at the earliest deadline left (or not at all). A timer per waiter cost a
//! `RM_CreateTimer` and a `RM_StopTimer` per handoff, each a rax insert or delete and a re-arm
//! of the event loop's time event.
//!
//! Deadlines are on the monotonic clock (`Instant`): the timer is only the alarm, and a timer
//! that fires early (the server's wall clock jumped forward: Redis 7.0 keys module timers by
//! wall time) finds nothing due and arms again.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::*;

thread_local! {
    /// (deadline, waiter id) -> the waiter's blocked-client handle (its address).
    static DUE: RefCell<BTreeMap<(Instant, u64), usize>> = const { RefCell::new(BTreeMap::new()) };
    /// The one timer: its id and when it fires. Armed at or before the earliest deadline in
    /// `DUE` whenever `DUE` has any.
    static TIMER: Cell<Option<(raw::RedisModuleTimerID, Instant)>> = const { Cell::new(None) };
}

/// The waiter `id` (handle `bc`) times out `timeout` ms from now (not 0): its deadline.
pub(super) fn start(
    ctx: *mut raw::RedisModuleCtx,
    bc: *mut raw::RedisModuleBlockedClient,
    id: u64,
    timeout: Millis,
) -> Instant {
    let at = Instant::now() + Duration::from_millis(timeout.max(0) as u64);
    DUE.with(|d| d.borrow_mut().insert((at, id), bc as usize));
    arm(ctx, at);
    at
}

/// The waiter `id` whose deadline is `at` left: it no longer times out. The timer stays (see
/// the top of this file).
pub(super) fn cancel(at: Instant, id: u64) {
    DUE.with(|d| d.borrow_mut().remove(&(at, id)));
}

/// Make sure the timer fires by `at`: keep one that fires then or earlier, replace a later one.
fn arm(ctx: *mut raw::RedisModuleCtx, at: Instant) {
    if let Some((timer, fires)) = TIMER.get() {
        if fires <= at {
            return;
        }
        // SAFETY: the timer carries no data; one that already fired makes StopTimer fail,
        // which is harmless (TIMER is cleared when it fires, so this is not that case).
        unsafe { raw::RedisModule_StopTimer.unwrap()(ctx, timer, std::ptr::null_mut()) };
    }
    // Rounded up to the millisecond, so that the deadline has passed when it fires; capped as
    // the deadline timers are (see `MAX_TIMER_MS`): a capped timer fires early and re-arms.
    let now = Instant::now();
    let delay = at
        .saturating_duration_since(now)
        .as_micros()
        .div_ceil(1000)
        .min(MAX_TIMER_MS as u128) as Millis;
    // SAFETY: the callback matches RedisModuleTimerProc and takes no data.
    let timer = unsafe {
        raw::RedisModule_CreateTimer.unwrap()(ctx, delay, Some(fire), std::ptr::null_mut())
    };
    TIMER.set(Some((timer, now + Duration::from_millis(delay as u64))));
}

/// The timer fired: every waiter whose deadline passed leaves its queue with a nil reply, in
/// deadline order; then the timer is armed for the next deadline, if any.
extern "C" fn fire(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    guard::callback("BLOCK timeout", (), || {
        // Redis frees a timer once it fired: this one is not to be stopped.
        TIMER.set(None);
        let now = Instant::now();
        // One at a time: taking a waiter out can run other queue code, which may touch `DUE`.
        while let Some(((_, id), bc)) = DUE.with(|d| {
            let mut due = d.borrow_mut();
            due.first_key_value()
                .is_some_and(|((at, _), _)| *at <= now)
                .then(|| due.pop_first())
                .flatten()
        }) {
            let bc = bc as *mut raw::RedisModuleBlockedClient;
            // Not retired: its entry in `DUE` is gone already.
            if let Some(waiter) = remove_waiter(ctx, bc, Some(id)) {
                stats::TIMED_OUT.incr();
                unblock(waiter.bc, Outcome::TimedOut);
            }
        }
        if let Some(next) = DUE.with(|d| d.borrow().first_key_value().map(|((at, _), _)| *at)) {
            arm(ctx, next);
        }
    })
}
