//! The async [`Client`]: one server, one multiplexed connection for every short command, and a
//! small pool of connections for blocking acquires.

use std::future::{poll_fn, Future};
use std::io;
use std::pin::{pin, Pin};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisResult, Value};
use tokio::runtime::Handle;
use tokio::sync::oneshot;

use super::default_session::Defaults;
use super::guard::Guard;
use super::session::Session;
use crate::client::{Endpoint, Next, Pursuit, MAX_FOLLOWS, MAX_IDLE};
use crate::command::{self, in_step, Command, Failure, Resend};
use crate::error::Error;
use crate::hold::{Acquisition, Durable, Settled, Target};
use crate::session::SessionState;

/// A handle to one Redis server that has the redis-lock module loaded; the async counterpart of
/// [`crate::Client`], with the same timeouts, owners and outcomes.
///
/// Cheap to clone: clones share the connections. Nothing is connected until the first command,
/// which must run inside a tokio runtime (with time enabled).
///
/// Connections: every command except a blocking acquire goes through one multiplexed
/// connection, so the requests of all guards and watchdogs of this client reach the server in
/// the order they were issued. A blocking acquire takes a connection of its own for the wait
/// (the server answers nothing else on a connection while it waits in the queue), whose
/// response timeout is `wait` plus the I/O timeout.
#[derive(Clone)]
pub struct Client {
    /// The server and the connections, shared by clones and by the guards and watchdogs.
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

/// What a [`Client`] and its guards share.
pub(crate) struct Inner {
    /// The server and the timeouts, as for the sync client (`inner.io_timeout` reads through).
    endpoint: Endpoint,
    /// The multiplexed connection for short commands, once opened; forgotten after an I/O
    /// error or a timeout, so that the next command opens a new one.
    shared: Mutex<Option<MultiplexedConnection>>,
    /// Idle connections for blocking acquires that got their reply.
    idle: Mutex<Vec<Waiter>>,
    /// The change feed's connections and thread (the sync client's: a thread in both APIs),
    /// started by the first watch.
    pub(crate) feed: std::sync::OnceLock<Arc<crate::subscriber::Subscriber>>,
}

impl std::ops::Deref for Inner {
    type Target = Endpoint;

    fn deref(&self) -> &Endpoint {
        &self.endpoint
    }
}

impl Client {
    /// A client for the server at `url` (see [`crate::Client::open`]). Only parses the URL.
    pub fn open(url: &str) -> Result<Client, Error> {
        Ok(Client::from_parts(Endpoint::open(url)?, None, None))
    }

    /// The same server with other timeouts (see [`crate::Client::with_timeouts`]). The returned
    /// client has connections of its own.
    pub fn with_timeouts(self, connect: Duration, io: Duration) -> Client {
        let endpoint = self.inner.with_timeouts(connect, io);
        Client {
            watch: self.watch,
            defaults: self.defaults.as_ref().map(|_| Arc::default()),
            ..Client::from_parts(endpoint, self.owner, self.session)
        }
    }

    /// The same server, each grant acknowledged by `replicas` replicas before an acquire
    /// succeeds (see [`crate::Client::durable`]). The returned client has connections of its
    /// own.
    pub fn durable(self, replicas: u32, timeout: Duration) -> Client {
        let endpoint = self.inner.with_durable(replicas, timeout);
        Client {
            watch: self.watch,
            defaults: self.defaults.as_ref().map(|_| Arc::default()),
            ..Client::from_parts(endpoint, self.owner, self.session)
        }
    }

    /// The same server, with every acquisition made as `owner` (see
    /// [`crate::Client::with_owner`]).
    pub fn with_owner(self, owner: impl Into<String>) -> Client {
        Client {
            owner: Some(owner.into()),
            ..self
        }
    }

