//! `LOCK.INFO key` -> nil | {owner, token, ttl, waiters, mode, limit, holders, queue}, and the
//! `INFO lock` section.
//!
//! Fields are only ever added, after the ones a client may read by position (RESP2 pairs):
//! a holder's `session` (its serial), a waiter's `client`, `waited` and `timeout`.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;

use redis_module::{
    raw, redisvalue::RedisValueKey, Context, InfoContext, RedisResult, RedisString, RedisValue,
    Status,
};

use crate::error::Error;
use crate::lock::{Millis, Mode};
use crate::redis::key::{self, LockKey};
use crate::redis::{blocking, docs};
use crate::stats::{self, Summary};

pub fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 2 {
        return Err(Error::WrongArity.into());
    }
    let now = key::now();
    let lock_key = LockKey::open_read(ctx, &args[1]);
    // A key in its lock-delay is shown (with no holder): it never looks free.
    let Some(lock) = lock_key
        .lock()?
        .filter(|l| l.occupying(now).next().is_some())
    else {
        return Ok(RedisValue::Null);
    };
    let db = key::selected_db(ctx.ctx);
    let map = |pairs: Vec<(&str, RedisValue)>| {
        RedisValue::OrderedMap(
            pairs
                .into_iter()
                .map(|(k, v)| (RedisValueKey::String(k.to_string()), v))
                .collect::<BTreeMap<_, _>>(),
        )
    };
    let holders: Vec<RedisValue> = lock
        .live(now)
        .map(|h| {
            let mut fields = vec![
                ("owner", RedisValue::StringBuffer(h.owner.to_vec())),
                ("token", RedisValue::Integer(h.token as i64)),
                ("ttl", RedisValue::Integer(ttl_of(h.deadline, now))),
            ];
            // Only on session holds, so that replies without sessions are as they always
            // were: the session's serial (as `LOCK.SESSION LIST` shows it), never its id.
            if h.session != 0 {
                fields.push(("session", RedisValue::Integer(h.session as i64)));
            }
            map(fields)
        })
        .collect();
    let queue = blocking::queue_view(db, args[1].as_slice());
    // Shown in this order (a map under RESP3, flat pairs under RESP2): the fields an exclusive
    // lock showed before shared holders existed come first, unchanged. For a shared lock,
    // `token` is the largest live token (as `LOCK.FENCE key`) and `ttl` the time until the
    // last holder's deadline (as `PTTL`), and there is no single `owner`.
    let mut fields = vec![];
    if lock.mode() == Mode::Exclusive {
        if let Some(h) = lock.live(now).next() {
            fields.push(("owner", RedisValue::StringBuffer(h.owner.to_vec())));
        }
    }
    let last_deadline = lock.live(now).map(|h| h.deadline).max().unwrap_or(now);
    let limit = lock
        .mode()
        .limit()
        .map_or(RedisValue::Null, |n| RedisValue::Integer(n as i64));
    fields.extend([
        (
            "token",
            RedisValue::Integer(lock.max_token(now).unwrap_or(0) as i64),
        ),
        ("ttl", RedisValue::Integer(ttl_of(last_deadline, now))),
        ("waiters", RedisValue::Integer(queue.len() as i64)),
        ("mode", mode_name(lock.mode())),
        ("limit", limit),
        ("holders", RedisValue::Array(holders)),
        // Written below, in its own order (see `reply_queue`).
        ("queue", RedisValue::NoReply),
    ]);
    // Only while a lock-delay runs (as above, replies without one are unchanged): the ms
    // until the last delay on this key ends.
    if let Some(until) = lock.delayed_until(now) {
        fields.push(("delayed", RedisValue::Integer(until - now)));
    }
    // Only while the key is watched: the seq of the last change-feed message about it.
    if let Some(seq) = crate::redis::feed::seq(db, args[1].as_slice()) {
        fields.push(("seq", RedisValue::Integer(seq as i64)));
    }
    raw::reply_with_map(ctx.ctx, fields.len() as _);
    for (name, value) in fields {
        ctx.reply_with_key(RedisValueKey::String(name.to_string()));
        if name == "queue" {
            reply_queue(ctx, &queue);
        } else {
            ctx.reply(Ok(value));
        }
    }
    Ok(RedisValue::NoReply)
}

