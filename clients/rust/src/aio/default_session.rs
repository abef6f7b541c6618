//! The async client's default sessions: the sync [`crate::default_session`] with an
//! [`aio::Session`](Session) (its keepalive a task) and an async lock around the opening, so
//! that concurrent acquires of one client open one session. Dropping the last clone of the
//! client drops the sessions, which close themselves with a task (`aio::Session`'s drop);
//! [`Client::close`](super::Client::close) closes them and waits for the replies.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use super::client::Client;
use super::session::Session;
use crate::default_session::{DEFAULT_GRACE, DEFAULT_SESSION_TTL};
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
        let session = Session::builder(&client.without_session(), DEFAULT_SESSION_TTL)
            .bound(true)
            .grace(DEFAULT_GRACE)
            .open()
            .await?;
        let state = Arc::clone(session.state());
        *current = Some(session);
        Ok(state)
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
