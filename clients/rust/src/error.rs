//! The error types: [`Error`] for one server, [`RedlockError`] for a set of masters.
//!
//! Both keep *contention* apart from *failure*. On one server, a lock held by someone else is not
//! an error at all (`Ok(None)`); every `Err` means the outcome could not be learned or the server
//! refused the command. For Redlock, [`RedlockError::Contended`] means enough masters answered
//! and too few granted, while [`RedlockError::Unavailable`] means too few answered to decide.

use std::fmt;
use std::time::Duration;

/// Why a command to one server failed.
///
/// A lock held by another owner is not an `Error`: [`Client::acquire`](crate::Client::acquire)
/// answers `Ok(None)` for that.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// No answer: the connection could not be opened, broke, or the reply did not arrive within
    /// the read timeout. The command may or may not have run on the server.
    Connection(redis::RedisError),
    /// The server answered with an error reply, e.g. `WRONGTYPE` (the key is not a lock) or
    /// `ERR unknown command` (the module is not loaded). Nothing changed on the server.
    Server(redis::RedisError),
    /// The server answered with a reply of a type the command never sends; for a fenced write
    /// ([`Guard::fenced`](crate::Guard::fenced)), a reply that is not of the type asked for
    /// (the write did run).
    UnexpectedReply {
        /// The command, e.g. `LOCK.ACQUIRE`.
        command: &'static str,
        /// The reply, as `Debug` text.
        reply: String,
    },
    /// An argument was rejected before anything was sent, e.g. a zero TTL.
    InvalidArgument(&'static str),
    /// A thread (the watchdog, or a connection helper) could not be started.
    Spawn(std::io::Error),
    /// Granted, but fewer than `wanted` replicas acknowledged the grant within the durable
    /// timeout of [`Client::durable`](crate::Client::durable): neither busy nor success.
    NotDurable {
        /// How many replicas did (0 if `WAIT` itself failed).
        acknowledged: u64,
        /// How many were asked for.
        wanted: u32,
        /// The grant was given back. False when that release failed too (the lock may stay
        /// held until its TTL), or when the owner is the caller's own choice
        /// ([`Client::with_owner`](crate::Client::with_owner)): the hold may then be one the
        /// caller had before (an idempotent retry), so it is left alone.
        released: bool,
    },
    /// A fenced write ([`Guard::fenced`](crate::Guard::fenced),
    /// [`fenced_call`](crate::fenced_call)) was refused: `token` is not the live hold on `lock`
    /// (the lock expired, was released, or is someone else's now). The command did not run.
    /// Its text is the server's refusal, `STALE token <token> is not the live hold on <lock>`,
    /// as the Python and Node packages' `StaleTokenError` reads.
    StaleToken {
        /// The lock's key.
        lock: String,
        /// The token that was refused.
        token: u64,
    },
}

impl Error {
    /// True if the server could not be reached or did not answer in time (as opposed to
    /// answering with an error).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Error::Connection(_))
    }

    /// Classify a `redis` error: I/O problems are [`Error::Connection`], error replies
    /// [`Error::Server`].
    pub(crate) fn from_redis(e: redis::RedisError) -> Error {
        if e.is_io_error() || e.is_connection_refusal() || e.is_timeout() {
            Error::Connection(e)
        } else if e.code().is_some() {
            Error::Server(e)
        } else {
            // Parse errors, "response was of incompatible type", client-side errors: the
            // connection is in an unknown state, so treat it like a broken one.
            Error::Connection(e)
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Connection(e) if e.is_timeout() => {
                write!(f, "redis server did not answer in time: {e}")
            }
            Error::Connection(e) => write!(f, "redis server unavailable: {e}"),
            Error::Server(e) => write!(f, "redis server error: {e}"),
            Error::UnexpectedReply { command, reply } => {
                write!(f, "unexpected reply to {command}: {reply}")
            }
            Error::InvalidArgument(what) => write!(f, "invalid argument: {what}"),
            Error::Spawn(e) => write!(f, "cannot start a thread: {e}"),
            Error::NotDurable {
                acknowledged,
                wanted,
                released,
            } => {
                write!(
                    f,
                    "granted, but {acknowledged} of {wanted} replica(s) acknowledged the grant; "
                )?;
                match released {
                    true => write!(f, "the grant was released"),
                    false => write!(
                        f,
                        "it was not released: the lock may stay held until its TTL"
                    ),
                }
            }
            Error::StaleToken { lock, token } => {
                write!(f, "STALE token {token} is not the live hold on {lock}")
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Connection(e) | Error::Server(e) => Some(e),
            Error::Spawn(e) => Some(e),
            Error::UnexpectedReply { .. }
            | Error::InvalidArgument(_)
            | Error::NotDurable { .. }
            | Error::StaleToken { .. } => None,
        }
    }
}

/// Why [`Redlock::acquire`](crate::Redlock::acquire) did not grant the lock.
///
/// On every one of these the acquirer has already tried to release the lock on each master
/// where it might hold it, so nothing is left behind beyond what an unreachable master keeps
/// until the TTL passes.
#[derive(Debug)]
#[non_exhaustive]
pub enum RedlockError {
    /// Held by someone else: enough masters answered, but fewer than `needed` granted the lock
    /// because another owner holds it on the others. Retrying later (with a random delay, so
    /// that competitors do not split the votes again) is the normal reaction.
    Contended {
        /// How many masters granted the lock to us.
        granted: usize,
        /// The majority: `masters / 2 + 1`.
        needed: usize,
    },
    /// Failure: fewer than `needed` masters gave an answer about the lock (a grant or a
    /// refusal), so no majority was possible whatever the other owners hold. A master that is
    /// unreachable, too slow, or answers with an error reply (e.g. the module is not loaded)
    /// counts as unavailable.
    Unavailable {
        /// How many masters answered with a grant or a refusal.
        reachable: usize,
        /// The majority: `masters / 2 + 1`.
        needed: usize,
        /// Each master that did not answer, by its index in the URL list, with its error.
        errors: Vec<(usize, Error)>,
    },
    /// A majority granted the lock, but acquiring took so long that no validity time was left
    /// (`ttl - elapsed - drift <= 0`): by the time the caller could use the lock, the first
    /// grants might already have expired.
    Expired {
        /// How many masters granted the lock.
        granted: usize,
        /// How long the round over all masters took.
        elapsed: Duration,
    },
    /// An argument was rejected before anything was sent (e.g. a zero TTL).
    InvalidArgument(&'static str),
}

impl RedlockError {
    /// True for [`RedlockError::Contended`]: someone else holds the lock.
    pub fn is_contended(&self) -> bool {
        matches!(self, RedlockError::Contended { .. })
    }
}

impl fmt::Display for RedlockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedlockError::Contended { granted, needed } => write!(
                f,
                "lock held by someone else: {granted} master(s) granted it, {needed} needed"
            ),
            RedlockError::Unavailable {
                reachable,
                needed,
                errors,
            } => {
                write!(
                    f,
                    "too few masters reachable: {reachable} answered, {needed} needed"
                )?;
                for (index, error) in errors {
                    write!(f, "; master {index}: {error}")?;
                }
                Ok(())
            }
            RedlockError::Expired { granted, elapsed } => write!(
                f,
                "lock granted by {granted} master(s) but acquiring took {elapsed:?}, \
                 leaving no validity time"
            ),
            RedlockError::InvalidArgument(what) => write!(f, "invalid argument: {what}"),
        }
    }
}

impl std::error::Error for RedlockError {}
