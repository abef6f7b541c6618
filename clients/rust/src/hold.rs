//! What a guard holds and how it got it, with no I/O: the half of every acquire, release,
//! extend and fence check that the sync and the async API share. They differ only in how they
//! send the [`Command`]s built here and wait for the replies.
//!
//! - [`Target`]: what an acquisition asks for (one key alone, shared or as a permit; or several
//!   keys at once).
//! - [`Acquisition`]: one call of an `acquire*` method: its request, then [`Acquisition::settle`]
//!   decides from the reply what the caller gets and what must be cleaned up.
//! - [`Hold`]: a granted lock: its keys, owner, tokens and TTL, and the commands that release,
//!   extend and check it, and that fence a write with its token.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::command::{self, block_ms, hold_ttl_ms, pick_owner, Command, Failure, Mode};
use crate::error::Error;

/// What an acquisition asks for.
#[derive(Clone, Debug)]
pub(crate) enum Target {
    /// One key (`LOCK.ACQUIRE`), alone or shared.
    One {
        /// The lock's key.
        key: String,
        /// Alone, shared, or one of `n` permits.
        mode: Mode,
    },
    /// Exclusive locks on every key or none (`LOCK.MACQUIRE`).
    Many {
        /// The keys, in the caller's order (the tokens come in the same order).
        keys: Vec<String>,
    },
}

impl Target {
    /// An exclusive lock on `key`.
    pub(crate) fn exclusive(key: &str) -> Target {
        Target::One {
            key: key.to_string(),
            mode: Mode::Exclusive,
        }
    }

    /// The keys, one for a single-key target.
    fn keys(&self) -> &[String] {
        match self {
            Target::One { key, .. } => std::slice::from_ref(key),
            Target::Many { keys } => keys,
        }
    }

    /// Arguments the server would refuse, refused before anything is sent.
    fn check(&self) -> Result<(), Error> {
        match self {
            Target::One {
                mode: Mode::Shared { limit: Some(0) },
                ..
            } => Err(Error::InvalidArgument(
                "a semaphore's limit must be at least 1",
            )),
            Target::Many { keys } if keys.is_empty() => {
                Err(Error::InvalidArgument("a MultiLock needs at least one key"))
            }
            _ => Ok(()),
        }
    }
}

/// One call of an `acquire*` method, before its reply.
pub(crate) struct Acquisition {
    /// What it asks for.
    target: Target,
    /// The owner it asks as.
    owner: String,
    /// True for a made-up owner, which no one else can hold, so releasing it is always safe.
    generated: bool,
    /// The TTL, in ms.
    ttl_ms: u64,
    /// `BLOCK ms`, or `None` for one try.
    block_ms: Option<u64>,
    /// `SESSION id`: the session the hold is taken in, if any.
    session: Option<String>,
    /// In the client's default session: the hold keeps a deadline of its own, as without a
    /// session (an extend to zero is refused).
    own_ttl: bool,
    /// When the request was made: the server grants it later, so the hold's deadline is at
    /// least this plus the TTL.
    started: Instant,
    /// A blocking acquisition: when the caller's wait ends.
    until: Option<Instant>,
}

/// What an acquisition's reply means for the caller.
pub(crate) enum Settled {
    /// Granted: the caller gets a guard for this hold.
    Granted(Hold),
    /// Held by someone else (or the wait ran out): the caller gets `None`.
    Busy,
    /// A failure, and the command to send (ignoring its outcome) before reporting it: the
    /// release of a grant that may have been made with its reply lost.
    Failed {
        /// What the caller gets.
        error: Error,
        /// `Some` when the request may have been granted and the owner is this call's own.
        clean_up: Option<Command<bool>>,
    },
}

impl Acquisition {
    /// Check the arguments and pick the owner: the client's chosen one (`chosen`), or a new
    /// random UUID. `wait` is `None` for one try, else how long to wait in the queue (zero is
    /// one try too: the server would read `BLOCK 0` as "forever"). `session` is the id of the
    /// session to hold it in; there a zero `ttl` means no deadline of the hold's own.
    pub(crate) fn new(
        target: Target,
        chosen: &Option<String>,
        ttl: Duration,
        wait: Option<Duration>,
        session: Option<&str>,
    ) -> Result<Acquisition, Error> {
        target.check()?;
        let ttl_ms = hold_ttl_ms(ttl, session.is_some())?;
        let block_ms = match wait {
            Some(wait) => block_ms(wait)?,
            None => None,
        };
        let (owner, generated) = pick_owner(chosen);
        let started = Instant::now();
        Ok(Acquisition {
            target,
            owner,
            generated,
            ttl_ms,
            block_ms,
            session: session.map(str::to_string),
            own_ttl: false,
            started,
            until: block_ms.map(|ms| started + Duration::from_millis(ms)),
        })
    }

