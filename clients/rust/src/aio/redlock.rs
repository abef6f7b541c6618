//! The async [`Redlock`]: the sync algorithm ([`crate::Redlock`]) with the masters asked
//! concurrently, so a round takes as long as the slowest master rather than the sum of all.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use super::client::{runtime_gone, send_now, Client};
use crate::command;
use crate::error::{Error, RedlockError};
use crate::redlock::{open_masters, Grant, Round, Vote};

/// A lock manager over N independent masters; the async counterpart of [`crate::Redlock`],
/// with the same outcomes.
pub struct Redlock {
    /// One client per master, in the order of the URLs.
    masters: Vec<Client>,
}

impl Redlock {
    /// A lock manager over the masters at `urls` (at least one). Only parses the URLs.
    pub fn new<S: AsRef<str>>(urls: &[S]) -> Result<Redlock, Error> {
        let masters = open_masters(urls, Client::open, Client::with_timeouts)?;
        Ok(Redlock { masters })
    }

    crate::redlock::redlock_masters!();

    /// Try once to take `key` for `ttl` on a majority of the masters (see
    /// [`crate::Redlock::acquire`]). On failure nothing is held.
    ///
    /// Cancel-safe: the round runs in a task of its own and hands over a guard; if this future
    /// is dropped, that guard is dropped and releases the lock on every master.
    pub async fn acquire(&self, key: &str, ttl: Duration) -> Result<RedlockGuard, RedlockError> {
        let round = Round::start(key, ttl)?;
        let (masters, needed) = (self.masters.clone(), self.quorum());
        let (tx, rx) = oneshot::channel();
        tokio::spawn(async move {
            let votes = collect_votes(&masters, &round).await;
            let result = match round.decide(votes, needed) {
                Ok(grant) => Ok(RedlockGuard {
                    masters,
                    grant,
                    runtime: Handle::current(),
                    released: false,
                }),
                Err((maybe_held, error)) => {
                    release_on(&masters, &maybe_held, &round.key, &round.owner).await;
                    Err(error)
                }
            };
            let _ = tx.send(result);
        });
        let gone = |_| RedlockError::Unavailable {
            reachable: 0,
            needed: self.quorum(),
            errors: (0..self.masters.len())
                .map(|i| (i, runtime_gone()))
                .collect(),
        };
        rx.await.unwrap_or_else(|e| Err(gone(e)))
    }
}

/// Step 2, concurrently: `LOCK.ACQUIRE` on every master, each with its own timeouts.
async fn collect_votes(masters: &[Client], round: &Round) -> Vec<Vote> {
    let mut requests = JoinSet::new();
    for (index, master) in masters.iter().enumerate() {
        let inner = Arc::clone(&master.inner);
        let acquire = round.request();
        requests.spawn(async move {
            let reply = inner
                .run(inner.io_timeout, inner.connect_timeout, &acquire)
                .await;
            (index, Vote::of(reply))
        });
    }
    let mut votes: Vec<Option<Vote>> = masters.iter().map(|_| None).collect();
    while let Some(done) = requests.join_next().await {
        if let Ok((index, vote)) = done {
            votes[index] = Some(vote);
        }
    }
    // A request task never panics; one cancelled by a runtime shutdown may have been sent.
    let missing = || Vote::Failed(runtime_gone(), true);
    votes
        .into_iter()
        .map(|v| v.unwrap_or_else(missing))
        .collect()
}

/// `LOCK.RELEASE key owner` on each master flagged in `which`, concurrently; returns how many
/// released a hold.
async fn release_on(masters: &[Client], which: &[bool], key: &str, owner: &str) -> usize {
    let mut releases = JoinSet::new();
    for (master, _) in masters.iter().zip(which).filter(|(_, &flag)| flag) {
        let inner = Arc::clone(&master.inner);
        let release = command::release(key, owner);
        releases.spawn(async move {
            let reply = inner
                .run(inner.io_timeout, inner.connect_timeout, &release)
                .await;
            matches!(reply, Ok(true))
        });
    }
    let mut released = 0;
    while let Some(done) = releases.join_next().await {
        released += usize::from(matches!(done, Ok(true)));
    }
    released
}

/// A lock held on a majority of the masters; the async counterpart of [`crate::RedlockGuard`].
/// [`RedlockGuard::release`]`.await` releases it on every master; dropping it sends the same
/// releases without waiting for the replies (see [`super::Guard`] on async drop).
pub struct RedlockGuard {
    /// The masters, in the order of the URLs.
    masters: Vec<Client>,
    /// What was granted.
    grant: Grant,
    /// The runtime the releases on drop run on.
    runtime: Handle,
    /// Set once [`RedlockGuard::release`] ran.
    released: bool,
}

impl RedlockGuard {
    crate::redlock::redlock_guard_accessors!();

    /// Release the lock on every master that granted it (or may have), concurrently; returns
    /// how many released a live hold.
    pub async fn release(mut self) -> usize {
        self.released = true;
        let grant = &self.grant;
        release_on(&self.masters, &grant.maybe_held, &grant.key, &grant.owner).await
    }
}

impl Drop for RedlockGuard {
    /// Send `LOCK.RELEASE` to every master where the lock may be held, unless
    /// [`RedlockGuard::release`] already did; replies are not awaited, errors ignored.
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let grant = &self.grant;
        for (master, _) in self
            .masters
            .iter()
            .zip(&grant.maybe_held)
            .filter(|(_, &f)| f)
        {
            let inner = Arc::clone(&master.inner);
            let release = command::release(&grant.key, &grant.owner);
            send_now(&self.runtime, async move {
                let _ = inner
                    .run(inner.io_timeout, inner.connect_timeout, &release)
                    .await;
            });
        }
    }
}

impl fmt::Debug for Redlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::redlock::debug_masters(self.masters(), f)
    }
}

impl fmt::Debug for RedlockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.grant.fmt("RedlockGuard", f)
    }
}
