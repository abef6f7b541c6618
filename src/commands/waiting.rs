//! `LOCK.WAITING [COUNT n]` -> [{db, key, waiters, oldest}, ...]: the keys with waiters on this
//! node, most contended first (the longest queue, then the longest wait).
//!
//! Read-only and keyless: it finds the keys in the module's own queue index, never by scanning
//! the keyspace. It reveals key names, so it shows a user only the keys it could read with
//! `LOCK.INFO` (its ACL key patterns, checked per key with `RedisModule_ACLCheckKeyPermissions`):
//! a user limited to `~app:*` sees the contended `app:` keys and nothing of the others, not even
//! how many there are. Keys of every database are shown, each with its database.

use redis_module::{raw, redisvalue::RedisValueKey, Context, RedisResult, RedisString, RedisValue};

use crate::parse;
use crate::redis::{acl, blocking, docs};

pub fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let raw = super::bytes(&args);
    let count = parse::waiting(&raw)?;
    let reader = acl::KeyReader::of_caller(ctx);
    let keys = blocking::contended(count, |_, key| {
        reader.as_ref().is_some_and(|r| r.may_read(key))
    });
    raw::reply_with_array(ctx.ctx, keys.len() as _);
    for k in keys {
        raw::reply_with_map(ctx.ctx, 4);
        let fields = [
            ("db", RedisValue::Integer(k.db as i64)),
            ("key", RedisValue::StringBuffer(k.key)),
            ("waiters", RedisValue::Integer(k.waiters as i64)),
            ("oldest", RedisValue::Integer(k.oldest)),
        ];
        for (name, value) in fields {
            ctx.reply_with_key(RedisValueKey::String(name.to_string()));
            ctx.reply(Ok(value));
        }
    }
    Ok(RedisValue::NoReply)
}

pub const DOC: docs::Doc = docs::Doc {
    name: c"lock.waiting",
    summary: c"Returns the keys with waiters that the caller may read, most contended first \
               (queue length, then the longest wait): database, key, waiters, ms waited by the \
               oldest.",
    complexity: c"O(K log K + W) with K keys with waiters and W waiters on this node",
    arity: -1,
    key_flags: 0,
    args: &[docs::Arg {
        name: c"count",
        kind: docs::INTEGER,
        token: Some(c"COUNT"),
        optional: true,
    }],
};
