//! `cargo bench --bench inventory` (part of `make bench`): the inventory case of issue 11.
//!
//! 16 workers, 10 items; each order locks 3 distinct random items, holds them 1 ms, and
//! releases them. Three recipes, each on a server of its own, taking turns (5 turns of 2 s
//! each, so that the load of this machine's other processes falls on all three alike):
//! - `LOCK.MACQUIRE ... BLOCK 0`, then `LOCK.MRELEASE`: the whole set in one step;
//! - the client-side recipe with the module: sort the keys, `LOCK.ACQUIRE ... BLOCK 0` each in
//!   turn, then `LOCK.RELEASE` each;
//! - the classic recipe: sort the keys, `SET NX PX` each, retrying every 10 ms, then the
//!   owner-checked release script for each.
//!
//! Reported per recipe: orders per second, the wait (from the first acquire command to holding
//! every item) at p50/p99/max, and the fewest and most orders one worker completed (starvation
//! shows as a low minimum). The table goes to stdout and to `benches/results/inventory.md`
//! (a smoke run: `target/bench/inventory.md`). Under it, where the time goes: the 1 ms sleep
//! as it ran (how late this machine woke the thread), the hold as the client saw it, and the
//! server's `INFO lock` wait and CPU; every order's sleep and hold also go to
//! `target/bench/inventory_samples.txt`, from which `simulate.py --measured` draws its holds.
//!
//! Then the goals of issue 22 (goal 1) on these figures, beside the ceilings that
//! `benches/inventory/simulate.py` puts on the same workload (its table is
//! `benches/results/inventory_simulated.md`), and beside what the same model gives on this
//! run's own samples (`simulate.py --measured`, a few seconds of python3; left out if it
//! fails): they go under the table, and a full `make bench`
//! also adds them to the Goals table of `BENCHMARKS.md` (replacing the rows of an earlier run).
//!
//! Environment: `QUICK=1` runs 2 s per recipe instead of 10; `RECIPES=N` runs the first N (of
//! MACQUIRE, sorted `LOCK.ACQUIRE`, MACQUIRE with `lock.max-overtakes 0`, sorted `SET NX PX`);
//! `RECIPES=2` (the first two) is for quick comparisons of builds. A smoke run, or one picked
//! out with `ONLY=inventory`, writes under `target/bench/`, never over the committed table;
//! `REDIS_SERVER` and `REDIS_LOCK_MODULE` as for the tests (the servers are started by the
//! tests' harness).

#[path = "../../tests/common/mod.rs"]
mod common;

use std::fmt::Write as _;
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use rand::seq::index::sample;
use redis::{Connection, Value};

const WORKERS: usize = 16;
const ITEMS: usize = 10;
const PER_ORDER: usize = 3;
const HOLD: Duration = Duration::from_millis(1);
/// Long enough never to run out during an order.
const TTL_MS: i64 = 10_000;
/// Turns each recipe takes (see `main`).
const SLICES: u32 = 5;
/// The classic recipe's retry interval.
const RETRY: Duration = Duration::from_millis(10);

/// The simulated ceilings of MACQUIRE's orders/s over sorted sequential `LOCK.ACQUIRE`
/// (`python3 benches/inventory/simulate.py`, the server's scan; its full run of 2026-12-01 is
/// `benches/results/inventory_simulated.md`): with the server's bound of 8 overtakes, and
/// greedy (no bound).
const CEILING_BOUND: f64 = 1.50;
const CEILING_GREEDY: f64 = 1.60;
/// MACQUIRE's wait p99 before bounded overtaking (BENCHMARKS.md of 2026-11-30, strict arrival
/// order on every key): the goal is to be no worse.
const BEFORE_P99_MS: f64 = 17.5;

const RELEASE_SCRIPT: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Recipe {
    MAcquire,
    SortedAcquire,
    /// `LOCK.MACQUIRE` on a server with `lock.max-overtakes 0`: strict arrival order on every
    /// key, what MACQUIRE was before bounded overtaking; the p99 goal's reference, measured in
    /// the same run.
    MAcquireStrict,
    SortedSetNx,
}

