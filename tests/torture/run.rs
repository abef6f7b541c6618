//! Running one scenario: start the server(s), the workload threads and the nemesis (the fault
//! injector, on the test's own thread), stop the workload when the time is up, then check the
//! server is quiet, read the resources, run the checker, print the report and fail the test on
//! any violation.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use redis::{Connection, Value};

use crate::checker::{self, Check, Expect, Verdict};
use crate::common::{info_field, wait_until, Server};
use crate::faults;
use crate::history::{Effect, Fault, History, Micros, Recorder, Snapshot, Survival};
use crate::report::{self, Report};
use crate::workload::{self, fenced_key, lock_key, Config, Target};

/// Workload seconds per scenario when `TORTURE_SECS` is not set: the short form `cargo test`
/// runs.
const DEFAULT_SECS: f64 = 2.0;

/// How long the server gets to dequeue every waiter once the clients are gone.
const QUIET_TIMEOUT: Duration = Duration::from_secs(5);

/// Seconds of workload per scenario: `TORTURE_SECS`, or the short default.
pub fn workload_secs() -> f64 {
    match std::env::var("TORTURE_SECS") {
        Ok(s) => s
            .parse::<f64>()
            .ok()
            .filter(|s| *s > 0.0)
            .unwrap_or_else(|| panic!("TORTURE_SECS must be a positive number, got {s:?}")),
        Err(_) => DEFAULT_SECS,
    }
}

/// One scenario: a workload, a server setup and a nemesis.
pub struct Scenario {
    pub name: &'static str,
    /// One line for the report.
    pub what: &'static str,
    /// Extra `redis-server` arguments (the replica gets them too).
    pub server_args: &'static [&'static str],
    /// Start a replica of the primary (failover scenarios).
    pub replica: bool,
    pub workload: Config,
    /// No fault of this scenario loses data: every accepted fenced write must be in the end.
    pub durable: bool,
    /// Injects the faults until `env.until`, on the test's thread, while the workload runs.
    pub nemesis: fn(&mut Env),
    /// The scenario's own checks over the finished history (e.g. "the pauses made the
    /// unfenced counter lose updates").
    pub post: Option<fn(&History, &Verdict) -> Vec<Check>>,
}

impl Scenario {
    /// A scenario as most are: no extra server arguments, no replica, the default workload,
    /// durable, and no checks of its own. The methods below change one of those each.
    pub fn new(name: &'static str, what: &'static str, nemesis: fn(&mut Env)) -> Scenario {
        Scenario {
            name,
            what,
            server_args: &[],
            replica: false,
            workload: Config::default(),
            durable: true,
            nemesis,
            post: None,
        }
    }

    pub fn server_args(self, server_args: &'static [&'static str]) -> Scenario {
        Scenario {
            server_args,
            ..self
        }
    }

    pub fn with_replica(self) -> Scenario {
        Scenario {
            replica: true,
            ..self
        }
    }

    pub fn workload(self, workload: Config) -> Scenario {
        Scenario { workload, ..self }
    }

    /// Its faults may lose acknowledged data: accepted fenced writes need not all survive.
    pub fn may_lose_writes(self) -> Scenario {
        Scenario {
            durable: false,
            ..self
        }
    }

    pub fn post(self, post: fn(&History, &Verdict) -> Vec<Check>) -> Scenario {
        Scenario {
            post: Some(post),
            ..self
        }
    }
}

/// What the nemesis works with.
pub struct Env {
    pub rec: Arc<Recorder>,
    /// Where the workload connects; `None` while the server is down.
    pub target: Arc<Target>,
    pub primary: Server,
    pub replica: Option<Server>,
    /// Killed primaries, kept for their logs until the scenario ends.
    pub retired: Vec<Server>,
    pub server_args: Vec<String>,
    pub cfg: Config,
    /// When the workload stops.
    pub until: Instant,
    pub rng: StdRng,
    /// Holder processes started so far (their names are `proc{n}`).
    pub spawned: u64,
}

impl Env {
    pub fn running(&self) -> bool {
        Instant::now() < self.until
    }

    pub fn now(&self) -> Micros {
        self.rec.clock.now()
    }

