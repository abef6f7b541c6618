//! `LOCK.LOAD key owner token deadline-ms [SHARED [LIMIT n]] [PRUNE ms] [SESSION serial]
//! [DELAY ms]` -> OK
//!
//! The deterministic effect of a grant, retry, extend or handoff, as the primary replicates it
//! and as a rewritten AOF stores it: absolute deadline, explicit token. Ordinary clients may
//! not call it (it would let anyone forge a hold); the replication link and AOF loading may.

use redis_module::{raw, Context, RedisResult, RedisString, RedisValue};

use crate::error;
use crate::lock::Hold;
use crate::parse;
use crate::redis::key::{self, LockKey};
use crate::redis::{asm, docs, session};
use crate::state;

pub fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if !key::applying_effects(ctx.ctx) {
        return Err(error::internal_only().into());
    }
    let raw = super::bytes(&args);
    let cmd = parse::load(&raw)?;
    if !state::observe_token(cmd.token) {
        ctx.log_warning(&format!(
            "redis-lock: LOCK.LOAD with token {} (at or above 2^53, which this module never \
             mints); the token mint does not follow it",
            cmd.token
        ));
    }
    let mut lock_key = LockKey::open(ctx, &args[1]);
    // A hold of a session this server does not know (which the stream's order rules out) is
    // kept as a plain hold, with a deadline so that it cannot outlive everything.
    // A session hold that an atomic slot migration brings in (Valkey 9) is never linked: its
    // session lives on the source node (see `redis::asm`).
    let db = key::selected_db(ctx.ctx);
    let fallback = key::now().saturating_add(state::max_session_ttl_ms());
    let imported = asm::imported_hold_cap(args[1].as_slice(), cmd.session, fallback);
    let linked =
        imported.is_none() && session::track(cmd.session, db, args[1].as_slice(), cmd.owner);
    let deadline = match (linked || cmd.session == 0, imported) {
        (_, Some(cap)) => cmd.deadline.min(cap),
        (true, None) => cmd.deadline,
        (false, None) => cmd.deadline.min(fallback),
    };
    let hold = Hold {
        owner: cmd.owner.into(),
        token: cmd.token,
        deadline,
        granted_at: 0,
        session: if linked { cmd.session } else { 0 },
        delay: cmd.delay,
    };
    if hold.frees_at() > key::now() {
        lock_key.grant(cmd.mode, hold, cmd.prune)?;
    } else if cmd.mode.is_shared() {
        // Already over here (replication lag, or an old AOF), but its token was issued, which
        // observe_token remembered. Only this holder's entry goes.
        if lock_key.remove(cmd.owner, cmd.prune)?.is_some() {
            lock_key.delete_if_empty()?;
        }
    } else if lock_key.lock()?.is_some() {
        // An exclusive grant replaced whatever was there, and it is over too.
        lock_key.delete();
    }
    Ok(RedisValue::SimpleStringStatic("OK"))
}

pub const DOC: docs::Doc = docs::Doc {
    name: c"lock.load",
    summary: c"Internal: applies a replicated or AOF-loaded hold. Refused from ordinary clients.",
    complexity: c"O(1)",
    arity: -5,
    key_flags: raw::REDISMODULE_CMD_KEY_OW | raw::REDISMODULE_CMD_KEY_UPDATE,
    args: &[
        docs::KEY_ARG,
        docs::OWNER_ARG,
        docs::Arg::required(c"token", docs::INTEGER),
        docs::Arg::required(c"deadline-ms", docs::INTEGER),
        docs::SHARED_ARG,
        docs::LIMIT_ARG,
        docs::Arg {
            name: c"prune-ms",
            kind: docs::INTEGER,
            token: Some(c"PRUNE"),
            optional: true,
        },
        docs::Arg {
            name: c"session-serial",
            kind: docs::INTEGER,
            token: Some(c"SESSION"),
            optional: true,
        },
        docs::Arg {
            name: c"delay-ms",
            kind: docs::INTEGER,
            token: Some(c"DELAY"),
            optional: true,
        },
    ],
};
