//! Server processes the common harness does not start: Redis Cluster nodes (which need a free
//! cluster-bus port at `port + 10000`) and Sentinels (which run from a config file they rewrite).
//!
//! Like `common::Server`, each [`Node`] runs on 127.0.0.1 on a port the OS chose, in a directory
//! of its own, with a deadline on readiness; dropping it kills the process and removes the
//! directory, unless the test is panicking: then the directory is kept and the log tail printed.
//!
//! Environment, besides `REDIS_SERVER` and `REDIS_LOCK_MODULE` (as for `common`):
//! - `REDIS_CLI`: the `redis-cli` binary (default `redis-cli` on `PATH`), for `--cluster create`.
//! - `REDIS_SENTINEL`: the Sentinel binary (default `redis-sentinel` if on `PATH`, else
//!   `$REDIS_SERVER --sentinel`, which is the same program).

// `cluster` and `sentinel` each use a different subset.
#![allow(dead_code)]

use std::fs::{self, File};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redis::{Connection, RedisResult};

/// How long a process may take to answer `PING` after it was spawned.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Read timeout on connections, so a command that is never answered fails the test instead of
/// hanging the suite. Blocking calls that may legitimately wait longer set their own.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How many OS-chosen ports to try before giving up on one process.
const PORT_ATTEMPTS: usize = 5;

/// The cluster bus listens on the client port plus this (fixed by Redis).
pub const BUS_PORT_OFFSET: u16 = 10_000;

/// What a [`Node`] listens with.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Ports {
    /// A client port only.
    Client,
    /// A client port and, at `port + 10000`, a cluster bus port.
    ClientAndBus,
}

/// A spawned server process (`redis-server` or a Sentinel) in a directory of its own.
pub struct Node {
    /// The running process; `None` after [`Node::kill9`].
    child: Option<Child>,
    /// Its client port on 127.0.0.1.
    port: u16,
    /// Its own directory (logfile, config, `nodes.conf`).
    dir: PathBuf,
    /// What the log tail printed on failure is called ("cluster node 3", "sentinel 1").
    name: String,
}

impl Node {
    /// Spawn `program` with `args(port, dir)` in `dir` (created here) on a free port, and wait
    /// until it answers `PING`. `args` gets the port and directory so that it can write them
    /// into a config file.
    pub fn spawn(
        name: &str,
        dir: PathBuf,
        ports: Ports,
        program: &str,
        args: impl Fn(u16, &Path) -> Vec<String>,
    ) -> Node {
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let mut node = Node {
            child: None,
            port: 0,
            dir,
            name: name.to_string(),
        };
        for attempt in 1..=PORT_ATTEMPTS {
            node.port = match ports {
                Ports::Client => free_port(),
                Ports::ClientAndBus => free_port_with_bus(),
            };
            let open = |file: &str| {
                File::create(node.dir.join(file))
                    .unwrap_or_else(|e| panic!("cannot create {file}: {e}"))
            };
            let (stdout, stderr) = (open("stdout"), open("stderr"));
            let child = Command::new(program)
                .args(args(node.port, &node.dir))
                .current_dir(&node.dir)
                .stdin(Stdio::null())
                .stdout(stdout)
                .stderr(stderr)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot run {program:?}: {e}"));
            node.child = Some(child);
            if node.wait_ready() {
                return node;
            }
            node.reap();
            eprintln!(
                "{name}: port {} (or its bus port) was taken (attempt {attempt}/{PORT_ATTEMPTS})",
                node.port
            );
        }
        panic!("{name}: no free port after {PORT_ATTEMPTS} attempts");
    }

    /// The client port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`, as the cluster and Sentinel name it.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// This process's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A new connection (10 s read timeout).
    pub fn conn(&self) -> Connection {
        connect(self.port)
    }

    /// True while the process has not been killed.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// SIGKILL the process and reap it.
    pub fn kill9(&mut self) {
        self.reap();
    }

    /// The log file and anything the process wrote to stdout/stderr.
    pub fn log(&self) -> String {
        let mut out = String::new();
        for name in ["logfile", "stdout", "stderr"] {
            if let Ok(text) = fs::read_to_string(self.dir.join(name)) {
                if !text.is_empty() {
                    out.push_str(&format!("--- {name} ---\n{text}"));
                }
            }
        }
        out
    }

    /// Poll until our child answers `PING`; false if it exited because a port was taken.
    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let child = self.child.as_mut().expect("wait_ready: no child");
            if let Some(status) = child.try_wait().expect("cannot poll the child") {
                let log = self.log();
                if log.contains("Address already in use") {
                    return false;
                }
                panic!(
                    "{} exited ({status}) before it was ready; dir {}; log:\n{log}",
                    self.name,
                    self.dir.display()
                );
            }
            if self.answers_ping() {
                return true;
            }
            assert!(
                Instant::now() < deadline,
                "{} on port {} not ready after {READY_TIMEOUT:?}; log:\n{}",
                self.name,
                self.port,
                self.log()
            );
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// True if the process on our port is our child (not another test's server that won the
    /// port) and answers `PING`.
    fn answers_ping(&self) -> bool {
        let Ok(mut conn) = try_connect(self.port, Duration::from_millis(200)) else {
            return false;
        };
        let pong: RedisResult<String> = redis::cmd("PING").query(&mut conn);
        if pong.as_deref() != Ok("PONG") {
            return false;
        }
        let pid = info_field(&mut conn, "server", "process_id");
        pid.is_some() && pid == self.child.as_ref().map(|c| c.id().to_string())
    }

