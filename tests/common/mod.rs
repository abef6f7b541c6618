//! Integration-test harness: real `redis-server` processes with the module loaded.
//!
//! Each [`Server`] runs on a port the OS chose, bound to 127.0.0.1 only, in a
//! directory of its own under `<tmp>/redis-lock-tests/<uuid>` (config `dir`, the
//! `logfile`, RDB and AOF files all live there). Dropping a `Server` kills the
//! process and removes the directory, unless the test is panicking: then the
//! directory is kept and its path and the log tail are printed.
//!
//! Tests wait on observable state ([`wait_until`], [`wait_for_replica_sync`]),
//! never on fixed sleeps.
//!
//! Environment:
//! - `REDIS_SERVER`: the server binary (default `redis-server` on `PATH`).
//! - `REDIS_LOCK_MODULE`: the module (default `<crate>/target/debug/libredis_lock.so`).

// Each test crate (`contract`, `persistence`, `replication`) uses a different
// subset of this module.
#![allow(dead_code)]

use std::fs::{self, File, OpenOptions};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::{Connection, RedisResult, ToRedisArgs, Value};

/// How long a server may take to answer `PING` after it was spawned.
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// How many OS-chosen ports to try before giving up. Another process can take
/// the port between our probe and the server's `bind`; that is rare, so a few
/// tries are plenty (unlike a helper that counts ports up and retries forever).
const PORT_ATTEMPTS: usize = 5;

/// Read timeout on client connections, so a command the module never answers
/// fails the test instead of hanging the suite.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A `redis-server` child process with the module loaded.
pub struct Server {
    /// The running process; `None` between [`Server::kill9`] and [`Server::restart`].
    child: Option<Child>,
    /// The TCP port on 127.0.0.1; kept across restarts.
    port: u16,
    /// This server's own directory (config `dir`, logfile, RDB, AOF).
    dir: PathBuf,
    /// Every argument after `--port P`, reused verbatim by [`Server::restart`].
    args: Vec<String>,
}

/// Why a spawned server did not come up.
enum StartError {
    /// The port was taken between our probe and the server's `bind`.
    PortTaken,
}

impl Server {
    /// A server with the module and the default settings (no RDB, no AOF).
    pub fn start() -> Server {
        Server::start_with_module_args(&[], &[])
    }

    /// A server with extra `redis-server` arguments appended, e.g.
    /// `&["--appendonly", "yes", "--appendfsync", "always"]`.
    pub fn start_with(extra: &[&str]) -> Server {
        Server::start_with_module_args(&[], extra)
    }

    /// A replica of `primary` (`--replicaof 127.0.0.1 <primary port>`).
    /// Call [`wait_for_replica_sync`] before reading from it.
    pub fn replica_of(primary: &Server) -> Server {
        let port = primary.port().to_string();
        Server::start_with(&["--replicaof", "127.0.0.1", &port])
    }

    /// A server whose module gets `module_args` at load time (e.g.
    /// `&["max-owner-bytes", "8"]`), plus extra `redis-server` arguments.
    pub fn start_with_module_args(module_args: &[&str], extra: &[&str]) -> Server {
        let dir = std::env::temp_dir()
            .join("redis-lock-tests")
            .join(uuid::Uuid::new_v4().to_string());
        fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create test dir {}: {e}", dir.display()));

        let module = module_path();
        assert!(
            module.is_file(),
            "module not found at {} (run `cargo build`, or set REDIS_LOCK_MODULE)",
            module.display()
        );

        let mut args: Vec<String> = vec![
            "--bind".into(),
            "127.0.0.1".into(),
            "--dir".into(),
            path_arg(&dir),
            // Absolute, so it does not depend on when the server applies `dir`.
            "--logfile".into(),
            path_arg(&dir.join("logfile")),
            // DEBUG (SET-ACTIVE-EXPIRE, RELOAD) is off by default since 7.0.
            "--enable-debug-command".into(),
            "yes".into(),
            // Full syncs otherwise wait 5 s for more replicas to show up.
            "--repl-diskless-sync-delay".into(),
            "0".into(),
            "--loadmodule".into(),
            path_arg(&module),
        ];
        args.extend(module_args.iter().map(|s| s.to_string()));
        // Persistence is off unless the test asks for it. A default is left out
        // when `extra` sets the same option, so the test's value is the only one.
        for (option, value) in [("--save", ""), ("--appendonly", "no")] {
            if !extra.contains(&option) {
                args.push(option.into());
                args.push(value.into());
            }
        }
        args.extend(extra.iter().map(|s| s.to_string()));

        let mut server = Server {
            child: None,
            port: 0,
            dir,
            args,
        };
        for attempt in 1..=PORT_ATTEMPTS {
            server.port = free_port();
            server.spawn();
            match server.wait_ready() {
                Ok(()) => return server,
                Err(StartError::PortTaken) => {
                    server.reap();
                    eprintln!(
                        "redis-lock-tests: port {} was taken (attempt {attempt}/{PORT_ATTEMPTS})",
                        server.port
                    );
                }
            }
        }
        panic!(
            "no free port after {PORT_ATTEMPTS} attempts; log:\n{}",
            server.log()
        );
    }

