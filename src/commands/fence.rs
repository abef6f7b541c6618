//! `LOCK.FENCE key [token]` -> token | nil, or with a token 1 | 0
//!
//! Read-only, so it runs on replicas, under read-only ACL key permissions, and inside Lua
//! scripts that fence a write: `if redis.call('LOCK.FENCE', KEYS[1], ARGV[1]) == 1 then ...`.

use redis_module::{raw, Context, RedisResult, RedisString, RedisValue};

use crate::lock;
use crate::parse;
use crate::redis::docs;
use crate::redis::key::{self, LockKey};

pub fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let raw = super::bytes(&args);
    let cmd = parse::fence(&raw)?;
    let now = key::now();
    let lock_key = LockKey::open_read(ctx, &args[1]);
    let current = lock_key.hold()?;
    Ok(match cmd.token {
        None => lock::live(current, now)
            .map_or(RedisValue::Null, |h| RedisValue::Integer(h.token as i64)),
        Some(token) => RedisValue::Integer(lock::fence_matches(current, token, now) as i64),
    })
}

pub const DOC: docs::Doc = docs::Doc {
    name: c"lock.fence",
    summary:
        c"Returns the live holder's fencing token, or with a token, whether it is the live one.",
    complexity: c"O(1)",
    arity: -2,
    key_flags: raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS,
    args: &[
        docs::KEY_ARG,
        docs::Arg {
            name: c"token",
            kind: docs::INTEGER,
            token: None,
            optional: true,
        },
    ],
};