    /// The same server, with every acquisition made in `session` (see
    /// [`crate::Client::with_session`]).
    pub fn with_session(&self, session: &Session) -> Client {
        Client {
            session: Some(Arc::clone(session.state())),
            // (Session and defaults both set means "in the default session": see acquire_target.)
            defaults: None,
            ..self.clone()
        }
    }

    /// The same server and connections, every acquisition holding by its TTL alone: no
    /// default session (see [`crate::Client::without_session`]).
    pub fn without_session(&self) -> Client {
        Client {
            session: None,
            defaults: None,
            ..self.clone()
        }
    }

    /// Close this client's default sessions now and wait for the replies (see
    /// [`crate::Client::close`]). Dropping the last clone closes them too, by a task.
    pub async fn close(&self) {
        if let Some(defaults) = &self.defaults {
            defaults.close().await;
        }
    }

    /// The same server, with every guard watching its keys' change feed while held (see
    /// [`crate::Client::watch_losses`] and [`Guard::watch`]).
    pub fn watch_losses(self) -> Client {
        Client {
            watch: true,
            ..self
        }
    }

    /// Follow every change of the exclusive holder of any lock `key`: the async
    /// [`Observer`](super::Observer) of [`Election::observe`](crate::Election), where a change's
    /// `leader` is the holder (`value` its owner, `term` its token), or `None` while nobody holds
    /// it. The first change is the state when it started. Bound a wait for the next change with
    /// `tokio::time::timeout`.
    pub async fn watch(&self, key: &str) -> Result<super::Observer, Error> {
        crate::Election::new(self, key, Duration::ZERO)
            .observe()
            .await
    }

    /// In a Redis Cluster: a client for the node that serves `key` (see
    /// [`crate::Client::for_key`]), with connections of its own. Like the sync client's, it
    /// follows a planned failover of its slot (issue 34): a command that meets `MOVED`,
    /// `READONLY` or a waiter's role-change `UNBLOCKED` is sent again to the slot's master, so
    /// sessions' keepalives, watchdogs' renewals and queued waiters go on there, and a bound
    /// session re-attaches there. A killed master is followed as the sync client's (the seed's
    /// `CLUSTER SLOTS`, asked on the runtime), within each call's own time.
    pub async fn for_key(&self, key: &str) -> Result<Client, Error> {
        // A client of its own for the node, even when it is this client's: following a
        // failover (or this probe's `MOVED`) repoints a client's endpoint, and two keys'
        // clients sharing one endpoint would drag each other to the wrong node.
        let inner = &self.inner;
        let endpoint = inner
            .with_timeouts(inner.connect_timeout, inner.io_timeout)
            .for_cluster_key(inner, key);
        let address = endpoint.redis().get_connection_info().addr.to_string();
        let mut client = Client::from_parts(endpoint, self.owner.clone(), None);
        client.watch = self.watch;
        // One default session per node: the node's clients share it.
        client.defaults = self.defaults.as_ref().map(|d| d.node(address));
        let node = &client.inner;
        node.run(
            node.io_timeout,
            node.connect_timeout,
            &command::fence(key, 1),
        )
        .await
        .map_err(|failure| failure.error)?;
        Ok(client)
    }

    /// Try once to take the lock `key` for `ttl`, without waiting: `Ok(Some(guard))` granted,
    /// `Ok(None)` held by someone else, `Err` a failure (see [`crate::Client::acquire`]).
    ///
    /// Cancel-safe: if this future is dropped before it completes (a timeout, a `select!`), a
    /// grant that arrives anyway is released at once, by a task that runs on.
    pub async fn acquire(&self, key: &str, ttl: Duration) -> Result<Option<Guard>, Error> {
        let target = Target::exclusive(key);
        self.acquire_target(target, &self.owner, ttl, None).await
    }

