//! [`Client`]: one server and its connection pool.

use std::io;
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::thread;
use std::time::Duration;

use redis::{Connection, ConnectionLike};

use crate::command::{self, in_step, Command, Failure, Resend};
use crate::default_session::{self, Defaults};
use crate::error::Error;
use crate::guard::Guard;
use crate::hold::{Acquisition, Durable, Settled, Target};
use crate::session::{Session, SessionState};
use crate::subscriber::Subscriber;

mod failover;
#[cfg(feature = "tokio")]
pub(crate) use failover::Next;
pub(crate) use failover::Pursuit;

/// How long opening a connection may take, unless [`Client::with_timeouts`] says otherwise.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a reply may take (and a request may block on write), unless
/// [`Client::with_timeouts`] says otherwise. A blocking acquire waits this much longer than its
/// `wait`.
pub const DEFAULT_IO_TIMEOUT: Duration = Duration::from_secs(1);

/// Most idle connections kept per [`Client`] (and its clones). A few are enough: each command
/// holds one only for its round trip, and the watchdog takes one per renewal.
pub(crate) const MAX_IDLE: usize = 4;

/// A handle to one Redis server that has the redis-lock module loaded.
///
/// Cheap to clone: clones share one small pool of connections. Nothing is connected until the
/// first command. Every command runs with a connect timeout and a read/write timeout (see
/// [`Client::with_timeouts`]), so an unreachable or stalled server gives an
/// [`Error::Connection`] instead of a hang.
///
/// Each guard gets a fresh random owner id (a UUID v4) unless [`Client::with_owner`] fixes one.
#[derive(Clone)]
pub struct Client {
    /// The server and the pool, shared by clones and by the guards and watchdogs they create.
    pub(crate) inner: Arc<Inner>,
    /// The owner every acquisition uses; `None` for a new UUID per acquisition.
    pub(crate) owner: Option<String>,
    /// The session every acquisition is made in ([`Client::with_session`]), if any.
    pub(crate) session: Option<Arc<SessionState>>,
    /// Without `session`: the default sessions acquisitions join, shared by clones; `None`
    /// for holds by TTL alone ([`Client::without_session`]).
    pub(crate) defaults: Option<Arc<Defaults>>,
    /// Every guard watches its key's change feed ([`Client::watch_losses`]).
    pub(crate) watch: bool,
}

/// The server a client talks to and its limits: what the sync and the async client share.
pub(crate) struct Endpoint {
    /// Connection parameters (no connection of its own). Replaced when a cluster node's slot
    /// moved to another master (a failover: [`Inner::follow`]).
    redis: std::sync::RwLock<redis::Client>,
    /// Limit on opening a connection, handshake included.
    pub(crate) connect_timeout: Duration,
    /// Limit on a reply (and a write), except for a blocking acquire.
    pub(crate) io_timeout: Duration,
    /// Replicas that must acknowledge each grant ([`Client::durable`]).
    pub(crate) durable: Option<Durable>,
    /// Whether the server can take durable grants, once asked (`INFO server`).
    pub(crate) durable_ok: std::sync::OnceLock<bool>,
    /// The server is a cluster node (`for_key` made this client, or it answered `MOVED`):
    /// `READONLY` and a role-change `UNBLOCKED` then mean "follow the failover".
    pub(crate) cluster: std::sync::atomic::AtomicBool,
    /// A cluster node's client: the hash slot it was made for ([`Client::for_key`]) and the
    /// other nodes it knows (the seed), to ask `CLUSTER SLOTS` when its node is gone.
    pub(crate) slot: Option<(u16, Vec<redis::Client>)>,
}

impl Endpoint {
    /// The server at `url`, with the default timeouts. Only parses the URL.
    pub(crate) fn open(url: &str) -> Result<Endpoint, Error> {
        let redis = redis::Client::open(url).map_err(Error::from_redis)?;
        Ok(Endpoint {
            redis: std::sync::RwLock::new(redis),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            io_timeout: DEFAULT_IO_TIMEOUT,
            durable: None,
            durable_ok: std::sync::OnceLock::new(),
            cluster: std::sync::atomic::AtomicBool::new(false),
            slot: None,
        })
    }

