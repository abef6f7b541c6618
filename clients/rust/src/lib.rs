//! A Rust client for the redis-lock Redis module: lock guards with fencing tokens and fenced
//! writes, a lease watchdog, semaphores, read/write locks, several keys at once, and Redlock
//! over several independent masters.
//!
//! The module does the lock logic inside the server (`LOCK.ACQUIRE [SHARED [LIMIT n]]`,
//! `LOCK.MACQUIRE`, `LOCK.RELEASE`, `LOCK.MRELEASE`, `LOCK.EXTEND`, `LOCK.FENCE`); this crate
//! wraps it in RAII types over the synchronous [`redis`] client. No async runtime: the watchdog
//! is a plain thread. With the cargo feature `tokio`, `aio` has the same API for tokio
//! (`aio::Client`, `aio::Guard`, `aio::Redlock`, `aio::Semaphore`, ...).
//!
//! A [`Session`] (`LOCK.SESSION`) is one lease for many holds: one keepalive for every lock taken
//! in it ([`Client::with_session`], or `.session(&session)` on the lock types), and, opened
//! [`bound`](SessionBuilder::bound), an end the moment this process's connection closes, so that
//! waiters do not sit out a TTL after a crash.
//!
//! A guard can watch its keys through the server's change feed ([`Guard::watch`],
//! [`Client::watch_losses`]): its loss signal then fires the moment the server ends the hold
//! (expired, deleted, flushed, its session ended, taken by another owner), at the client's own
//! deadline if no renewal succeeded, and when the feed's connection is lost. An [`Election`]
//! elects one leader among candidates on a lock key: [`Election::campaign`] waits in the FIFO
//! queue and returns the [`Leadership`] (its term is the fencing token), [`Election::observe`]
//! reports every change of leader, "no leader" included.
//!
//! ```no_run
//! use std::time::Duration;
//! use redis_lock_client::Client;
//!
//! # fn main() -> Result<(), redis_lock_client::Error> {
//! let client = Client::open("redis://127.0.0.1:6379/")?;
//!
//! // Non-blocking: Ok(None) means someone else holds it; Err means a failure.
//! match client.acquire("invoice:42", Duration::from_secs(10))? {
//!     Some(guard) => {
//!         println!("holding {} with token {}", guard.key(), guard.token());
//!         // ... write to the resource, passing guard.token() along for fencing ...
//!     } // dropped here: LOCK.RELEASE
//!     None => println!("busy"),
//! }
//!
//! // Wait up to 2 s in the server's FIFO queue, then keep the lock alive while working.
//! if let Some(guard) =
//!     client.acquire_blocking("job:nightly", Duration::from_secs(3), Duration::from_secs(2))?
//! {
//!     let mut guard = guard;
//!     guard.start_watchdog()?; // LOCK.EXTEND every ttl / 3
//!     for _step in 0..10 {
//!         if guard.is_lost() {
//!             eprintln!("lost the lock: {:?}", guard.loss_reason());
//!             break;
//!         }
//!         // ... one step of work ...
//!     }
//!     guard.release()?;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! A semaphore, a read/write lock and several keys at once: each acquires the same [`Guard`]
//! (release on drop, `extend`, `is_held`, the watchdog).
//!
//! ```no_run
//! use std::time::Duration;
//! use redis_lock_client::{Client, MultiLock, ReadWriteLock, Semaphore};
//!
//! # fn main() -> Result<(), redis_lock_client::Error> {
//! let client = Client::open("redis://127.0.0.1:6379/")?;
//! let ttl = Duration::from_secs(30);
//!
//! // At most 4 holders at once: LOCK.ACQUIRE payments-api <owner> 30000 SHARED LIMIT 4.
//! if let Some(permit) = Semaphore::new(&client, "payments-api", 4).acquire(ttl)? {
//!     println!("permit with token {}", permit.token());
//! }
//!
//! // Readers together, a writer alone (and never overtaken by later readers).
//! let report = ReadWriteLock::new(&client, "report");
//! let reader = report.read_blocking(ttl, Duration::from_secs(5))?;
//! drop(reader);
//! let writer = report.write(ttl)?;
//! drop(writer);
//!
//! // Every key or none, one token each: LOCK.MACQUIRE 2 {order:7}:a {order:7}:b <owner> 30000.
//! let keys = ["{order:7}:a", "{order:7}:b"];
//! if let Some(guard) = MultiLock::new(&client, &keys).acquire(ttl)? {
//!     println!("tokens {:?}", guard.tokens());
//! } // LOCK.MRELEASE
//! # Ok(())
//! # }
//! ```
//!
//! A fenced write: one command that runs only while the guard's token is the live hold, checked
//! and run in one atomic step on the server (an `EVAL` of [`FENCED_CALL_LUA`], the Python and
//! Node packages' script: `LOCK.FENCE key token`, then the command). A holder that paused past
//! its deadline and lost the lock cannot write late: [`Error::StaleToken`], and nothing was
//! written. [`Guard::fenced_by`] fences with one key's token of a [`MultiLock`] guard, and
//! [`fenced_call`] with a token held elsewhere.
//!
//! ```no_run
//! use std::time::Duration;
//! use redis_lock_client::{Client, Error};
//!
//! # fn main() -> Result<(), Error> {
//! let client = Client::open("redis://127.0.0.1:6379/")?;
//! let guard = client.acquire("{sku:42}:lock", Duration::from_secs(10))?.expect("free");
//! match guard.fenced::<i64>(redis::cmd("DECRBY").arg("{sku:42}:stock").arg(1)) {
//!     Ok(stock) => println!("{stock} left"),
//!     Err(Error::StaleToken { lock, token }) => eprintln!("{token} no longer holds {lock}"),
//!     Err(e) => return Err(e), // e.g. the command's own WRONGTYPE, as Error::Server
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Redlock over five independent masters:
//!
//! ```no_run
//! use std::time::Duration;
//! use redis_lock_client::{Redlock, RedlockError};
//!
//! let urls = [
//!     "redis://10.0.0.1:6379/", "redis://10.0.0.2:6379/", "redis://10.0.0.3:6379/",
//!     "redis://10.0.0.4:6379/", "redis://10.0.0.5:6379/",
//! ];
//! let redlock = Redlock::new(&urls).expect("valid URLs");
//! match redlock.acquire("report", Duration::from_secs(5)) {
//!     Ok(guard) => println!("token {} valid for {:?}", guard.token(), guard.validity()),
//!     Err(RedlockError::Contended { granted, needed }) => {
//!         println!("held by someone else ({granted}/{needed}); retry after a random delay")
//!     }
//!     Err(e) => eprintln!("failure: {e}"),
//! }
//! ```
//!
//! # The default session
//!
//! A lock of any kind made without a session ([`Client::with_session`], `.session(&session)`)
//! joins its client's *default session*: one bound session per [`Client`] (shared by its
//! clones) and per cluster node ([`Client::for_key`]), opened by the first acquire that needs
//! it with `LOCK.SESSION OPEN 10000 BOUND GRACE 500` ([`DEFAULT_SESSION_TTL`],
//! [`DEFAULT_GRACE`]), kept alive by one keepalive for all its holds. A process that dies frees
//! everything it held about 500 ms after its connection closes, not when each TTL runs out.
//! Each hold keeps its own TTL (`LOCK.ACQUIRE key owner ttl-ms SESSION id`), so the watchdog,
//! `extend` and durable grants work as before. A connection blip (`CLIENT KILL`, a proxy
//! closing it) is not a death: the session's thread re-attaches it within the grace and every
//! hold is kept. [`Client::close`], or dropping the last clone (guards hold one), closes it.
//! [`Client::without_session`] holds by TTL alone, as before. A lock delay is a session's
//! option: the default session has none (open a [`Session`] with
//! [`SessionBuilder::lock_delay`] for one).
//!
//! # Contention versus failure
//!
//! - [`Client::acquire`] (and the `acquire*`, `read*`, `write*` of the lock types):
//!   `Ok(Some(guard))` granted, `Ok(None)` held by someone else,
//!   `Err(`[`Error`]`)` a failure (unreachable, timeout, error reply).
//! - [`Redlock::acquire`]: [`RedlockError::Contended`] held by someone else,
//!   [`RedlockError::Unavailable`] too few masters answered, [`RedlockError::Expired`] the
//!   round took longer than the TTL allows.
//!
//! # Layout
//!
//! The sync and the async API share everything but the I/O. Written once, with no I/O:
//!
//! - `command.rs`: the lock commands (request and reply check), the fenced write (the script,
//!   [`FENCED_CALL_LUA`], and its refusal as [`Error::StaleToken`]) and the argument and outcome
//!   rules.
//! - `hold.rs`: what an acquisition asks for (`Target`: one key alone or shared, or several),
//!   `Acquisition` (its request, then `settle`: what the reply means and what a failure must
//!   clean up), and `Hold` (a granted lock's keys, owner, tokens, TTL, and its release, extend
//!   and fence commands, and its fenced writes: which key's token fences one).
//! - `watchdog.rs`: [`LossReason`], `Renewable` (a lock or a session), `Report` (who is told of
//!   a loss) and `Schedule` (when renewals are due, what they send, their timeouts), then the
//!   renewal thread.
//! - `session.rs`: what a session is to the client (`SessionState`: its id, TTL, and the guards to
//!   tell of its loss), [`SessionBuilder`] and [`SessionInfo`], then the sync [`Session`].
//! - `default_session.rs`: the sync client's default sessions (`Defaults`: one per client
//!   and node, opened when first needed, retired when the server says one ended, closed with
//!   the client); `aio/default_session.rs` the async one's.
//! - `bound.rs`: a bound session's dedicated connection and the thread that waits on it (both
//!   APIs).
//! - `feed.rs`: the change feed as the client reads it: `LOCK.WATCH`/`LOCK.UNWATCH`/`LOCK.INFO`,
//!   a message, a key's state, and what each means to a guard (`HoldWatch`: a loss of mine?)
//!   and to an election's observer (`Picture`: who leads now?), with no I/O.
//! - `subscriber.rs`: the feed's two connections per client (watch and pub/sub) and the thread
//!   that reads them, delivers messages in order, resynchronises after a gap or a reconnect and
//!   fires the guards' own deadlines (both APIs); `pubsub.rs`: the pub/sub connection as a plain
//!   socket with a small RESP reader.
//! - `election.rs`: [`Election`] for both APIs (generic over the client), and the sync
//!   [`Leadership`] and [`Observer`].
//! - `redlock.rs`: the Redlock round (`Round`, `Vote`, `decide`: quorum and validity math,
//!   where to release) and how tokens are combined, then the sync [`Redlock`].
//! - `locks.rs`: [`Semaphore`], [`ReadWriteLock`] and [`MultiLock`], one type each for both
//!   APIs (generic over the client), and their sync acquires.
//! - `error.rs`: [`Error`] and [`RedlockError`].
//!
//! What sends and waits:
//!
//! - `client.rs`: [`Client`] and its connection pool; `guard.rs`: [`Guard`] (release on drop,
//!   watchdog control, fenced writes) and [`fenced_call`].
//! - `aio/` (feature `tokio`): the async client (one multiplexed connection, waiter
//!   connections, cancel-safe acquires), guard, watchdog task, Redlock (masters asked
//!   concurrently), session and the async acquires of the lock types.

