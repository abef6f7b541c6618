//! [`Redlock`]: one lock over N independent masters, granted by a majority, using the module's
//! native commands (no scripts).
//!
//! The algorithm is the one described for Redis's Redlock, with `LOCK.ACQUIRE` in place of
//! `SET NX PX` and `LOCK.RELEASE` in place of the compare-and-delete script:
//!
//! 1. Note the start time; pick a random owner id.
//! 2. Send `LOCK.ACQUIRE key owner ttl` to each master in turn, each with short connect and read
//!    timeouts so that a dead master costs little.
//! 3. The lock is granted if a majority (`N / 2 + 1`) granted it and time is left:
//!    `validity = ttl - elapsed - drift`, with `drift = ttl / 100 + 2 ms` for clock rate
//!    differences between the masters and this process.
//! 4. Otherwise release it on every master that granted it (or may have: no reply) and report
//!    why: [`RedlockError::Contended`], [`RedlockError::Unavailable`] or
//!    [`RedlockError::Expired`].

use std::fmt;
use std::time::{Duration, Instant};

use crate::client::Client;
use crate::command::{self, ttl_ms, Command, Failure, Mode};
use crate::error::{Error, RedlockError};

/// Connect timeout per master, unless [`Redlock::with_timeouts`] says otherwise. Small compared
/// to a typical TTL, so that a master that is down costs little of the validity time.
pub const DEFAULT_MASTER_CONNECT_TIMEOUT: Duration = Duration::from_millis(100);

/// Read/write timeout per master, unless [`Redlock::with_timeouts`] says otherwise.
pub const DEFAULT_MASTER_IO_TIMEOUT: Duration = Duration::from_millis(100);

/// The configuration side of a Redlock, written once for [`Redlock`] and
/// [`crate::aio::Redlock`]: both keep one client per master in a field `masters`.
macro_rules! redlock_masters {
    () => {
        /// The same masters with other per-master timeouts: `connect` to open a connection, `io`
        /// for each reply. Keep both well below the TTLs you use: a master that does not answer
        /// costs up to `connect + io` of the validity time (once per round for the async
        /// Redlock, which asks the masters concurrently; once per such master for the sync one).
        pub fn with_timeouts(self, connect: Duration, io: Duration) -> Self {
            let masters = self.masters.into_iter();
            Self {
                masters: masters.map(|m| m.with_timeouts(connect, io)).collect(),
            }
        }

        /// How many masters there are.
        pub fn masters(&self) -> usize {
            self.masters.len()
        }

        /// How many masters must grant the lock: `masters / 2 + 1`.
        pub fn quorum(&self) -> usize {
            self.masters.len() / 2 + 1
        }
    };
}
#[cfg(feature = "tokio")]
pub(crate) use redlock_masters;

/// A lock manager over N independent Redis masters (not replicas of each other), each with the
/// redis-lock module loaded.
///
/// Cheap to share by reference between threads; each master has its own small connection pool.
pub struct Redlock {
    /// One client per master, in the order of the URLs.
    masters: Vec<Client>,
}

impl Redlock {
    /// A lock manager over the masters at `urls` (at least one; use an odd number, typically
    /// 5). Only parses the URLs; nothing is connected until the first acquisition.
    pub fn new<S: AsRef<str>>(urls: &[S]) -> Result<Redlock, Error> {
        let masters = open_masters(urls, Client::open, Client::with_timeouts)?;
        Ok(Redlock { masters })
    }

    redlock_masters!();

    /// Try once to take `key` for `ttl` on a majority of the masters.
    ///
    /// On success the guard's [`RedlockGuard::validity`] tells how long the lock can be relied
    /// on. On failure nothing is held (the lock was released wherever it was granted) and the
    /// error tells contention ([`RedlockError::Contended`]: retry after a random delay) from
    /// failure ([`RedlockError::Unavailable`], [`RedlockError::Expired`]).
    pub fn acquire(&self, key: &str, ttl: Duration) -> Result<RedlockGuard, RedlockError> {
        let round = Round::start(key, ttl)?;
        let votes = self
            .masters
            .iter()
            .map(|master| {
                let inner = &master.inner;
                let acquire = round.request();
                Vote::of(inner.with_conn_sent(inner.io_timeout, inner.connect_timeout, &acquire))
            })
            .collect();
        match round.decide(votes, self.quorum()) {
            Ok(grant) => Ok(RedlockGuard {
                masters: self.masters.clone(),
                grant,
                released: false,
            }),
            Err((maybe_held, error)) => {
                release_on(&self.masters, &maybe_held, key, &round.owner);
                Err(error)
            }
        }
    }
}