    /// The same acquisition, made in the client's default session: the hold keeps a deadline
    /// of its own (the caller checked that its ttl is not zero).
    pub(crate) fn keeping_own_ttl(self, own: bool) -> Acquisition {
        Acquisition {
            own_ttl: own,
            ..self
        }
    }

    /// True if the request waits in the server's queue (`BLOCK`).
    #[cfg(feature = "tokio")]
    pub(crate) fn blocks(&self) -> bool {
        self.block_ms.is_some()
    }

    /// How long to wait for the reply: the I/O timeout, plus the wait for a blocking request.
    pub(crate) fn reply_timeout(&self, io_timeout: Duration) -> Duration {
        Duration::from_millis(self.block_ms.unwrap_or(0)) + io_timeout
    }

    /// The request: `LOCK.ACQUIRE` or `LOCK.MACQUIRE`, answered with the tokens or `None`.
    pub(crate) fn request(&self) -> Command<Option<Vec<u64>>> {
        let (owner, ttl, block) = (&self.owner, self.ttl_ms, self.block_ms);
        let session = self.session.as_deref();
        let request = match &self.target {
            Target::One { key, mode } => {
                command::acquire(key, owner, ttl, *mode, block, session).map(|t| t.map(|t| vec![t]))
            }
            Target::Many { keys } => command::macquire(keys, owner, ttl, block, session),
        };
        // A killed master is followed by the acquire itself ([`Acquisition::resent`]), with the
        // wait it has left.
        request.resent_by_caller()
    }

    /// The same acquisition, to be sent again now to the slot's new master after its node was
    /// found gone (a killed master, issue 34): the same owner (a grant made on the old master
    /// and replicated is answered again with its token, as an idempotent retry), the same ttl,
    /// and a `BLOCK` of the wait left until the caller's own deadline (none left: one try).
    pub(crate) fn resent(&self) -> Acquisition {
        let now = Instant::now();
        let block_ms = self.until.and_then(|until| {
            let left = until.saturating_duration_since(now);
            block_ms(left).ok().flatten()
        });
        Acquisition {
            target: self.target.clone(),
            owner: self.owner.clone(),
            block_ms,
            session: self.session.clone(),
            started: now,
            ..*self
        }
    }

    /// What the reply to [`Acquisition::request`] means.
    ///
    /// After a failure the request may have been granted with the reply lost. A made-up owner
    /// is ours alone, so its grant is released; a chosen owner may be a hold that this call was
    /// retrying, so it is left alone (the caller can retry or release).
    pub(crate) fn settle(self, reply: Result<Option<Vec<u64>>, Failure>) -> Settled {
        match reply {
            Ok(Some(tokens)) => {
                // A blocking grant came at some moment of the wait, which the client does not
                // know: it counts from the reply's arrival (later than the grant by the reply's
                // trip from the server).
                let renewed = match self.block_ms {
                    Some(_) => Instant::now(),
                    None => self.started,
                };
                Settled::Granted(Hold {
                    target: self.target,
                    owner: self.owner,
                    generated: self.generated,
                    tokens,
                    ttl_ms: AtomicU64::new(self.ttl_ms),
                    in_session: self.session.is_some() && !self.own_ttl,
                    renewed: Mutex::new(renewed),
                })
            }
            Ok(None) => Settled::Busy,
            Err(Failure { error, maybe_sent }) => {
                let clean_up =
                    (self.generated && maybe_sent).then(|| release(&self.target, &self.owner));
                Settled::Failed { error, clean_up }
            }
        }
    }
}

