//! Client pauses: while the server holds writes back, the module writes and replicates nothing.
//!
//! `CLIENT PAUSE ms WRITE|ALL`, `FAILOVER` and a manual `CLUSTER FAILOVER` pause writes so that
//! the dataset stays fixed while a replica catches up. The server asserts that nothing is
//! propagated then (`propagateNow` in `server.c`: `!(areClientsPaused() && ...)` on 7.0,
//! `isPausedActions(PAUSE_ACTION_REPLICA)` on 7.2+ and Valkey), and it does not expire keys: a
//! key whose TTL has passed is neither live nor gone, and writing it from a module aborts in
//! `setKey`. Client commands are held back by the server itself, so the module has only its own
//! paths to guard: the ones that write outside a client's command. Every one of them goes
//! through [`writes_paused`] before it touches the keyspace:
//!
//! - the deadline timer of a queue (`blocking::deadline_timer`): a handoff at a holder's deadline,
//!   exclusive, shared or to a `LOCK.MACQUIRE` set, with the pruning of expired holders it does;
//! - the deferred work (`blocking::deferred`), which is where every other trigger lands:
//!   a lock key unlinked by `DEL`, `RENAME`, `RESTORE ... REPLACE`, `MOVE`, expiry or eviction, a
//!   flush or `SWAPDB`; a waiter that left the head of a queue (its `BLOCK` timeout, a disconnect,
//!   `CLIENT UNBLOCK`), which may let the next one in; and the revoke of a grant whose client went
//!   away before its reply (`Work::Revoke`, queued from the blocked client's free callback).
//!
//! The callbacks that only answer clients (a `BLOCK` timeout's nil, the errors of a demotion to
//! replica) write nothing and stay as they are. Work that finds writes paused is held, in
//! order (`blocking::deferred::run`), and a poll timer runs it again the moment the pause is over.
//!
//! How the end is seen: `RedisModule_AvoidReplicaTraffic()` is true during any of these pauses on
//! every server of the matrix, and it ends the pause itself once its end time has passed. On
//! Redis 7.0 that end time is compared with the server's cached clock, which an idle server
//! refreshes only in its cron (up to 1000/hz ms late); the poll refreshes it first (see
//! [`refresh_server_clock`]) so that a lock due during a pause is served within a poll period
//! of the pause's end, as on the newer servers.

use redis_module::raw;

/// How often held work looks again whether the pause is over. Short enough that a handoff due
/// during a pause follows its end within a few ms; the poll runs only while work is held.
pub const POLL_MS: raw::mstime_t = 2;

/// True while the server forbids writes and propagation (a client pause or a failover in
/// progress): no path outside a client's command may write then.
pub fn writes_paused() -> bool {
    // SAFETY: RedisModule_AvoidReplicaTraffic takes no arguments and only reads (and, when the
    // pause has timed out, ends) the server's pause state.
    unsafe { raw::RedisModule_AvoidReplicaTraffic.unwrap()() != 0 }
}

/// Bring the server's cached clock up to date before [`writes_paused`] compares the pause's end
/// with it. On Redis 7.0 `server.mstime` moves only in `serverCron` and at the start of a
/// command; from a timer, a call through `RedisModule_Call` is such a start (`call()` refreshes
/// the cache when it is not nested). `PING` reads and writes nothing, and is not held back by
/// the pause (`RM_Call` does not go through the client pause check). Servers from 7.2 on (and
/// Valkey) refresh the clock every event-loop turn, so there it is skipped.
pub fn refresh_server_clock(ctx: *mut raw::RedisModuleCtx) {
    if !clock_cached_per_command() {
        return;
    }
    // SAFETY: ctx is the live context of the timer callback we are in; "" is the format of a
    // call with no arguments; the reply is freed at once.
    unsafe {
        let reply = raw::RedisModule_Call.unwrap()(ctx, c"PING".as_ptr(), c"".as_ptr());
        if !reply.is_null() {
            raw::RedisModule_FreeCallReply.unwrap()(reply);
        }
    }
}

/// True on servers before 7.2, whose cached clock does not move between commands.
fn clock_cached_per_command() -> bool {
    // SAFETY: RedisModule_GetServerVersion takes no arguments (0x00MMmmpp); it exists on 7.0.
    let version = unsafe { raw::RedisModule_GetServerVersion.map_or(0, |f| f()) };
    version < 0x00_07_02_00
}