/// One client per URL (at least one), made by `open` and given the default per-master timeouts
/// with `with_timeouts`.
pub(crate) fn open_masters<S: AsRef<str>, C>(
    urls: &[S],
    open: fn(&str) -> Result<C, Error>,
    with_timeouts: fn(C, Duration, Duration) -> C,
) -> Result<Vec<C>, Error> {
    if urls.is_empty() {
        return Err(Error::InvalidArgument("Redlock needs at least one master"));
    }
    let default = |client| {
        with_timeouts(
            client,
            DEFAULT_MASTER_CONNECT_TIMEOUT,
            DEFAULT_MASTER_IO_TIMEOUT,
        )
    };
    urls.iter()
        .map(|url| open(url.as_ref()).map(default))
        .collect()
}

/// What one master answered to `LOCK.ACQUIRE`.
pub(crate) enum Vote {
    /// Granted, with this master's token.
    Granted(u64),
    /// Held by someone else there.
    Refused,
    /// No answer, or an error reply; and whether the request may have been granted anyway
    /// (its reply was lost).
    Failed(Error, bool),
}

impl Vote {
    /// The vote a master's reply to `LOCK.ACQUIRE` stands for.
    pub(crate) fn of(reply: Result<Option<u64>, Failure>) -> Vote {
        match reply {
            Ok(Some(token)) => Vote::Granted(token),
            Ok(None) => Vote::Refused,
            Err(Failure { error, maybe_sent }) => Vote::Failed(error, maybe_sent),
        }
    }
}

/// One acquisition over all masters: steps 1 and 3 of the algorithm, shared by the sync and the
/// async [`Redlock`]; they differ only in how they collect the votes.
pub(crate) struct Round {
    /// The lock's key.
    pub(crate) key: String,
    /// The random owner id, the same on every master.
    pub(crate) owner: String,
    /// The TTL asked of every master.
    pub(crate) ttl: Duration,
    /// `ttl` in milliseconds.
    pub(crate) ttl_ms: u64,
    /// When the round started, before the first request.
    pub(crate) start: Instant,
}

/// A lock granted by a majority: what a guard needs to report and release it.
pub(crate) struct Grant {
    /// The lock's key.
    pub(crate) key: String,
    /// The random owner id used on every master.
    pub(crate) owner: String,
    /// The combined token: the largest of `tokens`.
    pub(crate) token: u64,
    /// Each master's token, `None` where it did not grant.
    pub(crate) tokens: Vec<Option<u64>>,
    /// Masters where the lock is or may be held (granted, or no reply): released on drop.
    pub(crate) maybe_held: Vec<bool>,
    /// When the validity time ends: start of the acquisition + ttl - drift.
    pub(crate) valid_until: Instant,
    /// The validity time left right after the acquisition.
    pub(crate) validity_at_grant: Duration,
}

impl Round {
    /// Step 1: check the TTL, pick a random owner, note the time.
    pub(crate) fn start(key: &str, ttl: Duration) -> Result<Round, RedlockError> {
        let ttl_ms =
            ttl_ms(ttl).map_err(|_| RedlockError::InvalidArgument("ttl must be >= 1 ms"))?;
        Ok(Round {
            key: key.to_string(),
            owner: uuid::Uuid::new_v4().to_string(),
            ttl,
            ttl_ms,
            start: Instant::now(),
        })
    }

    /// Step 2's request to each master: `LOCK.ACQUIRE key owner ttl`.
    pub(crate) fn request(&self) -> Command<Option<u64>> {
        command::acquire(
            &self.key,
            &self.owner,
            self.ttl_ms,
            Mode::Exclusive,
            None,
            None,
        )
    }

