//! `LOCK.FENCE key [token]` -> token | nil, or with a token 1 | 0
//!
//! Read-only, so it runs on replicas, under read-only ACL key permissions, and inside Lua
//! scripts that fence a write: `if redis.call('LOCK.FENCE', KEYS[1], ARGV[1]) == 1 then ...`.

use redis_module::{raw, Context, RedisResult, RedisString, RedisValue};

use crate::parse;
use crate::redis::docs;
use crate::redis::key::{self, LockKey};

pub fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let raw = super::bytes(&args);
    let cmd = parse::fence(&raw)?;
    let now = key::now();
    let lock_key = LockKey::open_read(ctx, &args[1]);
    let current = lock_key.lock()?;
    Ok(match cmd.token {
        None => current
            .and_then(|l| l.max_token(now))
            .map_or(RedisValue::Null, |t| RedisValue::Integer(t as i64)),
        Some(token) => RedisValue::Integer(current.is_some_and(|l| l.fences(token, now)) as i64),
    })
}

pub const DOC: docs::Doc = docs::Doc {
    name: c"lock.fence",
    summary: c"Returns the largest fencing token among the live holders, or with a token, \
               whether it is a live holder's.",
    complexity: c"O(1) for an exclusive lock; O(N) with N holders of a shared one",
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
