//! What operators see of the queues: one key's waiters (`LOCK.INFO`) and the keys with waiters,
//! most contended first (`LOCK.WAITING`). Read only.

use std::time::Instant;

use super::*;

/// One queued waiter as `LOCK.INFO` shows it.
pub struct Queued {
    pub owner: Vec<u8>,
    pub mode: Mode,
    /// Its connection's client id (`CLIENT LIST`'s `id=`).
    pub client: u64,
    /// Milliseconds since it queued.
    pub waited: Millis,
    /// Milliseconds its `BLOCK` timeout leaves it, or -1 for `BLOCK 0` (no limit).
    pub timeout: Millis,
}

fn ms(from: Instant, to: Instant) -> Millis {
    to.saturating_duration_since(from).as_millis() as Millis
}

/// The waiters of `key` in queue order (for `LOCK.INFO`).
pub fn queue_view(db: i32, key: &[u8]) -> Vec<Queued> {
    let now = Instant::now();
    QUEUES.with(|q| {
        q.borrow()
            .get(&(db, key) as &dyn KeyView)
            .map_or(vec![], |q| {
                q.waiters
                    .iter()
                    .map(|w| Queued {
                        owner: w.owner.clone(),
                        mode: w.mode,
                        client: w.client,
                        waited: ms(w.queued, now),
                        timeout: w.timeout.map_or(-1, |t| ms(now, t)),
                    })
                    .collect()
            })
    })
}

/// A key with waiters, for `LOCK.WAITING`.
#[derive(Debug, PartialEq, Eq)]
pub struct Contended {
    pub db: i32,
    pub key: Vec<u8>,
    /// Its queue's length.
    pub waiters: usize,
    /// Milliseconds the longest-waiting of them has waited.
    pub oldest: Millis,
}

/// Up to `count` keys with waiters that `visible` lets through, most contended first: the
/// longest queue, then the longest wait, then database and name (so that equal keys come in
/// a stable order). O(K log K) with K keys with waiters, each visited once: the queues are
/// indexed by key, so no `SCAN` of the keyspace is needed.
pub fn contended(count: usize, mut visible: impl FnMut(i32, &[u8]) -> bool) -> Vec<Contended> {
    let now = Instant::now();
    let mut all: Vec<Contended> = QUEUES.with(|q| {
        q.borrow()
            .iter()
            .filter(|(_, queue)| !queue.waiters.is_empty())
            .map(|((db, key), queue)| Contended {
                db: *db,
                key: key.clone(),
                waiters: queue.waiters.len(),
                oldest: queue
                    .waiters
                    .iter()
                    .map(|w| ms(w.queued, now))
                    .max()
                    .unwrap_or(0),
            })
            .collect()
    });
    all.retain(|c| visible(c.db, &c.key));
    all.sort_unstable_by(|a, b| {
        (b.waiters, b.oldest)
            .cmp(&(a.waiters, a.oldest))
            .then_with(|| (a.db, &a.key).cmp(&(b.db, &b.key)))
    });
    all.truncate(count);
    all
}
