//! `cargo bench --bench lockbench`: redis-lock against the classic client-side pattern
//! (`SET NX PX`, a Lua release script, retry loops), both sides measured in the same run on the
//! same server, so that the machine's drift hits both.
//!
//! # Layout
//! - [`Config`], [`Sizes`]: what the environment asks for (full run or `QUICK=1`).
//! - [`Server`]: a `redis-server` with the module on a port the OS chose, or `REDIS_URL`.
//! - [`drive`]: a pipelined load generator over raw RESP (many connections, N in flight each)
//!   that checks every reply, with the server's CPU and `INFO commandstats` around it.
//! - `throughput`, `contention`, `expiry`, `memory`, `scale`: the five scenarios of the issue;
//!   `module_tax`: the same writes on a second server without the module (what loading it costs
//!   other commands); `scale_at_hz`: the scale scenario again at `hz 100`.
//! - [`Report`]: `BENCHMARKS.md`, `bench/results.json` and `bench/waits.svg` (written by hand:
//!   no plotting or serialisation crate).
//!
//! # Environment
//! - `QUICK=1`: a smoke run of under a minute (smaller counts, 2 s per contention contender).
//! - `REDIS_URL=redis://127.0.0.1:PORT`: use a running server (empty, with the module loaded,
//!   on this machine: the benchmark flushes it and reads its CPU use). Otherwise one is started.
//! - `REDIS_LOCK_MODULE`: the module (default `<crate>/target/release/libredis_lock.so`).
//! - `REDIS_SERVER`, `REDIS_BENCHMARK`: the binaries (default from `PATH`).
//!
//! Every connection goes to 127.0.0.1 and every loop is bounded in count or time.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, OnceLock};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::Rng;
use redis::Connection;

/// The owner-checked release script of the classic pattern.
const RELEASE_SCRIPT: &str =
    "if redis.call(\"GET\", KEYS[1]) == ARGV[1] then return redis.call(\"DEL\", KEYS[1]) else return 0 end";

/// Connections of the throughput scenario (as `redis-benchmark -c 50`).
const CONNS: usize = 50;
/// Client threads of the load generator: one per core is enough, since each thread keeps
/// many connections busy and the server itself is single-threaded.
const DRIVER_THREADS: usize = 2;
/// A lock TTL that never runs out during a measurement (10 minutes).
const LONG_TTL_MS: u64 = 600_000;

// ---------------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------------

struct Config {
    /// `QUICK=1`: the smoke run.
    quick: bool,
    /// The module `.so` to load into a server we start.
    module: PathBuf,
    /// The `redis-server` binary.
    server_bin: String,
    /// The `redis-benchmark` binary (used for a cross-check of the single-command throughput).
    benchmark_bin: String,
    /// `REDIS_URL`'s port, when the run uses an existing server on 127.0.0.1.
    existing_port: Option<u16>,
    /// How the run was started, for the report.
    command: String,
}

impl Config {
    fn from_env() -> Result<Config, String> {
        let quick = std::env::var("QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
        let module = std::env::var_os("REDIS_LOCK_MODULE")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/libredis_lock.so")
            });
        let existing_port = match std::env::var("REDIS_URL") {
            Ok(url) if !url.is_empty() => Some(parse_local_url(&url)?),
            _ => None,
        };
        let mut command = String::new();
        if quick {
            command.push_str("QUICK=1 ");
        }
        if let Ok(url) = std::env::var("REDIS_URL") {
            if !url.is_empty() {
                let _ = write!(command, "REDIS_URL={url} ");
            }
        }
        if std::env::var_os("MAKELEVEL").is_some() {
            command.push_str("make bench");
        } else {
            command.push_str("cargo bench --bench lockbench");
        }
        Ok(Config {
            quick,
            module,
            server_bin: std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into()),
            benchmark_bin: std::env::var("REDIS_BENCHMARK")
                .unwrap_or_else(|_| "redis-benchmark".into()),
            existing_port,
            command,
        })
    }
}

/// `redis://127.0.0.1:PORT[/0]` (or `localhost`): anything else is refused, because the
/// benchmark must only ever talk to this machine.
fn parse_local_url(url: &str) -> Result<u16, String> {
    let rest = url
        .strip_prefix("redis://")
        .ok_or_else(|| format!("REDIS_URL must start with redis:// (got {url})"))?;
    let hostport = rest.split('/').next().unwrap_or("");
    let (host, port) = hostport
        .rsplit_once(':')
        .ok_or_else(|| format!("REDIS_URL needs an explicit port (got {url})"))?;
    if host != "127.0.0.1" && host != "localhost" {
        return Err(format!(
            "REDIS_URL must point at 127.0.0.1 (got host {host:?}): this benchmark only runs locally"
        ));
    }
    port.parse()
        .map_err(|_| format!("REDIS_URL has a bad port {port:?}"))
}

/// How much work each scenario does: the full run, or the `QUICK=1` smoke run.
struct Sizes {
    /// Commands per contender per round, 16 in flight per connection.
    tput_p16: usize,
    /// Commands per contender per round, one in flight per connection.
    tput_p1: usize,
    /// Rounds of the throughput scenario; the contenders' order flips every round.
    tput_rounds: usize,
    /// Seconds per contention round, and rounds (order flips every round).
    contention_secs: f64,
    contention_rounds: usize,
    /// Expiry handoffs measured per contender.
    expiry_reps: usize,
    /// Locks held for the memory measurement.
    memory_locks: usize,
    /// Blocked waiters for the memory measurement.
    waiters: usize,
    /// Locks taken in the scale scenario.
    scale_locks: usize,
    /// TTL of the scale scenario's locks.
    scale_ttl_ms: u64,
}

impl Sizes {
    fn new(quick: bool) -> Sizes {
        if quick {
            Sizes {
                tput_p16: 40_000,
                tput_p1: 15_000,
                tput_rounds: 2,
                contention_secs: 1.0,
                contention_rounds: 2,
                expiry_reps: 10,
                memory_locks: 20_000,
                waiters: 1000,
                scale_locks: 100_000,
                scale_ttl_ms: 2000,
            }
        } else {
            Sizes {
                tput_p16: 300_000,
                tput_p1: 100_000,
                tput_rounds: 3,
                contention_secs: 5.0,
                contention_rounds: 2,
                expiry_reps: 50,
                memory_locks: 100_000,
                waiters: 1000,
                scale_locks: 1_000_000,
                scale_ttl_ms: 2000,
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The server
// ---------------------------------------------------------------------------------------------

/// The server every scenario runs on: our own child process, or an existing one (`REDIS_URL`).
struct Server {
    /// TCP port on 127.0.0.1.
    port: u16,
    /// Our `redis-server` process; `None` for an existing server.
    child: Option<Child>,
    /// Our server's directory (log file); removed on drop.
    dir: Option<PathBuf>,
}

impl Server {
    fn start(cfg: &Config) -> Result<Server, String> {
        if let Some(port) = cfg.existing_port {
            let server = Server {
                port,
                child: None,
                dir: None,
            };
            let mut con = server
                .try_connect()
                .map_err(|e| format!("cannot connect to REDIS_URL 127.0.0.1:{port}: {e}"))?;
            let modules: String = redis::cmd("MODULE")
                .arg("LIST")
                .query::<redis::Value>(&mut con)
                .map(|v| format!("{v:?}"))
                .map_err(|e| format!("MODULE LIST failed: {e}"))?;
            if !modules.contains("lock") {
                return Err("the REDIS_URL server has no `lock` module loaded".into());
            }
            let keys: u64 = redis::cmd("DBSIZE")
                .query(&mut con)
                .map_err(|e| e.to_string())?;
            if keys != 0 {
                return Err(format!(
                    "the REDIS_URL server holds {keys} keys; the benchmark flushes it, so give it \
                     an empty server"
                ));
            }
            return Ok(server);
        }
        if !cfg.module.is_file() {
            return Err(format!(
                "module not found at {} (run `cargo build --release`, or set REDIS_LOCK_MODULE)",
                cfg.module.display()
            ));
        }
        Server::spawn(cfg, Some(&cfg.module))
    }

    /// Start our own `redis-server` on a port the OS chose, with `module` loaded (or none: the
    /// reference server that measures what loading the module costs other commands).
    fn spawn(cfg: &Config, module: Option<&Path>) -> Result<Server, String> {
        let dir = std::env::temp_dir().join(format!("redis-lock-bench-{}", uuid::Uuid::new_v4()));
        fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let log = dir.join("redis.log");
        // The OS picks the port: bind :0, read it, drop the listener, start the server there.
        // Another process can take it in between, so try a few times.
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map_err(|e| format!("cannot pick a port: {e}"))?
                .port();
            let child = Command::new(&cfg.server_bin)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(&dir)
                .arg("--logfile")
                .arg(&log)
                .args(
                    module
                        .map(|m| vec![std::ffi::OsStr::new("--loadmodule"), m.as_os_str()])
                        .unwrap_or_default(),
                )
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot run {}: {e}", cfg.server_bin))?;
            let mut server = Server {
                port,
                child: Some(child),
                dir: Some(dir.clone()),
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if let Some(status) = server.child.as_mut().and_then(|c| c.try_wait().ok()?) {
                    let text = fs::read_to_string(&log).unwrap_or_default();
                    if text.contains("Address already in use") {
                        server.child = None;
                        break;
                    }
                    return Err(format!("redis-server exited ({status}); log:\n{text}"));
                }
                if let Ok(mut con) = server.try_connect() {
                    let pid: Option<String> = info(&mut con, "server").remove("process_id");
                    if pid == server.child.as_ref().map(|c| c.id().to_string()) {
                        return Ok(server);
                    }
                }
                if Instant::now() > deadline {
                    return Err("redis-server did not answer within 10 s".into());
                }
                thread::sleep(Duration::from_millis(10));
            }
        }
        Err("no free port after 5 attempts".into())
    }

    fn try_connect(&self) -> redis::RedisResult<Connection> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))?;
        let con = client.get_connection_with_timeout(Duration::from_secs(5))?;
        // Long enough for FLUSHALL of a million keys and for blocked acquires.
        con.set_read_timeout(Some(Duration::from_secs(120)))?;
        Ok(con)
    }

    fn connect(&self) -> Connection {
        self.try_connect()
            .unwrap_or_else(|e| panic!("cannot connect to 127.0.0.1:{}: {e}", self.port))
    }

