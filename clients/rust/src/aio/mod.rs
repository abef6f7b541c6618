//! The async API on tokio (cargo feature `tokio`): [`Client`], [`Guard`], [`Semaphore`],
//! [`ReadWriteLock`], [`MultiLock`], [`Redlock`], [`RedlockGuard`], [`Session`], [`Election`]
//! (with [`Leadership`] and the [`Observer`] stream) and [`fenced_call`] with the
//! semantics of their sync namesakes at the crate root. The commands, the reply checks, what an
//! acquisition's reply means, the error types, the watchdog's schedule and the Redlock decision
//! are the same code; what differs is how they send and wait.
//!
//! - Every call runs inside a tokio runtime (with time enabled); the watchdog is a task on the
//!   runtime the lock was acquired on, and stops with its guard.
//! - A blocking acquire waits in the server's queue with one `LOCK.ACQUIRE ... BLOCK` on a
//!   connection of its own, whose response timeout is the wait plus the I/O timeout.
//! - Acquisitions are cancel-safe: dropping the future (a timeout, a `select!`) leaves no grant
//!   behind; one that arrives anyway is released.
//! - Guards release on drop without waiting (Rust has no async `Drop`); `release().await`
//!   reports the outcome. See [`Guard`].
//!
//! ```no_run
//! use std::time::Duration;
//! use redis_lock_client::aio::Client;
//!
//! # async fn run() -> Result<(), redis_lock_client::Error> {
//! let client = Client::open("redis://127.0.0.1:6379/")?;
//! if let Some(mut guard) = client
//!     .acquire_blocking("job:nightly", Duration::from_secs(3), Duration::from_secs(30))
//!     .await?
//! {
//!     guard.start_watchdog()?; // LOCK.EXTEND every second
//!     tokio::select! {
//!         reason = guard.lost() => eprintln!("stop: {reason}"),
//!         _ = tokio::time::sleep(Duration::from_secs(10)) => {} // the work, fenced with guard.token()
//!     }
//!     guard.release().await?;
//! }
//! # Ok(())
//! # }
//! ```

mod client;
mod default_session;
mod election;
mod guard;
mod locks;
mod redlock;
mod session;
mod watchdog;

pub use client::Client;
pub use election::{Leadership, Observer};
pub use guard::{fenced_call, Guard};
pub use redlock::{Redlock, RedlockGuard};
pub use session::Session;

/// [`crate::Semaphore`] on an async [`Client`]: `Semaphore::new(&client, key, limit)`.
pub type Semaphore = crate::Semaphore<Client>;
/// [`crate::ReadWriteLock`] on an async [`Client`]: `ReadWriteLock::new(&client, key)`.
pub type ReadWriteLock = crate::ReadWriteLock<Client>;
/// [`crate::MultiLock`] on an async [`Client`]: `MultiLock::new(&client, &keys)`.
pub type MultiLock = crate::MultiLock<Client>;
/// [`crate::Election`] on an async [`Client`]: `Election::new(&client, name, ttl)`.
pub type Election = crate::Election<Client>;
/// [`crate::SessionBuilder`] on an async [`Client`]: `Session::builder(&client, ttl)`.
pub type SessionBuilder = crate::SessionBuilder<Client>;
