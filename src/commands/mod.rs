//! One file per command: parse into a typed struct, then apply to the lock key.
//! No `unsafe` here; the keyspace is reached through `crate::redis::key::LockKey`.

pub mod acquire;
pub mod extend;
pub mod fence;
pub mod info;
pub mod load;
pub mod macquire;
pub mod mrelease;
pub mod release;
pub mod session;
pub mod waiting;
pub mod watch;

use redis_module::{raw, Context, RedisError, RedisString};

use crate::error::{self, Error};
use crate::redis::key;

impl From<Error> for RedisError {
    fn from(e: Error) -> Self {
        match e {
            Error::WrongArity => RedisError::WrongArity,
            Error::WrongType => RedisError::WrongType,
            reply @ Error::Reply(_) => RedisError::String(reply.reply_text()),
        }
    }
}

/// The arguments as byte slices, for the parsers.
fn bytes(args: &[RedisString]) -> Vec<&[u8]> {
    args.iter().map(RedisString::as_slice).collect()
}

/// For `numkeys key [key ...]` commands registered with `getkeys-api`: when the server asks
/// where the keys are (rather than running the command), say so and return true. Why both this
/// and the key specs: Redis 7.0 routes cluster commands (`CROSSSLOT`, `MOVED`) by the legacy
/// key range or this callback, never by a module's key specs; `COMMAND GETKEYS` and ACL checks
/// use the specs.
fn report_numkeys_keys(ctx: &Context, args: &[RedisString]) -> bool {
    if !ctx.is_keys_position_request() {
        return false;
    }
    let n = args
        .get(1)
        .and_then(|a| std::str::from_utf8(a.as_slice()).ok())
        .and_then(|a| a.parse::<usize>().ok())
        .unwrap_or(0);
    // Only a well-formed count: the command itself reports the error otherwise.
    if n > 0 && n.checked_add(2).is_some_and(|end| end <= args.len()) {
        for pos in 2..2 + n {
            ctx.key_at_pos(pos as i32);
        }
    }
    true
}

/// Refuse `what` inside `EVAL`/`FCALL`: a script's or function's client never disconnects, so
/// anything that lasts until its connection closes (a watch, a `BOUND` session) would last
/// for ever. `MULTI` is not a script: its client is a real connection.
fn not_from_script(ctx: &Context, what: &str) -> Result<(), Error> {
    if key::context_flags(ctx.ctx) & raw::REDISMODULE_CTX_FLAGS_LUA != 0 {
        return Err(error::not_from_script(what));
    }
    Ok(())
}
