//! Contention against the lock libraries users pick instead, on the same server in the same
//! run: redis-py's `Lock`, python-redis-lock and node `redlock`, each installed from PyPI or npm
//! into `target/peers/` and used as its README shows (`peers/worker.py`, `peers/worker.js`),
//! and the module driven by the same Python harness. Worker processes all after one key, hold
//! 1 ms, ask again at once; then a crashed holder: a holder takes a 1 s lock and dies, and we
//! time how long after its deadline the next waiter gets the lock.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use redis::Connection;

use super::{Env, Scenario};
use crate::config::Config;
use crate::report::{f, max_wait, num, obj, ratio, s, Goal, Json};
use crate::server::{commandstats, info_u64, server_cpu, wait_info, Server};
use crate::stats::{median, pct, sorted, wall_ms};

/// The pinned versions installed into `target/peers/`.
const PIP_PACKAGES: [&str; 2] = ["redis==8.1.0", "python-redis-lock==4.0.0"];
const NPM_PACKAGES: [&str; 2] = ["redlock@4.2.0", "ioredis@5.4.1"];
/// Worker counts, as in the contention scenario's headline rows.
const WORKERS: [usize; 2] = [8, 32];
/// The crashed holder's ttl.
const CRASH_TTL_MS: u64 = 1000;

/// A contender: `--lib` of a worker script.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Lib {
    Module,
    RedisPy,
    PythonRedisLock,
    NodeRedlock,
}

impl Lib {
    const ALL: [Lib; 4] = [
        Lib::Module,
        Lib::PythonRedisLock,
        Lib::RedisPy,
        Lib::NodeRedlock,
    ];
    fn label(self) -> &'static str {
        match self {
            Lib::Module => "`LOCK.ACQUIRE ... BLOCK` (redis-py)",
            Lib::RedisPy => "redis-py 8.1 `Lock`, default sleep 0.1 s",
            Lib::PythonRedisLock => "python-redis-lock 4.0.0",
            Lib::NodeRedlock => "node `redlock` 4.2.0 (ioredis 5), one master, defaults",
        }
    }
    fn id(self) -> &'static str {
        match self {
            Lib::Module => "module",
            Lib::RedisPy => "redis-py",
            Lib::PythonRedisLock => "python-redis-lock",
            Lib::NodeRedlock => "node-redlock",
        }
    }
    /// The key the library actually writes for lock `name` (python-redis-lock prefixes it).
    fn server_key(self, name: &str) -> String {
        match self {
            Lib::PythonRedisLock => format!("lock:{name}"),
            _ => name.to_string(),
        }
    }
}

/// Where the installed peers live.
struct Installed {
    python_path: PathBuf,
    node_path: PathBuf,
    scripts: PathBuf,
}

/// Install the peers into `target/peers/` unless they are there already.
fn install() -> Result<Installed, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let base = root.join("target/peers");
    let py = base.join("python");
    if !py.join("redis_lock").is_dir() {
        eprintln!(
            "[6] installing {} into {}",
            PIP_PACKAGES.join(" "),
            py.display()
        );
        let ok = Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "--target",
            ])
            .arg(&py)
            .args(PIP_PACKAGES)
            .status()
            .map_err(|e| format!("python3: {e}"))?;
        if !ok.success() {
            return Err(format!("pip install {} failed", PIP_PACKAGES.join(" ")));
        }
    }
    let node = base.join("node");
    if !node.join("node_modules/redlock").is_dir() {
        eprintln!(
            "[6] installing {} into {}",
            NPM_PACKAGES.join(" "),
            node.display()
        );
        std::fs::create_dir_all(&node).map_err(|e| e.to_string())?;
        let ok = Command::new("npm")
            .args(["install", "--silent", "--no-audit", "--no-fund", "--prefix"])
            .arg(&node)
            .args(NPM_PACKAGES)
            .status()
            .map_err(|e| format!("npm: {e}"))?;
        if !ok.success() {
            return Err(format!("npm install {} failed", NPM_PACKAGES.join(" ")));
        }
    }
    Ok(Installed {
        python_path: py,
        node_path: node.join("node_modules"),
        scripts: root.join("benches/lockbench/peers"),
    })
}