impl Recipe {
    fn name(self) -> &'static str {
        match self {
            Recipe::MAcquire => "`LOCK.MACQUIRE ... BLOCK` + `LOCK.MRELEASE`",
            Recipe::SortedAcquire => "sorted `LOCK.ACQUIRE ... BLOCK` + `LOCK.RELEASE` each",
            Recipe::MAcquireStrict => {
                "`LOCK.MACQUIRE ... BLOCK` + `LOCK.MRELEASE`, `lock.max-overtakes 0` (strict order)"
            }
            Recipe::SortedSetNx => "sorted `SET NX PX`, retry every 10 ms + release script each",
        }
    }
}

fn item(i: usize) -> String {
    format!("{{inv}}:item:{i}")
}

/// What one order measured.
#[derive(Clone, Copy)]
struct Order {
    /// From the first acquire command to holding every item.
    wait: Duration,
    /// What `thread::sleep(HOLD)` took: the hold, and how late this thread was woken.
    slept: Duration,
    /// From holding every item to the last release's reply.
    held: Duration,
}

/// Sleep `HOLD`; returns how long it took.
fn hold() -> Duration {
    let at = Instant::now();
    thread::sleep(HOLD);
    at.elapsed()
}

/// One order: lock `keys`, hold, release.
fn order(c: &mut Connection, recipe: Recipe, keys: &[String], owner: &str) -> Order {
    let start = Instant::now();
    let (wait, slept) = acquire_hold_release(c, recipe, keys, owner, start);
    Order {
        wait,
        slept,
        held: start.elapsed() - wait,
    }
}

/// The body of [`order`]: returns the wait and the sleep.
fn acquire_hold_release(
    c: &mut Connection,
    recipe: Recipe,
    keys: &[String],
    owner: &str,
    start: Instant,
) -> (Duration, Duration) {
    match recipe {
        Recipe::MAcquire | Recipe::MAcquireStrict => {
            let reply: Value = redis::cmd("LOCK.MACQUIRE")
                .arg(keys.len())
                .arg(keys)
                .arg(owner)
                .arg(TTL_MS)
                .arg("BLOCK")
                .arg(0)
                .query(c)
                .expect("LOCK.MACQUIRE");
            assert!(matches!(reply, Value::Array(_)), "LOCK.MACQUIRE: {reply:?}");
            let waited = start.elapsed();
            let slept = hold();
            let n: i64 = redis::cmd("LOCK.MRELEASE")
                .arg(keys.len())
                .arg(keys)
                .arg(owner)
                .query(c)
                .expect("LOCK.MRELEASE");
            assert_eq!(n, keys.len() as i64);
            (waited, slept)
        }
        Recipe::SortedAcquire => {
            for key in keys {
                let token: Option<i64> = redis::cmd("LOCK.ACQUIRE")
                    .arg(key)
                    .arg(owner)
                    .arg(TTL_MS)
                    .arg("BLOCK")
                    .arg(0)
                    .query(c)
                    .expect("LOCK.ACQUIRE");
                assert!(token.is_some(), "LOCK.ACQUIRE BLOCK 0 answered nil");
            }
            let waited = start.elapsed();
            let slept = hold();
            for key in keys {
                let n: i64 = redis::cmd("LOCK.RELEASE")
                    .arg(key)
                    .arg(owner)
                    .query(c)
                    .expect("LOCK.RELEASE");
                assert_eq!(n, 1);
            }
            (waited, slept)
        }
        Recipe::SortedSetNx => {
            for key in keys {
                loop {
                    let ok: Option<String> = redis::cmd("SET")
                        .arg(key)
                        .arg(owner)
                        .arg("NX")
                        .arg("PX")
                        .arg(TTL_MS)
                        .query(c)
                        .expect("SET NX PX");
                    if ok.is_some() {
                        break;
                    }
                    thread::sleep(RETRY);
                }
            }
            let waited = start.elapsed();
            let slept = hold();
            for key in keys {
                let n: i64 = redis::cmd("EVAL")
                    .arg(RELEASE_SCRIPT)
                    .arg(1)
                    .arg(key)
                    .arg(owner)
                    .query(c)
                    .expect("release script");
                assert_eq!(n, 1);
            }
            (waited, slept)
        }
    }
}

