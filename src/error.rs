//! One error type for every reply the module refuses with. Each message starts with its Redis
//! error code, so clients see `ERR` or `WRONGTYPE` and never a made-up code.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The server's own arity message (`ERR wrong number of arguments for '...' command`).
    WrongArity,
    /// The key holds a value of another type.
    WrongType,
    /// Any other refusal; the text already starts with its code.
    Reply(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The reply text, guaranteed printable ASCII.
    pub fn reply_text(&self) -> String {
        printable(self.to_string().as_bytes())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::WrongArity => f.write_str("ERR wrong number of arguments"),
            Error::WrongType => {
                f.write_str("WRONGTYPE Operation against a key holding the wrong kind of value")
            }
            Error::Reply(s) => f.write_str(s),
        }
    }
}

fn err(msg: impl Into<String>) -> Error {
    Error::Reply(format!("ERR {}", msg.into()))
}

pub fn ttl_not_positive() -> Error {
    err("ttl-ms must be a positive integer")
}

pub fn ttl_too_large() -> Error {
    err("ttl-ms is too large")
}

pub fn owner_empty() -> Error {
    err("owner must not be empty")
}

pub fn owner_too_long(max: usize) -> Error {
    err(format!("owner is longer than lock.max-owner-bytes ({max})"))
}

/// Echoes the argument, unless it has a session id's shape: an id sent in the wrong place
/// (`SESSION` forgotten) is still a secret, and an error reply can end up in a client's log.
pub fn unexpected_argument(arg: &[u8]) -> Error {
    if crate::lock::session::well_formed_id(arg) {
        return err("syntax error: unexpected argument (a session id; give it after SESSION)");
    }
    err(format!(
        "syntax error: unexpected argument '{}'",
        printable(arg)
    ))
}

/// Client bytes made safe to echo in an error reply: printable ASCII stays, anything else
/// becomes `\xNN`. Why: an error reply is one line of text, and the crate's reply path
/// panics (aborting the server) on some non-ASCII text.
pub fn printable(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|&b| match b {
            0x20..=0x7e => (b as char).to_string(),
            _ => format!("\\x{b:02x}"),
        })
        .collect()
}

pub fn option_repeated(name: &str) -> Error {
    err(format!("syntax error: {name} given more than once"))
}

pub fn option_needs_value(name: &str, what: &str) -> Error {
    err(format!("syntax error: {name} needs {what}"))
}

pub fn timeout_invalid() -> Error {
    err("BLOCK timeout-ms must be a non-negative integer")
}

pub fn timeout_too_large() -> Error {
    err("BLOCK timeout-ms is too large")
}

pub fn limit_invalid() -> Error {
    err("LIMIT must be a positive integer")
}

pub fn limit_needs_shared() -> Error {
    err("syntax error: LIMIT needs SHARED (a semaphore is a shared lock with n permits)")
}

/// An acquire that conflicts with how the key is held (see [`crate::lock::Conflict`]).
pub fn conflict(c: crate::lock::Conflict) -> Error {
    use crate::lock::{Conflict, Mode};
    match c {
        Conflict::OtherMode {
            held: Mode::Exclusive,
        } => err("owner holds this lock exclusively; release it before acquiring it SHARED"),
        Conflict::OtherMode { .. } => {
            err("owner holds this lock SHARED; release it before acquiring it exclusively")
        }
        Conflict::Limit { limit: Some(n) } => err(format!(
            "this lock is held SHARED with LIMIT {n}; acquire it with SHARED LIMIT {n}"
        )),
        Conflict::Limit { limit: None } => {
            err("this lock is held SHARED without a limit; acquire it with SHARED and no LIMIT")
        }
        Conflict::OtherSession => err(
            "owner holds this lock in another session (or outside any); release it before \
             acquiring it with another SESSION",
        ),
    }
}

pub fn numkeys_invalid() -> Error {
    err("numkeys must be a positive integer")
}

pub fn numkeys_too_large() -> Error {
    err("numkeys is larger than the number of keys given")
}

pub fn too_many_keys(max: usize) -> Error {
    err(format!("too many keys (lock.max-multi-keys is {max})"))
}

pub fn duplicate_key(key: &[u8]) -> Error {
    err(format!("duplicate key '{}'", printable(key)))
}

pub fn token_invalid() -> Error {
    err("token must be a positive integer")
}

pub fn deadline_invalid() -> Error {
    err("deadline-ms must be a non-negative integer")
}

