//! `LOCK.RELEASE key owner` -> 1 | 0

use redis_module::{raw, Context, RedisResult, RedisValue};

use crate::parse;
use crate::redis::guard::Args;
use crate::redis::key::{self, LockKey};
use crate::redis::{blocking, docs};
use crate::{state, stats};

pub fn run(ctx: &Context, args: &Args) -> RedisResult {
    let cmd = parse::release(args.bytes, state::max_owner_bytes())?;
    let now = key::now();
    let name = args.bytes[1];
    let mut lock_key = LockKey::open_raw(ctx.ctx, args.raw[1], key::READ_WRITE);
    let current = lock_key.lock()?;
    if key::applying_effects(ctx.ctx) {
        // Replayed from the primary or the AOF: the primary already decided this release was
        // valid, so apply it whatever this server's clock says about the deadline.
        if lock_key.remove(cmd.owner, None)?.is_some() {
            lock_key.delete_if_empty()?;
        }
        return Ok(RedisValue::Integer(1));
    }
    let Some(held) = current.and_then(|l| l.holder(cmd.owner, now)) else {
        return Ok(RedisValue::Integer(0));
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
    // The command itself is the effect: replayed on a replica or from the AOF it removes the
    // same holder (see above), and replicating it verbatim costs a fraction of building a
    // `DEL`. It goes before the handoffs, so that they reach replicas after it (`serve_looked`
    // says whether anyone is queued before it grants anything, from its own lookup of the
    // queue); an exclusive lock handed to a waiter needs none (the handoff replaces the whole
    // value there).
    let mut waiting = false;
    let granted = blocking::serve_looked(ctx.ctx, &mut lock_key, name, now, |queued| {
        waiting = queued;
        if queued && shared {
            key::replicate_verbatim(ctx.ctx);
        }
    })?;
    if !waiting {
        // Nobody queued: nothing was granted or replicated above.
        if shared && lock_key.delete_if_empty()? {
            // The last holder left a shared key: `DEL` alone, because the replica may still
            // keep holders that expired here unseen, and the key goes on both sides.
            lock_key.replicate_delete();
            return Ok(RedisValue::Integer(1));
        }
        key::replicate_verbatim(ctx.ctx);
        lock_key.delete_if_empty()?;
        return Ok(RedisValue::Integer(1));
    }
    if lock_key.delete_if_empty()? {
        if shared {
            lock_key.replicate_delete();
        } else if granted == 0 {
            key::replicate_verbatim(ctx.ctx);
        }
    }
    Ok(RedisValue::Integer(1))
}

pub const DOC: docs::Doc = docs::Doc {
    name: c"lock.release",
    summary:
        c"Releases owner's hold on a lock (exclusive or shared), handing what it frees to the \
               waiters at the head of the queue.",
    complexity: c"O(1)",
    arity: 3,
    key_flags: raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_DELETE,
    args: &[docs::KEY_ARG, docs::OWNER_ARG],
};
