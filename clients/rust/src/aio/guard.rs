//! The async [`Guard`]: a held lock, released when dropped, optionally renewed by a watchdog task.

use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::watch;

use super::client::{send_now, Client};
use super::watchdog::{Lease, Watchdog};
use crate::command::{self, Command};
use crate::error::Error;
use crate::feed::HoldWatch;
use crate::guard::report_release_failure;
use crate::hold::Hold;
use crate::subscriber::{Subscriber, Watching};
use crate::watchdog::{LossReason, Report};

/// A lock held on one server; the async counterpart of [`crate::Guard`].
///
/// Release it with [`Guard::release`]`.await`, which reports the outcome and, with a watchdog,
/// waits until no renewal is in flight. Dropping it also releases the lock: Rust has no async
/// `Drop`, so `drop` aborts the watchdog task and queues `LOCK.RELEASE` without waiting for the
/// reply (a task awaits it; errors go to stderr). When `drop` runs inside a runtime and the
/// client's connection is open, the release is queued on that connection before `drop` returns,
/// so a later command from the same client reaches the server after it (acquiring the key again
/// finds it free); the runtime writes it out once it runs. Otherwise it is sent by a task on the
/// runtime the lock was acquired on; if that runtime has shut down, nothing is sent and the lock
/// lapses at its deadline.
pub struct Guard {
    /// The server, for extend, release and fence checks.
    client: Client,
    /// The keys, owner, tokens and TTL; shared with the watchdog, which renews with the TTL.
    hold: Arc<Hold>,
    /// The renewal task, if started.
    watchdog: Option<Watchdog>,
    /// Where the watchdog publishes a loss; receivers come from [`Guard::loss_watch`].
    loss: Arc<watch::Sender<Option<LossReason>>>,
    /// The runtime the lock was acquired on: the watchdog and the release on drop run there.
    runtime: Handle,
    /// The watch of the keys' change feed, if started ([`Guard::watch`]).
    watching: Option<Watching>,
    /// Set once [`Guard::release`] ran, so that `Drop` does not release again.
    released: bool,
}

impl Guard {
    /// A guard for a grant just received; must be called inside the runtime.
    pub(crate) fn new(client: Client, hold: Hold) -> Guard {
        let loss = Arc::new(watch::Sender::new(None));
        if let Some(session) = &client.session {
            session.listen(Arc::downgrade(&loss));
        }
        Guard {
            client,
            hold: Arc::new(hold),
            watchdog: None,
            loss,
            runtime: Handle::current(),
            watching: None,
            released: false,
        }
    }

    crate::guard::guard_accessors!();

    /// Move the deadline to now + `ttl` (`LOCK.EXTEND`); `Ok(false)`: no longer held by this
    /// guard. On success the watchdog, if running, renews with `ttl` from then on.
    pub async fn extend(&self, ttl: Duration) -> Result<bool, Error> {
        let (extend, ms) = self.hold.extend(ttl)?;
        let sent = std::time::Instant::now();
        Ok(self.hold.extended(ms, sent, self.run(&extend).await?))
    }

    /// Stop the watchdog and wait for its end, then release the lock (`LOCK.RELEASE`).
    /// `Ok(true)`: it was held and is free now (or handed to the first waiter); `Ok(false)`: it
    /// had already been lost. On `Err` the lock lapses at its deadline.
    pub async fn release(mut self) -> Result<bool, Error> {
        self.stop_watchdog().await;
        if let Some(watching) = self.watching.take() {
            let unwatch = watching.detach();
            let _ = tokio::task::spawn_blocking(move || unwatch.run()).await;
        }
        self.released = true;
        self.run(&self.hold.release()).await
    }

    /// Ask the server whether this hold is still the live one (`LOCK.FENCE key token`; for
    /// several keys, whether every token is).
    pub async fn is_held(&self) -> Result<bool, Error> {
        self.run(&self.hold.fence()).await
    }

