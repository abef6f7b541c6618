//! The lock commands, written and read once for both APIs: [`Command`] holds the request and
//! how to read its reply. The sync client runs it with [`Command::run`]; the async one sends
//! `command.cmd` on a tokio connection and reads the reply with [`Command::read`]. The two
//! `CLIENT` commands serve the async client's cancelled waits.
//!
//! Each reader checks the reply's type: an integer must be an integer, nil must be nil.

use std::time::Duration;

use redis::{RedisResult, Value};

use crate::error::Error;

/// Turns a reply, or the error it came as, into a command's result.
type Reader<T> = Box<dyn Fn(Result<Value, Error>) -> Result<T, Error> + Send + Sync>;

/// A lock command and the reader of its reply.
pub(crate) struct Command<T> {
    /// The request.
    pub(crate) cmd: redis::Cmd,
    /// Turns the reply, or the error it came as, into the command's result.
    parse: Reader<T>,
    /// Whether a cluster node's client may send it again to the slot's new master after its
    /// node is gone (a killed master, issue 34).
    pub(crate) resend: Resend,
}

impl<T: 'static> Command<T> {
    /// A command whose error replies are the caller's errors as they are.
    pub(crate) fn new(
        cmd: redis::Cmd,
        parse: impl Fn(Value) -> Result<T, Error> + Send + Sync + 'static,
    ) -> Self {
        Command::reading_errors(cmd, move |reply| parse(reply?))
    }

    /// A command that also reads its errors (a fenced write turns `STALE` into
    /// [`Error::StaleToken`]).
    fn reading_errors(
        cmd: redis::Cmd,
        parse: impl Fn(Result<Value, Error>) -> Result<T, Error> + Send + Sync + 'static,
    ) -> Self {
        Command {
            cmd,
            parse: Box::new(parse),
            resend: Resend::Unsent,
        }
    }

    /// The same command, marked as one that may run twice ([`Resend::Always`]): running it
    /// again after a reply was lost answers the same or changes nothing.
    pub(crate) fn idempotent(self) -> Self {
        Command {
            resend: Resend::Always,
            ..self
        }
    }

    /// The same command, never sent again by the connection layer ([`Resend::Never`]).
    pub(crate) fn resent_by_caller(self) -> Self {
        Command {
            resend: Resend::Never,
            ..self
        }
    }

    /// Send the command on a sync connection and read its reply.
    pub(crate) fn run(&self, conn: &mut dyn redis::ConnectionLike) -> Result<T, Error> {
        self.read(self.cmd.query(conn))
    }

    /// Read the command's reply (an error reply arrives as `Err`, as `Cmd::query` and
    /// `Cmd::query_async` return it).
    pub(crate) fn read(&self, reply: RedisResult<Value>) -> Result<T, Error> {
        (self.parse)(reply.map_err(Error::from_redis))
    }

    /// The same request, its result turned into another by `f`.
    pub(crate) fn map<U: 'static>(self, f: impl Fn(T) -> U + Send + Sync + 'static) -> Command<U> {
        let (parse, resend) = (self.parse, self.resend);
        Command {
            resend,
            ..Command::reading_errors(self.cmd, move |reply| parse(reply).map(&f))
        }
    }
}

/// When a cluster node's client sends a command again to the slot's new master after the node
/// it was sent to is gone (a killed master: no connection, or one that broke mid-command).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Resend {
    /// Only if it certainly did not run (no connection could be opened): a session's `OPEN`
    /// (two would open two), a fenced write, anything not known to be safe twice.
    Unsent,
    /// Also after its connection broke with the reply lost: running it twice is running it
    /// once (a release, an extend, a fence check, a session's keepalive, `INFO`, `CLOSE`).
    Always,
    /// Never by the connection layer: an acquisition, which its caller makes again as the
    /// same owner with the wait it has left ([`crate::hold::Acquisition::resent`]).
    Never,
}

/// How a single-key acquire holds the key (see "Shared locks and semaphores" in
/// docs/commands.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Alone: no option.
    Exclusive,
    /// `SHARED`, with `LIMIT n` when `limit` is given: a reader, or one of `n` permits.
    Shared {
        /// The number of permits, or `None` for any number of shared holders.
        limit: Option<u32>,
    },
}

