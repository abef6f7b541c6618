//! The other kinds of hold, named as in the Python package: [`Semaphore`] and [`ReadWriteLock`]
//! (`LOCK.ACQUIRE ... SHARED [LIMIT n]`) and [`MultiLock`] (`LOCK.MACQUIRE`). Each is a handle
//! on a client that acquires [`Guard`]s, like [`Client::acquire`]; the guards release on drop,
//! extend, check their tokens and run the watchdog as for an exclusive lock.
//!
//! One type serves both APIs: `Semaphore::new(&client, ...)` with a [`Client`] acquires with
//! blocking calls, with an [`aio::Client`](crate::aio::Client) with `async` ones (see
//! `aio/locks.rs`); the request and the reply's meaning are the same code
//! ([`crate::hold::Acquisition`]).

use std::time::Duration;

use crate::client::Client;
use crate::command::Mode;
use crate::error::Error;
use crate::guard::Guard;
use crate::hold::Target;
use crate::session::Session;

/// A counting semaphore on one key: at most `limit` holders at once (`LOCK.ACQUIRE key owner
/// ttl SHARED LIMIT limit`), each with a guard and a token of its own.
///
/// Everyone using the key must give the same `limit` while it is held: another one gets the
/// server's `ERR this lock is held SHARED with LIMIT n; ...` as [`Error::Server`]. Waiters
/// (`acquire_blocking`) are served in FIFO order together with exclusive ones on the same key.
#[derive(Clone, Debug)]
pub struct Semaphore<C = Client> {
    /// The server.
    pub(crate) client: C,
    /// The key, `SHARED` with `LIMIT`.
    pub(crate) target: Target,
}

/// A read/write lock on one key: [`ReadWriteLock::read`] is a shared hold (`SHARED`, any
/// number of readers together), [`ReadWriteLock::write`] an exclusive one. A writer queued
/// behind readers is not overtaken by readers that come after it.
///
/// There is no upgrade or downgrade: an owner holding one mode is refused the other (an
/// [`Error::Server`]). With [`Client::with_owner`]`("x")` the reader acquires as `x:read` and
/// the writer as `x:write`, as in the Python package; otherwise each guard has a random owner.
#[derive(Clone, Debug)]
pub struct ReadWriteLock<C = Client> {
    /// The server.
    pub(crate) client: C,
    /// The key.
    pub(crate) key: String,
}

/// Exclusive locks on several keys, all or none, in one step (`LOCK.MACQUIRE numkeys key ...
/// owner ttl [BLOCK ms]`). A blocking acquire waits in every key's queue at once, so sets that
/// overlap cannot deadlock.
///
/// The guard's [`Guard::tokens`] has one token per key, in the order given; [`Guard::token`]
/// is the largest. Releasing is one `LOCK.MRELEASE` (true only if every key was still held);
/// extending, [`Guard::is_held`] and the watchdog's renewals run one script over the keys
/// (`LOCK.EXTEND` / `LOCK.FENCE` on each: there is no multi-key extend command). In a cluster
/// the keys need one hash tag.
#[derive(Clone, Debug)]
pub struct MultiLock<C = Client> {
    /// The server.
    pub(crate) client: C,
    /// The keys.
    pub(crate) target: Target,
}

impl<C: Clone> Semaphore<C> {
    /// A semaphore of `limit` permits (at least 1) on `key`, on the server of `client` (a
    /// [`Client`] or an [`aio::Client`](crate::aio::Client)). Nothing is sent yet.
    pub fn new(client: &C, key: &str, limit: u32) -> Semaphore<C> {
        let mode = Mode::Shared { limit: Some(limit) };
        Semaphore {
            client: client.clone(),
            target: Target::One {
                key: key.to_string(),
                mode,
            },
        }
    }
}

impl<C: Clone> ReadWriteLock<C> {
    /// A read/write lock on `key`, on the server of `client`. Nothing is sent yet.
    pub fn new(client: &C, key: &str) -> ReadWriteLock<C> {
        ReadWriteLock {
            client: client.clone(),
            key: key.to_string(),
        }
    }

    /// The target of a reader (`read`) or a writer, and its owner if the client chose one
    /// (`owner`): `owner:read` or `owner:write`, so that a reader and a writer of one client
    /// never share an owner (the second would be refused as an upgrade).
    pub(crate) fn side(&self, read: bool, owner: &Option<String>) -> (Target, Option<String>) {
        let (mode, side) = match read {
            true => (Mode::Shared { limit: None }, "read"),
            false => (Mode::Exclusive, "write"),
        };
        let key = self.key.clone();
        let owner = owner.as_ref().map(|owner| format!("{owner}:{side}"));
        (Target::One { key, mode }, owner)
    }
}