#![warn(missing_docs)]

#[cfg(feature = "tokio")]
pub mod aio;
mod bound;
mod client;
mod command;
mod default_session;
mod election;
mod error;
mod feed;
mod guard;
mod hold;
mod locks;
mod pubsub;
mod redlock;
mod session;
mod subscriber;
pub(crate) mod watchdog;

pub use client::{Client, DEFAULT_CONNECT_TIMEOUT, DEFAULT_IO_TIMEOUT};
pub use command::{FENCED_CALL_LUA, FENCE_CHECK_LUA};
pub use default_session::{DEFAULT_GRACE, DEFAULT_SESSION_TTL};
pub use election::{Election, Leadership, Observer};
pub use error::{Error, RedlockError};
pub use feed::{Change, Leader};
pub use guard::{fenced_call, Guard};
pub use locks::{MultiLock, ReadWriteLock, Semaphore};
pub use redlock::{
    Redlock, RedlockGuard, DEFAULT_MASTER_CONNECT_TIMEOUT, DEFAULT_MASTER_IO_TIMEOUT,
};
pub use session::{Session, SessionBuilder, SessionInfo};
pub use watchdog::LossReason;

/// The README's Rust blocks as doc tests: `cargo test --doc` compiles every one (they are
/// whole programs, `rust,no_run`), so a renamed call or a missing import in the README fails.
/// Not run here (doc tests get no server; each program connects to `REDIS_URL`, else
/// 127.0.0.1:6379): `tests/readme.rs` runs them against a test server (`build.rs`).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