    fn raw(&self) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.port))
            .unwrap_or_else(|e| panic!("cannot connect to 127.0.0.1:{}: {e}", self.port));
        s.set_nodelay(true).expect("set_nodelay");
        s.set_read_timeout(Some(Duration::from_secs(120)))
            .expect("set_read_timeout");
        s
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(dir) = &self.dir {
            let _ = fs::remove_dir_all(dir);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// INFO helpers
// ---------------------------------------------------------------------------------------------

fn info(con: &mut Connection, section: &str) -> HashMap<String, String> {
    let text: String = redis::cmd("INFO")
        .arg(section)
        .query(con)
        .expect("INFO failed");
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

fn info_u64(con: &mut Connection, section: &str, field: &str) -> u64 {
    info(con, section)
        .get(field)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("INFO {section} has no numeric {field}"))
}

/// Server CPU (user + system, all threads) in seconds since it started.
fn server_cpu(con: &mut Connection) -> f64 {
    let m = info(con, "cpu");
    let get = |k: &str| m.get(k).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    get("used_cpu_sys") + get("used_cpu_user")
}

/// `INFO commandstats`: command name -> (calls, usec).
fn commandstats(con: &mut Connection) -> HashMap<String, (u64, f64)> {
    let mut out = HashMap::new();
    for (k, v) in info(con, "commandstats") {
        let Some(name) = k.strip_prefix("cmdstat_") else {
            continue;
        };
        let mut calls = 0;
        let mut usec = 0.0;
        for kv in v.split(',') {
            match kv.split_once('=') {
                Some(("calls", n)) => calls = n.parse().unwrap_or(0),
                Some(("usec", n)) => usec = n.parse().unwrap_or(0.0),
                _ => {}
            }
        }
        out.insert(name.to_string(), (calls, usec));
    }
    out
}

fn flushall(con: &mut Connection) {
    let _: () = redis::cmd("FLUSHALL")
        .arg("SYNC")
        .query(con)
        .expect("FLUSHALL");
}

fn reset_stats(con: &mut Connection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(con)
        .expect("CONFIG RESETSTAT");
}

/// Poll `INFO <section> <field>` until `ok` holds (bounded by `limit`).
fn wait_info(
    con: &mut Connection,
    section: &str,
    field: &str,
    limit: Duration,
    ok: impl Fn(u64) -> bool,
) -> u64 {
    let deadline = Instant::now() + limit;
    loop {
        let v = info_u64(con, section, field);
        if ok(v) || Instant::now() > deadline {
            return v;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

// ---------------------------------------------------------------------------------------------
// The pipelined load generator
// ---------------------------------------------------------------------------------------------

/// Append one command in RESP to `out`.
fn resp(out: &mut Vec<u8>, args: &[&[u8]]) {
    let _ = write!(out, "*{}\r\n", args.len());
    for a in args {
        let _ = write!(out, "${}\r\n", a.len());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// Format `prefix:conn:i` into `buf` without allocating; returns the bytes used.
fn key_into<'a>(buf: &'a mut [u8; 64], prefix: &str, conn: usize, i: usize) -> &'a [u8] {
    let total = buf.len();
    let mut cur = &mut buf[..];
    let _ = write!(cur, "{prefix}:{conn}:{i}");
    let used = total - cur.len();
    &buf[..used]
}

/// What a reply must be for the command to count as done.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Expect {
    /// A positive integer (a fencing token).
    Token,
    /// The integer 1 (a release or `DEL` that removed the key).
    One,
    /// `+OK` (a `SET` that took the key).
    Ok,
}

/// A reply line, judged against what was expected: `Ok(true)` done, `Ok(false)` refused (nil or
/// 0), `Err` anything else (an error reply aborts the benchmark: it means a broken setup).
fn judge(line: &[u8], want: Expect) -> Result<bool, String> {
    let text = || String::from_utf8_lossy(line).into_owned();
    match (line.first(), want) {
        (Some(b'-'), _) => Err(format!("error reply {:?}", text())),
        (Some(b':'), Expect::Token | Expect::One) => {
            let n: i64 = std::str::from_utf8(&line[1..])
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("bad integer reply {:?}", text()))?;
            Ok(if want == Expect::Token { n > 0 } else { n == 1 })
        }
        (Some(b'+'), Expect::Ok) => Ok(line == b"+OK"),
        (Some(b'$'), _) if line == b"$-1" => Ok(false),
        _ => Err(format!("unexpected reply {:?} (wanted {want:?})", text())),
    }
}

/// One connection of the load generator.
struct DriverConn {
    /// Connection number (0..conns), passed to the command generator.
    id: usize,
    stream: TcpStream,
    /// The batch being sent.
    out: Vec<u8>,
    /// What each reply of the batch in flight must be.
    expects: Vec<Expect>,
    /// Reply bytes read and not yet parsed.
    inbuf: Vec<u8>,
    /// Index of the next command to generate.
    next: usize,
}

impl DriverConn {
    /// Read and judge every reply of the batch in flight; returns (done, refused).
    fn read_replies(&mut self) -> io::Result<(u64, u64)> {
        let (mut done, mut refused) = (0, 0);
        let mut idx = 0;
        let mut pos = 0;
        self.inbuf.clear();
        let mut chunk = [0u8; 16 * 1024];
        // Every reply these commands get is one line (integer, status, nil or error).
        while idx < self.expects.len() {
            while idx < self.expects.len() {
                let Some(nl) = self.inbuf[pos..].iter().position(|&b| b == b'\n') else {
                    break;
                };
                let line = &self.inbuf[pos..pos + nl];
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                match judge(line, self.expects[idx]) {
                    Ok(true) => done += 1,
                    Ok(false) => refused += 1,
                    Err(e) => return Err(io::Error::other(e)),
                }
                pos += nl + 1;
                idx += 1;
            }
            if idx == self.expects.len() {
                break;
            }
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err(io::Error::other("server closed the connection"));
            }
            self.inbuf.extend_from_slice(&chunk[..n]);
        }
        self.expects.clear();
        Ok((done, refused))
    }
}

/// A load: `conns` connections, each sending `per_conn` commands, `depth` in flight at a time.
#[derive(Clone, Copy)]
struct Load {
    conns: usize,
    depth: usize,
    per_conn: usize,
}

/// What one run of the load generator measured.
#[derive(Clone, Debug, Default)]
struct Run {
    /// Commands whose reply was the expected success.
    done: u64,
    /// Commands refused (nil or 0).
    refused: u64,
    /// Wall-clock seconds from the start signal to the last reply.
    secs: f64,
    /// Server CPU seconds over the same span.
    cpu: f64,
    /// `INFO commandstats` over the same span: name -> (calls, usec).
    cmd: HashMap<String, (u64, f64)>,
}

impl Run {
    fn usec_of(&self, names: &[&str]) -> f64 {
        names
            .iter()
            .map(|n| self.cmd.get(*n).map_or(0.0, |c| c.1))
            .sum()
    }
}

/// Run a load. `gen(conn, i, out)` appends command `i` of connection `conn` to `out` and says
/// what its reply must be. Connections are opened first; `CONFIG RESETSTAT` and the CPU reading
/// happen after that and before the start signal, and are read again after the last reply,
/// before the connections close, so only the commands themselves are measured.
fn drive<G>(srv: &Server, ctl: &mut Connection, load: Load, gen: G) -> Run
where
    G: Fn(usize, usize, &mut Vec<u8>) -> Expect + Sync,
{
    let threads = DRIVER_THREADS.min(load.conns);
    let connected = Barrier::new(threads + 1);
    let go = Barrier::new(threads + 1);
    let gen = &gen;
    thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (connected, go) = (&connected, &go);
                s.spawn(move || {
                    let mut conns: Vec<DriverConn> = (t..load.conns)
                        .step_by(threads)
                        .map(|id| DriverConn {
                            id,
                            stream: srv.raw(),
                            out: Vec::with_capacity(4096),
                            expects: Vec::with_capacity(load.depth),
                            inbuf: Vec::with_capacity(4096),
                            next: 0,
                        })
                        .collect();
                    connected.wait();
                    go.wait();
                    let (mut done, mut refused) = (0u64, 0u64);
                    // Lockstep: send a batch on every connection, then read every batch. The
                    // server always has the other thread's batches to work on meanwhile.
                    loop {
                        let mut sent = false;
                        for c in conns.iter_mut() {
                            if c.next >= load.per_conn {
                                continue;
                            }
                            c.out.clear();
                            let end = (c.next + load.depth).min(load.per_conn);
                            for i in c.next..end {
                                let e = gen(c.id, i, &mut c.out);
                                c.expects.push(e);
                            }
                            c.next = end;
                            c.stream.write_all(&c.out).expect("write to server");
                            sent = true;
                        }
                        if !sent {
                            break;
                        }
                        for c in conns.iter_mut() {
                            if !c.expects.is_empty() {
                                let (d, r) = c
                                    .read_replies()
                                    .unwrap_or_else(|e| panic!("load generator: {e}"));
                                done += d;
                                refused += r;
                            }
                        }
                    }
                    (done, refused, Instant::now(), conns)
                })
            })
            .collect();
        connected.wait();
        reset_stats(ctl);
        let cpu0 = server_cpu(ctl);
        let t0 = Instant::now();
        go.wait();
        let mut run = Run::default();
        let mut end = t0;
        let mut keep = Vec::new();
        for h in handles {
            let (d, r, t, conns) = h.join().expect("load thread panicked");
            run.done += d;
            run.refused += r;
            end = end.max(t);
            keep.push(conns);
        }
        run.secs = (end - t0).as_secs_f64();
        run.cpu = server_cpu(ctl) - cpu0;
        run.cmd = commandstats(ctl);
        drop(keep);
        run
    })
}

// ---------------------------------------------------------------------------------------------
// Statistics
// ---------------------------------------------------------------------------------------------

/// Nearest-rank percentile of sorted values (`p` in 0..=100).
fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// Milliseconds since the Unix epoch, as a float (microsecond resolution).
fn wall_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock before 1970")
        .as_secs_f64()
        * 1000.0
}

// ---------------------------------------------------------------------------------------------
// Scenario 1: uncontended throughput
// ---------------------------------------------------------------------------------------------

/// One contender's samples in the throughput scenario (one per round).
#[derive(Clone, Debug, Default)]
struct Tput {
    name: String,
    /// Per round: operations done (commands, or cycles), seconds, server CPU seconds, and
    /// `INFO commandstats` usec of the top-level commands.
    ops: Vec<f64>,
    secs: Vec<f64>,
    cpu: Vec<f64>,
    cmd_usec: Vec<f64>,
    /// Operations refused (should be 0: every key is fresh, every release is of a held lock).
    refused: u64,
}

impl Tput {
    fn named(name: &str) -> Tput {
        Tput {
            name: name.into(),
            ..Tput::default()
        }
    }
    fn add(&mut self, ops: f64, run: &Run, cmds: &[&str]) {
        self.ops.push(ops);
        self.secs.push(run.secs);
        self.cpu.push(run.cpu);
        self.cmd_usec.push(run.usec_of(cmds));
        self.refused += run.refused;
    }
    fn rates(&self) -> Vec<f64> {
        self.ops
            .iter()
            .zip(&self.secs)
            .map(|(o, s)| o / s)
            .collect()
    }
    fn rate(&self) -> f64 {
        median(&self.rates())
    }
    /// Server CPU per operation in microseconds, over all rounds.
    fn cpu_us(&self) -> f64 {
        self.cpu.iter().sum::<f64>() * 1e6 / self.ops.iter().sum::<f64>()
    }
    /// Share of one core the server used while the contender ran (1.0: saturated, so the
    /// throughput is the server's; well below: the clients set the pace).
    fn busy(&self) -> f64 {
        self.cpu.iter().sum::<f64>() / self.secs.iter().sum::<f64>()
    }
    /// `INFO commandstats` usec per operation, over all rounds.
    fn cmd_us(&self) -> f64 {
        self.cmd_usec.iter().sum::<f64>() / self.ops.iter().sum::<f64>()
    }
    /// Median of the per-round throughput ratios self / other (rounds ran back to back).
    fn ratio(&self, other: &Tput) -> f64 {
        let r: Vec<f64> = self
            .rates()
            .iter()
            .zip(other.rates())
            .map(|(a, b)| a / b)
            .collect();
        median(&r)
    }
}

/// The throughput results of one pipelining mode.
struct TputMode {
    /// Commands in flight per connection.
    depth: usize,
    /// Single commands: acquire on fresh keys, then release of exactly those keys.
    acquire: Tput,
    set_nx: Tput,
    release: Tput,
    evalsha: Tput,
    /// Full cycles on distinct keys (one operation = acquire + release).
    cycle_lock: Tput,
    cycle_eval: Tput,
    cycle_del: Tput,
    /// redis-benchmark cross-check: LOCK.ACQUIRE and SET NX PX on random keys.
    rb_acquire: Tput,
    rb_set: Tput,
}

fn throughput(
    srv: &Server,
    ctl: &mut Connection,
    sizes: &Sizes,
    cfg: &Config,
    sha: &str,
) -> Vec<TputMode> {
    let owners: Vec<String> = (0..CONNS)
        .map(|_| uuid::Uuid::new_v4().to_string())
        .collect();
    let ttl = LONG_TTL_MS.to_string();
    let mut modes = Vec::new();
    for (depth, total) in [(16, sizes.tput_p16), (1, sizes.tput_p1)] {
        eprintln!(
            "[1] throughput, {CONNS} connections, {depth} in flight each, {total} commands per run"
        );
        let per_conn = total / CONNS;
        let load = Load {
            conns: CONNS,
            depth,
            per_conn,
        };
        let cycles_load = Load {
            per_conn: per_conn / 2 * 2,
            ..load
        };
        let mut m = TputMode {
            depth,
            acquire: Tput::named("LOCK.ACQUIRE"),
            set_nx: Tput::named("SET NX PX"),
            release: Tput::named("LOCK.RELEASE"),
            evalsha: Tput::named("EVALSHA release script"),
            cycle_lock: Tput::named("LOCK.ACQUIRE + LOCK.RELEASE"),
            cycle_eval: Tput::named("SET NX PX + EVALSHA"),
            cycle_del: Tput::named("SET NX PX + DEL (floor)"),
            rb_acquire: Tput::named("LOCK.ACQUIRE (redis-benchmark)"),
            rb_set: Tput::named("SET NX PX (redis-benchmark)"),
        };
        for round in 0..sizes.tput_rounds {
            let lock_first = round % 2 == 0;
            // Acquire on fresh keys, then release exactly those keys; same for the classic side.
            for side in if lock_first {
                [true, false]
            } else {
                [false, true]
            } {
                flushall(ctl);
                let prefix = format!("t{round}{}", if side { 'L' } else { 'C' });
                let ops = (per_conn * CONNS) as f64;
                if side {
                    let run = drive(srv, ctl, load, |c, i, out| {
                        let mut kb = [0u8; 64];
                        let k = key_into(&mut kb, &prefix, c, i);
                        resp(
                            out,
                            &[b"LOCK.ACQUIRE", k, owners[c].as_bytes(), ttl.as_bytes()],
                        );
                        Expect::Token
                    });
                    m.acquire.add(ops, &run, &["lock.acquire"]);
                    let run = drive(srv, ctl, load, |c, i, out| {
                        let mut kb = [0u8; 64];
                        let k = key_into(&mut kb, &prefix, c, i);
                        resp(out, &[b"LOCK.RELEASE", k, owners[c].as_bytes()]);
                        Expect::One
                    });
                    m.release.add(ops, &run, &["lock.release"]);
                } else {
                    let run = drive(srv, ctl, load, |c, i, out| {
                        let mut kb = [0u8; 64];
                        let k = key_into(&mut kb, &prefix, c, i);
                        resp(
                            out,
                            &[
                                b"SET",
                                k,
                                owners[c].as_bytes(),
                                b"NX",
                                b"PX",
                                ttl.as_bytes(),
                            ],
                        );
                        Expect::Ok
                    });
                    m.set_nx.add(ops, &run, &["set"]);
                    let run = drive(srv, ctl, load, |c, i, out| {
                        let mut kb = [0u8; 64];
                        let k = key_into(&mut kb, &prefix, c, i);
                        resp(
                            out,
                            &[b"EVALSHA", sha.as_bytes(), b"1", k, owners[c].as_bytes()],
                        );
                        Expect::One
                    });
                    m.evalsha.add(ops, &run, &["evalsha"]);
                }
            }
            // Full cycles on distinct keys: acquire then release of the same key, back to back on
            // one connection (pipelined together when depth > 1).
            let order: [usize; 3] = if lock_first { [0, 1, 2] } else { [2, 1, 0] };
            for which in order {
                flushall(ctl);
                let prefix = format!("c{round}{which}");
                let cycles = (cycles_load.per_conn / 2 * CONNS) as f64;
                let run = drive(srv, ctl, cycles_load, |c, i, out| {
                    let mut kb = [0u8; 64];
                    let k = key_into(&mut kb, &prefix, c, i / 2);
                    let owner = owners[c].as_bytes();
                    match (which, i % 2) {
                        (0, 0) => {
                            resp(out, &[b"LOCK.ACQUIRE", k, owner, ttl.as_bytes()]);
                            Expect::Token
                        }
                        (0, _) => {
                            resp(out, &[b"LOCK.RELEASE", k, owner]);
                            Expect::One
                        }
                        (_, 0) => {
                            resp(out, &[b"SET", k, owner, b"NX", b"PX", ttl.as_bytes()]);
                            Expect::Ok
                        }
                        (1, _) => {
                            resp(out, &[b"EVALSHA", sha.as_bytes(), b"1", k, owner]);
                            Expect::One
                        }
                        _ => {
                            resp(out, &[b"DEL", k]);
                            Expect::One
                        }
                    }
                });
                match which {
                    0 => m
                        .cycle_lock
                        .add(cycles, &run, &["lock.acquire", "lock.release"]),
                    1 => m.cycle_eval.add(cycles, &run, &["set", "evalsha"]),
                    _ => m.cycle_del.add(cycles, &run, &["set", "del"]),
                }
            }
            // Cross-check with redis-benchmark (random keys in a 10^8 keyspace, so nearly every
            // command finds a fresh key; the few repeats are refused the same way on both sides).
            for side in if lock_first {
                [true, false]
            } else {
                [false, true]
            } {
                flushall(ctl);
                let args: Vec<String> = if side {
                    ["LOCK.ACQUIRE", "rb:__rand_int__", &owners[0], &ttl]
                        .map(String::from)
                        .to_vec()
                } else {
                    ["SET", "rb:__rand_int__", &owners[0], "NX", "PX", &ttl]
                        .map(String::from)
                        .to_vec()
                };
                if let Some((ops, run)) =
                    redis_benchmark(cfg, srv, ctl, depth, per_conn * CONNS, &args)
                {
                    if side {
                        m.rb_acquire.add(ops, &run, &["lock.acquire"]);
                    } else {
                        m.rb_set.add(ops, &run, &["set"]);
                    }
                }
            }
        }
        flushall(ctl);
        modes.push(m);
    }
    modes
}

