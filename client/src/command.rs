//! The four lock commands, written and read once for both APIs: [`Command`] holds the request and
//! how to read its reply. The sync client runs it with [`Command::run`]; the async one sends
//! `command.cmd` on a tokio connection and reads the reply with [`Command::read`].
//!
//! Each reader checks the reply's type: an integer must be an integer, nil must be nil.

use std::time::Duration;

use redis::{RedisResult, Value};

use crate::error::Error;

/// A lock command and the reader of its reply.
pub(crate) struct Command<T> {
    /// The request.
    pub(crate) cmd: redis::Cmd,
    /// Turns the reply into the command's result.
    parse: fn(Value) -> Result<T, Error>,
}

impl<T> Command<T> {
    /// Send the command on a sync connection and read its reply.
    pub(crate) fn run(&self, conn: &mut redis::Connection) -> Result<T, Error> {
        self.read(self.cmd.query(conn))
    }

    /// Read the command's reply (an error reply arrives as `Err`, as `Cmd::query` and
    /// `Cmd::query_async` return it).
    pub(crate) fn read(&self, reply: RedisResult<Value>) -> Result<T, Error> {
        (self.parse)(reply.map_err(Error::from_redis)?)
    }
}

/// `LOCK.ACQUIRE key owner ttl [BLOCK ms]` -> `Some(token)` or `None`.
pub(crate) fn acquire(
    key: &str,
    owner: &str,
    ttl_ms: u64,
    block_ms: Option<u64>,
) -> Command<Option<u64>> {
    let mut cmd = redis::cmd("LOCK.ACQUIRE");
    cmd.arg(key).arg(owner).arg(ttl_ms);
    if let Some(ms) = block_ms {
        cmd.arg("BLOCK").arg(ms);
    }
    Command {
        cmd,
        parse: |reply| match reply {
            Value::Int(n) if n > 0 => Ok(Some(n as u64)),
            Value::Nil => Ok(None),
            other => Err(unexpected("LOCK.ACQUIRE", other)),
        },
    }
}

/// `LOCK.RELEASE key owner` -> released?
pub(crate) fn release(key: &str, owner: &str) -> Command<bool> {
    let mut cmd = redis::cmd("LOCK.RELEASE");
    cmd.arg(key).arg(owner);
    Command {
        cmd,
        parse: |reply| zero_or_one("LOCK.RELEASE", reply),
    }
}

/// `LOCK.EXTEND key owner ttl` -> extended?
pub(crate) fn extend(key: &str, owner: &str, ttl_ms: u64) -> Command<bool> {
    let mut cmd = redis::cmd("LOCK.EXTEND");
    cmd.arg(key).arg(owner).arg(ttl_ms);
    Command {
        cmd,
        parse: |reply| zero_or_one("LOCK.EXTEND", reply),
    }
}

/// `LOCK.FENCE key token` -> is `token` the live hold's?
pub(crate) fn fence(key: &str, token: u64) -> Command<bool> {
    let mut cmd = redis::cmd("LOCK.FENCE");
    cmd.arg(key).arg(token);
    Command {
        cmd,
        parse: |reply| zero_or_one("LOCK.FENCE", reply),
    }
}

fn zero_or_one(command: &'static str, reply: Value) -> Result<bool, Error> {
    match reply {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        other => Err(unexpected(command, other)),
    }
}

fn unexpected(command: &'static str, reply: Value) -> Error {
    Error::UnexpectedReply {
        command,
        reply: format!("{reply:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Argument checks and outcome rules that both APIs follow.

/// `ttl` in whole milliseconds; at least 1.
pub(crate) fn ttl_ms(ttl: Duration) -> Result<u64, Error> {
    let ms = u64::try_from(ttl.as_millis()).map_err(|_| Error::InvalidArgument("ttl too long"))?;
    if ms == 0 {
        return Err(Error::InvalidArgument("ttl must be at least 1 ms"));
    }
    Ok(ms)
}

/// The `BLOCK` argument for a blocking acquire that waits up to `wait`: `None` for a zero wait,
/// which is sent without `BLOCK` (the server would read `BLOCK 0` as "forever"). Rounded up, so
/// that a sub-millisecond wait still waits.
pub(crate) fn block_ms(wait: Duration) -> Result<Option<u64>, Error> {
    let ms = u64::try_from(wait.as_nanos().div_ceil(1_000_000))
        .map_err(|_| Error::InvalidArgument("wait too long"))?;
    Ok((ms > 0).then_some(ms))
}

/// The owner of a new acquisition: the client's chosen one, or a new random UUID. The flag is
/// true for a made-up owner, which no one else can hold, so releasing it is always safe.
pub(crate) fn pick_owner(chosen: &Option<String>) -> (String, bool) {
    match chosen {
        Some(owner) => (owner.clone(), false),
        None => (uuid::Uuid::new_v4().to_string(), true),
    }
}

/// A watchdog `period` is non-zero and shorter than the lock's `ttl`.
pub(crate) fn check_watchdog_period(period: Duration, ttl: Duration) -> Result<(), Error> {
    if period.is_zero() || period >= ttl {
        return Err(Error::InvalidArgument(
            "watchdog period must be non-zero and shorter than the ttl",
        ));
    }
    Ok(())
}

/// A command that failed, and whether it may have taken effect anyway.
pub(crate) struct Failure {
    /// What went wrong.
    pub(crate) error: Error,
    /// False when the command certainly did not run (no connection) or ran without effect (an
    /// error reply); true when its reply was lost, so it may have run.
    pub(crate) maybe_sent: bool,
}

impl Failure {
    /// A failure after the command was handed to a connection.
    pub(crate) fn sent(error: Error) -> Failure {
        Failure {
            // An error reply means the command ran and changed nothing; anything else (no
            // reply, a garbled one) leaves its effect unknown.
            maybe_sent: !matches!(error, Error::Server(_)),
            error,
        }
    }

    /// A failure before anything was sent (the connection could not be opened).
    pub(crate) fn unsent(error: Error) -> Failure {
        Failure {
            error,
            maybe_sent: false,
        }
    }
}

/// Whether a connection is still in step after a command: it got its reply, or an error reply.
/// After an I/O error, a timeout or a malformed reply it is dropped, never reused, since a late
/// reply would otherwise be read as the answer to the next command (and, for a waiter, the
/// server may still hold the connection in a queue).
pub(crate) fn in_step<T>(result: &Result<T, Error>) -> bool {
    matches!(result, Ok(_) | Err(Error::Server(_)))
}