struct Result {
    recipe: Recipe,
    orders: usize,
    elapsed: Duration,
    /// Every order's wait, sorted.
    waits: Vec<Duration>,
    /// Every order's `thread::sleep(HOLD)`, sorted.
    slept: Vec<Duration>,
    /// Every order's hold as the client saw it (all held to the last release's reply), sorted.
    held: Vec<Duration>,
    per_worker: Vec<usize>,
    /// What the server counted during the run: `INFO lock` (this recipe's own server) and the
    /// server's CPU seconds (user + sys) over the run.
    server: ServerView,
}

/// The server's side of one run (each recipe gets a fresh server, so `INFO lock` is its own).
impl ServerView {
    /// `INFO lock` of the recipe's server, and `cpu_s` as measured over its slices.
    fn read(server: &common::Server, cpu_s: f64) -> ServerView {
        let info = |f: &str| server.info_field("lock", &format!("lock_{f}"));
        let count = |f: &str| info(f).and_then(|v| v.parse().ok()).unwrap_or(0);
        ServerView {
            acquired: count("acquired"),
            contended: count("contended"),
            handed_off: count("handed_off"),
            sets_overtaken: count("sets_overtaken"),
            wait: info("wait_ms").unwrap_or_default(),
            hold: info("hold_ms").unwrap_or_default(),
            cpu_s,
            version: server_version(server),
        }
    }
}

impl Result {
    /// `self` and a later slice of the same recipe, as one run.
    fn merge(mut self, later: Result) -> Result {
        let join = |a: Vec<Duration>, b: Vec<Duration>| {
            let mut v = [a, b].concat();
            v.sort_unstable();
            v
        };
        self.orders += later.orders;
        self.elapsed += later.elapsed;
        self.waits = join(self.waits, later.waits);
        self.slept = join(self.slept, later.slept);
        self.held = join(self.held, later.held);
        for (mine, theirs) in self.per_worker.iter_mut().zip(later.per_worker) {
            *mine += theirs;
        }
        self.server.cpu_s += later.server.cpu_s;
        self
    }
}

/// The server's side of a recipe's run.
#[derive(Default)]
struct ServerView {
    acquired: i64,
    /// Calls that could not be granted at once and queued (`lock_contended`).
    contended: i64,
    /// Queued waiters granted (`lock_handed_off`).
    handed_off: i64,
    /// Times a waiting `LOCK.MACQUIRE` set was passed (`lock_sets_overtaken`).
    sets_overtaken: i64,
    /// `lock_wait_ms`: from queueing to the grant, queued waiters only (server clock).
    wait: String,
    /// `lock_hold_ms`: grant to release, millisecond resolution.
    hold: String,
    cpu_s: f64,
    /// `Redis 7.0.15`, as lockbench's Goals table names the server.
    version: String,
}

fn server_cpu(server: &common::Server) -> f64 {
    ["used_cpu_user", "used_cpu_sys"]
        .iter()
        .filter_map(|f| server.info_field("cpu", f)?.parse::<f64>().ok())
        .sum()
}

