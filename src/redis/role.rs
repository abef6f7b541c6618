//! What a change of replication role means for fencing tokens.
//!
//! A replica promoted to primary (`REPLICAOF NO ONE`, a Sentinel failover, which sends that
//! same command, or a cluster failover) may have missed the newest grants of the old primary,
//! and its clock may be behind that primary's. Before it mints anything, it jumps its token
//! high-water mark ahead by `lock.failover-token-margin-ms` (see `TokenMint::skip_ahead` for
//! the guarantee and its cost). The event handler that calls this lives in `blocking.rs`,
//! which also fails the waiters of a server that becomes a replica.

use redis_module::{raw, Context};

use crate::redis::key;
use crate::state;

/// Called for every `REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED` event.
pub fn changed(ctx: *mut raw::RedisModuleCtx, subevent: u64) {
    if subevent != raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_MASTER {
        return;
    }
    let before = state::token_high_water();
    let whole = state::skip_ahead(key::now());
    let after = state::token_high_water();
    let margin = state::failover_token_margin_ms();
    let ctx = Context::new(ctx);
    if whole {
        ctx.log_notice(&format!(
            "redis-lock: promoted to primary; token high-water mark {before} -> {after} \
             (lock.failover-token-margin-ms {margin})"
        ));
    } else {
        ctx.log_warning(&format!(
            "redis-lock: promoted to primary; token high-water mark {before} -> {after}, cut \
             short below 2^53: new tokens may not exceed every token of the old primary"
        ));
    }
}