/// A worker process of either language, past its `ready` line.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    fn spawn(inst: &Installed, lib: Lib, port: u16, args: &[String]) -> Result<Worker, String> {
        let mut cmd = if lib == Lib::NodeRedlock {
            let mut c = Command::new("node");
            c.arg(inst.scripts.join("worker.js"))
                .env("NODE_PATH", &inst.node_path);
            c
        } else {
            let mut c = Command::new("python3");
            c.arg(inst.scripts.join("worker.py"))
                .args(["--lib", lib.id()])
                .env("PYTHONPATH", &inst.python_path);
            c
        };
        let mut child = cmd
            .args(["--port", &port.to_string()])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start a {} worker: {e}", lib.id()))?;
        let stdin = child.stdin.take().expect("piped stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).map_err(|e| e.to_string())?;
        if line.trim() != "ready" {
            let _ = child.kill();
            return Err(format!(
                "{} worker said {line:?} instead of ready",
                lib.id()
            ));
        }
        Ok(Worker {
            child,
            stdin,
            stdout,
        })
    }
    fn go(&mut self) {
        let _ = self.stdin.write_all(b"go\n");
        let _ = self.stdin.flush();
    }
    /// The worker's JSON line, then its exit.
    fn finish(mut self) -> String {
        let mut line = String::new();
        let _ = self.stdout.read_line(&mut line);
        let _ = self.child.wait();
        line
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The delays (ms after the deadline) of crashed-holder runs.
fn delays(runs: &[CrashRun]) -> Vec<f64> {
    runs.iter().map(|r| r.delay_ms).collect()
}

/// The numbers in `text` (a JSON fragment), in order.
fn numbers(text: &str) -> Vec<f64> {
    text.split(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '-' | '+')))
        .filter_map(|t| t.parse().ok())
        .collect()
}

/// The part of a worker's JSON line after `"field":` up to the next field.
fn field<'a>(line: &'a str, name: &str, next: Option<&str>) -> &'a str {
    let key = format!("\"{name}\":");
    let Some(start) = line.find(&key).map(|i| i + key.len()) else {
        return "";
    };
    let end = next
        .and_then(|n| line[start..].find(&format!("\"{n}\":")))
        .map_or(line.len(), |i| start + i);
    &line[start..end]
}

/// One library at one worker count.
struct Row {
    lib: Lib,
    workers: usize,
    secs: f64,
    waits: Vec<f64>,
    unfinished: Vec<f64>,
    per_worker: Vec<u64>,
    handoffs: u64,
    /// Commands the server ran during the round (`INFO commandstats`).
    server_cmds: u64,
    cpu: f64,
}

impl Row {
    fn acquisitions(&self) -> u64 {
        self.per_worker.iter().sum()
    }
    fn handoffs_per_s(&self) -> f64 {
        self.handoffs as f64 / self.secs
    }
    fn p99(&self) -> f64 {
        let mut all = self.waits.clone();
        all.extend(&self.unfinished);
        pct(&sorted(all), 99.0)
    }
}

fn total_calls(ctl: &mut Connection) -> u64 {
    commandstats(ctl)
        .iter()
        .filter(|(name, _)| !matches!(name.as_str(), "info" | "config" | "del"))
        .map(|(_, c)| c.0)
        .sum()
}

