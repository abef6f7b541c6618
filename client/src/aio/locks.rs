//! The async side of [`crate::Semaphore`], [`crate::ReadWriteLock`] and [`crate::MultiLock`]:
//! the same types on an [`aio::Client`](Client), with `async` acquires (cancel-safe, as
//! [`Client::acquire`]). `aio::Semaphore` and the others name them.

use std::time::Duration;

use super::client::{with_watchdog, Client};
use super::guard::Guard;
use crate::error::Error;
use crate::locks::{side_owner, MultiLock, ReadWriteLock, Semaphore};

impl Semaphore<Client> {
    /// Try once to take a permit for `ttl` (see [`crate::Semaphore::acquire`]).
    pub async fn acquire(&self, ttl: Duration) -> Result<Option<Guard>, Error> {
        let client = &self.client;
        let target = self.target.clone();
        client
            .acquire_target(target, &client.owner, ttl, None)
            .await
    }

    /// Take a permit for `ttl`, waiting up to `wait` in the key's FIFO queue with one
    /// `LOCK.ACQUIRE ... BLOCK` (see [`Client::acquire_blocking`]).
    pub async fn acquire_blocking(
        &self,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Guard>, Error> {
        let client = &self.client;
        let target = self.target.clone();
        client
            .acquire_target(target, &client.owner, ttl, Some(wait))
            .await
    }

    /// [`Semaphore::acquire`], then [`Guard::start_watchdog`] on the granted guard.
    pub async fn acquire_with_watchdog(&self, ttl: Duration) -> Result<Option<Guard>, Error> {
        with_watchdog(self.acquire(ttl).await?)
    }
}

impl ReadWriteLock<Client> {
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
        let (target, side) = self.side(read);
        let owner = side_owner(&self.client.owner, side);
        self.client.acquire_target(target, &owner, ttl, wait).await
    }
}

impl MultiLock<Client> {
    /// Try once to take every key for `ttl` (see [`crate::MultiLock::acquire`]).
    pub async fn acquire(&self, ttl: Duration) -> Result<Option<Guard>, Error> {
        let client = &self.client;
        let target = self.target.clone();
        client
            .acquire_target(target, &client.owner, ttl, None)
            .await
    }

    /// Take every key for `ttl`, waiting up to `wait` in all their queues at once with one
    /// `LOCK.MACQUIRE ... BLOCK`.
    pub async fn acquire_blocking(
        &self,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Guard>, Error> {
        let client = &self.client;
        let target = self.target.clone();
        client
            .acquire_target(target, &client.owner, ttl, Some(wait))
            .await
    }

    /// [`MultiLock::acquire`], then [`Guard::start_watchdog`] on the granted guard.
    pub async fn acquire_with_watchdog(&self, ttl: Duration) -> Result<Option<Guard>, Error> {
        with_watchdog(self.acquire(ttl).await?)
    }
}
