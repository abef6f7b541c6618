//! The timer armed at the current holders' next deadline, one per queue (`Queue::timer`): when
//! it fires, the key is settled (handed to the head if the hold expired, re-armed if not). Apart
//! from the queue logic in `blocking.rs` because it is about the server's timers, not about how
//! a queue is served.

use super::*;

/// Make sure the queue's timer fires by `deadline`: keep one that fires then or earlier (an
/// early one finds the hold live and re-arms, see `settle`), replace a later one. Under
/// contention every handoff moves the deadline later, so the timer is re-armed about once a
/// ttl rather than stopped and created again at every handoff.
pub(super) fn arm_deadline_timer(ctx: *mut raw::RedisModuleCtx, qk: KeyRef, deadline: Millis) {
    let old = QUEUES.with(|q| {
        let mut queues = q.borrow_mut();
        let queue = queues.get_mut(&qk as &dyn KeyView)?;
        match queue.timer {
            Some((_, at)) if at <= deadline => None,
            _ => Some(queue.timer.take()),
        }
    });
    let Some(old) = old else { return };
    if let Some((id, _)) = old {
        stop_timer(ctx, id);
    }
    // From the clock in microseconds, rounded up: a delay computed from milliseconds fires up
    // to a millisecond late, and one that fires early only finds the hold live and re-arms.
    // Capped: on Redis 7.0 a timer more than about 35 minutes away can make the event loop
    // spin (fixed in 7.2.2), and a session hold may have no deadline at all.
    let delay = (deadline.saturating_mul(1000) - key::now_micros() + 999)
        .div_euclid(1000)
        .clamp(0, MAX_TIMER_MS);
    let data = Box::into_raw(Box::new((qk.0, qk.1.to_vec())));
    // SAFETY: the callback matches RedisModuleTimerProc; `data` is reclaimed by the callback or
    // by stop_timer, exactly once.
    let id = unsafe {
        raw::RedisModule_CreateTimer.unwrap()(ctx, delay, Some(deadline_timer), data.cast())
    };
    QUEUES.with(|q| {
        if let Some(queue) = q.borrow_mut().get_mut(&qk as &dyn KeyView) {
            queue.timer = Some((id, deadline));
        }
    });
}

/// The longest a deadline timer is armed for at once (see `arm_deadline_timer`).
pub(super) const MAX_TIMER_MS: Millis = 600_000;

pub(super) fn stop_timer(ctx: *mut raw::RedisModuleCtx, id: raw::RedisModuleTimerID) {
    let mut data: *mut c_void = std::ptr::null_mut();
    // SAFETY: on success Redis hands back the data pointer we boxed in arm_deadline_timer.
    let ok = unsafe { raw::RedisModule_StopTimer.unwrap()(ctx, id, &mut data) };
    if ok == raw::REDISMODULE_OK as c_int && !data.is_null() {
        // SAFETY: see above; the timer will not fire any more, so the box is ours again.
        drop(unsafe { Box::from_raw(data.cast::<QueueKey>()) });
    }
}

extern "C" fn deadline_timer(ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    // SAFETY: data is the Box<QueueKey> created in arm_deadline_timer; a fired timer's data is
    // ours to free.
    let qk = *unsafe { Box::from_raw(data.cast::<QueueKey>()) };
    guard::callback("deadline timer", (), || {
        QUEUES.with(|q| {
            if let Some(queue) = q.borrow_mut().get_mut(&qk) {
                queue.timer = None;
            }
        });
        run(ctx, vec![Work::Settle(qk)]);
    })
}