/// A granted lock: what a guard (sync or async) holds, shared with its watchdog.
#[derive(Debug)]
pub(crate) struct Hold {
    /// What was asked for.
    target: Target,
    /// The owner it is held as.
    owner: String,
    /// The owner was made up for this grant (no one else can hold as it).
    generated: bool,
    /// The fencing tokens, one per key.
    tokens: Vec<u64>,
    /// The TTL of the grant or of the last successful extend, in ms; the watchdog renews with it.
    /// Zero for a session hold with no deadline of its own.
    ttl_ms: AtomicU64,
    /// Held in a session: it ends with the session too, and a zero TTL is allowed.
    in_session: bool,
    /// When the grant or the last successful extend was sent: the client's own, conservative
    /// deadline is this plus the TTL.
    renewed: Mutex<Instant>,
}

impl Hold {
    /// The keys, in the order they were asked for.
    pub(crate) fn keys(&self) -> &[String] {
        self.target.keys()
    }

    /// The owner id.
    pub(crate) fn owner(&self) -> &str {
        &self.owner
    }

    /// The tokens, one per key.
    pub(crate) fn tokens(&self) -> &[u64] {
        &self.tokens
    }

    /// The largest token (the only one, for a single key).
    pub(crate) fn token(&self) -> u64 {
        self.tokens.iter().copied().max().unwrap_or(0)
    }

    /// The TTL renewals ask for.
    pub(crate) fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms.load(Ordering::Relaxed))
    }

    /// `LOCK.RELEASE`, or `LOCK.MRELEASE` for several keys: true if every key was still held.
    pub(crate) fn release(&self) -> Command<bool> {
        release(&self.target, &self.owner)
    }

    /// `LOCK.FENCE key token`, on every key for several: true if every token is live.
    pub(crate) fn fence(&self) -> Command<bool> {
        match &self.target {
            Target::One { key, .. } => command::fence(key, self.token()),
            Target::Many { keys } => command::fence_all(keys, &self.tokens),
        }
    }

    /// The fenced write of `write` with this hold's token ([`command::fenced`]). `lock` names
    /// the key whose token fences it: `None` for a single-key hold (refused for several keys,
    /// each of which has a token of its own), or one of the keys.
    pub(crate) fn fenced<T: redis::FromRedisValue + 'static>(
        &self,
        lock: Option<&str>,
        write: &redis::Cmd,
    ) -> Result<Command<T>, Error> {
        let key = match (lock, &self.target) {
            (Some(lock), _) => lock,
            (None, Target::One { key, .. }) => key,
            (None, Target::Many { .. }) => return Err(Error::InvalidArgument(FENCE_WHICH_KEY)),
        };
        let i = self
            .keys()
            .iter()
            .position(|k| k == key)
            .ok_or(Error::InvalidArgument(
                "fenced_by needs one of the guard's keys",
            ))?;
        command::fenced(key, self.tokens[i], write)
    }

    /// [`command::fenced_script`] with this hold's token (one key; a multi-key hold is refused).
    pub(crate) fn fenced_script<T: redis::FromRedisValue + 'static>(
        &self,
        body: &str,
        keys: &[&str],
        args: &[Vec<u8>],
    ) -> Result<Command<T>, Error> {
        match &self.target {
            Target::One { key, .. } => Ok(command::fenced_script(
                key,
                self.tokens[0],
                body,
                keys,
                args,
            )),
            Target::Many { .. } => Err(Error::InvalidArgument(FENCE_WHICH_KEY)),
        }
    }

    /// True for a shared hold (a reader, a permit): others may hold the key with it.
    pub(crate) fn shared(&self) -> bool {
        matches!(
            self.target,
            Target::One {
                mode: Mode::Shared { .. },
                ..
            }
        )
    }

    /// The client's own deadline of the hold: when the last successful grant or extend was
    /// sent, plus the TTL (the server's deadline is no earlier). `None` for a session hold with
    /// no deadline of its own.
    pub(crate) fn local_deadline(&self) -> Option<Instant> {
        let ttl = self.ttl();
        let renewed = *self.renewed.lock().unwrap_or_else(PoisonError::into_inner);
        (!ttl.is_zero()).then(|| renewed + ttl)
    }

    /// A renewal sent at `sent` succeeded: the local deadline moves.
    pub(crate) fn renewed(&self, sent: Instant) {
        let mut renewed = self.renewed.lock().unwrap_or_else(PoisonError::into_inner);
        *renewed = (*renewed).max(sent);
    }

    /// True for a hold taken in a session.
    pub(crate) fn in_session(&self) -> bool {
        self.in_session
    }

    /// The renewal the watchdog sends: an extend with the current TTL.
    pub(crate) fn renewal(&self) -> Command<bool> {
        self.extend_ms(self.ttl_ms.load(Ordering::Relaxed))
    }

    /// An extend to `ttl`, and the TTL in ms to record with [`Hold::extended`] if it succeeds.
    /// In a session a zero `ttl` takes the hold's own deadline away again.
    pub(crate) fn extend(&self, ttl: Duration) -> Result<(Command<bool>, u64), Error> {
        let ms = hold_ttl_ms(ttl, self.in_session)?;
        Ok((self.extend_ms(ms), ms))
    }

    /// Record the outcome of an extend to `ms` sent at `sent`: on success, later renewals use
    /// `ms`, and the local deadline counts from `sent`.
    pub(crate) fn extended(&self, ms: u64, sent: Instant, extended: bool) -> bool {
        if extended {
            self.ttl_ms.store(ms, Ordering::Relaxed);
            self.renewed(sent);
        }
        extended
    }

    fn extend_ms(&self, ms: u64) -> Command<bool> {
        match &self.target {
            Target::One { key, .. } => command::extend(key, &self.owner, ms),
            Target::Many { keys } => command::extend_all(keys, &self.owner, ms),
        }
    }
}