    fn reap(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.reap();
        if thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(25).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            eprintln!(
                "{}: test failed; keeping {} (port {}); log tail:\n{}",
                self.name,
                self.dir.display(),
                self.port,
                tail.join("\n")
            );
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// A fresh directory for one test's processes: `<tmp>/redis-lock-tests/<prefix>-<uuid>`.
pub fn test_dir(prefix: &str) -> PathBuf {
    std::env::temp_dir()
        .join("redis-lock-tests")
        .join(format!("{prefix}-{}", uuid::Uuid::new_v4()))
}

/// The `redis-server` binary.
pub fn server_bin() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_string())
}

/// The `redis-cli` binary.
pub fn cli_bin() -> String {
    std::env::var("REDIS_CLI").unwrap_or_else(|_| "redis-cli".to_string())
}

/// How to start a Sentinel: the binary, and what goes after its config file's path
/// (`redis-sentinel <conf>`, or `redis-server <conf> --sentinel`).
pub fn sentinel_cmd() -> (String, Vec<String>) {
    if let Ok(bin) = std::env::var("REDIS_SENTINEL") {
        return (bin, vec![]);
    }
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).any(|d| d.join("redis-sentinel").is_file()))
        .unwrap_or(false);
    if on_path {
        ("redis-sentinel".to_string(), vec![])
    } else {
        (server_bin(), vec!["--sentinel".to_string()])
    }
}

/// The module, as an absolute path.
pub fn module_path() -> String {
    let path = match std::env::var_os("REDIS_LOCK_MODULE") {
        Some(path) => PathBuf::from(path),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/debug/libredis_lock.so"),
    };
    assert!(
        path.is_file(),
        "module not found at {} (run `cargo build`, or set REDIS_LOCK_MODULE)",
        path.display()
    );
    path.to_str().expect("non-UTF-8 module path").to_string()
}

/// A path as a command-line argument.
pub fn path_arg(path: &Path) -> String {
    path.to_str()
        .unwrap_or_else(|| panic!("non-UTF-8 path {}", path.display()))
        .to_string()
}

/// A port the OS considers free right now (it can be lost before the server binds; callers
/// retry).
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("cannot bind 127.0.0.1:0");
    listener.local_addr().expect("no local address").port()
}

/// A free port whose cluster bus port (`port + 10000`) is free too: the OS picks the port
/// (binding 127.0.0.1:0); ports above 55535, whose bus port would not exist, are skipped.
pub fn free_port_with_bus() -> u16 {
    for _ in 0..100 {
        let listener = TcpListener::bind("127.0.0.1:0").expect("cannot bind 127.0.0.1:0");
        let port = listener.local_addr().expect("no local address").port();
        let Some(bus) = port.checked_add(BUS_PORT_OFFSET) else {
            continue;
        };
        if TcpListener::bind(("127.0.0.1", bus)).is_ok() {
            return port;
        }
    }
    panic!("no port P with P and P+{BUS_PORT_OFFSET} free after 100 tries");
}

/// A connection to 127.0.0.1:`port` with the default read timeout.
pub fn connect(port: u16) -> Connection {
    try_connect(port, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("cannot connect to 127.0.0.1:{port}: {e}"))
}

fn try_connect(port: u16, timeout: Duration) -> RedisResult<Connection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let conn = client.get_connection_with_timeout(timeout)?;
    conn.set_read_timeout(Some(READ_TIMEOUT))?;
    Ok(conn)
}

/// The value of `field` in `INFO <section>`, if present.
pub fn info_field(conn: &mut Connection, section: &str, field: &str) -> Option<String> {
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query(conn)
        .unwrap_or_else(|e| panic!("INFO {section}: {e}"));
    let value = fields(&info).find_map(|(name, value)| (name == field).then(|| value.to_string()));
    value
}

/// `name:value` lines of an `INFO` or `CLUSTER INFO` reply.
pub fn fields(text: &str) -> impl Iterator<Item = (&str, &str)> {
    text.lines()
        .filter_map(|line| line.trim_end().split_once(':'))
}

/// Poll `cond` until it returns `Some`, or panic naming `what` once `timeout` passed.
pub fn wait_for<T>(what: &str, timeout: Duration, mut cond: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = cond() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

/// How a [`sentinel`] watches its primary.
pub struct SentinelConfig<'a> {
    pub master_name: &'a str,
    /// The primary's address as the Sentinel reaches it.
    pub primary_port: u16,
    pub quorum: usize,
    pub down_after_ms: u64,
    pub failover_timeout_ms: u64,
}

/// Start Sentinel `i` in `dir/sentinel{i}`, monitoring the primary of `cfg`.
pub fn sentinel(i: usize, dir: &Path, cfg: &SentinelConfig) -> Node {
    let (program, trailing) = sentinel_cmd();
    Node::spawn(
        &format!("sentinel {i}"),
        dir.join(format!("sentinel{i}")),
        Ports::Client,
        &program,
        |port, dir| {
            // Sentinel rewrites its config file, so it must be a writable file of its own.
            let conf = dir.join("sentinel.conf");
            let name = cfg.master_name;
            let text = format!(
                "port {port}\n\
                 bind 127.0.0.1\n\
                 dir {dir}\n\
                 logfile {log}\n\
                 sentinel monitor {name} 127.0.0.1 {primary} {quorum}\n\
                 sentinel down-after-milliseconds {name} {down}\n\
                 sentinel failover-timeout {name} {failover}\n\
                 sentinel parallel-syncs {name} 1\n",
                dir = path_arg(dir),
                log = path_arg(&dir.join("logfile")),
                primary = cfg.primary_port,
                quorum = cfg.quorum,
                down = cfg.down_after_ms,
                failover = cfg.failover_timeout_ms,
            );
            fs::write(&conf, text).expect("write sentinel.conf");
            let mut args = vec![path_arg(&conf)];
            args.extend(trailing.iter().cloned());
            args
        },
    )
}
