//! `LOCK.INFO key` -> nil | {owner, token, ttl, waiters}, and the `INFO lock` section.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;

use redis_module::{
    raw, redisvalue::RedisValueKey, Context, InfoContext, RedisResult, RedisString, RedisValue,
    Status,
};

use crate::error::Error;
use crate::lock;
use crate::redis::key::{self, LockKey};
use crate::redis::{blocking, docs};
use crate::stats::{self, Summary};

pub fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 2 {
        return Err(Error::WrongArity.into());
    }
    let now = key::now();
    let lock_key = LockKey::open_read(ctx, &args[1]);
    let Some(hold) = lock::live(lock_key.hold()?, now) else {
        return Ok(RedisValue::Null);
    };
    let waiters = blocking::waiters(key::selected_db(ctx.ctx), args[1].as_slice());
    // Field names sort in the order we want them shown: owner, token, ttl, waiters.
    let mut fields = BTreeMap::new();
    let mut put = |k: &str, v| fields.insert(RedisValueKey::String(k.to_string()), v);
    put("owner", RedisValue::StringBuffer(hold.owner.clone()));
    put("token", RedisValue::Integer(hold.token as i64));
    put("ttl", RedisValue::Integer(hold.deadline - now));
    put("waiters", RedisValue::Integer(waiters as i64));
    Ok(RedisValue::OrderedMap(fields))
}

/// The `INFO lock` section: fields are printed as `lock_<name>`.
#[allow(deprecated)] // the builder API cannot name a section after the module alone
pub fn info_section(ctx: &InfoContext) -> Status {
    let counters: [(&str, i64); 11] = [
        ("locks", stats::LOCK_VALUES.load(Relaxed).max(0)),
        ("waiters", blocking::total_waiters() as i64),
        ("waiting_keys", blocking::waiting_keys() as i64),
        ("acquired", stats::ACQUIRED.get() as i64),
        ("contended", stats::CONTENDED.get() as i64),
        ("handed_off", stats::HANDED_OFF.get() as i64),
        ("released", stats::RELEASED.get() as i64),
        ("extended", stats::EXTENDED.get() as i64),
        ("expired", stats::EXPIRED.get() as i64),
        ("timed_out", stats::TIMED_OUT.get() as i64),
        ("token_high_water", crate::state::token_high_water() as i64),
    ];
    if ctx.add_info_section(None) == Status::Err {
        return Status::Err;
    }
    for (name, value) in counters {
        ctx.add_info_field_long_long(name, value);
    }
    for (name, summary) in [
        ("wait", stats::WAIT_US.summary()),
        ("hold", stats::HOLD_US.summary()),
    ] {
        ctx.add_info_field_str(&format!("{name}_ms"), &describe(&summary));
    }
    Status::Ok
}

/// `count=..,mean=..,p50=..,p90=..,p99=..,max=..` in milliseconds, like `INFO commandstats`.
fn describe(s: &Summary) -> String {
    let ms = |us: u64| format!("{:.3}", us as f64 / 1000.0);
    format!(
        "count={},mean={},p50={},p90={},p99={},max={}",
        s.count,
        ms(s.mean),
        ms(s.p50),
        ms(s.p90),
        ms(s.p99),
        ms(s.max)
    )
}

pub const DOC: docs::Doc = docs::Doc {
    name: c"lock.info",
    summary:
        c"Returns the owner, token, remaining ttl and number of waiters of a held lock, or nil.",
    complexity: c"O(1)",
    arity: 2,
    key_flags: raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS,
    args: &[docs::KEY_ARG],
};
