//! `LOCK.ACQUIRE key owner ttl-ms [BLOCK timeout-ms]` -> token | nil

use redis_module::{raw, Context, RedisResult, RedisString, RedisValue};

use crate::error;
use crate::lock::{self, Acquire, Hold};
use crate::parse;
use crate::redis::key::{self, LockKey};
use crate::redis::{blocking, docs};
use crate::{state, stats};

pub fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let raw = super::bytes(&args);
    let cmd = parse::acquire(&raw, state::max_owner_bytes())?;
    let now = key::now();
    let deadline = lock::deadline_after(now, cmd.ttl).ok_or_else(error::ttl_too_large)?;
    let name = &args[1];
    let mut lock_key = LockKey::open(ctx, name);
    let queued = blocking::has_waiters(key::selected_db(ctx.ctx), name.as_slice());
    let mut decision = lock::decide_acquire(lock_key.hold()?, cmd.owner, now, queued);
    if decision == Acquire::ServeQueue {
        // The lock is free but others queued first: hand it to them, never to this caller.
        decision = if blocking::serve(ctx.ctx, &mut lock_key, name.as_slice(), now)? {
            Acquire::Busy
        } else {
            Acquire::Grant
        };
    }
    match decision {
        Acquire::Retry { token } => {
            lock_key.set_deadline(deadline)?;
            lock_key.replicate_hold();
            blocking::deadline_changed(ctx.ctx, name.as_slice(), deadline);
            Ok(RedisValue::Integer(token as i64))
        }
        Acquire::Grant => {
            let token = state::next_token(now);
            let hold = Hold {
                owner: cmd.owner.to_vec(),
                token,
                deadline,
                granted_at: now,
            };
            lock_key.put(hold, now)?;
            lock_key.replicate_hold();
            lock_key.notify(c"lock.acquired");
            stats::ACQUIRED.incr();
            Ok(RedisValue::Integer(token as i64))
        }
        Acquire::Busy | Acquire::ServeQueue => {
            stats::CONTENDED.incr();
            match cmd.block {
                Some(timeout) if blocking::may_block(ctx) => {
                    let holder_deadline = lock_key.hold()?.map_or(now, |h| h.deadline);
                    drop(lock_key);
                    blocking::block(
                        ctx,
                        name.as_slice(),
                        cmd.owner,
                        cmd.ttl,
                        timeout,
                        holder_deadline,
                    )?;
                    Ok(RedisValue::NoReply)
                }
                _ => Ok(RedisValue::Null),
            }
        }
    }
}

pub const DOC: docs::Doc = docs::Doc {
    name: c"lock.acquire",
    summary: c"Acquires a lock for ttl-ms milliseconds and returns its fencing token; \
               with BLOCK, waits in the key's FIFO queue.",
    complexity: c"O(1)",
    arity: -4,
    key_flags: raw::REDISMODULE_CMD_KEY_RW
        | raw::REDISMODULE_CMD_KEY_ACCESS
        | raw::REDISMODULE_CMD_KEY_UPDATE,
    args: &[
        docs::KEY_ARG,
        docs::OWNER_ARG,
        docs::TTL_ARG,
        docs::Arg {
            name: c"timeout-ms",
            kind: docs::INTEGER,
            token: Some(c"BLOCK"),
            optional: true,
        },
    ],
};
