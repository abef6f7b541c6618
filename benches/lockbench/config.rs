//! What the environment asks for: the server(s), the module, full run or `QUICK=1`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The owner-checked release script of the classic pattern.
pub const RELEASE_SCRIPT: &str =
    "if redis.call(\"GET\", KEYS[1]) == ARGV[1] then return redis.call(\"DEL\", KEYS[1]) else return 0 end";
/// Connections of the throughput scenario (as `redis-benchmark -c 50`).
pub const CONNS: usize = 50;
/// Client threads of the load generator: one per core is enough, since each thread keeps
/// many connections busy and the server itself is single-threaded.
pub const DRIVER_THREADS: usize = 2;
/// A lock TTL that never runs out during a measurement (10 minutes).
pub const LONG_TTL_MS: u64 = 600_000;

pub struct Config {
    /// `QUICK=1`: the smoke run.
    pub quick: bool,
    /// The module `.so` to load into a server we start.
    pub module: PathBuf,
    /// The `redis-server` binary.
    pub server_bin: String,
    /// The `redis-benchmark` binary (used for a cross-check of the single-command throughput).
    pub benchmark_bin: String,
    /// `BENCH_SERVERS`: more servers for the headline scenarios (Redis 8.2 in `make bench`).
    pub headline_bins: Vec<String>,
    /// `BENCH_MATRIX`: more servers for the scenarios that run on the whole matrix.
    pub matrix_bins: Vec<String>,
    /// `REDIS_URL`'s port, when the run uses an existing server on 127.0.0.1.
    pub existing_port: Option<u16>,
    /// How the run was started, for the report.
    pub command: String,
    /// `ONLY=contention,peers`: the scenarios to run (by id); empty for all of them.
    pub only: Vec<String>,
    /// Where this run writes its report.
    pub out: Output,
}

/// Where a run writes. Only a full run of every scenario (`make bench`) writes the committed
/// report (`BENCHMARKS.md`, `benches/results/`); a smoke run (`QUICK=1`) or a partial one
/// (`ONLY=...`) writes under `target/bench/`, so that it never replaces the figures to quote.
pub struct Output {
    /// The Markdown report.
    pub markdown: PathBuf,
    /// The same results as JSON.
    pub json: PathBuf,
    /// The folder for charts.
    pub dir: PathBuf,
    /// `dir` as the report links it (relative to the report's folder, empty for the same one).
    pub link: String,
}

impl Output {
    fn new(quick: bool, partial: bool) -> Output {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        if !quick && !partial {
            let dir = root.join("benches/results");
            return Output {
                markdown: root.join("BENCHMARKS.md"),
                json: dir.join("results.json"),
                dir,
                link: "benches/results/".into(),
            };
        }
        let dir = root.join("target/bench");
        let (markdown, json) = if partial {
            ("only.md", "only.json")
        } else {
            ("BENCHMARKS.md", "results.json")
        };
        Output {
            markdown: dir.join(markdown),
            json: dir.join(json),
            dir,
            link: String::new(),
        }
    }

    /// How the report links a chart written to `dir`.
    pub fn link_to(&self, file: &str) -> String {
        format!("{}{file}", self.link)
    }
}

impl Config {
    pub fn from_env() -> Result<Config, String> {
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
        let only: Vec<String> = std::env::var("ONLY")
            .unwrap_or_default()
            .split(',')
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
        let mut command = String::new();
        if !only.is_empty() {
            let _ = write!(command, "ONLY={} ", only.join(","));
        }
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
            out: Output::new(quick, !only.is_empty()),
            only,
            quick,
            module,
            server_bin: std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into()),
            benchmark_bin: std::env::var("REDIS_BENCHMARK")
                .unwrap_or_else(|_| "redis-benchmark".into()),
            headline_bins: list_var("BENCH_SERVERS"),
            matrix_bins: list_var("BENCH_MATRIX"),
            existing_port,
            command,
        })
    }
}

/// A space-separated list of binaries from the environment (empty when unset).
fn list_var(name: &str) -> Vec<String> {
    std::env::var(name)
        .unwrap_or_default()
        .split_whitespace()
        .map(String::from)
        .collect()
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
pub struct Sizes {
    /// Commands per contender per round, 16 in flight per connection.
    pub tput_p16: usize,
    /// Commands per contender per round, one in flight per connection.
    pub tput_p1: usize,
    /// Rounds of the throughput scenario; the contenders' order flips every round.
    pub tput_rounds: usize,
    /// Seconds per contention round, and rounds (order flips every round).
    pub contention_secs: f64,
    pub contention_rounds: usize,
    /// Expiry handoffs measured per contender.
    pub expiry_reps: usize,
    /// Locks held for the memory measurement.
    pub memory_locks: usize,
    /// Blocked waiters for the memory measurement.
    pub waiters: usize,
    /// Locks taken in the scale scenario.
    pub scale_locks: usize,
    /// TTL of the scale scenario's locks.
    pub scale_ttl_ms: u64,
}

impl Sizes {
    pub fn new(quick: bool) -> Sizes {
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