/// `LOCK.ACQUIRE key owner ttl [SHARED [LIMIT n]] [BLOCK ms] [SESSION id]` -> `Some(token)` or
/// `None`.
pub(crate) fn acquire(
    key: &str,
    owner: &str,
    ttl_ms: u64,
    mode: Mode,
    block_ms: Option<u64>,
    session: Option<&str>,
) -> Command<Option<u64>> {
    let mut cmd = redis::cmd("LOCK.ACQUIRE");
    cmd.arg(key).arg(owner).arg(ttl_ms);
    if let Mode::Shared { limit } = mode {
        cmd.arg("SHARED");
        if let Some(n) = limit {
            cmd.arg("LIMIT").arg(n);
        }
    }
    if let Some(ms) = block_ms {
        cmd.arg("BLOCK").arg(ms);
    }
    if let Some(id) = session {
        cmd.arg("SESSION").arg(id);
    }
    Command::new(cmd, |reply| match reply {
        Value::Int(n) if n > 0 => Ok(Some(n as u64)),
        Value::Nil => Ok(None),
        other => Err(unexpected("LOCK.ACQUIRE", other)),
    })
}

/// `LOCK.MACQUIRE numkeys key... owner ttl [BLOCK ms] [SESSION id]` -> one token per key, or
/// `None`.
pub(crate) fn macquire(
    keys: &[String],
    owner: &str,
    ttl_ms: u64,
    block_ms: Option<u64>,
    session: Option<&str>,
) -> Command<Option<Vec<u64>>> {
    let mut cmd = redis::cmd("LOCK.MACQUIRE");
    cmd.arg(keys.len()).arg(keys).arg(owner).arg(ttl_ms);
    if let Some(ms) = block_ms {
        cmd.arg("BLOCK").arg(ms);
    }
    if let Some(id) = session {
        cmd.arg("SESSION").arg(id);
    }
    let n = keys.len();
    Command::new(cmd, move |reply| match reply {
        Value::Nil => Ok(None),
        Value::Array(items) if items.len() == n => items
            .into_iter()
            .map(|item| match item {
                Value::Int(t) if t > 0 => Ok(t as u64),
                other => Err(unexpected("LOCK.MACQUIRE", other)),
            })
            .collect::<Result<Vec<u64>, Error>>()
            .map(Some),
        other => Err(unexpected("LOCK.MACQUIRE", other)),
    })
}

/// `LOCK.RELEASE key owner` -> released?
pub(crate) fn release(key: &str, owner: &str) -> Command<bool> {
    let mut cmd = redis::cmd("LOCK.RELEASE");
    cmd.arg(key).arg(owner);
    Command::new(cmd, |reply| zero_or_one("LOCK.RELEASE", reply)).idempotent()
}

/// `LOCK.MRELEASE numkeys key... owner` -> were all `keys` released?
pub(crate) fn mrelease(keys: &[String], owner: &str) -> Command<bool> {
    let mut cmd = redis::cmd("LOCK.MRELEASE");
    cmd.arg(keys.len()).arg(keys).arg(owner);
    let n = keys.len() as i64;
    Command::new(cmd, move |reply| {
        count_of("LOCK.MRELEASE", reply, n).map(|c| c == n)
    })
    .idempotent()
}

/// `LOCK.EXTEND key owner ttl` -> extended?
pub(crate) fn extend(key: &str, owner: &str, ttl_ms: u64) -> Command<bool> {
    let mut cmd = redis::cmd("LOCK.EXTEND");
    cmd.arg(key).arg(owner).arg(ttl_ms);
    Command::new(cmd, |reply| zero_or_one("LOCK.EXTEND", reply)).idempotent()
}

/// KEYS the locks, ARGV[1] the owner, ARGV[2] ttl-ms: how many keys were extended. There is no
/// multi-key extend command; a script is one atomic step on the server (the Python package's
/// `MultiLock` runs the same one).
const EXTEND_ALL_LUA: &str = "\
local n = 0
for _, key in ipairs(KEYS) do
    n = n + redis.call('LOCK.EXTEND', key, ARGV[1], ARGV[2])
end
return n
";

/// KEYS the locks, ARGV their tokens: 1 if every token is live.
const FENCE_ALL_LUA: &str = "\
for i, key in ipairs(KEYS) do
    if redis.call('LOCK.FENCE', key, ARGV[i]) ~= 1 then
        return 0
    end
end
return 1
";

