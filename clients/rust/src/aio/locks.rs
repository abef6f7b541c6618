//! The async side of [`crate::Semaphore`], [`crate::ReadWriteLock`] and [`crate::MultiLock`]:
//! the same types on an [`aio::Client`](Client), with `async` acquires (cancel-safe, as
//! [`Client::acquire`]). `aio::Semaphore` and the others name them.

use std::time::Duration;

use super::client::Client;
use super::guard::Guard;
use super::session::Session;
use crate::error::Error;
use crate::locks::{MultiLock, ReadWriteLock, Semaphore};

/// The async `acquire`, `acquire_blocking` and `acquire_with_watchdog` of a handle with fields
/// `client` and `target` (see `sync_acquires` in `locks.rs`).
macro_rules! async_acquires {
    ($what:literal) => {
        #[doc = concat!("Try once to take ", $what, " for `ttl` (see [`Client::acquire`]).")]
        pub async fn acquire(&self, ttl: Duration) -> Result<Option<Guard>, Error> {
            let (client, target) = (&self.client, self.target.clone());
            client
                .acquire_target(target, &client.owner, ttl, None)
                .await
        }

        #[doc = concat!("Take ", $what, " for `ttl`, waiting up to `wait` in the FIFO queue")]
        #[doc = "with one blocking command (see [`Client::acquire_blocking`])."]
        pub async fn acquire_blocking(
            &self,
            ttl: Duration,
            wait: Duration,
        ) -> Result<Option<Guard>, Error> {
            let (client, target) = (&self.client, self.target.clone());
            client
                .acquire_target(target, &client.owner, ttl, Some(wait))
                .await
        }

        /// `acquire`, then [`Guard::start_watchdog`] on the granted guard.
        pub async fn acquire_with_watchdog(&self, ttl: Duration) -> Result<Option<Guard>, Error> {
            let granted = self.acquire(ttl).await?;
            granted
                .map(|mut guard| guard.start_watchdog().map(|()| guard))
                .transpose()
        }
    };
}

impl Semaphore<Client> {
    async_acquires!("a permit");
    crate::locks::in_session!(Session);
}

impl MultiLock<Client> {
    async_acquires!("every key (one `LOCK.MACQUIRE`)");
    crate::locks::in_session!(Session);
}

impl ReadWriteLock<Client> {
    crate::locks::in_session!(Session);

    /// Try once to read-lock for `ttl` (see [`crate::ReadWriteLock::read`]).
    pub async fn read(&self, ttl: Duration) -> Result<Option<Guard>, Error> {
        self.acquire(true, ttl, None).await
    }

    /// Read-lock for `ttl`, waiting up to `wait` in the key's FIFO queue.
    pub async fn read_blocking(
        &self,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Guard>, Error> {
        self.acquire(true, ttl, Some(wait)).await
    }

    /// Try once to write-lock for `ttl` (exclusive).
    pub async fn write(&self, ttl: Duration) -> Result<Option<Guard>, Error> {
        self.acquire(false, ttl, None).await
    }

    /// Write-lock for `ttl`, waiting up to `wait` in the key's FIFO queue.
    pub async fn write_blocking(
        &self,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Guard>, Error> {
        self.acquire(false, ttl, Some(wait)).await
    }

    async fn acquire(
        &self,
        read: bool,
        ttl: Duration,
        wait: Option<Duration>,
    ) -> Result<Option<Guard>, Error> {
        let (target, owner) = self.side(read, &self.client.owner);
        self.client.acquire_target(target, &owner, ttl, wait).await
    }
}