/// The queue, each waiter a map whose first two fields are the ones it always had (`mode`,
/// `owner`, in that order) and then `client` (its connection's id), `waited` (ms since it
/// queued) and `timeout` (ms its `BLOCK` leaves it, -1 for none).
fn reply_queue(ctx: &Context, queue: &[blocking::Queued]) {
    raw::reply_with_array(ctx.ctx, queue.len() as _);
    for w in queue {
        raw::reply_with_map(ctx.ctx, 5);
        let fields = [
            ("mode", mode_name(w.mode)),
            ("owner", RedisValue::StringBuffer(w.owner.clone())),
            ("client", RedisValue::Integer(w.client as i64)),
            ("waited", RedisValue::Integer(w.waited)),
            ("timeout", RedisValue::Integer(w.timeout)),
        ];
        for (name, value) in fields {
            ctx.reply_with_key(RedisValueKey::String(name.to_string()));
            ctx.reply(Ok(value));
        }
    }
}

/// Remaining ms, or -1 for a session hold with no deadline of its own (as `PTTL` shows it).
fn ttl_of(deadline: Millis, now: Millis) -> i64 {
    if deadline >= crate::lock::NO_DEADLINE {
        -1
    } else {
        deadline - now
    }
}

fn mode_name(mode: Mode) -> RedisValue {
    RedisValue::SimpleStringStatic(if mode.is_shared() {
        "shared"
    } else {
        "exclusive"
    })
}

/// The `INFO lock` section: fields are printed as `lock_<name>`.
#[allow(deprecated)] // the builder API cannot name a section after the module alone
pub fn info_section(ctx: &InfoContext) -> Status {
    let counters: [(&str, i64); 23] = [
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
        ("sessions", crate::redis::session::count() as i64),
        ("sessions_opened", stats::SESSIONS_OPENED.get() as i64),
        ("sessions_closed", stats::SESSIONS_CLOSED.get() as i64),
        ("sessions_expired", stats::SESSIONS_EXPIRED.get() as i64),
        (
            "sessions_disconnected",
            stats::SESSIONS_DISCONNECTED.get() as i64,
        ),
        ("sessions_killed", stats::SESSIONS_KILLED.get() as i64),
        ("sessions_detached", stats::SESSIONS_DETACHED.get() as i64),
        (
            "sessions_reattached",
            stats::SESSIONS_REATTACHED.get() as i64,
        ),
        (
            "sessions_grace_expired",
            stats::SESSIONS_GRACE_EXPIRED.get() as i64,
        ),
        (
            "session_holds_released",
            stats::SESSION_HOLDS_RELEASED.get() as i64,
        ),
        (
            "keys_in_lock_delay",
            crate::redis::session::keys_in_delay() as i64,
        ),
        ("sets_overtaken", stats::SETS_OVERTAKEN.get() as i64),
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
    // The same two distributions as flat numbers, a Prometheus histogram's `_count`, `_sum`
    // and cumulative `le` buckets, because an exporter takes only fields whose value is one
    // number (the summaries above are kept for whoever parses them already).
    for (name, histogram) in [("wait", &stats::WAIT_US), ("hold", &stats::HOLD_US)] {
        let (counts, sum_ms) = histogram.cumulative();
        let total = counts.last().copied().unwrap_or(0);
        ctx.add_info_field_long_long(&format!("{name}_ms_count"), total as i64);
        ctx.add_info_field_long_long(&format!("{name}_ms_sum"), sum_ms as i64);
        for (bound, count) in stats::LE_MS.iter().zip(&counts) {
            ctx.add_info_field_long_long(&format!("{name}_ms_le_{bound}"), *count as i64);
        }
        ctx.add_info_field_long_long(&format!("{name}_ms_le_inf"), total as i64);
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
    summary: c"Returns a held lock's mode, limit, holders (owner, token, remaining ttl, session \
               serial) and queued waiters (owner, mode, client id, ms waited, ms left), or nil.",
    complexity: c"O(N+M) with N holders and M waiters",
    arity: 2,
    key_flags: raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS,
    args: &[docs::KEY_ARG],
};