    /// Run `write` only while this hold's token is the live one, in one atomic step (`EVAL` of
    /// [`FENCED_CALL_LUA`](crate::FENCED_CALL_LUA)); see [`crate::Guard::fenced`] for `write`,
    /// the replies and the errors ([`Error::StaleToken`]: refused, the command did not run).
    pub async fn fenced<T: redis::FromRedisValue + 'static>(
        &self,
        write: &redis::Cmd,
    ) -> Result<T, Error> {
        self.run(&self.hold.fenced(None, write)?).await
    }

    /// Run a Lua script of one's own only while this hold's token is the live one, in one
    /// atomic step: `body` runs after [`FENCE_CHECK_LUA`](crate::FENCE_CHECK_LUA), with the lock as
    /// `KEYS[1]` and the token as `ARGV[1]`, `keys` from `KEYS[2]` and `args` from `ARGV[2]` (in a
    /// cluster, give `keys` the lock's hash tag). `Ok(reply)` as the script returns it, read as
    /// `T`; [`Error::StaleToken`] when the token is not the live hold (the body did not run), as
    /// from [`Guard::fenced`] and the other clients' fenced scripts; [`Error::InvalidArgument`]
    /// for a guard of several keys.
    ///
    /// ```ignore
    /// let total: i64 = guard.fenced_script("return redis.call('INCRBY', KEYS[2], ARGV[2])", &["invoice:42:total"], &[5]).await?;
    /// ```
    pub async fn fenced_script<T: redis::FromRedisValue + 'static, A: redis::ToRedisArgs>(
        &self,
        body: &str,
        keys: &[&str],
        args: &[A],
    ) -> Result<T, Error> {
        let args: Vec<Vec<u8>> = args.iter().flat_map(|a| a.to_redis_args()).collect();
        self.run(&self.hold.fenced_script(body, keys, &args)?).await
    }

    /// [`Guard::fenced`] with the token of `lock`, one of [`Guard::keys`]: how a
    /// [`MultiLock`](super::MultiLock) guard fences a write (see [`crate::Guard::fenced_by`]).
    pub async fn fenced_by<T: redis::FromRedisValue + 'static>(
        &self,
        lock: &str,
        write: &redis::Cmd,
    ) -> Result<T, Error> {
        self.run(&self.hold.fenced(Some(lock), write)?).await
    }

    /// Start renewing the lock every third of its TTL in a task on the guard's runtime (see
    /// [`crate::Guard::start_watchdog`]). A loss is published once, to [`Guard::lost`],
    /// [`Guard::is_lost`] and the receivers of [`Guard::loss_watch`]; the task then renews no
    /// more. A running watchdog is replaced (the old task is aborted).
    /// A lock taken in a session needs none (see [`crate::Guard::start_watchdog`]); for a
    /// session hold with ttl 0 it is refused.
    pub fn start_watchdog(&mut self) -> Result<(), Error> {
        command::check_renewable(&self.hold)?;
        self.spawn_watchdog(None);
        Ok(())
    }

    /// [`Guard::start_watchdog`] with a chosen `period`, which must be shorter than the TTL.
    pub fn start_watchdog_every(&mut self, period: Duration) -> Result<(), Error> {
        command::check_renewable(&self.hold)?;
        command::check_watchdog_period(period, self.ttl())?;
        self.spawn_watchdog(Some(period));
        Ok(())
    }

    /// Stop renewing (the lock stays held until its deadline). Returns once the watchdog task
    /// has ended, so no renewal is in flight. Does nothing if none runs.
    pub async fn stop_watchdog(&mut self) {
        if let Some(watchdog) = self.watchdog.take() {
            watchdog.stop().await;
        }
    }

    /// True while a watchdog task is attached (it may have stopped after reporting a loss).
    pub fn has_watchdog(&self) -> bool {
        self.watchdog.is_some()
    }

    /// True once the watchdog has reported a loss. The holder must stop acting on the lock.
    pub fn is_lost(&self) -> bool {
        self.loss.borrow().is_some()
    }

    /// The loss the watchdog reported, if any.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.loss.borrow().clone()
    }

    /// Wait until the watchdog (or the feed: [`Guard::watch`]; or the session) reports a loss,
    /// and return it (at once if it already did). Without any of them, or while the hold lives,
    /// it waits forever: use it in `tokio::select!` next to the work, or under
    /// `tokio::time::timeout`.
    pub async fn lost(&self) -> LossReason {
        let mut loss = self.loss.subscribe();
        let reason = match loss.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone(),
            // The guard owns the sender, so it cannot be closed while `self` lives.
            Err(_) => None,
        };
        match reason {
            Some(reason) => reason,
            None => std::future::pending().await,
        }
    }

    /// A receiver of the loss, for other tasks that act on the lock: it holds `None` until the
    /// watchdog publishes `Some(reason)` (`changed().await`, `wait_for(Option::is_some)`). It
    /// reports the sender closed once the guard is gone.
    pub fn loss_watch(&self) -> watch::Receiver<Option<LossReason>> {
        self.loss.subscribe()
    }

    /// Watch the lock's keys through the server's change feed while the guard lives (see
    /// [`crate::Guard::watch`]): the loss is published to [`Guard::lost`], [`Guard::is_lost`]
    /// and [`Guard::loss_watch`] as soon as the feed reports it, at the client's own deadline
    /// with no successful renewal, or when the feed's connection is lost. The feed's
    /// connections are a thread (shared by the client's guards); its blocking calls run on
    /// tokio's blocking pool.
    pub async fn watch(&mut self) -> Result<(), Error> {
        if self.watching.is_some() {
            return Ok(());
        }
        let inner = Arc::clone(&self.client.inner);
        let report = Arc::clone(&self.loss) as Arc<dyn Report>;
        let listener = Arc::new(HoldWatch::new(Arc::clone(&self.hold), report));
        let keys = self.hold.keys().to_vec();
        let watching = tokio::task::spawn_blocking(move || {
            Subscriber::of(&inner, &inner.feed).watch(&keys, listener)
        })
        .await
        .map_err(|_| super::client::runtime_gone())??;
        self.watching = Some(watching);
        Ok(())
    }

    /// True while the guard watches its keys' feed ([`Guard::watch`]).
    pub fn is_watching(&self) -> bool {
        self.watching.is_some()
    }

    fn spawn_watchdog(&mut self, period: Option<Duration>) {
        if let Some(old) = self.watchdog.take() {
            old.abort();
        }
        let lease = Lease {
            client: Arc::clone(&self.client.inner),
            hold: Arc::clone(&self.hold) as Arc<dyn crate::watchdog::Renewable>,
            period,
            loss: Arc::clone(&self.loss),
        };
        self.watchdog = Some(Watchdog::spawn(lease, &self.runtime));
    }

    async fn run<T: 'static>(&self, command: &Command<T>) -> Result<T, Error> {
        let inner = &self.client.inner;
        inner
            .run(inner.io_timeout, inner.connect_timeout, command)
            .await
            .map_err(|failure| failure.error)
    }
}

