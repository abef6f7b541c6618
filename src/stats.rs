//! Counters and histograms behind `INFO lock`. Plain Rust, no Redis types.
//!
//! Why atomics: almost everything runs on the server's main thread, but a lock value can be
//! freed on the lazy-free thread (`UNLINK`, `FLUSHALL ASYNC`), and the free callback counts
//! expired holds. Relaxed ordering is enough for statistics.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

/// A monotonically increasing event count.
pub struct Counter(AtomicU64);

impl Counter {
    pub const fn new() -> Self {
        Counter(AtomicU64::new(0))
    }
    pub fn incr(&self) {
        self.0.fetch_add(1, Relaxed);
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

impl Default for Counter {
    fn default() -> Self {
        Self::new()
    }
}

/// Grants of a new token: to a free lock or handed to a waiter.
pub static ACQUIRED: Counter = Counter::new();
/// `LOCK.ACQUIRE` that found the lock held by another owner (blocking or not).
pub static CONTENDED: Counter = Counter::new();
/// `LOCK.RELEASE` that freed a lock.
pub static RELEASED: Counter = Counter::new();
/// `LOCK.EXTEND` that moved a deadline.
pub static EXTENDED: Counter = Counter::new();
/// Holds that ended by reaching their deadline.
pub static EXPIRED: Counter = Counter::new();
/// Grants made to a queued waiter.
pub static HANDED_OFF: Counter = Counter::new();
/// Waiters whose `BLOCK` timeout passed (or that `CLIENT UNBLOCK` answered like one).
pub static TIMED_OUT: Counter = Counter::new();
/// Sessions opened (`LOCK.SESSION OPEN`).
pub static SESSIONS_OPENED: Counter = Counter::new();
/// Sessions ended by `LOCK.SESSION CLOSE`.
pub static SESSIONS_CLOSED: Counter = Counter::new();
/// Sessions ended because their deadline passed without a keepalive.
pub static SESSIONS_EXPIRED: Counter = Counter::new();
/// Bound sessions ended because their connection closed.
pub static SESSIONS_DISCONNECTED: Counter = Counter::new();
/// Sessions ended by an administrator's `LOCK.SESSION KILL`.
pub static SESSIONS_KILLED: Counter = Counter::new();
/// `BOUND` sessions with a grace detached by their connection's close.
pub static SESSIONS_DETACHED: Counter = Counter::new();
/// Detached sessions that a connection attached within their grace.
pub static SESSIONS_REATTACHED: Counter = Counter::new();
/// Detached sessions that ended because no connection attached them in time.
pub static SESSIONS_GRACE_EXPIRED: Counter = Counter::new();
/// Holds that ended because their session did.
pub static SESSION_HOLDS_RELEASED: Counter = Counter::new();
/// Times a blocked `LOCK.MACQUIRE` set was passed by a later set whose keys were all free
/// (bounded overtaking: at most `lock.max-overtakes` times per set).
pub static SETS_OVERTAKEN: Counter = Counter::new();
/// Lock values in the dataset (created minus freed), expired ones not yet removed included.
pub static LOCK_VALUES: AtomicI64 = AtomicI64::new(0);
/// Time from `LOCK.ACQUIRE ... BLOCK` queueing to the grant, in microseconds.
pub static WAIT_US: Histogram = Histogram::new();
/// Time from grant to `LOCK.RELEASE`, in microseconds.
pub static HOLD_US: Histogram = Histogram::new();

/// Sub-buckets per power of two: values are kept to within 25%.
const SUB_BITS: u32 = 2;
const SUB: u64 = 1 << SUB_BITS;
const BUCKETS: usize = ((64 - SUB_BITS as usize) + 1) * SUB as usize;

/// The upper bounds (ms) of the cumulative buckets `INFO lock` prints for Prometheus
/// (`lock_wait_ms_le_<bound>`), plus one for everything above (`_le_inf`). Exact, unlike the
/// percentiles: each value is counted in the first bound it does not exceed.
pub const LE_MS: [u64; 10] = [1, 5, 10, 50, 100, 500, 1000, 5000, 10000, 60000];

/// A log-linear histogram of non-negative values (HDR-style, coarse), lock-free, with exact
/// counts per [`LE_MS`] bound beside it.
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS],
    /// Values per `LE_MS` bound (not cumulative), and above the last one at the end.
    le: [AtomicU64; LE_MS.len() + 1],
    count: AtomicU64,
    sum: AtomicU64,
    max: AtomicU64,
}

/// The summary `INFO lock` prints.
#[derive(Debug, PartialEq, Eq, Default)]
pub struct Summary {
    pub count: u64,
    pub mean: u64,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub max: u64,
}

