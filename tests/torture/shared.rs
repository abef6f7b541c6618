//! Shared holders in the torture suite: the scenarios that take keys `SHARED` and `SHARED
//! LIMIT n` beside exclusive holders, and the checks only shared holders need. The common
//! checks of `checker.rs` apply to them as to every scenario; `checker::check` runs the checks
//! below for every scenario too (they find nothing to check where nobody takes a key shared).
//!
//! What the resources mean here (see `workload.rs`): only exclusive holders write `res:i` and
//! `cnt:i`, so `stale-fenced-writes`, `fenced-lost-updates` and `resource-order` keep their
//! one-writer-at-a-time meaning; shared holders read `res:i` through the fence, and
//! `shared-reads-stable` checks that no write lands while one of them holds the key.
//!
//! The checks, on the intervals in which each hold was certainly live
//! ([`certain_intervals`], the ones `exclusive-holds` uses, with the same [`TOLERANCE`]):
//! - `shared-exclusive-holds`: no shared hold certainly live at once with an exclusive one;
//! - `holders-within-limit`: a key taken `SHARED LIMIT n` never has more than `n` holders
//!   certainly live at once;
//! - `shared-reads-stable`: every read one shared hold's fence accepted saw the same length.
//!
//! "Tokens on each key only grow" is `grant-order`, which covers shared grants.

use std::collections::HashMap;

use crate::checker::{certain_intervals, Check, Index, Verdict, TOLERANCE};
use crate::history::{Effect, Entry, History, Micros, Mode, Op, Outcome, Survival};
use crate::run::Scenario;
use crate::scenarios;
use crate::workload::Config;

// --- Scenarios ------------------------------------------------------------------------------

pub fn shared_readers_writers() -> Scenario {
    Scenario::new(
        "shared_readers_writers",
        "readers (SHARED, 60% of acquires) and writers on 2 keys, most waiting in BLOCK; \
         waiters are CLIENT KILLed, CLIENT UNBLOCKed (TIMEOUT and ERROR), or disconnect",
        scenarios::disturb_waiters,
    )
    .workload(Config {
        workers: 8,
        keys: 2,
        shared_share: 0.6,
        block_share: 0.7,
        block_ms: (30, 400),
        disconnect_share: 0.1,
        ..Config::default()
    })
    .post(readers_writers_criteria)
}

/// The criteria of `waiters_killed_and_unblocked`, and that readers did share with each other
/// and writers took the same keys.
fn readers_writers_criteria(h: &History, v: &Verdict) -> Vec<Check> {
    let mut checks = scenarios::unblocked_waiters_get_no_lock(h, v);
    checks.push(acquires_answered(h));
    checks.push(readers_share(h));
    checks
}

pub fn semaphore_limit() -> Scenario {
    Scenario::new(
        "semaphore_limit",
        "SHARED LIMIT 2 and LIMIT 3 (85% of acquires) and exclusive acquires on 2 keys; \
         redis-server killed -9 and restarted, AOF with appendfsync always",
        |env| {
            scenarios::restarts(
                env,
                "kill -9 + restart (appendfsync always)",
                Effect::Keeps,
                Some(Survival::Acked),
            )
        },
    )
    .server_args(&["--appendonly", "yes", "--appendfsync", "always"])
    .workload(Config {
        workers: 8,
        keys: 2,
        shared_share: 0.85,
        shared_limits: vec![2, 3],
        block_share: 0.6,
        ..Config::default()
    })
    .post(semaphore_criteria)
}

pub fn semaphore_failover_wait() -> Scenario {
    Scenario::new(
        "semaphore_failover_wait",
        "as failover_wait (WAIT 1 1000 after every grant, ttls of 0.3-2 s), with SHARED \
         LIMIT 2 and LIMIT 3 (80% of acquires) beside exclusive acquires on 2 keys: \
         every waited holder must survive promotion",
        |env| scenarios::failovers(env, (50, 150), Survival::WaitAcked),
    )
    .server_args(scenarios::FORENSIC_AOF)
    .with_replica()
    .workload(Config {
        keys: 2,
        ttl_ms: (300, 2000),
        expire_share: 0.3,
        wait_replicas: true,
        shared_share: 0.8,
        shared_limits: vec![2, 3],
        ..Config::default()
    })
    .may_lose_writes()
    .post(semaphore_criteria)
}

/// Every limited key was filled to its limit, and every acquire was answered sensibly.
fn semaphore_criteria(h: &History, _v: &Verdict) -> Vec<Check> {
    vec![acquires_answered(h), limits_reached(h)]
}

pub fn shared_debug_reload() -> Scenario {
    Scenario::new(
        "shared_debug_reload",
        "readers (SHARED, 70% of acquires) and writers on 3 keys; DEBUG RELOAD in the \
         middle of the workload: every acknowledged holder, shared or not, must survive it",
        scenarios::reloads,
    )
    .workload(Config {
        workers: 8,
        shared_share: 0.7,
        ..Config::default()
    })
    .post(reload_criteria)
}