impl Drop for Guard {
    /// Abort the watchdog, then send `LOCK.RELEASE` unless [`Guard::release`] already did (see
    /// the type's documentation). A renewal the aborted task had already sent reaches the server
    /// before the release (one connection, in order); one it was about to send may arrive after
    /// it and is refused, since the owner id is this hold's alone (unless
    /// [`Client::with_owner`] chose it).
    fn drop(&mut self) {
        if let Some(watchdog) = self.watchdog.take() {
            watchdog.abort();
        }
        if let Some(watching) = self.watching.take() {
            // The listener hears nothing from now on; the server's `LOCK.UNWATCH` may wait on
            // the watch connection: off the runtime's threads.
            let unwatch = watching.detach();
            drop(self.runtime.spawn_blocking(move || unwatch.run()));
        }
        if self.released {
            return;
        }
        let (inner, hold) = (Arc::clone(&self.client.inner), Arc::clone(&self.hold));
        send_now(&self.runtime, async move {
            let reply = inner
                .run(inner.io_timeout, inner.connect_timeout, &hold.release())
                .await;
            if let Err(failure) = reply {
                report_release_failure(hold.keys(), &failure.error);
            }
        });
    }
}

crate::guard::impl_guard_debug!(Guard);

/// Run `write` only while `token` is the live hold on `lock`, on an async connection of your
/// own (e.g. a `redis::aio::MultiplexedConnection`): the async [`crate::fenced_call`], with
/// the same replies and errors.
pub async fn fenced_call<T: redis::FromRedisValue + 'static>(
    conn: &mut impl redis::aio::ConnectionLike,
    lock: &str,
    token: u64,
    write: &redis::Cmd,
) -> Result<T, Error> {
    let command = command::fenced(lock, token, write)?;
    command.read(command.cmd.query_async(conn).await)
}