    /// Step 3: granted if `needed` masters granted and validity time is left. Otherwise the
    /// error, with the masters where the lock is or may be held: the caller releases it there
    /// (step 4).
    pub(crate) fn decide(
        &self,
        votes: Vec<Vote>,
        needed: usize,
    ) -> Result<Grant, (Vec<bool>, RedlockError)> {
        let elapsed = self.start.elapsed();
        let drift = self.ttl / 100 + Duration::from_millis(2);
        let validity = self
            .ttl
            .checked_sub(elapsed + drift)
            .filter(|v| !v.is_zero());
        let granted = votes
            .iter()
            .filter(|v| matches!(v, Vote::Granted(_)))
            .count();
        let reachable = granted + votes.iter().filter(|v| matches!(v, Vote::Refused)).count();
        // Where the lock is, or may be, ours: granted, or sent with the reply lost. A refusal,
        // an error reply or a failed connection left nothing behind.
        let maybe_held: Vec<bool> = votes
            .iter()
            .map(|v| match v {
                Vote::Granted(_) => true,
                Vote::Failed(_, maybe_sent) => *maybe_sent,
                Vote::Refused => false,
            })
            .collect();

        if granted >= needed {
            if let Some(validity) = validity {
                let tokens: Vec<Option<u64>> = votes
                    .iter()
                    .map(|v| match v {
                        Vote::Granted(t) => Some(*t),
                        _ => None,
                    })
                    .collect();
                return Ok(Grant {
                    key: self.key.clone(),
                    owner: self.owner.clone(),
                    token: tokens.iter().flatten().copied().max().unwrap_or(0),
                    tokens,
                    maybe_held,
                    valid_until: self.start + self.ttl - drift,
                    validity_at_grant: validity,
                });
            }
            return Err((maybe_held, RedlockError::Expired { granted, elapsed }));
        }
        if reachable < needed {
            let errors = votes
                .into_iter()
                .enumerate()
                .filter_map(|(i, v)| match v {
                    Vote::Failed(e, _) => Some((i, e)),
                    _ => None,
                })
                .collect();
            let error = RedlockError::Unavailable {
                reachable,
                needed,
                errors,
            };
            return Err((maybe_held, error));
        }
        Err((maybe_held, RedlockError::Contended { granted, needed }))
    }
}

impl fmt::Debug for Redlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        debug_masters(self.masters(), f)
    }
}

/// `Debug` for a Redlock of `masters` masters, sync or async.
pub(crate) fn debug_masters(masters: usize, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    f.debug_struct("Redlock")
        .field("masters", &masters)
        .field("quorum", &(masters / 2 + 1))
        .finish()
}

/// `LOCK.RELEASE key owner` on each master flagged in `which`; returns how many released a hold.
fn release_on(masters: &[Client], which: &[bool], key: &str, owner: &str) -> usize {
    masters
        .iter()
        .zip(which)
        .filter(|(_, &flag)| flag)
        .filter(|(master, _)| {
            let inner = &master.inner;
            matches!(
                inner.with_conn(
                    inner.io_timeout,
                    inner.connect_timeout,
                    &command::release(key, owner)
                ),
                Ok(true)
            )
        })
        .count()
}

/// A lock held on a majority of the masters. Dropping it releases the lock on every master
/// (best effort).
///
/// There is no watchdog: a Redlock lock is meant to be used within its validity time
/// ([`RedlockGuard::validity`]) and then released.
pub struct RedlockGuard {
    /// The masters, in the order of the URLs.
    masters: Vec<Client>,
    /// What was granted.
    grant: Grant,
    /// Set once [`RedlockGuard::release`] ran.
    released: bool,
}