fn reload_criteria(h: &History, _v: &Verdict) -> Vec<Check> {
    vec![acquires_answered(h), readers_share(h)]
}

/// Pass: every `LOCK.ACQUIRE` answered a token, `nil`, `UNBLOCKED` (a `CLIENT UNBLOCK ...
/// ERROR`) or nothing (its connection was lost): never an error. Each key keeps one limit and
/// each owner one mode, so an `ERR` about the limit or the mode would be the server's mistake.
fn acquires_answered(h: &History) -> Check {
    let mut c = Check::new(
        "acquire-replies",
        "every LOCK.ACQUIRE answers a token, nil or UNBLOCKED: no limit or mode error (each key \
         keeps one limit, each owner one mode)",
    );
    for e in h.entries.iter().filter(|e| e.op.is_acquire()) {
        c.checked += 1;
        let fine = e.outcome == Outcome::Unknown
            || e.token.is_some()
            || e.reply == "nil"
            || e.reply.starts_with("UNBLOCKED");
        if !fine {
            c.violations.push(format!("unexpected reply:\n      {e}"));
        }
    }
    c
}

/// Pass: on some key, two shared holds were certainly live at once, and exclusive holds were
/// granted on that key too: else the scenario tested nothing of what it is for.
fn readers_share(h: &History) -> Check {
    let mut c = Check::new(
        "readers-share",
        "shared holders certainly held a key together (2 or more at once) and exclusive holders \
         took the same key",
    );
    let index = Index::new(h);
    let mut most = 0;
    for (key, intervals) in certain_intervals(h, &index) {
        c.checked += 1;
        let exclusive = index
            .holds
            .iter()
            .any(|hold| hold.key == key && hold.mode == Mode::Exclusive);
        for (_, crowd) in crowds(&intervals) {
            let shared = crowd
                .iter()
                .filter(|&&i| index.holds[i].mode.is_shared())
                .count();
            if exclusive {
                most = most.max(shared);
            }
        }
    }
    // A coverage check: required in the long runs only, as `limit-reached` below.
    if most < 2 && crate::run::workload_secs() >= 10.0 {
        c.violations.push(format!(
            "at most {most} shared holders at once on a key also held exclusively: the readers \
             never shared (the scenario tested nothing)"
        ));
    }
    c
}

/// Pass: every key taken `SHARED LIMIT n` had `n` holders certainly live at once at some
/// moment (and never more: `holders-within-limit`). Else the limit was never tested.
fn limits_reached(h: &History) -> Check {
    let mut c = Check::new(
        "limit-reached",
        "every limited key had LIMIT n holders certainly live at once at some moment",
    );
    let index = Index::new(h);
    let mut most: HashMap<(&str, u64), usize> = HashMap::new();
    for hold in &index.holds {
        if let Mode::Shared { limit: Some(n) } = hold.mode {
            most.entry((hold.key, n)).or_default();
        }
    }
    for (key, intervals) in certain_intervals(h, &index) {
        for (_, crowd) in crowds(&intervals) {
            let mut counts: HashMap<u64, usize> = HashMap::new();
            for &i in &crowd {
                if let Mode::Shared { limit: Some(n) } = index.holds[i].mode {
                    *counts.entry(n).or_default() += 1;
                }
            }
            for (n, count) in counts {
                let m = most.entry((key, n)).or_default();
                *m = (*m).max(count);
            }
        }
    }
    let mut most: Vec<_> = most.into_iter().collect();
    most.sort();
    // A coverage check, not a safety one: in the short runs of `make test` and `make
    // test-servers` (2 s and 1 s, with failovers in them) a key may see too few grants to fill
    // its limit (Redis 8.2 in CI at 1 s: 7 holds granted, LIMIT 3 never reached; once at 2 s on
    // a loaded machine). The long runs (`make torture`, 60 s) must reach it.
    let short = crate::run::workload_secs() < 10.0;
    for ((key, n), count) in most {
        c.checked += 1;
        if (count as u64) < n && !short {
            c.violations.push(format!(
                "{key} LIMIT {n}: at most {count} holders certainly live at once (the limit \
                 was never reached)"
            ));
        }
    }
    // Likewise: a 1 s run with a failover in it on a loaded machine once granted no SHARED
    // LIMIT hold at all (Redis 8.2, seed 335321: 58 refused while exclusive holds of 0.3-2 s
    // kept both keys).
    if c.checked == 0 && !short {
        c.violations
            .push("no SHARED LIMIT hold at all (the scenario tested nothing)".to_string());
    }
    c
}

// --- Checks ---------------------------------------------------------------------------------

/// The checks of shared holders, run for every scenario by `checker::check`.
pub fn checks(h: &History, index: &Index) -> Vec<Check> {
    let per_key = certain_intervals(h, index);
    vec![
        shared_exclusive_holds(&per_key, index),
        holders_within_limit(&per_key, index),
        shared_reads_stable(h, index),
    ]
}

