//! One server process: spawned on a port the OS chose, in a directory of its own, ready once it
//! answers `PING` as itself, killed on drop. [`Server::spawn`] runs any program with any
//! arguments (cluster nodes, Sentinels); [`Server::builder`] makes the usual one, a server with
//! the module loaded.

use std::fs::{self, OpenOptions};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redis::{Connection, RedisResult};

use crate::clock::ShiftedClock;
use crate::paths::{module_file, path_arg, server_bin};
use crate::valgrind;
use crate::wait::{info_field, try_connect, wait_until};

/// How long a process may take to answer `PING` after it was spawned (six times that under
/// valgrind).
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// How many OS-chosen ports to try before giving up. Another process can take the port between
/// our probe and the server's `bind`; that is rare, so a few tries are plenty (unlike a helper
/// that counts ports up and retries forever).
const PORT_ATTEMPTS: usize = 5;

/// The cluster bus listens on the client port plus this (fixed by Redis).
pub const BUS_PORT_OFFSET: u16 = 10_000;

/// What a process listens with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ports {
    /// A client port only.
    Client,
    /// A client port and, at `port + 10000`, a cluster bus port.
    ClientAndBus,
}

/// A spawned server process (`redis-server` with or without the module, a cluster node, a
/// Sentinel) in a directory of its own. Dropping it kills the process (also a stopped one) and
/// removes the directory, unless the test is panicking: then the directory is kept and its path
/// and the log tail are printed.
pub struct Server {
    /// The running process; `None` between [`Server::kill9`] and [`Server::restart`].
    child: Option<Child>,
    /// The TCP port on 127.0.0.1; kept across restarts.
    port: u16,
    /// This process's own directory (config `dir`, logfile, RDB, AOF, `nodes.conf`).
    dir: PathBuf,
    /// What messages call it ("redis-server", "cluster node 3", "sentinel 1").
    name: String,
    /// The program and every argument, as spawned; reused verbatim by [`Server::restart`].
    program: String,
    args: Vec<String>,
    /// Extra environment of the process (e.g. [`ShiftedClock::env`]), kept across restarts.
    env: Vec<(String, String)>,
    /// Keep the directory on drop: the start failed and the caller reports it.
    keep_dir: bool,
}

/// The old name of [`Server`] in the cluster and Sentinel tests.
pub type Node = Server;

/// Why a spawned process did not come up.
enum StartError {
    /// The port (or its bus port) was taken between our probe and the process's `bind`.
    PortTaken,
    /// Anything else, with the message to report.
    Failed(String),
}

impl Server {
    /// A server with the module and the default settings (no RDB, no AOF).
    pub fn start() -> Server {
        Server::builder().start()
    }

    /// A server with extra `redis-server` arguments appended, e.g.
    /// `&["--appendonly", "yes", "--appendfsync", "always"]`.
    pub fn start_with(extra: &[&str]) -> Server {
        Server::builder().args(extra).start()
    }

    /// A server with an AOF synced on every write (`appendfsync always`), so that every reply
    /// is on disk before SIGKILL; `rdb_preamble` (`"yes"` or `"no"`) picks the rewritten base
    /// file's format.
    pub fn start_aof_always(rdb_preamble: &str) -> Server {
        Server::start_with(&[
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--aof-use-rdb-preamble",
            rdb_preamble,
        ])
    }

    /// A replica of `primary` (`--replicaof 127.0.0.1 <primary port>`).
    /// Call [`crate::wait_for_replica_sync`] before reading from it.
    pub fn replica_of(primary: &Server) -> Server {
        Server::builder().replica_of(primary.port()).start()
    }

    /// A server whose module gets `module_args` at load time (e.g.
    /// `&["max-owner-bytes", "8"]`), plus extra `redis-server` arguments.
    pub fn start_with_module_args(module_args: &[&str], extra: &[&str]) -> Server {
        Server::builder()
            .module_args(module_args)
            .args(extra)
            .start()
    }

    /// As [`Server::start_with_module_args`], with extra environment variables for the
    /// process (kept across [`Server::restart`]), e.g. a shifted wall clock.
    pub fn start_with_env(
        env: Vec<(String, String)>,
        module_args: &[&str],
        extra: &[&str],
    ) -> Server {
        Server::builder()
            .env(env)
            .module_args(module_args)
            .args(extra)
            .start()
    }

