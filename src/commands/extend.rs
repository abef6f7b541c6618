//! `LOCK.EXTEND key owner ttl-ms` -> 1 | 0

use redis_module::{Context, RedisResult, RedisString, RedisValue};

use crate::error;
use crate::lock::{self, Hold};
use crate::parse;
use crate::redis::blocking;
use crate::redis::key::{self, LockKey};
use crate::state;

pub fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let raw = super::bytes(&args);
    let cmd = parse::extend(&raw, state::max_owner_bytes())?;
    let now = key::now();
    let deadline = lock::deadline_after(now, cmd.ttl).ok_or_else(error::ttl_too_large)?;
    let name = &args[1];
    let mut lock_key = LockKey::open(ctx, name);
    let current = lock_key.hold()?;
    if !lock::held_by(current, cmd.owner, now) {
        return Ok(RedisValue::Integer(0));
    }
    let token = current.map_or(0, |h| h.token);
    lock_key.set_deadline(deadline)?;
    lock_key.replicate_hold(&Hold {
        owner: cmd.owner.to_vec(),
        token,
        deadline,
    });
    blocking::deadline_changed(ctx.ctx, name.as_slice(), deadline);
    Ok(RedisValue::Integer(1))
}