/// `LOCK.EXTEND key owner ttl` on every key in one script -> were all extended?
pub(crate) fn extend_all(keys: &[String], owner: &str, ttl_ms: u64) -> Command<bool> {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(EXTEND_ALL_LUA)
        .arg(keys.len())
        .arg(keys)
        .arg(owner)
        .arg(ttl_ms);
    let n = keys.len() as i64;
    Command::new(cmd, move |reply| {
        count_of("LOCK.EXTEND (script)", reply, n).map(|c| c == n)
    })
    .idempotent()
}

/// `LOCK.FENCE key token` on every key in one script -> are all tokens live?
pub(crate) fn fence_all(keys: &[String], tokens: &[u64]) -> Command<bool> {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(FENCE_ALL_LUA).arg(keys.len()).arg(keys).arg(tokens);
    Command::new(cmd, |reply| zero_or_one("LOCK.FENCE (script)", reply)).idempotent()
}

/// `LOCK.FENCE key token` -> is `token` the live hold's?
pub(crate) fn fence(key: &str, token: u64) -> Command<bool> {
    let mut cmd = redis::cmd("LOCK.FENCE");
    cmd.arg(key).arg(token);
    Command::new(cmd, |reply| zero_or_one("LOCK.FENCE", reply)).idempotent()
}

// ---------------------------------------------------------------------------------------------
// Fenced writes: one command that runs only while a token is the live hold on a lock.

/// The text of [`FENCE_CHECK_LUA`], as a macro so that [`FENCED_CALL_LUA`] can be built from it
/// with `concat!`.
macro_rules! fence_check_lua {
    () => {
        "\
if redis.call('LOCK.FENCE', KEYS[1], ARGV[1]) ~= 1 then
    return redis.error_reply('STALE token ' .. ARGV[1] .. ' is not the live hold on ' .. KEYS[1])
end
"
    };
}

/// The check to put first in a script of your own: `KEYS[1]` the lock, `ARGV[1]` the token (as
/// a string). It answers `STALE token <token> is not the live hold on <lock>` unless the token
/// is a live holder's.
///
/// The same text as `FENCE_CHECK_LUA` in the Python package (`redislock_native/fence.py`) and
/// the Node package (`lib/fence.js`): a fenced write behaves the same from every client (the
/// test `the_scripts_are_the_python_and_node_packages_scripts` in `tests/fenced.rs` compares
/// them).
pub const FENCE_CHECK_LUA: &str = fence_check_lua!();

/// [`FENCE_CHECK_LUA`], then one command on one key: `KEYS[1]` the lock, `KEYS[2]` the key
/// written, `ARGV[1]` the token, `ARGV[2]` the command, `ARGV[3..]` its other arguments.
/// [`Guard::fenced`](crate::Guard::fenced) and [`fenced_call`](crate::fenced_call) send it.
///
/// The same text as `FENCED_CALL_LUA` in the Python and Node packages (see
/// [`FENCE_CHECK_LUA`]): keep them in step.
pub const FENCED_CALL_LUA: &str = concat!(
    fence_check_lua!(),
    "\
-- KEYS[2] the key written, ARGV[2] the command, ARGV[3..] its other arguments.
return redis.call(ARGV[2], KEYS[2], unpack(ARGV, 3))
"
);

/// `EVAL FENCE_CHECK_LUA+body 1+n lock keys... token args...`: a script of one's own behind the
/// fence check (`KEYS[1]` the lock, `ARGV[1]` the token; the caller's keys from `KEYS[2]`, its
/// arguments from `ARGV[2]`), its reply as `T`, or [`Error::StaleToken`] as for [`fenced`].
pub(crate) fn fenced_script<T: redis::FromRedisValue + 'static>(
    lock: &str,
    token: u64,
    body: &str,
    keys: &[&str],
    args: &[Vec<u8>],
) -> Command<T> {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(format!("{FENCE_CHECK_LUA}{body}"))
        .arg(1 + keys.len())
        .arg(lock)
        .arg(keys)
        .arg(token);
    for arg in args {
        cmd.arg(arg.as_slice());
    }
    let lock = lock.to_string();
    Command::reading_errors(cmd, move |reply| match reply {
        Ok(value) => T::from_redis_value(&value).map_err(|_| unexpected("a fenced script", value)),
        Err(Error::Server(e)) if e.code() == Some("STALE") => Err(Error::StaleToken {
            lock: lock.clone(),
            token,
        }),
        Err(e) => Err(e),
    })
}