    /// Any other server with the module: the binary, module arguments, extra arguments,
    /// environment, replica, clock.
    pub fn builder() -> ServerBuilder {
        ServerBuilder::default()
    }

    /// Spawn `program` with `args(port, dir)` in `dir` (created here) on a free port, and wait
    /// until it answers `PING`. `args` gets the port and directory so that it can write them
    /// into a config file; it must name the port itself (`--port`, or `port` in the file).
    pub fn spawn(
        name: &str,
        dir: PathBuf,
        ports: Ports,
        program: &str,
        args: impl Fn(u16, &Path) -> Vec<String>,
    ) -> Server {
        Server::try_spawn(name, dir, ports, program, Vec::new(), args)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Server::spawn`] with extra environment, returning what went wrong rather than
    /// panicking (for the benchmarks and the `harness` program).
    pub fn try_spawn(
        name: &str,
        dir: PathBuf,
        ports: Ports,
        program: &str,
        env: Vec<(String, String)>,
        args: impl Fn(u16, &Path) -> Vec<String>,
    ) -> Result<Server, String> {
        fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let mut server = Server {
            child: None,
            port: 0,
            dir,
            name: name.to_string(),
            program: program.to_string(),
            args: Vec::new(),
            env,
            keep_dir: false,
        };
        for attempt in 1..=PORT_ATTEMPTS {
            server.port = match ports {
                Ports::Client => free_port(),
                Ports::ClientAndBus => free_port_with_bus(),
            };
            server.args = args(server.port, &server.dir);
            // A fresh start: the output of an attempt that lost its port is not this one's.
            for file in ["logfile", "stdout", "stderr"] {
                let _ = fs::remove_file(server.dir.join(file));
            }
            let started = server.launch().and_then(|()| server.wait_ready());
            match started {
                Ok(()) => return Ok(server),
                Err(StartError::PortTaken) => {
                    server.reap();
                    eprintln!(
                        "{name}: port {} (or its bus port) was taken (attempt {attempt}/{PORT_ATTEMPTS})",
                        server.port
                    );
                }
                Err(StartError::Failed(message)) => {
                    server.reap();
                    server.keep_dir = true;
                    return Err(message);
                }
            }
        }
        server.keep_dir = true;
        Err(format!(
            "{name}: no free port after {PORT_ATTEMPTS} attempts; log:\n{}",
            server.log()
        ))
    }

    /// The TCP port it listens on (127.0.0.1 only, unless its arguments bind more).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`, as the cluster and Sentinel name it.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// This process's own directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The process id; panics if it was killed.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server is not running").id()
    }

    /// True while the process has not been killed.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The log file, followed by anything the process wrote to stdout/stderr (config errors
    /// are printed before the log file is opened).
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

    /// A new client connection (10 s read timeout).
    pub fn conn(&self) -> Connection {
        crate::connect(self.port)
    }

    /// `INFO <section>` field of this server, if present.
    pub fn info_field(&self, section: &str, field: &str) -> Option<String> {
        info_field(&mut self.conn(), section, field)
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
        crate::blocked_clients(&mut self.conn()) as u64
    }

    /// Wait (up to 10 s) until exactly `n` clients are blocked.
    #[track_caller]
    pub fn wait_blocked(&self, n: u64) {
        let mut conn = self.conn();
        wait_until(
            &format!("blocked_clients == {n}"),
            Duration::from_secs(10),
            || crate::blocked_clients(&mut conn) as u64 == n,
        );
    }

    /// Send `SIGSTOP` (`"STOP"`) or `SIGCONT` (`"CONT"`) to the process.
    pub fn signal(&self, signal: &str) {
        send_signal(self.pid(), signal);
    }

    /// SIGKILL the process (no shutdown save, no AOF flush beyond what was already written)
    /// and reap it.
    pub fn kill9(&mut self) {
        let mut child = self.child.take().expect("kill9: server is not running");
        // `Child::kill` sends SIGKILL on unix.
        child.kill().expect("kill9: cannot signal the server");
        child.wait().expect("kill9: cannot reap the server");
    }