fn contend(
    inst: &Installed,
    ctl: &mut Connection,
    srv: &Server,
    lib: Lib,
    workers: usize,
    secs: f64,
) -> Result<Row, String> {
    let key = format!("bench:peers:{}:{workers}", lib.id());
    let _: () = redis::cmd("DEL")
        .arg(lib.server_key(&key))
        .query(ctl)
        .map_err(|e| e.to_string())?;
    let args: Vec<String> = [
        "--mode",
        "contend",
        "--key",
        &key,
        "--hold-ms",
        "1",
        "--ttl-ms",
        "10000",
        "--secs",
        &secs.to_string(),
        "--grace",
        "10",
    ]
    .map(String::from)
    .to_vec();
    let mut procs = (0..workers)
        .map(|_| Worker::spawn(inst, lib, srv.port, &args))
        .collect::<Result<Vec<_>, _>>()?;
    let calls0 = total_calls(ctl);
    let cpu0 = server_cpu(ctl);
    let t0 = crate::stats::wall_ms() / 1000.0;
    for p in procs.iter_mut() {
        p.go();
    }
    let lines: Vec<String> = procs.drain(..).map(Worker::finish).collect();
    let cpu = server_cpu(ctl) - cpu0;
    let server_cmds = total_calls(ctl) - calls0;
    let mut grants: Vec<(f64, usize)> = Vec::new();
    let mut row = Row {
        lib,
        workers,
        secs: 0.0,
        waits: Vec::new(),
        unfinished: Vec::new(),
        per_worker: Vec::new(),
        handoffs: 0,
        server_cmds,
        cpu,
    };
    let mut end = t0;
    for (w, line) in lines.iter().enumerate() {
        if !line.contains("\"grants\"") {
            return Err(format!("{} worker {w} reported {line:?}", lib.id()));
        }
        let g = numbers(field(line, "grants", Some("unfinished_ms")));
        for pair in g.chunks(2) {
            grants.push((pair[0], w));
            row.waits.push(pair[1]);
        }
        row.per_worker.push(g.len() as u64 / 2);
        if let Some(u) = numbers(field(line, "unfinished_ms", Some("last_release"))).first() {
            row.unfinished.push(*u);
        }
        if let Some(t) = numbers(field(line, "last_release", None)).first() {
            end = end.max(*t);
        }
    }
    grants.sort_by(|a, b| a.0.total_cmp(&b.0));
    row.handoffs = grants.windows(2).filter(|p| p[0].1 != p[1].1).count() as u64;
    row.secs = end - t0;
    Ok(row)
}

/// One crashed-holder run: how many ms after the holder's deadline the waiter had the lock,
/// and, for the module, how many ms before that deadline its `LOCK.ACQUIRE ... BLOCK` was
/// queued (seen in `blocked_clients`).
struct CrashRun {
    delay_ms: f64,
    queued_before_ms: Option<f64>,
}

/// A holder takes a 1 s lock and dies; how many ms after its deadline the waiter gets it
/// (`Ok(Err(why))` when the waiter never got it). Both worker processes are started and
/// connected before the holder takes the lock, so no process start-up is timed; the module's
/// waiter must be queued on the server (`blocked_clients`) before the deadline, or the run
/// fails, and the deadline is the server's (`PEXPIRETIME` of the key the library wrote).
fn crashed_holder(
    inst: &Installed,
    ctl: &mut Connection,
    srv: &Server,
    lib: Lib,
    rep: usize,
) -> Result<Result<CrashRun, String>, String> {
    let key = format!("bench:crash:{}:{rep}", lib.id());
    let args = |mode: &str, ttl: u64| -> Vec<String> {
        ["--mode", mode, "--key", &key, "--ttl-ms", &ttl.to_string()]
            .map(String::from)
            .to_vec()
    };
    let mut holder = Worker::spawn(inst, lib, srv.port, &args("hold-and-die", CRASH_TTL_MS))?;
    let mut waiter = Worker::spawn(inst, lib, srv.port, &args("wait-once", 10_000))?;
    holder.go();
    let held = holder.finish();
    if !held.contains("held_at_ms") {
        return Err(format!("{} holder reported {held:?}", lib.id()));
    }
    let deadline: i64 = redis::cmd("PEXPIRETIME")
        .arg(lib.server_key(&key))
        .query(ctl)
        .map_err(|e| e.to_string())?;
    if deadline <= 0 {
        return Err(format!(
            "{}: the holder's key has no deadline ({deadline})",
            lib.id()
        ));
    }
    let blocked = info_u64(ctl, "clients", "blocked_clients");
    waiter.go();
    let started = Instant::now();
    let queued_before_ms = if lib == Lib::Module {
        let now = wait_info(
            ctl,
            "clients",
            "blocked_clients",
            Duration::from_millis(CRASH_TTL_MS),
            |v| v > blocked,
        );
        let before = deadline as f64 - wall_ms();
        if now <= blocked || before <= 0.0 {
            return Ok(Err(format!(
                "the waiter was not queued before the deadline (blocked_clients {now})"
            )));
        }
        Some(before)
    } else {
        None
    };
    let line = waiter.finish();
    match numbers(field(&line, "granted_at_ms", None)).first() {
        Some(at) => Ok(Ok(CrashRun {
            delay_ms: at - deadline as f64,
            queued_before_ms,
        })),
        None => Ok(Err(format!(
            "no grant: the waiter {} after {:.0} s",
            if line.contains("\"error\"") {
                format!(
                    "raised {}",
                    field(&line, "error", None).trim_matches(|c| " \"}\n".contains(c))
                )
            } else {
                "reported nothing".to_string()
            },
            started.elapsed().as_secs_f64()
        ))),
    }
}

