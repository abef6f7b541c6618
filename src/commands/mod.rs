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

use redis_module::{RedisError, RedisString};

use crate::error::Error;

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
