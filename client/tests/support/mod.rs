//! Test harness: real `redis-server` processes with the redis-lock module loaded.
//!
//! A trimmed copy of the module's own `tests/common/mod.rs`: each [`Server`] runs on a port the
//! OS chose, bound to 127.0.0.1, in a directory of its own under
//! `<tmp>/redis-lock-client-tests/<uuid>`; dropping it kills the process (also a stopped one) and
//! removes the directory, unless the test is panicking, when the directory is kept and the log
//! tail printed.
//!
//! Environment:
//! - `REDIS_SERVER`: the server binary (default `/usr/bin/redis-server` if it exists, else
//!   `redis-server` on `PATH`).
//! - `REDIS_LOCK_MODULE`: the module (default `<workspace>/target/debug/libredis_lock.so`, which
//!   `cargo build` at the workspace root produces).

// Each test crate uses a different subset.
#![allow(dead_code)]

use std::fs::{self, File};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redis::{Connection, RedisResult, Value};

/// How long a server may take to answer `PING` after it was spawned.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// How many OS-chosen ports to try: another process can take the port between our probe and
/// the server's `bind`.
const PORT_ATTEMPTS: usize = 5;

/// A `redis-server` child process with the module loaded.
pub struct Server {
    /// The running process; `None` after [`Server::kill9`].
    child: Option<Child>,
    /// The TCP port on 127.0.0.1.
    port: u16,
    /// This server's own directory (config `dir`, logfile).
    dir: PathBuf,
}

impl Server {
    /// A server with the module, no persistence.
    pub fn start() -> Server {
        let dir = std::env::temp_dir()
            .join("redis-lock-client-tests")
            .join(uuid::Uuid::new_v4().to_string());
        fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create test dir {}: {e}", dir.display()));
        let module = module_path();
        assert!(
            module.is_file(),
            "module not found at {} (run `cargo build` at the workspace root, or set \
             REDIS_LOCK_MODULE)",
            module.display()
        );
        let mut server = Server {
            child: None,
            port: 0,
            dir,
        };
        for attempt in 1..=PORT_ATTEMPTS {
            server.port = free_port();
            server.spawn(&module);
            match server.wait_ready() {
                Ok(()) => return server,
                Err(PortTaken) => {
                    server.reap();
                    eprintln!(
                        "redis-lock-client-tests: port {} was taken (attempt {attempt})",
                        server.port
                    );
                }
            }
        }
        panic!("no free port after {PORT_ATTEMPTS} attempts");
    }