/// Run `redis-benchmark -c 50 -P depth -r 10^8 --csv <args>`; returns (commands, measurements),
/// with the wall time taken from its own requests-per-second figure.
fn redis_benchmark(
    cfg: &Config,
    srv: &Server,
    ctl: &mut Connection,
    depth: usize,
    n: usize,
    args: &[String],
) -> Option<(f64, Run)> {
    reset_stats(ctl);
    let cpu0 = server_cpu(ctl);
    let out = Command::new(&cfg.benchmark_bin)
        .args(["-h", "127.0.0.1", "-p", &srv.port.to_string()])
        .args([
            "-c",
            &CONNS.to_string(),
            "-n",
            &n.to_string(),
            "-P",
            &depth.to_string(),
        ])
        .args(["-r", "100000000", "--csv"])
        .args(args)
        .stderr(Stdio::null())
        .output();
    let out = match out {
        Ok(o) if o.status.success() => o,
        other => {
            eprintln!("    redis-benchmark unavailable or failed ({other:?}); cross-check skipped");
            return None;
        }
    };
    let cpu = server_cpu(ctl) - cpu0;
    let cmd = commandstats(ctl);
    let text = String::from_utf8_lossy(&out.stdout);
    let rps: f64 = text
        .lines()
        .nth(1)?
        .split("\",\"")
        .nth(1)?
        .trim_matches('"')
        .parse()
        .ok()?;
    let calls = cmd
        .get(if args[0] == "SET" {
            "set"
        } else {
            "lock.acquire"
        })
        .map_or(0, |c| c.0);
    let ops = calls as f64;
    let run = Run {
        done: calls,
        refused: 0,
        secs: ops / rps,
        cpu,
        cmd,
    };
    Some((ops, run))
}

/// What loading the module costs commands that have nothing to do with locks: the same
/// `SET NX PX` and `INCR` load on our server and on a second `redis-server` without the module,
/// alternating, plus `LOCK.ACQUIRE` in the same rounds.
struct Tax {
    /// `LOCK.ACQUIRE` on fresh keys (module server).
    acquire: Tput,
    /// `SET NX PX` on fresh keys, on the module server and on the plain server.
    set_module: Tput,
    set_plain: Tput,
    /// `INCR` of one counter per connection, on the module server and on the plain server.
    incr_module: Tput,
    incr_plain: Tput,
}

fn module_tax(cfg: &Config, srv: &Server, ctl: &mut Connection, sizes: &Sizes) -> Option<Tax> {
    if cfg.existing_port.is_some() {
        return None;
    }
    let plain = match Server::spawn(cfg, None) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("    cannot start a server without the module ({e}); skipped");
            return None;
        }
    };
    let mut pctl = plain.connect();
    eprintln!("[1] module tax: the same writes on a server without the module");
    let owners: Vec<String> = (0..CONNS)
        .map(|_| uuid::Uuid::new_v4().to_string())
        .collect();
    let ttl = LONG_TTL_MS.to_string();
    let load = Load {
        conns: CONNS,
        depth: 16,
        per_conn: sizes.tput_p16 / CONNS,
    };
    let ops = (load.per_conn * CONNS) as f64;
    let mut tax = Tax {
        acquire: Tput::named("LOCK.ACQUIRE (module loaded)"),
        set_module: Tput::named("SET NX PX (module loaded)"),
        set_plain: Tput::named("SET NX PX (no module)"),
        incr_module: Tput::named("INCR (module loaded)"),
        incr_plain: Tput::named("INCR (no module)"),
    };
    for round in 0..sizes.tput_rounds {
        let mut order = [0, 1, 2, 3, 4];
        if round % 2 == 1 {
            order.reverse();
        }
        for which in order {
            let (server, con) = if which == 2 || which == 4 {
                (&plain, &mut pctl)
            } else {
                (srv, &mut *ctl)
            };
            flushall(con);
            let prefix = format!("x{round}");
            let run = drive(server, con, load, |c, i, out| {
                let mut kb = [0u8; 64];
                let k = key_into(&mut kb, &prefix, c, i);
                let owner = owners[c].as_bytes();
                match which {
                    0 => {
                        resp(out, &[b"LOCK.ACQUIRE", k, owner, ttl.as_bytes()]);
                        Expect::Token
                    }
                    1 | 2 => {
                        resp(out, &[b"SET", k, owner, b"NX", b"PX", ttl.as_bytes()]);
                        Expect::Ok
                    }
                    _ => {
                        let k = key_into(&mut kb, "counter", c, 0);
                        resp(out, &[b"INCR", k]);
                        Expect::Token
                    }
                }
            });
            match which {
                0 => tax.acquire.add(ops, &run, &["lock.acquire"]),
                1 => tax.set_module.add(ops, &run, &["set"]),
                2 => tax.set_plain.add(ops, &run, &["set"]),
                3 => tax.incr_module.add(ops, &run, &["incr"]),
                _ => tax.incr_plain.add(ops, &run, &["incr"]),
            }
        }
    }
    flushall(ctl);
    Some(tax)
}

// ---------------------------------------------------------------------------------------------
// Scenario 2: contention on one key
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
enum Strategy {
    /// `LOCK.ACQUIRE ... BLOCK`, released with `LOCK.RELEASE`.
    Block,
    /// `BLPOP` a token from a one-element list, `LPUSH` it back: the fair lower bound.
    Blpop,
    /// `SET NX PX`, sleep 10 ms on failure; released with the EVALSHA script.
    Retry10,
    /// As `Retry10` with 1 ms.
    Retry1,
    /// As `Retry10`, sleeping `d/2 + rand(0..=d/2)` with `d = min(100 ms, 1 ms * 2^failures)`.
    Backoff,
}

impl Strategy {
    const ALL: [Strategy; 5] = [
        Strategy::Block,
        Strategy::Blpop,
        Strategy::Retry10,
        Strategy::Retry1,
        Strategy::Backoff,
    ];
    fn label(self) -> &'static str {
        match self {
            Strategy::Block => "LOCK.ACQUIRE BLOCK",
            Strategy::Blpop => "BLPOP/LPUSH token",
            Strategy::Retry10 => "retry every 10 ms",
            Strategy::Retry1 => "retry every 1 ms",
            Strategy::Backoff => "exp. backoff 1-100 ms",
        }
    }
    fn id(self) -> &'static str {
        match self {
            Strategy::Block => "lock_block",
            Strategy::Blpop => "blpop_token",
            Strategy::Retry10 => "retry_10ms",
            Strategy::Retry1 => "retry_1ms",
            Strategy::Backoff => "exp_backoff",
        }
    }
    /// SVG stroke attributes: the lock thick, BLPOP dashed (it runs along the lock's line).
    fn stroke(self) -> &'static str {
        match self {
            Strategy::Block => r#"stroke-width="4""#,
            Strategy::Blpop => r#"stroke-width="2" stroke-dasharray="6 4""#,
            _ => r#"stroke-width="2""#,
        }
    }
    fn color(self) -> &'static str {
        match self {
            Strategy::Block => "#1f5fbf",
            Strategy::Blpop => "#2a9d3a",
            Strategy::Retry10 => "#e07b00",
            Strategy::Retry1 => "#c62828",
            Strategy::Backoff => "#7b3fa0",
        }
    }
}

/// One contender at one worker count, summed over its rounds.
#[derive(Clone, Debug)]
struct Contention {
    strategy: Strategy,
    workers: usize,
    /// Seconds from the start signal to the last release, summed over rounds.
    secs: f64,
    /// Every completed wait, in ms (from wanting the lock to holding it).
    waits: Vec<f64>,
    /// Waits still going when the run's hard limit hit (a starved worker gave up), in ms.
    unfinished: Vec<f64>,
    /// Acquisitions per worker.
    per_worker: Vec<u64>,
    /// Acquisitions whose holder differs from the previous holder.
    handoffs: u64,
    /// Commands the clients sent, and the acquire attempts among them.
    cmds: u64,
    acquire_cmds: u64,
    /// Server CPU seconds.
    cpu: f64,
}

impl Contention {
    fn acquisitions(&self) -> u64 {
        self.per_worker.iter().sum()
    }
    fn handoffs_per_s(&self) -> f64 {
        self.handoffs as f64 / self.secs
    }
    fn max_wait(&self) -> f64 {
        self.waits
            .iter()
            .chain(&self.unfinished)
            .copied()
            .fold(0.0, f64::max)
    }
}

/// What a worker reports: its acquisitions (grant time since start in s, wait in ms) and counts.
struct WorkerLog {
    grants: Vec<(f64, f64)>,
    unfinished: Option<f64>,
    cmds: u64,
    acquire_cmds: u64,
    last_release: Instant,
}

const LOCK_KEY: &str = "bench:onekey";
const TOKEN_LIST: &str = "bench:token";
const HOLD: Duration = Duration::from_millis(1);