    /// The TCP port the server listens on (127.0.0.1 only).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// This server's own directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The server's log file, followed by anything it wrote to stdout/stderr
    /// (config errors are printed before the log file is opened).
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

    /// A new client connection.
    pub fn conn(&self) -> Connection {
        self.try_conn(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("cannot connect to 127.0.0.1:{}: {e}", self.port))
    }

    /// `INFO <section>` field of this server, if present.
    pub fn info_field(&self, section: &str, field: &str) -> Option<String> {
        info_field(&mut self.conn(), section, field)
    }

    /// SIGKILL the server (no shutdown save, no AOF flush beyond what was
    /// already written) and reap it.
    pub fn kill9(&mut self) {
        let mut child = self.child.take().expect("kill9: server is not running");
        // `Child::kill` sends SIGKILL on unix.
        child.kill().expect("kill9: cannot signal redis-server");
        child.wait().expect("kill9: cannot reap redis-server");
    }

    /// Start the server again on the same port and directory with the same
    /// arguments, and wait until it answers `PING` (i.e. has loaded its data).
    pub fn restart(&mut self) {
        assert!(
            self.child.is_none(),
            "restart: server is still running; call kill9() first"
        );
        self.spawn();
        if let Err(StartError::PortTaken) = self.wait_ready() {
            panic!(
                "restart: port {} was taken by another process; log:\n{}",
                self.port,
                self.log()
            );
        }
    }

    fn spawn(&mut self) {
        // Append: a restarted server keeps the earlier output for diagnosis.
        let open = |name: &str| {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.dir.join(name))
                .unwrap_or_else(|e| panic!("cannot open {name} in {}: {e}", self.dir.display()))
        };
        let (stdout, stderr): (File, File) = (open("stdout"), open("stderr"));
        let child = Command::new(server_bin())
            .arg("--port")
            .arg(self.port.to_string())
            .args(&self.args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {:?}: {e}", server_bin()));
        self.child = Some(child);
    }

