//! `LOCK.RELEASE key owner` -> 1 | 0

use redis_module::{Context, RedisResult, RedisString, RedisValue};

use crate::lock;
use crate::parse;
use crate::redis::blocking;
use crate::redis::key::{self, LockKey};
use crate::state;

pub fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let raw = super::bytes(&args);
    let cmd = parse::release(&raw, state::max_owner_bytes())?;
    let now = key::now();
    let name = &args[1];
    let mut lock_key = LockKey::open(ctx, name);
    if !lock::held_by(lock_key.hold()?, cmd.owner, now) {
        return Ok(RedisValue::Integer(0));
    }
    // With waiters queued, the lock goes straight to the first of them (overwriting this
    // hold); otherwise the key goes away.
    if blocking::serve(ctx.ctx, &mut lock_key, name.as_slice(), now)?.is_none() {
        lock_key.delete();
        lock_key.replicate_delete();
    }
    Ok(RedisValue::Integer(1))
}
