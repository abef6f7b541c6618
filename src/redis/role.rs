//! When fencing tokens jump ahead: at start-up and when this server is promoted.
//!
//! A promoted replica (`REPLICAOF NO ONE`, a Sentinel failover, which sends that same command,
//! or a cluster failover) may have missed the newest grants of the old primary, and its clock
//! may be behind that primary's. A server started again may have lost the last grants (no
//! persistence, an RDB snapshot, `appendfsync everysec`). Before either mints anything, it
//! jumps its token high-water mark ahead by `lock.failover-token-margin-ms` (see
//! `TokenMint::skip_ahead` for the guarantee and its cost).
//!
//! At start-up there are two jumps, both before the server serves a command:
//! - [`started`], from the module's load: the mark is then `(now + margin) << 11`. Why here
//!   and not "when nothing was loaded": a start with no RDB or AOF file sends no loading event
//!   at all, so no event says "nothing to load". Why eagerly and not at the first grant: a
//!   replica that syncs before that first grant must receive the jumped mark (the RDB's aux
//!   field carries it), or, promoted, it would know neither the mark nor the grants it missed.
//! - [`on_loading`], when the start-up load from RDB or AOF ends: from the loaded mark, which
//!   may miss the last grants before a crash. Loads after the first grant (`DEBUG RELOAD`)
//!   and full syncs of a replica do not jump: they lose nothing.
//!
//! The role-change handler that calls [`changed`] lives in `blocking.rs`, which also fails the
//! waiters of a server that becomes a replica.

use std::cell::Cell;
use std::os::raw::{c_int, c_void};

use redis_module::{raw, Context};

use crate::redis::{guard, key};
use crate::state;

thread_local! {
    /// A start-up load from RDB or AOF is in progress.
    static DISK_LOAD: Cell<bool> = const { Cell::new(false) };
}

/// The module was just loaded (config applied, nothing loaded yet): jump from the clock.
pub fn started(ctx: &Context) {
    jump(ctx, "started");
}

/// Called for every `REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED` event.
pub fn changed(ctx: *mut raw::RedisModuleCtx, subevent: u64) {
    if subevent == raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_MASTER {
        jump(&Context::new(ctx), "promoted to primary");
    }
}

/// Subscribe to the loading events (for the jump after the start-up load).
pub fn subscribe(ctx: &Context) -> bool {
    let loading = raw::RedisModuleEvent {
        id: raw::REDISMODULE_EVENT_LOADING,
        dataver: 1,
    };
    // SAFETY: registration during module load with a callback of the matching signature.
    unsafe {
        raw::RedisModule_SubscribeToServerEvent.unwrap()(ctx.ctx, loading, Some(on_loading))
            == raw::REDISMODULE_OK as c_int
    }
}

extern "C" fn on_loading(
    ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    guard::callback("loading event", (), || match subevent {
        raw::REDISMODULE_SUBEVENT_LOADING_RDB_START
        | raw::REDISMODULE_SUBEVENT_LOADING_AOF_START => {
            DISK_LOAD.with(|d| d.set(state::starting()));
        }
        raw::REDISMODULE_SUBEVENT_LOADING_ENDED => {
            if DISK_LOAD.with(|d| d.replace(false)) {
                jump(&Context::new(ctx), "loaded its data");
            }
            // Loaded sessions expire from now on (a replica's timer ends nothing).
            crate::redis::session::arm_timer(ctx);
        }
        raw::REDISMODULE_SUBEVENT_LOADING_FAILED => DISK_LOAD.with(|d| d.set(false)),
        _ => {}
    })
}

fn jump(ctx: &Context, why: &str) {
    let before = state::token_high_water();
    let whole = state::skip_ahead(key::now());
    let after = state::token_high_water();
    let margin = state::failover_token_margin_ms();
    if whole {
        ctx.log_notice(&format!(
            "redis-lock: {why}; token high-water mark {before} -> {after} \
             (lock.failover-token-margin-ms {margin})"
        ));
    } else {
        ctx.log_warning(&format!(
            "redis-lock: {why}; token high-water mark {before} -> {after}, cut short below \
             2^53: new tokens may not exceed every token issued before"
        ));
    }
}
