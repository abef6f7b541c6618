//! The scenarios: one fault (family) each, injected again and again while the workload runs.
//! Each nemesis states its pass criteria where it tallies them; the common checks of
//! `checker.rs` apply to every scenario.
//!
//! One file per family of faults: `client_faults.rs`, `restarts.rs`, `keyspace.rs`,
//! `failover.rs`, `memory.rs`, `acl.rs`, `sessions.rs` (with its holder process in
//! `sessions/holder.rs`), `election.rs` (candidates: the same processes, campaigning; on one server,
//! and with a replica and failovers, `election_failover`, its checks in `election/replicated.rs`);
//! below, the helpers they share and the scenarios without server faults.

use std::thread;
use std::time::{Duration, Instant};

use rand::Rng;
use redis::{Cmd, Connection, Value};

use crate::checker::{Check, Verdict};
use crate::common::{info_field, wait_until};
use crate::faults::{self, Holder};
use crate::history::{Effect, History, Micros, Op, Outcome, Survival};
use crate::run::{Env, Scenario};
use crate::workload::{Config, GAVE_UP, NO_REPLY};

mod acl;
mod client_faults;
mod election;
mod failover;
mod keyspace;
mod memory;
mod restarts;
mod sessions;

pub use acl::*;
pub use client_faults::*;
pub use election::*;
pub use failover::*;
pub use keyspace::*;
pub use memory::*;
pub use restarts::*;
pub use sessions::*;

// The scenarios with shared holders live in their own file; the test list finds them here.
pub use crate::pause::{client_pause, client_pause_replica};
pub use crate::shared::{
    semaphore_failover_wait, semaphore_limit, shared_debug_reload, shared_readers_writers,
};

const APPENDFSYNC_ALWAYS: &[&str] = &["--appendonly", "yes", "--appendfsync", "always"];

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn int(v: Option<&Value>) -> Option<i64> {
    match v {
        Some(Value::Int(n)) => Some(*n),
        _ => None,
    }
}

fn is_error(v: Option<&Value>, code: &str) -> bool {
    matches!(v, Some(Value::ServerError(e)) if e.code() == code)
}

/// True if `after` (a `LOCK.FENCE` reply read later in the same transaction) shows the hold
/// `before` (a `LOCK.INFO` reply) unchanged: the same token, or nil when it was free. The module
/// checks liveness against the clock at each command, not once per `EXEC`, so a hold with at
/// most 1 ms left (`ttl` = deadline - now) may read as expired a few microseconds later in the
/// same transaction; nil is accepted for it.
fn same_hold(before: &Value, after: &Value) -> bool {
    match (faults::parse_lock_info(before), after) {
        (Some((_, token, _)), Value::Int(t)) => *t == token,
        (Some((_, _, ttl)), Value::Nil) => ttl <= 1,
        (None, Value::Nil) => true,
        _ => false,
    }
}

/// Record the token a `LOCK.INFO` reply read at `at` showed, if it showed a hold.
fn observe_info(env: &Env, at: Micros, info: &Value, what: String) {
    if let Some((_, token, _)) = faults::parse_lock_info(info) {
        env.rec.observe(at, token, what);
    }
}

/// Record the largest token in the primary's AOF (`whose` it is, for the history) as known
/// when `fault` was invoked: the server wrote it before it answered. Returns how many
/// `LOCK.LOAD`s the AOF's base files hold.
fn observe_aof_tokens(env: &Env, fault: usize, whose: &str) -> u64 {
    let (aof_max, in_base) = faults::aof_tokens(env.primary.dir());
    if let Some(token) = aof_max {
        let at = env.rec.with_fault(fault, |f| f.invoke);
        env.rec
            .observe(at, token, format!("the largest token in {whose}"));
    }
    in_base
}

/// Run `cmds` as one `MULTI`/`EXEC` and record it as the server-side fault `kind` on `keys`
/// (`None`: every key), described by `note` from the replies. Returns the replies and when
/// `EXEC` answered.
fn transaction_fault(
    env: &Env,
    c: &mut Connection,
    kind: &str,
    keys: Option<Vec<String>>,
    effect: Effect,
    cmds: &[Cmd],
    note: impl FnOnce(&[Value]) -> String,
) -> (Vec<Value>, Micros) {
    let (replies, invoke, complete) =
        faults::transaction(&env.rec, c, cmds).unwrap_or_else(|e| panic!("MULTI for {kind}: {e}"));
    let note = note(&replies);
    env.fault_at(kind, keys, effect, true, invoke, complete, note);
    (replies, complete)
}

// --- No server faults ----------------------------------------------------------------------

pub fn baseline() -> Scenario {
    Scenario::new("baseline", "the workload alone, no faults", watch)
}

pub fn multikey() -> Scenario {
    Scenario::new(
        "multikey",
        "half the lock attempts take 2-3 keys at once with LOCK.MACQUIRE (half of them \
         BLOCK), the rest single keys, no faults",
        watch,
    )
    .workload(Config {
        multi_share: 0.5,
        ..Config::default()
    })
}

/// Only watch: read every key's token now and then (tokens known for the epoch check).
fn watch(env: &mut Env) {
    while env.running() {
        env.sleep((50, 150));
        env.observe_tokens();
    }
}
