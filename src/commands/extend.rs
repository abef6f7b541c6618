//! `LOCK.EXTEND key owner ttl-ms` -> 1 | 0

use redis_module::{raw, Context, RedisResult, RedisString, RedisValue};

use crate::error;
use crate::lock;
use crate::parse;
use crate::redis::key::{self, LockKey};
use crate::redis::{blocking, docs};
use crate::{state, stats};

pub fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let raw = super::bytes(&args);
    let cmd = parse::extend(&raw, state::max_owner_bytes())?;
    let now = key::now();
    let deadline = lock::deadline_after(now, cmd.ttl).ok_or_else(error::ttl_too_large)?;
    let name = &args[1];
    let mut lock_key = LockKey::open(ctx, name);
    if !lock::held_by(lock_key.lock()?, cmd.owner, now) {
        return Ok(RedisValue::Integer(0));
    }
    lock_key.set_deadline(cmd.owner, deadline, now)?;
    lock_key.replicate_holder(cmd.owner, now);
    lock_key.notify(c"lock.extended");
    stats::EXTENDED.incr();
    blocking::deadline_changed(ctx.ctx, &lock_key, name.as_slice(), now);
    Ok(RedisValue::Integer(1))
}

pub const DOC: docs::Doc = docs::Doc {
    name: c"lock.extend",
    summary:
        c"Moves the deadline of owner's hold (exclusive or shared) to ttl-ms milliseconds from now.",
    complexity: c"O(1)",
    arity: 4,
    key_flags: raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_UPDATE,
    args: &[docs::KEY_ARG, docs::OWNER_ARG, docs::TTL_ARG],
};
