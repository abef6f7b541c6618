//! `make bench` (`cargo bench --bench lockbench`): redis-lock against the classic client-side
//! pattern (`SET NX PX`, a Lua release script, retry loops) and against the lock libraries
//! users pick instead, every side measured in the same run on the same server, so that the
//! machine's drift hits both.
//!
//! # Layout
//! - `config`: what the environment asks for (servers, module, full run or `QUICK=1`).
//! - `server`: a `redis-server` with the module on a port the OS chose (bare, or with AOF and
//!   a replica), or `REDIS_URL`; `INFO` helpers.
//! - `load`: a pipelined load generator over raw RESP (many connections, N in flight each)
//!   that checks every reply, with the server's CPU and `INFO commandstats` around it.
//! - `scenarios/`: one file per scenario, registered in `scenarios::ALL`.
//! - `instruction_goals`: the Goals table's rows of `make bench-instructions`' figures.
//! - `report`: `BENCHMARKS.md` and `benches/results/results.json` (written by hand: no
//!   plotting or serialisation crate).
//! - `peers/`: the worker scripts of the real lock libraries (Python, Node).
//!
//! # What runs where
//! Every scenario runs on the first server (`REDIS_SERVER`); the headline ones also on each of
//! `BENCH_SERVERS`, and the matrix ones on `BENCH_MATRIX` too. Uncontended scenarios run twice
//! on each of their servers: bare, and with `appendonly yes` + `appendfsync everysec` and a
//! replica attached.
//!
//! # Environment
//! - `QUICK=1`: a smoke run (smaller counts, short contention rounds). It writes under
//!   `target/bench/` (`BENCHMARKS.md`, `results.json`, charts), never over the committed
//!   report: only a full run of every scenario writes `BENCHMARKS.md` and `benches/results/`.
//! - `REDIS_URL=redis://127.0.0.1:PORT`: use a running server (empty, with the module loaded,
//!   on this machine: the benchmark flushes it and reads its CPU use). Only that server, bare.
//! - `REDIS_LOCK_MODULE`: the module (default `<crate>/target/release/libredis_lock.so`).
//! - `REDIS_SERVER`, `REDIS_BENCHMARK`: the binaries (default from `PATH`).
//! - `BENCH_SERVERS`, `BENCH_MATRIX`: more server binaries, space-separated.
//! - `ONLY=contention,peers`: run only these scenarios (by id), for a quick look; the report
//!   then goes to `target/bench/only.md` and `only.json`, leaving BENCHMARKS.md alone.
//!
//! Every connection goes to 127.0.0.1 and every loop is bounded in count or time.

mod config;
mod instruction_goals;
mod load;
mod report;
mod scenarios;
mod server;
mod stats;
mod waits_svg;
mod workers;

use std::fs;
use std::path::Path;
use std::thread;
use std::time::Instant;

use config::{Config, Sizes, RELEASE_SCRIPT};
use report::{Done, Machine, Report};
use scenarios::{Env, Servers, Setting};
use server::{flushall, Server};

fn main() {
    // The leader process of the feed_latency scenario: this binary started again by it.
    if let Ok(spec) = std::env::var(scenarios::feed_latency::LEADER_ENV) {
        scenarios::feed_latency::leader_process(&spec);
        return;
    }
    if let Err(e) = run() {
        eprintln!("lockbench: {e}");
        std::process::exit(1);
    }
}

/// The servers of the run and which scenarios each takes.
fn plan(cfg: &Config) -> Vec<(String, Servers)> {
    let mut out = vec![(cfg.server_bin.clone(), Servers::First)];
    if cfg.existing_port.is_none() {
        out.extend(
            cfg.headline_bins
                .iter()
                .map(|b| (b.clone(), Servers::Headline)),
        );
        out.extend(cfg.matrix_bins.iter().map(|b| (b.clone(), Servers::Matrix)));
    }
    out
}

/// Does a scenario that runs on `wants` run on a server of `tier`?
fn runs_on(wants: Servers, tier: Servers) -> bool {
    match tier {
        Servers::First => true,
        Servers::Headline => wants != Servers::First,
        Servers::Matrix => wants == Servers::Matrix,
    }
}