    /// Kill (if still alive) and reap the child.
    fn reap(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Under valgrind (tests/memcheck.sh sets REDIS_LOCK_GRACEFUL_STOP) stop with SIGTERM,
            // so the server shuts down and valgrind runs its leak check; SIGKILL after a
            // deadline. Otherwise SIGKILL at once: tests should not wait for shutdowns.
            if std::env::var_os("REDIS_LOCK_GRACEFUL_STOP").is_some() {
                let _ = Command::new("kill")
                    .args(["-TERM", &child.id().to_string()])
                    .status();
                let deadline = Instant::now() + Duration::from_secs(30);
                while Instant::now() < deadline {
                    if let Ok(Some(_)) = child.try_wait() {
                        return;
                    }
                    thread::sleep(Duration::from_millis(20));
                }
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Poll until our own process answers `PING`, with a deadline.
    fn wait_ready(&mut self) -> Result<(), StartError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let child = self.child.as_mut().expect("wait_ready: no child");
            if let Some(status) = child.try_wait().expect("cannot poll redis-server") {
                let log = self.log();
                if log.contains("Address already in use") {
                    return Err(StartError::PortTaken);
                }
                panic!(
                    "redis-server exited ({status}) before it was ready; dir {}; log:\n{log}",
                    self.dir.display()
                );
            }
            if self.answers_ping() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                panic!(
                    "redis-server on port {} not ready after {READY_TIMEOUT:?}; dir {}; log:\n{}",
                    self.port,
                    self.dir.display(),
                    self.log()
                );
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// True if the server on our port is *our* child (not another test's server
    /// that won the port) and answers `PING` (not `LOADING`).
    fn answers_ping(&self) -> bool {
        let Ok(mut conn) = self.try_conn(Duration::from_millis(200)) else {
            return false;
        };
        let pong: RedisResult<String> = redis::cmd("PING").query(&mut conn);
        if pong.as_deref() != Ok("PONG") {
            return false;
        }
        let pid = info_field(&mut conn, "server", "process_id");
        let ours = self.child.as_ref().map(|c| c.id().to_string());
        pid.is_some() && pid == ours
    }

    fn try_conn(&self, timeout: Duration) -> RedisResult<Connection> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))?;
        let conn = client.get_connection_with_timeout(timeout)?;
        conn.set_read_timeout(Some(READ_TIMEOUT))?;
        Ok(conn)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.reap();
        if thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            eprintln!(
                "redis-lock-tests: test failed; keeping {} (port {}); log tail:\n{}",
                self.dir.display(),
                self.port,
                tail.join("\n")
            );
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

fn server_bin() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_string())
}

fn module_path() -> PathBuf {
    match std::env::var_os("REDIS_LOCK_MODULE") {
        Some(path) => PathBuf::from(path),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/debug/libredis_lock.so"),
    }
}

fn path_arg(path: &Path) -> String {
    path.to_str()
        .unwrap_or_else(|| panic!("non-UTF-8 path {}", path.display()))
        .to_string()
}

/// A port the OS considers free right now. The listener is dropped before the
/// server binds, so the port can be lost in between; callers retry.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("cannot bind 127.0.0.1:0");
    listener.local_addr().expect("no local address").port()
}

/// Poll `cond` every few milliseconds until it is true; panic naming `what`
/// if `timeout` passes first.
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        thread::sleep(Duration::from_millis(2));
    }
}

/// The value of `field` in `INFO <section>`, if present.
pub fn info_field(conn: &mut Connection, section: &str, field: &str) -> Option<String> {
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query(conn)
        .unwrap_or_else(|e| panic!("INFO {section}: {e}"));
    info.lines().find_map(|line| {
        let (name, value) = line.trim_end().split_once(':')?;
        (name == field).then(|| value.to_string())
    })
}

/// Wait until `replica` has a live link to `primary` and has processed
/// everything the primary has sent (`slave_repl_offset` equals the primary's
/// `master_repl_offset`), and the primary is streaming commands to it.
///
/// The last part matters right after a diskless full sync: the primary holds
/// back the command stream until the replica's next `REPLCONF ACK` (sent once a
/// second), so a write made then can reach the replica up to a second late.
/// Once the link is up this sends a `PUBLISH` (propagated to replicas, no key
/// touched) and waits for the replica to have processed it too.
pub fn wait_for_replica_sync(primary: &Server, replica: &Server) {
    let mut p = primary.conn();
    let mut r = replica.conn();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut probed = false;
    loop {
        let link = info_field(&mut r, "replication", "master_link_status");
        let replica_offset = info_field(&mut r, "replication", "slave_repl_offset");
        let primary_offset = info_field(&mut p, "replication", "master_repl_offset");
        if link.as_deref() == Some("up")
            && replica_offset.is_some()
            && replica_offset == primary_offset
        {
            if probed {
                return;
            }
            let _: i64 = redis::cmd("PUBLISH")
                .arg("redis-lock-tests:sync-probe")
                .arg("")
                .query(&mut p)
                .expect("PUBLISH sync probe");
            probed = true;
            continue;
        }
        if Instant::now() >= deadline {
            panic!(
                "timed out waiting for the replica on port {} to catch up with the primary \
                 on port {} (link {link:?}, replica offset {replica_offset:?}, primary \
                 offset {primary_offset:?}); replica log:\n{}",
                replica.port(),
                primary.port(),
                replica.log()
            );
        }
        thread::sleep(Duration::from_millis(2));
    }
}