pub fn new() -> Box<dyn Scenario> {
    Box::new(Peers {
        rows: Vec::new(),
        crash: Vec::new(),
        error: None,
        notes: Vec::new(),
    })
}

pub struct Peers {
    rows: Vec<Row>,
    /// Per library: the crashed-holder runs, and why a waiter never got the lock, if one did
    /// not.
    crash: Vec<(Lib, Vec<CrashRun>, Option<String>)>,
    /// Why the scenario could not run (no network for the install, no node, ...).
    error: Option<String>,
    /// Rows that failed, and why.
    notes: Vec<String>,
}

impl Peers {
    fn find(&self, lib: Lib, workers: usize) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.lib == lib && r.workers == workers)
    }
    fn run_all(&mut self, env: &mut Env) -> Result<(), String> {
        let inst = install()?;
        let secs = env.sizes.contention_secs;
        for workers in WORKERS {
            eprintln!("[6] peers: {workers} workers, {secs:.0} s per library");
            for lib in Lib::ALL {
                match contend(&inst, env.ctl, env.srv, lib, workers, secs) {
                    Ok(row) => self.rows.push(row),
                    Err(e) => {
                        eprintln!("    peers: {e}");
                        self.notes.push(e);
                    }
                }
            }
        }
        let reps = if env.cfg.quick { 1 } else { 3 };
        eprintln!("[6] peers: crashed holder, {reps} per library");
        for lib in Lib::ALL {
            let mut runs = Vec::new();
            let mut failed = None;
            for rep in 0..reps {
                match crashed_holder(&inst, env.ctl, env.srv, lib, rep)? {
                    Ok(run) => {
                        eprintln!(
                            "    {}: granted {:.2} ms after the deadline{}",
                            lib.id(),
                            run.delay_ms,
                            run.queued_before_ms
                                .map(|q| format!(", queued {q:.0} ms before it"))
                                .unwrap_or_default()
                        );
                        runs.push(run);
                    }
                    // One waiter that never gets the lock says enough; the next would too.
                    Err(why) => {
                        failed = Some(why);
                        break;
                    }
                }
            }
            self.crash.push((lib, runs, failed));
        }
        Ok(())
    }
}

impl Scenario for Peers {
    fn run(&mut self, env: &mut Env) {
        if let Err(e) = self.run_all(env) {
            eprintln!("    peers: {e}; the scenario is left out");
            self.error = Some(e);
        }
    }

