//! The async side of [`crate::Election`]: the same type on an [`aio::Client`](Client), with
//! `async` campaigns, an async [`Leadership`] and an [`Observer`] that is a `Stream`.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::client::{runtime_gone, Client};
use super::guard::Guard;
use super::session::Session;
use crate::election::{leader_of, Election, CAMPAIGN_WAIT};
use crate::error::Error;
use crate::feed::{self, Change, Leader, Picture};
use crate::subscriber::{Subscriber, Watching};
use crate::watchdog::LossReason;

impl Election<Client> {
    crate::locks::in_session!(Session);

    /// Campaign as `value` until this candidate leads (see [`crate::Election::campaign`]).
    pub async fn campaign(&self, value: &str) -> Result<Leadership, Error> {
        loop {
            if let Some(leadership) = self.campaign_for(value, CAMPAIGN_WAIT).await? {
                return Ok(leadership);
            }
        }
    }

    /// [`Election::campaign`], waiting at most `wait`: `Ok(None)` if this candidate did not
    /// lead by then. Cancel-safe as [`Client::acquire_blocking`].
    pub async fn campaign_for(
        &self,
        value: &str,
        wait: Duration,
    ) -> Result<Option<Leadership>, Error> {
        let client = self.client.clone().with_owner(value);
        let Some(mut guard) = client.acquire_blocking(&self.name, self.ttl, wait).await? else {
            return Ok(None);
        };
        if !self.ttl.is_zero() {
            guard.start_watchdog()?;
        }
        guard.watch().await?;
        Ok(Some(Leadership {
            guard,
            value: value.to_string(),
        }))
    }

    /// Who leads now (`LOCK.INFO`), or `None`.
    pub async fn leader(&self) -> Result<Option<Leader>, Error> {
        let inner = &self.client.inner;
        let state = inner
            .run(
                inner.io_timeout,
                inner.connect_timeout,
                &feed::info(&self.name),
            )
            .await
            .map_err(|failure| failure.error)?;
        Ok(leader_of(&state))
    }

    /// Follow the leadership: a `Stream` of its changes (see [`crate::Observer`]).
    pub async fn observe(&self) -> Result<Observer, Error> {
        let (tx, rx) = mpsc::unbounded_channel();
        let picture = Picture::new(move |change| {
            let _ = tx.send(change);
        });
        let inner = Arc::clone(&self.client.inner);
        let name = self.name.clone();
        let watching = tokio::task::spawn_blocking(move || {
            Subscriber::of(&inner, &inner.feed).watch(&[name], Arc::new(picture))
        })
        .await
        .map_err(|_| runtime_gone())??;
        Ok(Observer {
            changes: rx,
            watching: Some(watching),
        })
    }
}

/// This candidate leads; the async counterpart of [`crate::Leadership`]. Dropping it resigns
/// (without waiting, as a guard's drop releases).
#[derive(Debug)]
pub struct Leadership {
    /// The hold.
    guard: Guard,
    /// What this leader published.
    value: String,
}

impl Leadership {
    /// What this leader published (the lock's owner).
    pub fn value(&self) -> &str {
        &self.value
    }

    /// The term: the hold's fencing token.
    pub fn term(&self) -> u64 {
        self.guard.token()
    }

    /// The lock behind it.
    pub fn guard(&self) -> &Guard {
        &self.guard
    }

    /// Wait until the leadership is lost (see [`Guard::lost`]).
    pub async fn lost(&self) -> LossReason {
        self.guard.lost().await
    }

    /// A receiver of the loss (see [`Guard::loss_watch`]).
    pub fn loss_watch(&self) -> watch::Receiver<Option<LossReason>> {
        self.guard.loss_watch()
    }

    /// True once the leadership was lost.
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// Run `write` only while this term is the live one (see [`crate::Leadership::fenced`]).
    pub async fn fenced<T: redis::FromRedisValue + 'static>(
        &self,
        write: &redis::Cmd,
    ) -> Result<T, Error> {
        self.guard.fenced(write).await
    }

    /// Step down (`LOCK.RELEASE`); `Ok(false)`: it had already been lost.
    pub async fn resign(self) -> Result<bool, Error> {
        self.guard.release().await
    }
}

/// The changes of an election's leadership, as a `Stream` (and [`Observer::next`]); the async
/// counterpart of [`crate::Observer`], with the same order and resynchronisations.
pub struct Observer {
    /// The changes, as the subscriber's thread reports them.
    changes: mpsc::UnboundedReceiver<Change>,
    /// The watch of the key, ended on drop (off the runtime's threads).
    watching: Option<Watching>,
}

impl Observer {
    /// Wait for the next change.
    pub async fn next(&mut self) -> Option<Change> {
        self.changes.recv().await
    }

    /// The next change if one is there already.
    pub fn try_next(&mut self) -> Option<Change> {
        self.changes.try_recv().ok()
    }
}

impl futures_core::Stream for Observer {
    type Item = Change;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Change>> {
        self.changes.poll_recv(cx)
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        if let Some(watching) = self.watching.take() {
            let unwatch = watching.detach();
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn_blocking(move || unwatch.run())),
                Err(_) => unwatch.run(),
            }
        }
    }
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer").finish_non_exhaustive()
    }
}
