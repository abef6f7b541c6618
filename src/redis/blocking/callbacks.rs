//! The callbacks Redis calls for a blocked `LOCK.ACQUIRE` / `LOCK.MACQUIRE` client: the reply
//! (a grant, a failure or a timeout), Redis's own timeout and `CLIENT UNBLOCK`, a disconnect,
//! and the free of the outcome, which revokes a grant its client never heard of. Apart from the
//! queue logic in `blocking.rs` because these change with the server's blocking API, not with
//! how the queue is served.

use super::*;

pub(super) extern "C" fn reply_callback(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    guard::callback("blocked reply", raw::REDISMODULE_OK as c_int, || {
        // SAFETY: in a reply callback the private data is the Outcome we passed to
        // UnblockClient; it stays ours until free_outcome.
        let outcome =
            unsafe { raw::RedisModule_GetBlockedClientPrivateData.unwrap()(ctx).cast::<Outcome>() };
        // SAFETY: non-null private data is a live Box<Outcome> (see above).
        match unsafe { outcome.as_mut() } {
            Some(Outcome::Granted {
                token, delivered, ..
            }) => {
                *delivered = true;
                // SAFETY: ctx is the blocked client's reply context.
                unsafe { raw::RedisModule_ReplyWithLongLong.unwrap()(ctx, *token as i64) }
            }
            Some(Outcome::GrantedSet {
                tokens, delivered, ..
            }) => {
                *delivered = true;
                // SAFETY: ctx is the blocked client's reply context; one element per token.
                unsafe {
                    raw::RedisModule_ReplyWithArray.unwrap()(ctx, tokens.len() as _);
                    for token in tokens.iter() {
                        raw::RedisModule_ReplyWithLongLong.unwrap()(ctx, *token as i64);
                    }
                }
                raw::REDISMODULE_OK as c_int
            }
            Some(Outcome::Failed(msg)) => reply_error(ctx, msg),
            // SAFETY: ctx is the blocked client's reply context.
            Some(Outcome::TimedOut) => unsafe { raw::RedisModule_ReplyWithNull.unwrap()(ctx) },
            // SAFETY: ctx is the blocked client's reply context.
            Some(Outcome::Closed(n)) => unsafe {
                raw::RedisModule_ReplyWithLongLong.unwrap()(ctx, *n)
            },
            None => reply_error(ctx, "ERR internal error in redis-lock"),
        }
    })
}

fn reply_error(ctx: *mut raw::RedisModuleCtx, msg: &str) -> c_int {
    let msg = std::ffi::CString::new(msg).unwrap_or_default();
    // SAFETY: msg is a NUL-terminated string that outlives the call.
    unsafe { raw::RedisModule_ReplyWithError.unwrap()(ctx, msg.as_ptr()) }
}

pub(super) extern "C" fn timeout_callback(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    guard::callback("blocked timeout", raw::REDISMODULE_OK as c_int, || {
        // SAFETY: in a timeout callback the context carries the blocked client's handle.
        let bc = unsafe { raw::RedisModule_GetBlockedClientHandle.unwrap()(ctx) };
        if let Some(waiter) = remove_waiter(ctx, bc, None) {
            retire(&waiter);
            stats::TIMED_OUT.incr();
            // SAFETY: removed from the queue just now, so this is its only UnblockClient call;
            // it releases the handle (Redis requires it even after a timeout).
            unsafe { raw::RedisModule_UnblockClient.unwrap()(bc, std::ptr::null_mut()) };
        }
        // SAFETY: ctx is the timed-out client's context.
        unsafe { raw::RedisModule_ReplyWithNull.unwrap()(ctx) }
    })
}

pub(super) extern "C" fn disconnect_callback(
    ctx: *mut raw::RedisModuleCtx,
    bc: *mut raw::RedisModuleBlockedClient,
) {
    guard::callback("blocked disconnect", (), || {
        if let Some(waiter) = remove_waiter(ctx, bc, None) {
            retire(&waiter);
            // SAFETY: as in timeout_callback.
            unsafe { raw::RedisModule_UnblockClient.unwrap()(bc, std::ptr::null_mut()) };
        }
    })
}

pub(super) extern "C" fn free_outcome(ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    if data.is_null() {
        return;
    }
    // SAFETY: non-null private data is the Box<Outcome> from `unblock`, freed exactly once here.
    let outcome = *unsafe { Box::from_raw(data.cast::<Outcome>()) };
    guard::callback("blocked free", (), || match outcome {
        // The client went away between the grant and its reply: nobody knows this token,
        // so free the lock for the next waiter rather than let it sit until its deadline.
        Outcome::Granted {
            token,
            db,
            key,
            delivered: false,
        } => defer(ctx, Work::Revoke((db, key), token)),
        Outcome::GrantedSet {
            tokens,
            db,
            keys,
            delivered: false,
        } => {
            for (key, token) in keys.into_iter().zip(tokens) {
                defer(ctx, Work::Revoke((db, key), token));
            }
        }
        _ => {}
    })
}