    fn goals(&self) -> Vec<Goal> {
        let mut g = Vec::new();
        for workers in WORKERS {
            let Some(lock) = self.find(Lib::Module, workers) else {
                continue;
            };
            for lib in Lib::ALL.into_iter().skip(1) {
                let Some(peer) = self.find(lib, workers) else {
                    continue;
                };
                g.push(Goal {
                    goal: format!(
                        "{workers} workers: ahead of {} on handoffs/s and wait p99",
                        lib.label()
                    ),
                    measured: format!(
                        "{} vs {} handoffs/s, p99 {} vs {} ms",
                        f(lock.handoffs_per_s()),
                        f(peer.handoffs_per_s()),
                        f(lock.p99()),
                        f(peer.p99())
                    ),
                    met: lock.handoffs_per_s() > peer.handoffs_per_s() && lock.p99() < peer.p99(),
                });
            }
        }
        if let Some((_, runs, failed)) = self.crash.iter().find(|(l, _, _)| *l == Lib::Module) {
            let worst = delays(runs).into_iter().fold(f64::NAN, f64::max);
            g.push(Goal {
                goal: "crashed holder: the next waiter has the lock < 5 ms after the deadline"
                    .into(),
                measured: match failed {
                    Some(why) => why.clone(),
                    None => format!("worst of {}: {} ms", runs.len(), f(worst)),
                },
                met: failed.is_none() && worst < 5.0,
            });
        }
        g
    }

    fn intro(&self, o: &mut String, _cfg: &Config) {
        let _ = writeln!(
            o,
            "Each library is installed by the benchmark into `target/peers/` (pip: {}; npm: {}) \
             and used as its README shows: `benches/lockbench/peers/worker.py` and `worker.js`. \
             Each worker is its own process with its own connection; all want one key, hold it \
             1 ms (a sleep), release and ask again at once, with a 10 s ttl. The module's row \
             runs in the same Python harness (redis-py sending `LOCK.ACQUIRE key owner 10000 \
             BLOCK 30000` and `LOCK.RELEASE`), so the client language is the same as the Python \
             peers'. *Real handoffs* count grants whose holder differs from the previous one. \
             *Server commands per acquisition* is the `INFO commandstats` call count over the \
             round (every command any worker sent) divided by the acquisitions; server CPU is \
             `INFO cpu`. A wait still going 10 s after the round (a starved worker) is given up \
             and counted in p99 and max. node `redlock` gives up after its 10 retries \
             (200 ms + up to 200 ms jitter apart) and the worker asks again.\n",
            PIP_PACKAGES.join(" "),
            NPM_PACKAGES.join(" ")
        );
        let _ = writeln!(
            o,
            "*Crashed holder*: a holder process takes the lock with a {} ms ttl and exits without \
             releasing; a waiter of the same library (10 s ttl, as the contention workers) then \
             asks for it, blocking the library's way. Both processes are started and connected \
             before the holder takes the lock, so no process start-up is timed; the module's \
             waiter is seen queued in `INFO clients` `blocked_clients` before the deadline (the \
             run fails otherwise). The delay runs from the holder's deadline on the server \
             (`PEXPIRETIME` of the key the library wrote) to the waiter's grant as its process \
             saw it (both on this machine's clock).\n",
            CRASH_TTL_MS
        );
    }