/// `EVAL FENCED_CALL_LUA 2 lock key token name args...` for `write` = `name key args...`: the
/// command's reply as `T`, or [`Error::StaleToken`] when `token` is not the live hold on
/// `lock`. A command without a key, or with a cursor argument, is refused before sending.
pub(crate) fn fenced<T: redis::FromRedisValue + 'static>(
    lock: &str,
    token: u64,
    write: &redis::Cmd,
) -> Result<Command<T>, Error> {
    let mut parts = Vec::with_capacity(write.args_iter().len());
    for arg in write.args_iter() {
        match arg {
            redis::Arg::Simple(bytes) => parts.push(bytes),
            redis::Arg::Cursor => {
                return Err(Error::InvalidArgument(
                    "a fenced command cannot have a cursor argument",
                ))
            }
        }
    }
    let [name, key, args @ ..] = parts.as_slice() else {
        return Err(Error::InvalidArgument(
            "a fenced command needs a name and a key: `redis::cmd(\"SET\").arg(key).arg(value)`",
        ));
    };
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(FENCED_CALL_LUA)
        .arg(2)
        .arg(lock)
        .arg(*key)
        .arg(token)
        .arg(*name);
    for arg in args {
        cmd.arg(*arg);
    }
    let lock = lock.to_string();
    Ok(Command::reading_errors(cmd, move |reply| match reply {
        Ok(value) => T::from_redis_value(&value).map_err(|_| unexpected("a fenced command", value)),
        Err(Error::Server(e)) if e.code() == Some("STALE") => Err(Error::StaleToken {
            lock: lock.clone(),
            token,
        }),
        Err(e) => Err(e),
    }))
}

// ---------------------------------------------------------------------------------------------
// Sessions: one lease for many holds (see "Sessions" in docs/commands.md).

/// `LOCK.SESSION OPEN ttl [BOUND [GRACE ms]] [LOCKDELAY ms]` -> the new session's id.
pub(crate) fn session_open(
    ttl_ms: u64,
    bound: bool,
    grace_ms: Option<u64>,
    lock_delay_ms: Option<u64>,
) -> Command<String> {
    let mut cmd = redis::cmd("LOCK.SESSION");
    cmd.arg("OPEN").arg(ttl_ms);
    if bound {
        cmd.arg("BOUND");
    }
    if let Some(ms) = grace_ms {
        cmd.arg("GRACE").arg(ms);
    }
    if let Some(ms) = lock_delay_ms {
        cmd.arg("LOCKDELAY").arg(ms);
    }
    Command::new(cmd, |reply| match reply {
        Value::BulkString(id) if !id.is_empty() => String::from_utf8(id)
            .map_err(|e| unexpected("LOCK.SESSION OPEN", Value::BulkString(e.into_bytes()))),
        other => Err(unexpected("LOCK.SESSION OPEN", other)),
    })
}

/// `LOCK.SESSION KEEPALIVE id` -> the ms left, or `None`: the session is gone.
pub(crate) fn session_keepalive(id: &str) -> Command<Option<u64>> {
    let mut cmd = redis::cmd("LOCK.SESSION");
    cmd.arg("KEEPALIVE").arg(id);
    Command::new(cmd, |reply| match reply {
        Value::Int(n) if n >= 0 => Ok(Some(n as u64)),
        Value::Nil => Ok(None),
        other => Err(unexpected("LOCK.SESSION KEEPALIVE", other)),
    })
    .idempotent()
}

/// `LOCK.SESSION CLOSE id` -> how many holds it released, or `None`: the session was gone.
pub(crate) fn session_close(id: &str) -> Command<Option<u64>> {
    let mut cmd = redis::cmd("LOCK.SESSION");
    cmd.arg("CLOSE").arg(id);
    Command::new(cmd, |reply| match reply {
        Value::Int(n) if n >= 0 => Ok(Some(n as u64)),
        Value::Nil => Ok(None),
        other => Err(unexpected("LOCK.SESSION CLOSE", other)),
    })
    .idempotent()
}

