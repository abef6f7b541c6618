//! [`Session`]: one lease for many holds (`LOCK.SESSION`), kept alive by one keepalive.
//!
//! A session is opened on one server with a TTL (`LOCK.SESSION OPEN ttl [BOUND] [LOCKDELAY ms]`)
//! and renewed by one watchdog (the guards' [`Watchdog`], renewing the session with
//! `LOCK.SESSION KEEPALIVE id` instead of a lock). Locks of every kind taken in it (`SESSION id`,
//! through [`Client::with_session`] or the lock types' `session`) need no watchdog of their own:
//! they end when the session ends, at the latest. When the session is lost, it tells itself and
//! every guard taken in it, once ([`LossReason::SessionEnded`],
//! [`LossReason::BoundConnectionClosed`], [`LossReason::ExtendFailed`]).
//!
//! Written once for both APIs: [`SessionState`] (the id, the TTL, who to tell of a loss),
//! [`SessionBuilder`] (the options and the `OPEN` request) and [`SessionInfo`]. The bound
//! connection is `bound.rs`, a thread in both APIs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use redis::Value;

use crate::bound::Bound;
use crate::client::Client;
use crate::command::{self, ttl_ms, unexpected, Command};
use crate::error::Error;
use crate::watchdog::{Lease, LossReason, LossSignal, Renewable, Report, Watchdog};

/// A session as a client knows it, shared by the session, its keepalive and its guards.
pub(crate) struct SessionState {
    /// The id the server gave (`{tag}` and 32 hex digits); a secret.
    id: String,
    /// The session's TTL in ms, which the keepalive renews every third of.
    ttl_ms: AtomicU64,
    /// Opened `BOUND`.
    bound: bool,
    /// The first loss seen, kept so that later guards and `is_lost` see it too.
    lost: Mutex<Option<LossReason>>,
    /// Who to tell of a loss: the session itself and the guards taken in it, held weakly (a
    /// guard that is gone has no one to tell).
    listeners: Mutex<Vec<Weak<dyn Report>>>,
    /// When the last keepalive that succeeded was sent (at first: when the session was known
    /// open): its deadline on the server is at most this plus the TTL.
    renewed: Mutex<Instant>,
}

impl SessionState {
    pub(crate) fn new(id: String, ttl_ms: u64, bound: bool) -> SessionState {
        SessionState {
            id,
            ttl_ms: AtomicU64::new(ttl_ms),
            bound,
            lost: Mutex::new(None),
            listeners: Mutex::new(Vec::new()),
            renewed: Mutex::new(Instant::now()),
        }
    }

    /// The session's id.
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// True if opened `BOUND`.
    pub(crate) fn bound(&self) -> bool {
        self.bound
    }

    /// The loss reported, if any.
    pub(crate) fn lost(&self) -> Option<LossReason> {
        lock(&self.lost).clone()
    }

    /// Tell `to` of this session's loss: at once if it was already lost, else when it is.
    /// `to` is held weakly: a guard that is gone is dropped from the list.
    pub(crate) fn listen<T: Report>(&self, to: Weak<T>) {
        // The loss is checked and the listener added under one lock, which `report` takes
        // first too: a listener is told whether it came before the loss or after.
        let lost = lock(&self.lost);
        match (&*lost, to.upgrade()) {
            (Some(reason), Some(to)) => to.report(reason.clone()),
            (None, Some(_)) => {
                let mut listeners = lock(&self.listeners);
                listeners.retain(|l| l.strong_count() > 0);
                listeners.push(to);
            }
            (_, None) => {}
        }
    }
}

impl Report for SessionState {
    fn report(&self, reason: LossReason) {
        let mut lost = lock(&self.lost);
        if lost.is_some() {
            return;
        }
        *lost = Some(reason.clone());
        let listeners = std::mem::take(&mut *lock(&self.listeners));
        drop(lost);
        for to in listeners.iter().filter_map(Weak::upgrade) {
            to.report(reason.clone());
        }
    }
}