/// Wait until no AOF rewrite is running or scheduled.
pub fn wait_no_aof_rewrite(server: &Server) {
    let mut c = server.conn();
    wait_until("AOF rewrite to finish", Duration::from_secs(10), || {
        info_field(&mut c, "persistence", "aof_rewrite_in_progress").as_deref() == Some("0")
            && info_field(&mut c, "persistence", "aof_rewrite_scheduled").as_deref() == Some("0")
    });
}

/// A key name no other test uses.
pub fn unique_key(prefix: &str) -> String {
    format!("{prefix}:{}", uuid::Uuid::new_v4())
}

/// Wall-clock milliseconds since the Unix epoch.
pub fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock before 1970")
        .as_millis() as i64
}

/// Sleep until `deadline` has passed. Only for deadlines the test itself set
/// (a lock's ttl), never to wait for the server to do something.
pub fn sleep_until(deadline: Instant) {
    let now = Instant::now();
    if deadline > now {
        thread::sleep(deadline - now);
    }
}

// ---------------------------------------------------------------------------
// Commands. Each helper checks the exact reply type (an integer reply must not
// arrive as a bulk string, nil must be nil) and panics with the raw reply if not.

/// Run `name args...` and return the raw reply (or the error reply).
pub fn call<A: ToRedisArgs>(conn: &mut Connection, name: &str, args: &[A]) -> RedisResult<Value> {
    let mut cmd = redis::cmd(name);
    for arg in args {
        cmd.arg(arg);
    }
    cmd.query(conn)
}

fn int_or_nil(what: &str, reply: RedisResult<Value>) -> Option<i64> {
    match reply {
        Ok(Value::Int(n)) => Some(n),
        Ok(Value::Nil) => None,
        other => panic!("{what}: expected an integer or nil reply, got {other:?}"),
    }
}

fn int(what: &str, reply: RedisResult<Value>) -> i64 {
    match reply {
        Ok(Value::Int(n)) => n,
        other => panic!("{what}: expected an integer reply, got {other:?}"),
    }
}

/// `LOCK.ACQUIRE key owner ttl` -> `Some(token)` or `None` (nil).
pub fn acquire(
    conn: &mut Connection,
    key: &str,
    owner: impl ToRedisArgs,
    ttl_ms: i64,
) -> Option<i64> {
    let reply = redis::cmd("LOCK.ACQUIRE")
        .arg(key)
        .arg(owner)
        .arg(ttl_ms)
        .query(conn);
    int_or_nil("LOCK.ACQUIRE", reply)
}

/// `LOCK.ACQUIRE` that must grant; returns the token and checks it is positive.
pub fn must_acquire(conn: &mut Connection, key: &str, owner: impl ToRedisArgs, ttl_ms: i64) -> i64 {
    let token = acquire(conn, key, owner, ttl_ms)
        .unwrap_or_else(|| panic!("LOCK.ACQUIRE {key}: expected a token, got nil"));
    assert!(
        token > 0,
        "LOCK.ACQUIRE {key}: token {token} is not positive"
    );
    token
}

/// `LOCK.RELEASE key owner` -> 1 or 0.
pub fn release(conn: &mut Connection, key: &str, owner: impl ToRedisArgs) -> i64 {
    int(
        "LOCK.RELEASE",
        redis::cmd("LOCK.RELEASE").arg(key).arg(owner).query(conn),
    )
}

/// `LOCK.EXTEND key owner ttl` -> 1 or 0.
pub fn extend(conn: &mut Connection, key: &str, owner: impl ToRedisArgs, ttl_ms: i64) -> i64 {
    int(
        "LOCK.EXTEND",
        redis::cmd("LOCK.EXTEND")
            .arg(key)
            .arg(owner)
            .arg(ttl_ms)
            .query(conn),
    )
}