    /// The same server with other timeouts, each at least 1 ms.
    pub(crate) fn with_timeouts(&self, connect: Duration, io: Duration) -> Endpoint {
        Endpoint {
            redis: std::sync::RwLock::new(self.redis()),
            connect_timeout: connect.max(Duration::from_millis(1)),
            io_timeout: io.max(Duration::from_millis(1)),
            durable: self.durable,
            durable_ok: std::sync::OnceLock::new(),
            cluster: std::sync::atomic::AtomicBool::new(self.is_cluster()),
            slot: self.slot.clone(),
        }
    }

    /// The same server, each grant waited on by `replicas` replicas for up to `timeout`.
    pub(crate) fn with_durable(&self, replicas: u32, timeout: Duration) -> Endpoint {
        Endpoint {
            durable: (replicas > 0).then(|| Durable {
                replicas,
                timeout_ms: (timeout.as_millis() as u64).max(1),
            }),
            ..self.with_timeouts(self.connect_timeout, self.io_timeout)
        }
    }

    /// The connection parameters now (a clone: they change when a failover is followed).
    pub(crate) fn redis(&self) -> redis::Client {
        self.redis
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The node a cluster's `MOVED` redirect names, with this endpoint's credentials, database,
    /// TLS settings and timeouts.
    pub(crate) fn redirected(&self, moved: &redis::RedisError) -> Result<Endpoint, Error> {
        let bad = || Error::UnexpectedReply {
            command: "LOCK.FENCE",
            reply: format!("{moved}"),
        };
        let (node, _slot) = moved.redirect_node().ok_or_else(bad)?;
        let (host, port) = node.rsplit_once(':').ok_or_else(bad)?;
        let port: u16 = port.parse().map_err(|_| bad())?;
        Ok(Endpoint {
            redis: std::sync::RwLock::new(self.at(host, port)?),
            ..self.with_timeouts(self.connect_timeout, self.io_timeout)
        })
    }

    /// This endpoint's connection parameters (credentials, database, TLS) for `host:port`.
    fn at(&self, host: &str, port: u16) -> Result<redis::Client, Error> {
        let mut info = self.redis().get_connection_info().clone();
        info.addr = match info.addr {
            redis::ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => redis::ConnectionAddr::TcpTls {
                host: host.to_string(),
                port,
                insecure,
                tls_params,
            },
            _ => redis::ConnectionAddr::Tcp(host.to_string(), port),
        };
        redis::Client::open(info).map_err(Error::from_redis)
    }

    /// Open a connection within `timeout`, handshake included.
    ///
    /// `redis::Client::get_connection_with_timeout` bounds only the TCP connect: the handshake
    /// that follows (`CLIENT SETINFO`, and `AUTH`/`SELECT` if the URL asks) reads its replies
    /// with no timeout, so a server that accepts connections but does not answer (paused with
    /// SIGSTOP, or stuck) would block the caller forever. The connection is therefore opened on
    /// a helper thread and abandoned if it is not ready in time; that thread ends when the
    /// server answers or the connection breaks, and the late connection is then closed.
    pub(crate) fn connect(&self, timeout: Duration) -> Result<Connection, Error> {
        let (tx, rx) = mpsc::sync_channel(1);
        let redis = self.redis();
        thread::Builder::new()
            .name("redis-lock-connect".to_string())
            .spawn(move || {
                // The receiver may have given up; the connection is then dropped (closed).
                let _ = tx.send(redis.get_connection_with_timeout(timeout));
            })
            .map_err(Error::Spawn)?;
        match rx.recv_timeout(timeout) {
            Ok(result) => result.map_err(Error::from_redis),
            Err(_) => Err(Error::Connection(redis::RedisError::from(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no answer to the connection handshake within {timeout:?}"),
            )))),
        }
    }
}