    /// Sleep a random time in `range` ms, but not past the end of the workload.
    pub fn sleep(&mut self, range: (u64, u64)) {
        let want = Duration::from_millis(self.rng.gen_range(range.0..=range.1));
        let left = self.until.saturating_duration_since(Instant::now());
        thread::sleep(want.min(left));
    }

    pub fn keys(&self) -> Vec<String> {
        (0..self.cfg.keys).map(lock_key).collect()
    }

    pub fn random_key(&mut self) -> String {
        lock_key(self.rng.gen_range(0..self.cfg.keys))
    }

    pub fn choose<T: Clone>(&mut self, items: &[T]) -> Option<T> {
        items.choose(&mut self.rng).cloned()
    }

    /// A connection to the current primary.
    pub fn conn(&self) -> Connection {
        self.primary.conn()
    }

    /// Record a fault that ran from `invoke` to `complete`; returns its index.
    #[allow(clippy::too_many_arguments)]
    pub fn fault_at(
        &self,
        kind: &str,
        keys: Option<Vec<String>>,
        effect: Effect,
        server_side: bool,
        invoke: Micros,
        complete: Micros,
        note: String,
    ) -> usize {
        let wall_ms = crate::history::wall_us() / 1000 - (self.now() - invoke) / 1000;
        self.rec.fault(Fault {
            kind: kind.to_string(),
            invoke,
            complete,
            wall_ms,
            keys,
            effect,
            server_side,
            note,
        })
    }

    /// Run `body` as a fault: stamped before and after, recorded with the note it returns.
    pub fn inject<T>(
        &mut self,
        kind: &str,
        keys: Option<Vec<String>>,
        effect: Effect,
        server_side: bool,
        body: impl FnOnce(&mut Env) -> (T, String),
    ) -> (usize, T) {
        let invoke = self.now();
        let (result, note) = body(self);
        let complete = self.now();
        let index = self.fault_at(kind, keys, effect, server_side, invoke, complete, note);
        (index, result)
    }

    /// Tally a scenario criterion.
    pub fn check(&self, name: &str, criterion: &str, ok: bool, detail: impl FnOnce() -> String) {
        self.rec.check(name, criterion, ok, detail);
    }

    /// Record every key's live token (`LOCK.FENCE`) as known from now on.
    pub fn observe_tokens(&self) {
        let mut c = self.conn();
        for key in self.keys() {
            if let Ok(Value::Int(token)) = redis::cmd("LOCK.FENCE").arg(&key).query(&mut c) {
                self.rec.observe(
                    self.now(),
                    token,
                    format!("LOCK.FENCE {key} by the nemesis"),
                );
            }
        }
    }

    /// Record the server's `lock_token_high_water` as known from now on.
    pub fn observe_high_water(&self) {
        let mut c = self.conn();
        if let Some(hw) = faults::high_water(&mut c) {
            self.rec.observe(
                self.now(),
                hw,
                "INFO lock lock_token_high_water".to_string(),
            );
        }
    }

    /// Read every key's hold on the primary, as the survivors of fault `fault`.
    pub fn snapshot(&self, fault: usize, survival: Survival) {
        let mut c = self.conn();
        let invoke = self.now();
        let holds: BTreeMap<String, Vec<(String, i64)>> = self
            .keys()
            .into_iter()
            .map(|key| {
                let holders = faults::lock_holders(&mut c, &key);
                let holds = holders.into_iter().map(|(owner, token, _)| (owner, token));
                (key, holds.collect())
            })
            .collect();
        let complete = self.now();
        self.rec.snapshot(Snapshot {
            fault,
            invoke,
            complete,
            holds,
            survival,
        });
    }

    /// Start a replica of the current primary with the scenario's arguments and wait until
    /// its initial sync is done.
    pub fn start_replica(&self) -> Server {
        let port = self.primary.port().to_string();
        let mut args: Vec<&str> = self.server_args.iter().map(String::as_str).collect();
        args.extend(["--replicaof", "127.0.0.1", port.as_str()]);
        let replica = Server::start_with(&args);
        let mut c = replica.conn();
        wait_until(
            "the replica's initial sync",
            Duration::from_secs(20),
            || {
                info_field(&mut c, "replication", "master_link_status").as_deref() == Some("up")
                    && info_field(&mut c, "replication", "master_sync_in_progress").as_deref()
                        == Some("0")
            },
        );
        replica
    }
}

