//! [`Election`]: leader election on one lock key. A candidate campaigns by waiting in the key's
//! FIFO queue (`LOCK.ACQUIRE name value ttl BLOCK ...`, the owner being the value it publishes);
//! the leader is the lock's holder, its term the hold's fencing token; an observer follows the
//! key's change feed. One type for both APIs: `Election::new(&client, ...)` with a [`Client`]
//! campaigns with blocking calls, with an [`aio::Client`](crate::aio::Client) with `async`
//! ones (`aio/election.rs`).

use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;
use std::time::Duration;

use crate::client::Client;
use crate::error::Error;
use crate::feed::{self, Change, Leader, Picture};
use crate::guard::Guard;
use crate::session::Session;
use crate::subscriber::{Subscriber, Watching};
use crate::watchdog::LossReason;

/// How long one wait of [`Election::campaign`] in the queue lasts: a candidate that waits
/// longer queues again at the end (a read timeout must bound each wait, so that a server that
/// stops answering is noticed).
pub(crate) const CAMPAIGN_WAIT: Duration = Duration::from_secs(30);

/// A leader election on the lock key `name`, on one server.
///
/// - [`Election::campaign`]`(value)` waits in the key's FIFO queue until this candidate leads,
///   and returns its [`Leadership`]: its term is the hold's fencing token, larger than every
///   earlier term, so that the resources the leader writes to can refuse an earlier leader
///   ([`Leadership::fenced`]). The value is the lock's owner, what the leader publishes about
///   itself (an address, an id): **every candidate needs a value of its own** (two candidates
///   with one value would be one hold).
/// - [`Election::leader`]: who leads now (`LOCK.INFO`).
/// - [`Election::observe`]: every change of leader, "no leader" included, from the key's
///   change feed.
///
/// Without a session the leadership is a lock of `ttl` renewed by a watchdog: a leader that
/// crashes is succeeded once its TTL has passed. In a bound session
/// ([`SessionBuilder::bound`](crate::SessionBuilder::bound), [`Election::session`]) the
/// server ends the leadership the moment the leader's connection closes, and the next candidate
/// leads within milliseconds; `ttl` may then be zero (the leadership lasts as long as the
/// session).
#[derive(Clone, Debug)]
pub struct Election<C = Client> {
    /// The server (and the session campaigns are made in, if any).
    pub(crate) client: C,
    /// The lock key.
    pub(crate) name: String,
    /// The leadership's TTL (zero in a session: none of its own).
    pub(crate) ttl: Duration,
}

impl<C: Clone> Election<C> {
    /// An election on the key `name` of `client`'s server, whose leaders hold it for `ttl`
    /// (renewed by a watchdog; in a session, zero for no deadline of its own). Nothing is sent
    /// yet.
    pub fn new(client: &C, name: &str, ttl: Duration) -> Election<C> {
        Election {
            client: client.clone(),
            name: name.to_string(),
            ttl,
        }
    }

    /// The election's lock key.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Election<Client> {
    crate::locks::in_session!(Session);

    /// Campaign as `value` until this candidate leads: wait in the queue (behind the leader and
    /// earlier candidates), then hold the key, renewed by a watchdog (unless a session with
    /// `ttl` zero keeps it), watching its change feed for a loss. Waits of more than 30 s
    /// queue again at the end.
    pub fn campaign(&self, value: &str) -> Result<Leadership, Error> {
        loop {
            if let Some(leadership) = self.campaign_for(value, CAMPAIGN_WAIT)? {
                return Ok(leadership);
            }
        }
    }

    /// [`Election::campaign`], waiting at most `wait`: `Ok(None)` if this candidate did not
    /// lead by then (it leaves the queue).
    pub fn campaign_for(&self, value: &str, wait: Duration) -> Result<Option<Leadership>, Error> {
        let client = self.client.clone().with_owner(value);
        let Some(mut guard) = client.acquire_blocking(&self.name, self.ttl, wait)? else {
            return Ok(None);
        };
        if !self.ttl.is_zero() {
            guard.start_watchdog()?;
        }
        guard.watch()?;
        Ok(Some(Leadership {
            guard,
            value: value.to_string(),
        }))
    }

