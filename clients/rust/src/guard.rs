//! [`Guard`]: a held lock, released when dropped, optionally renewed by a watchdog.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::client::Client;
use crate::command::{self, Command};
use crate::error::Error;
use crate::feed::HoldWatch;
use crate::hold::Hold;
use crate::subscriber::{Subscriber, Watching};
use crate::watchdog::{Lease, LossReason, LossSignal, Report, Watchdog};

/// A lock held on one server: an exclusive lock ([`Client::acquire`]), a shared hold
/// ([`Semaphore`](crate::Semaphore), [`ReadWriteLock`](crate::ReadWriteLock)), or exclusive
/// locks on several keys ([`MultiLock`](crate::MultiLock)). Dropping it releases the lock (best
/// effort).
///
/// The guard is `Send` (it can move to another thread) but not `Sync`: one thread at a time
/// uses it, since it owns the receiving end of the loss channel.
///
/// Without a watchdog the lock lapses at its deadline, `ttl` after the grant, unless
/// [`Guard::extend`] moves it. With one ([`Guard::start_watchdog`]) it is renewed until the guard
/// is dropped or released, and a failed renewal is reported through [`Guard::lost`].
pub struct Guard {
    /// The server, for extend, release and fence checks.
    client: Client,
    /// The keys, owner, tokens and TTL; shared with the watchdog, which renews with the TTL.
    hold: Arc<Hold>,
    /// The renewal thread, if started.
    watchdog: Option<Watchdog>,
    /// Where the watchdog (or the guard's session) reports a loss: the sender side and the
    /// remembered reason.
    loss: Arc<LossSignal>,
    /// The receiving side of the loss channel.
    loss_rx: Receiver<LossReason>,
    /// The watch of the keys' change feed, if started ([`Guard::watch`]); dropped before the
    /// release.
    watching: Option<Watching>,
    /// Set once [`Guard::release`] ran, so that `Drop` does not release again.
    released: bool,
}

/// The read-only side of a guard, written once for [`Guard`] and [`crate::aio::Guard`]: both
/// keep what they hold in a field `hold: Arc<Hold>`.
macro_rules! guard_accessors {
    () => {
        /// The fencing token of this hold: larger than the token of every earlier hold of this key
        /// on this server. Pass it to the resource you write to, which checks it with
        /// `LOCK.FENCE key token` (or keeps the largest token it has seen). For several keys
        /// ([`MultiLock`](crate::MultiLock)) the largest of [`Guard::tokens`].
        pub fn token(&self) -> u64 {
            self.hold.token()
        }

        /// The fencing tokens, one per key in the order of [`Guard::keys`] (one for a single key).
        pub fn tokens(&self) -> &[u64] {
            self.hold.tokens()
        }

        /// The lock's key (for several keys, the first).
        pub fn key(&self) -> &str {
            &self.hold.keys()[0]
        }

        /// The keys held: one, or those of a [`MultiLock`](crate::MultiLock) in its order.
        pub fn keys(&self) -> &[String] {
            self.hold.keys()
        }

        /// The owner id this lock is held as (a random UUID unless [`Client::with_owner`] chose one).
        pub fn owner(&self) -> &str {
            self.hold.owner()
        }

        /// The TTL of the grant or of the last successful [`Guard::extend`]; the watchdog renews with
        /// this value.
        pub fn ttl(&self) -> Duration {
            self.hold.ttl()
        }
    };
}
#[cfg(feature = "tokio")]
pub(crate) use guard_accessors;

impl Guard {
    pub(crate) fn new(client: Client, hold: Hold) -> Guard {
        let (notify, loss_rx) = mpsc::channel();
        let loss = Arc::new(LossSignal {
            reason: Arc::new(Mutex::new(None)),
            notify,
        });
        if let Some(session) = &client.session {
            session.listen(Arc::downgrade(&loss));
        }
        Guard {
            client,
            hold: Arc::new(hold),
            watchdog: None,
            loss,
            loss_rx,
            watching: None,
            released: false,
        }
    }

    guard_accessors!();