impl<C: Clone> MultiLock<C> {
    /// Exclusive locks on `keys` (at least one, each at most once, at most the server's
    /// `lock.max-multi-keys`, 64 by default), on the server of `client`. Nothing is sent yet.
    pub fn new<S: AsRef<str>>(client: &C, keys: &[S]) -> MultiLock<C> {
        let keys = keys.iter().map(|k| k.as_ref().to_string()).collect();
        MultiLock {
            client: client.clone(),
            target: Target::Many { keys },
        }
    }
}

/// `acquire`, `acquire_blocking` and `acquire_with_watchdog` of a handle with fields `client`
/// and `target` (a [`Semaphore`] or a [`MultiLock`]), on the sync client; `$what` is what its
/// guard holds.
macro_rules! sync_acquires {
    ($what:literal) => {
        #[doc = concat!("Try once to take ", $what, " for `ttl`: `Ok(Some(guard))` granted, ")]
        #[doc = "`Ok(None)` held by others (or waiters queued; nothing was taken), `Err` a"]
        #[doc = "failure (see [`Client::acquire`])."]
        pub fn acquire(&self, ttl: Duration) -> Result<Option<Guard>, Error> {
            let client = &self.client;
            client.acquire_target(self.target.clone(), &client.owner, ttl, None)
        }

        #[doc = concat!("Take ", $what, " for `ttl`, waiting up to `wait` in the FIFO queue")]
        #[doc = "(see [`Client::acquire_blocking`])."]
        pub fn acquire_blocking(
            &self,
            ttl: Duration,
            wait: Duration,
        ) -> Result<Option<Guard>, Error> {
            let client = &self.client;
            client.acquire_target(self.target.clone(), &client.owner, ttl, Some(wait))
        }

        /// `acquire`, then [`Guard::start_watchdog`] on the granted guard.
        pub fn acquire_with_watchdog(&self, ttl: Duration) -> Result<Option<Guard>, Error> {
            let granted = self.acquire(ttl)?;
            granted
                .map(|mut guard| guard.start_watchdog().map(|()| guard))
                .transpose()
        }
    };
}

/// `session(&session)` of a lock type with a field `client`, for the session type `$session`.
macro_rules! in_session {
    ($session:ty) => {
        /// The same lock, every acquisition made in `session` (`SESSION id`; see
        /// [`Client::with_session`]): no watchdog needed, and a `ttl` of zero means no deadline
        /// of the hold's own (it ends with the session).
        pub fn session(self, session: &$session) -> Self {
            Self {
                client: self.client.with_session(session),
                ..self
            }
        }
    };
}
pub(crate) use in_session;

impl Semaphore<Client> {
    sync_acquires!("a permit");
    in_session!(Session);
}

impl MultiLock<Client> {
    sync_acquires!("every key (one `LOCK.MACQUIRE`)");
    in_session!(Session);
}

impl ReadWriteLock<Client> {
    in_session!(Session);

    /// Try once to read-lock for `ttl` (`SHARED`): `Ok(None)` if a writer holds it or waits.
    pub fn read(&self, ttl: Duration) -> Result<Option<Guard>, Error> {
        self.acquire(true, ttl, None)
    }

    /// Read-lock for `ttl`, waiting up to `wait` in the key's FIFO queue.
    pub fn read_blocking(&self, ttl: Duration, wait: Duration) -> Result<Option<Guard>, Error> {
        self.acquire(true, ttl, Some(wait))
    }

    /// Try once to write-lock for `ttl` (exclusive): `Ok(None)` if anyone holds it or waits.
    pub fn write(&self, ttl: Duration) -> Result<Option<Guard>, Error> {
        self.acquire(false, ttl, None)
    }

    /// Write-lock for `ttl`, waiting up to `wait` in the key's FIFO queue.
    pub fn write_blocking(&self, ttl: Duration, wait: Duration) -> Result<Option<Guard>, Error> {
        self.acquire(false, ttl, Some(wait))
    }

    fn acquire(
        &self,
        read: bool,
        ttl: Duration,
        wait: Option<Duration>,
    ) -> Result<Option<Guard>, Error> {
        let (target, owner) = self.side(read, &self.client.owner);
        self.client.acquire_target(target, &owner, ttl, wait)
    }
}
