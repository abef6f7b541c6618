//! `LOCK.ACQUIRE key owner ttl-ms [SHARED] [LIMIT n] [BLOCK timeout-ms] [SESSION id]
//! [LOCKDELAY ms]` -> token | nil

use redis_module::{raw, Context, RedisResult, RedisValue};

use crate::error;
use crate::lock::{self, Acquire, HoldRef};
use crate::parse;
use crate::redis::guard::Args;
use crate::redis::key::{self, LockKey};
use crate::redis::{asm, blocking, docs, session};
use crate::{state, stats};

pub fn run(ctx: &Context, args: &Args) -> RedisResult {
    session::redact_ids(ctx, args.bytes, 4);
    let cmd = parse::acquire(args.bytes, state::max_owner_bytes())?;
    let now = key::now();
    let (serial, delay) = match cmd.session {
        Some(id) => session::resolve(
            ctx,
            id,
            key::selected_db(ctx.ctx),
            &[args.bytes[1]],
            cmd.owner,
        )?,
        None => (0, cmd.lock_delay),
    };
    if serial != 0 {
        asm::refuse_session_hold([args.bytes[1]])?;
    }
    lock::deadline_after(now, cmd.ttl).ok_or_else(error::ttl_too_large)?;
    let deadline = blocking::hold_deadline(now, cmd.ttl, serial);
    let name = args.bytes[1];
    let db = key::selected_db(ctx.ctx);
    let mut lock_key = LockKey::open_raw(ctx.ctx, args.raw[1], key::READ_WRITE);
    let decide = |lock_key: &LockKey, queued| {
        lock::decide_acquire(lock_key.lock()?, cmd.owner, cmd.mode, serial, now, queued)
            .map_err(error::conflict)
    };
    // Whether others are queued changes only a grant (into `ServeQueue`), so the queue is
    // looked up only for one: a caller that finds the lock busy, as under contention, costs no
    // lookup here.
    let mut decision = decide(&lock_key, false)?;
    if decision == Acquire::Grant && blocking::has_waiters(db, name) {
        decision = decide(&lock_key, true)?;
    }
    if decision == Acquire::ServeQueue {
        // Compatible, but others queued first: admit them, and this caller only if nobody is
        // left waiting ahead of it (no barging).
        blocking::serve(ctx.ctx, &mut lock_key, name, now)?;
        decision = match blocking::has_waiters(db, name) {
            true => Acquire::Busy,
            false => decide(&lock_key, false)?,
        };
    }
    match decision {
        Acquire::Retry { token } => {
            lock_key.set_deadline(cmd.owner, deadline, now)?;
            lock_key.feed(
                crate::redis::feed::Kind::Extended,
                cmd.owner,
                token,
                Some(deadline),
            );
            lock_key.replicate_holder(cmd.owner, now);
            blocking::deadline_changed(ctx.ctx, &lock_key, name, now);
            Ok(RedisValue::Integer(token as i64))
        }
        Acquire::Grant => {
            let token = state::next_token(now);
            // Borrowed: the typical lock copies the owner into its value (see `IntoHold`).
            let hold = HoldRef {
                owner: cmd.owner,
                token,
                deadline,
                granted_at: now,
                session: serial,
                delay,
            };
            lock_key.grant(cmd.mode, hold, Some(now))?;
            session::track(serial, db, name, cmd.owner);
            lock_key.replicate_holder(cmd.owner, now);
            lock_key.notify(c"lock.acquired");
            lock_key.feed(
                crate::redis::feed::Kind::Acquired,
                cmd.owner,
                token,
                Some(deadline),
            );
            stats::ACQUIRED.incr();
            Ok(RedisValue::Integer(token as i64))
        }
        Acquire::Busy | Acquire::ServeQueue => {
            stats::CONTENDED.incr();
            match cmd.block {
                Some(timeout) if blocking::may_block(ctx) => {
                    if let Some(conflict) = blocking::queued_conflict(db, name, cmd.mode) {
                        return Err(error::conflict(conflict).into());
                    }
                    let next_expiry = lock_key.lock()?.and_then(|l| l.next_expiry(now));
                    drop(lock_key);
                    blocking::block(
                        ctx,
                        name,
                        blocking::Wants {
                            owner: cmd.owner,
                            mode: cmd.mode,
                            ttl: cmd.ttl,
                            session: serial,
                            delay,
                        },
                        timeout,
                        next_expiry.unwrap_or(now),
                    )?;
                    Ok(RedisValue::NoReply)
                }
                _ => Ok(RedisValue::Null),
            }
        }
    }
}

pub const DOC: docs::Doc = docs::Doc {
    name: c"lock.acquire",
    summary: c"Acquires a lock for ttl-ms milliseconds and returns its fencing token: alone, or \
               SHARED with other holders (at most LIMIT n of them); with BLOCK, waits in the \
               key's FIFO queue.",
    complexity: c"O(1) for an exclusive lock; O(N) with N holders of a shared one",
    arity: -4,
    key_flags: raw::REDISMODULE_CMD_KEY_RW
        | raw::REDISMODULE_CMD_KEY_ACCESS
        | raw::REDISMODULE_CMD_KEY_UPDATE,
    args: &[
        docs::KEY_ARG,
        docs::OWNER_ARG,
        docs::TTL_ARG,
        docs::SHARED_ARG,
        docs::LIMIT_ARG,
        docs::Arg {
            name: c"timeout-ms",
            kind: docs::INTEGER,
            token: Some(c"BLOCK"),
            optional: true,
        },
        docs::SESSION_ARG,
        docs::Arg {
            name: c"lockdelay-ms",
            kind: docs::INTEGER,
            token: Some(c"LOCKDELAY"),
            optional: true,
        },
    ],
};