fn contention_round(
    srv: &Server,
    ctl: &mut Connection,
    strategy: Strategy,
    workers: usize,
    secs: f64,
    grace: Duration,
    sha: &str,
) -> Contention {
    let _: () = redis::cmd("DEL")
        .arg(LOCK_KEY)
        .arg(TOKEN_LIST)
        .query(ctl)
        .expect("DEL");
    if strategy == Strategy::Blpop {
        let _: () = redis::cmd("LPUSH")
            .arg(TOKEN_LIST)
            .arg("token")
            .query(ctl)
            .expect("LPUSH");
    }
    let connected = Barrier::new(workers + 1);
    let go = Barrier::new(workers + 1);
    let start: OnceLock<Instant> = OnceLock::new();
    let window = Duration::from_secs_f64(secs);
    let logs: Vec<WorkerLog>;
    let cpu0;
    let t0;
    {
        let (connected, go, start) = (&connected, &go, &start);
        (logs, cpu0, t0) = thread::scope(|s| {
            let handles: Vec<_> = (0..workers)
                .map(|w| {
                    s.spawn(move || {
                        let mut con = srv.connect();
                        let owner = format!("worker-{w}-{}", uuid::Uuid::new_v4());
                        let mut rng = rand::thread_rng();
                        connected.wait();
                        go.wait();
                        let t0 = *start.get().expect("start time");
                        let stop = t0 + window;
                        let hard_stop = stop + grace;
                        let mut log = WorkerLog {
                            grants: Vec::new(),
                            unfinished: None,
                            cmds: 0,
                            acquire_cmds: 0,
                            last_release: t0,
                        };
                        loop {
                            let want = Instant::now();
                            if want >= stop {
                                break;
                            }
                            let mut failures = 0u32;
                            let granted = loop {
                                log.cmds += 1;
                                log.acquire_cmds += 1;
                                let ok = match strategy {
                                    Strategy::Block => redis::cmd("LOCK.ACQUIRE")
                                        .arg(LOCK_KEY)
                                        .arg(&owner)
                                        .arg(10_000)
                                        .arg("BLOCK")
                                        .arg(30_000)
                                        .query::<Option<i64>>(&mut con)
                                        .expect("LOCK.ACQUIRE")
                                        .is_some(),
                                    Strategy::Blpop => redis::cmd("BLPOP")
                                        .arg(TOKEN_LIST)
                                        .arg(30)
                                        .query::<Option<(String, String)>>(&mut con)
                                        .expect("BLPOP")
                                        .is_some(),
                                    _ => redis::cmd("SET")
                                        .arg(LOCK_KEY)
                                        .arg(&owner)
                                        .arg("NX")
                                        .arg("PX")
                                        .arg(10_000)
                                        .query::<Option<String>>(&mut con)
                                        .expect("SET NX PX")
                                        .is_some(),
                                };
                                if ok {
                                    break true;
                                }
                                if Instant::now() >= hard_stop {
                                    break false;
                                }
                                let pause = match strategy {
                                    Strategy::Block | Strategy::Blpop => Duration::ZERO,
                                    Strategy::Retry10 => Duration::from_millis(10),
                                    Strategy::Retry1 => Duration::from_millis(1),
                                    Strategy::Backoff => {
                                        let d_us = (1000u64 << failures.min(7)).min(100_000);
                                        Duration::from_micros(
                                            d_us / 2 + rng.gen_range(0..=d_us / 2),
                                        )
                                    }
                                };
                                failures += 1;
                                thread::sleep(pause);
                            };
                            let got = Instant::now();
                            if !granted {
                                log.unfinished = Some((got - want).as_secs_f64() * 1000.0);
                                break;
                            }
                            log.grants.push((
                                (got - t0).as_secs_f64(),
                                (got - want).as_secs_f64() * 1000.0,
                            ));
                            thread::sleep(HOLD);
                            log.cmds += 1;
                            match strategy {
                                Strategy::Block => {
                                    let n: i64 = redis::cmd("LOCK.RELEASE")
                                        .arg(LOCK_KEY)
                                        .arg(&owner)
                                        .query(&mut con)
                                        .expect("LOCK.RELEASE");
                                    assert_eq!(n, 1, "LOCK.RELEASE of a held lock returned {n}");
                                }
                                Strategy::Blpop => {
                                    let _: i64 = redis::cmd("LPUSH")
                                        .arg(TOKEN_LIST)
                                        .arg("token")
                                        .query(&mut con)
                                        .expect("LPUSH");
                                }
                                _ => {
                                    let n: i64 = redis::cmd("EVALSHA")
                                        .arg(sha)
                                        .arg(1)
                                        .arg(LOCK_KEY)
                                        .arg(&owner)
                                        .query(&mut con)
                                        .expect("EVALSHA");
                                    assert_eq!(n, 1, "release script on a held lock returned {n}");
                                }
                            }
                            log.last_release = Instant::now();
                        }
                        log
                    })
                })
                .collect();
            connected.wait();
            let cpu0 = server_cpu(ctl);
            let t0 = Instant::now();
            start.set(t0).expect("start set once");
            go.wait();
            let logs: Vec<WorkerLog> = handles
                .into_iter()
                .map(|h| h.join().expect("worker panicked"))
                .collect();
            (logs, cpu0, t0)
        });
    }
    let cpu = server_cpu(ctl) - cpu0;
    let end = logs.iter().map(|l| l.last_release).max().unwrap_or(t0);
    let mut grants: Vec<(f64, usize)> = Vec::new();
    let mut waits = Vec::new();
    for (w, l) in logs.iter().enumerate() {
        for &(at, wait) in &l.grants {
            grants.push((at, w));
            waits.push(wait);
        }
    }
    grants.sort_by(|a, b| a.0.total_cmp(&b.0));
    let handoffs = grants.windows(2).filter(|p| p[0].1 != p[1].1).count() as u64;
    Contention {
        strategy,
        workers,
        secs: (end - t0).as_secs_f64(),
        waits,
        unfinished: logs.iter().filter_map(|l| l.unfinished).collect(),
        per_worker: logs.iter().map(|l| l.grants.len() as u64).collect(),
        handoffs,
        cmds: logs.iter().map(|l| l.cmds).sum(),
        acquire_cmds: logs.iter().map(|l| l.acquire_cmds).sum(),
        cpu,
    }
}