/// One slice of a recipe's run on its own server: `WORKERS` workers for `length`.
fn run(server: &common::Server, recipe: Recipe, length: Duration) -> Result {
    let cpu_before = server_cpu(server);
    let barrier = Barrier::new(WORKERS + 1);
    let deadline_after = length;
    let (per_worker, orders, elapsed) = thread::scope(|s| {
        let handles: Vec<_> = (0..WORKERS)
            .map(|w| {
                let mut c = server.conn();
                let barrier = &barrier;
                s.spawn(move || {
                    let mut rng = rand::thread_rng();
                    let mut orders = vec![];
                    barrier.wait();
                    let end = Instant::now() + deadline_after;
                    while Instant::now() < end {
                        let mut picked: Vec<usize> = sample(&mut rng, ITEMS, PER_ORDER).into_vec();
                        picked.sort_unstable();
                        let keys: Vec<String> = picked.into_iter().map(item).collect();
                        let owner = format!("w{w}:{}", orders.len());
                        orders.push(order(&mut c, recipe, &keys, &owner));
                    }
                    orders
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        let results: Vec<Vec<Order>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let elapsed = start.elapsed();
        let per_worker = results.iter().map(Vec::len).collect::<Vec<_>>();
        (per_worker, results.concat(), elapsed)
    });
    let view = ServerView {
        cpu_s: server_cpu(server) - cpu_before,
        ..ServerView::default()
    };
    let sorted = |f: fn(&Order) -> Duration| {
        let mut v: Vec<Duration> = orders.iter().map(f).collect();
        v.sort_unstable();
        v
    };
    Result {
        recipe,
        orders: orders.len(),
        elapsed,
        waits: sorted(|o| o.wait),
        slept: sorted(|o| o.slept),
        held: sorted(|o| o.held),
        per_worker,
        server: view,
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is expected.
    let quick = std::env::var("QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    let secs = if quick { 2 } else { 10 };
    let mut results = vec![];
    // `RECIPES=2` runs the first two only (MACQUIRE and sorted `LOCK.ACQUIRE`), for quick
    // comparisons while working on the queue; the report then has two rows.
    let recipes = std::env::var("RECIPES")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(4)
        .clamp(1, 4);
    let recipes: Vec<Recipe> = [
        Recipe::MAcquire,
        Recipe::SortedAcquire,
        Recipe::MAcquireStrict,
        Recipe::SortedSetNx,
    ]
    .into_iter()
    .take(recipes)
    .collect();
    // The recipes take turns, `SLICES` times each, so that a change in this machine's load
    // (other processes on its 2 cores) falls on all of them alike rather than on whichever ran
    // at that moment: the ratio between them is what the goals judge. One server per recipe,
    // so each has its own `INFO lock`.
    let servers: Vec<common::Server> = recipes
        .iter()
        .map(|r| {
            let server = common::Server::start();
            if *r == Recipe::MAcquireStrict {
                let _: () = redis::cmd("CONFIG")
                    .arg("SET")
                    .arg("lock.max-overtakes")
                    .arg(0)
                    .query(&mut server.conn())
                    .expect("CONFIG SET lock.max-overtakes 0");
            }
            server
        })
        .collect();
    let slice = Duration::from_secs(secs) / SLICES;
    let mut slices: Vec<Option<Result>> = recipes.iter().map(|_| None).collect();
    eprintln!(
        "inventory: {} recipes, {SLICES} turns of {} ms each ...",
        recipes.len(),
        slice.as_millis()
    );
    for _ in 0..SLICES {
        for (i, recipe) in recipes.iter().enumerate() {
            let r = run(&servers[i], *recipe, slice);
            slices[i] = Some(match slices[i].take() {
                Some(before) => before.merge(r),
                None => r,
            });
        }
    }
    for (slice, server) in slices.into_iter().zip(&servers) {
        let mut r = slice.expect("every recipe ran");
        r.server = ServerView::read(server, r.server.cpu_s);
        results.push(r);
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{WORKERS} workers, {ITEMS} items, {PER_ORDER} random items per order, each held {} ms; \
         {secs} s per recipe in {SLICES} turns taken in rotation, a server of its own for \
         each (`{}`).\n",
        HOLD.as_millis(),
        std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into()),
    );
    let _ = writeln!(
        out,
        "| recipe | orders/s | vs MACQUIRE | wait p50 ms | p99 ms | max ms | orders per worker (min .. max) |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---|");
    let base = results[0].orders as f64 / results[0].elapsed.as_secs_f64();
    for r in &results {
        let rate = r.orders as f64 / r.elapsed.as_secs_f64();
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.2}x | {} | {} | {} | {} .. {} |",
            r.recipe.name(),
            rate,
            rate / base,
            ms(percentile(&r.waits, 0.5)),
            ms(percentile(&r.waits, 0.99)),
            ms(*r.waits.last().unwrap_or(&Duration::ZERO)),
            r.per_worker.iter().min().unwrap_or(&0),
            r.per_worker.iter().max().unwrap_or(&0),
        );
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    // Every order's sleep and client-seen hold, in microseconds (`simulate.py --measured` draws
    // its holds from them).
    let samples: String = results
        .iter()
        .flat_map(|r| {
            let recipe = format!("{:?}", r.recipe);
            r.slept
                .iter()
                .zip(&r.held)
                .map(move |(s, h)| format!("{recipe} {} {}\n", s.as_micros(), h.as_micros()))
        })
        .collect();
    let samples_path = root.join("target/bench/inventory_samples.txt");
    let _ = std::fs::create_dir_all(root.join("target/bench"))
        .and_then(|()| std::fs::write(&samples_path, samples));
    let model = Model::of(root, &samples_path);
    let goals = goals(&results, model.as_ref());
    out.push_str(&diagnostics(&results));
    let place = format!("{}, inventory", results[0].server.version);
    let _ = writeln!(out, "\nGoals (issue 22, goal 1):\n");
    let _ = writeln!(
        out,
        "| where | goal | measured | verdict |\n|---|---|---|---|"
    );
    let rows: String = goals
        .iter()
        .map(|(goal, measured, met)| {
            let verdict = if *met { "**met**" } else { "**missed**" };
            format!("| {place} | {goal} | {measured} | {verdict} |\n")
        })
        .collect();
    out.push_str(&rows);
    print!("{out}");
    // Only a full `make bench` writes the committed table (as lockbench does).
    let partial = std::env::var("ONLY").is_ok_and(|v| !v.is_empty());
    let dir = root.join(if quick || partial {
        "target/bench"
    } else {
        "benches/results"
    });
    let path = dir.join("inventory.md");
    let doc = format!(
        "# Inventory benchmark (`cargo bench --bench inventory`)\n\n{out}\nThe wait is from \
         the first acquire command of an order to holding all of its items. `LOCK.MACQUIRE` \
         keeps arrival order on every key save a bounded overtaking: a waiting order whose items \
         are all free may go before orders that wait for a busy item, at most 8 times per \
         waiting order (`lock.max-overtakes`, docs/commands.md); the strict-order row is the \
         same MACQUIRE recipe on a server with `lock.max-overtakes 0`, what MACQUIRE was before \
         the bound, and the p99 goal's reference in the same run. The sorted sequential recipes hold some items while \
         waiting for others and let later orders use free items first. The simulated ceilings \
         are ratios on a model of this workload (`python3 benches/inventory/simulate.py`, \
         `benches/results/inventory_simulated.md`), not rates of this machine: the first with \
         a constant 1.08 ms hold and 0.03 ms round trips, the second (\"on this run's client \
         side\") with the holds and reply delays drawn from this run's own samples \
         (`simulate.py --measured`), as is strict FIFO's p99 beside the measured one. The \
         recipes take turns so that the machine's load falls on them alike; the sorted \
         recipes wait for a reply 6 times per order against MACQUIRE's 2, so the ratio still \
         rises with the load (`benches/results/inventory_runs.md`).\n"
    );
    if !(quick || partial) && results.len() == 4 {
        add_goals_to_report(&root.join("BENCHMARKS.md"), &rows);
    }
    match std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, doc)) {
        Ok(()) => eprintln!("inventory: wrote {}", path.display()),
        Err(e) => eprintln!("inventory: cannot write {}: {e}", path.display()),
    }
}

/// Where the time goes, per recipe: the client's side (the 1 ms sleep as it ran, so how late
/// a thread was woken; the hold from all held to the last release's reply) and the server's
/// (`INFO lock` of the recipe's own server: calls that queued, their wait on the server's
/// clock; its CPU). The client's wait minus the server's is the round trip and the client
/// thread's wake-up after the grant.
fn diagnostics(results: &[Result]) -> String {
    let mut out = String::from(
        "\nWhere the time goes (client: `thread::sleep(1 ms)` as it ran, the hold from all held \
         to the last release's reply; server: `INFO lock` of the recipe's own server, \
         `lock_wait_ms` counts queued calls only):\n\n\
         | recipe | sleep p50 ms | p99 | max | client hold mean ms | p99 | queued / acquire calls \
         | handed off | sets overtaken per order | server wait (queued) | server hold mean ms (1 ms resolution) \
         | server CPU % of one core |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|\n",
    );
    for r in results {
        let mean = |v: &[Duration]| {
            v.iter().map(Duration::as_secs_f64).sum::<f64>() * 1000.0 / v.len().max(1) as f64
        };
        let calls = match r.recipe {
            // One MACQUIRE per order; `lock_acquired` counts keys.
            Recipe::MAcquire | Recipe::MAcquireStrict => r.orders as i64,
            _ => r.server.acquired.max(1),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {:.2} | {} | {:.2} | {} | {:.2} | {} | {} | {:.1} |",
            r.recipe.name(),
            ms(percentile(&r.slept, 0.5)),
            ms(percentile(&r.slept, 0.99)),
            ms(*r.slept.last().unwrap_or(&Duration::ZERO)),
            mean(&r.held),
            ms(percentile(&r.held, 0.99)),
            r.server.contended as f64 / calls.max(1) as f64,
            r.server.handed_off,
            r.server.sets_overtaken as f64 / r.orders.max(1) as f64,
            r.server.wait.replace(',', ", "),
            summary_field(&r.server.hold, "mean"),
            r.server.cpu_s / r.elapsed.as_secs_f64() * 100.0,
        );
    }
    out
}

/// `field` of an `INFO lock` summary (`count=..,mean=..,...`).
fn summary_field<'a>(summary: &'a str, field: &str) -> &'a str {
    summary
        .split(',')
        .find_map(|kv| kv.strip_prefix(field)?.strip_prefix('='))
        .unwrap_or("-")
}

