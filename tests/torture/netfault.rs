//! What the network and clock scenarios share (`partitions.rs`, `skew.rs`, `clockjump.rs`,
//! `slowlink.rs`): an external fenced resource, the clients that use it, their history of
//! grants and writes, the checks over that history, a private network namespace, a delaying
//! TCP proxy, and the table each scenario prints.
//!
//! Why a resource outside Redis here (the other scenarios fence a list inside the server):
//! in a partition or a failover the lock service itself is what splits, so the resource must
//! be one place that every client reaches, like the database a lock protects. [`Fenced`]
//! keeps, per key, the largest token it accepted and refuses smaller ones.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::{Connection, Value};

/// Past a command's own wait, how long a client waits for a reply before it counts the call as
/// unanswered.
pub const SLACK: Duration = Duration::from_secs(2);

/// A resource that accepts a write only with a token at least the largest it accepted.
#[derive(Default)]
pub struct Fenced {
    keys: Mutex<BTreeMap<String, i64>>,
    pub accepted: AtomicU64,
    pub rejected: AtomicU64,
}

impl Fenced {
    pub fn write(&self, key: &str, token: i64) -> bool {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        let max = keys.entry(key.to_string()).or_insert(i64::MIN);
        if token >= *max {
            *max = token;
            self.accepted.fetch_add(1, Ordering::Relaxed);
            true
        } else {
            self.rejected.fetch_add(1, Ordering::Relaxed);
            false
        }
    }
}

/// A grant as its client saw it.
#[derive(Clone, Debug)]
pub struct Grant {
    pub key: String,
    pub owner: String,
    pub token: i64,
    /// The port of the server that answered.
    pub server: u16,
    pub invoke: Instant,
    pub complete: Instant,
    /// The ttl asked for, ms.
    pub ttl: i64,
}

/// A fenced write as its client saw it.
#[derive(Clone, Debug)]
pub struct FencedWrite {
    /// Index of its grant in [`Log::grants`].
    pub grant: usize,
    pub at: Instant,
    pub accepted: bool,
}

/// Everything the clients did.
#[derive(Default)]
pub struct Log {
    pub grants: Mutex<Vec<Grant>>,
    pub writes: Mutex<Vec<FencedWrite>>,
    /// Commands sent.
    pub ops: AtomicU64,
    /// Error replies (NOREPLICAS, READONLY, ...).
    pub errors: AtomicU64,
    /// Calls whose reply never came within their wait plus [`SLACK`].
    pub unanswered: AtomicU64,
    /// Calls that failed to connect or lost their connection.
    pub io_failures: AtomicU64,
    /// `BLOCK` acquires answered nil (timed out) and granted.
    pub waits_timed_out: AtomicU64,
    pub waits_granted: AtomicU64,
    /// The longest a `BLOCK` call took beyond its timeout, ms.
    pub wait_overrun_ms: AtomicU64,
}

impl Log {
    fn grant(&self, g: Grant) -> usize {
        let mut grants = self.grants.lock().unwrap_or_else(|e| e.into_inner());
        grants.push(g);
        grants.len() - 1
    }

    fn write(&self, w: FencedWrite) {
        self.writes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(w);
    }