impl Renewable for SessionState {
    fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms.load(Ordering::Relaxed))
    }

    fn renewal(&self) -> Command<bool> {
        command::session_keepalive(&self.id).map(|left| left.is_some())
    }

    fn gone(&self) -> LossReason {
        LossReason::SessionEnded
    }

    fn renewed(&self, sent: Instant) {
        *lock(&self.renewed) = sent;
    }

    /// Its deadline as of the last keepalive: it ends no sooner on the server, on the old
    /// master or on its promoted replica (the deadline replicates).
    fn pursued_until(&self) -> Option<Instant> {
        Some(*lock(&self.renewed) + self.ttl())
    }
}

impl std::fmt::Debug for SessionState {
    /// The id is a secret: only its hash tag is shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("tag", &hash_tag(&self.id))
            .field("ttl", &self.ttl())
            .field("bound", &self.bound)
            .field("lost", &self.lost())
            .finish()
    }
}

/// The `{tag}` an id starts with, which routes it in a cluster.
fn hash_tag(id: &str) -> &str {
    match (id.find('{'), id.find('}')) {
        (Some(0), Some(end)) => &id[..=end],
        _ => "",
    }
}

/// The options of a session to open: `Session::builder(&client, ttl)`, then `bound`,
/// `lock_delay`, `keepalive_every`, then `open()` (a [`Session`] on a [`Client`], an
/// [`aio::Session`](crate::aio::Session) on an [`aio::Client`](crate::aio::Client)).
#[derive(Clone, Debug)]
pub struct SessionBuilder<C = Client> {
    /// The server.
    pub(crate) client: C,
    /// The session's TTL: it ends that long after its last keepalive.
    ttl: Duration,
    /// `BOUND`: it also ends when its dedicated connection closes.
    bound: bool,
    /// `LOCKDELAY ms`, if given.
    lock_delay: Option<Duration>,
    /// `GRACE ms` (with `bound`), if given.
    grace: Option<Duration>,
    /// Time between keepalives; `None` for a third of the TTL.
    pub(crate) keepalive_every: Option<Duration>,
}

impl<C: Clone> SessionBuilder<C> {
    pub(crate) fn new(client: &C, ttl: Duration) -> SessionBuilder<C> {
        SessionBuilder {
            client: client.clone(),
            ttl,
            bound: false,
            lock_delay: None,
            grace: None,
            keepalive_every: None,
        }
    }

    /// `BOUND`: the session also ends, with every hold in it, the moment its connection closes
    /// for any reason (this process exits or crashes, `CLIENT KILL`, the server's idle
    /// `timeout`, a network error), rather than a TTL later. The session keeps a connection of
    /// its own open, idle, for its whole life (a thread waits on it, in both APIs), and reports
    /// that connection closing as [`LossReason::BoundConnectionClosed`].
    pub fn bound(mut self, bound: bool) -> Self {
        self.bound = bound;
        self
    }

    /// `LOCKDELAY ms` (at most 60 s): after a hold of this session is lost uncleanly (the
    /// session expired, or its bound connection closed), no one is granted what it held for
    /// `delay`. A clean [`Session::close`] or release has no delay.
    pub fn lock_delay(mut self, delay: Duration) -> Self {
        self.lock_delay = Some(delay);
        self
    }

    /// `GRACE ms` (with [`bound`](Self::bound); at most 60 s and at most the TTL): a connection
    /// blip is not a death. When the bound connection closes while this process lives (a
    /// `CLIENT KILL`, a proxy or the network dropping it), the server keeps the session
    /// detached for `grace`, and the session's thread reconnects and `LOCK.SESSION ATTACH`es it
    /// within that time: every hold goes on with its token, and no loss is reported. If this
    /// process dies, its holds are handed on `grace` later than without one (plus any lock
    /// delay). A loss is reported when the re-attach fails within the grace.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = Some(grace);
        self
    }

    /// Send a keepalive every `period` (shorter than the TTL) instead of every third of it.
    pub fn keepalive_every(mut self, period: Duration) -> Self {
        self.keepalive_every = Some(period);
        self
    }

    /// The `OPEN` request and the TTL in ms, after checking the options.
    pub(crate) fn request(&self) -> Result<(Command<String>, u64), Error> {
        let ttl = ttl_ms(self.ttl)?;
        if let Some(period) = self.keepalive_every {
            command::check_watchdog_period(period, self.ttl)?;
        }
        let delay = match self.lock_delay {
            Some(d) => Some(
                u64::try_from(d.as_millis())
                    .map_err(|_| Error::InvalidArgument("lock delay too long"))?,
            ),
            None => None,
        };
        let grace = match self.grace {
            Some(_) if !self.bound => {
                return Err(Error::InvalidArgument("a grace needs a bound session"))
            }
            Some(g) => Some(
                u64::try_from(g.as_millis())
                    .map_err(|_| Error::InvalidArgument("grace too long"))?,
            ),
            None => None,
        };
        Ok((command::session_open(ttl, self.bound, grace, delay), ttl))
    }

    /// The grace, for a bound session opened with one (0 is none).
    pub(crate) fn grace_period(&self) -> Option<Duration> {
        self.grace.filter(|g| self.bound && !g.is_zero())
    }

    /// True for `BOUND`.
    pub(crate) fn is_bound(&self) -> bool {
        self.bound
    }
}