/// Run `scenario`; `total` is the number of scenarios in the file (the summary table is
/// printed when the last one finishes).
pub fn run(scenario: Scenario, total: usize) {
    let secs = workload_secs();
    let seed = match std::env::var("TORTURE_SEED") {
        Ok(s) => s.parse().expect("TORTURE_SEED must be an integer"),
        Err(_) => rand::random::<u64>() % 1_000_000,
    };
    let primary = Server::start_with(scenario.server_args);
    let rec = Arc::new(Recorder::new());
    let target = Target::new(primary.port());
    let stop = Arc::new(AtomicBool::new(false));
    let mut env = Env {
        rec: rec.clone(),
        target: target.clone(),
        primary,
        replica: None,
        retired: Vec::new(),
        server_args: scenario.server_args.iter().map(|s| s.to_string()).collect(),
        cfg: scenario.workload.clone(),
        until: Instant::now(),
        rng: StdRng::seed_from_u64(seed),
        spawned: 0,
    };
    if scenario.replica {
        env.replica = Some(env.start_replica());
    }
    env.until = Instant::now() + Duration::from_secs_f64(secs);
    let workers = workload::start_workers(&scenario.workload, &target, rec.clone(), &stop, seed);
    (scenario.nemesis)(&mut env);
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.join().expect("a workload thread panicked");
    }

    quiescence(&env);
    let lists = read_lists(&env);
    let history = rec.finish();
    let mut verdict = checker::check(
        &history,
        &lists,
        &Expect {
            durable: scenario.durable,
        },
    );
    if let Some(post) = scenario.post {
        let extra = post(&history, &verdict);
        verdict.checks.extend(extra);
    }
    let report = Report::new(&scenario, secs, seed, &history, &verdict);
    report.print(&verdict);
    let violations = verdict.violations();
    report::finished(report, total);
    // A failing test keeps each server's directory and prints its log tail (tests/common):
    // keep the last killed primaries, not every one of a long failover run.
    let keep = env.retired.len().saturating_sub(2);
    env.retired.drain(..keep);
    assert_eq!(
        violations, 0,
        "{}: {violations} violations (see the report above)",
        scenario.name
    );
}

/// Pass: once every workload client is gone, no waiter stays queued, no client stays blocked,
/// and no hold is longer than the longest ttl the workload asked for.
fn quiescence(env: &Env) {
    let mut c = env.conn();
    let name = "quiescence";
    let criterion = "once the clients are gone, no waiter stays queued and no hold outlives the \
                     longest ttl asked for";
    let quiet = |c: &mut Connection| {
        info_field(c, "lock", "lock_waiters").as_deref() == Some("0")
            && info_field(c, "clients", "blocked_clients").as_deref() == Some("0")
    };
    let deadline = Instant::now() + QUIET_TIMEOUT;
    while !quiet(&mut c) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    env.check(name, criterion, quiet(&mut c), || {
        format!(
            "still {:?} waiters, {:?} blocked clients {QUIET_TIMEOUT:?} after the clients left",
            info_field(&mut c, "lock", "lock_waiters"),
            info_field(&mut c, "clients", "blocked_clients")
        )
    });
    for key in env.keys() {
        for (owner, token, ttl) in faults::lock_holders(&mut c, &key) {
            env.check(name, criterion, ttl <= env.cfg.ttl_ms.1, || {
                format!("{key} held by {owner} (token {token}) for {ttl} ms more")
            });
        }
    }
}

/// Every fenced resource list on the final primary, by lock key.
fn read_lists(env: &Env) -> BTreeMap<String, Vec<String>> {
    let mut c = env.conn();
    env.keys()
        .into_iter()
        .map(|key| {
            let list: Vec<String> = redis::cmd("LRANGE")
                .arg(fenced_key(&key))
                .arg(0)
                .arg(-1)
                .query(&mut c)
                .unwrap_or_else(|e| panic!("LRANGE {}: {e}", fenced_key(&key)));
            (key, list)
        })
        .collect()
}
