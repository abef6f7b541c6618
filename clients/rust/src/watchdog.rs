//! The lease watchdog: a thread that renews a guard's lock every fraction of its TTL and tells
//! the holder the moment a renewal fails. A [`Session`](crate::Session)'s keepalive is the same
//! thread renewing the session instead of a lock ([`Renewable`]), and reporting to every guard
//! of the session ([`Report`]).
//!
//! Its lifetime is tied to the [`Guard`](crate::Guard): the guard owns the sending half of a
//! stop channel, and the thread waits on the other half with `recv_timeout` between renewals.
//! Dropping or releasing the guard (including while a panic unwinds the holder's stack) drops the
//! sender, which wakes the thread at once; the guard then joins it before releasing the lock, so
//! no renewal can reach the server after the release.

use std::fmt;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::client::{Endpoint, Inner, Pursuit};
use crate::command::{Command, Failure, Resend};
use crate::error::Error;
use crate::hold::Hold;

/// Why the watchdog gave up a lock. It sends one and stops renewing.
#[derive(Debug, Clone)]
pub enum LossReason {
    /// `LOCK.EXTEND` answered 0: the hold had expired (e.g. this process or the server was
    /// paused past the deadline), its key was deleted, or another owner holds it now.
    NotHeld,
    /// `LOCK.EXTEND` did not get an answer: the server was unreachable or did not reply within
    /// the renewal period. The lock may still be held until its deadline, but the holder can no
    /// longer count on it, so the watchdog reports it as lost at once (before the deadline,
    /// with the default period) rather than letting the holder run past an expiry it cannot see.
    /// A session's keepalive through a cluster node's client ([`Client::for_key`]) that cannot
    /// reach its node is sent again (to the slot's new master, once the cluster names one)
    /// until the session's deadline, and only then reported: the session lives on a promoted
    /// replica.
    ///
    /// [`Client::for_key`]: crate::Client::for_key
    ExtendFailed(Arc<Error>),
    /// The hold's session is gone: its `LOCK.SESSION KEEPALIVE` answered nil (the session
    /// expired, e.g. this process was paused past its TTL; it was closed from elsewhere; or,
    /// for a bound session, its connection closed). Every hold of the session went with it.
    SessionEnded,
    /// The dedicated connection of a bound session ([`SessionBuilder::bound`]) closed (the
    /// server closed it: `CLIENT KILL`, an idle `timeout`, a restart; or the network failed).
    /// The server ends a bound session the moment that connection closes, with every hold in it.
    ///
    /// [`SessionBuilder::bound`]: crate::SessionBuilder::bound
    BoundConnectionClosed(Arc<Error>),
    /// The key's change feed reported the hold released, though this guard did not release it
    /// (another client holding as the same owner released it, or the hold's session was closed
    /// elsewhere).
    Released,
    /// The hold reached its deadline: the feed reported its expiry, or the client's own
    /// conservative deadline (the grant's or last successful renewal's sending, plus the TTL)
    /// passed with no renewal, whichever came first (the server may notice an expiry late).
    Expired,
    /// The feed reported the key deleted (`DEL`, `UNLINK`, `RENAME` away, `RESTORE ...
    /// REPLACE`, `MOVE`, eviction), with every hold on it.
    Deleted,
    /// The feed reported the key's database flushed (`FLUSHDB`, `FLUSHALL`).
    Flushed,
    /// The feed reported the key's database swapped away (`SWAPDB`).
    Swapped,
    /// The feed reported that the server became a replica (a failover, `REPLICAOF`): it holds
    /// no lock of its own any more.
    Demoted,
    /// The feed reported the key granted to another holder: this hold had ended (an exclusive
    /// lock has one holder).
    Taken {
        /// The new holder's owner.
        owner: String,
        /// The new holder's token.
        token: u64,
    },
    /// The connection of the key's change feed was lost (the server closed it, restarted, or
    /// the network failed): the holder can no longer learn of a loss at once, so it counts the
    /// lock as lost (fail-safe). The hold may still be live until its deadline.
    FeedDisconnected(Arc<Error>),
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossReason::NotHeld => write!(f, "lock no longer held (expired, deleted or taken)"),
            LossReason::ExtendFailed(e) => write!(f, "lock renewal failed: {e}"),
            LossReason::SessionEnded => write!(f, "the lock's session ended"),
            LossReason::BoundConnectionClosed(e) => {
                write!(f, "the bound session's connection closed: {e}")
            }
            LossReason::Released => write!(f, "the lock was released elsewhere"),
            LossReason::Expired => write!(f, "the lock expired"),
            LossReason::Deleted => write!(f, "the lock's key was deleted"),
            LossReason::Flushed => write!(f, "the lock's database was flushed"),
            LossReason::Swapped => write!(f, "the lock's database was swapped (SWAPDB)"),
            LossReason::Demoted => write!(f, "the server became a replica"),
            LossReason::Taken { owner, token } => {
                write!(f, "the lock was granted to {owner:?} (token {token})")
            }
            LossReason::FeedDisconnected(e) => {
                write!(f, "the lock's change feed connection was lost: {e}")
            }
        }
    }
}

