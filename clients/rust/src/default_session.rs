//! The default session: what a lock made without a session of its own joins (issue 29).
//!
//! Every acquisition of a [`Client`] that was given no session ([`Client::with_session`]) and
//! was not told to hold by TTL alone ([`Client::without_session`]) is made in the client's
//! *default session*: one `BOUND` session with a grace, per client (shared by its clones: they
//! share its connections) and per cluster node ([`Client::for_key`]), opened by the first
//! acquire that needs it, kept alive by one keepalive for all its holds. A process that dies
//! (exits, crashes, `kill -9`) closes its connections, and the server frees everything it held
//! [`DEFAULT_GRACE`] later, instead of when each hold's TTL runs out.
//!
//! Nothing else changes for a lock: it sends its own TTL as well as `SESSION id`, so the hold
//! keeps its own deadline, and the watchdog, `extend` and durable grants work as without a
//! session. The session:
//!
//! - TTL [`DEFAULT_SESSION_TTL`] (10 s), a keepalive every third: the bound for a holder whose
//!   *host* vanished without closing its connection (the server learns of that only from TCP).
//! - `GRACE` [`DEFAULT_GRACE`] (500 ms): when its connection drops while this process lives (a
//!   `CLIENT KILL`, a proxy or the network closing it), the session's thread sees the close at
//!   once and re-`ATTACH`es the session on a new connection (`bound.rs`): every hold is kept.
//!   If the server answers nil (the grace passed), each guard reports the loss
//!   ([`LossReason::SessionEnded`](crate::LossReason)) and the next acquire opens a new one.
//! - Closed (`LOCK.SESSION CLOSE`: every hold in it released, no lock delay) by
//!   [`Client::close`], or when the last clone of the client (guards hold one) is dropped.
//!
//! The lock delay is a session's option (`LOCKDELAY`), one for all its holds: the default
//! session has none. A lock that needs one is taken in a session opened with
//! [`SessionBuilder::lock_delay`](crate::SessionBuilder::lock_delay).
//!
//! The sync [`Defaults`] lives here; the async one is `aio/default_session.rs`.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::client::Client;
use crate::error::Error;
use crate::session::{Session, SessionState};

/// The default session's TTL; the keepalive runs every third of it.
pub const DEFAULT_SESSION_TTL: Duration = Duration::from_secs(10);

/// How long the server keeps the default session after its bound connection drops
/// (`BOUND GRACE ms`), for the session's thread to re-`ATTACH` it; also how much later than
/// the close of a killed holder's connection its holds are handed on.
pub const DEFAULT_GRACE: Duration = Duration::from_millis(500);

/// How many times an acquire in the default session is made when the session ended under it.
pub(crate) const ATTEMPTS: usize = 3;

/// Whether an acquire's error says its session ended (before it, or while it waited).
pub(crate) fn session_gone(error: &Error) -> bool {
    let text = error.to_string();
    text.contains("no such session") || text.contains("session ended while the client waited")
}

/// The server's answer to `GRACE` from a module that does not know it (a syntax error naming
/// it): the default session is then opened without a grace.
pub(crate) fn refuses_grace(error: &Error) -> bool {
    let text = error.to_string();
    matches!(error, Error::Server(_)) && text.contains("syntax") && text.contains("GRACE")
}

/// The default sessions of one sync client (and its clones): this node's, and one per node of
/// the clients [`Client::for_key`] made from it.
#[derive(Default)]
pub(crate) struct Defaults {
    /// The session in use, once opened.
    current: Mutex<Option<Session>>,
    /// Sessions an acquire found gone: closed with the client (best effort; a session that
    /// ended answers nothing).
    retired: Mutex<Vec<Session>>,
    /// The default sessions of the cluster nodes' clients, by node address.
    nodes: Mutex<HashMap<String, Arc<Defaults>>>,
    /// The server answered `GRACE` with a syntax error (a module without it): open without.
    no_grace: std::sync::atomic::AtomicBool,
}

impl Defaults {
    /// The session to acquire in through `client` (whose own session is the default): the
    /// current one, or a new one if there is none or it was lost.
    pub(crate) fn session(&self, client: &Client) -> Result<Arc<SessionState>, Error> {
        let mut current = lock(&self.current);
        if let Some(session) = current.as_ref() {
            if !session.is_lost() {
                return Ok(Arc::clone(session.state()));
            }
        }
        if let Some(lost) = current.take() {
            lock(&self.retired).push(lost);
        }
        let session = match self.open(client) {
            Err(e) if refuses_grace(&e) => {
                // Without a grace a blip ends the session: its guards are told, as with an
                // explicit bound session, and the next acquire opens a new one.
                self.no_grace.store(true, Ordering::Relaxed);
                self.open(client)?
            }
            opened => opened?,
        };
        let state = Arc::clone(session.state());
        *current = Some(session);
        Ok(state)
    }

    /// Open a default session on `client`'s server, with the grace unless the server refused
    /// it before.
    fn open(&self, client: &Client) -> Result<Session, Error> {
        let builder = Session::builder(&client.without_session(), DEFAULT_SESSION_TTL).bound(true);
        match !self.no_grace.load(Ordering::Relaxed) {
            true => builder.grace(DEFAULT_GRACE).open(),
            false => builder.open(),
        }
    }

    /// An acquire was told `state` is gone: the next one opens a new session.
    pub(crate) fn retire(&self, state: &Arc<SessionState>) {
        let mut current = lock(&self.current);
        if current
            .as_ref()
            .is_some_and(|s| Arc::ptr_eq(s.state(), state))
        {
            lock(&self.retired).extend(current.take());
        }
    }

    /// The default sessions of the cluster node at `address` (shared by every client
    /// [`Client::for_key`] makes for that node).
    pub(crate) fn node(&self, address: String) -> Arc<Defaults> {
        Arc::clone(lock(&self.nodes).entry(address).or_default())
    }

    /// Close every session now: this node's and the cluster nodes'. Errors are not
    /// reported: a session that does not answer ends as its connection closes, after the grace.
    pub(crate) fn close(&self) {
        let sessions: Vec<Session> = lock(&self.current)
            .take()
            .into_iter()
            .chain(lock(&self.retired).drain(..))
            .collect();
        for session in sessions {
            let _ = session.close();
        }
        let nodes: Vec<Arc<Defaults>> = lock(&self.nodes).values().cloned().collect();
        for node in nodes {
            node.close();
        }
    }
}

impl Drop for Defaults {
    /// The last clone of the client is gone: close its sessions (each `CLOSE` within the
    /// client's I/O timeout; the bound connection is closed after it all the same).
    fn drop(&mut self) {
        self.close();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
