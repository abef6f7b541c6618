//! `LOCK.WATCH key` -> [channel, seq]: this connection watches `key` until it closes or sends
//! `LOCK.UNWATCH key` (-> 1 | 0). While a key is watched, every change of its holders is
//! published to `channel` (sharded pub/sub: `SSUBSCRIBE channel`). See `crate::redis::feed`.
//!
//! Flagged `write`, although it changes no key: a watch must be made on the primary, where the
//! changes happen (a replica would take it and publish nothing).
//!
//! Both are refused inside `EVAL`/`FCALL`: a watch lasts until its connection closes, and the
//! script's client never closes, so a script's watch (and its memory) would never end.

use redis_module::{raw, Context, RedisResult, RedisString, RedisValue};

use crate::error::Error;
use crate::redis::key::{self, LockKey};
use crate::redis::{docs, feed, session};

pub fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 2 {
        return Err(Error::WrongArity.into());
    }
    super::not_from_script(ctx, "LOCK.WATCH")?;
    // A key of another type is refused, as every lock command refuses it.
    LockKey::open_read(ctx, &args[1]).lock()?;
    let db = key::selected_db(ctx.ctx);
    let (channel, seq) = feed::watch(session::client_id(ctx), db, args[1].as_slice());
    Ok(RedisValue::Array(vec![
        RedisValue::StringBuffer(channel),
        RedisValue::Integer(seq as i64),
    ]))
}

pub fn run_unwatch(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 2 {
        return Err(Error::WrongArity.into());
    }
    // Nothing a script could unwatch (it cannot watch), and the script client is shared by every
    // script of every user: refused like LOCK.WATCH, so the rule reads the same for both.
    super::not_from_script(ctx, "LOCK.UNWATCH")?;
    let db = key::selected_db(ctx.ctx);
    let was = feed::unwatch(session::client_id(ctx), db, args[1].as_slice());
    Ok(RedisValue::Integer(was as i64))
}

pub const DOC: docs::Doc = docs::Doc {
    name: c"lock.watch",
    summary: c"Watches a lock key from this connection: every change of its holders is published \
               to the returned sharded pub/sub channel while the connection stays open; returns \
               the channel and the key's current sequence number.",
    complexity: c"O(1)",
    arity: 2,
    key_flags: raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS,
    args: &[docs::KEY_ARG],
};

pub const UNWATCH_DOC: docs::Doc = docs::Doc {
    name: c"lock.unwatch",
    summary: c"Stops this connection's watch of a lock key; 1 if it was watching, else 0.",
    complexity: c"O(1)",
    arity: 2,
    key_flags: raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS,
    args: &[docs::KEY_ARG],
};