impl Histogram {
    #[allow(clippy::declare_interior_mutable_const)]
    pub const fn new() -> Self {
        const ZERO: AtomicU64 = AtomicU64::new(0);
        Histogram {
            buckets: [ZERO; BUCKETS],
            le: [ZERO; LE_MS.len() + 1],
            count: AtomicU64::new(0),
            sum: AtomicU64::new(0),
            max: AtomicU64::new(0),
        }
    }

    fn index(v: u64) -> usize {
        if v < SUB {
            return v as usize;
        }
        let exp = 63 - v.leading_zeros(); // >= SUB_BITS
        let sub = (v >> (exp - SUB_BITS)) & (SUB - 1);
        ((exp - SUB_BITS + 1) as u64 * SUB + sub) as usize
    }

    /// The largest value that falls in bucket `i`.
    fn upper(i: usize) -> u64 {
        let i = i as u64;
        if i < SUB {
            return i;
        }
        let exp = i / SUB - 1 + SUB_BITS as u64;
        let sub = i % SUB;
        let low = (1u64 << exp) + (sub << (exp - SUB_BITS as u64));
        low.saturating_add((1u64 << (exp - SUB_BITS as u64)) - 1)
    }

    /// Record `v` microseconds.
    pub fn record(&self, v: u64) {
        self.buckets[Self::index(v)].fetch_add(1, Relaxed);
        let bound = LE_MS.partition_point(|ms| ms * 1000 < v);
        self.le[bound].fetch_add(1, Relaxed);
        self.count.fetch_add(1, Relaxed);
        self.sum.fetch_add(v, Relaxed);
        self.max.fetch_max(v, Relaxed);
    }

    /// Cumulative counts at each [`LE_MS`] bound and, last, of every value (`+Inf`), as a
    /// Prometheus histogram's buckets; and the sum of the values in whole milliseconds.
    pub fn cumulative(&self) -> (Vec<u64>, u64) {
        let mut seen = 0;
        let counts = self
            .le
            .iter()
            .map(|c| {
                seen += c.load(Relaxed);
                seen
            })
            .collect();
        (counts, self.sum.load(Relaxed) / 1000)
    }

    pub fn summary(&self) -> Summary {
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.load(Relaxed)).collect();
        let count: u64 = counts.iter().sum();
        if count == 0 {
            return Summary::default();
        }
        let max = self.max.load(Relaxed);
        let quantile = |q: f64| {
            let rank = ((count as f64) * q).ceil().max(1.0) as u64;
            let mut seen = 0;
            for (i, c) in counts.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    return Self::upper(i).min(max);
                }
            }
            max
        };
        Summary {
            count,
            mean: self.sum.load(Relaxed) / count,
            p50: quantile(0.50),
            p90: quantile(0.90),
            p99: quantile(0.99),
            max,
        }
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cumulative_buckets_count_each_value_at_its_first_bound_and_above() {
        let h = Histogram::new();
        // 0 and exactly 1 ms are <= 1; 1 ms + 1 us is not; 70 s is only in +Inf.
        for us in [0, 1000, 1001, 5000, 70_000_000] {
            h.record(us);
        }
        let (counts, sum_ms) = h.cumulative();
        assert_eq!(counts, [2, 4, 4, 4, 4, 4, 4, 4, 4, 4, 5]);
        assert_eq!(sum_ms, 70_007);
    }

    #[test]
    fn buckets_cover_values_within_a_quarter() {
        for v in [0u64, 1, 3, 4, 5, 7, 8, 100, 1000, 12345, 1 << 40, u64::MAX] {
            let i = Histogram::index(v);
            let up = Histogram::upper(i);
            assert!(up >= v, "v={v} upper={up}");
            assert!(up - v <= v / 4 + 1, "v={v} upper={up}");
            if i > 0 {
                assert!(
                    Histogram::upper(i - 1) < v,
                    "v={v} previous bucket covers it"
                );
            }
        }
    }

    #[test]
    fn summary_reports_quantiles_and_max() {
        let h = Histogram::new();
        for v in 1..=100 {
            h.record(v * 10);
        }
        let s = h.summary();
        assert_eq!(s.count, 100);
        assert_eq!(s.max, 1000);
        assert_eq!(s.mean, 505);
        assert!((500..=640).contains(&s.p50), "{s:?}");
        assert!((900..=1000).contains(&s.p90), "{s:?}");
        assert!((990..=1000).contains(&s.p99), "{s:?}");
    }

    #[test]
    fn empty_summary_is_zero() {
        assert_eq!(Histogram::new().summary(), Summary::default());
    }
}
