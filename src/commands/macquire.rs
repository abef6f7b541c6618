//! `LOCK.MACQUIRE numkeys key [key ...] owner ttl-ms [BLOCK timeout-ms] [SESSION id]`
//! -> [token ...] | nil
//!
//! Exclusive locks on every key at once, or on none: each key is free (or already held by this
//! owner, which keeps its token) and has nobody queued, or nothing changes. With `BLOCK`, the
//! caller joins every key's queue and is granted the whole set inside the server (see
//! `crate::lock::multi` for why that cannot deadlock).

use redis_module::{raw, Context, RedisResult, RedisString, RedisValue};

use crate::error;
use crate::lock::{self, Hold, KeyGrant, KeyState, Mode, MultiAcquire};
use crate::parse;
use crate::redis::key::{self, LockKey};
use crate::redis::{asm, blocking, docs, session};
use crate::{state, stats};

pub fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if super::report_numkeys_keys(ctx, &args) {
        return Ok(RedisValue::NoReply);
    }
    let raw = super::bytes(&args);
    session::redact_ids(ctx, &raw, 2);
    let cmd = parse::macquire(&raw, state::max_owner_bytes(), state::max_multi_keys())?;
    let now = key::now();
    let (serial, delay) = match cmd.session {
        Some(id) => session::resolve(ctx, id, key::selected_db(ctx.ctx), &cmd.keys, cmd.owner)?,
        None => (0, 0),
    };
    if serial != 0 {
        asm::refuse_session_hold(cmd.keys.iter().copied())?;
    }
    lock::deadline_after(now, cmd.ttl).ok_or_else(error::ttl_too_large)?;
    let deadline = blocking::hold_deadline(now, cmd.ttl, serial);
    let names = &args[2..2 + cmd.keys.len()];
    let db = key::selected_db(ctx.ctx);
    // Every key must be ours (or empty) before anything changes.
    for name in names {
        LockKey::open(ctx, name).lock()?;
    }
    // Waiters queued on a key go first (no barging); their turn may already have come (a
    // holder expired a moment before its timer). One key open at a time: serving a queue can
    // grant a multi-key waiter, which opens that waiter's other keys.
    for name in names {
        if blocking::has_waiters(db, name.as_slice()) {
            let mut lock_key = LockKey::open(ctx, name);
            blocking::serve(ctx.ctx, &mut lock_key, name.as_slice(), now)?;
        }
    }
    let mut keys: Vec<LockKey> = names.iter().map(|n| LockKey::open(ctx, n)).collect();
    let decision = {
        let mut states = Vec::with_capacity(keys.len());
        for (lock_key, name) in keys.iter().zip(names) {
            states.push(KeyState {
                lock: lock_key.lock()?,
                ahead: blocking::has_waiters(db, name.as_slice()),
            });
        }
        lock::decide_macquire(&states, cmd.owner, serial, now)
            .map_err(|(_, c)| error::conflict(c))?
    };
    match decision {
        MultiAcquire::Grant(grants) => {
            // Every check is done; what can still fail below is internal (the server refusing
            // to store a value or an expiry), never something a client sent.
            let mut tokens = Vec::with_capacity(grants.len());
            for ((lock_key, name), grant) in keys.iter_mut().zip(names).zip(grants) {
                let token = match grant {
                    KeyGrant::Retry { token } => {
                        lock_key.set_deadline(cmd.owner, deadline, now)?;
                        lock_key.feed(
                            crate::redis::feed::Kind::Extended,
                            cmd.owner,
                            token,
                            Some(deadline),
                        );
                        blocking::deadline_changed(ctx.ctx, lock_key, name.as_slice(), now);
                        token
                    }
                    KeyGrant::New => {
                        let token = state::next_token(now);
                        let hold = Hold {
                            owner: cmd.owner.into(),
                            token,
                            deadline,
                            granted_at: now,
                            session: serial,
                            delay,
                        };
                        lock_key.grant(Mode::Exclusive, hold, Some(now))?;
                        session::track(serial, db, name.as_slice(), cmd.owner);
                        lock_key.notify(c"lock.acquired");
                        lock_key.feed(
                            crate::redis::feed::Kind::Acquired,
                            cmd.owner,
                            token,
                            Some(deadline),
                        );
                        stats::ACQUIRED.incr();
                        token
                    }
                };
                // One LOCK.LOAD per key; Redis wraps the command's propagations in MULTI/EXEC,
                // so a replica or the AOF applies the whole set or none of it.
                lock_key.replicate_holder(cmd.owner, now);
                tokens.push(RedisValue::Integer(token as i64));
            }
            Ok(RedisValue::Array(tokens))
        }
        MultiAcquire::Busy => {
            stats::CONTENDED.incr();
            match cmd.block {
                Some(timeout) if blocking::may_block(ctx) => {
                    let mut next_expiry = Vec::with_capacity(keys.len());
                    for lock_key in &keys {
                        next_expiry.push(lock_key.lock()?.and_then(|l| l.next_expiry(now)));
                    }
                    drop(keys);
                    blocking::block_set(
                        ctx,
                        &cmd.keys,
                        blocking::Wants {
                            owner: cmd.owner,
                            mode: Mode::Exclusive,
                            ttl: cmd.ttl,
                            session: serial,
                            delay,
                        },
                        timeout,
                        &next_expiry
                            .into_iter()
                            .map(|at| at.unwrap_or(now))
                            .collect::<Vec<_>>(),
                    )?;
                    Ok(RedisValue::NoReply)
                }
                _ => Ok(RedisValue::Null),
            }
        }
    }
}

pub const DOC: docs::Doc = docs::Doc {
    name: c"lock.macquire",
    summary: c"Acquires exclusive locks on every key or on none, in one step, and returns their \
               fencing tokens in key order; with BLOCK, waits in every key's FIFO queue and is \
               granted the whole set at once.",
    complexity: c"O(N) with N keys",
    arity: -5,
    key_flags: raw::REDISMODULE_CMD_KEY_RW
        | raw::REDISMODULE_CMD_KEY_ACCESS
        | raw::REDISMODULE_CMD_KEY_UPDATE,
    args: &[
        docs::NUMKEYS_ARG,
        docs::KEY_ARG,
        docs::OWNER_ARG,
        docs::TTL_ARG,
        docs::Arg {
            name: c"timeout-ms",
            kind: docs::INTEGER,
            token: Some(c"BLOCK"),
            optional: true,
        },
        docs::SESSION_ARG,
    ],
};