fn run() -> Result<(), String> {
    let started = Instant::now();
    let load_before = report::loadavg();
    let cfg = Config::from_env()?;
    let sizes = Sizes::new(cfg.quick);
    let only = &cfg.only;
    let mut done = Vec::new();
    let mut servers = Vec::new();
    let mut module = String::from("lock");
    for (bin, tier) in plan(&cfg) {
        for setting in [Setting::Bare, Setting::Production] {
            let todo: Vec<_> = scenarios::ALL
                .iter()
                .filter(|e| runs_on(e.servers, tier))
                .filter(|e| setting == Setting::Bare || e.uncontended)
                .filter(|e| only.is_empty() || only.iter().any(|o| o == e.id))
                .collect();
            if todo.is_empty() || (setting == Setting::Production && cfg.existing_port.is_some()) {
                continue;
            }
            let srv = match setting {
                Setting::Bare => Server::start(&cfg, &bin)?,
                Setting::Production => Server::production(&cfg, &bin)?,
            };
            let mut ctl = srv.connect();
            let name = Server::name(&mut ctl);
            if setting == Setting::Bare {
                servers.push(format!("{name} (`{bin}`)"));
                module = module_version(&mut ctl);
            }
            eprintln!(
                "lockbench: {name}, {} on 127.0.0.1:{}{}",
                setting.label(),
                srv.port,
                if cfg.quick { " (QUICK)" } else { "" }
            );
            let sha: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(RELEASE_SCRIPT)
                .query(&mut ctl)
                .map_err(|e| format!("SCRIPT LOAD: {e}"))?;
            for entry in todo {
                let mut scenario = (entry.make)();
                let mut env = Env {
                    cfg: &cfg,
                    sizes: &sizes,
                    srv: &srv,
                    ctl: &mut ctl,
                    sha: &sha,
                };
                scenario.run(&mut env);
                flushall(&mut ctl);
                done.push(Done {
                    server: name.clone(),
                    setting,
                    entry,
                    scenario,
                });
            }
        }
    }

    if done.is_empty() {
        // `ONLY=inventory`: nothing of this benchmark was asked for.
        eprintln!("lockbench: no scenario matches ONLY={}", only.join(","));
        return Ok(());
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let report = Report {
        cfg: &cfg,
        machine: Machine {
            cpus: thread::available_parallelism().map_or(0, |n| n.get()),
            cpu_model: report::cpu_model(),
            date: report::utc_now(),
            servers,
            module,
            started_here: cfg.existing_port.is_none(),
            source: report::git_describe(),
            load_before,
            load_after: report::loadavg(),
        },
        total_secs: started.elapsed().as_secs_f64(),
        done,
        instructions: fs::read_to_string(root.join("benches/results/instructions.md")).ok(),
        instruction_goals: ["instructions.json", "instructions_handoff.json"]
            .iter()
            .filter_map(|f| fs::read_to_string(root.join("benches/results").join(f)).ok())
            .flat_map(|j| instruction_goals::goals(&j))
            .collect(),
    };
    let out = &cfg.out;
    fs::create_dir_all(&out.dir).map_err(|e| format!("{}: {e}", out.dir.display()))?;
    let md = report.markdown();
    let mut written = vec![out.markdown.clone(), out.json.clone()];
    fs::write(&out.markdown, &md).map_err(|e| e.to_string())?;
    fs::write(&out.json, report.json()).map_err(|e| e.to_string())?;
    // Extra files (charts) come from each scenario's first run: the first server, bare.
    for d in &report.done {
        for (name, text) in d.scenario.files() {
            let path = out.dir.join(name);
            if !written.contains(&path) {
                fs::write(&path, text).map_err(|e| e.to_string())?;
                written.push(path);
            }
        }
    }
    eprintln!("\n{}", md.split("## 1.").next().unwrap_or(""));
    let shown: Vec<String> = written
        .iter()
        .map(|p| p.strip_prefix(root).unwrap_or(p).display().to_string())
        .collect();
    eprintln!(
        "lockbench: wrote {} in {:.0} s",
        shown.join(", "),
        report.total_secs
    );
    Ok(())
}

/// The module's name and version from `MODULE LIST`, e.g. `` `lock` v1 ``.
fn module_version(ctl: &mut redis::Connection) -> String {
    let module = redis::cmd("MODULE")
        .arg("LIST")
        .query::<redis::Value>(ctl)
        .map(|v| format!("{v:?}"))
        .unwrap_or_default();
    module
        .split("\"ver\"")
        .nth(1)
        .and_then(|r| {
            r.split(|c: char| !c.is_ascii_digit())
                .find(|p| !p.is_empty())
        })
        .map_or("lock".to_string(), |v| format!("`lock` v{v}"))
}