    pub fn grants(&self) -> Vec<Grant> {
        self.grants
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn writes(&self) -> Vec<FencedWrite> {
        self.writes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Where a client connects; `None` while there is nowhere to go.
#[derive(Default)]
pub struct Target {
    addr: Mutex<Option<(String, u16)>>,
    generation: AtomicU64,
}

impl Target {
    pub fn new(host: &str, port: u16) -> Arc<Target> {
        let t = Target::default();
        t.set(Some((host, port)));
        Arc::new(t)
    }

    pub fn set(&self, addr: Option<(&str, u16)>) {
        *self.addr.lock().unwrap_or_else(|e| e.into_inner()) = addr.map(|(h, p)| (h.into(), p));
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    pub fn get(&self) -> (Option<(String, u16)>, u64) {
        let addr = self.addr.lock().unwrap_or_else(|e| e.into_inner()).clone();
        (addr, self.generation.load(Ordering::SeqCst))
    }
}

/// What one client does: take a lock on `{prefix}{0..keys}`, write the resource with its
/// token, maybe extend and write again, release (or walk away).
#[derive(Clone, Debug)]
pub struct ClientCfg {
    pub prefix: &'static str,
    pub keys: usize,
    pub ttl_ms: (i64, i64),
    /// `BLOCK` timeout range for half of the acquires; `None`: never block.
    pub block_ms: Option<(i64, i64)>,
    pub hold_ms: (u64, u64),
    pub extend_share: f64,
    pub expire_share: f64,
    /// How long past a command's own wait its reply may take before the call counts as
    /// unanswered.
    pub reply_slack: Duration,
}

impl Default for ClientCfg {
    fn default() -> ClientCfg {
        ClientCfg {
            prefix: "hot:",
            keys: 3,
            ttl_ms: (100, 400),
            block_ms: Some((50, 500)),
            hold_ms: (0, 30),
            extend_share: 0.3,
            expire_share: 0.1,
            reply_slack: SLACK,
        }
    }
}

/// One client thread, until `stop`.
pub struct Client {
    pub name: String,
    pub cfg: ClientCfg,
    pub target: Arc<Target>,
    pub fenced: Arc<Fenced>,
    pub log: Arc<Log>,
    pub stop: Arc<AtomicBool>,
    pub rng: StdRng,
    conn: Option<(Connection, u64, u16)>,
    n: u64,
}

impl Client {
    #[allow(clippy::too_many_arguments)]
    pub fn spawn(
        name: String,
        cfg: ClientCfg,
        target: Arc<Target>,
        fenced: Arc<Fenced>,
        log: Arc<Log>,
        stop: Arc<AtomicBool>,
        seed: u64,
    ) -> thread::JoinHandle<()> {
        let c = Client {
            name,
            cfg,
            target,
            fenced,
            log,
            stop,
            rng: StdRng::seed_from_u64(seed),
            conn: None,
            n: 0,
        };
        thread::spawn(move || c.run())
    }

    /// `n` clients named `{prefix}0 .. {prefix}(n-1)` with the same configuration, seeded
    /// `seed`, `seed + 1`...
    #[allow(clippy::too_many_arguments)]
    pub fn spawn_many(
        prefix: &str,
        n: usize,
        cfg: &ClientCfg,
        target: &Arc<Target>,
        fenced: &Arc<Fenced>,
        log: &Arc<Log>,
        stop: &Arc<AtomicBool>,
        seed: u64,
    ) -> Vec<thread::JoinHandle<()>> {
        (0..n)
            .map(|i| {
                Client::spawn(
                    format!("{prefix}{i}"),
                    cfg.clone(),
                    target.clone(),
                    fenced.clone(),
                    log.clone(),
                    stop.clone(),
                    seed + i as u64,
                )
            })
            .collect()
    }

    fn run(mut self) {
        while !self.stop.load(Ordering::Relaxed) {
            self.n += 1;
            let key = format!(
                "{}{}",
                self.cfg.prefix,
                self.rng.gen_range(0..self.cfg.keys)
            );
            let owner = format!("{}-{}", self.name, self.n);
            let ttl = self.rng.gen_range(self.cfg.ttl_ms.0..=self.cfg.ttl_ms.1);
            let block = self
                .cfg
                .block_ms
                .filter(|_| self.rng.gen_bool(0.5))
                .map(|(a, b)| self.rng.gen_range(a..=b));
            let mut cmd = redis::cmd("LOCK.ACQUIRE");
            cmd.arg(&key).arg(&owner).arg(ttl);
            if let Some(b) = block {
                cmd.arg("BLOCK").arg(b);
            }
            let wait = Duration::from_millis(block.unwrap_or(0) as u64);
            let invoke = Instant::now();
            let sent = self.send(&cmd, wait);
            if block.is_some() {
                let over = invoke.elapsed().saturating_sub(wait).as_millis() as u64;
                self.log.wait_overrun_ms.fetch_max(over, Ordering::Relaxed);
            }
            let Some((reply, server)) = sent else {
                thread::sleep(Duration::from_millis(5));
                continue;
            };
            let token = match reply {
                Value::Int(t) => t,
                _ => {
                    if block.is_some() && reply == Value::Nil {
                        self.log.waits_timed_out.fetch_add(1, Ordering::Relaxed);
                    }
                    thread::sleep(Duration::from_millis(self.rng.gen_range(0..=3)));
                    continue;
                }
            };
            if block.is_some() {
                self.log.waits_granted.fetch_add(1, Ordering::Relaxed);
            }
            let g = self.log.grant(Grant {
                key: key.clone(),
                owner: owner.clone(),
                token,
                server,
                invoke,
                complete: Instant::now(),
                ttl,
            });
            self.use_lock(g, &key, &owner, ttl, token);
        }
    }

    fn use_lock(&mut self, g: usize, key: &str, owner: &str, ttl: i64, token: i64) {
        self.write(g, key, token);
        self.sleep(self.cfg.hold_ms);
        if self.rng.gen_bool(self.cfg.extend_share) {
            let mut extend = redis::cmd("LOCK.EXTEND");
            extend.arg(key).arg(owner).arg(ttl);
            if let Some((Value::Int(1), _)) = self.send(&extend, Duration::ZERO) {
                self.write(g, key, token);
                self.sleep(self.cfg.hold_ms);
            }
        }
        if !self.rng.gen_bool(self.cfg.expire_share) {
            let mut release = redis::cmd("LOCK.RELEASE");
            release.arg(key).arg(owner);
            let _ = self.send(&release, Duration::ZERO);
        }
    }

    fn write(&mut self, grant: usize, key: &str, token: i64) {
        let accepted = self.fenced.write(key, token);
        self.log.write(FencedWrite {
            grant,
            at: Instant::now(),
            accepted,
        });
    }

    fn sleep(&mut self, range: (u64, u64)) {
        let ms = self.rng.gen_range(range.0..=range.1);
        if ms > 0 {
            thread::sleep(Duration::from_millis(ms));
        }
    }

    /// Send `cmd` (which may wait `wait` on the server); the reply and the server's port, or
    /// `None` if nothing came back (counted in the log).
    fn send(&mut self, cmd: &redis::Cmd, wait: Duration) -> Option<(Value, u16)> {
        let (addr, generation) = self.target.get();
        let (host, port) = addr?;
        let mut conn = match self.conn.take() {
            Some((c, made_for, p)) if made_for == generation && p == port => c,
            _ => match connect(&host, port, Duration::from_millis(300)) {
                Ok(c) => c,
                Err(_) => {
                    self.log.io_failures.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
            },
        };
        let _ = conn.set_read_timeout(Some(wait + self.cfg.reply_slack));
        self.log.ops.fetch_add(1, Ordering::Relaxed);
        match cmd.query::<Value>(&mut conn) {
            Ok(v) => {
                self.conn = Some((conn, generation, port));
                Some((v, port))
            }
            Err(e) if e.kind() == redis::ErrorKind::ExtensionError || e.code().is_some() => {
                self.log.errors.fetch_add(1, Ordering::Relaxed);
                self.conn = Some((conn, generation, port));
                None
            }
            Err(e) if e.is_timeout() => {
                self.log.unanswered.fetch_add(1, Ordering::Relaxed);
                None
            }
            Err(_) => {
                self.log.io_failures.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }
}

/// A connection to `host:port` with a connect timeout.
pub fn connect(host: &str, port: u16, timeout: Duration) -> redis::RedisResult<Connection> {
    let client = redis::Client::open(format!("redis://{host}:{port}/"))?;
    let conn = client.get_connection_with_timeout(timeout)?;
    conn.set_write_timeout(Some(SLACK))?;
    Ok(conn)
}

// --- Checks ---------------------------------------------------------------------------------

/// Grants of one server that completed before another grant began and carry a larger or equal
/// token: the tokens went back in real time. Grants of different servers count too (a
/// failover). Returns the count and up to three examples.
pub fn tokens_back_in_time(grants: &[Grant]) -> (u64, Vec<String>) {
    let mut by_complete: Vec<&Grant> = grants.iter().collect();
    by_complete.sort_by_key(|g| g.complete);
    let mut by_invoke: Vec<&Grant> = grants.iter().collect();
    by_invoke.sort_by_key(|g| g.invoke);
    let (mut i, mut max): (usize, Option<&Grant>) = (0, None);
    let (mut count, mut examples) = (0, Vec::new());
    for g in by_invoke {
        while i < by_complete.len() && by_complete[i].complete < g.invoke {
            if max.is_none_or(|m| by_complete[i].token > m.token) {
                max = Some(by_complete[i]);
            }
            i += 1;
        }
        if let Some(m) = max {
            if m.token >= g.token {
                count += 1;
                if examples.len() < 3 {
                    examples.push(format!(
                        "{} got {} from :{} after {} got {} from :{}",
                        g.owner, g.token, g.server, m.owner, m.token, m.server
                    ));
                }
            }
        }
    }
    (count, examples)
}

/// The same token granted to two owners.
pub fn duplicate_tokens(grants: &[Grant]) -> u64 {
    let mut seen: BTreeMap<i64, &str> = BTreeMap::new();
    let mut dups = 0;
    for g in grants {
        if let Some(o) = seen.insert(g.token, &g.owner) {
            if o != g.owner {
                dups += 1;
            }
        }
    }
    dups
}

// --- Namespaces, packet filters, proxies ---------------------------------------------------

// A private network namespace, and running a command, come from the harness crate.
pub use crate::common::netns::{in_private_netns, sh};

/// Cut 127.0.0.1:`port` off: packets to or from it are dropped (no reset: peers see silence,
/// as in a real partition). 127.0.0.2:`port` still works, for the clients on its side.
pub fn isolate(port: u16, on: bool) {
    let p = port.to_string();
    let action = if on { "-I" } else { "-D" };
    for (dir, addr) in [("--dport", "-d"), ("--sport", "-s")] {
        sh(&[
            "iptables",
            action,
            "INPUT",
            "-p",
            "tcp",
            addr,
            "127.0.0.1",
            dir,
            &p,
            "-j",
            "DROP",
        ]);
    }
}

/// A TCP proxy on 127.0.0.1 that delays every chunk by `delay` plus up to `jitter` (in order),
/// and can freeze all traffic for a while. Stops when dropped.
pub struct SlowLink {
    pub port: u16,
    frozen_until: Arc<Mutex<Option<Instant>>>,
    stop: Arc<AtomicBool>,
}

impl SlowLink {
    pub fn start(upstream: u16, delay: Duration, jitter: Duration) -> SlowLink {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().unwrap().port();
        let frozen_until = Arc::new(Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        let (frozen, stopping) = (frozen_until.clone(), stop.clone());
        thread::spawn(move || {
            let mut seed = 1u64;
            while !stopping.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((down, _)) => {
                        let Ok(up) = TcpStream::connect(("127.0.0.1", upstream)) else {
                            continue;
                        };
                        let _ = down.set_nonblocking(false);
                        for (from, to) in [
                            (down.try_clone().unwrap(), up.try_clone().unwrap()),
                            (up, down),
                        ] {
                            seed += 1;
                            pipe(from, to, delay, jitter, frozen.clone(), seed);
                        }
                    }
                    Err(_) => thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        SlowLink {
            port,
            frozen_until,
            stop,
        }
    }

    /// Hold every byte in both directions until `d` from now.
    pub fn freeze(&self, d: Duration) {
        *self.frozen_until.lock().unwrap() = Some(Instant::now() + d);
    }
}

impl Drop for SlowLink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Copy `from` to `to`, each chunk released `delay + rand(0..jitter)` after it was read, never
/// before the previous one, and not while frozen.
fn pipe(
    mut from: TcpStream,
    mut to: TcpStream,
    delay: Duration,
    jitter: Duration,
    frozen: Arc<Mutex<Option<Instant>>>,
    seed: u64,
) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    thread::spawn(move || {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut last = Instant::now();
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let j = rng.gen_range(0..=jitter.as_micros() as u64);
                    let at = (Instant::now() + delay + Duration::from_micros(j)).max(last);
                    last = at;
                    if tx.send((at, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
    });
    thread::spawn(move || {
        for (at, bytes) in rx {
            loop {
                let until = (*frozen.lock().unwrap()).map_or(at, |f| f.max(at));
                let now = Instant::now();
                if now >= until {
                    break;
                }
                thread::sleep((until - now).min(Duration::from_millis(20)));
            }
            if to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
    });
}

// --- The table ------------------------------------------------------------------------------

/// One scenario's line in RELIABILITY.md.
#[derive(Default)]
pub struct Row {
    pub scenario: String,
    pub secs: f64,
    pub faults: Vec<String>,
    pub grants_lost: Option<u64>,
    /// Check -> violations.
    pub checks: Vec<(String, u64)>,
    pub notes: Vec<String>,
}

impl Row {
    pub fn violations(&self) -> u64 {
        self.checks.iter().map(|(_, v)| v).sum()
    }

    /// Print the table of one scenario, with the client counters of `log` and `fenced`.
    pub fn print(&self, log: &Log, fenced: &Fenced) {
        let g = log.grants.lock().unwrap().len();
        println!("\n### {} ({:.1} s)\n", self.scenario, self.secs);
        println!("| what | figure |\n|---|---|");
        println!(
            "| operations | {} sent: {g} grants, {} error replies, {} unanswered, {} connection failures |",
            log.ops.load(Ordering::Relaxed),
            log.errors.load(Ordering::Relaxed),
            log.unanswered.load(Ordering::Relaxed),
            log.io_failures.load(Ordering::Relaxed),
        );
        println!(
            "| waiters | {} granted, {} timed out; longest past its BLOCK timeout {} ms |",
            log.waits_granted.load(Ordering::Relaxed),
            log.waits_timed_out.load(Ordering::Relaxed),
            log.wait_overrun_ms.load(Ordering::Relaxed)
        );
        println!(
            "| fenced writes | {} accepted, {} refused (token below the largest accepted) |",
            fenced.accepted.load(Ordering::Relaxed),
            fenced.rejected.load(Ordering::Relaxed),
        );
        println!("| faults injected | {} |", self.faults.join("; "));
        if let Some(lost) = self.grants_lost {
            println!("| acknowledged grants lost | {lost} |");
        }
        for (check, v) in &self.checks {
            println!("| violations: {check} | {v} |");
        }
        for n in &self.notes {
            println!("| note | {n} |");
        }
    }
}

/// Seconds of workload: `TORTURE_SECS` (as for every scenario) or the short default.
pub fn secs() -> f64 {
    crate::run::workload_secs()
}

/// The scenario's seed: `TORTURE_SEED` or a random one (printed).
pub fn seed(name: &str) -> u64 {
    let seed = match std::env::var("TORTURE_SEED") {
        Ok(s) => s.parse().expect("TORTURE_SEED must be an integer"),
        Err(_) => rand::random::<u64>() % 1_000_000,
    };
    println!("{name}: seed {seed}");
    seed
}

/// `INFO lock` `lock_token_high_water`.
pub fn high_water(c: &mut Connection) -> i64 {
    crate::faults::high_water(c).expect("lock_token_high_water")
}