/// A session as `LOCK.SESSION INFO` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionInfo {
    /// `ttl`: the ms left until the session's deadline (a keepalive moves it to its TTL again).
    pub ttl_ms: i64,
    /// `bound`: the client id of the connection it is bound to, or `None` (not bound, or
    /// bound and waiting for an `ATTACH` after a restart or a promotion).
    pub bound: Option<i64>,
    /// `lockdelay`: its lock delay, in ms.
    pub lock_delay_ms: i64,
    /// `holds`: how many holds it has.
    pub holds: i64,
}

impl SessionInfo {
    /// The reply's fields, by name; names it does not know are skipped.
    pub(crate) fn from_pairs(pairs: Vec<(Value, Value)>) -> Result<SessionInfo, Error> {
        let bad = |v: Value| unexpected("LOCK.SESSION INFO", v);
        let (mut ttl, mut bound, mut delay, mut holds) = (None, None, None, None);
        for (name, value) in pairs {
            let name = match name {
                Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
                Value::SimpleString(s) => s,
                other => return Err(bad(other)),
            };
            let int = |v: Value| match v {
                Value::Int(n) => Ok(n),
                other => Err(bad(other)),
            };
            match name.as_str() {
                "ttl" => ttl = Some(int(value)?),
                "lockdelay" => delay = Some(int(value)?),
                "holds" => holds = Some(int(value)?),
                "bound" => {
                    bound = Some(match value {
                        Value::Nil => None,
                        v => Some(int(v)?),
                    })
                }
                _ => {}
            }
        }
        match (ttl, bound, delay, holds) {
            (Some(ttl_ms), Some(bound), Some(lock_delay_ms), Some(holds)) => Ok(SessionInfo {
                ttl_ms,
                bound,
                lock_delay_ms,
                holds,
            }),
            _ => Err(Error::UnexpectedReply {
                command: "LOCK.SESSION INFO",
                reply: "a map without ttl, bound, lockdelay and holds".to_string(),
            }),
        }
    }
}

/// A session on one server: one lease for every lock taken in it, renewed by one keepalive
/// thread. Dropping it closes it (`LOCK.SESSION CLOSE`, best effort), which releases every hold
/// in it with no lock delay.
///
/// ```no_run
/// use std::time::Duration;
/// use redis_lock_client::{Client, Semaphore, Session};
///
/// # fn main() -> Result<(), redis_lock_client::Error> {
/// let client = Client::open("redis://127.0.0.1:6379/")?;
/// let session = Session::builder(&client, Duration::from_secs(10)).bound(true).open()?;
/// // Locks in the session: no watchdog each, and a ttl of 0 means "until the session ends".
/// let locks = client.with_session(&session);
/// let a = locks.acquire("a", Duration::ZERO)?.expect("free");
/// let permit = Semaphore::new(&client, "pool", 4).session(&session).acquire(Duration::ZERO)?;
/// if session.is_lost() { /* stop acting on a and the permit */ }
/// session.close()?; // releases both
/// # let _ = (a, permit);
/// # Ok(())
/// # }
/// ```
pub struct Session {
    /// The server, without a session (the keepalive and `CLOSE` go through its pool).
    client: Client,
    /// The id, TTL and the loss, shared with the keepalive and the guards.
    state: Arc<SessionState>,
    /// The keepalive thread.
    keepalive: Option<Watchdog>,
    /// The dedicated connection of a bound session, and the thread that waits on it.
    bound: Option<Bound>,
    /// Where the session's own loss is reported: kept alive here, since `state` holds its
    /// listeners weakly.
    _loss: Arc<LossSignal>,
    /// The receiving side of the loss channel.
    loss_rx: Receiver<LossReason>,
    /// Set once [`Session::close`] ran, so that `Drop` does not close again.
    closed: bool,
}