/// What a [`Client`] and its guards share.
pub(crate) struct Inner {
    /// The server and the timeouts (`inner.io_timeout` reads through to it).
    endpoint: Endpoint,
    /// Connections that answered their last command correctly, ready for reuse.
    idle: Mutex<Vec<Connection>>,
    /// The change feed's connections and thread, started by the first watch.
    pub(crate) feed: std::sync::OnceLock<Arc<Subscriber>>,
}

/// How many failovers (redirects) one command follows before its error is returned.
pub(crate) const MAX_FOLLOWS: usize = 5;

impl std::ops::Deref for Inner {
    type Target = Endpoint;

    fn deref(&self) -> &Endpoint {
        &self.endpoint
    }
}

impl Client {
    /// A client for the server at `url`, e.g. `redis://127.0.0.1:6379/` or
    /// `redis://:password@host:6379/2`.
    ///
    /// Only parses the URL: an unreachable server shows up as [`Error::Connection`] on the first
    /// command.
    pub fn open(url: &str) -> Result<Client, Error> {
        Ok(Client {
            inner: Arc::new(Inner::new(Endpoint::open(url)?)),
            owner: None,
            session: None,
            defaults: Some(Arc::default()),
            watch: false,
        })
    }

    /// The same server with other timeouts: `connect` for opening a connection, `io` for each
    /// reply and write (a blocking acquire adds its `wait` to `io`). Both must be non-zero.
    ///
    /// The returned client has a pool of its own.
    pub fn with_timeouts(self, connect: Duration, io: Duration) -> Client {
        Client {
            inner: Arc::new(Inner::new(self.inner.with_timeouts(connect, io))),
            defaults: self.defaults.as_ref().map(|_| Arc::default()),
            ..self
        }
    }

    /// The same server, with every grant acknowledged by `replicas` replicas before an acquire
    /// succeeds: `WAIT replicas timeout` on the acquire's own connection right after the grant
    /// (0 turns it off). If fewer acknowledge within `timeout`, the grant is released and the
    /// acquire fails with [`Error::NotDurable`] (neither `Ok(None)` nor a guard). A grant made
    /// as an owner the caller chose ([`Client::with_owner`]) is not released: it may be a hold
    /// the caller had before (an idempotent retry). Needs Redis 7.0.12+, where a `WAIT` after a
    /// blocked grant counts it.
    ///
    /// `WAIT` is not consensus: with several replicas and `replicas = 1`, a failover can still
    /// promote one that did not acknowledge. The returned client has a pool of its own.
    pub fn durable(self, replicas: u32, timeout: Duration) -> Client {
        Client {
            inner: Arc::new(Inner::new(self.inner.with_durable(replicas, timeout))),
            defaults: self.defaults.as_ref().map(|_| Arc::default()),
            ..self
        }
    }

    /// The same server, with every acquisition made as `owner` instead of a new random UUID.
    ///
    /// Use it when the owner must be known in advance, e.g. to retry an acquisition whose reply
    /// was lost after a crash: `LOCK.ACQUIRE` by the owner that already holds the lock is an
    /// idempotent retry and returns the same token. Two guards with the same owner on the same
    /// key are the *same* hold: releasing either releases it. The server rejects an empty owner.
    pub fn with_owner(self, owner: impl Into<String>) -> Client {
        Client {
            owner: Some(owner.into()),
            ..self
        }
    }

    /// The same server, with every acquisition made in `session` (`SESSION id`): the holds end
    /// when the session ends (closed, expired, or, bound, its connection closed), at the latest,
    /// and need no watchdog: the session's one keepalive covers them all. A `ttl` of zero is
    /// allowed there: the hold has no deadline of its own (its key has no Redis TTL, `PTTL` is
    /// -1) and lives as long as the session. A guard taken in a session reports the session's
    /// loss as its own ([`Guard::lost`]).
    ///
    /// The session must be one of this server's: another server answers `ERR no such session`
    /// (in a cluster, open one session per node, on [`Client::for_key`]'s client).
    pub fn with_session(&self, session: &Session) -> Client {
        Client {
            session: Some(Arc::clone(session.state())),
            // (Session and defaults both set means "in the default session": see acquire_target.)
            defaults: None,
            ..self.clone()
        }
    }