/// Where a loss is reported: the slot the guard reads in `is_lost`, and the channel it exposes
/// in `lost`.
#[derive(Clone)]
pub(crate) struct LossSignal {
    /// The first loss seen; kept so that `is_lost` stays true after the message was received.
    pub(crate) reason: Arc<Mutex<Option<LossReason>>>,
    /// Wakes whoever waits on the guard's receiver.
    pub(crate) notify: Sender<LossReason>,
}

/// Where a watchdog reports a loss: a guard's [`LossSignal`] (sync) or `watch` sender (async),
/// or a session, which tells its guards. Only the first loss is kept and told.
pub(crate) trait Report: Send + Sync + 'static {
    /// Record `reason` and wake whoever waits, unless a loss was already reported.
    fn report(&self, reason: LossReason);
}

impl<T: Report + ?Sized> Report for Arc<T> {
    fn report(&self, reason: LossReason) {
        (**self).report(reason)
    }
}

impl Report for LossSignal {
    fn report(&self, reason: LossReason) {
        let mut slot = self.reason.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_some() {
            return;
        }
        *slot = Some(reason.clone());
        // The guard holds the receiver; if it is gone there is no one left to tell.
        let _ = self.notify.send(reason);
    }
}

/// What a watchdog keeps alive: a guard's [`Hold`] (`LOCK.EXTEND`) or a session
/// (`LOCK.SESSION KEEPALIVE`).
pub(crate) trait Renewable: Send + Sync + 'static {
    /// The TTL each renewal asks for; renewals are due every third of it by default.
    fn ttl(&self) -> Duration;
    /// The renewal: true while it still lives.
    fn renewal(&self) -> Command<bool>;
    /// What a renewal answered with false means.
    fn gone(&self) -> LossReason;
    /// A renewal sent at `sent` succeeded.
    fn renewed(&self, _sent: Instant) {}
    /// For a session: until when a keepalive that cannot reach a cluster node is tried again
    /// rather than reported (its deadline as of its last keepalive; issue 34: it lives on the
    /// promoted replica after a killed master). `None` (a lock): a failure is a loss at once.
    fn pursued_until(&self) -> Option<Instant> {
        None
    }
}

impl Renewable for Hold {
    fn ttl(&self) -> Duration {
        Hold::ttl(self)
    }

    fn renewal(&self) -> Command<bool> {
        Hold::renewal(self)
    }

    fn gone(&self) -> LossReason {
        LossReason::NotHeld
    }

    fn renewed(&self, sent: Instant) {
        Hold::renewed(self, sent)
    }
}

/// What a watchdog renews, and how often: for the sync thread `Lease<Inner, _>`, for the async
/// task ([`crate::aio`]) its client; a guard's lock reported to the guard, or a session
/// reported to the session.
pub(crate) struct Lease<C, L> {
    /// The server and its connections.
    pub(crate) client: Arc<C>,
    /// The lock, shared with its guard ([`Guard::extend`](crate::Guard::extend) updates its
    /// TTL), or the session.
    pub(crate) hold: Arc<dyn Renewable>,
    /// Time between renewals; `None` for a third of the current TTL.
    pub(crate) period: Option<Duration>,
    /// Where to report a loss.
    pub(crate) loss: L,
}

/// When renewals are due and what each one sends: the timing rules of both watchdogs, which
/// differ only in how they sleep and send.
pub(crate) struct Schedule {
    /// When the next renewal is due.
    next: Instant,
    /// The chosen period, or `None` for a third of the TTL.
    period: Option<Duration>,
}

impl Schedule {
    /// A schedule starting now (the grant).
    pub(crate) fn start(period: Option<Duration>) -> Schedule {
        Schedule {
            next: Instant::now(),
            period,
        }
    }

    /// When the next renewal is due, and its period. Renewals are scheduled from the previous
    /// one's start, so the round trip does not stretch the interval.
    pub(crate) fn next(&mut self, hold: &dyn Renewable) -> (Instant, Duration) {
        let period = renewal_period(self.period, hold.ttl());
        self.next += period;
        (self.next, period)
    }