impl Session {
    /// The options of a session on `client`'s server with `ttl` (at least 1 ms): the session
    /// ends `ttl` after its last keepalive (every third of it, by a thread), or at `close`.
    pub fn builder(client: &Client, ttl: Duration) -> SessionBuilder<Client> {
        SessionBuilder::new(client, ttl)
    }

    /// Open a session with `ttl` and no other option: `Session::builder(client, ttl).open()`.
    pub fn open(client: &Client, ttl: Duration) -> Result<Session, Error> {
        Session::builder(client, ttl).open()
    }

    crate::session::session_accessors!();

    /// A client whose acquisitions are all made in this session ([`Client::with_session`]).
    pub fn client(&self) -> Client {
        self.client.with_session(self)
    }

    /// `LOCK.SESSION KEEPALIVE` now: `Some(remaining)` (the session's deadline is now + its
    /// TTL again), or `None`: the session is gone.
    pub fn keepalive(&self) -> Result<Option<Duration>, Error> {
        let left = self.run(&command::session_keepalive(self.id()))?;
        Ok(left.map(Duration::from_millis))
    }

    /// `LOCK.SESSION INFO`: the session as the server sees it, or `None` if it is gone.
    pub fn info(&self) -> Result<Option<SessionInfo>, Error> {
        self.run(&command::session_info(self.id()))
    }

    /// Close the session (`LOCK.SESSION CLOSE`) after stopping its keepalive: every hold in it
    /// is released, with no lock delay. `Ok(Some(n))`: `n` holds were released; `Ok(None)`: the
    /// session was already gone. A bound session's connection is closed after the reply (if
    /// `CLOSE` failed, closing it still ends the session on the server, lock delay included).
    pub fn close(mut self) -> Result<Option<u64>, Error> {
        self.closed = true;
        self.end()
    }

    /// The channel on which the session's loss is sent, once (see [`Guard::lost`]).
    ///
    /// [`Guard::lost`]: crate::Guard::lost
    pub fn lost(&self) -> &Receiver<LossReason> {
        &self.loss_rx
    }

    /// Wait up to `timeout` for the session's loss; `None` if it was not lost meanwhile.
    pub fn wait_lost(&self, timeout: Duration) -> Option<LossReason> {
        if let Some(reason) = self.loss_reason() {
            return Some(reason);
        }
        match self.loss_rx.recv_timeout(timeout) {
            Ok(reason) => Some(reason),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => self.loss_reason(),
        }
    }

    /// Stop the keepalive, `CLOSE`, then close the bound connection.
    fn end(&mut self) -> Result<Option<u64>, Error> {
        if let Some(mut keepalive) = self.keepalive.take() {
            keepalive.stop();
        }
        let closed = self.run(&command::session_close(self.id()));
        if let Some(bound) = self.bound.take() {
            bound.stop();
        }
        closed
    }

    fn run<T: 'static>(&self, command: &Command<T>) -> Result<T, Error> {
        let inner = &self.client.inner;
        inner.with_conn(inner.io_timeout, inner.connect_timeout, command)
    }

    /// The shared state, for [`Client::with_session`].
    pub(crate) fn state(&self) -> &Arc<SessionState> {
        &self.state
    }
}