    /// The port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server is not running").id()
    }

    /// A new plain connection (not through the crate under test).
    pub fn conn(&self) -> Connection {
        let client = redis::Client::open(self.url()).expect("url");
        let conn = client
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", self.url()));
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("set_read_timeout");
        conn
    }

    /// Send `SIGSTOP` (`stop`) or `SIGCONT` to the server.
    pub fn signal(&self, signal: &str) {
        send_signal(self.pid(), signal);
    }

    /// SIGKILL the server and reap it.
    pub fn kill9(&mut self) {
        let mut child = self.child.take().expect("kill9: server is not running");
        child.kill().expect("kill9: cannot signal redis-server");
        child.wait().expect("kill9: cannot reap redis-server");
    }

    /// How many times `command` (lower case, e.g. `lock.extend`) has run, from
    /// `INFO commandstats`.
    pub fn calls(&self, command: &str) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.conn())
            .expect("INFO commandstats");
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .map(|rest| rest.split(',').next().unwrap_or("0").parse().unwrap_or(0))
            .unwrap_or(0)
    }

    /// `INFO clients` `blocked_clients`: how many clients wait in a queue.
    pub fn blocked_clients(&self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("clients")
            .query(&mut self.conn())
            .expect("INFO clients");
        info.lines()
            .find_map(|line| line.strip_prefix("blocked_clients:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("INFO clients has no blocked_clients")
    }

    /// Wait (up to 10 s) until exactly `n` clients are blocked.
    #[track_caller]
    pub fn wait_blocked(&self, n: u64) {
        wait_until(
            &format!("blocked_clients == {n}"),
            Duration::from_secs(10),
            || self.blocked_clients() == n,
        );
    }

    /// The server's log.
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

    fn spawn(&mut self, module: &Path) {
        let open = |name: &str| {
            File::create(self.dir.join(name))
                .unwrap_or_else(|e| panic!("cannot create {name} in {}: {e}", self.dir.display()))
        };
        let child = Command::new(server_bin())
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(self.dir.join("logfile"))
            .arg("--loadmodule")
            .arg(module)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(open("stdout"))
            .stderr(open("stderr"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {:?}: {e}", server_bin()));
        self.child = Some(child);
    }

    fn reap(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Poll until our own process answers `PING`, with a deadline.
    fn wait_ready(&mut self) -> Result<(), PortTaken> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let child = self.child.as_mut().expect("wait_ready: no child");
            if let Some(status) = child.try_wait().expect("cannot poll redis-server") {
                let log = self.log();
                if log.contains("Address already in use") {
                    return Err(PortTaken);
                }
                panic!("redis-server exited ({status}) before it was ready; log:\n{log}");
            }
            if self.answers_ping() {
                return Ok(());
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} not ready after {READY_TIMEOUT:?}; log:\n{}",
                self.port,
                self.log()
            );
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// True if the server on our port is *our* child and answers `PING`.
    fn answers_ping(&self) -> bool {
        let Ok(client) = redis::Client::open(self.url()) else {
            return false;
        };
        let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_millis(200)) else {
            return false;
        };
        let pong: RedisResult<String> = redis::cmd("PING").query(&mut conn);
        if pong.as_deref() != Ok("PONG") {
            return false;
        }
        let info: RedisResult<String> = redis::cmd("INFO").arg("server").query(&mut conn);
        let ours = format!("process_id:{}", self.pid());
        info.is_ok_and(|info| info.lines().any(|l| l.trim_end() == ours))
    }
}

/// The port was taken between our probe and the server's `bind`.
struct PortTaken;

impl Drop for Server {
    fn drop(&mut self) {
        self.reap();
        if thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            eprintln!(
                "redis-lock-client-tests: test failed; keeping {} (port {}); log tail:\n{}",
                self.dir.display(),
                self.port,
                tail.join("\n")
            );
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// Five servers, as independent Redlock masters.
pub fn five_servers() -> Vec<Server> {
    (0..5).map(|_| Server::start()).collect()
}

/// The servers' URLs, in order.
pub fn urls(servers: &[Server]) -> Vec<String> {
    servers.iter().map(Server::url).collect()
}

/// Which servers hold `key` right now.
pub fn holders(servers: &[Server], key: &str) -> Vec<bool> {
    servers
        .iter()
        .map(|s| fence(&mut s.conn(), key).is_some())
        .collect()
}

/// `kill -<signal> <pid>` (e.g. `STOP`, `CONT`).
pub fn send_signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("cannot run kill");
    assert!(status.success(), "kill -{signal} {pid} failed");
}

fn server_bin() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| {
        if Path::new("/usr/bin/redis-server").exists() {
            "/usr/bin/redis-server".to_string()
        } else {
            "redis-server".to_string()
        }
    })
}

fn module_path() -> PathBuf {
    match std::env::var_os("REDIS_LOCK_MODULE") {
        Some(path) => PathBuf::from(path),
        // client/ is one level below the workspace root.
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/libredis_lock.so"),
    }
}

/// A port the OS considers free right now (nothing listens on it once this returns).
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("cannot bind 127.0.0.1:0");
    listener.local_addr().expect("no local address").port()
}

/// A key name no other test uses.
pub fn unique_key(prefix: &str) -> String {
    format!("{prefix}:{}", uuid::Uuid::new_v4())
}

/// Poll `cond` every few milliseconds until it is true; panic naming `what` if `timeout`
/// passes first.
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        thread::sleep(Duration::from_millis(2));
    }
}

/// [`wait_until`] for async tests: polls with `tokio::time::sleep`, so that the runtime's other
/// tasks (a guard's release, a connection's driver) run meanwhile even on one thread.
pub async fn eventually(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// `LOCK.FENCE key` -> the live hold's token, or `None`.
pub fn fence(conn: &mut Connection, key: &str) -> Option<u64> {
    match redis::cmd("LOCK.FENCE").arg(key).query(conn) {
        Ok(Value::Int(n)) => Some(n as u64),
        Ok(Value::Nil) => None,
        other => panic!("LOCK.FENCE {key}: {other:?}"),
    }
}

/// `PTTL key`.
pub fn pttl(conn: &mut Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(conn).expect("PTTL")
}

/// `EXISTS key`.
pub fn exists(conn: &mut Connection, key: &str) -> bool {
    let n: i64 = redis::cmd("EXISTS").arg(key).query(conn).expect("EXISTS");
    n == 1
}

/// `LOCK.ACQUIRE key owner ttl` on a plain connection -> token or `None`.
pub fn raw_acquire(conn: &mut Connection, key: &str, owner: &str, ttl_ms: u64) -> Option<u64> {
    match redis::cmd("LOCK.ACQUIRE")
        .arg(key)
        .arg(owner)
        .arg(ttl_ms)
        .query(conn)
    {
        Ok(Value::Int(n)) => Some(n as u64),
        Ok(Value::Nil) => None,
        other => panic!("LOCK.ACQUIRE {key}: {other:?}"),
    }
}

/// Sleep until `elapsed` has passed since `since`. Only for durations the test itself chose (a
/// pause past a ttl), never to wait for the server to do something.
pub fn sleep_until_elapsed(since: std::time::Instant, elapsed: Duration) {
    let left = elapsed.saturating_sub(since.elapsed());
    thread::sleep(left);
}
