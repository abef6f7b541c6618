//! `LOCK.SESSION OPEN ttl-ms [BOUND] [LOCKDELAY ms]` -> id
//! `LOCK.SESSION KEEPALIVE id [ttl-ms]` -> remaining ms | nil
//! `LOCK.SESSION CLOSE id` -> holds released | nil
//! `LOCK.SESSION ATTACH id` -> OK | nil
//! `LOCK.SESSION INFO id` -> {ttl, bound, lockdelay, holds} | nil
//!
//! And the internal forms, which only the replication link and AOF loading may send:
//! `RESTORE id serial ttl deadline lock-delay bound user`, `RENEW serial ttl deadline`,
//! `ENDED serial at CLOSED|LOST`.
//!
//! One command with subcommands rather than five commands, so that the whole family carries
//! the flags that keep ids out of `MONITOR` and `SLOWLOG`. The id is argument 2 of every
//! subcommand that takes one, which the getkeys callback reports as the command's key: a cluster
//! client routes it by the id's hash tag to the node that has the session.

use std::collections::BTreeMap;

use redis_module::{raw, redisvalue::RedisValueKey, Context, RedisResult, RedisString, RedisValue};

use crate::error::{self, Error};
use crate::lock::Session;
use crate::parse::{self, Session as Sub};
use crate::redis::key;
use crate::redis::{asm, blocking, docs, session};
use crate::state;

pub fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if ctx.is_keys_position_request() {
        report_id_key(ctx, &args);
        return Ok(RedisValue::NoReply);
    }
    let raw = super::bytes(&args);
    let cmd = parse::session(&raw)?;
    let internal = matches!(
        cmd,
        Sub::Restore { .. } | Sub::Renew { .. } | Sub::Ended { .. }
    );
    if internal != key::applying_effects(ctx.ctx) && internal {
        return Err(error::internal_only().into());
    }
    match cmd {
        Sub::Open {
            ttl,
            bound,
            lock_delay,
        } => {
            check_ttl(ttl)?;
            if bound {
                not_from_script(ctx, "BOUND")?;
            }
            let id = session::open(ctx, ttl, bound, lock_delay)?;
            Ok(RedisValue::StringBuffer(id))
        }
        Sub::KeepAlive { id, ttl } => {
            if let Some(ttl) = ttl {
                check_ttl(ttl)?;
            }
            match session::find(ctx, id)? {
                Some(serial) => Ok(RedisValue::Integer(session::keepalive(ctx, serial, ttl)?)),
                None => Ok(RedisValue::Null),
            }
        }
        Sub::Close { id } => match session::find(ctx, id)? {
            Some(serial) => Ok(match blocking::close_session(ctx, serial) {
                None => RedisValue::Null,
                Some(blocking::CloseReply::Now(n)) => RedisValue::Integer(n as i64),
                Some(blocking::CloseReply::Later) => RedisValue::NoReply,
            }),
            None => Ok(RedisValue::Null),
        },
        Sub::Attach { id } => {
            not_from_script(ctx, "ATTACH")?;
            let Some(serial) = session::find(ctx, id)? else {
                return Ok(RedisValue::Null);
            };
            let me = session::client_id(ctx);
            let (bound, client) =
                session::with(|s| s.get(serial).map_or((false, None), |x| (x.bound, x.client)));
            if !bound {
                return Err(error::attach_not_bound().into());
            }
            if client.is_some_and(|c| c != me && session::client_exists(c)) {
                return Err(error::attach_bound_elsewhere().into());
            }
            session::with(|s| s.bind(serial, Some(me)));
            Ok(RedisValue::SimpleStringStatic("OK"))
        }
        Sub::Info { id } => match session::find(ctx, id)? {
            Some(serial) => Ok(info(ctx, serial)),
            None => Ok(RedisValue::Null),
        },
        Sub::Restore {
            id,
            serial,
            ttl,
            deadline,
            lock_delay,
            bound,
            user,
        } => {
            // Another node's session, described by an atomic slot migration's snapshot: it
            // stays there; only its deadline is kept, for the holds that follow.
            if asm::note_foreign_session(ctx.ctx, id, serial, deadline) {
                return Ok(RedisValue::SimpleStringStatic("OK"));
            }
            // A session that is already here (an AOF rewrite writes it before its holds,
            // which may follow an earlier copy) keeps its holds and binding.
            let (holds, client) = session::with(|s| {
                s.get(serial)
                    .map_or((Default::default(), None), |x| (x.holds.clone(), x.client))
            });
            session::with(|s| {
                s.insert(Session {
                    id: id.to_vec(),
                    serial,
                    ttl,
                    deadline,
                    lock_delay,
                    bound,
                    client,
                    user: user.to_vec(),
                    holds,
                })
            });
            Ok(RedisValue::SimpleStringStatic("OK"))
        }
        Sub::Renew {
            serial,
            ttl,
            deadline,
        } => {
            session::with(|s| s.renew(serial, ttl, deadline));
            Ok(RedisValue::SimpleStringStatic("OK"))
        }
        Sub::Ended { serial, at, clean } => {
            blocking::apply_ended(ctx, serial, at, clean);
            Ok(RedisValue::SimpleStringStatic("OK"))
        }
    }
}