/// `LOCK.SESSION INFO id` -> the session as the server sees it, or `None`: it is gone.
pub(crate) fn session_info(id: &str) -> Command<Option<crate::session::SessionInfo>> {
    let mut cmd = redis::cmd("LOCK.SESSION");
    cmd.arg("INFO").arg(id);
    Command::new(cmd, |reply| match reply {
        Value::Nil => Ok(None),
        Value::Map(pairs) => crate::session::SessionInfo::from_pairs(pairs).map(Some),
        // RESP2: the map as a flat array of names and values.
        Value::Array(items) if items.len() % 2 == 0 => {
            let mut items = items.into_iter();
            let mut pairs = Vec::new();
            while let (Some(name), Some(value)) = (items.next(), items.next()) {
                pairs.push((name, value));
            }
            crate::session::SessionInfo::from_pairs(pairs).map(Some)
        }
        other => Err(unexpected("LOCK.SESSION INFO", other)),
    })
    .idempotent()
}

/// `CLIENT ID` -> this connection's client id.
#[cfg(feature = "tokio")]
pub(crate) fn client_id() -> Command<u64> {
    Command::new(
        redis::cmd("CLIENT").arg("ID").clone(),
        |reply| match reply {
            Value::Int(n) if n > 0 => Ok(n as u64),
            other => Err(unexpected("CLIENT ID", other)),
        },
    )
}

/// `INFO server` -> the `redis_version` it reports (Valkey reports the Redis version it matches).
pub(crate) fn server_version() -> Command<(u32, u32, u32)> {
    let mut cmd = redis::cmd("INFO");
    cmd.arg("server");
    Command::new(cmd, |reply| {
        let text = match &reply {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            Value::VerbatimString { text, .. } => text.clone(),
            other => return Err(unexpected("INFO", other.clone())),
        };
        let version = text
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .ok_or_else(|| unexpected("INFO", reply.clone()))?;
        let mut parts = version
            .trim()
            .split('.')
            .map(|p| p.parse::<u32>().unwrap_or(0));
        let mut next = || parts.next().unwrap_or(0);
        Ok((next(), next(), next()))
    })
    .idempotent()
}

/// `WAIT replicas timeout-ms` -> how many replicas acknowledged this connection's writes.
pub(crate) fn wait(replicas: u32, timeout_ms: u64) -> Command<u64> {
    let mut cmd = redis::cmd("WAIT");
    cmd.arg(replicas).arg(timeout_ms);
    Command::new(cmd, |reply| match reply {
        Value::Int(n) if n >= 0 => Ok(n as u64),
        other => Err(unexpected("WAIT", other)),
    })
}

/// `CLIENT UNBLOCK id` -> was that client blocked? A waiter in a lock's queue then gets the
/// reply of a wait that ran out (nil).
#[cfg(feature = "tokio")]
pub(crate) fn unblock(client_id: u64) -> Command<bool> {
    let mut cmd = redis::cmd("CLIENT");
    cmd.arg("UNBLOCK").arg(client_id);
    Command::new(cmd, |reply| zero_or_one("CLIENT UNBLOCK", reply))
}

fn zero_or_one(command: &'static str, reply: Value) -> Result<bool, Error> {
    match reply {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        other => Err(unexpected(command, other)),
    }
}

/// An integer reply between 0 and `max`.
fn count_of(command: &'static str, reply: Value, max: i64) -> Result<i64, Error> {
    match reply {
        Value::Int(n) if (0..=max).contains(&n) => Ok(n),
        other => Err(unexpected(command, other)),
    }
}

pub(crate) fn unexpected(command: &'static str, reply: Value) -> Error {
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

/// A hold's `ttl` in whole milliseconds: at least 1, or exactly zero in a session (a session hold
/// with no deadline of its own, which ends with its session).
pub(crate) fn hold_ttl_ms(ttl: Duration, in_session: bool) -> Result<u64, Error> {
    match ttl.is_zero() && in_session {
        true => Ok(0),
        false => ttl_ms(ttl),
    }
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

/// A watchdog has something to renew: refused for a session hold with no deadline of its own.
pub(crate) fn check_renewable(hold: &crate::hold::Hold) -> Result<(), Error> {
    if hold.in_session() && hold.ttl().is_zero() {
        return Err(Error::InvalidArgument(
            "a session hold with ttl 0 has no deadline of its own to renew: the session's \
             keepalive covers it",
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

    /// This failure of a command's last try, after earlier tries (sent again to a killed
    /// master's successor) of which one may have run if `earlier`.
    pub(crate) fn after(self, earlier: bool) -> Failure {
        Failure {
            maybe_sent: self.maybe_sent || earlier,
            ..self
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