/// For each hold of `intervals` (one key's, sorted by start) that was certainly live for more
/// than [`TOLERANCE`]: its start, and every hold certainly live just after it: those started
/// no later whose end is more than [`TOLERANCE`] past its start, itself included. (An end can
/// be up to [`TOLERANCE`] late: the server truncates its clock to milliseconds.)
fn crowds(intervals: &[(Micros, Micros, usize)]) -> Vec<(Micros, Vec<usize>)> {
    let mut open: Vec<(Micros, usize)> = Vec::new();
    let mut out = Vec::new();
    for &(start, end, i) in intervals {
        open.retain(|&(until, _)| start < until - TOLERANCE);
        if start < end - TOLERANCE {
            open.push((end, i));
            out.push((start, open.iter().map(|&(_, j)| j).collect()));
        }
    }
    out
}

/// Per key, the certain intervals `(from, until, hold)` of its holds.
type PerKey<'h> = HashMap<&'h str, Vec<(Micros, Micros, usize)>>;

fn describe_all(index: &Index, holds: &[usize]) -> String {
    let mut out = String::new();
    for &i in holds {
        out.push_str(&format!("\n    {}", index.holds[i].describe()));
    }
    out
}

/// Pass: per key, no shared hold was certainly live at the same moment as an exclusive one.
fn shared_exclusive_holds(per_key: &PerKey, index: &Index) -> Check {
    let mut c = Check::new(
        "shared-exclusive-holds",
        "per key, no shared hold was live at once with an exclusive one (the same intervals as \
         exclusive-holds, overlapping by more than 2 ms)",
    );
    for intervals in per_key.values() {
        for (start, crowd) in crowds(intervals) {
            c.checked += 1;
            let newest = *crowd.last().expect("a crowd holds its own hold");
            let shared = index.holds[newest].mode.is_shared();
            let clash: Vec<usize> = crowd
                .iter()
                .copied()
                .filter(|&j| index.holds[j].mode.is_shared() != shared)
                .collect();
            if let Some(&other) = clash.first() {
                c.violations.push(format!(
                    "a shared and an exclusive hold live at once at {:.3} ms:{}",
                    start as f64 / 1000.0,
                    describe_all(index, &[other, newest])
                ));
            }
        }
    }
    c
}

/// Pass: per key, at no moment were more than `n` holds taken `SHARED LIMIT n` certainly live.
fn holders_within_limit(per_key: &PerKey, index: &Index) -> Check {
    let mut c = Check::new(
        "holders-within-limit",
        "per key, no more than n holds taken SHARED LIMIT n were live at once (the same \
         intervals as exclusive-holds, overlapping by more than 2 ms)",
    );
    for (key, intervals) in per_key {
        for (start, crowd) in crowds(intervals) {
            let newest = *crowd.last().expect("a crowd holds its own hold");
            let Mode::Shared { limit: Some(n) } = index.holds[newest].mode else {
                continue;
            };
            c.checked += 1;
            let same: Vec<usize> = crowd
                .into_iter()
                .filter(|&j| index.holds[j].mode == index.holds[newest].mode)
                .collect();
            if same.len() as u64 > n {
                c.violations.push(format!(
                    "{} holders of {key} (LIMIT {n}) live at once at {:.3} ms:{}",
                    same.len(),
                    start as f64 / 1000.0,
                    describe_all(index, &same)
                ));
            }
        }
    }
    c
}

/// Pass: the fenced reads one shared hold made and the fence accepted all returned the same
/// list length. Only exclusive holders write the list, through the fence, and none can hold
/// the key between two moments at which the reader's token was live (a hold is one interval,
/// and a token never comes back once its hold ended). Holds that a data-losing fault may have
/// touched between their reads are skipped.
fn shared_reads_stable(h: &History, index: &Index) -> Check {
    let mut c = Check::new(
        "shared-reads-stable",
        "every fenced read one shared hold made (and the fence accepted) saw the same length: \
         no write landed while it held the key",
    );
    for hold in index.holds.iter().filter(|hold| hold.mode.is_shared()) {
        let reads: Vec<(&Entry, i64)> = hold
            .proofs
            .iter()
            .filter(|e| e.op == Op::FencedRead)
            .filter_map(|e| Some((*e, e.reply.parse().ok()?)))
            .collect();
        let (Some(first), Some(last)) = (
            reads.iter().map(|(e, _)| e.invoke).min(),
            reads.iter().map(|(e, _)| e.complete).max(),
        ) else {
            continue;
        };
        if reads.len() < 2
            || h.faults.iter().any(|f| {
                f.effect != Effect::Keeps
                    && f.covers(hold.key)
                    && f.complete > first
                    && f.invoke < last
            })
        {
            continue;
        }
        c.checked += 1;
        if reads.iter().any(|(_, len)| *len != reads[0].1) {
            let mut detail = format!(
                "the list changed while a shared hold was live:\n    {}",
                hold.describe()
            );
            for (e, _) in &reads {
                detail.push_str(&format!("\n      {e}"));
            }
            c.violations.push(detail);
        }
    }
    c
}