    /// Take the lock `key` for `ttl`, waiting up to `wait` in the key's FIFO queue on the server
    /// with one `LOCK.ACQUIRE ... BLOCK wait-ms` (see [`crate::Client::acquire_blocking`]).
    ///
    /// The wait is never cut short or sliced by the client: the connection that carries it
    /// waits `wait` plus the I/O timeout for the reply. Cancel-safe as [`Client::acquire`]: if
    /// this future is dropped, the waiter leaves the server's queue at once (`CLIENT UNBLOCK`
    /// on the shared connection), and a grant it got just before is released.
    pub async fn acquire_blocking(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Guard>, Error> {
        let target = Target::exclusive(key);
        self.acquire_target(target, &self.owner, ttl, Some(wait))
            .await
    }

    /// [`Client::acquire`], then [`Guard::start_watchdog`] on the granted guard.
    pub async fn acquire_with_watchdog(
        &self,
        key: &str,
        ttl: Duration,
    ) -> Result<Option<Guard>, Error> {
        let granted = self.acquire(key, ttl).await?;
        granted
            .map(|mut guard| guard.start_watchdog().map(|()| guard))
            .transpose()
    }

    fn from_parts(
        endpoint: Endpoint,
        owner: Option<String>,
        session: Option<Arc<SessionState>>,
    ) -> Client {
        Client {
            inner: Arc::new(Inner {
                endpoint,
                shared: Mutex::new(None),
                idle: Mutex::new(Vec::new()),
                feed: std::sync::OnceLock::new(),
            }),
            owner,
            session,
            defaults: Some(Arc::default()),
            watch: false,
        }
    }

    /// One acquisition of `target` as `owner`: in the client's session, or its default session
    /// (opened if needed; a new one, within `wait`, if the server says it ended), or by TTL
    /// alone (see [`crate::Client`]'s).
    pub(crate) async fn acquire_target(
        &self,
        target: Target,
        owner: &Option<String>,
        ttl: Duration,
        wait: Option<Duration>,
    ) -> Result<Option<Guard>, Error> {
        let defaults = match (&self.session, &self.defaults) {
            (None, Some(defaults)) => defaults,
            _ => return self.acquire_once(target, owner, ttl, wait).await,
        };
        command::hold_ttl_ms(ttl, false)?;
        let deadline = wait.map(|wait| std::time::Instant::now() + wait);
        let mut attempt = 1;
        loop {
            let state = defaults.session(self).await?;
            let client = Client {
                session: Some(Arc::clone(&state)),
                ..self.clone()
            };
            let wait = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
            match client.acquire_once(target.clone(), owner, ttl, wait).await {
                Err(e)
                    if attempt < crate::default_session::ATTEMPTS
                        && crate::default_session::session_gone(&e) =>
                {
                    defaults.retire(&state).await;
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    /// One acquisition of `target` as `owner` (see [`Acquisition`]) in `self.session`,
    /// cancel-safe.
    ///
    /// The request runs in a task of its own that hands over a Guard, never a bare token: if the
    /// caller stops waiting, the guard is dropped in the task (or in the channel) and releases
    /// the lock, so a cancelled acquire leaves no grant behind.
    async fn acquire_once(
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
        if inner.durable.is_some() && inner.durable_ok.get().is_none() {
            let version = command::server_version();
            let version = inner
                .run(inner.io_timeout, inner.connect_timeout, &version)
                .await
                .map_err(|failure| failure.error)?;
            let _ = inner.durable_ok.set(Durable::supported(version));
        }
        if inner.durable.is_some() && inner.durable_ok.get() == Some(&false) {
            return Err(Durable::too_old());
        }
        let client = self.clone();
        let (mut tx, rx) = oneshot::channel();
        tokio::spawn(async move {
            let inner = &client.inner;
            let durable = inner.durable;
            // A killed master (issue 34): the acquisition is made again, as the same owner, on
            // the slot's new master, within the caller's own wait and reply timeout (not once
            // the caller stopped waiting).
            let pursuit = Pursuit::within(acquisition.reply_timeout(inner.io_timeout));
            let (mut acquisition, mut maybe_sent) = (acquisition, false);
            let (reply, acked) = loop {
                let (request, timeout) = (
                    acquisition.request(),
                    acquisition.reply_timeout(inner.io_timeout),
                );
                // A durable acquire runs on a connection of its own, so that its WAIT counts
                // this grant's write and no other task's.
                let (reply, acked) = match (durable, acquisition.blocks()) {
                    (None, false) => (
                        inner.run(timeout, inner.connect_timeout, &request).await,
                        None,
                    ),
                    (None, true) => (
                        inner.run_blocking(timeout, &request, tx.closed()).await,
                        None,
                    ),
                    (Some(durable), _) => {
                        let then = |tokens: &Option<Vec<u64>>| {
                            tokens.as_ref().map(|_| durable.wait(inner.io_timeout))
                        };
                        inner
                            .run_blocking_then(timeout, &request, tx.closed(), then)
                            .await
                    }
                };
                match &reply {
                    Err(failure)
                        if !tx.is_closed() && pursuit.again(inner, failure, Resend::Always) =>
                    {
                        inner.pursue(&pursuit).await;
                        maybe_sent |= failure.maybe_sent;
                        acquisition = acquisition.resent();
                    }
                    _ => break (reply.map_err(|f| f.after(maybe_sent)), acked),
                }
            };
            let result = match acquisition.settle(reply) {
                Settled::Granted(hold) => match durable.map(|d| (d, d.check(&hold, acked))) {
                    Some((durable, Err((acknowledged, release)))) => {
                        let released = match release {
                            Some(release) => inner
                                .run(inner.io_timeout, inner.connect_timeout, &release)
                                .await
                                .is_ok(),
                            None => false,
                        };
                        Err(durable.shortfall(acknowledged, released))
                    }
                    _ => {
                        let mut guard = Guard::new(client.clone(), hold);
                        match client.watch {
                            true => guard.watch().await.map(|()| Some(guard)),
                            false => Ok(Some(guard)),
                        }
                    }
                },
                Settled::Busy => Ok(None),
                Settled::Failed { error, clean_up } => {
                    if let Some(release) = clean_up {
                        let _ = inner
                            .run(inner.io_timeout, inner.connect_timeout, &release)
                            .await;
                    }
                    Err(error)
                }
            };
            let _ = tx.send(result);
        });
        rx.await.unwrap_or_else(|_| Err(runtime_gone()))
    }
}

impl Inner {
    /// Run `command` on the shared multiplexed connection (opened within `connect` if there is
    /// none), waiting up to `timeout` for the reply. After an I/O error, a timeout or a malformed
    /// reply the connection is forgotten (requests already on it finish or fail on their own),
    /// and the next command opens a new one. A shared connection found dead on first use (the
    /// server restarted, or closed it as idle) is replaced once.
    ///
    /// In a cluster, an error that says the node gave up the slot ([`Inner::follow`]) sends
    /// the command again to the slot's master, as the sync client does.
    pub(crate) async fn run<T: 'static>(
        &self,
        timeout: Duration,
        connect: Duration,
        command: &Command<T>,
    ) -> Result<T, Failure> {
        let mut follows = 0;
        let pursuit = Pursuit::within(timeout);
        let (mut timeout, mut connect) = (timeout, connect);
        loop {
            let result = self.run_once(timeout, connect, command).await;
            if let Err(failure) = &result {
                if follows < MAX_FOLLOWS && self.follow(&failure.error).await {
                    follows += 1;
                    continue;
                }
                // A killed master: again on the slot's new master, within the reply timeout.
                if pursuit.again(self, failure, command.resend) {
                    self.pursue(&pursuit).await;
                    timeout = pursuit.left();
                    connect = connect.min(timeout);
                    continue;
                }
            }
            return result;
        }
    }

    async fn run_once<T: 'static>(
        &self,
        timeout: Duration,
        connect: Duration,
        command: &Command<T>,
    ) -> Result<T, Failure> {
        let shared = lock(&self.shared).clone();
        let mut fresh = shared.is_none();
        let mut conn = match shared {
            Some(conn) => conn,
            None => self.connect_shared(connect).await?,
        };
        loop {
            conn.set_response_timeout(timeout.max(Duration::from_millis(1)));
            let result = command.read(command.cmd.query_async(&mut conn).await);
            if in_step(&result) {
                return result.map_err(Failure::sent);
            }
            *lock(&self.shared) = None;
            match result {
                Err(Error::Connection(e)) if e.is_connection_dropped() && !fresh => {
                    conn = self.connect_shared(connect).await?;
                    fresh = true;
                }
                result => return result.map_err(Failure::sent),
            }
        }
    }

    /// Run a blocking `command` on a connection of its own, waiting up to `timeout` for the
    /// reply. The connection goes back to the idle pool only if it is still in step; one that
    /// timed out is closed, which also takes the waiter out of the server's queue.
    ///
    /// If `abandoned` completes first (the caller stopped waiting), the waiter is taken out of
    /// the queue with `CLIENT UNBLOCK` and the reply awaited all the same: nil, or a grant that
    /// came first (which the caller's dropped guard then releases). The server decides which,
    /// so no grant can slip through unseen, as it could if the connection were just closed.
    pub(crate) async fn run_blocking<T: 'static>(
        &self,
        timeout: Duration,
        command: &Command<T>,
        abandoned: impl Future<Output = ()>,
    ) -> Result<T, Failure> {
        let none = |_: &T| None::<(Command<()>, Duration)>;
        self.run_blocking_then(timeout, command, abandoned, none)
            .await
            .0
    }

    /// [`Inner::run_blocking`], then, if `then` asks for one given the reply, a second command
    /// on the same connection (a `WAIT` counts only its own connection's writes), read within
    /// the timeout `then` gives with it.
    ///
    /// In a cluster a waiter whose node turned replica (`UNBLOCKED ... master -> replica`) or a
    /// request that met `MOVED` is sent again to the slot's master ([`Inner::follow`]), unless
    /// the caller stopped waiting.
    pub(crate) async fn run_blocking_then<T: 'static, U: 'static>(
        &self,
        timeout: Duration,
        command: &Command<T>,
        abandoned: impl Future<Output = ()>,
        then: impl Fn(&T) -> Option<(Command<U>, Duration)>,
    ) -> (Result<T, Failure>, Option<Result<U, Error>>) {
        let mut abandoned = pin!(abandoned);
        let mut follows = 0;
        loop {
            let (result, second, gave_up) = self
                .run_blocking_then_once(timeout, command, abandoned.as_mut(), &then)
                .await;
            if let Err(failure) = &result {
                if !gave_up && follows < MAX_FOLLOWS && self.follow(&failure.error).await {
                    follows += 1;
                    continue;
                }
            }
            return (result, second);
        }
    }

    /// One try of [`Inner::run_blocking_then`]; true with it if the caller stopped waiting.
    async fn run_blocking_then_once<T: 'static, U: 'static>(
        &self,
        timeout: Duration,
        command: &Command<T>,
        mut abandoned: Pin<&mut impl Future<Output = ()>>,
        then: &impl Fn(&T) -> Option<(Command<U>, Duration)>,
    ) -> (Result<T, Failure>, Option<Result<U, Error>>, bool) {
        let pooled = lock(&self.idle).pop();
        let mut fresh = pooled.is_none();
        let mut waiter = match pooled {
            Some(waiter) => waiter,
            None => match self.open_waiter().await {
                Ok(waiter) => waiter,
                Err(e) => return (Err(Failure::unsent(e)), None, false),
            },
        };
        loop {
            let timeout = timeout.max(Duration::from_millis(1));
            waiter.conn.set_response_timeout(timeout);
            let (reply, gave_up) = self.wait(&mut waiter, command, abandoned.as_mut()).await;
            let result = command.read(reply);
            if in_step(&result) {
                let second = match result.as_ref().ok().and_then(then) {
                    Some((next, timeout)) => {
                        waiter.conn.set_response_timeout(timeout);
                        Some(next.read(next.cmd.query_async(&mut waiter.conn).await))
                    }
                    None => None,
                };
                if second.as_ref().is_none_or(in_step) {
                    let mut idle = lock(&self.idle);
                    if idle.len() < MAX_IDLE {
                        idle.push(waiter);
                    }
                }
                return (result.map_err(Failure::sent), second, gave_up);
            }
            match result {
                // A pooled connection found dead on first use: once more on a new one.
                Err(Error::Connection(e)) if e.is_connection_dropped() && !fresh && !gave_up => {
                    waiter = match self.open_waiter().await {
                        Ok(waiter) => waiter,
                        Err(e) => return (Err(Failure::unsent(e)), None, false),
                    };
                    fresh = true;
                }
                result => return (result.map_err(Failure::sent), None, gave_up),
            }
        }
    }

    /// The reply to `command` on `waiter`; true with it if `abandoned` completed first and the
    /// waiter was unblocked.
    async fn wait<T: 'static>(
        &self,
        waiter: &mut Waiter,
        command: &Command<T>,
        mut abandoned: Pin<&mut impl Future<Output = ()>>,
    ) -> (RedisResult<Value>, bool) {
        let id = waiter.id;
        let mut reply = pin!(command.cmd.query_async::<Value>(&mut waiter.conn));
        let first = poll_fn(|cx| match reply.as_mut().poll(cx) {
            Poll::Ready(reply) => Poll::Ready(Some(reply)),
            Poll::Pending => abandoned.as_mut().poll(cx).map(|()| None),
        })
        .await;
        match first {
            Some(reply) => (reply, false),
            None => {
                if let Some(id) = id {
                    let unblock = command::unblock(id);
                    let _ = self
                        .run(self.io_timeout, self.connect_timeout, &unblock)
                        .await;
                }
                (reply.await, true)
            }
        }
    }

    /// After `error`: whether this cluster node's client now points at the slot's master
    /// ([`Endpoint::follow_plan`]; the demoted node's `ROLE` asked here without blocking the
    /// runtime). The old node's connections are forgotten: requests already on them finish
    /// or fail on their own.
    pub(crate) async fn follow(&self, error: &Error) -> bool {
        let next = match self.follow_plan(error) {
            None => return false,
            Some(Next::To(next)) => next,
            Some(Next::ByRole) => match self.master_by_role().await {
                Ok(next) => next,
                Err(_) => return false,
            },
        };
        self.repoint(next);
        self.forget_connections();
        true
    }

    /// One step of a [`Pursuit`] (a killed master), as the sync client's: ask the nodes for
    /// the slot's master (`CLUSTER SLOTS`, without blocking the runtime); if another is named,
    /// point there (the old node's connections forgotten), else pause.
    pub(crate) async fn pursue(&self, pursuit: &Pursuit) {
        if self.follow_slot().await {
            self.forget_connections();
        } else {
            tokio::time::sleep(pursuit.pause()).await;
        }
    }

    /// [`Endpoint::follow_slot_blocking`] with async I/O: the nodes this client knows asked in
    /// turn, the first answer read with [`Endpoint::master_in_slots`] and [`Endpoint::adopt`].
    async fn follow_slot(&self) -> bool {
        let Some((slot, peers)) = self.slot_peers() else {
            return false;
        };
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(self.connect_timeout)
            .set_response_timeout(self.io_timeout);
        for peer in peers {
            let ranges: Result<Vec<Vec<Value>>, _> = async {
                let mut conn = peer
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async(&mut conn)
                    .await
            }
            .await;
            let Ok(ranges) = ranges else {
                continue;
            };
            let Ok(master) = self.master_in_slots(slot, ranges) else {
                continue;
            };
            return self.adopt(master);
        }
        false
    }

    fn forget_connections(&self) {
        *lock(&self.shared) = None;
        lock(&self.idle).clear();
    }

    /// The master this (demoted) node replicates now, from its `ROLE`.
    async fn master_by_role(&self) -> Result<redis::Client, Error> {
        let mut conn = self.connect(self.connect_timeout).await?;
        conn.set_response_timeout(self.io_timeout);
        let role: Vec<Value> = redis::cmd("ROLE")
            .query_async(&mut conn)
            .await
            .map_err(Error::from_redis)?;
        self.master_in_role(&role)
    }

    /// A new connection for blocking acquires, with its client id (`None` if the server does
    /// not tell it, e.g. an ACL forbids `CLIENT ID`: a cancelled wait then stays in the queue
    /// until it ends). Asking the id is part of opening it, bounded by the connect timeout.
    async fn open_waiter(&self) -> Result<Waiter, Error> {
        let mut conn = self.connect(self.connect_timeout).await?;
        conn.set_response_timeout(self.connect_timeout);
        let id = command::client_id();
        let id = match id.read(id.cmd.query_async(&mut conn).await) {
            Ok(id) => Some(id),
            Err(Error::Server(_)) => None,
            Err(e) => return Err(e),
        };
        Ok(Waiter { conn, id })
    }

    async fn connect_shared(&self, timeout: Duration) -> Result<MultiplexedConnection, Failure> {
        let conn = self.connect(timeout).await.map_err(Failure::unsent)?;
        *lock(&self.shared) = Some(conn.clone());
        Ok(conn)
    }

    /// Open a connection within `timeout`, handshake included (redis bounds the whole of it
    /// with the connection timeout).
    async fn connect(&self, timeout: Duration) -> Result<MultiplexedConnection, Error> {
        let config = AsyncConnectionConfig::new().set_connection_timeout(timeout);
        self.redis()
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(Error::from_redis)
    }
}

impl crate::bound::FollowTarget for Inner {
    fn endpoint(&self) -> &Endpoint {
        self
    }