    /// The same server and connections, every acquisition holding by its TTL alone: no
    /// default session (see [the default session](crate#the-default-session)). A lock then outlives
    /// a crash of this process until its TTL runs out, as before issue 29; use it where that
    /// is wanted (a lock that must hold across a restart of its holder), or to compare.
    pub fn without_session(&self) -> Client {
        Client {
            session: None,
            defaults: None,
            ..self.clone()
        }
    }

    /// Close this client's default sessions now (every clone's: they share them), each with
    /// `LOCK.SESSION CLOSE`, which releases every hold in it at once. Dropping the last clone
    /// (guards hold one) does the same. A later acquire opens a new default session. Errors are
    /// not reported: a session that does not answer ends as its connection closes, after the
    /// grace.
    pub fn close(&self) {
        if let Some(defaults) = &self.defaults {
            defaults.close();
        }
    }

    /// The same server, with every guard watching its keys' change feed while held
    /// ([`Guard::watch`]): its loss signal ([`Guard::lost`]) then fires as soon as the server
    /// reports the hold gone (expired, deleted, flushed, its session ended, taken by another
    /// owner), at the client's own deadline if no renewal succeeded, and when the feed's
    /// connection is lost. An acquire whose watch cannot be set up fails (the grant is
    /// released).
    pub fn watch_losses(self) -> Client {
        Client {
            watch: true,
            ..self
        }
    }

    /// Follow every change of the exclusive holder of any lock `key`: the same [`Observer`](crate::Observer) as
    /// [`Election::observe`](crate::Election::observe), where [`Change::leader`](crate::Change)
    /// is the holder (`value` its owner, `term` its token), or `None` while nobody holds it. The
    /// first change is the state when it started; [`Observer::next_timeout`](crate::Observer::next_timeout) answers `None` when
    /// no change came within its timeout.
    pub fn watch(&self, key: &str) -> Result<crate::Observer, Error> {
        crate::Election::new(self, key, Duration::ZERO).observe()
    }

    /// In a Redis Cluster: a client for the node that serves `key`, with this client's
    /// credentials, timeouts and owner (and no session). Asks this client's node with
    /// `LOCK.FENCE key`: this client's node if it serves the key, else the node its `MOVED`
    /// redirect names (a client of its own either way). Open a session there for the locks of that node's keys
    /// (`LOCK.SESSION OPEN` has no key, so it opens on whichever node it is sent to).
    ///
    /// It follows its key's slot through a failover (issue 34): `MOVED`, `READONLY` or a
    /// waiter's role-change `UNBLOCKED` (a planned `CLUSTER FAILOVER`) are followed to the
    /// slot's master; a node that is gone (a killed master) is replaced by the master this
    /// client's node (the seed) names in `CLUSTER SLOTS`, once its replica is promoted, within
    /// each call's own time: a command is sent again there if it did not run or is safe to run
    /// twice, an acquire (a waiter too) is made again as the same owner with the wait it has
    /// left, and a session's keepalive is sent again until the session's deadline.
    pub fn for_key(&self, key: &str) -> Result<Client, Error> {
        // A client of its own for the node, even when it is this client's: following a
        // failover (or this probe's `MOVED`) repoints a client's endpoint, and two keys' clients
        // sharing one endpoint would drag each other to the wrong node.
        let inner = &self.inner;
        let node = Inner::new(
            inner
                .with_timeouts(inner.connect_timeout, inner.io_timeout)
                .for_cluster_key(inner, key),
        );
        node.with_conn(
            node.io_timeout,
            node.connect_timeout,
            &command::fence(key, 1),
        )?;
        // One default session per node: the node's clients share it.
        let address = node.redis().get_connection_info().addr.to_string();
        Ok(Client {
            inner: Arc::new(node),
            owner: self.owner.clone(),
            session: None,
            defaults: self.defaults.as_ref().map(|d| d.node(address)),
            watch: self.watch,
        })
    }

