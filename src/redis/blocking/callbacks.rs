//! The callbacks Redis calls for a blocked `LOCK.ACQUIRE` / `LOCK.MACQUIRE` client: the reply
//! (a grant, a failure or a timeout), Redis's own timeout and `CLIENT UNBLOCK`, a disconnect,
//! and the free of the outcome, which revokes a grant its client never heard of. Apart from the
//! queue logic in `blocking.rs` because these change with the server's blocking API, not with
//! how the queue is served.

use super::*;
use std::sync::atomic::AtomicBool;

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
            return;
        }
        // Not queued: this turn already handed the client its outcome (a grant, a failure),
        // and the server is dropping it unread. A disconnect, or a CLIENT UNBLOCK in the same
        // turn, which on the servers of `LOSES_RACED_REPLIES` leaves the client connected
        // with no reply at all: it would wait forever.
        if !LOSES_RACED_REPLIES.load(Relaxed) {
            return;
        }
        // SAFETY: ctx is the disconnect context; its private data is what we passed to
        // UnblockClient (null if nothing), and its client is the blocked one.
        let (data, id) = unsafe {
            (
                raw::RedisModule_GetBlockedClientPrivateData.unwrap()(ctx),
                raw::RedisModule_GetClientId.unwrap()(ctx),
            )
        };
        if !data.is_null() && id != 0 {
            UNDELIVERED.with(|u| u.borrow_mut().insert(data as usize, id));
        }
    })
}

thread_local! {
    /// Outcomes whose reply the server dropped while their client may still be connected
    /// (see `disconnect_callback`): the outcome's address -> that client's id.
    static UNDELIVERED: RefCell<HashMap<usize, u64>> = RefCell::new(HashMap::new());
}

/// Set at load on a server that drops the reply of a module-blocked client that `CLIENT
/// UNBLOCK` reaches in the turn the module unblocked it: Redis before 7.4 (and Valkey 7.2) runs
/// the module's disconnect path there, which detaches the reply, and answers nothing itself
/// (redis/redis#13015 made it skip such a client). There the module closes that connection, so
/// its caller sees an error at once instead of waiting forever; the outcome, if a grant, is
/// revoked like any undelivered grant.
static LOSES_RACED_REPLIES: AtomicBool = AtomicBool::new(true);

/// Read which server this is (at load): see [`LOSES_RACED_REPLIES`]. An unreadable version
/// counts as an old one, whose cost is a needless close at worst.
pub fn note_server(ctx: &Context) {
    use crate::redis::server::Server;
    let loses = match Server::read(ctx) {
        Some(Server::Redis(release)) => release < (7, 4),
        Some(Server::Valkey(release)) => release < (8, 0),
        None => true,
    };
    LOSES_RACED_REPLIES.store(loses, Relaxed);
}

/// Close client `id` from the next turn of the event loop: after this turn has written what it
/// did get (an `UNBLOCKED` error), and outside the server's own unblocking code.
fn close_later(ctx: *mut raw::RedisModuleCtx, id: u64) {
    // SAFETY: the callback matches RedisModuleTimerProc; the data is the id itself, no pointer.
    unsafe {
        raw::RedisModule_CreateTimer.unwrap()(ctx, 0, Some(close_timer), id as usize as *mut c_void)
    };
}

extern "C" fn close_timer(ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    guard::callback("close a client whose reply was dropped", (), || {
        let id = (data as usize).to_string();
        let ctx = Context::new(ctx);
        // Gone already (a real disconnect): the server answers an error, and nothing is done.
        if let Ok(redis_module::RedisValue::Integer(1)) = ctx.call("CLIENT", &["KILL", "ID", &id]) {
            ctx.log_notice(&format!(
                "redis-lock: closed client id {id}: CLIENT UNBLOCK reached it in the turn its \
                 LOCK.ACQUIRE was answered, and this server drops that reply (Redis before 7.4); \
                 a grant it never heard of was revoked"
            ));
        }
    })
}

pub(super) extern "C" fn free_outcome(ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    if data.is_null() {
        return;
    }
    // SAFETY: non-null private data is the Box<Outcome> from `unblock`, freed exactly once here.
    let outcome = *unsafe { Box::from_raw(data.cast::<Outcome>()) };
    if let Some(id) = UNDELIVERED.with(|u| u.borrow_mut().remove(&(data as usize))) {
        close_later(ctx, id);
    }
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
