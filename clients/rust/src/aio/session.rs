//! The async [`Session`]: the sync [`crate::Session`] with its keepalive as a task (the async
//! watchdog renewing the session) and its loss published on a `watch` channel. A bound session's
//! connection is the same thread as in the sync API (`bound.rs`), opened on tokio's blocking pool.

use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::watch;

use super::client::{runtime_gone, send_now, Client};
use super::watchdog::{Lease, Loss, Watchdog};
use crate::bound::Bound;
use crate::command::{self, Command};
use crate::error::Error;
use crate::session::{report_close_failure, SessionBuilder, SessionInfo, SessionState};
use crate::watchdog::{LossReason, Renewable, Report};

/// A session on one server; the async counterpart of [`crate::Session`], with the same
/// options, outcomes and loss reports.
///
/// Close it with [`Session::close`]`.await`. Dropping it also closes it, without waiting (as a
/// guard's drop releases): the keepalive task is aborted and `LOCK.SESSION CLOSE` is sent by a
/// task, and only then is a bound session's connection closed. If the runtime has shut down, a
/// bound session's connection is closed at once (which ends it on the server, lock delay
/// included) and an unbound one ends at its deadline.
pub struct Session {
    /// The server, without a session.
    client: Client,
    /// The id, TTL and the loss, shared with the keepalive and the guards.
    state: Arc<SessionState>,
    /// The keepalive task.
    keepalive: Option<Watchdog>,
    /// The dedicated connection of a bound session, and the thread that waits on it.
    bound: Option<Bound>,
    /// Where the session's own loss is published (a listener of `state`).
    loss: Loss,
    /// The runtime the keepalive and the close on drop run on.
    runtime: Handle,
    /// Set once [`Session::close`] ran.
    closed: bool,
}

impl Session {
    /// The options of a session on `client`'s server with `ttl` (see
    /// [`crate::Session::builder`]).
    pub fn builder(client: &Client, ttl: Duration) -> SessionBuilder<Client> {
        SessionBuilder::new(client, ttl)
    }

    /// Open a session with `ttl` and no other option.
    pub async fn open(client: &Client, ttl: Duration) -> Result<Session, Error> {
        Session::builder(client, ttl).open().await
    }

    crate::session::session_accessors!();

    /// A client whose acquisitions are all made in this session ([`Client::with_session`]).
    pub fn client(&self) -> Client {
        self.client.with_session(self)
    }

    /// `LOCK.SESSION KEEPALIVE` now: `Some(remaining)`, or `None`: the session is gone.
    pub async fn keepalive(&self) -> Result<Option<Duration>, Error> {
        let left = self.run(&command::session_keepalive(self.id())).await?;
        Ok(left.map(Duration::from_millis))
    }

    /// `LOCK.SESSION INFO`: the session as the server sees it, or `None` if it is gone.
    pub async fn info(&self) -> Result<Option<SessionInfo>, Error> {
        self.run(&command::session_info(self.id())).await
    }

    /// Stop the keepalive, then close the session (see [`crate::Session::close`]).
    pub async fn close(mut self) -> Result<Option<u64>, Error> {
        self.closed = true;
        if let Some(keepalive) = self.keepalive.take() {
            keepalive.stop().await;
        }
        let closed = self.run(&command::session_close(self.id())).await;
        // After the reply: the connection closes within the bound thread's poll (50 ms).
        drop(self.bound.take());
        closed
    }

    /// Wait until the session is lost, and return why (at once if it already was). While it
    /// lives this waits forever: use it in `tokio::select!` next to the work.
    pub async fn lost(&self) -> LossReason {
        let mut loss = self.loss.subscribe();
        let reason = match loss.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone(),
            Err(_) => None,
        };
        match reason {
            Some(reason) => reason,
            None => std::future::pending().await,
        }
    }

    /// A receiver of the session's loss, for other tasks: `None` until it is lost.
    pub fn loss_watch(&self) -> watch::Receiver<Option<LossReason>> {
        self.loss.subscribe()
    }

    async fn run<T: 'static>(&self, command: &Command<T>) -> Result<T, Error> {
        let inner = &self.client.inner;
        inner
            .run(inner.io_timeout, inner.connect_timeout, command)
            .await
            .map_err(|failure| failure.error)
    }

    /// The shared state, for [`Client::with_session`].
    pub(crate) fn state(&self) -> &Arc<SessionState> {
        &self.state
    }
}

impl SessionBuilder<Client> {
    /// Open the session and start its keepalive task (see
    /// [`SessionBuilder::open`](crate::SessionBuilder#method.open)). A bound session's
    /// connection is opened on tokio's blocking pool; if this future is dropped meanwhile, that
    /// connection is closed once it is open, which ends the session on the server.
    pub async fn open(self) -> Result<Session, Error> {
        let (open, ttl_ms) = self.request()?;
        // Without the default sessions: the session's own client must not keep them alive.
        let client = self.client.without_session();
        let (id, bound) = match self.is_bound() {
            true => {
                let inner = Arc::clone(&client.inner);
                let opened = tokio::task::spawn_blocking(move || Bound::open(&inner, &open));
                let (conn, id) = opened.await.map_err(|_| runtime_gone())??;
                (id, Some(conn))
            }
            false => {
                let inner = &client.inner;
                let id = inner
                    .run(inner.io_timeout, inner.connect_timeout, &open)
                    .await;
                (id.map_err(|failure| failure.error)?, None)
            }
        };
        let state = Arc::new(SessionState::new(id, ttl_ms, bound.is_some()));
        let loss: Loss = Arc::new(watch::Sender::new(None));
        state.listen(Arc::downgrade(&loss));
        let runtime = Handle::current();
        let mut session = Session {
            client,
            state: Arc::clone(&state),
            keepalive: None,
            bound: None,
            loss,
            runtime,
            closed: false,
        };
        if let Some(conn) = bound {
            let to = Arc::clone(&state);
            let closed = move |e: Option<Error>| {
                to.report(match e {
                    Some(e) => LossReason::BoundConnectionClosed(Arc::new(e)),
                    None => LossReason::SessionEnded,
                })
            };
            let follow = crate::bound::Follow::for_session(
                Arc::clone(&session.client.inner) as Arc<dyn crate::bound::FollowTarget>,
                state.id(),
                Duration::from_millis(ttl_ms),
                self.grace_period(),
            );
            session.bound = Some(Bound::watch(conn, follow, closed).map_err(Error::Spawn)?);
        }
        let lease = Lease {
            client: Arc::clone(&session.client.inner),
            hold: Arc::clone(&state) as Arc<dyn Renewable>,
            period: self.keepalive_every,
            loss: state,
        };
        session.keepalive = Some(Watchdog::spawn(lease, &session.runtime));
        Ok(session)
    }
}

impl Drop for Session {
    /// Abort the keepalive, then send `CLOSE` unless [`Session::close`] already did, and close
    /// a bound session's connection after its reply (see the type's documentation).
    fn drop(&mut self) {
        if let Some(keepalive) = self.keepalive.take() {
            keepalive.abort();
        }
        if self.closed {
            return;
        }
        let inner = Arc::clone(&self.client.inner);
        let close = command::session_close(self.id());
        let bound = self.bound.take();
        send_now(&self.runtime, async move {
            let reply = inner
                .run(inner.io_timeout, inner.connect_timeout, &close)
                .await;
            if let Err(failure) = reply {
                report_close_failure(&failure.error);
            }
            drop(bound);
        });
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.state.fmt(f)
    }
}