    /// Try once to take the lock `key` for `ttl` (whole milliseconds, at least 1), without
    /// waiting.
    ///
    /// - `Ok(Some(guard))`: granted; the guard releases it when dropped.
    /// - `Ok(None)`: held by someone else (or by queued `BLOCK` waiters, who go first).
    /// - `Err(_)`: failure: the server was unreachable, did not answer in time, or answered with
    ///   an error. If the request may have reached the server, the client tries to release the
    ///   lock again (with the random owner it made up, so this can touch no one else's hold).
    pub fn acquire(&self, key: &str, ttl: Duration) -> Result<Option<Guard>, Error> {
        self.acquire_target(Target::exclusive(key), &self.owner, ttl, None)
    }

    /// Take the lock `key` for `ttl`, waiting up to `wait` in the key's FIFO queue on the server
    /// (`LOCK.ACQUIRE ... BLOCK wait-ms`) if someone else holds it.
    ///
    /// `Ok(None)` when `wait` passed first. The connection's read timeout is `wait` plus the I/O
    /// timeout, so a server that stops answering gives an error rather than a hang. A zero
    /// `wait` is the same as [`Client::acquire`] (the server would read `BLOCK 0` as "forever").
    pub fn acquire_blocking(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Guard>, Error> {
        self.acquire_target(Target::exclusive(key), &self.owner, ttl, Some(wait))
    }

    /// [`Client::acquire`], then [`Guard::start_watchdog`] on the granted guard: the lock is
    /// renewed every `ttl / 3` until the guard is released or dropped, or the lock is lost.
    pub fn acquire_with_watchdog(&self, key: &str, ttl: Duration) -> Result<Option<Guard>, Error> {
        let granted = self.acquire(key, ttl)?;
        granted
            .map(|mut guard| guard.start_watchdog().map(|()| guard))
            .transpose()
    }

    /// One acquisition of `target` as `owner`: in the client's session, or its default session
    /// (opened if needed; a new one, within `wait`, if the server says it ended), or by TTL
    /// alone.
    pub(crate) fn acquire_target(
        &self,
        target: Target,
        owner: &Option<String>,
        ttl: Duration,
        wait: Option<Duration>,
    ) -> Result<Option<Guard>, Error> {
        let defaults = match (&self.session, &self.defaults) {
            (None, Some(defaults)) => defaults,
            _ => return self.acquire_once(target, owner, ttl, wait),
        };
        // The hold keeps its own ttl: refused as without a session (a zero one too).
        command::hold_ttl_ms(ttl, false)?;
        let deadline = wait.map(|wait| std::time::Instant::now() + wait);
        let mut attempt = 1;
        loop {
            let state = defaults.session(self)?;
            let client = Client {
                session: Some(Arc::clone(&state)),
                ..self.clone()
            };
            let wait = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
            match client.acquire_once(target.clone(), owner, ttl, wait) {
                Err(e)
                    if attempt < default_session::ATTEMPTS && default_session::session_gone(&e) =>
                {
                    defaults.retire(&state);
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    /// One acquisition of `target` as `owner` (see [`Acquisition`]) in `self.session`: the
    /// request, then what its reply means, and the clean-up a failure may need.
    fn acquire_once(
        &self,
        target: Target,
        owner: &Option<String>,
        ttl: Duration,
        wait: Option<Duration>,
    ) -> Result<Option<Guard>, Error> {
        let session = self.session.as_deref().map(SessionState::id);
        let acquisition = Acquisition::new(target, owner, ttl, wait, session)?
            .keeping_own_ttl(self.session.is_some() && self.defaults.is_some());
        let inner = &self.inner;
        let timeout = acquisition.reply_timeout(inner.io_timeout);
        let durable = inner.durable;
        if durable.is_some() && inner.durable_ok.get().is_none() {
            let version = command::server_version();
            let version = inner.with_conn(inner.io_timeout, inner.connect_timeout, &version)?;
            let _ = inner.durable_ok.set(Durable::supported(version));
        }
        if durable.is_some() && inner.durable_ok.get() == Some(&false) {
            return Err(Durable::too_old());
        }
        let then = |tokens: &Option<Vec<u64>>| match (durable, tokens) {
            (Some(durable), Some(_)) => Some(durable.wait(inner.io_timeout)),
            _ => None,
        };
        // A killed master (issue 34): the acquisition is made again, as the same owner, on the
        // slot's new master, within the caller's own wait and reply timeout.
        let pursuit = Pursuit::within(timeout);
        let (mut acquisition, mut maybe_sent) = (acquisition, false);
        let (reply, acked) = loop {
            let timeout = acquisition.reply_timeout(inner.io_timeout);
            let (reply, acked) =
                inner.with_conn_then(timeout, inner.connect_timeout, &acquisition.request(), then);
            match &reply {
                Err(failure) if pursuit.again(inner, failure, Resend::Always) => {
                    inner.pursue(&pursuit);
                    maybe_sent |= failure.maybe_sent;
                    acquisition = acquisition.resent();
                }
                _ => break (reply.map_err(|f| f.after(maybe_sent)), acked),
            }
        };
        match acquisition.settle(reply) {
            Settled::Granted(hold) => match durable.map(|d| (d, d.check(&hold, acked))) {
                Some((durable, Err((acknowledged, release)))) => {
                    let released = release.is_some_and(|release| {
                        inner
                            .with_conn(inner.io_timeout, inner.connect_timeout, &release)
                            .is_ok()
                    });
                    Err(durable.shortfall(acknowledged, released))
                }
                _ => {
                    let mut guard = Guard::new(self.clone(), hold);
                    if self.watch {
                        guard.watch()?;
                    }
                    Ok(Some(guard))
                }
            },
            Settled::Busy => Ok(None),
            Settled::Failed { error, clean_up } => {
                if let Some(release) = clean_up {
                    let _ = inner.with_conn(inner.io_timeout, inner.connect_timeout, &release);
                }
                Err(error)
            }
        }
    }
}

impl Inner {
    fn new(endpoint: Endpoint) -> Inner {
        Inner {
            endpoint,
            idle: Mutex::new(Vec::new()),
            feed: std::sync::OnceLock::new(),
        }
    }

    /// After `error`: whether this cluster node's client now points at the slot's master
    /// ([`Endpoint::follow_blocking`]); the pool of the old node's connections is emptied.
    pub(crate) fn follow(&self, error: &Error) -> bool {
        if !self.endpoint.follow_blocking(error) {
            return false;
        }
        self.forget_idle();
        true
    }

    /// One step of a [`Pursuit`] (a killed master): ask the nodes for the slot's master; if
    /// another is named, point there (the old node's connections closed), else pause.
    pub(crate) fn pursue(&self, pursuit: &Pursuit) {
        if self.endpoint.follow_slot_blocking() {
            self.forget_idle();
        } else {
            thread::sleep(pursuit.pause());
        }
    }

    /// Close the idle connections (to a node the client no longer points at).
    pub(crate) fn forget_idle(&self) {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// Run `command` on a pooled (or new) connection whose read timeout is `read_timeout`.
    ///
    /// A connection goes back to the pool only if it is still in step ([`in_step`]).
    /// A pooled connection found dead on first use (the server restarted, or closed it as idle)
    /// is replaced once by a fresh one.
    pub(crate) fn with_conn<T: 'static>(
        &self,
        read_timeout: Duration,
        connect_timeout: Duration,
        command: &Command<T>,
    ) -> Result<T, Error> {
        self.with_conn_sent(read_timeout, connect_timeout, command)
            .map_err(|failure| failure.error)
    }

    /// [`Inner::with_conn`], telling on failure whether the command may have reached the server.
    pub(crate) fn with_conn_sent<T: 'static>(
        &self,
        read_timeout: Duration,
        connect_timeout: Duration,
        command: &Command<T>,
    ) -> Result<T, Failure> {
        let none = |_: &T| None::<(Command<()>, Duration)>;
        self.with_conn_then(read_timeout, connect_timeout, command, none)
            .0
    }

    /// [`Inner::with_conn_sent`], then, if `then` asks for one given the reply, a second
    /// command on the same connection (a `WAIT` counts only its own connection's writes),
    /// read within the timeout `then` gives with it.
    pub(crate) fn with_conn_then<T: 'static, U: 'static>(
        &self,
        read_timeout: Duration,
        connect_timeout: Duration,
        command: &Command<T>,
        then: impl Fn(&T) -> Option<(Command<U>, Duration)>,
    ) -> (Result<T, Failure>, Option<Result<U, Error>>) {
        let mut follows = 0;
        let pursuit = Pursuit::within(read_timeout);
        let (mut read_timeout, mut connect_timeout) = (read_timeout, connect_timeout);
        loop {
            let (result, second) =
                self.with_conn_then_once(read_timeout, connect_timeout, command, &then);
            match &result {
                Err(failure) if follows < MAX_FOLLOWS && self.follow(&failure.error) => {
                    follows += 1
                }
                // A killed master: again on the slot's new master, within the reply timeout.
                Err(failure) if pursuit.again(self, failure, command.resend) => {
                    self.pursue(&pursuit);
                    read_timeout = pursuit.left();
                    connect_timeout = connect_timeout.min(read_timeout);
                }
                _ => return (result, second),
            }
        }
    }

    fn with_conn_then_once<T: 'static, U: 'static>(
        &self,
        read_timeout: Duration,
        connect_timeout: Duration,
        command: &Command<T>,
        then: &impl Fn(&T) -> Option<(Command<U>, Duration)>,
    ) -> (Result<T, Failure>, Option<Result<U, Error>>) {
        let pooled = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let mut conn = match pooled {
            Some(mut conn) => match self.run(&mut conn, read_timeout, command) {
                Err(Error::Connection(e)) if e.is_connection_dropped() => None, // stale
                result => Some((conn, result)),
            },
            None => None,
        };
        if conn.is_none() {
            let mut fresh = match self.connect(connect_timeout) {
                Ok(fresh) => fresh,
                Err(e) => return (Err(Failure::unsent(e)), None),
            };
            let result = self.run(&mut fresh, read_timeout, command);
            conn = Some((fresh, result));
        }
        let (mut conn, result) = conn.expect("a connection was opened above");
        let second = match &result {
            Ok(reply) => then(reply).map(|(next, timeout)| self.run(&mut conn, timeout, &next)),
            Err(_) => None,
        };
        if !second.as_ref().is_none_or(in_step) {
            // The follow-up left the connection out of step: close it rather than pool it.
            return (result.map_err(Failure::sent), second);
        }
        (self.finish(conn, result), second)
    }

    fn run<T: 'static>(
        &self,
        conn: &mut Connection,
        read_timeout: Duration,
        command: &Command<T>,
    ) -> Result<T, Error> {
        conn.set_read_timeout(Some(read_timeout.max(Duration::from_millis(1))))
            .map_err(Error::from_redis)?;
        conn.set_write_timeout(Some(self.io_timeout))
            .map_err(Error::from_redis)?;
        command.run(conn)
    }

    fn finish<T: 'static>(&self, conn: Connection, result: Result<T, Error>) -> Result<T, Failure> {
        if in_step(&result) && conn.is_open() {
            let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
            if idle.len() < MAX_IDLE {
                idle.push(conn);
            }
        }
        result.map_err(Failure::sent)
    }
}