    /// Move the deadline to now + `ttl` (`LOCK.EXTEND`). `Ok(false)`: the lock is no longer held
    /// by this guard (it expired, was deleted, or is someone else's now); the token never
    /// changes. On success the watchdog, if running, renews with `ttl` from then on.
    pub fn extend(&self, ttl: Duration) -> Result<bool, Error> {
        let (extend, ms) = self.hold.extend(ttl)?;
        let sent = std::time::Instant::now();
        Ok(self.hold.extended(ms, sent, self.run(&extend)?))
    }

    /// Release the lock now (`LOCK.RELEASE`), after stopping the watchdog. `Ok(true)`: it was
    /// held and is free now (or handed to the first waiter); `Ok(false)`: it had already been
    /// lost. On `Err` the lock lapses at its deadline.
    pub fn release(mut self) -> Result<bool, Error> {
        self.stop_watchdog();
        self.watching = None;
        self.released = true;
        self.run(&self.hold.release())
    }

    /// Ask the server whether this hold is still the live one (`LOCK.FENCE key token`; for
    /// several keys, whether every token is).
    pub fn is_held(&self) -> Result<bool, Error> {
        self.run(&self.hold.fence())
    }

    /// Run `write` only while this hold's token is the live one, in one atomic step on the server:
    /// `EVAL` of [`FENCED_CALL_LUA`](crate::FENCED_CALL_LUA), which calls `LOCK.FENCE key token`
    /// and then the command. A holder that paused past its deadline (GC, swap, SIGSTOP) and
    /// lost the lock meanwhile cannot write late: the server refuses.
    ///
    /// `write` is a command whose first argument is the key it writes, e.g.
    /// `guard.fenced::<()>(redis::cmd("SET").arg("invoice:42:total").arg(100))`; that key is the
    /// script's `KEYS[2]` (in a cluster, give it the lock's hash tag: `{invoice:42}` and
    /// `{invoice:42}:total`).
    ///
    /// - `Ok(reply)`: the command ran; its reply as a script returns it (Lua's conversions:
    ///   nil is `Value::Nil`, `OK` a status), read as `T` (`redis::Value` to take it as it is).
    /// - [`Error::StaleToken`]: the token is not the live hold (expired, released, someone
    ///   else's now); the command did not run.
    /// - [`Error::Server`]: the command's own error reply (e.g. `WRONGTYPE`), or `LOCK.FENCE`'s
    ///   (the lock key is not a lock).
    /// - [`Error::InvalidArgument`], before sending: `write` has no key, or this guard holds
    ///   several keys ([`MultiLock`](crate::MultiLock)): fence with one of them,
    ///   [`Guard::fenced_by`].
    ///
    /// As for every command of the client, a pooled connection that turns out closed on first
    /// use is replaced once and the command sent again on the new one.
    pub fn fenced<T: redis::FromRedisValue + 'static>(
        &self,
        write: &redis::Cmd,
    ) -> Result<T, Error> {
        self.run(&self.hold.fenced(None, write)?)
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
    /// let total: i64 = guard.fenced_script("return redis.call('INCRBY', KEYS[2], ARGV[2])", &["invoice:42:total"], &[5])?;
    /// ```
    pub fn fenced_script<T: redis::FromRedisValue + 'static, A: redis::ToRedisArgs>(
        &self,
        body: &str,
        keys: &[&str],
        args: &[A],
    ) -> Result<T, Error> {
        let args: Vec<Vec<u8>> = args.iter().flat_map(|a| a.to_redis_args()).collect();
        self.run(&self.hold.fenced_script(body, keys, &args)?)
    }

    /// [`Guard::fenced`] with the token of `lock`, one of [`Guard::keys`]: how a
    /// [`MultiLock`](crate::MultiLock) guard fences a write, with the token of the key that
    /// guards it ([`Error::InvalidArgument`] for a key the guard does not hold).
    pub fn fenced_by<T: redis::FromRedisValue + 'static>(
        &self,
        lock: &str,
        write: &redis::Cmd,
    ) -> Result<T, Error> {
        self.run(&self.hold.fenced(Some(lock), write)?)
    }

    /// Start renewing the lock every third of its TTL ([`Guard::ttl`]) in a background thread.
    ///
    /// The watchdog stops when the guard is released or dropped, including when a panic unwinds
    /// the holder's stack, and when a renewal fails: then it reports a [`LossReason`] through
    /// [`Guard::lost`] / [`Guard::wait_lost`] / [`Guard::is_lost`], and renews no more. Each
    /// renewal may take at most the period (read and connect timeouts), so a server that stops
    /// answering is reported within two thirds of the TTL after the last renewal, before the
    /// deadline. A running watchdog is replaced.
    ///
    /// A lock taken in a session needs none: the session's keepalive covers it. A watchdog
    /// there renews the hold's own deadline; for a hold without one (ttl 0) it is refused.
    pub fn start_watchdog(&mut self) -> Result<(), Error> {
        command::check_renewable(&self.hold)?;
        self.spawn_watchdog(None)
    }

    /// [`Guard::start_watchdog`] with a chosen `period` between renewals, which must be shorter
    /// than the TTL (a third or less is advisable: a renewal that is one period late must still
    /// land before the deadline).
    pub fn start_watchdog_every(&mut self, period: Duration) -> Result<(), Error> {
        command::check_renewable(&self.hold)?;
        command::check_watchdog_period(period, self.ttl())?;
        self.spawn_watchdog(Some(period))
    }

    /// Stop renewing (the lock stays held until its deadline). Returns after the watchdog
    /// thread has ended, so no renewal is in flight. Does nothing if none runs.
    pub fn stop_watchdog(&mut self) {
        if let Some(mut watchdog) = self.watchdog.take() {
            watchdog.stop();
        }
    }

    /// True while a watchdog thread is attached (it may have stopped after reporting a loss).
    pub fn has_watchdog(&self) -> bool {
        self.watchdog.is_some()
    }

    /// The channel on which the watchdog reports a loss, once. Use it to wait for a loss next to
    /// other work (`try_recv` in a loop, `recv_timeout`). Nothing is sent without a watchdog, a
    /// watch of the change feed ([`Guard::watch`]) or a session, and the channel stays open as
    /// long as the guard lives. A guard taken in a
    /// session is sent the session's loss ([`LossReason::SessionEnded`],
    /// [`LossReason::BoundConnectionClosed`], or a failed keepalive as
    /// [`LossReason::ExtendFailed`]).
    pub fn lost(&self) -> &Receiver<LossReason> {
        &self.loss_rx
    }

    /// True once the watchdog has reported a loss. The holder must stop acting on the lock.
    pub fn is_lost(&self) -> bool {
        self.loss_reason().is_some()
    }

    /// The loss the watchdog reported, if any.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.loss
            .reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Wait up to `timeout` for the watchdog to report a loss; `None` if it did not (the lock
    /// was renewed all along, or no watchdog runs). Returns at once if the loss was already
    /// reported, even if its message was taken from [`Guard::lost`].
    pub fn wait_lost(&self, timeout: Duration) -> Option<LossReason> {
        if let Some(reason) = self.loss_reason() {
            return Some(reason);
        }
        match self.loss_rx.recv_timeout(timeout) {
            Ok(reason) => Some(reason),
            // The guard keeps a sender, so the channel is never disconnected while it lives.
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => self.loss_reason(),
        }
    }

    /// Watch the lock's keys through the server's change feed while the guard lives (one watch
    /// connection and one pub/sub connection per [`Client`], shared by its guards): the loss
    /// signal ([`Guard::lost`], [`Guard::wait_lost`], [`Guard::is_lost`]) then fires as soon as
    /// the feed reports a loss the server caused: [`LossReason::Expired`],
    /// [`LossReason::SessionEnded`] (`lost`), [`LossReason::Deleted`], [`LossReason::Flushed`],
    /// [`LossReason::Swapped`], [`LossReason::Demoted`], [`LossReason::Released`] (by someone
    /// else), [`LossReason::Taken`] (granted to another owner); at the client's own deadline
    /// ([`LossReason::Expired`]: the grant's or the last successful extend's sending plus the
    /// TTL, as the server may notice an expiry late); and when the feed's connection is lost
    /// ([`LossReason::FeedDisconnected`]). While renewals succeed (a watchdog, or
    /// [`Guard::extend`]) it stays silent.
    ///
    /// A blocking call: `LOCK.WATCH` for each key, the first of them also connects. The state
    /// of each key is read once the subscription is in place (`LOCK.INFO`), so a loss between
    /// the grant and the watch is reported too ([`LossReason::NotHeld`]). Watching again does
    /// nothing; [`Client::watch_losses`] watches every guard as it is granted.
    pub fn watch(&mut self) -> Result<(), Error> {
        if self.watching.is_some() {
            return Ok(());
        }
        let inner = &self.client.inner;
        let subscriber = Subscriber::of(inner, &inner.feed);
        let report = Arc::clone(&self.loss) as Arc<dyn Report>;
        let listener = Arc::new(HoldWatch::new(Arc::clone(&self.hold), report));
        self.watching = Some(subscriber.watch(self.hold.keys(), listener)?);
        Ok(())
    }

    /// True while the guard watches its keys' feed ([`Guard::watch`]).
    pub fn is_watching(&self) -> bool {
        self.watching.is_some()
    }

    fn spawn_watchdog(&mut self, period: Option<Duration>) -> Result<(), Error> {
        self.stop_watchdog();
        let lease = Lease {
            client: Arc::clone(&self.client.inner),
            hold: Arc::clone(&self.hold) as Arc<dyn crate::watchdog::Renewable>,
            period,
            loss: Arc::clone(&self.loss),
        };
        self.watchdog = Some(Watchdog::spawn(lease).map_err(Error::Spawn)?);
        Ok(())
    }

    fn run<T: 'static>(&self, command: &Command<T>) -> Result<T, Error> {
        let inner = &self.client.inner;
        inner.with_conn(inner.io_timeout, inner.connect_timeout, command)
    }
}