    /// From a bound session's thread (not the runtime): `ROLE` or `CLUSTER SLOTS` (a node
    /// that is gone) on a sync connection.
    fn follow_blocking(&self, error: &Error) -> bool {
        if !self.endpoint.follow_blocking(error) && !self.endpoint.follow_gone_blocking(error) {
            return false;
        }
        self.forget_connections();
        true
    }
}

/// A connection for blocking acquires: the server answers nothing else on it while it waits.
struct Waiter {
    /// The connection (multiplexed, but used by one command at a time).
    conn: MultiplexedConnection,
    /// Its client id on the server, for `CLIENT UNBLOCK`.
    id: Option<u64>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The error for a request whose task was dropped before it answered: the runtime is shutting
/// down.
pub(crate) fn runtime_gone() -> Error {
    Error::Spawn(io::Error::other(
        "the tokio runtime shut down before the request finished",
    ))
}

/// Start `task` now and let it finish on `runtime`: for the requests a `Drop` sends.
///
/// `Drop` cannot wait. Polling the task once here queues its request on the client's
/// multiplexed connection before `drop` returns (when that connection is open: the first poll
/// of a send on `redis`'s multiplexed connection enqueues it on the channel its writer reads),
/// so a command the same client sends afterwards reaches the server after it: dropping a guard
/// and acquiring the key again from the same client finds it free. The rest (writing, the
/// reply) happens as the runtime runs, in a spawned task.
/// Outside a runtime (e.g. a guard dropped on a plain thread) the task is only spawned; if the
/// runtime has shut down, nothing is sent and the lock lapses at its deadline.
pub(crate) fn send_now(
    runtime: &Handle,
    task: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let mut task = Box::pin(task);
    if Handle::try_current().is_ok() {
        let _context = runtime.enter();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if task.as_mut().poll(&mut cx).is_ready() {
            return;
        }
    }
    drop(runtime.spawn(task));
}