    /// Start the process again on the same port and directory with the same arguments, and
    /// wait until it answers `PING` (i.e. has loaded its data).
    pub fn restart(&mut self) {
        assert!(
            self.child.is_none(),
            "restart: server is still running; call kill9() first"
        );
        match self.launch().and_then(|()| self.wait_ready()) {
            Ok(()) => {}
            Err(StartError::PortTaken) => panic!(
                "restart: port {} was taken by another process; log:\n{}",
                self.port,
                self.log()
            ),
            Err(StartError::Failed(message)) => panic!("restart: {message}"),
        }
    }

    /// If the process has exited by itself (after `SHUTDOWN`, say): `Some` of its exit code
    /// (`None` inside if a signal ended it), and it counts as killed. `None` while it runs.
    pub fn exited(&mut self) -> Option<Option<i32>> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        Some(status.code())
    }

    fn launch(&mut self) -> Result<(), StartError> {
        // Append: a restarted server keeps the earlier output for diagnosis.
        let open = |name: &str| {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.dir.join(name))
                .map_err(|e| {
                    StartError::Failed(format!("cannot open {name} in {}: {e}", self.dir.display()))
                })
        };
        let (stdout, stderr) = (open("stdout")?, open("stderr")?);
        let mut command = match valgrind::log_dir() {
            Some(logs) => {
                let mut c = Command::new("valgrind");
                c.args(valgrind::args(&logs)).arg(&self.program);
                c
            }
            None => Command::new(&self.program),
        };
        let child = command
            .args(&self.args)
            .envs(self.env.iter().cloned())
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .map_err(|e| StartError::Failed(format!("cannot run {:?}: {e}", self.program)))?;
        self.child = Some(child);
        Ok(())
    }

    /// Kill (if still alive) and reap the child.
    fn reap(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Under valgrind (or with REDIS_LOCK_GRACEFUL_STOP) stop with SIGTERM, so that the
            // server shuts down and valgrind runs its leak check; SIGKILL after a deadline.
            // Otherwise SIGKILL at once: tests should not wait for shutdowns.
            if valgrind::graceful_stop() {
                // SAFETY: kill takes no pointers; the pid is our own unreaped child.
                unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
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
        let timeout = READY_TIMEOUT * if valgrind::log_dir().is_some() { 6 } else { 1 };
        let deadline = Instant::now() + timeout;
        loop {
            let child = self.child.as_mut().expect("wait_ready: no child");
            let exited = child
                .try_wait()
                .map_err(|e| StartError::Failed(format!("cannot poll {}: {e}", self.name)))?;
            if let Some(status) = exited {
                self.child = None;
                let log = self.log();
                if log.contains("Address already in use") {
                    return Err(StartError::PortTaken);
                }
                return Err(StartError::Failed(format!(
                    "{} exited ({status}) before it was ready; dir {}; log:\n{log}",
                    self.name,
                    self.dir.display()
                )));
            }
            if self.answers_ping() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(StartError::Failed(format!(
                    "{} on port {} not ready after {timeout:?}; dir {}; log:\n{}",
                    self.name,
                    self.port,
                    self.dir.display(),
                    self.log()
                )));
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// True if the process on our port is *our* child (not another test's server that won the
    /// port) and answers `PING` (not `LOADING`).
    fn answers_ping(&self) -> bool {
        let Ok(mut conn) = try_connect(self.port, Duration::from_millis(200)) else {
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

impl Drop for Server {
    fn drop(&mut self) {
        self.reap();
        if thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            eprintln!(
                "{}: test failed; keeping {} (port {}); log tail:\n{}",
                self.name,
                self.dir.display(),
                self.port,
                tail.join("\n")
            );
        } else if !self.keep_dir {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// How to start a server with the module: [`Server::builder`], then [`ServerBuilder::start`].
///
/// The defaults are those every test wants: bound to 127.0.0.1, `dir` and `logfile` in the
/// server's own directory, `DEBUG` enabled, full syncs without the 5 s wait for more replicas,
/// no RDB and no AOF unless the extra arguments set `--save` or `--appendonly`.
pub struct ServerBuilder {
    /// The server binary (default [`server_bin`]).
    bin: Option<String>,
    /// Load the module: `REDIS_LOCK_MODULE`'s (`None`), this one (`Some(Some(path))`), or
    /// none (`Some(None)`).
    module: Option<Option<PathBuf>>,
    /// Arguments after `--loadmodule <path>`.
    module_args: Vec<String>,
    /// Extra `redis-server` arguments, after the defaults (so they win).
    args: Vec<String>,
    /// Extra environment.
    env: Vec<(String, String)>,
    /// What messages call it.
    name: String,
}

impl Default for ServerBuilder {
    fn default() -> Self {
        ServerBuilder {
            bin: None,
            module: None,
            module_args: Vec::new(),
            args: Vec::new(),
            env: Vec::new(),
            name: "redis-server".to_string(),
        }
    }
}

impl ServerBuilder {
    /// Run this binary rather than `REDIS_SERVER`'s (another server of the matrix).
    pub fn bin(mut self, bin: &str) -> Self {
        self.bin = Some(bin.to_string());
        self
    }

    /// Load this module rather than `REDIS_LOCK_MODULE`'s (a release build, say).
    pub fn module(mut self, path: &Path) -> Self {
        self.module = Some(Some(path.to_path_buf()));
        self
    }

    /// Start the server without the module (a reference server).
    pub fn without_module(mut self) -> Self {
        self.module = Some(None);
        self
    }

    /// Arguments for the module at load time, e.g. `&["max-owner-bytes", "8"]`.
    pub fn module_args(mut self, args: &[&str]) -> Self {
        self.module_args.extend(args.iter().map(|s| s.to_string()));
        self
    }

    /// Extra `redis-server` arguments, e.g. `&["--appendonly", "yes"]`.
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|s| s.to_string()));
        self
    }

    /// Extra environment variables (kept across [`Server::restart`]).
    pub fn env(mut self, env: Vec<(String, String)>) -> Self {
        self.env.extend(env);
        self
    }

    /// A replica of the server on 127.0.0.1:`port`.
    pub fn replica_of(self, port: u16) -> Self {
        self.args(&["--replicaof", "127.0.0.1", &port.to_string()])
    }

    /// The server's wall clock shifted by `clock` (the LD_PRELOAD library).
    pub fn clock(self, clock: &ShiftedClock) -> Self {
        self.env(clock.env())
    }

    /// What messages and the kept directory call it (default `redis-server`).
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }

    /// Start it and wait until it answers `PING`; panics with the log if it does not.
    pub fn start(self) -> Server {
        self.try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`ServerBuilder::start`], returning what went wrong rather than panicking.
    pub fn try_start(self) -> Result<Server, String> {
        let bin = self.bin.clone().unwrap_or_else(server_bin);
        let module = match self.module.clone().unwrap_or_else(|| Some(module_file())) {
            Some(module) if !module.is_file() => {
                return Err(format!(
                    "module not found at {} (run `cargo build`, or set REDIS_LOCK_MODULE)",
                    module.display()
                ));
            }
            module => module.as_deref().map(path_arg),
        };
        let dir = std::env::temp_dir()
            .join("redis-lock-tests")
            .join(uuid::Uuid::new_v4().to_string());
        let extra = &self.args;
        Server::try_spawn(
            &self.name,
            dir,
            Ports::Client,
            &bin,
            self.env.clone(),
            |port, dir| {
                let mut args: Vec<String> = [
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--dir",
                    &path_arg(dir),
                    // Absolute, so it does not depend on when the server applies `dir`.
                    "--logfile",
                    &path_arg(&dir.join("logfile")),
                    // DEBUG (SET-ACTIVE-EXPIRE, RELOAD) is off by default since 7.0.
                    "--enable-debug-command",
                    "yes",
                    // Full syncs otherwise wait 5 s for more replicas to show up.
                    "--repl-diskless-sync-delay",
                    "0",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                if let Some(module) = &module {
                    args.extend(["--loadmodule".to_string(), module.clone()]);
                    args.extend(self.module_args.iter().cloned());
                }
                // Persistence is off unless the test asks for it. A default is left out when
                // `extra` sets the same option, so the test's value is the only one.
                for (option, value) in [("--save", ""), ("--appendonly", "no")] {
                    if !extra.iter().any(|a| a == option) {
                        args.extend([option.to_string(), value.to_string()]);
                    }
                }
                args.extend(extra.iter().cloned());
                args
            },
        )
    }
}

/// A port the OS considers free right now. Nothing listens on it once this returns, so the
/// port can be lost before a server binds it; [`Server::spawn`] retries.
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

/// `kill -<signal> <pid>` (e.g. `STOP`, `CONT`).
pub fn send_signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("cannot run kill");
    assert!(status.success(), "kill -{signal} {pid} failed");
}