impl SessionBuilder<Client> {
    /// Open the session (`LOCK.SESSION OPEN`; for a bound one, on a connection of its own that
    /// it keeps) and start its keepalive.
    pub fn open(self) -> Result<Session, Error> {
        let (open, ttl_ms) = self.request()?;
        // Without the default sessions: the session's own client must not keep them alive.
        let client = self.client.without_session();
        let inner = &client.inner;
        let (id, bound) = match self.is_bound() {
            true => {
                let (conn, id) = Bound::open(inner, &open)?;
                (id, Some(conn))
            }
            false => (
                inner.with_conn(inner.io_timeout, inner.connect_timeout, &open)?,
                None,
            ),
        };
        let state = Arc::new(SessionState::new(id, ttl_ms, bound.is_some()));
        let (notify, loss_rx) = mpsc::channel();
        let loss = Arc::new(LossSignal {
            reason: Arc::new(Mutex::new(None)),
            notify,
        });
        state.listen(Arc::downgrade(&loss));
        let mut session = Session {
            client,
            state: Arc::clone(&state),
            keepalive: None,
            bound: None,
            _loss: loss,
            loss_rx,
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
        session.keepalive = Some(Watchdog::spawn(lease).map_err(Error::Spawn)?);
        Ok(session)
    }
}

impl Drop for Session {
    /// Close the session unless [`Session::close`] already did; errors go to stderr (the
    /// session then ends at its deadline, or, bound, as its connection closes now).
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        if let Err(e) = self.end() {
            report_close_failure(&e);
        }
    }
}

/// The read-only side of a session, written once for [`Session`] and
/// [`crate::aio::Session`]: both keep a field `state: Arc<SessionState>`.
macro_rules! session_accessors {
    () => {
        /// The session's id, as `LOCK.SESSION OPEN` answered it: `{tag}` and 32 hex digits,
        /// whose tag is a hash tag of a slot this server serves. It is a secret: whoever has it
        /// can keep the session alive or close it.
        pub fn id(&self) -> &str {
            self.state.id()
        }

        /// The session's TTL: it ends that long after its last keepalive.
        pub fn ttl(&self) -> Duration {
            crate::watchdog::Renewable::ttl(&*self.state)
        }

        /// True if opened `BOUND` (see [`SessionBuilder::bound`](crate::SessionBuilder::bound)).
        pub fn is_bound(&self) -> bool {
            self.state.bound()
        }

        /// True once the session was lost: a keepalive found it gone or got no answer, or its
        /// bound connection closed. Every guard taken in it reports the same loss.
        pub fn is_lost(&self) -> bool {
            self.state.lost().is_some()
        }

        /// The session's loss, if it was lost.
        pub fn loss_reason(&self) -> Option<LossReason> {
            self.state.lost()
        }
    };
}
pub(crate) use session_accessors;

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.state.fmt(f)
    }
}

/// What a session's `Drop` does with a `CLOSE` that failed.
pub(crate) fn report_close_failure(error: &Error) {
    eprintln!(
        "redis-lock-client: could not close a session (it ends at its deadline, or, bound, as \
         its connection closes): {error}"
    );
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Count(Mutex<Vec<String>>);

    impl Report for Count {
        fn report(&self, reason: LossReason) {
            lock(&self.0).push(reason.to_string());
        }
    }

    /// A loss is told once to each listener, whether it listened before the loss or after, and
    /// a listener that is gone is skipped.
    #[test]
    fn a_loss_is_told_once_to_every_listener() {
        let state = SessionState::new("{ab}0123".to_string(), 3000, true);
        let (early, gone, late) = (
            Arc::new(Count(Mutex::new(Vec::new()))),
            Arc::new(Count(Mutex::new(Vec::new()))),
            Arc::new(Count(Mutex::new(Vec::new()))),
        );
        state.listen(Arc::downgrade(&early));
        state.listen(Arc::downgrade(&gone));
        drop(gone);
        state.report(LossReason::SessionEnded);
        state.report(LossReason::NotHeld);
        state.listen(Arc::downgrade(&late));
        let told = |c: &Count| lock(&c.0).clone();
        let ended = vec!["the lock's session ended".to_string()];
        assert_eq!(told(&early), ended);
        assert_eq!(told(&late), ended);
        assert!(matches!(state.lost(), Some(LossReason::SessionEnded)));
        assert_eq!(hash_tag(state.id()), "{ab}");
        assert!(!format!("{state:?}").contains("0123"), "the id is a secret");
    }
}
