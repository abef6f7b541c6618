//! `LOCK.SESSION OPEN ttl-ms [BOUND [GRACE ms]] [LOCKDELAY ms]` -> id
//! `LOCK.SESSION KEEPALIVE id [ttl-ms]` -> remaining ms | nil
//! `LOCK.SESSION CLOSE id` -> holds released | nil
//! `LOCK.SESSION ATTACH id` -> OK | nil
//! `LOCK.SESSION INFO id` -> {bound, holds, lockdelay, ttl, serial, grace, detached} | nil
//! `LOCK.SESSION LIST [cursor] [COUNT n]` -> [next-cursor, [{serial, user, bound, ttl,
//! lockdelay, holds, grace, detached}, ...]] (administrators)
//! `LOCK.SESSION KILL serial` -> holds released | nil (administrators)
//!
//! And the internal forms, which only the replication link and AOF loading may send:
//! `RESTORE id serial ttl deadline lock-delay bound user [grace]`, `RENEW serial ttl deadline`,
//! `ENDED serial at CLOSED|LOST`.
//!
//! One command with real subcommands (`lock.session|keepalive`, ...) rather than five commands:
//! the family shares a name and the flags that keep ids out of `MONITOR` and `SLOWLOG`, while
//! each subcommand has its own key spec and ACL bit. The id is argument 2 of every subcommand
//! that takes one and is declared as a `NOT_KEY` key (see [`SUBCOMMANDS`]): routed like a key
//! in a cluster, never checked against a user's key patterns.

use std::ffi::CStr;

use redis_module::{raw, redisvalue::RedisValueKey, Context, RedisResult, RedisString, RedisValue};

use crate::error::{self, Error};
use crate::lock::Session;
use crate::parse::{self, Session as Sub};
use crate::redis::key;
use crate::redis::{acl, asm, blocking, docs, session};
use crate::state;