pub fn too_many_waiters(max: usize) -> Error {
    err(format!(
        "too many waiters on this key (lock.max-waiters is {max})"
    ))
}

pub fn internal_only() -> Error {
    err("LOCK.LOAD is internal: only the replication link and AOF loading may call it")
}

/// `LOCK.SESSION RESTORE/RENEW/ENDED` from a client.
pub fn session_internal_only(sub: &[u8]) -> Error {
    err(format!(
        "LOCK.SESSION {} is internal: only the replication link and AOF loading may call it",
        printable(sub).to_ascii_uppercase()
    ))
}

pub fn internal(what: &str) -> Error {
    err(format!(
        "internal error in redis-lock: {what} (see the server log)"
    ))
}

pub fn no_such_session() -> Error {
    err("no such session on this server (closed, expired, its connection closed, or opened on another node)")
}

pub fn session_of_other_user() -> Error {
    Error::Reply("NOPERM this session was opened by another ACL user".into())
}

pub fn session_on_replica() -> Error {
    Error::Reply(
        "READONLY sessions and session holds are taken on the primary only: a replica never \
         ends a session by its own clock or connections (replica-read-only no does not change \
         that)"
            .into(),
    )
}

pub fn session_ttl_too_large(max: i64) -> Error {
    err(format!(
        "ttl-ms is larger than lock.max-session-ttl-ms ({max})"
    ))
}

pub fn lock_delay_invalid() -> Error {
    err(format!(
        "LOCKDELAY must be an integer from 0 to {}",
        crate::lock::session::MAX_LOCK_DELAY
    ))
}

pub fn lock_delay_with_session() -> Error {
    err("syntax error: a hold in a SESSION takes the session's LOCKDELAY; give it to LOCK.SESSION OPEN")
}

/// The same words as before sessions existed, so that a plain 0 gets the reply it always got
/// (`docs/commands.md` says 0 is for session holds).
pub fn zero_ttl_needs_session() -> Error {
    ttl_not_positive()
}

pub fn too_many_sessions(max: usize) -> Error {
    err(format!("too many sessions (lock.max-sessions is {max})"))
}

pub fn too_many_session_holds(max: usize) -> Error {
    err(format!(
        "the session has too many holds (lock.max-session-holds is {max})"
    ))
}

/// A session hold in a slot that Valkey 9's atomic slot migration is moving away.
pub fn slot_exporting() -> &'static str {
    "TRYAGAIN the key's slot is migrating to another node: no session may take a hold in it \
     now; retry"
}

pub fn session_ended_while_waiting() -> &'static str {
    "ERR the session ended while the client waited; it was not granted"
}

pub fn not_from_script(what: &str) -> Error {
    err(format!(
        "{what} cannot be used from a script or function (its client never disconnects)"
    ))
}

pub fn grace_needs_bound() -> Error {
    err("syntax error: GRACE needs BOUND (only a bound session outlives its connection)")
}

pub fn grace_invalid() -> Error {
    err(format!(
        "GRACE must be an integer from 0 to {}",
        crate::lock::session::MAX_GRACE
    ))
}

pub fn grace_over_ttl() -> Error {
    err("GRACE must not be longer than the session's ttl-ms")
}

pub fn attach_not_bound() -> Error {
    err("the session was opened without BOUND; only a BOUND session can be attached")
}

pub fn attach_bound_elsewhere() -> Error {
    err("the session is bound to another connection that is still open")
}

pub fn session_subcommand(arg: &[u8]) -> Error {
    err(format!(
        "unknown LOCK.SESSION subcommand '{}' (OPEN, KEEPALIVE, CLOSE, ATTACH, INFO, LIST, KILL)",
        printable(arg)
    ))
}

pub fn serial_invalid() -> Error {
    err("serial must be a positive integer (as LOCK.SESSION LIST shows it)")
}

pub fn cursor_invalid() -> Error {
    err("cursor must be an integer from 0 (a serial LIST returned)")
}

pub fn list_count_invalid(max: usize) -> Error {
    err(format!("COUNT must be an integer from 1 to {max}"))
}

pub fn session_admin_only(sub: &[u8]) -> Error {
    Error::Reply(format!(
        "NOPERM LOCK.SESSION {} is for administrators: the ACL user must also be allowed CLIENT KILL",
        printable(sub).to_ascii_uppercase()
    ))
}