impl Drop for Guard {
    /// Stop the watchdog, then release the lock unless [`Guard::release`] already did. Errors
    /// are written to stderr: the lock then lapses at its deadline.
    fn drop(&mut self) {
        self.stop_watchdog();
        self.watching = None;
        if self.released {
            return;
        }
        if let Err(e) = self.run(&self.hold.release()) {
            report_release_failure(self.hold.keys(), &e);
        }
    }
}

/// Run `write` only while `token` is the live hold on `lock`, on a connection of your own: the
/// fenced write of [`Guard::fenced`] for a token held elsewhere (another process, a job record),
/// with the same replies and errors. It is the Python package's `fenced_call(client, lock_key,
/// token, command, key, *args)`, with the command and its key in `write`.
///
/// ```no_run
/// # fn main() -> Result<(), redis_lock_client::Error> {
/// let mut conn = redis::Client::open("redis://127.0.0.1:6379/")
///     .and_then(|c| c.get_connection())
///     .expect("connected");
/// let token = 3678192830795776; // handed over by the holder
/// let stock: i64 = redis_lock_client::fenced_call(
///     &mut conn,
///     "{sku:42}:lock",
///     token,
///     redis::cmd("DECRBY").arg("{sku:42}:stock").arg(1),
/// )?;
/// # let _ = stock;
/// # Ok(())
/// # }
/// ```
pub fn fenced_call<T: redis::FromRedisValue + 'static>(
    conn: &mut impl redis::ConnectionLike,
    lock: &str,
    token: u64,
    write: &redis::Cmd,
) -> Result<T, Error> {
    command::fenced(lock, token, write)?.run(conn)
}

/// `Debug` for a guard type with the methods of [`guard_accessors`], a field `watchdog` and
/// `is_lost()`; written once for [`Guard`] and [`crate::aio::Guard`].
macro_rules! impl_guard_debug {
    ($guard:ty) => {
        impl std::fmt::Debug for $guard {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct("Guard")
                    .field("keys", &self.keys())
                    .field("owner", &self.owner())
                    .field("tokens", &self.tokens())
                    .field("ttl", &self.ttl())
                    .field("watchdog", &self.watchdog.is_some())
                    .field("lost", &self.is_lost())
                    .finish()
            }
        }
    };
}
#[cfg(feature = "tokio")]
pub(crate) use impl_guard_debug;

impl_guard_debug!(Guard);

/// What a guard's `Drop` does with a release that failed: the lock then lapses at its deadline.
pub(crate) fn report_release_failure(keys: &[String], error: &Error) {
    eprintln!(
        "redis-lock-client: could not release lock {keys:?} (it lapses at its deadline): {error}"
    );
}
