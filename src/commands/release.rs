//! `LOCK.RELEASE key owner` -> 1 | 0

use redis_module::{raw, Context, RedisResult, RedisString, RedisValue};

use crate::lock;
use crate::parse;
use crate::redis::key::{self, LockKey};
use crate::redis::{blocking, docs};
use crate::{state, stats};

pub fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let raw = super::bytes(&args);
    let cmd = parse::release(&raw, state::max_owner_bytes())?;
    let now = key::now();
    let name = &args[1];
    let mut lock_key = LockKey::open(ctx, name);
    let current = lock_key.hold()?;
    if key::applying_effects(ctx.ctx) {
        // Replayed from the primary or the AOF: the primary already decided this release was
        // valid, so apply it whatever this server's clock says about the deadline.
        if current.is_some_and(|h| h.owner == cmd.owner) {
            lock_key.delete();
        }
        return Ok(RedisValue::Integer(1));
    }
    if !lock::held_by(current, cmd.owner, now) {
        return Ok(RedisValue::Integer(0));
    }
    if let Some(granted_at) = current.map(|h| h.granted_at).filter(|t| *t > 0) {
        stats::HOLD_US.record(((now - granted_at).max(0) as u64) * 1000);
    }
    stats::RELEASED.incr();
    lock_key.notify(c"lock.released");
    // With waiters queued, the lock goes straight to the first of them: the handoff replicates
    // the new hold, which overwrites this one. Otherwise the key goes away, and the command
    // itself is the effect: replayed on a replica or from the AOF it deletes the same hold
    // (see above), and replicating it verbatim costs a fraction of building a `DEL`.
    if !blocking::serve(ctx.ctx, &mut lock_key, name.as_slice(), now)? {
        lock_key.delete();
        key::replicate_verbatim(ctx.ctx);
    }
    Ok(RedisValue::Integer(1))
}

pub const DOC: docs::Doc = docs::Doc {
    name: c"lock.release",
    summary: c"Releases a lock if owner holds it, handing it to the first waiter if any.",
    complexity: c"O(1)",
    arity: 3,
    key_flags: raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_DELETE,
    args: &[docs::KEY_ARG, docs::OWNER_ARG],
};
