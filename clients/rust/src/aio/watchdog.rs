//! The async lease watchdog: a tokio task that renews a guard's lock every third of its TTL and
//! publishes the loss the moment a renewal fails. The renewal rules are the sync watchdog's
//! ([`crate::watchdog`]); only the waiting differs.
//!
//! The guard owns the sending half of a stop channel; the task waits on the other half with a
//! deadline between renewals. [`Watchdog::stop`] drops the sender, which wakes the task at once,
//! and awaits the task's end, so no renewal is in flight afterwards. A guard that is dropped
//! cannot wait: it aborts the task instead (see [`super::Guard`]'s `Drop`).

use std::sync::Arc;

use tokio::runtime::Handle;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use super::client::Inner;
use crate::watchdog::{verdict, LossReason, Report, Schedule, Verdict};

/// What the task renews: the lease of the sync watchdog, with the async client; reported to a
/// guard's `watch` sender ([`Loss`]) or to a session.
pub(crate) type Lease<L = Loss> = crate::watchdog::Lease<Inner, L>;

/// Where an async guard's loss is published: the guard's `watch` sender.
pub(crate) type Loss = Arc<watch::Sender<Option<LossReason>>>;

impl Report for watch::Sender<Option<LossReason>> {
    fn report(&self, reason: LossReason) {
        self.send_if_modified(|slot| match slot {
            Some(_) => false,
            None => {
                *slot = Some(reason);
                true
            }
        });
    }
}

/// A running watchdog task.
pub(crate) struct Watchdog {
    /// Dropped to stop the task: its wait then ends at once.
    stop: oneshot::Sender<()>,
    /// Awaited on stop, so that no renewal is in flight afterwards.
    task: JoinHandle<()>,
}

impl Watchdog {
    /// Start renewing `lease` on `runtime`.
    pub(crate) fn spawn<L: Report>(lease: Lease<L>, runtime: &Handle) -> Watchdog {
        let (stop, stopped) = oneshot::channel();
        Watchdog {
            stop,
            task: runtime.spawn(run(lease, stopped)),
        }
    }

    /// Stop renewing and wait for the task to end. A renewal already in flight finishes first;
    /// it is bounded by the renewal period (its timeouts are at most that).
    pub(crate) async fn stop(self) {
        drop(self.stop);
        // The task never panics by design; if it was aborted there is nothing to add.
        let _ = self.task.await;
    }

    /// Stop renewing without waiting: the task ends at its next await point.
    pub(crate) fn abort(self) {
        self.task.abort();
    }
}

/// The task: wait until the next renewal unless stopped, renew (again after a pause while
/// [`verdict`] says so), publish a failure and quit.
async fn run<L: Report>(lease: Lease<L>, mut stopped: oneshot::Receiver<()>) {
    let mut schedule = Schedule::start(lease.period);
    let client = &lease.client;
    loop {
        let (due, period) = schedule.next(&*lease.hold);
        if tokio::time::timeout_at(due.into(), &mut stopped)
            .await
            .is_ok()
        {
            return; // stopped, or the guard (and with it the sender) is gone
        }
        let (renewal, io, connect) = schedule.renewal(
            &*lease.hold,
            period,
            client.io_timeout,
            client.connect_timeout,
        );
        loop {
            let sent = std::time::Instant::now();
            let reply = client.run(io, connect, &renewal).await;
            match verdict(reply, sent, &*lease.hold, client) {
                Verdict::Live => break,
                Verdict::Lost(reason) => return lease.loss.report(reason),
                Verdict::Again(pause) => {
                    if tokio::time::timeout(pause, &mut stopped).await.is_ok() {
                        return; // stopped
                    }
                }
            }
        }
    }
}