/// The server's name and version, as lockbench's Goals table names it (`Redis 7.0.15`).
fn server_version(server: &common::Server) -> String {
    let valkey = server.info_field("server", "valkey_version");
    let redis = server.info_field("server", "redis_version");
    match (valkey, redis) {
        (Some(v), _) => format!("Valkey {v}"),
        (None, Some(v)) => format!("Redis {v}"),
        _ => "server".into(),
    }
}

/// `simulate.py` on this run's own client side (`--measured`: holds and reply wake-ups drawn
/// from this run's samples): orders/s and wait p99 (ms) of each policy.
struct Model {
    sorted: (f64, f64),
    fifo: (f64, f64),
    bound: (f64, f64),
    greedy: (f64, f64),
}

impl Model {
    /// Run the model (2 seeds x 3 s, a few seconds); `None` if python3 is missing or fails.
    fn of(root: &std::path::Path, samples: &std::path::Path) -> Option<Model> {
        let out = std::process::Command::new("python3")
            .arg(root.join("benches/inventory/simulate.py"))
            .arg("--measured")
            .arg(samples)
            .args(["--quick", "--line"])
            .output()
            .ok()?;
        let v: Vec<f64> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        if !out.status.success() || v.len() != 8 {
            eprintln!("inventory: simulate.py --measured failed");
            return None;
        }
        Some(Model {
            sorted: (v[0], v[1]),
            fifo: (v[2], v[3]),
            bound: (v[4], v[5]),
            greedy: (v[6], v[7]),
        })
    }
}