#[cfg(test)]
mod tests {
    use super::*;

    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}

    /// Clients are shared between threads; guards move to the thread that uses them.
    #[test]
    fn thread_safety() {
        send_sync::<Client>();
        send_sync::<Semaphore>();
        send_sync::<ReadWriteLock>();
        send_sync::<MultiLock>();
        send_sync::<Redlock>();
        send_sync::<SessionBuilder>();
        send::<Session>();
        send_sync::<Error>();
        send_sync::<RedlockError>();
        send_sync::<LossReason>();
        send::<Guard>();
        send::<RedlockGuard>();
        send_sync::<Election>();
        send::<Leadership>();
        send::<Observer>();
        send_sync::<Change>();
    }

    /// The async types are shared between tasks the same way, and guards can be held across
    /// `.await` in a spawned task.
    #[cfg(feature = "tokio")]
    #[test]
    fn async_thread_safety() {
        send_sync::<aio::Client>();
        send_sync::<aio::Semaphore>();
        send_sync::<aio::ReadWriteLock>();
        send_sync::<aio::MultiLock>();
        send_sync::<aio::Redlock>();
        send_sync::<aio::Session>();
        send_sync::<aio::Guard>();
        send_sync::<aio::RedlockGuard>();
        send_sync::<aio::Election>();
        send_sync::<aio::Leadership>();
        send_sync::<aio::Observer>();
    }

    #[test]
    fn invalid_arguments_are_rejected_before_sending() {
        // Port 1 on loopback: nothing is sent anyway, since the check comes first.
        let client = Client::open("redis://127.0.0.1:1/").unwrap();
        assert!(matches!(
            client.acquire("k", std::time::Duration::ZERO),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            Redlock::new::<&str>(&[]),
            Err(Error::InvalidArgument(_))
        ));
        let redlock = Redlock::new(&["redis://127.0.0.1:1/"]).unwrap();
        assert_eq!(redlock.quorum(), 1);
        assert!(matches!(
            redlock.acquire("k", std::time::Duration::ZERO),
            Err(RedlockError::InvalidArgument(_))
        ));
    }
}