/// `LOCK.FENCE key` -> `Some(token)` of the live hold, or `None`.
pub fn fence(conn: &mut Connection, key: &str) -> Option<i64> {
    int_or_nil("LOCK.FENCE", redis::cmd("LOCK.FENCE").arg(key).query(conn))
}

/// `LOCK.FENCE key token` -> 1 or 0.
pub fn fence_check(conn: &mut Connection, key: &str, token: i64) -> i64 {
    int(
        "LOCK.FENCE",
        redis::cmd("LOCK.FENCE").arg(key).arg(token).query(conn),
    )
}

/// `PTTL key`.
pub fn pttl(conn: &mut Connection, key: &str) -> i64 {
    int("PTTL", redis::cmd("PTTL").arg(key).query(conn))
}

/// `EXISTS key`.
pub fn exists(conn: &mut Connection, key: &str) -> i64 {
    int("EXISTS", redis::cmd("EXISTS").arg(key).query(conn))
}

/// `TYPE key`.
pub fn key_type(conn: &mut Connection, key: &str) -> String {
    match redis::cmd("TYPE").arg(key).query(conn) {
        Ok(Value::SimpleString(s)) => s,
        other => panic!("TYPE {key}: expected a status reply, got {other:?}"),
    }
}

/// Assert `reply` is the error `expected`, written as the server sends it
/// (`"ERR ttl-ms must be a positive integer"`): the code and the message text.
#[track_caller]
pub fn assert_err<T: std::fmt::Debug>(reply: RedisResult<T>, expected: &str) {
    let (code, detail) = match expected.split_once(' ') {
        Some((code, detail)) => (code, Some(detail)),
        None => (expected, None),
    };
    match reply {
        Err(e) => assert!(
            e.code() == Some(code) && e.detail() == detail,
            "expected error {expected:?}, got code {:?} detail {:?} ({e})",
            e.code(),
            e.detail()
        ),
        Ok(v) => panic!("expected error {expected:?}, got reply {v:?}"),
    }
}

/// Assert `reply` is an error with code `code` (message not checked).
#[track_caller]
pub fn assert_err_code<T: std::fmt::Debug>(reply: RedisResult<T>, code: &str) {
    match reply {
        Err(e) => assert_eq!(e.code(), Some(code), "expected error code {code}, got {e}"),
        Ok(v) => panic!("expected error code {code}, got reply {v:?}"),
    }
}

/// Assert `key` is held with `token` and its deadline has not moved later
/// than `max_pttl` ms from now (and has not passed).
#[track_caller]
pub fn assert_held(conn: &mut Connection, key: &str, token: i64, max_pttl: i64) {
    assert_eq!(fence(conn, key), Some(token), "LOCK.FENCE {key}");
    let left = pttl(conn, key);
    assert!(
        left > 0 && left <= max_pttl,
        "PTTL {key} = {left}, expected in 1..={max_pttl}"
    );
}

/// Assert `key` is free and does not exist.
#[track_caller]
pub fn assert_absent(conn: &mut Connection, key: &str) {
    assert_eq!(exists(conn, key), 0, "EXISTS {key}");
    assert_eq!(fence(conn, key), None, "LOCK.FENCE {key}");
}

/// `INFO clients` `blocked_clients`.
pub fn blocked_clients(ctl: &mut Connection) -> i64 {
    let field =
        info_field(ctl, "clients", "blocked_clients").expect("INFO clients has no blocked_clients");
    field
        .parse()
        .unwrap_or_else(|e| panic!("blocked_clients {field:?}: {e}"))
}

/// Wait (up to 10 s) until exactly `n` clients are blocked.
#[track_caller]
pub fn wait_blocked(ctl: &mut Connection, n: i64) {
    wait_until(
        &format!("blocked_clients == {n}"),
        Duration::from_secs(10),
        || blocked_clients(ctl) == n,
    );
}