/// Goal 1 of issue 22 on this run: (goal, measured, met).
fn goals(results: &[Result], model: Option<&Model>) -> Vec<(String, String, bool)> {
    let rate = |r: &Result| r.orders as f64 / r.elapsed.as_secs_f64();
    let (Some(m), Some(sorted)) = (
        results.iter().find(|r| r.recipe == Recipe::MAcquire),
        results.iter().find(|r| r.recipe == Recipe::SortedAcquire),
    ) else {
        return vec![];
    };
    let ratio = rate(m) / rate(sorted);
    let p99_of = |r: &Result| percentile(&r.waits, 0.99).as_secs_f64() * 1000.0;
    let p99 = p99_of(m);
    // The reference: strict order measured in this run (the same load), when it ran; else
    // the figure of 2026-11-30.
    let strict = results.iter().find(|r| r.recipe == Recipe::MAcquireStrict);
    let (reference, reference_text) = match strict {
        Some(s) => (
            p99_of(s),
            format!(
                "strict arrival order, `lock.max-overtakes 0`, in this run: {:.2} ms at {:.0} \
                 orders/s; {BEFORE_P99_MS} ms in BENCHMARKS.md of 2026-11-30",
                p99_of(s),
                rate(s)
            ),
        ),
        None => (
            BEFORE_P99_MS,
            format!("{BEFORE_P99_MS} ms, BENCHMARKS.md of 2026-11-30"),
        ),
    };
    let fewest = *m.per_worker.iter().min().unwrap_or(&0) as f64;
    let mean = m.orders as f64 / m.per_worker.len().max(1) as f64;
    vec![
        (
            "inventory, 16 workers, 10 items, 3 per order, 1 ms holds: `LOCK.MACQUIRE ... BLOCK` \
             orders/s >= 1.5x sorted sequential `LOCK.ACQUIRE ... BLOCK`"
                .into(),
            format!(
                "{ratio:.2}x ({:.0} vs {:.0} /s); simulated ceiling {CEILING_BOUND:.2}x with the \
                 bound of 8 overtakes ({:.0}% of it), {CEILING_GREEDY:.2}x greedy{}",
                rate(m),
                rate(sorted),
                ratio / CEILING_BOUND * 100.0,
                model.map_or(String::new(), |md| {
                    let bound = md.bound.0 / md.sorted.0;
                    format!(
                        "; on this run's client side (`simulate.py --measured`) {bound:.2}x \
                         with the bound ({:.0}% of it), {:.2}x greedy",
                        ratio / bound * 100.0,
                        md.greedy.0 / md.sorted.0
                    )
                })
            ),
            ratio >= 1.5,
        ),
        (
            "inventory: `LOCK.MACQUIRE ... BLOCK` wait p99 no worse than before bounded \
             overtaking"
                .to_string(),
            format!(
                "{p99:.2} ms vs {reference:.2} ms ({reference_text}){}",
                model.map_or(String::new(), |md| format!(
                    "; on this run's client side the model gives {:.1} ms with the bound, {:.1} \
                     ms under strict FIFO",
                    md.bound.1, md.fifo.1
                ))
            ),
            p99 <= reference,
        ),
        (
            "inventory: `LOCK.MACQUIRE ... BLOCK` fewest orders of any worker >= 0.8x the mean"
                .into(),
            format!("{:.2}x ({fewest:.0} vs {mean:.0})", fewest / mean.max(1.0)),
            fewest >= 0.8 * mean,
        ),
    ]
}

/// Put `rows` at the end of the Goals table of the report lockbench just wrote, in place of
/// any inventory rows an earlier run left there.
fn add_goals_to_report(path: &std::path::Path, rows: &str) {
    let Ok(report) = std::fs::read_to_string(path) else {
        eprintln!("inventory: no {} to add the goals to", path.display());
        return;
    };
    let Some(table) = report
        .find("## Goals\n")
        .and_then(|at| report[at..].find("|---").map(|i| at + i))
    else {
        eprintln!("inventory: {} has no Goals table", path.display());
        return;
    };
    // The table ends at the first blank line after its rule.
    let end = report[table..]
        .find("\n\n")
        .map_or(report.len(), |i| table + i + 1);
    let kept: String = report[table..end]
        .lines()
        .filter(|l| !l.contains(", inventory |"))
        .map(|l| format!("{l}\n"))
        .collect();
    let updated = format!("{}{kept}{rows}{}", &report[..table], &report[end..]);
    match std::fs::write(path, updated) {
        Ok(()) => eprintln!("inventory: added the goals to {}", path.display()),
        Err(e) => eprintln!("inventory: cannot write {}: {e}", path.display()),
    }
}