fn check_ttl(ttl: i64) -> Result<(), Error> {
    let max = state::max_session_ttl_ms();
    if ttl > max {
        return Err(error::session_ttl_too_large(max));
    }
    Ok(())
}

/// A script's or function's client never disconnects: binding a session to it would make the
/// binding meaningless.
fn not_from_script(ctx: &Context, what: &str) -> Result<(), Error> {
    if key::context_flags(ctx.ctx) & raw::REDISMODULE_CTX_FLAGS_LUA != 0 {
        return Err(error::not_from_script(what));
    }
    Ok(())
}

fn info(ctx: &Context, serial: u64) -> RedisValue {
    let now = key::now();
    let Some((ttl, client, lock_delay, holds)) = session::with(|s| {
        s.get(serial).map(|x| {
            (
                x.remaining(now),
                x.client,
                x.lock_delay,
                x.holds.iter().cloned().collect::<Vec<_>>(),
            )
        })
    }) else {
        return RedisValue::Null;
    };
    // In a cluster the keys cannot be looked at from this command (see
    // `blocking::close_session`): there it is the number of holds on record, which may still
    // count a shared hold that expired on its own until its key is touched.
    let live = if key::context_flags(ctx.ctx) & raw::REDISMODULE_CTX_FLAGS_CLUSTER != 0 {
        holds.len()
    } else {
        holds
            .iter()
            .filter(|h| blocking::session_hold_exists(ctx, serial, h))
            .count()
    };
    let pairs = vec![
        ("ttl", RedisValue::Integer(ttl)),
        (
            "bound",
            client.map_or(RedisValue::Null, |c| RedisValue::Integer(c as i64)),
        ),
        ("lockdelay", RedisValue::Integer(lock_delay)),
        ("holds", RedisValue::Integer(live as i64)),
    ];
    RedisValue::OrderedMap(
        pairs
            .into_iter()
            .map(|(k, v)| (RedisValueKey::String(k.to_string()), v))
            .collect::<BTreeMap<_, _>>(),
    )
}

/// For the getkeys callback: the id of `KEEPALIVE`, `CLOSE`, `ATTACH` and `INFO` is the key.
fn report_id_key(ctx: &Context, args: &[RedisString]) {
    let takes_id = args.get(1).is_some_and(|sub| {
        let sub = sub.as_slice();
        [&b"KEEPALIVE"[..], b"CLOSE", b"ATTACH", b"INFO"]
            .iter()
            .any(|name| sub.eq_ignore_ascii_case(name))
    });
    if takes_id && args.len() >= 3 {
        ctx.key_at_pos(2);
    }
}

pub const DOC: docs::Doc = docs::Doc {
    name: c"lock.session",
    summary: c"Sessions: OPEN one lease for many holds (BOUND: ended when this connection \
               closes; LOCKDELAY: how long a lost hold keeps others out), KEEPALIVE it, CLOSE \
               it, ATTACH a BOUND one to this connection, INFO about it.",
    complexity: c"O(1), except CLOSE: O(N) with N holds in the session",
    arity: -3,
    key_flags: raw::REDISMODULE_CMD_KEY_RW
        | raw::REDISMODULE_CMD_KEY_ACCESS
        | raw::REDISMODULE_CMD_KEY_NOT_KEY
        | raw::REDISMODULE_CMD_KEY_INCOMPLETE,
    args: &[
        docs::Arg::required(c"subcommand", docs::STRING),
        docs::Arg {
            name: c"id-or-ttl-ms",
            kind: docs::KEY,
            token: None,
            optional: false,
        },
        docs::Arg {
            name: c"option",
            kind: docs::STRING,
            token: None,
            optional: true,
        },
    ],
};