    /// Who leads now (`LOCK.INFO`), or `None`.
    pub fn leader(&self) -> Result<Option<Leader>, Error> {
        let inner = &self.client.inner;
        let state = inner.with_conn(
            inner.io_timeout,
            inner.connect_timeout,
            &feed::info(&self.name),
        )?;
        Ok(leader_of(&state))
    }

    /// Follow the leadership: an iterator of its changes, the first being who leads now. See
    /// [`Observer`].
    pub fn observe(&self) -> Result<Observer, Error> {
        let (tx, rx) = mpsc::channel();
        let picture = Picture::new(move |change| {
            let _ = tx.send(change);
        });
        let inner = &self.client.inner;
        let subscriber = Subscriber::of(inner, &inner.feed);
        let watching = subscriber.watch(std::slice::from_ref(&self.name), Arc::new(picture))?;
        Ok(Observer {
            changes: rx,
            _watching: watching,
        })
    }
}

/// The leader in a key's state.
pub(crate) fn leader_of(state: &feed::KeyState) -> Option<Leader> {
    state.exclusive_holder().map(|h| Leader {
        value: h.owner.clone(),
        term: h.token,
    })
}

/// This candidate leads: it holds the election's key. Dropping it resigns.
///
/// Its loss signal ([`Leadership::lost`], [`Leadership::wait_lost`]) fires as soon as the
/// leadership ends without [`Leadership::resign`]: the server reports it (expired, session
/// ended, key deleted, taken by the next candidate), the client's own deadline passes with no
/// renewal, or the feed's connection is lost. A leader that is told must stop acting as one;
/// one that is not (a paused process) is still refused by [`Leadership::fenced`].
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

    /// The term: the hold's fencing token, larger than every earlier leader's.
    pub fn term(&self) -> u64 {
        self.guard.token()
    }

    /// The lock behind it.
    pub fn guard(&self) -> &Guard {
        &self.guard
    }

    /// The loss channel (see [`Guard::lost`]).
    pub fn lost(&self) -> &Receiver<LossReason> {
        self.guard.lost()
    }

    /// True once the leadership was lost.
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// Wait up to `timeout` for the loss (see [`Guard::wait_lost`]).
    pub fn wait_lost(&self, timeout: Duration) -> Option<LossReason> {
        self.guard.wait_lost(timeout)
    }

    /// Run `write` only while this term is the live one (see [`Guard::fenced`]): a leader
    /// that lost its term gets [`Error::StaleToken`] and nothing is written.
    pub fn fenced<T: redis::FromRedisValue + 'static>(
        &self,
        write: &redis::Cmd,
    ) -> Result<T, Error> {
        self.guard.fenced(write)
    }

    /// Step down (`LOCK.RELEASE`): the next candidate leads at once. `Ok(false)`: the
    /// leadership had already been lost.
    pub fn resign(self) -> Result<bool, Error> {
        self.guard.release()
    }
}

/// The changes of an election's leadership ([`Election::observe`]), as an iterator that blocks
/// for the next one: first who leads now (or `None`), then each change, "no leader" included,
/// in order.
///
/// A handoff from one leader to the next is one change (the server grants the next candidate
/// in the step that ends the term), never a false "no leader" in between. Pub/sub delivers at
/// most once: after a gap in the feed's sequence numbers or a reconnect, the observer reads
/// the key again and reports the leader it finds if it changed, with [`Change::resync`] set:
/// a term that began and ended while it could not see is not in the feed it got.
pub struct Observer {
    /// The changes, as the subscriber's thread reports them.
    changes: Receiver<Change>,
    /// The watch of the key, ended on drop.
    _watching: Watching,
}

impl Observer {
    /// The next change, waiting up to `timeout`; `None` if none came.
    pub fn next_timeout(&self, timeout: Duration) -> Option<Change> {
        self.changes.recv_timeout(timeout).ok()
    }

    /// The next change if one is there already.
    pub fn try_next(&self) -> Option<Change> {
        self.changes.try_recv().ok()
    }
}

impl Iterator for Observer {
    type Item = Change;

    /// Wait for the next change.
    fn next(&mut self) -> Option<Change> {
        self.changes.recv().ok()
    }
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer").finish_non_exhaustive()
    }
}
