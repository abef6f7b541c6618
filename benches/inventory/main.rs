//! `cargo bench --bench inventory` (part of `make bench`): the inventory case of issue 11.
//!
//! 16 workers, 10 items; each order locks 3 distinct random items, holds them 1 ms, and
//! releases them. Three recipes, one after another on the same server:
//! - `LOCK.MACQUIRE ... BLOCK 0`, then `LOCK.MRELEASE`: the whole set in one step;
//! - the client-side recipe with the module: sort the keys, `LOCK.ACQUIRE ... BLOCK 0` each in
//!   turn, then `LOCK.RELEASE` each;
//! - the classic recipe: sort the keys, `SET NX PX` each, retrying every 10 ms, then the
//!   owner-checked release script for each.
//!
//! Reported per recipe: orders per second, the wait (from the first acquire command to holding
//! every item) at p50/p99/max, and the fewest and most orders one worker completed (starvation
//! shows as a low minimum). The table goes to stdout and to `benches/results/inventory.md`
//! (a smoke run: `target/bench/inventory.md`).
//!
//! Then the goals of issue 22 (goal 1) on these figures, beside the ceilings that
//! `benches/inventory/simulate.py` puts on the same workload (its table is
//! `benches/results/inventory_simulated.md`): they go under the table, and a full `make bench`
//! also adds them to the Goals table of `BENCHMARKS.md` (replacing the rows of an earlier run).
//!
//! Environment: `QUICK=1` runs 2 s per recipe instead of 10; `RECIPES=2` runs the first two
//! recipes only (for quick comparisons). A smoke run, or one picked out
//! with `ONLY=inventory`, writes under `target/bench/`, never over the committed table; `REDIS_SERVER` and `REDIS_LOCK_MODULE` as for the tests (the
//! server is started by the tests' harness).

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
    SortedSetNx,
}

impl Recipe {
    fn name(self) -> &'static str {
        match self {
            Recipe::MAcquire => "`LOCK.MACQUIRE ... BLOCK` + `LOCK.MRELEASE`",
            Recipe::SortedAcquire => "sorted `LOCK.ACQUIRE ... BLOCK` + `LOCK.RELEASE` each",
            Recipe::SortedSetNx => "sorted `SET NX PX`, retry every 10 ms + release script each",
        }
    }
}

fn item(i: usize) -> String {
    format!("{{inv}}:item:{i}")
}

/// One order: lock `keys`, hold, release. Returns the wait (first command to all held).
fn order(c: &mut Connection, recipe: Recipe, keys: &[String], owner: &str) -> Duration {
    let start = Instant::now();
    match recipe {
        Recipe::MAcquire => {
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
            thread::sleep(HOLD);
            let n: i64 = redis::cmd("LOCK.MRELEASE")
                .arg(keys.len())
                .arg(keys)
                .arg(owner)
                .query(c)
                .expect("LOCK.MRELEASE");
            assert_eq!(n, keys.len() as i64);
            waited
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
            thread::sleep(HOLD);
            for key in keys {
                let n: i64 = redis::cmd("LOCK.RELEASE")
                    .arg(key)
                    .arg(owner)
                    .query(c)
                    .expect("LOCK.RELEASE");
                assert_eq!(n, 1);
            }
            waited
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
            thread::sleep(HOLD);
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
            waited
        }
    }
}

struct Result {
    recipe: Recipe,
    orders: usize,
    elapsed: Duration,
    /// Every order's wait, sorted.
    waits: Vec<Duration>,
    per_worker: Vec<usize>,
}

