//! `LOCK.MRELEASE numkeys key [key ...] owner` -> number of locks released
//!
//! Releases each listed key that `owner` holds (in any mode), then hands each freed key to
//! its queue. One step, and one replication entry for the releases: the command itself.

use redis_module::{raw, Context, RedisResult, RedisString, RedisValue};

use crate::parse;
use crate::redis::key::{self, LockKey};
use crate::redis::{blocking, docs};
use crate::{state, stats};

pub fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if super::report_numkeys_keys(ctx, &args) {
        return Ok(RedisValue::NoReply);
    }
    let raw = super::bytes(&args);
    let cmd = parse::mrelease(&raw, state::max_owner_bytes(), state::max_multi_keys())?;
    let now = key::now();
    let names = &args[2..2 + cmd.keys.len()];
    // Every key must be ours (or empty) before anything changes.
    for name in names {
        LockKey::open(ctx, name).lock()?;
    }
    if key::applying_effects(ctx.ctx) {
        // Replayed from the primary or the AOF: apply whatever this server's clock says (see
        // `commands::release`).
        for name in names {
            let mut lock_key = LockKey::open(ctx, name);
            if lock_key.remove(cmd.owner, None)?.is_some() {
                lock_key.delete_if_empty()?;
            }
        }
        return Ok(RedisValue::Integer(names.len() as i64));
    }
    // Keys are opened one at a time: handing a key to a multi-key waiter opens that waiter's
    // other keys, which may be among ours.
    let mut released = vec![];
    for name in names {
        let mut lock_key = LockKey::open(ctx, name);
        let current = lock_key.lock()?;
        let Some(held) = current.and_then(|l| l.holder(cmd.owner, now)) else {
            continue;
        };
        if held.granted_at > 0 {
            stats::HOLD_US.record(((now - held.granted_at).max(0) as u64) * 1000);
        }
        let shared = current.is_some_and(|l| l.mode().is_shared());
        let token = held.token;
        stats::RELEASED.incr();
        lock_key.notify(c"lock.released");
        lock_key.feed(crate::redis::feed::Kind::Released, cmd.owner, token, None);
        lock_key.remove(cmd.owner, Some(now))?;
        released.push((name, shared));
    }
    if released.is_empty() {
        return Ok(RedisValue::Integer(0));
    }
    // The command is the effect (as for LOCK.RELEASE): replayed, it removes the same holders.
    // It goes first, so that the handoffs below reach replicas after it.
    key::replicate_verbatim(ctx.ctx);
    for (name, shared) in &released {
        let mut lock_key = LockKey::open(ctx, name);
        blocking::serve(ctx.ctx, &mut lock_key, name.as_slice(), now)?;
        if lock_key.delete_if_empty()? && *shared {
            // The replica may still keep holders that expired here and were never replicated
            // as gone: the key goes on both sides.
            lock_key.replicate_delete();
        }
    }
    Ok(RedisValue::Integer(released.len() as i64))
}

pub const DOC: docs::Doc = docs::Doc {
    name: c"lock.mrelease",
    summary: c"Releases owner's hold on each of the keys, in one step, handing each freed key to \
               the waiters at the head of its queue; returns how many were released.",
    complexity: c"O(N) with N keys",
    arity: -4,
    key_flags: raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_DELETE,
    args: &[docs::NUMKEYS_ARG, docs::KEY_ARG, docs::OWNER_ARG],
};