fn contention(
    srv: &Server,
    ctl: &mut Connection,
    sizes: &Sizes,
    quick: bool,
    sha: &str,
) -> Vec<Contention> {
    let grace = Duration::from_secs(if quick { 10 } else { 30 });
    let mut out = Vec::new();
    for workers in [2, 8, 32] {
        eprintln!(
            "[2] contention on one key, {workers} workers, {} x {:.0} s per contender",
            sizes.contention_rounds, sizes.contention_secs
        );
        let mut merged: Vec<Option<Contention>> = vec![None; Strategy::ALL.len()];
        for round in 0..sizes.contention_rounds {
            let mut order: Vec<usize> = (0..Strategy::ALL.len()).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for i in order {
                let r = contention_round(
                    srv,
                    ctl,
                    Strategy::ALL[i],
                    workers,
                    sizes.contention_secs,
                    grace,
                    sha,
                );
                merged[i] = Some(match merged[i].take() {
                    None => r,
                    Some(mut m) => {
                        m.secs += r.secs;
                        m.waits.extend(r.waits);
                        m.unfinished.extend(r.unfinished);
                        for (a, b) in m.per_worker.iter_mut().zip(&r.per_worker) {
                            *a += b;
                        }
                        m.handoffs += r.handoffs;
                        m.cmds += r.cmds;
                        m.acquire_cmds += r.acquire_cmds;
                        m.cpu += r.cpu;
                        m
                    }
                });
            }
        }
        out.extend(merged.into_iter().flatten());
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Scenario 3: expiry handoff
// ---------------------------------------------------------------------------------------------

struct Expiry {
    ttl_ms: u64,
    /// Lock: client-observed delay from the holder's deadline to the waiter's grant reply (ms).
    lock: Vec<f64>,
    /// Lock: the same delay on the server's clock, from the waiter's token (whole ms).
    lock_server: Vec<f64>,
    /// Poller (`SET NX PX` every 10 ms): delay from the holder's deadline to its `OK` (ms).
    poll: Vec<f64>,
}

/// The clock shift of the module's tokens: a token minted at server time `t` ms is `t << shift`
/// when it is the first of that millisecond (see the README's "Fencing tokens"). The shift is
/// read off a fresh token against this machine's clock rather than assumed, so a change of the
/// token layout does not silently skew the figures; `None` when the token does not look like
/// that (then the server-clock figure is left out).
fn token_shift(token: i64) -> Option<u32> {
    let now = wall_ms();
    (0..=40u32).find(|&shift| ((token >> shift) as f64 - now).abs() < 5_000.0)
}

/// The server millisecond of a token, and whether the token was the first of that millisecond.
fn token_ms(token: i64, shift: u32) -> (i64, bool) {
    (token >> shift, token & ((1i64 << shift) - 1) == 0)
}

fn expiry(srv: &Server, ctl: &mut Connection, sizes: &Sizes) -> Expiry {
    const TTL: u64 = 200;
    eprintln!(
        "[3] expiry handoff, ttl {TTL} ms, {} handoffs per contender",
        sizes.expiry_reps
    );
    let key = "bench:expiry";
    let mut holder = srv.connect();
    let mut waiter = srv.connect();
    let mut rng = rand::thread_rng();
    let mut out = Expiry {
        ttl_ms: TTL,
        lock: Vec::new(),
        lock_server: Vec::new(),
        poll: Vec::new(),
    };
    for rep in 0..sizes.expiry_reps {
        let lock_first = rep % 2 == 0;
        for side in if lock_first {
            [true, false]
        } else {
            [false, true]
        } {
            let _: () = redis::cmd("DEL").arg(key).query(ctl).expect("DEL");
            if side {
                let token: i64 = redis::cmd("LOCK.ACQUIRE")
                    .arg(key)
                    .arg("holder")
                    .arg(TTL)
                    .query(&mut holder)
                    .expect("LOCK.ACQUIRE holder");
                // The grant's server time is in its token when it was the first of its ms;
                // otherwise ask the key's absolute expiry (equal to the deadline).
                let shift = token_shift(token);
                let deadline = match shift.map(|s| token_ms(token, s)) {
                    Some((ms, true)) => ms + TTL as i64,
                    _ => redis::cmd("PEXPIRETIME")
                        .arg(key)
                        .query(&mut holder)
                        .expect("PEXPIRETIME"),
                };
                let got: Option<i64> = redis::cmd("LOCK.ACQUIRE")
                    .arg(key)
                    .arg("waiter")
                    .arg(10_000)
                    .arg("BLOCK")
                    .arg(5_000)
                    .query(&mut waiter)
                    .expect("LOCK.ACQUIRE waiter");
                let at = wall_ms();
                let token = got.expect("the waiter timed out instead of getting the expired lock");
                out.lock.push(at - deadline as f64);
                if let Some(s) = shift {
                    out.lock_server
                        .push((token_ms(token, s).0 - deadline) as f64);
                }
                let _: i64 = redis::cmd("LOCK.RELEASE")
                    .arg(key)
                    .arg("waiter")
                    .query(&mut waiter)
                    .expect("LOCK.RELEASE");
            } else {
                let ok: Option<String> = redis::cmd("SET")
                    .arg(key)
                    .arg("holder")
                    .arg("NX")
                    .arg("PX")
                    .arg(TTL)
                    .query(&mut holder)
                    .expect("SET holder");
                assert!(ok.is_some(), "holder could not take a free key");
                let deadline: i64 = redis::cmd("PEXPIRETIME")
                    .arg(key)
                    .query(&mut holder)
                    .expect("PEXPIRETIME");
                // Start polling at a random phase of the 10 ms period.
                thread::sleep(Duration::from_micros(rng.gen_range(0..10_000)));
                let limit = Instant::now() + Duration::from_secs(5);
                loop {
                    let ok: Option<String> = redis::cmd("SET")
                        .arg(key)
                        .arg("poller")
                        .arg("NX")
                        .arg("PX")
                        .arg(10_000)
                        .query(&mut waiter)
                        .expect("SET poller");
                    if ok.is_some() {
                        out.poll.push(wall_ms() - deadline as f64);
                        break;
                    }
                    assert!(Instant::now() < limit, "poller never got the expired key");
                    thread::sleep(Duration::from_millis(10));
                }
                let _: i64 = redis::cmd("DEL").arg(key).query(ctl).expect("DEL");
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Scenario 4: memory
// ---------------------------------------------------------------------------------------------

struct Memory {
    locks: usize,
    owner_len: usize,
    key_example: String,
    /// used_memory delta per held lock / per SET-string lock (bytes).
    lock_bytes: f64,
    string_bytes: f64,
    /// `MEMORY USAGE` of one key of each kind.
    lock_usage: u64,
    string_usage: u64,
    /// Blocked waiters, and used_memory per waiter above an idle connection that has sent a command.
    waiters: usize,
    lock_waiter_bytes: f64,
    blpop_waiter_bytes: f64,
}

fn used_memory(con: &mut Connection) -> f64 {
    info_u64(con, "memory", "used_memory") as f64
}

fn memory(srv: &Server, ctl: &mut Connection, sizes: &Sizes) -> Memory {
    eprintln!(
        "[4] memory: {} held locks, {} waiters",
        sizes.memory_locks, sizes.waiters
    );
    let n = sizes.memory_locks;
    let owners: Vec<String> = (0..CONNS)
        .map(|_| uuid::Uuid::new_v4().to_string())
        .collect();
    let ttl = LONG_TTL_MS.to_string();
    let load = Load {
        conns: CONNS,
        depth: 16,
        per_conn: n / CONNS,
    };
    let clients0 = info_u64(ctl, "clients", "connected_clients");
    let mut per_key = [0.0; 2];
    let mut usage = [0u64; 2];
    for (slot, lock) in [(0, true), (1, false)] {
        flushall(ctl);
        let before = used_memory(ctl);
        let run = drive(srv, ctl, load, |c, i, out| {
            let mut kb = [0u8; 64];
            let k = key_into(&mut kb, "mem", c, i);
            if lock {
                resp(
                    out,
                    &[b"LOCK.ACQUIRE", k, owners[c].as_bytes(), ttl.as_bytes()],
                );
                Expect::Token
            } else {
                resp(
                    out,
                    &[
                        b"SET",
                        k,
                        owners[c].as_bytes(),
                        b"NX",
                        b"PX",
                        ttl.as_bytes(),
                    ],
                );
                Expect::Ok
            }
        });
        assert_eq!(run.refused, 0, "memory load: some keys were refused");
        wait_info(
            ctl,
            "clients",
            "connected_clients",
            Duration::from_secs(5),
            |v| v <= clients0,
        );
        let after = used_memory(ctl);
        per_key[slot] = (after - before) / (load.per_conn * CONNS) as f64;
        usage[slot] = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg("mem:0:0")
            .query(ctl)
            .expect("MEMORY USAGE");
    }
    flushall(ctl);

    // Waiters: `waiters` connections each send PING (so each has a query buffer, as a blocked
    // client does), then a blocking command; the used_memory difference is the waiting state.
    // Both readings are taken within a second, before the server trims idle query buffers (2 s).
    let mut per_waiter = [0.0; 2];
    for (slot, lock) in [(0, true), (1, false)] {
        let _: () = redis::cmd("DEL").arg("mem:wait").query(ctl).expect("DEL");
        if lock {
            let _: i64 = redis::cmd("LOCK.ACQUIRE")
                .arg("mem:wait")
                .arg("holder")
                .arg(LONG_TTL_MS)
                .query(ctl)
                .expect("LOCK.ACQUIRE holder");
        }
        let mut socks: Vec<TcpStream> = (0..sizes.waiters).map(|_| srv.raw()).collect();
        for s in socks.iter_mut() {
            s.write_all(b"*1\r\n$4\r\nPING\r\n").expect("PING");
        }
        for s in socks.iter_mut() {
            let mut buf = [0u8; 7];
            s.read_exact(&mut buf).expect("PONG");
        }
        let before = used_memory(ctl);
        for s in socks.iter_mut() {
            let mut out = Vec::new();
            let owner = format!("{}", uuid::Uuid::new_v4());
            if lock {
                resp(
                    &mut out,
                    &[
                        b"LOCK.ACQUIRE",
                        b"mem:wait",
                        owner.as_bytes(),
                        b"10000",
                        b"BLOCK",
                        b"0",
                    ],
                );
            } else {
                resp(&mut out, &[b"BLPOP", b"mem:wait", b"0"]);
            }
            s.write_all(&out).expect("blocking command");
        }
        let blocked = wait_info(
            ctl,
            "clients",
            "blocked_clients",
            Duration::from_secs(10),
            |v| v >= sizes.waiters as u64,
        );
        assert_eq!(blocked, sizes.waiters as u64, "not every waiter blocked");
        let after = used_memory(ctl);
        per_waiter[slot] = (after - before) / sizes.waiters as f64;
        drop(socks);
        wait_info(
            ctl,
            "clients",
            "connected_clients",
            Duration::from_secs(10),
            |v| v <= clients0,
        );
        let _: () = redis::cmd("DEL").arg("mem:wait").query(ctl).expect("DEL");
    }
    Memory {
        locks: load.per_conn * CONNS,
        owner_len: owners[0].len(),
        key_example: "mem:17:4711".into(),
        lock_bytes: per_key[0],
        string_bytes: per_key[1],
        lock_usage: usage[0],
        string_usage: usage[1],
        waiters: sizes.waiters,
        lock_waiter_bytes: per_waiter[0],
        blpop_waiter_bytes: per_waiter[1],
    }
}

// ---------------------------------------------------------------------------------------------
// Scenario 5: a million expiring locks
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct Scale {
    what: String,
    /// The server's `hz` during the run (its active expiry runs `hz` times a second).
    hz: u64,
    locks: u64,
    ttl_ms: u64,
    take_secs: f64,
    /// Seconds from the last lock taken to `DBSIZE` 0.
    drain_secs: f64,
    /// PING latencies (ms) while the locks were being taken, and afterwards until all were gone.
    ping_load: Vec<f64>,
    ping_expiry: Vec<f64>,
    /// Keys left when the time limit hit (0 when all expired).
    left: u64,
}

fn config_get(con: &mut Connection, name: &str) -> String {
    let v: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg(name)
        .query(con)
        .expect("CONFIG GET");
    v.get(1).cloned().unwrap_or_default()
}

fn config_set(con: &mut Connection, name: &str, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(con)
        .expect("CONFIG SET");
}

/// Scale run with the server's `hz` set to `hz` for its duration (then restored), if given.
fn scale_at_hz(
    srv: &Server,
    ctl: &mut Connection,
    sizes: &Sizes,
    lock: bool,
    hz: Option<u64>,
) -> Scale {
    let old = config_get(ctl, "hz");
    if let Some(hz) = hz {
        config_set(ctl, "hz", &hz.to_string());
    }
    let mut r = scale(srv, ctl, sizes, lock);
    config_set(ctl, "hz", &old);
    r.hz = hz.unwrap_or_else(|| old.parse().unwrap_or(0));
    if hz.is_some() {
        r.what.push_str(&format!(" at hz {}", r.hz));
    }
    r
}

fn scale(srv: &Server, ctl: &mut Connection, sizes: &Sizes, lock: bool) -> Scale {
    let n = sizes.scale_locks;
    let what = if lock { "LOCK.ACQUIRE" } else { "SET NX PX" };
    eprintln!(
        "[5] scale: {n} x {what} with ttl {} ms, PING latency until all expire",
        sizes.scale_ttl_ms
    );
    flushall(ctl);
    let owners: Vec<String> = (0..CONNS)
        .map(|_| uuid::Uuid::new_v4().to_string())
        .collect();
    let ttl = sizes.scale_ttl_ms.to_string();
    let load = Load {
        conns: CONNS,
        depth: 16,
        per_conn: n / CONNS,
    };
    let stop = AtomicBool::new(false);
    let t0 = Instant::now();
    let (run, samples, load_end, done, left) = thread::scope(|s| {
        let stop = &stop;
        let sampler = s.spawn(move || {
            // Back-to-back PINGs on a raw socket: a stall of the event loop shows up as one
            // slow PING at most one round trip after the stall begins.
            let mut sock = srv.raw();
            let mut samples: Vec<(f64, f64)> = Vec::with_capacity(1 << 20);
            let mut buf = [0u8; 7];
            while !stop.load(Ordering::Relaxed) {
                let sent = Instant::now();
                sock.write_all(b"*1\r\n$4\r\nPING\r\n").expect("PING");
                sock.read_exact(&mut buf).expect("PONG");
                let back = Instant::now();
                samples.push((
                    (sent - t0).as_secs_f64(),
                    (back - sent).as_secs_f64() * 1000.0,
                ));
            }
            samples
        });
        let run = drive(srv, ctl, load, |c, i, out| {
            let mut kb = [0u8; 64];
            let k = key_into(&mut kb, "scale", c, i);
            if lock {
                resp(
                    out,
                    &[b"LOCK.ACQUIRE", k, owners[c].as_bytes(), ttl.as_bytes()],
                );
                Expect::Token
            } else {
                resp(
                    out,
                    &[
                        b"SET",
                        k,
                        owners[c].as_bytes(),
                        b"NX",
                        b"PX",
                        ttl.as_bytes(),
                    ],
                );
                Expect::Ok
            }
        });
        let load_end = (Instant::now() - t0).as_secs_f64();
        let limit = Instant::now() + Duration::from_secs(300);
        let left = loop {
            let keys: u64 = redis::cmd("DBSIZE").query(ctl).expect("DBSIZE");
            if keys == 0 || Instant::now() > limit {
                break keys;
            }
            thread::sleep(Duration::from_millis(10));
        };
        let done = (Instant::now() - t0).as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        let samples = sampler.join().expect("sampler panicked");
        (run, samples, load_end, done, left)
    });
    let mut ping_load = Vec::new();
    let mut ping_expiry = Vec::new();
    for (at, lat) in samples {
        if at < load_end {
            ping_load.push(lat);
        } else if at < done {
            ping_expiry.push(lat);
        }
    }
    Scale {
        what: what.into(),
        hz: 0,
        locks: run.done,
        ttl_ms: sizes.scale_ttl_ms,
        take_secs: run.secs,
        drain_secs: done - load_end,
        ping_load: sorted(ping_load),
        ping_expiry: sorted(ping_expiry),
        left,
    }
}

// ---------------------------------------------------------------------------------------------
// The report
// ---------------------------------------------------------------------------------------------

/// A JSON value, written by hand (no serialisation crate).
enum Json {
    Num(f64),
    Str(String),
    Bool(bool),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    fn write(&self, out: &mut String, indent: usize) {
        let pad = "  ".repeat(indent + 1);
        match self {
            Json::Num(x) if x.is_finite() => {
                if x.fract() == 0.0 && x.abs() < 1e15 {
                    let _ = write!(out, "{}", *x as i64);
                } else {
                    let _ = write!(out, "{}", (x * 1e4).round() / 1e4);
                }
            }
            Json::Num(_) => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Str(s) => {
                out.push('"');
                for ch in s.chars() {
                    match ch {
                        '"' => out.push_str("\\\""),
                        '\\' => out.push_str("\\\\"),
                        '\n' => out.push_str("\\n"),
                        c if (c as u32) < 0x20 => {
                            let _ = write!(out, "\\u{:04x}", c as u32);
                        }
                        c => out.push(c),
                    }
                }
                out.push('"');
            }
            Json::Arr(items) => {
                if items.iter().all(|i| matches!(i, Json::Num(_))) {
                    out.push('[');
                    for (i, item) in items.iter().enumerate() {
                        if i > 0 {
                            out.push_str(", ");
                        }
                        item.write(out, indent);
                    }
                    out.push(']');
                    return;
                }
                out.push_str("[\n");
                for (i, item) in items.iter().enumerate() {
                    out.push_str(&pad);
                    item.write(out, indent + 1);
                    out.push_str(if i + 1 < items.len() { ",\n" } else { "\n" });
                }
                out.push_str(&"  ".repeat(indent));
                out.push(']');
            }
            Json::Obj(fields) => {
                out.push_str("{\n");
                for (i, (k, v)) in fields.iter().enumerate() {
                    out.push_str(&pad);
                    Json::Str(k.clone()).write(out, indent + 1);
                    out.push_str(": ");
                    v.write(out, indent + 1);
                    out.push_str(if i + 1 < fields.len() { ",\n" } else { "\n" });
                }
                out.push_str(&"  ".repeat(indent));
                out.push('}');
            }
        }
    }
}

fn num(x: f64) -> Json {
    Json::Num(x)
}
fn s(x: impl Into<String>) -> Json {
    Json::Str(x.into())
}
fn obj(fields: Vec<(&str, Json)>) -> Json {
    Json::Obj(
        fields
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    )
}

/// A goal and whether this run met it.
struct Goal {
    goal: String,
    measured: String,
    met: bool,
}

struct Machine {
    cpus: usize,
    cpu_model: String,
    date: String,
    server_version: String,
    module: String,
    port: u16,
    started_here: bool,
    /// `git describe` of the working tree the module was built from.
    source: String,
    /// `/proc/loadavg` (1-minute) before and after the run: other work on the machine.
    load_before: String,
    load_after: String,
}

struct Report<'a> {
    cfg: &'a Config,
    machine: Machine,
    total_secs: f64,
    tput: Vec<TputMode>,
    tax: Option<Tax>,
    cont: Vec<Contention>,
    exp: Expiry,
    mem: Memory,
    scale: Vec<Scale>,
}

/// A compact number: 3 significant figures, thousands separated for large ones.
fn f(x: f64) -> String {
    if !x.is_finite() {
        return "-".into();
    }
    let a = x.abs();
    if a >= 1000.0 {
        let n = x.round() as i64;
        let digits = n.abs().to_string();
        let mut out = String::new();
        for (i, ch) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(ch);
        }
        if n < 0 {
            out.insert(0, '-');
        }
        out
    } else if a >= 100.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

fn ratio(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2}x")
    } else {
        "-".into()
    }
}

fn verdict(met: bool) -> &'static str {
    if met {
        "**met**"
    } else {
        "**missed**"
    }
}

impl Report<'_> {
    fn find(&self, strategy: Strategy, workers: usize) -> Option<&Contention> {
        self.cont
            .iter()
            .find(|c| c.strategy == strategy && c.workers == workers)
    }

    fn goals(&self) -> Vec<Goal> {
        let mut g = Vec::new();
        for m in &self.tput {
            let d = m.depth;
            let r = m.acquire.ratio(&m.set_nx);
            g.push(Goal {
                goal: format!("-P {d}: LOCK.ACQUIRE >= 0.9x SET NX PX throughput"),
                measured: format!(
                    "{} ({} vs {} ops/s)",
                    ratio(r),
                    f(m.acquire.rate()),
                    f(m.set_nx.rate())
                ),
                met: r >= 0.9,
            });
            let r = m.release.ratio(&m.evalsha);
            g.push(Goal {
                goal: format!("-P {d}: LOCK.RELEASE >= 1.3x EVALSHA throughput"),
                measured: format!(
                    "{} ({} vs {} ops/s)",
                    ratio(r),
                    f(m.release.rate()),
                    f(m.evalsha.rate())
                ),
                met: r >= 1.3,
            });
            let r = m.cycle_eval.cpu_us() / m.cycle_lock.cpu_us();
            g.push(Goal {
                goal: format!(
                    "-P {d}: full cycle >= 2x cheaper in server CPU than SET NX PX + EVALSHA"
                ),
                measured: format!(
                    "{} ({} vs {} us/cycle)",
                    ratio(r),
                    f(m.cycle_lock.cpu_us()),
                    f(m.cycle_eval.cpu_us())
                ),
                met: r >= 2.0,
            });
            let r = m.cycle_lock.cpu_us() / m.cycle_del.cpu_us();
            g.push(Goal {
                goal: format!(
                    "-P {d}: full cycle within 25% of the SET NX PX + DEL floor (server CPU)"
                ),
                measured: format!(
                    "{} the floor ({} vs {} us/cycle)",
                    ratio(r),
                    f(m.cycle_lock.cpu_us()),
                    f(m.cycle_del.cpu_us())
                ),
                met: r <= 1.25,
            });
        }
        for workers in [8, 32] {
            let (Some(lock), Some(blpop), Some(r10)) = (
                self.find(Strategy::Block, workers),
                self.find(Strategy::Blpop, workers),
                self.find(Strategy::Retry10, workers),
            ) else {
                continue;
            };
            let vs_blpop = lock.handoffs_per_s() / blpop.handoffs_per_s();
            g.push(Goal {
                goal: format!("{workers} workers: handoffs/s >= 0.95x BLPOP token passing"),
                measured: format!(
                    "{} ({} vs {} /s)",
                    ratio(vs_blpop),
                    f(lock.handoffs_per_s()),
                    f(blpop.handoffs_per_s())
                ),
                met: vs_blpop >= 0.95,
            });
            let vs_r10 = lock.handoffs_per_s() / r10.handoffs_per_s();
            g.push(Goal {
                goal: format!("{workers} workers: handoffs/s >= 5x retry every 10 ms"),
                measured: format!(
                    "{} ({} vs {} /s)",
                    ratio(vs_r10),
                    f(lock.handoffs_per_s()),
                    f(r10.handoffs_per_s())
                ),
                met: vs_r10 >= 5.0,
            });
            let min = *lock.per_worker.iter().min().unwrap_or(&0) as f64;
            let max = *lock.per_worker.iter().max().unwrap_or(&0) as f64;
            g.push(Goal {
                goal: format!("{workers} workers: acquisitions per worker within 5% of each other"),
                measured: format!(
                    "min {} / max {} ({:.1}% apart)",
                    min,
                    max,
                    (max - min) / max * 100.0
                ),
                met: min >= 0.95 * max,
            });
            let per = lock.acquire_cmds as f64 / lock.acquisitions() as f64;
            g.push(Goal {
                goal: format!("{workers} workers: exactly one acquire command per acquisition"),
                measured: format!(
                    "{} acquire commands for {} acquisitions ({per:.3})",
                    lock.acquire_cmds,
                    lock.acquisitions()
                ),
                met: lock.acquire_cmds == lock.acquisitions(),
            });
        }
        let p99 = pct(&sorted(self.exp.lock.clone()), 99.0);
        g.push(Goal {
            goal: "expiry handoff p99 < 5 ms".into(),
            measured: format!("p99 {} ms", f(p99)),
            met: p99 < 5.0,
        });
        let mem = self.mem.lock_bytes / self.mem.string_bytes;
        g.push(Goal {
            goal: "held lock <= 1.5x the memory of a SET string lock".into(),
            measured: format!(
                "{} ({} vs {} bytes)",
                ratio(mem),
                f(self.mem.lock_bytes),
                f(self.mem.string_bytes)
            ),
            met: mem <= 1.5,
        });
        if let Some(sc) = self.scale.iter().find(|s| s.what == "LOCK.ACQUIRE") {
            let stall = sc.ping_expiry.last().copied().unwrap_or(f64::NAN);
            g.push(Goal {
                goal: format!(
                    "{} expiring locks never stall the server > 10 ms",
                    f(sc.locks as f64)
                ),
                measured: format!("longest PING while they expired: {} ms", f(stall)),
                met: stall <= 10.0 && sc.left == 0,
            });
        }
        g
    }

    fn markdown(&self) -> String {
        let mut o = String::new();
        let m = &self.machine;
        let _ = writeln!(o, "# Benchmarks\n");
        let _ = writeln!(
            o,
            "redis-lock against the classic client-side pattern (`SET key owner NX PX ttl`, an \
             owner-checked Lua release, retry loops), **both measured in the same run on the same \
             server**, contenders alternating so that the machine's drift hits both. Only the \
             ratios mean anything across machines and runs. Written by `benches/lockbench.rs`; \
             do not edit by hand.\n"
        );
        let _ = writeln!(o, "| | |\n|---|---|");
        let _ = writeln!(o, "| command | `{}` |", self.cfg.command);
        let _ = writeln!(
            o,
            "| run | {}{} s in all |",
            if self.cfg.quick {
                "QUICK smoke run (small counts; not the figures to quote), "
            } else {
                "full run, "
            },
            f(self.total_secs)
        );
        let _ = writeln!(o, "| date | {} |", m.date);
        let _ = writeln!(
            o,
            "| server | Redis {} on 127.0.0.1:{}, {}; module {} |",
            m.server_version,
            m.port,
            if m.started_here {
                "started by the benchmark (`--save \"\" --appendonly no`, defaults otherwise)"
            } else {
                "the `REDIS_URL` server"
            },
            m.module
        );
        let _ = writeln!(
            o,
            "| machine | {} cores (`nproc`), {} |",
            m.cpus, m.cpu_model
        );
        let _ = writeln!(
            o,
            "| clients | on the same machine, sharing its {} cores with the server |",
            m.cpus
        );
        let _ = writeln!(
            o,
            "| module source | {} |\n| load average (1 min) | {} before, {} after the run (anything above ~0 is other work sharing the cores) |\n",
            m.source, m.load_before, m.load_after
        );

        let _ = writeln!(o, "## Goals\n");
        let _ = writeln!(o, "| goal | measured | verdict |\n|---|---|---|");
        for g in self.goals() {
            let _ = writeln!(o, "| {} | {} | {} |", g.goal, g.measured, verdict(g.met));
        }
        let _ = writeln!(
            o,
            "\nThe `-P 16` rows show the commands' own cost (the server reads 16 commands per \
             socket read). At `-P 1` the socket work per command, the same for every contender, \
             dominates the server's CPU, so ratios there sit closer to 1 (see section 1).\n"
        );

        // 1. Throughput
        let _ = writeln!(o, "## 1. Uncontended throughput\n");
        let _ = writeln!(
            o,
            "{CONNS} connections driven by the benchmark's own load generator ({DRIVER_THREADS} \
             threads, raw RESP, every reply checked), 16 commands in flight per connection \
             (`-P 16`) or one. Fairness: every `LOCK.ACQUIRE` and every `SET NX PX` goes to a \
             fresh key (`t<round><side>:<conn>:<i>`, same length on both sides) with the same \
             36-byte owner and a {} s ttl, so each one succeeds and does the full work of a grant; \
             then `LOCK.RELEASE` and the `EVALSHA` release script are run on exactly the keys just \
             taken, so each one finds its owner and deletes. Cycles take and release distinct keys, \
             the release right behind the acquire on the same connection. `FLUSHALL` and \
             `CONFIG RESETSTAT` before each run; {} rounds, the order of the sides flipping each \
             round. ops/s is the median over rounds and the ratio the median of the per-round \
             ratios; server CPU is the `INFO cpu` (user + sys) delta over all rounds divided by the \
             operations, and `usec/op` the `INFO commandstats` time of the top-level commands \
             (for `EVALSHA` it includes the script's `GET` and `DEL`).\n",
            LONG_TTL_MS / 1000,
            self.tput.first().map_or(0, |m| m.acquire.ops.len())
        );
        let _ = writeln!(
            o,
            "*Server busy* is the server's CPU time over the wall time (100%: one core saturated, \
             so the throughput is the server's own). At `-P 1` most of the server's CPU goes to \
             reading and writing the sockets once per command, the same for every command, so the \
             throughput ratios shrink toward 1 and CPU per operation also depends on how many \
             clients each event-loop turn finds ready; `commandstats usec/op` is the command's own \
             cost there.\n"
        );
        for mode in &self.tput {
            let _ = writeln!(o, "### -P {}\n", mode.depth);
            let _ = writeln!(
                o,
                "| command | ops/s | ratio | server busy | server CPU us/op | commandstats usec/op | refused |\n|---|---|---|---|---|---|---|"
            );
            for (a, b) in [
                (&mode.acquire, &mode.set_nx),
                (&mode.release, &mode.evalsha),
            ] {
                for (t, r) in [(a, a.ratio(b)), (b, 1.0)] {
                    let _ = writeln!(
                        o,
                        "| `{}` | {} | {} | {:.0}% | {} | {} | {} |",
                        t.name,
                        f(t.rate()),
                        ratio(r),
                        t.busy() * 100.0,
                        f(t.cpu_us()),
                        f(t.cmd_us()),
                        t.refused
                    );
                }
            }
            let _ = writeln!(o);
            let _ = writeln!(
                o,
                "| full cycle (distinct keys) | cycles/s | throughput ratio to lock | server busy | server CPU us/cycle | CPU ratio to lock | commandstats usec/cycle |\n|---|---|---|---|---|---|---|"
            );
            for t in [&mode.cycle_lock, &mode.cycle_eval, &mode.cycle_del] {
                let _ = writeln!(
                    o,
                    "| `{}` | {} | {} | {:.0}% | {} | {} | {} |",
                    t.name,
                    f(t.rate()),
                    ratio(t.ratio(&mode.cycle_lock)),
                    t.busy() * 100.0,
                    f(t.cpu_us()),
                    ratio(t.cpu_us() / mode.cycle_lock.cpu_us()),
                    f(t.cmd_us())
                );
            }
            let _ = writeln!(o);
            if !mode.rb_acquire.ops.is_empty() && !mode.rb_set.ops.is_empty() {
                let _ = writeln!(
                    o,
                    "Cross-check with `redis-benchmark -c {CONNS} -P {} -r 100000000` on random keys \
                     (`rb:__rand_int__`): `LOCK.ACQUIRE` {} ops/s ({} us CPU/op), `SET NX PX` {} \
                     ops/s ({} us CPU/op), ratio {}.\n",
                    mode.depth,
                    f(mode.rb_acquire.rate()),
                    f(mode.rb_acquire.cpu_us()),
                    f(mode.rb_set.rate()),
                    f(mode.rb_set.cpu_us()),
                    ratio(mode.rb_acquire.ratio(&mode.rb_set))
                );
            }
        }

        if let Some(tax) = &self.tax {
            let _ = writeln!(o, "### What loading the module costs other writes\n");
            let _ = writeln!(
                o,
                "The tables above run the classic pattern on the server that has the module \
                 loaded, as the issue asks. The module watches lock keys through its data \
                 type's unlink callback and subscribes to no keyspace events, so writes to other \
                 keys should cost what they cost without it. To check, the same `-P 16` load \
                 runs on a second `redis-server` without the module, started by the benchmark \
                 the same way, alternating with the module's server in each round.\n"
            );
            let _ = writeln!(
                o,
                "| command | ops/s | server CPU us/op | commandstats usec/op |\n|---|---|---|---|"
            );
            for t in [
                &tax.acquire,
                &tax.set_module,
                &tax.set_plain,
                &tax.incr_module,
                &tax.incr_plain,
            ] {
                let _ = writeln!(
                    o,
                    "| `{}` | {} | {} | {} |",
                    t.name,
                    f(t.rate()),
                    f(t.cpu_us()),
                    f(t.cmd_us())
                );
            }
            let _ = writeln!(
                o,
                "\nLoading the module adds {} us of commandstats time to each `SET NX PX` ({} -> {}) \
                 and {} us to each `INCR` ({} -> {}). `LOCK.ACQUIRE` against `SET NX PX` on the \
                 server without the module: {} throughput, {} the server CPU per operation.\n",
                f(tax.set_module.cmd_us() - tax.set_plain.cmd_us()),
                f(tax.set_plain.cmd_us()),
                f(tax.set_module.cmd_us()),
                f(tax.incr_module.cmd_us() - tax.incr_plain.cmd_us()),
                f(tax.incr_plain.cmd_us()),
                f(tax.incr_module.cmd_us()),
                ratio(tax.acquire.ratio(&tax.set_plain)),
                ratio(tax.acquire.cpu_us() / tax.set_plain.cpu_us())
            );
        }

        // 2. Contention
        let _ = writeln!(o, "## 2. Contention on one key\n");
        let secs = self.cont.first().map_or(0.0, |c| c.secs);
        let _ = writeln!(
            o,
            "Worker threads, one connection each, all after one key; each holds the lock for 1 ms \
             (a `sleep` of 1 ms) and asks again at once. About {:.0} s per contender (two halves, \
             the contenders' order reversed in the second). *Wait* runs from the moment a worker \
             wants the lock to the reply that grants it. *Real handoffs* count grants whose holder \
             differs from the previous holder (a releaser that wins its own lock again is not a \
             handoff); per second of the whole run. *Commands per acquisition* counts every \
             command the clients sent (acquire attempts and releases), with the acquire attempts \
             alone in brackets. Polling strategies: `SET key owner NX PX 10000`, released with the \
             `EVALSHA` script; on failure sleep 10 ms, 1 ms, or (exponential backoff with equal \
             jitter) `d/2 + rand(0..d/2)` with `d = min(100 ms, 1 ms * 2^failures)`, reset after \
             each acquisition. `LOCK.ACQUIRE key owner 10000 BLOCK 30000` / `LOCK.RELEASE`. Token \
             passing: a list holds one token; `BLPOP list 30` acquires, `LPUSH` releases. A worker \
             starts no attempt after the run's time is up but finishes the one in progress (a \
             starved poller gives up {} s later: that wait is counted in *max* only, marked >=).\n",
            secs,
            if self.cfg.quick { 10 } else { 30 }
        );
        let _ = writeln!(
            o,
            "| workers | strategy | real handoffs/s | acquisitions/s | wait p50 ms | wait p99 ms | wait max ms | acquisitions per worker min / max | commands per acquisition (acquire) | server CPU us/acquisition |\n|---|---|---|---|---|---|---|---|---|---|"
        );
        for c in &self.cont {
            let w = sorted(c.waits.clone());
            let unfinished = c.unfinished.iter().copied().fold(0.0, f64::max);
            let max = if unfinished > pct(&w, 100.0) {
                format!(">= {}", f(unfinished))
            } else {
                f(pct(&w, 100.0))
            };
            let acq = c.acquisitions() as f64;
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {} | {} / {} | {} ({}) | {} |",
                c.workers,
                c.strategy.label(),
                f(c.handoffs_per_s()),
                f(acq / c.secs),
                f(pct(&w, 50.0)),
                f(pct(&w, 99.0)),
                max,
                c.per_worker.iter().min().unwrap_or(&0),
                c.per_worker.iter().max().unwrap_or(&0),
                f(c.cmds as f64 / acq),
                f(c.acquire_cmds as f64 / acq),
                f(c.cpu * 1e6 / acq)
            );
        }
        let _ = writeln!(o, "\nRatios of `LOCK.ACQUIRE BLOCK` real handoffs/s:\n");
        let _ = writeln!(o, "| workers | vs BLPOP token | vs retry 10 ms | vs retry 1 ms | vs backoff |\n|---|---|---|---|---|");
        for workers in [2, 8, 32] {
            let Some(lock) = self.find(Strategy::Block, workers) else {
                continue;
            };
            let r = |s: Strategy| {
                self.find(s, workers).map_or("-".into(), |c| {
                    ratio(lock.handoffs_per_s() / c.handoffs_per_s())
                })
            };
            let _ = writeln!(
                o,
                "| {workers} | {} | {} | {} | {} |",
                r(Strategy::Blpop),
                r(Strategy::Retry10),
                r(Strategy::Retry1),
                r(Strategy::Backoff)
            );
        }
        let _ = writeln!(
            o,
            "\n![Wait-time distribution per strategy, 8 and 32 workers](bench/waits.svg)\n"
        );

        // 3. Expiry
        let e = &self.exp;
        let lock = sorted(e.lock.clone());
        let server = sorted(e.lock_server.clone());
        let poll = sorted(e.poll.clone());
        let _ = writeln!(o, "## 3. Expiry handoff\n");
        let _ = writeln!(
            o,
            "A holder takes the key with a {} ms ttl and never releases it; a waiter is already \
             queued with `LOCK.ACQUIRE key waiter 10000 BLOCK 5000`. The delay runs from the \
             holder's deadline on the server's clock (the grant's server millisecond, read from \
             its fencing token, + ttl; `PEXPIRETIME` when the token was not the first of its \
             millisecond) to the moment the waiter's client has the reply (the same machine's \
             clock), so it includes the reply's trip. The server-side figure is the waiter's \
             token's millisecond minus the deadline (whole ms). Against it: a poller that sends \
             `SET key poller NX PX 10000` every 10 ms (starting at a random phase) on a key the \
             holder took with `SET NX PX {}`; its delay runs from the `PEXPIRETIME` deadline to \
             its `OK`. {} handoffs each, alternating.\n",
            e.ttl_ms,
            e.ttl_ms,
            e.lock.len()
        );
        let _ = writeln!(
            o,
            "| waiter | p50 ms | p99 ms | max ms |\n|---|---|---|---|"
        );
        for (name, v) in [
            ("`LOCK.ACQUIRE ... BLOCK` (client-observed)", &lock),
            ("`LOCK.ACQUIRE ... BLOCK` (server clock, whole ms)", &server),
            ("`SET NX PX` every 10 ms", &poll),
        ] {
            let _ = writeln!(
                o,
                "| {name} | {} | {} | {} |",
                f(pct(v, 50.0)),
                f(pct(v, 99.0)),
                f(pct(v, 100.0))
            );
        }
        o.push('\n');

        // 4. Memory
        let mm = &self.mem;
        let _ = writeln!(o, "## 4. Memory\n");
        let _ = writeln!(
            o,
            "`INFO memory` `used_memory` before and after taking {} locks (keys like `{}`, \
             {}-byte owners, {} s ttl, so each key also has an expiry), divided by the count; then \
             the same with `SET key owner NX PX ttl`. `MEMORY USAGE` of one key for comparison \
             (the module reports its own value's size).\n",
            f(mm.locks as f64),
            mm.key_example,
            mm.owner_len,
            LONG_TTL_MS / 1000
        );
        let _ = writeln!(
            o,
            "| lock kind | bytes per lock (used_memory) | MEMORY USAGE of one key |\n|---|---|---|"
        );
        let _ = writeln!(
            o,
            "| `LOCK.ACQUIRE` (type `redislock`) | {} | {} |",
            f(mm.lock_bytes),
            mm.lock_usage
        );
        let _ = writeln!(
            o,
            "| `SET NX PX` string | {} | {} |",
            f(mm.string_bytes),
            mm.string_usage
        );
        let _ = writeln!(
            o,
            "| ratio | {} | |\n",
            ratio(mm.lock_bytes / mm.string_bytes)
        );
        let _ = writeln!(
            o,
            "Waiters: {} connections, each first sends `PING` (so that it has a query buffer, as a \
             blocked client does), then `used_memory` is read; then each sends a blocking command \
             on one key, and once `blocked_clients` shows all of them `used_memory` is read again \
             (both within about a second, before the server trims idle query buffers).\n",
            mm.waiters
        );
        let _ = writeln!(o, "| waiter | bytes per waiter |\n|---|---|");
        let _ = writeln!(
            o,
            "| `LOCK.ACQUIRE key owner 10000 BLOCK 0` (36-byte owner) | {} |",
            f(mm.lock_waiter_bytes)
        );
        let _ = writeln!(
            o,
            "| `BLPOP key 0` (reference) | {} |\n",
            f(mm.blpop_waiter_bytes)
        );
        let _ = writeln!(
            o,
            "Most of a blocked `LOCK.ACQUIRE`'s size is Redis's, not the module's queue entry: \
             `RedisModule_BlockClient` gives every blocked client a reply client of its own \
             (`createClient(NULL)`, with a 16 KB reply buffer), which `BLPOP` does not need. \
             At `lock.max-waiters` (10000 per key by default) that is about {} MB for one full \
             queue.\n",
            f(mm.lock_waiter_bytes * 10_000.0 / 1e6)
        );

        // 5. Scale
        let _ = writeln!(o, "## 5. Many expiring locks\n");
        let _ = writeln!(
            o,
            "Take N locks on distinct keys with a short ttl through the load generator ({CONNS} \
             connections, 16 in flight), while another connection sends `PING` back to back and \
             times each one; keep sampling until `DBSIZE` is 0. The longest `PING` is the longest \
             time the server did not answer (a stall). The `SET NX PX` row is the same with string \
             keys, for Redis's own expiry as a reference. While the locks are being taken the \
             `PING`s queue behind the load's pipelines (and share the CPU with the load \
             generator), so only the expiry phase tells about stalls.\n"
        );
        let _ = writeln!(
            o,
            "| locks | hz | ttl ms | taken in s | locks/s | all gone after the last was taken, s | PING p99 / max while taking, ms | PING p50 / p99 / max while expiring, ms | PINGs > 10 ms while expiring |\n|---|---|---|---|---|---|---|---|---|"
        );
        for sc in &self.scale {
            let slow = sc.ping_expiry.iter().filter(|x| **x > 10.0).count();
            let _ = writeln!(
                o,
                "| {} x `{}` | {} | {} | {} | {} | {}{} | {} / {} | {} / {} / {} | {} of {} |",
                f(sc.locks as f64),
                sc.what.split(" at hz").next().unwrap_or(""),
                sc.hz,
                sc.ttl_ms,
                f(sc.take_secs),
                f(sc.locks as f64 / sc.take_secs),
                f(sc.drain_secs),
                if sc.left > 0 {
                    format!(" ({} keys left at the time limit)", sc.left)
                } else {
                    String::new()
                },
                f(pct(&sc.ping_load, 99.0)),
                f(pct(&sc.ping_load, 100.0)),
                f(pct(&sc.ping_expiry, 50.0)),
                f(pct(&sc.ping_expiry, 99.0)),
                f(pct(&sc.ping_expiry, 100.0)),
                slow,
                sc.ping_expiry.len()
            );
        }
        o.push('\n');
        let row = |what: &str| self.scale.iter().find(|s| s.what == what);
        if let (Some(lock), Some(string)) = (row("LOCK.ACQUIRE"), row("SET NX PX")) {
            let _ = writeln!(
                o,
                "At the default `hz` ({}), Redis's active expiry runs up to 25% of each 1/hz tick \
                 (25 ms at hz 10) when many keys are due: the longest `PING` was {} ms for the \
                 locks and {} ms for plain strings{}.\n",
                lock.hz,
                f(pct(&lock.ping_expiry, 100.0)),
                f(pct(&string.ping_expiry, 100.0)),
                self.scale
                    .iter()
                    .find(|s| s.what.starts_with("LOCK.ACQUIRE at hz"))
                    .map_or(String::new(), |h| format!(
                        "; with `CONFIG SET hz {}` it was {} ms for the locks",
                        h.hz,
                        f(pct(&h.ping_expiry, 100.0))
                    ))
            );
        }
        o
    }

    fn json(&self) -> String {
        let m = &self.machine;
        let tput = |t: &Tput| {
            obj(vec![
                ("name", s(&t.name)),
                ("ops_per_s_median", num(t.rate())),
                (
                    "ops_per_s_rounds",
                    Json::Arr(t.rates().into_iter().map(num).collect()),
                ),
                ("server_cpu_us_per_op", num(t.cpu_us())),
                ("commandstats_usec_per_op", num(t.cmd_us())),
                ("refused", num(t.refused as f64)),
            ])
        };
        let modes = self
            .tput
            .iter()
            .map(|md| {
                obj(vec![
                    ("pipeline", num(md.depth as f64)),
                    ("acquire", tput(&md.acquire)),
                    ("set_nx_px", tput(&md.set_nx)),
                    ("acquire_ratio", num(md.acquire.ratio(&md.set_nx))),
                    ("release", tput(&md.release)),
                    ("evalsha_release", tput(&md.evalsha)),
                    ("release_ratio", num(md.release.ratio(&md.evalsha))),
                    ("cycle_lock", tput(&md.cycle_lock)),
                    ("cycle_set_evalsha", tput(&md.cycle_eval)),
                    ("cycle_set_del", tput(&md.cycle_del)),
                    (
                        "cycle_cpu_ratio_evalsha_to_lock",
                        num(md.cycle_eval.cpu_us() / md.cycle_lock.cpu_us()),
                    ),
                    (
                        "cycle_cpu_ratio_lock_to_floor",
                        num(md.cycle_lock.cpu_us() / md.cycle_del.cpu_us()),
                    ),
                    ("redis_benchmark_acquire", tput(&md.rb_acquire)),
                    ("redis_benchmark_set_nx_px", tput(&md.rb_set)),
                ])
            })
            .collect();
        let cont = self
            .cont
            .iter()
            .map(|c| {
                let w = sorted(c.waits.clone());
                let acq = c.acquisitions() as f64;
                obj(vec![
                    ("workers", num(c.workers as f64)),
                    ("strategy", s(c.strategy.id())),
                    ("label", s(c.strategy.label())),
                    ("seconds", num(c.secs)),
                    ("acquisitions", num(acq)),
                    ("real_handoffs", num(c.handoffs as f64)),
                    ("real_handoffs_per_s", num(c.handoffs_per_s())),
                    ("wait_ms_p50", num(pct(&w, 50.0))),
                    ("wait_ms_p99", num(pct(&w, 99.0))),
                    ("wait_ms_max", num(c.max_wait())),
                    (
                        "unfinished_waits_ms",
                        Json::Arr(c.unfinished.iter().copied().map(num).collect()),
                    ),
                    (
                        "acquisitions_per_worker",
                        Json::Arr(c.per_worker.iter().map(|x| num(*x as f64)).collect()),
                    ),
                    ("commands_per_acquisition", num(c.cmds as f64 / acq)),
                    (
                        "acquire_commands_per_acquisition",
                        num(c.acquire_cmds as f64 / acq),
                    ),
                    ("server_cpu_us_per_acquisition", num(c.cpu * 1e6 / acq)),
                ])
            })
            .collect();
        let dist = |v: &[f64]| {
            let v = sorted(v.to_vec());
            obj(vec![
                ("p50", num(pct(&v, 50.0))),
                ("p99", num(pct(&v, 99.0))),
                ("max", num(pct(&v, 100.0))),
                ("samples", Json::Arr(v.iter().copied().map(num).collect())),
            ])
        };
        let e = &self.exp;
        let mm = &self.mem;
        let scale = self
            .scale
            .iter()
            .map(|sc| {
                obj(vec![
                    ("command", s(&sc.what)),
                    ("hz", num(sc.hz as f64)),
                    ("locks", num(sc.locks as f64)),
                    ("ttl_ms", num(sc.ttl_ms as f64)),
                    ("take_seconds", num(sc.take_secs)),
                    ("locks_per_s", num(sc.locks as f64 / sc.take_secs)),
                    ("seconds_until_all_gone_after_taking", num(sc.drain_secs)),
                    ("keys_left_at_limit", num(sc.left as f64)),
                    (
                        "ping_ms_while_taking",
                        obj(vec![
                            ("count", num(sc.ping_load.len() as f64)),
                            ("p50", num(pct(&sc.ping_load, 50.0))),
                            ("p99", num(pct(&sc.ping_load, 99.0))),
                            ("max", num(pct(&sc.ping_load, 100.0))),
                        ]),
                    ),
                    (
                        "ping_ms_while_expiring",
                        obj(vec![
                            ("count", num(sc.ping_expiry.len() as f64)),
                            ("p50", num(pct(&sc.ping_expiry, 50.0))),
                            ("p99", num(pct(&sc.ping_expiry, 99.0))),
                            ("max", num(pct(&sc.ping_expiry, 100.0))),
                            (
                                "over_10ms",
                                num(sc.ping_expiry.iter().filter(|x| **x > 10.0).count() as f64),
                            ),
                        ]),
                    ),
                ])
            })
            .collect();
        let goals = self
            .goals()
            .into_iter()
            .map(|g| {
                obj(vec![
                    ("goal", s(g.goal)),
                    ("measured", s(g.measured)),
                    ("met", Json::Bool(g.met)),
                ])
            })
            .collect();
        let root = obj(vec![
            ("command", s(&self.cfg.command)),
            ("quick", Json::Bool(self.cfg.quick)),
            ("date", s(&m.date)),
            ("total_seconds", num(self.total_secs)),
            ("server_version", s(&m.server_version)),
            ("module", s(&m.module)),
            ("server_started_by_benchmark", Json::Bool(m.started_here)),
            ("nproc", num(m.cpus as f64)),
            ("cpu_model", s(&m.cpu_model)),
            ("module_source", s(&m.source)),
            ("loadavg_before", s(&m.load_before)),
            ("loadavg_after", s(&m.load_after)),
            ("goals", Json::Arr(goals)),
            ("throughput", Json::Arr(modes)),
            (
                "module_tax",
                match &self.tax {
                    None => Json::Arr(Vec::new()),
                    Some(t) => obj(vec![
                        ("acquire_module", tput(&t.acquire)),
                        ("set_nx_px_module", tput(&t.set_module)),
                        ("set_nx_px_no_module", tput(&t.set_plain)),
                        ("incr_module", tput(&t.incr_module)),
                        ("incr_no_module", tput(&t.incr_plain)),
                    ]),
                },
            ),
            ("contention", Json::Arr(cont)),
            (
                "expiry_handoff",
                obj(vec![
                    ("ttl_ms", num(e.ttl_ms as f64)),
                    ("lock_block_client_ms", dist(&e.lock)),
                    ("lock_block_server_ms", dist(&e.lock_server)),
                    ("poll_10ms_ms", dist(&e.poll)),
                ]),
            ),
            (
                "memory",
                obj(vec![
                    ("locks", num(mm.locks as f64)),
                    ("owner_bytes", num(mm.owner_len as f64)),
                    ("lock_bytes_per_key", num(mm.lock_bytes)),
                    ("string_bytes_per_key", num(mm.string_bytes)),
                    ("ratio", num(mm.lock_bytes / mm.string_bytes)),
                    ("memory_usage_lock_key", num(mm.lock_usage as f64)),
                    ("memory_usage_string_key", num(mm.string_usage as f64)),
                    ("waiters", num(mm.waiters as f64)),
                    ("lock_waiter_bytes", num(mm.lock_waiter_bytes)),
                    ("blpop_waiter_bytes", num(mm.blpop_waiter_bytes)),
                ]),
            ),
            ("scale", Json::Arr(scale)),
        ]);
        let mut out = String::new();
        root.write(&mut out, 0);
        out.push('\n');
        out
    }

    /// Wait-time CDFs, one panel per worker count (8 and 32), one line per strategy, log x axis.
    fn svg(&self) -> String {
        const PW: f64 = 520.0; // panel width
        const PH: f64 = 330.0; // panel height (plot area)
        const ML: f64 = 70.0; // left margin
        const MT: f64 = 90.0; // top margin (title + legend)
        const GAP: f64 = 90.0;
        const MB: f64 = 84.0;
        let panels = [8usize, 32];
        let width = ML + panels.len() as f64 * PW + (panels.len() - 1) as f64 * GAP + 30.0;
        let height = MT + PH + MB;
        let all: Vec<f64> = self
            .cont
            .iter()
            .filter(|c| panels.contains(&c.workers))
            .flat_map(|c| c.waits.iter().copied())
            .collect();
        let lo_exp = -2i32; // 0.01 ms
        let max = all.iter().copied().fold(1.0, f64::max);
        let hi_exp = (max.log10().ceil() as i32).max(1);
        let xpos = |ms: f64, x0: f64| {
            let l = ms.max(10f64.powi(lo_exp)).log10();
            x0 + (l - lo_exp as f64) / (hi_exp - lo_exp) as f64 * PW
        };
        let mut o = String::new();
        let _ = writeln!(
            o,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="13">"#
        );
        let _ = writeln!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let _ = writeln!(
            o,
            r#"<text x="{:.0}" y="24" font-size="17" font-weight="bold" text-anchor="middle">Wait for one contended lock (hold 1 ms): cumulative share of acquisitions</text>"#,
            width / 2.0
        );
        // Legend.
        let mut lx = ML;
        for st in Strategy::ALL {
            let _ = writeln!(
                o,
                r#"<line x1="{lx:.0}" y1="48" x2="{:.0}" y2="48" stroke="{}" {}/><text x="{:.0}" y="52">{}</text>"#,
                lx + 28.0,
                st.color(),
                st.stroke(),
                lx + 34.0,
                st.label()
            );
            lx += 34.0 + st.label().len() as f64 * 7.6 + 26.0;
        }
        for (pi, workers) in panels.iter().enumerate() {
            let x0 = ML + pi as f64 * (PW + GAP);
            let y0 = MT;
            let _ = writeln!(
                o,
                r#"<text x="{:.0}" y="{:.0}" font-size="15" font-weight="bold" text-anchor="middle">{workers} workers</text>"#,
                x0 + PW / 2.0,
                y0 - 10.0
            );
            let _ = writeln!(
                o,
                r##"<rect x="{x0:.0}" y="{y0:.0}" width="{PW:.0}" height="{PH:.0}" fill="none" stroke="#444"/>"##
            );
            for e in lo_exp..=hi_exp {
                let x = xpos(10f64.powi(e), x0);
                let label = match e {
                    e if e < 0 => format!("{}", 10f64.powi(e)),
                    e => format!("{}", 10i64.pow(e as u32)),
                };
                let _ = writeln!(
                    o,
                    r##"<line x1="{x:.1}" y1="{y0:.0}" x2="{x:.1}" y2="{:.0}" stroke="#ddd"/><text x="{x:.1}" y="{:.0}" text-anchor="middle">{label}</text>"##,
                    y0 + PH,
                    y0 + PH + 18.0
                );
            }
            for q in [0.0, 0.25, 0.5, 0.75, 1.0] {
                let y = y0 + PH - q * PH;
                let _ = writeln!(
                    o,
                    r##"<line x1="{x0:.0}" y1="{y:.1}" x2="{:.0}" y2="{y:.1}" stroke="#ddd"/><text x="{:.0}" y="{:.1}" text-anchor="end">{q}</text>"##,
                    x0 + PW,
                    x0 - 6.0,
                    y + 4.0,
                );
            }
            let y99 = y0 + PH - 0.99 * PH;
            let _ = writeln!(
                o,
                r##"<line x1="{x0:.0}" y1="{y99:.1}" x2="{:.0}" y2="{y99:.1}" stroke="#999" stroke-dasharray="4 3"/><text x="{:.0}" y="{:.1}" text-anchor="end" font-size="11" fill="#666">p99</text>"##,
                x0 + PW,
                x0 + PW - 4.0,
                y99 + 13.0,
            );
            let _ = writeln!(
                o,
                r#"<text x="{:.0}" y="{:.0}" text-anchor="middle">wait until granted, ms (log scale)</text>"#,
                x0 + PW / 2.0,
                y0 + PH + 40.0
            );
            let _ = writeln!(
                o,
                r#"<text transform="translate({:.0},{:.0}) rotate(-90)" text-anchor="middle">share of acquisitions waiting at most x</text>"#,
                x0 - 46.0,
                y0 + PH / 2.0
            );
            // The lock's thick line goes under the dashed BLPOP line, which it mostly covers.
            for st in [
                Strategy::Backoff,
                Strategy::Retry1,
                Strategy::Retry10,
                Strategy::Block,
                Strategy::Blpop,
            ] {
                let Some(c) = self.find(st, *workers) else {
                    continue;
                };
                let w = sorted(c.waits.clone());
                if w.is_empty() {
                    continue;
                }
                let n = w.len();
                let steps = 400.min(n);
                let mut pts = String::new();
                let mut prev_y = y0 + PH;
                for k in 0..=steps {
                    let idx = ((k as f64 / steps as f64) * (n - 1) as f64).round() as usize;
                    let x = xpos(w[idx], x0);
                    let y = y0 + PH - ((idx + 1) as f64 / n as f64) * PH;
                    if k == 0 {
                        let _ = write!(pts, "{x:.1},{prev_y:.1} ");
                    }
                    let _ = write!(pts, "{x:.1},{prev_y:.1} {x:.1},{y:.1} ");
                    prev_y = y;
                }
                let _ = writeln!(
                    o,
                    r#"<polyline fill="none" stroke="{}" {} stroke-linejoin="round" points="{}"/>"#,
                    st.color(),
                    st.stroke(),
                    pts.trim_end()
                );
            }
        }
        let _ = writeln!(
            o,
            r##"<text x="{ML:.0}" y="{:.0}" font-size="12" fill="#555">Every acquisition of the whole run. The pollers' many near-zero waits are mostly a releasing worker taking its own lock again (not a handoff);</text>
<text x="{ML:.0}" y="{:.0}" font-size="12" fill="#555">a wait still going when a run ended (a starved poller) is not in the lines. Real handoffs per second and the rest: BENCHMARKS.md.</text>"##,
            height - 26.0,
            height - 10.0
        );
        o.push_str("</svg>\n");
        o
    }
}