    /// The renewal to send now that it is due, with its reply and connect timeouts (`io` and
    /// `connect`, cut to the `period`).
    ///
    /// A renewal must not outlast the period: with the default period (ttl / 3), a server that
    /// stops answering is reported within two periods of the last successful renewal, i.e.
    /// before the lock's deadline. If this process was paused (or starved) past the due time,
    /// the schedule restarts now; the renewal then finds out whether the hold survived (if it
    /// lapsed, the extend answers 0 and nothing is extended).
    pub(crate) fn renewal(
        &mut self,
        hold: &dyn Renewable,
        period: Duration,
        io: Duration,
        connect: Duration,
    ) -> (Command<bool>, Duration, Duration) {
        let now = Instant::now();
        if self.next < now {
            self.next = now;
        }
        (hold.renewal(), io.min(period), connect.min(period))
    }
}

/// A running watchdog thread. Dropping it stops and joins the thread.
pub(crate) struct Watchdog {
    /// Dropped to stop the thread: its `recv_timeout` then returns `Disconnected` at once.
    stop: Option<Sender<()>>,
    /// Joined on stop, so that no renewal is in flight afterwards.
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Start renewing `lease`.
    pub(crate) fn spawn<L: Report>(lease: Lease<Inner, L>) -> std::io::Result<Watchdog> {
        let (stop_tx, stop_rx) = mpsc::channel();
        let thread = thread::Builder::new()
            .name("redis-lock-watchdog".to_string())
            .spawn(move || run(lease, stop_rx))?;
        Ok(Watchdog {
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// Stop renewing and wait for the thread to end. A renewal already in flight finishes first;
    /// it is bounded by the renewal period (its read and connect timeouts are at most that).
    pub(crate) fn stop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            // The thread never panics by design; if it somehow did, there is nothing to add.
            let _ = thread.join();
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The thread: sleep until the next renewal unless stopped, renew (again after a pause while
/// [`verdict`] says so), report a failure and quit.
fn run<L: Report>(lease: Lease<Inner, L>, stop: Receiver<()>) {
    let mut schedule = Schedule::start(lease.period);
    let client = &lease.client;
    loop {
        let (due, period) = schedule.next(&*lease.hold);
        match stop.recv_timeout(due.saturating_duration_since(Instant::now())) {
            Err(RecvTimeoutError::Timeout) => {}
            // Stopped, or the guard (and with it the sender) is gone.
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
        let (renewal, io, connect) = schedule.renewal(
            &*lease.hold,
            period,
            client.io_timeout,
            client.connect_timeout,
        );
        loop {
            let sent = Instant::now();
            let reply = client.with_conn_sent(io, connect, &renewal);
            match verdict(reply, sent, &*lease.hold, client) {
                Verdict::Live => break,
                Verdict::Lost(reason) => return lease.loss.report(reason),
                Verdict::Again(pause) => match stop.recv_timeout(pause) {
                    Err(RecvTimeoutError::Timeout) => {}
                    Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
                },
            }
        }
    }
}

/// The time between renewals: the chosen `period`, or a third of the TTL the lock was last
/// granted or extended with; at least 1 ms.
fn renewal_period(period: Option<Duration>, ttl: Duration) -> Duration {
    period.unwrap_or(ttl / 3).max(Duration::from_millis(1))
}

/// What the outcome of a renewal means, for both watchdogs.
pub(crate) enum Verdict {
    /// It lives: renew at the next due time.
    Live,
    /// Its node could not be reached: send the renewal again after this pause.
    Again(Duration),
    /// It is lost: report this and stop.
    Lost(LossReason),
}

/// What the outcome of a renewal sent at `sent` through `endpoint` means. A session of a
/// cluster node's client whose keepalive cannot reach its node (a killed master, its replica
/// not promoted yet) is not lost while its deadline has not passed: the keepalive is sent again
/// (each try asking the other nodes for the slot's master, [`Pursuit`]), and only the server's
/// nil, or its deadline passing with no master answering, is a loss (issue 34).
pub(crate) fn verdict(
    renewal: Result<bool, Failure>,
    sent: Instant,
    hold: &dyn Renewable,
    endpoint: &Endpoint,
) -> Verdict {
    match renewal {
        Ok(true) => {
            hold.renewed(sent);
            Verdict::Live
        }
        Ok(false) => Verdict::Lost(hold.gone()),
        Err(failure) => match hold.pursued_until().map(Pursuit::until) {
            Some(pursuit) if pursuit.again(endpoint, &failure, Resend::Always) => {
                Verdict::Again(pursuit.pause())
            }
            _ => Verdict::Lost(LossReason::ExtendFailed(Arc::new(failure.error))),
        },
    }
}