    fn markdown(&self, o: &mut String) {
        if let Some(e) = &self.error {
            let _ = writeln!(o, "Not run: {e}.\n");
            return;
        }
        let _ = writeln!(
            o,
            "| workers | library | real handoffs/s | wait p50 ms | wait p99 ms | wait max ms | acquisitions per worker min / max | server commands per acquisition | server CPU us/acquisition |\n|---|---|---|---|---|---|---|---|---|"
        );
        for r in &self.rows {
            let w = sorted(r.waits.clone());
            let max = max_wait(&w, &r.unfinished);
            let acq = r.acquisitions() as f64;
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {} / {} | {} | {} |",
                r.workers,
                r.lib.label(),
                f(r.handoffs_per_s()),
                f(pct(&w, 50.0)),
                f(r.p99()),
                max,
                r.per_worker.iter().min().unwrap_or(&0),
                r.per_worker.iter().max().unwrap_or(&0),
                f(r.server_cmds as f64 / acq),
                f(r.cpu * 1e6 / acq)
            );
        }
        let _ = writeln!(
            o,
            "\n| crashed holder ({} ms ttl) | waiter has the lock after the deadline, median ms | max ms | waiter queued before the deadline, least ms | runs |\n|---|---|---|---|---|",
            CRASH_TTL_MS
        );
        for (lib, runs, failed) in &self.crash {
            let d = delays(runs);
            let queued: Vec<f64> = runs.iter().filter_map(|r| r.queued_before_ms).collect();
            let queued = if queued.is_empty() {
                "not checked (no server-side queue)".to_string()
            } else {
                f(queued.into_iter().fold(f64::INFINITY, f64::min))
            };
            match failed {
                None => {
                    let _ = writeln!(
                        o,
                        "| {} | {} | {} | {queued} | {} |",
                        lib.label(),
                        f(median(&d)),
                        f(d.iter().copied().fold(f64::NAN, f64::max)),
                        d.len()
                    );
                }
                Some(why) => {
                    let _ = writeln!(o, "| {} | {why} | | | {} |", lib.label(), d.len() + 1);
                }
            }
        }
        let _ = writeln!(
            o,
            "\nRatios of the module's real handoffs/s to each library's:\n"
        );
        let _ = writeln!(o, "| workers | library | handoffs/s ratio | p99 ratio (library / module) |\n|---|---|---|---|");
        for workers in WORKERS {
            let Some(lock) = self.find(Lib::Module, workers) else {
                continue;
            };
            for lib in Lib::ALL.into_iter().skip(1) {
                if let Some(peer) = self.find(lib, workers) {
                    let _ = writeln!(
                        o,
                        "| {workers} | {} | {} | {} |",
                        lib.label(),
                        ratio(lock.handoffs_per_s() / peer.handoffs_per_s()),
                        ratio(peer.p99() / lock.p99())
                    );
                }
            }
        }
        for note in &self.notes {
            let _ = writeln!(o, "\nA row is missing: {note}.");
        }
        o.push('\n');
    }

    fn json(&self) -> Json {
        let rows = self
            .rows
            .iter()
            .map(|r| {
                let w = sorted(r.waits.clone());
                let acq = r.acquisitions() as f64;
                obj(vec![
                    ("workers", num(r.workers as f64)),
                    ("library", s(r.lib.id())),
                    ("label", s(r.lib.label())),
                    ("seconds", num(r.secs)),
                    ("acquisitions", num(acq)),
                    ("real_handoffs_per_s", num(r.handoffs_per_s())),
                    ("wait_ms_p50", num(pct(&w, 50.0))),
                    ("wait_ms_p99", num(r.p99())),
                    ("wait_ms_max", num(pct(&w, 100.0))),
                    (
                        "unfinished_waits_ms",
                        Json::Arr(r.unfinished.iter().copied().map(num).collect()),
                    ),
                    (
                        "acquisitions_per_worker",
                        Json::Arr(r.per_worker.iter().map(|x| num(*x as f64)).collect()),
                    ),
                    (
                        "server_commands_per_acquisition",
                        num(r.server_cmds as f64 / acq),
                    ),
                    ("server_cpu_us_per_acquisition", num(r.cpu * 1e6 / acq)),
                ])
            })
            .collect();
        let crash = self
            .crash
            .iter()
            .map(|(lib, runs, failed)| {
                obj(vec![
                    ("library", s(lib.id())),
                    ("failed", failed.as_deref().map_or(Json::Bool(false), s)),
                    ("holder_ttl_ms", num(CRASH_TTL_MS as f64)),
                    (
                        "delay_after_deadline_ms",
                        Json::Arr(delays(runs).into_iter().map(num).collect()),
                    ),
                    (
                        "waiter_queued_before_deadline_ms",
                        Json::Arr(
                            runs.iter()
                                .filter_map(|r| r.queued_before_ms)
                                .map(num)
                                .collect(),
                        ),
                    ),
                ])
            })
            .collect();
        obj(vec![
            ("error", self.error.as_deref().map_or(Json::Bool(false), s)),
            ("contention", Json::Arr(rows)),
            ("crashed_holder", Json::Arr(crash)),
        ])
    }
}