/// The read-only side of a Redlock guard, written once for [`RedlockGuard`] and
/// [`crate::aio::RedlockGuard`]: both keep what was granted in a field `grant: Grant`.
macro_rules! redlock_guard_accessors {
    () => {
        /// One fencing token for the whole lock: the **largest** of the tokens the granting masters
        /// returned.
        ///
        /// Why the maximum: on each master the tokens of a key strictly increase, and every token a
        /// master mints at time `t` (its clock, in ms) lies in `[t << 11, (t + 1) << 11)` as long as
        /// that clock never stepped back (see "Fencing tokens" in the module's README). Any two majorities
        /// share at least one master, and on that master the later acquisition got the larger
        /// token. With clocks in step, a lock acquired at least a millisecond (plus the clock skew)
        /// after another therefore has a larger maximum: the later maximum is at least the shared
        /// master's token, whose clock floor is above every token the earlier majority minted.
        ///
        /// The limit: tokens of *different* masters are ordered only through their clocks. If the
        /// masters' clocks disagree by more than the time between two acquisitions, the earlier
        /// majority may include a master whose clock runs ahead, and its token can exceed every
        /// token of the later majority: the maximum then does **not** increase, and a resource that
        /// fences on it would wrongly reject the newer holder (or, with a stale holder still
        /// writing, accept the stale one after the newer). A master restarted without persistence
        /// also forgets its holds, which breaks Redlock's mutual exclusion itself.
        ///
        /// When strict fencing matters, either fence per master with [`RedlockGuard::tokens`] (the
        /// resource keeps the largest token seen from each master and rejects a request any of whose
        /// tokens is below that master's largest: the intersecting master guarantees a stale holder
        /// has one), or use a single primary with replicas and `WAIT` after each grant, whose tokens
        /// are strictly increasing without any clock assumption.
        pub fn token(&self) -> u64 {
            self.grant.token
        }

        /// Each master's token, in the order of the URLs; `None` for masters that did not grant the
        /// lock. See [`RedlockGuard::token`] for per-master fencing.
        pub fn tokens(&self) -> &[Option<u64>] {
            &self.grant.tokens
        }

        /// How many masters granted the lock.
        pub fn granted(&self) -> usize {
            self.grant.granted()
        }

        /// The lock's key.
        pub fn key(&self) -> &str {
            &self.grant.key
        }

        /// The random owner id the lock is held as on every master.
        pub fn owner(&self) -> &str {
            &self.grant.owner
        }

        /// The validity time left: how much longer the lock can be relied on (zero once past). It
        /// started as `ttl - elapsed - drift`, counted from the start of the acquisition.
        pub fn validity(&self) -> Duration {
            self.grant.validity()
        }

        /// The validity time left right after the acquisition.
        pub fn validity_at_grant(&self) -> Duration {
            self.grant.validity_at_grant
        }
    };
}
#[cfg(feature = "tokio")]
pub(crate) use redlock_guard_accessors;

impl RedlockGuard {
    redlock_guard_accessors!();

    /// Release the lock on every master that granted it (or may have); returns how many
    /// released a live hold. Masters that cannot be reached keep it until the TTL passes.
    pub fn release(mut self) -> usize {
        self.released = true;
        let grant = &self.grant;
        release_on(&self.masters, &grant.maybe_held, &grant.key, &grant.owner)
    }
}

impl Drop for RedlockGuard {
    /// Release everywhere unless [`RedlockGuard::release`] already did. Errors are ignored: an
    /// unreachable master keeps the lock until the TTL passes.
    fn drop(&mut self) {
        if !self.released {
            let grant = &self.grant;
            release_on(&self.masters, &grant.maybe_held, &grant.key, &grant.owner);
        }
    }
}

impl fmt::Debug for RedlockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.grant.fmt("RedlockGuard", f)
    }
}

impl Grant {
    /// How many masters granted the lock.
    pub(crate) fn granted(&self) -> usize {
        self.tokens.iter().flatten().count()
    }

    /// The validity time left (zero once past).
    pub(crate) fn validity(&self) -> Duration {
        self.valid_until.saturating_duration_since(Instant::now())
    }

    /// `Debug` for a guard named `name`.
    pub(crate) fn fmt(&self, name: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(name)
            .field("key", &self.key)
            .field("owner", &self.owner)
            .field("token", &self.token)
            .field("tokens", &self.tokens)
            .field("validity", &self.validity())
            .finish()
    }
}