// ---------------------------------------------------------------------------------------------
// Machine facts
// ---------------------------------------------------------------------------------------------

/// `YYYY-MM-DD HH:MM UTC` from the system clock (civil-from-days, no date crate).
fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock before 1970")
        .as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60
    )
}

/// The 1-minute load average.
fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|t| t.split_whitespace().next().map(String::from))
        .unwrap_or_else(|| "?".into())
}

/// `git describe --always --dirty` of the crate, e.g. `1582b0e-dirty`.
fn git_describe() -> String {
    Command::new("git")
        .args([
            "-C",
            env!("CARGO_MANIFEST_DIR"),
            "describe",
            "--always",
            "--dirty",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| format!("commit `{}`", String::from_utf8_lossy(&o.stdout).trim()))
        .unwrap_or_else(|| "unknown (no git)".into())
}

fn cpu_model() -> String {
    fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

// ---------------------------------------------------------------------------------------------
// main
// ---------------------------------------------------------------------------------------------

fn main() {
    if let Err(e) = run() {
        eprintln!("lockbench: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let started = Instant::now();
    let load_before = loadavg();
    let cfg = Config::from_env()?;
    let sizes = Sizes::new(cfg.quick);
    let srv = Server::start(&cfg)?;
    let mut ctl = srv.connect();
    let version = info(&mut ctl, "server")
        .remove("redis_version")
        .unwrap_or_else(|| "?".into());
    let module = format!(
        "{:?}",
        redis::cmd("MODULE")
            .arg("LIST")
            .query::<redis::Value>(&mut ctl)
            .map_err(|e| e.to_string())?
    );
    let module_ver = module
        .split("\"ver\"")
        .nth(1)
        .and_then(|r| {
            r.split(|c: char| !c.is_ascii_digit())
                .find(|p| !p.is_empty())
        })
        .map_or("lock".to_string(), |v| format!("`lock` v{v}"));
    eprintln!(
        "lockbench: Redis {version} on 127.0.0.1:{}{}",
        srv.port,
        if cfg.quick { " (QUICK)" } else { "" }
    );
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(RELEASE_SCRIPT)
        .query(&mut ctl)
        .map_err(|e| format!("SCRIPT LOAD: {e}"))?;

    let tput = throughput(&srv, &mut ctl, &sizes, &cfg, &sha);
    let tax = module_tax(&cfg, &srv, &mut ctl, &sizes);
    let cont = contention(&srv, &mut ctl, &sizes, cfg.quick, &sha);
    let exp = expiry(&srv, &mut ctl, &sizes);
    let mem = memory(&srv, &mut ctl, &sizes);
    let mut scales = Vec::new();
    for (lock, hz) in [(true, None), (false, None), (true, Some(100))] {
        scales.push(scale_at_hz(&srv, &mut ctl, &sizes, lock, hz));
    }
    flushall(&mut ctl);

    let report = Report {
        cfg: &cfg,
        machine: Machine {
            cpus: thread::available_parallelism().map_or(0, |n| n.get()),
            cpu_model: cpu_model(),
            date: utc_now(),
            server_version: version,
            module: module_ver,
            port: srv.port,
            started_here: cfg.existing_port.is_none(),
            source: git_describe(),
            load_before,
            load_after: loadavg(),
        },
        total_secs: started.elapsed().as_secs_f64(),
        tput,
        tax,
        cont,
        exp,
        mem,
        scale: scales,
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    fs::create_dir_all(root.join("bench")).map_err(|e| e.to_string())?;
    let md = report.markdown();
    fs::write(root.join("BENCHMARKS.md"), &md).map_err(|e| e.to_string())?;
    fs::write(root.join("bench/results.json"), report.json()).map_err(|e| e.to_string())?;
    fs::write(root.join("bench/waits.svg"), report.svg()).map_err(|e| e.to_string())?;
    eprintln!("\n{}", md.split("## 1.").next().unwrap_or(""));
    eprintln!(
        "lockbench: wrote BENCHMARKS.md, bench/results.json, bench/waits.svg in {:.0} s",
        report.total_secs
    );
    Ok(())
}