/// The refusal of `fenced` on a guard of several keys (the Python package's `MultiLock.fenced`
/// refuses too).
const FENCE_WHICH_KEY: &str = "a MultiLock guard holds several keys, each with its own token: \
                               fence with one of them, guard.fenced_by(key, command)";

/// How many replicas a durable client waits for after each grant, and for how long.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Durable {
    /// `WAIT`'s first argument.
    pub(crate) replicas: u32,
    /// `WAIT`'s timeout, in ms (0 would wait forever: at least 1).
    pub(crate) timeout_ms: u64,
}

impl Durable {
    /// The `WAIT` that follows a grant on the same connection, and how long its reply may take.
    pub(crate) fn wait(&self, io_timeout: Duration) -> (Command<u64>, Duration) {
        let reply = Duration::from_millis(self.timeout_ms) + io_timeout;
        (command::wait(self.replicas, self.timeout_ms), reply)
    }

    /// A grant whose `WAIT` answered `acked`: `Ok` if enough replicas have it; otherwise the
    /// shortfall, and the release to send first (only for an owner made up for this grant: a
    /// chosen owner's hold may be one the caller had before this call).
    pub(crate) fn check(
        &self,
        hold: &Hold,
        acked: Option<Result<u64, Error>>,
    ) -> Result<(), (u64, Option<Command<bool>>)> {
        let acknowledged = match acked {
            Some(Ok(n)) => n,
            _ => 0,
        };
        if acknowledged >= u64::from(self.replicas) {
            return Ok(());
        }
        Err((acknowledged, hold.generated.then(|| hold.release())))
    }

    /// True on servers where a `WAIT` after a blocked grant counts it (7.0.12 and later).
    pub(crate) fn supported(version: (u32, u32, u32)) -> bool {
        version >= (7, 0, 12)
    }

    /// The refusal on an older server.
    pub(crate) fn too_old() -> Error {
        Error::InvalidArgument(
            "durable grants need Redis 7.0.12 or later (there a WAIT after a blocked grant \
             counts it); this server is older",
        )
    }

    /// The error for a shortfall, once the release (if any) was tried.
    pub(crate) fn shortfall(&self, acknowledged: u64, released: bool) -> Error {
        Error::NotDurable {
            acknowledged,
            wanted: self.replicas,
            released,
        }
    }
}

/// The release of `owner`'s hold on `target`.
fn release(target: &Target, owner: &str) -> Command<bool> {
    match target {
        Target::One { key, .. } => command::release(key, owner),
        Target::Many { keys } => command::mrelease(keys, owner),
    }
}

#[cfg(test)]
mod tests {
    use super::Durable;

    #[test]
    fn durable_grants_need_7_0_12() {
        for (version, ok) in [
            ((6, 2, 14), false),
            ((7, 0, 11), false),
            ((7, 0, 12), true),
            ((7, 0, 15), true),
            ((7, 2, 4), true),
            ((8, 2, 3), true),
        ] {
            assert_eq!(Durable::supported(version), ok, "{version:?}");
        }
        assert!(Durable::too_old()
            .to_string()
            .contains("need Redis 7.0.12 or later"));
    }
}