fn run(server: &common::Server, recipe: Recipe, secs: u64) -> Result {
    let barrier = Barrier::new(WORKERS + 1);
    let deadline_after = Duration::from_secs(secs);
    let (per_worker, mut waits, elapsed) = thread::scope(|s| {
        let handles: Vec<_> = (0..WORKERS)
            .map(|w| {
                let mut c = server.conn();
                let barrier = &barrier;
                s.spawn(move || {
                    let mut rng = rand::thread_rng();
                    let mut waits = vec![];
                    barrier.wait();
                    let end = Instant::now() + deadline_after;
                    while Instant::now() < end {
                        let mut picked: Vec<usize> = sample(&mut rng, ITEMS, PER_ORDER).into_vec();
                        picked.sort_unstable();
                        let keys: Vec<String> = picked.into_iter().map(item).collect();
                        let owner = format!("w{w}:{}", waits.len());
                        waits.push(order(&mut c, recipe, &keys, &owner));
                    }
                    waits
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        let results: Vec<Vec<Duration>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let elapsed = start.elapsed();
        let per_worker = results.iter().map(Vec::len).collect::<Vec<_>>();
        (per_worker, results.concat(), elapsed)
    });
    waits.sort_unstable();
    Result {
        recipe,
        orders: waits.len(),
        elapsed,
        waits,
        per_worker,
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
    let server = common::Server::start();
    let mut results = vec![];
    // `RECIPES=2` runs the first two only (MACQUIRE and sorted `LOCK.ACQUIRE`), for quick
    // comparisons while working on the queue; the report then has two rows.
    let recipes = std::env::var("RECIPES")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(3)
        .clamp(1, 3);
    for recipe in [Recipe::MAcquire, Recipe::SortedAcquire, Recipe::SortedSetNx]
        .into_iter()
        .take(recipes)
    {
        eprintln!("inventory: {} for {secs} s ...", recipe.name());
        results.push(run(&server, recipe, secs));
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{WORKERS} workers, {ITEMS} items, {PER_ORDER} random items per order, each held {} ms; \
         {secs} s per recipe, one server (`{}`).\n",
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
    let goals = goals(&results);
    let place = format!("{}, inventory", server_version(&server));
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
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
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
         waiting order (docs/commands.md). The sorted sequential recipes hold some items while \
         waiting for others and let later orders use free items first. The simulated ceilings \
         are ratios on a model of this workload (`python3 benches/inventory/simulate.py`, \
         `benches/results/inventory_simulated.md`), not rates of this machine.\n"
    );
    if !(quick || partial) && results.len() == 3 {
        add_goals_to_report(&root.join("BENCHMARKS.md"), &rows);
    }
    match std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, doc)) {
        Ok(()) => eprintln!("inventory: wrote {}", path.display()),
        Err(e) => eprintln!("inventory: cannot write {}: {e}", path.display()),
    }
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

/// Goal 1 of issue 22 on this run: (goal, measured, met).
fn goals(results: &[Result]) -> Vec<(String, String, bool)> {
    let rate = |r: &Result| r.orders as f64 / r.elapsed.as_secs_f64();
    let (Some(m), Some(sorted)) = (
        results.iter().find(|r| r.recipe == Recipe::MAcquire),
        results.iter().find(|r| r.recipe == Recipe::SortedAcquire),
    ) else {
        return vec![];
    };
    let ratio = rate(m) / rate(sorted);
    let p99 = percentile(&m.waits, 0.99).as_secs_f64() * 1000.0;
    let fewest = *m.per_worker.iter().min().unwrap_or(&0) as f64;
    let mean = m.orders as f64 / m.per_worker.len().max(1) as f64;
    vec![
        (
            "inventory, 16 workers, 10 items, 3 per order, 1 ms holds: `LOCK.MACQUIRE ... BLOCK` \
             orders/s >= 1.5x sorted sequential `LOCK.ACQUIRE ... BLOCK`"
                .into(),
            format!(
                "{ratio:.2}x ({:.0} vs {:.0} /s); simulated ceiling {CEILING_BOUND:.2}x with the \
                 bound of 8 overtakes ({:.0}% of it), {CEILING_GREEDY:.2}x greedy",
                rate(m),
                rate(sorted),
                ratio / CEILING_BOUND * 100.0
            ),
            ratio >= 1.5,
        ),
        (
            format!(
                "inventory: `LOCK.MACQUIRE ... BLOCK` wait p99 no worse than before bounded \
                 overtaking ({BEFORE_P99_MS} ms, BENCHMARKS.md of 2026-11-30)"
            ),
            format!("{p99:.2} ms vs {BEFORE_P99_MS} ms"),
            p99 <= BEFORE_P99_MS,
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
