//! `LOCK.EXTEND key owner ttl-ms` -> 1 | 0 (ttl-ms 0: a session hold with no deadline of its own)

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
    lock::deadline_after(now, cmd.ttl).ok_or_else(error::ttl_too_large)?;
    let name = &args[1];
    let mut lock_key = LockKey::open(ctx, name);
    let held = lock_key.lock()?.and_then(|l| l.holder(cmd.owner, now));
    // A hold in a session may drop its own deadline again (0); anything else keeps the reply
    // a 0 always had.
    if cmd.ttl == 0 && held.is_none_or(|h| h.session == 0) {
        return Err(error::zero_ttl_needs_session().into());
    }
    let Some(held) = held else {
        return Ok(RedisValue::Integer(0));
    };
    let deadline = blocking::hold_deadline(now, cmd.ttl, held.session);
    let token = held.token;
    lock_key.set_deadline(cmd.owner, deadline, now)?;
    lock_key.replicate_holder(cmd.owner, now);
    lock_key.notify(c"lock.extended");
    lock_key.feed(
        crate::redis::feed::Kind::Extended,
        cmd.owner,
        token,
        Some(deadline),
    );
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
