//! History-checked torture tests: many clients take and use locks while a nemesis injects one
//! kind of fault after another; every operation is recorded with its invocation and completion
//! times, and an offline checker then looks for anything no correct server could have done:
//! two live holds at once, a token granted twice or out of order, a token that went backwards
//! across a restart or failover, a stale fenced write accepted, an acknowledged lock lost.
//!
//! Each `#[test]` is one scenario (see `torture/scenarios/` for what each injects and its
//! own pass criteria). Each prints its tables; when every scenario of the file has run in one
//! process, the summary table follows.
//!
//! Layout:
//! - `torture/history.rs`: the recorded history (operations, faults, observations).
//! - `torture/workload/`: the clients (threads, and holder processes), the fenced and the
//!   unfenced resource.
//! - `torture/checker/`: the offline checks, each with its pass criterion.
//! - `torture/faults.rs`: the tools the nemeses use (signals, `CLIENT LIST`, `MULTI`, AOF...).
//! - `torture/scenarios/`: the scenarios and their nemeses, a file per family of faults.
//! - `torture/pause.rs`: `CLIENT PAUSE` (WRITE and ALL) as the nemesis.
//! - `torture/shared.rs`: the scenarios with shared holders (`SHARED [LIMIT n]`) and the checks
//!   only they need; `torture/checker_tests.rs`: the checker on hand-made histories.
//! - `torture/run.rs`: running a scenario; `torture/report.rs`: the tables.
//!
//! Environment:
//! - `TORTURE_SECS`: seconds of workload per scenario (default 2, the short form `cargo test`
//!   runs; `make torture` uses 60).
//! - `TORTURE_SEED`: the seed of the random choices (printed by every scenario). The threads
//!   interleave differently on every run, so a seed reproduces the choices, not the history.
//! - `REDIS_SERVER`, `REDIS_LOCK_MODULE`: as for every integration test (`tests/common`).

mod common;

#[path = "torture/checker/mod.rs"]
mod checker;
#[path = "torture/checker_tests.rs"]
mod checker_tests;
#[path = "torture/faults.rs"]
mod faults;
#[path = "torture/history.rs"]
mod history;
#[path = "torture/pause.rs"]
mod pause;
#[path = "torture/report.rs"]
mod report;
#[path = "torture/run.rs"]
mod run;
#[path = "torture/scenarios/mod.rs"]
mod scenarios;
#[path = "torture/shared.rs"]
mod shared;
#[path = "torture/workload/mod.rs"]
mod workload;

// Network and clock faults (issue 14): their own runner and tables, see torture/netfault.rs.
#[path = "torture/clockjump.rs"]
mod clockjump;
#[path = "torture/netfault.rs"]
mod netfault;
#[path = "torture/netfault_tests.rs"]
mod netfault_tests;
mod nodes;
#[path = "torture/partitions.rs"]
mod partitions;
#[path = "torture/skew.rs"]
mod skew;
#[path = "torture/slowlink.rs"]
mod slowlink;

/// One `#[test]` per scenario, and their number (the summary is printed after the last).
macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        const SCENARIOS: usize = [$(stringify!($name)),*].len();
        $(
            #[test]
            fn $name() {
                run::run(scenarios::$name(), SCENARIOS);
            }
        )*
    };
}

scenarios![
    baseline,
    multikey,
    gc_pause_threads,
    sigstop_holders,
    waiters_killed_and_unblocked,
    kill9_aof_always,
    kill9_aof_everysec,
    kill9_no_persistence,
    debug_reload,
    bgrewriteaof,
    flushall,
    swapdb,
    rename_and_move,
    restore_truncated_dump,
    failover_async,
    failover_wait,
    failover_durable,
    maxmemory_noeviction,
    maxmemory_allkeys_lru,
    acl,
    shared_readers_writers,
    shared_debug_reload,
    semaphore_limit,
    semaphore_failover_wait,
    client_pause,
    client_pause_replica,
    sessions_bound,
    sessions_lock_delay,
    election_bound,
    election_failover,
];

/// Not a test: the body of a holder process, the test binary re-executed by the
/// `sigstop_holders` scenario with `TORTURE_HOLDER` set (see `workload::holder_process_main`).
#[test]
#[ignore = "runs only as a holder process started by the sigstop_holders scenario"]
fn holder_process() {
    workload::holder_process_main();
}

/// Not a test: the body of a session holder process, the test binary re-executed by the
/// `sessions_*` scenarios with `TORTURE_SESSION_HOLDER` set (see
/// `scenarios::session_holder_main`).
#[test]
#[ignore = "runs only as a session holder process started by the sessions_* scenarios"]
fn session_holder_process() {
    scenarios::session_holder_main();
}
