//! What the server tells the module about many keys at once, or about a key behind its back:
//! a lock key unlinked (`DEL`, `RENAME`, expiry, ...), a key loaded with holds of a session this
//! server does not have, flushes and `SWAPDB`, a change of role; and the subscriptions to those
//! events. Apart from the queue logic in `blocking.rs` because they change with the server's
//! event API, not with how a queue is served.

use super::*;

/// A lock key left the keyspace (called from the type's unlink callback, in the middle of the
/// deletion): if it has waiters, look at it again once the current command is done.
pub fn key_unlinked(db: i32, key: &[u8]) {
    if QUEUED_KEYS.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        return;
    }
    let qk = (db, key.to_vec());
    let queued = QUEUES.with(|q| q.try_borrow().map_or(true, |q| q.contains_key(&qk)));
    if queued {
        let ctx = DETACHED.with(Cell::get);
        if !ctx.is_null() {
            defer(ctx, Work::Settle(qk));
        }
    }
}

/// A key was loaded (`RESTORE`, the end of a `MIGRATE`) with session holds of a session this
/// server does not have: they became plain holds with a deadline (see `datatype`), and the
/// key's Redis expiry must follow, which a load cannot set. Done after the command.
pub fn orphans_loaded(db: i32, key: &[u8]) {
    let ctx = DETACHED.with(Cell::get);
    if !ctx.is_null() {
        defer(ctx, Work::SyncExpiry((db, key.to_vec())));
    }
}

/// Give `qk`'s key the Redis expiry of its holders, and replicas its holders as they are now.
pub(super) fn sync_expiry(ctx: *mut raw::RedisModuleCtx, qk: &QueueKey) {
    if key::context_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_SLAVE != 0 || !key::select_db(ctx, qk.0)
    {
        return;
    }
    let name = RedisString::create_from_slice(ctx, &qk.1);
    let mut lock_key = LockKey::open_raw(ctx, name.inner, raw::KeyMode::READ | raw::KeyMode::WRITE);
    let owners: Vec<Vec<u8>> = match lock_key.lock() {
        Ok(Some(lock)) => lock.holders().map(|h| h.owner.to_vec()).collect(),
        _ => return,
    };
    if lock_key.delete_if_empty().is_ok() {
        for owner in owners {
            lock_key.replicate_holder(&owner, key::now());
        }
    }
}

/// `FLUSHDB`, `FLUSHALL`, `SWAPDB` (and the flush inside `DEBUG RELOAD`) change many keys
/// without per-key notifications: look at every key with waiters again.
extern "C" fn on_dataset_event(
    ctx: *mut raw::RedisModuleCtx,
    eid: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    guard::callback("flush/swapdb event", (), || {
        // Sessions outlive a flush (they are not keys), but their records of where their holds
        // were must follow the keys.
        if !data.is_null() {
            if eid.id == raw::REDISMODULE_EVENT_SWAPDB {
                // SAFETY: for this event the data is a RedisModuleSwapDbInfo.
                let info = unsafe { &*data.cast::<raw::RedisModuleSwapDbInfo>() };
                session::with(|s| s.swap_db(info.dbnum_first, info.dbnum_second));
                for db in [info.dbnum_first, info.dbnum_second] {
                    crate::redis::feed::database_event(Some(db), crate::redis::feed::Kind::Swapped);
                }
            } else if subevent == raw::REDISMODULE_SUBEVENT_FLUSHDB_END {
                // SAFETY: for this event the data is a RedisModuleFlushInfo.
                let info = unsafe { &*data.cast::<raw::RedisModuleFlushInfo>() };
                let db = (info.dbnum >= 0).then_some(info.dbnum);
                session::with(|s| s.forget_holds(db));
                crate::redis::feed::database_event(db, crate::redis::feed::Kind::Flushed);
            }
        }
        let keys: Vec<QueueKey> = QUEUES.with(|q| q.borrow().keys().cloned().collect());
        for qk in keys {
            defer(ctx, Work::Settle(qk));
        }
    })
}

/// Demoted to replica: this server can no longer grant, so no waiter may stay queued.
/// (Redis also disconnects blocked clients itself on `REPLICAOF`; this covers any that remain.)
extern "C" fn on_role_changed(
    ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    guard::callback("role change event", (), || {
        crate::redis::role::changed(ctx, subevent);
        if subevent != raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_REPLICA {
            // Promoted: sessions keep their deadlines and now expire by this server's clock.
            // None is bound: a replica's sessions never are.
            session::arm_timer(ctx);
            return;
        }
        // In a cluster the server has already sunsubscribed the slot's watchers here, and a
        // shard message from this node, now a replica, would be forwarded to its new primary's
        // subscribers: a `demoted` there, numbered by this node's seq (seen under load in CI run
        // 35, tests/cluster/failover_feed.rs). The `sunsubscribe` is the marker there.
        if key::context_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_CLUSTER == 0 {
            crate::redis::feed::database_event(None, crate::redis::feed::Kind::Demoted);
        }
        // Demoted: the new primary decides when sessions end; connections here no longer
        // bind them, and none is detached (its `RENEW`s apply as the new primary sends them).
        session::with(|s| s.unbind_all());
        let keys: Vec<QueueKey> = QUEUES.with(|q| q.borrow().keys().cloned().collect());
        for qk in keys {
            fail_all(
                ctx,
                &qk,
                "UNBLOCKED this server became a replica while the client waited",
            );
        }
    })
}

/// Subscribe to the server events that can free many locks behind our back. (Single keys are
/// watched through the type's unlink callback, see `datatype::unlink`.)
pub fn subscribe(ctx: &Context) -> bool {
    // SAFETY: registration calls during module load with matching callback signatures; the
    // detached context lives as long as the module (it is never freed).
    unsafe {
        let detached = raw::RedisModule_GetDetachedThreadSafeContext.unwrap()(ctx.ctx);
        DETACHED.with(|d| d.set(detached));
        crate::redis::feed::init(detached);
        let ok = !detached.is_null();
        let subscribe = raw::RedisModule_SubscribeToServerEvent.unwrap();
        let flush = raw::RedisModuleEvent {
            id: raw::REDISMODULE_EVENT_FLUSHDB,
            dataver: 1,
        };
        let swap = raw::RedisModuleEvent {
            id: raw::REDISMODULE_EVENT_SWAPDB,
            dataver: 1,
        };
        let role = raw::RedisModuleEvent {
            id: raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
            dataver: 1,
        };
        ok && subscribe(ctx.ctx, flush, Some(on_dataset_event)) == raw::REDISMODULE_OK as c_int
            && subscribe(ctx.ctx, swap, Some(on_dataset_event)) == raw::REDISMODULE_OK as c_int
            && subscribe(ctx.ctx, role, Some(on_role_changed)) == raw::REDISMODULE_OK as c_int
    }
}
