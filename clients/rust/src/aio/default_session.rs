//! The async client's default sessions: the sync [`crate::default_session`] with an
//! [`aio::Session`](Session) (its keepalive a task) and an async lock around the opening, so
//! that concurrent acquires of one client open one session. Dropping the last clone of the
//! client drops the sessions, which close themselves with a task (`aio::Session`'s drop);
//! [`Client::close`](super::Client::close) closes them and waits for the replies.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use super::client::Client;
use super::session::Session;
use crate::default_session::{refuses_grace, DEFAULT_GRACE, DEFAULT_SESSION_TTL};
use crate::error::Error;
use crate::session::SessionState;

/// The default sessions of one async client (and its clones), as [`crate::default_session`]'s.
#[derive(Default)]
pub(crate) struct Defaults {
    /// The session in use, once opened; locked across the opening.
    current: tokio::sync::Mutex<Option<Session>>,
    /// Sessions an acquire found gone, closed with the client.
    retired: Mutex<Vec<Session>>,
    /// The default sessions of the cluster nodes' clients, by node address.
    nodes: Mutex<HashMap<String, Arc<Defaults>>>,
    /// The server answered `GRACE` with a syntax error (a module without it): open without.
    no_grace: std::sync::atomic::AtomicBool,
}

impl Defaults {
    /// The session to acquire in through `client`: the current one, or a new one.
    pub(crate) async fn session(&self, client: &Client) -> Result<Arc<SessionState>, Error> {
        let mut current = self.current.lock().await;
        if let Some(session) = current.as_ref() {
            if !session.is_lost() {
                return Ok(Arc::clone(session.state()));
            }
        }
        if let Some(lost) = current.take() {
            lock(&self.retired).push(lost);
        }
        let session = match self.open(client).await {
            Err(e) if refuses_grace(&e) => {
                // Without a grace a blip ends the session: its guards are told, as with an
                // explicit bound session, and the next acquire opens a new one.
                self.no_grace.store(true, Ordering::Relaxed);
                self.open(client).await?
            }
            opened => opened?,
        };
        let state = Arc::clone(session.state());
        *current = Some(session);
        Ok(state)
    }

    /// Open a default session on `client`'s server, with the grace unless the server refused
    /// it before.
    async fn open(&self, client: &Client) -> Result<Session, Error> {
        let builder = Session::builder(&client.without_session(), DEFAULT_SESSION_TTL).bound(true);
        match !self.no_grace.load(Ordering::Relaxed) {
            true => builder.grace(DEFAULT_GRACE).open().await,
            false => builder.open().await,
        }
    }

    /// An acquire was told `state` is gone: the next one opens a new session.
    pub(crate) async fn retire(&self, state: &Arc<SessionState>) {
        let mut current = self.current.lock().await;
        if current
            .as_ref()
            .is_some_and(|s| Arc::ptr_eq(s.state(), state))
        {
            lock(&self.retired).extend(current.take());
        }
    }

    /// The default sessions of the cluster node at `address`.
    pub(crate) fn node(&self, address: String) -> Arc<Defaults> {
        Arc::clone(lock(&self.nodes).entry(address).or_default())
    }

    /// Close every session now, this node's and the cluster nodes', waiting for each reply;
    /// errors are not reported (a session that does not answer ends after its grace).
    pub(crate) async fn close(&self) {
        let mut pending: Vec<Arc<Defaults>> = lock(&self.nodes).values().cloned().collect();
        let mut sessions: Vec<Session> = self.current.lock().await.take().into_iter().collect();
        sessions.append(&mut lock(&self.retired));
        while let Some(node) = pending.pop() {
            pending.extend(lock(&node.nodes).values().cloned());
            sessions.extend(node.current.lock().await.take());
            sessions.append(&mut lock(&node.retired));
        }
        for session in sessions {
            let _ = session.close().await;
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
