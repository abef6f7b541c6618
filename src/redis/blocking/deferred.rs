//! Deferred work: what the server's own operations trigger (unlinks, flushes, `SWAPDB`, a
//! waiter leaving the head of a queue, the revoke of an undelivered grant) runs from a
//! zero-delay timer, never inside the notification; and while the server holds writes back
//! (`CLIENT PAUSE`, `FAILOVER`) every piece of it, and the deadline timers' handoffs, is held in
//! order until the pause ends (see `crate::redis::pause` for the paths this covers). Apart from
//! the queue logic in `blocking.rs` because it changes with the server's rules for when a module
//! may write, not with how a queue is served.

use super::*;

thread_local! {
    /// Work that found writes paused, in the order it came; run again when the pause ends.
    static HELD: RefCell<Vec<Work>> = const { RefCell::new(Vec::new()) };
    static HELD_ARMED: Cell<bool> = const { Cell::new(false) };
}

/// Queue deferred work and make sure the zero-delay timer that runs it is armed.
pub(super) fn defer(ctx: *mut raw::RedisModuleCtx, work: Work) {
    PENDING.with(|p| p.borrow_mut().push(work));
    if !PENDING_ARMED.with(|a| a.replace(true)) {
        // SAFETY: the callback matches RedisModuleTimerProc and takes no data.
        unsafe {
            raw::RedisModule_CreateTimer.unwrap()(ctx, 0, Some(pending_timer), std::ptr::null_mut())
        };
    }
}

extern "C" fn pending_timer(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    guard::callback("deferred work", (), || {
        PENDING_ARMED.with(|a| a.set(false));
        let work = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
        run(ctx, work);
    })
}

/// Do deferred work now, or, while writes are paused, hold it (after whatever is held already,
/// so the order stays) until the pause ends.
pub(super) fn run(ctx: *mut raw::RedisModuleCtx, mut work: Vec<Work>) {
    if HELD_ARMED.with(Cell::get) || pause::writes_paused() {
        // A session expiry held back by a pause is told so: no keepalive could land meanwhile.
        for item in work.iter_mut() {
            if matches!(item, Work::ExpireSessions) {
                *item = Work::ExpireSessionsAfterPause;
            }
        }
        HELD.with(|h| h.borrow_mut().append(&mut work));
        if !HELD_ARMED.with(|a| a.replace(true)) {
            arm_held_timer(ctx);
        }
        return;
    }
    work.dedup_by(|a, b| matches!((a, b), (Work::Settle(x), Work::Settle(y)) if x == y));
    for item in work {
        match item {
            Work::Settle(qk) => settle(ctx, &qk),
            Work::Revoke(qk, token) => revoke(ctx, &qk, token),
            Work::SyncExpiry(qk) => super::events::sync_expiry(ctx, &qk),
            Work::EndSession(session) => sessions::end_lost(ctx, *session),
            Work::SessionDetached(serial) => session::detach_told(ctx, serial),
            Work::SessionAttached(serial, untold) => {
                sessions::announce_attached(ctx, serial, untold)
            }
            Work::CloseSession(session, bc) => sessions::end_closed(ctx, *session, bc),
            Work::ExpireSessions => sessions::end_expired(ctx, false),
            Work::ExpireSessionsAfterPause => sessions::end_expired(ctx, true),
        }
    }
    // The change feed's messages for what this did, now rather than a timer later.
    crate::redis::feed::flush(ctx);
}

fn arm_held_timer(ctx: *mut raw::RedisModuleCtx) {
    // SAFETY: the callback matches RedisModuleTimerProc and takes no data.
    unsafe {
        raw::RedisModule_CreateTimer.unwrap()(
            ctx,
            pause::POLL_MS,
            Some(held_timer),
            std::ptr::null_mut(),
        )
    };
}

/// Polls while work is held: when writes are allowed again, runs it all in order.
extern "C" fn held_timer(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    guard::callback("held work", (), || {
        pause::refresh_server_clock(ctx);
        if pause::writes_paused() {
            arm_held_timer(ctx);
            return;
        }
        HELD_ARMED.with(|a| a.set(false));
        let work = HELD.with(|h| std::mem::take(&mut *h.borrow_mut()));
        run(ctx, work);
    })
}