pub fn run(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let raw = super::bytes(&args);
    // Checked before parsing: a client is told what it may not send, not what it sent wrong.
    let internal = raw.get(1).is_some_and(|sub| {
        [&b"RESTORE"[..], b"RENEW", b"ENDED"]
            .iter()
            .any(|name| sub.eq_ignore_ascii_case(name))
    });
    if internal && !key::applying_effects(ctx.ctx) {
        return Err(error::session_internal_only(raw[1]).into());
    }
    let cmd = parse::session(&raw)?;
    if matches!(cmd, Sub::List { .. } | Sub::Kill { .. }) && !acl::is_admin(ctx) {
        return Err(error::session_admin_only(raw[1]).into());
    }
    if !internal && !matches!(cmd, Sub::Info { .. } | Sub::List { .. } | Sub::Help) {
        session::on_primary(ctx)?;
    }
    match cmd {
        Sub::Open {
            ttl,
            bound,
            grace,
            lock_delay,
        } => {
            check_ttl(ttl)?;
            if bound {
                not_from_script(ctx, "BOUND")?;
            }
            let id = session::open(ctx, ttl, bound, grace, lock_delay)?;
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
            let (bound, client, too_late) = session::with(|s| {
                s.get(serial).map_or((false, None, false), |x| {
                    let too_late = x.detached.is_some() && x.deadline <= key::now();
                    (x.bound, x.client, too_late)
                })
            });
            if too_late {
                // The grace is over; the expiry timer ends the session in a moment.
                return Ok(RedisValue::Null);
            }
            if !bound {
                return Err(error::attach_not_bound().into());
            }
            if client.is_some_and(|c| c != me && session::client_exists(c)) {
                return Err(error::attach_bound_elsewhere().into());
            }
            session::attach(ctx, serial, me);
            Ok(RedisValue::SimpleStringStatic("OK"))
        }
        Sub::Info { id } => match session::find(ctx, id)? {
            Some(serial) => Ok(info(ctx, serial)),
            None => Ok(RedisValue::Null),
        },
        Sub::List { cursor, count } => {
            list(ctx, cursor, count);
            Ok(RedisValue::NoReply)
        }
        Sub::Help => Ok(RedisValue::Array(
            HELP.iter()
                .map(|line| RedisValue::SimpleStringStatic(line))
                .collect(),
        )),
        Sub::Kill { serial } => Ok(match blocking::kill_session(ctx, serial) {
            Some(n) => RedisValue::Integer(n as i64),
            None => RedisValue::Null,
        }),
        Sub::Restore {
            id,
            serial,
            ttl,
            deadline,
            lock_delay,
            bound,
            user,
            grace,
        } => {
            // Another node's session, described by an atomic slot migration's snapshot: it
            // stays there; only its deadline is kept, for the holds that follow.
            if asm::note_foreign_session(ctx.ctx, id, serial, deadline) {
                return Ok(RedisValue::SimpleStringStatic("OK"));
            }
            // A session that is already here (an AOF rewrite writes it before its holds,
            // which may follow an earlier copy) keeps its holds and binding.
            let (holds, client, detached) = session::with(|s| {
                s.get(serial).map_or((Default::default(), None, None), |x| {
                    (x.holds.clone(), x.client, x.detached)
                })
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
                    grace,
                    detached,
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
    let Some((ttl, client, lock_delay, holds, grace, detached)) = session::with(|s| {
        s.get(serial).map(|x| {
            (
                x.remaining(now),
                x.client,
                x.lock_delay,
                x.holds.iter().cloned().collect::<Vec<_>>(),
                x.grace,
                detached_field(x, now),
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
    // In the order this reply always had (its fields sorted by name), then `serial` (issue 32):
    // the public handle `LOCK.SESSION LIST`, `KILL` and `LOCK.INFO` use, so that a client can
    // name its connection after it (`CLIENT SETNAME`) without ever showing the id.
    let fields = [
        (
            "bound",
            client.map_or(RedisValue::Null, |c| RedisValue::Integer(c as i64)),
        ),
        ("holds", RedisValue::Integer(live as i64)),
        ("lockdelay", RedisValue::Integer(lock_delay)),
        ("ttl", RedisValue::Integer(ttl)),
        ("serial", RedisValue::Integer(serial as i64)),
        // Then the grace (issue 29): `grace` ms, and `detached`, the ms left for a connection
        // to attach it (nil while it is not detached).
        ("grace", RedisValue::Integer(grace)),
        ("detached", detached),
    ];
    raw::reply_with_map(ctx.ctx, fields.len() as _);
    for (name, value) in fields {
        ctx.reply_with_key(RedisValueKey::String(name.to_string()));
        ctx.reply(Ok(value));
    }
    RedisValue::NoReply
}

/// `LOCK.SESSION LIST`: one page, written straight to the client so that each entry's fields
/// keep their documented order (a map under RESP3, flat pairs under RESP2). Never the id.
/// `holds` is the number on record (O(1) per session, so a page costs O(COUNT) whatever the
/// sessions hold): it may still count a hold that ended by itself (an expiry inside a
/// shared key, a `DEL`) until its key is touched; `LOCK.SESSION INFO` counts the live ones.
fn list(ctx: &Context, cursor: u64, count: usize) {
    let now = key::now();
    let (entries, next) = session::with(|s| {
        let (page, next) = s.page(cursor, count);
        let entries: Vec<_> = page
            .into_iter()
            .map(|x| {
                (
                    x.serial,
                    x.user.clone(),
                    x.client,
                    x.remaining(now),
                    x.lock_delay,
                    x.holds.len(),
                    x.grace,
                    detached_field(x, now),
                )
            })
            .collect();
        (entries, next)
    });
    raw::reply_with_array(ctx.ctx, 2);
    ctx.reply(Ok(RedisValue::BulkString(next.to_string())));
    raw::reply_with_array(ctx.ctx, entries.len() as _);
    for (serial, user, client, ttl, lock_delay, holds, grace, detached) in entries {
        raw::reply_with_map(ctx.ctx, 8);
        let fields = [
            ("serial", RedisValue::Integer(serial as i64)),
            ("user", RedisValue::StringBuffer(user)),
            (
                "bound",
                client.map_or(RedisValue::Null, |c| RedisValue::Integer(c as i64)),
            ),
            ("ttl", RedisValue::Integer(ttl)),
            ("lockdelay", RedisValue::Integer(lock_delay)),
            ("holds", RedisValue::Integer(holds as i64)),
            ("grace", RedisValue::Integer(grace)),
            ("detached", detached),
        ];
        for (name, value) in fields {
            ctx.reply_with_key(RedisValueKey::String(name.to_string()));
            ctx.reply(Ok(value));
        }
    }
}

/// `detached` in `INFO` and `LIST`: the ms left until a detached session ends unless a
/// connection attaches it (its grace's end, or its deadline if that comes first), else nil.
/// Always nil on a replica, which never detaches anything (its `ttl` is the shortened one).
fn detached_field(s: &Session, now: crate::lock::Millis) -> RedisValue {
    match s.detached {
        Some(_) => RedisValue::Integer(s.remaining(now)),
        None => RedisValue::Null,
    }
}

/// `LOCK.SESSION HELP`, in the shape of the server's own `... HELP` replies.
const HELP: [&str; 17] = [
    "LOCK.SESSION <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "OPEN <ttl-ms> [BOUND [GRACE <ms>]] [LOCKDELAY <ms>]",
    "    Open a session: one lease for many holds (SESSION <id> in LOCK.ACQUIRE/MACQUIRE). Returns its secret id.",
    "KEEPALIVE <id> [<ttl-ms>]",
    "    Renew the session for its ttl (or a new one). Returns ms left, or nil when it is gone.",
    "CLOSE <id>",
    "    End the session and release its holds at once. Returns how many, or nil.",
    "ATTACH <id>",
    "    Bind a BOUND session to this connection (after a restart, a promotion, or within its GRACE).",
    "INFO <id>",
    "    bound, holds, lockdelay, ttl, serial, grace, detached; nil when it is gone.",
    "LIST [<cursor>] [COUNT <n>]",
    "    Administrators: a page of every session on this node (never the ids).",
    "KILL <serial>",
    "    Administrators: end a session as an expiry would (lock-delay applies).",
    "HELP",
    "    Print this help.",
];

/// One `LOCK.SESSION` subcommand as the server registers it: a real subcommand
/// (`lock.session|keepalive`), so that each has its own key spec, flags and ACL bit.
pub struct Subcommand {
    /// Lower case, as `RedisModule_CreateSubcommand` takes it.
    pub name: &'static CStr,
    /// Where its key is: the session id (argument 2), or nowhere.
    pub keys: docs::Keys,
    /// Its command flags ([`FLAGS`], or [`READ_FLAGS`] for `INFO`).
    pub flags: &'static CStr,
    pub doc: docs::Doc,
}

/// The container's own entry in `COMMAND DOCS` (its subcommands are listed under it).
pub const DOC: docs::Doc = docs::Doc {
    name: c"lock.session",
    summary: c"Sessions: OPEN one lease for many holds, KEEPALIVE it, CLOSE it, ATTACH a BOUND \
               one to this connection, INFO about it; administrators LIST and KILL them.",
    complexity: c"Depends on the subcommand",
    arity: -2,
    key_flags: 0,
    args: &[],
};

/// Every subcommand: no-monitor and no-slowlog, because an id is a secret; not deny-oom, because
/// a keepalive refused under memory pressure would end the session and every hold in it.
pub const FLAGS: &CStr = c"write no-monitor no-slowlog";
/// `INFO` changes nothing: it answers on a read-only replica too.
pub const READ_FLAGS: &CStr = c"readonly no-monitor no-slowlog";
/// `HELP` changes nothing and shows no id. (`allow-loading` and `allow-stale`, which the
/// server's own HELPs have, make Redis 7.0 refuse to create the subcommand.)
pub const HELP_FLAGS: &CStr = c"readonly";
/// `LIST` is for administrators: `admin` puts it in `@admin` and `@dangerous` wherever the
/// server derives categories from flags, and `redis::acl` keeps it out of `@lock`. It shows
/// no id, so `MONITOR` may show it; read-only, so a replica answers it too.
pub const ADMIN_READ_FLAGS: &CStr = c"readonly admin";
/// `KILL` is for administrators (as `LIST`); it writes (the end of a session).
pub const ADMIN_FLAGS: &CStr = c"write admin";

/// The session id of `KEEPALIVE`, `CLOSE`, `ATTACH` and `INFO`. Declared as a key flagged
/// `NOT_KEY` and nothing else (no getkeys callback): every server of the matrix (Redis 7.0,
/// 8.2, Valkey 8.1, 9.1; `getNodeByQuery` uses the legacy key range, which this one spec
/// gives) still redirects a misrouted call to the node of the id's hash tag, while the ACL key
/// check (`getKeysFromCommandWithSpecs`, which skips `NOT_KEY` specs) never sees the id: a user
/// limited to `~lock:*` keeps its session alive, and `ACL LOG` never records an id.
const ID_FLAGS: u32 = raw::REDISMODULE_CMD_KEY_RW
    | raw::REDISMODULE_CMD_KEY_ACCESS
    | raw::REDISMODULE_CMD_KEY_NOT_KEY;
/// `INFO`'s id: read only.
const INFO_ID_FLAGS: u32 = raw::REDISMODULE_CMD_KEY_RO
    | raw::REDISMODULE_CMD_KEY_ACCESS
    | raw::REDISMODULE_CMD_KEY_NOT_KEY;

const ID_ARG: docs::Arg = docs::Arg::required(c"id", docs::KEY);
const TTL_OPTIONAL: docs::Arg = docs::Arg {
    name: c"ttl-ms",
    kind: docs::INTEGER,
    token: None,
    optional: true,
};

const fn sub(
    name: &'static CStr,
    full: &'static CStr,
    summary: &'static CStr,
    complexity: &'static CStr,
    arity: i32,
    keys: docs::Keys,
    args: &'static [docs::Arg],
) -> Subcommand {
    Subcommand {
        name,
        keys,
        flags: match name.to_bytes() {
            b"info" => READ_FLAGS,
            b"help" => HELP_FLAGS,
            b"list" => ADMIN_READ_FLAGS,
            b"kill" => ADMIN_FLAGS,
            _ => FLAGS,
        },
        doc: docs::Doc {
            name: full,
            summary,
            complexity,
            arity,
            key_flags: match keys {
                docs::Keys::SessionId if name.to_bytes().eq_ignore_ascii_case(b"info") => {
                    INFO_ID_FLAGS
                }
                docs::Keys::SessionId => ID_FLAGS,
                _ => 0,
            },
            args,
        },
    }
}

const INTERNAL: &CStr =
    c"Internal: replication and AOF loading only; refused from any other client.";

pub const SUBCOMMANDS: [Subcommand; 11] = [
    sub(
        c"open",
        c"lock.session|open",
        c"Opens a session: one lease for many holds (BOUND: ended when this connection closes, \
          or GRACE ms later unless a connection ATTACHes it; LOCKDELAY: how long a lost hold \
          keeps others out). Returns its secret id.",
        c"O(1)",
        -3,
        docs::Keys::None,
        &[
            docs::TTL_ARG,
            docs::Arg {
                name: c"bound",
                kind: docs::PURE_TOKEN,
                token: Some(c"BOUND"),
                optional: true,
            },
            docs::Arg {
                name: c"grace-ms",
                kind: docs::INTEGER,
                token: Some(c"GRACE"),
                optional: true,
            },
            docs::Arg {
                name: c"lockdelay-ms",
                kind: docs::INTEGER,
                token: Some(c"LOCKDELAY"),
                optional: true,
            },
        ],
    ),
    sub(
        c"keepalive",
        c"lock.session|keepalive",
        c"Renews a session for its ttl (or a new ttl-ms); nil when it is gone.",
        c"O(log N) with N open sessions, whatever the session holds",
        -3,
        docs::Keys::SessionId,
        &[ID_ARG, TTL_OPTIONAL],
    ),
    sub(
        c"close",
        c"lock.session|close",
        c"Ends a session and releases its holds at once (no lock-delay); nil when it is gone.",
        c"O(N) with N holds in the session",
        3,
        docs::Keys::SessionId,
        &[ID_ARG],
    ),
    sub(
        c"attach",
        c"lock.session|attach",
        c"Binds a BOUND session to this connection (after a restart or promotion, or within \
          its GRACE after its connection closed: then it is renewed for its ttl).",
        c"O(1)",
        3,
        docs::Keys::SessionId,
        &[ID_ARG],
    ),
    sub(
        c"info",
        c"lock.session|info",
        c"A session's ttl, bound connection, lock-delay, live holds, serial, grace and how long \
          it has left while detached; nil when it is gone.",
        c"O(N) with N holds on record in the session (at most lock.max-session-holds)",
        3,
        docs::Keys::SessionId,
        &[ID_ARG],
    ),
    sub(
        c"list",
        c"lock.session|list",
        c"Administrators: a page of every session on this node (serial, ACL user, bound client \
          id, ttl, lock-delay, holds on record, grace, ms left while detached), never the id; \
          the cursor of the next page (0: done).",
        c"O(N + log M) with N the COUNT (default 10, at most 1000) and M open sessions",
        -2,
        docs::Keys::None,
        &[
            docs::Arg {
                name: c"cursor",
                kind: docs::INTEGER,
                token: None,
                optional: true,
            },
            docs::Arg {
                name: c"count",
                kind: docs::INTEGER,
                token: Some(c"COUNT"),
                optional: true,
            },
        ],
    ),
    sub(
        c"kill",
        c"lock.session|kill",
        c"Administrators: ends a session as an expiry would (its holds lost, lock-delay \
          applied, holders told through the feed); the holds released, or nil.",
        c"O(N) with N holds in the session",
        3,
        docs::Keys::None,
        &[docs::Arg::required(c"serial", docs::INTEGER)],
    ),
    sub(
        c"help",
        c"lock.session|help",
        c"Shows what each LOCK.SESSION subcommand does.",
        c"O(1)",
        2,
        docs::Keys::None,
        &[],
    ),
    sub(
        c"restore",
        c"lock.session|restore",
        INTERNAL,
        c"O(1)",
        -9,
        docs::Keys::None,
        &[],
    ),
    sub(
        c"renew",
        c"lock.session|renew",
        INTERNAL,
        c"O(log N) with N sessions",
        5,
        docs::Keys::None,
        &[],
    ),
    sub(
        c"ended",
        c"lock.session|ended",
        INTERNAL,
        c"O(N) with N holds in the session",
        5,
        docs::Keys::None,
        &[],
    ),
];
