//! The workload: clients that take locks, write two resources while they believe they hold
//! them, and record every operation in the history.
//!
//! One loop ([`Worker::run`]) serves both kinds of client: the test's own threads, which write
//! to the in-memory [`Recorder`](crate::history::Recorder), and holder *processes* (the test
//! binary re-executed, see [`holder_process_main`]) that the nemesis can `SIGSTOP` and
//! `SIGKILL`, which write to a [`FileSink`].
//!
//! Per lock key `lock:i` there are two resources:
//! - `res:i`, a list written only through [`FENCED_APPEND`], a Lua script that appends only if
//!   `LOCK.FENCE lock:i token` says the writer's token is the live one;
//! - `cnt:i`, a counter written with a plain `GET` then `SET`, no fence: what a client that
//!   trusts its lock without fencing does.
//!
//! Each write is a read-modify-write: read the resource, maybe stall (the "GC pause" past the
//! ttl), write. Two writes that read the same state while both windows were open lost an update.
//!
//! Shared holders (`SHARED`, `SHARED LIMIT n`: [`Config::shared_share`]) never write: many of
//! them hold a key at once, so appends from them would interleave and the checks that assume
//! one writer at a time (`resource-order`, `fenced-lost-updates`, the unfenced counter) would
//! report what the lock rightly allows. They read `res:i` through [`FENCED_READ`] instead:
//! only exclusive holders write it, so every read one shared hold's fence accepts must see the
//! same length (the checker's `shared-reads-stable`), and the write checks stay as they were.
//!
//! Here: the configuration, the target, replies and their outcomes, and starting the workers;
//! a worker's loop and calls in `worker.rs`, what it does with a lock in `lock_use.rs`, the
//! holder processes in `holders.rs`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::{Cmd, Connection, ConnectionLike, Value};

use crate::history::{Entry, FileSink, Micros, Mode, Op, Outcome, Sink};

mod holders;
mod lock_use;
mod worker;

pub use holders::*;
pub use lock_use::{write_step, Reads, Recording};

/// The fenced write. `KEYS[1]` lock key, `KEYS[2]` the resource list; `ARGV[1]` the writer's
/// token, `ARGV[2]` what to append. Returns 1 if appended, 0 if the token is not the live one.
pub const FENCED_APPEND: &str = "\
if redis.call('LOCK.FENCE', KEYS[1], ARGV[1]) == 1 then
  redis.call('RPUSH', KEYS[2], ARGV[2])
  return 1
end
return 0";

/// The fenced read of a shared holder. `KEYS[1]` lock key, `KEYS[2]` the resource list;
/// `ARGV[1]` the reader's token. Returns the list's length, or -1 if the token is not live.
pub const FENCED_READ: &str = "\
if redis.call('LOCK.FENCE', KEYS[1], ARGV[1]) == 1 then
  return redis.call('LLEN', KEYS[2])
end
return -1";

/// How long a reply may take beyond any wait the command itself asked for (`BLOCK`, `WAIT`).
/// Past it the client stops reading and records the call as unanswered (`NO_REPLY`), which
/// the checker counts as a violation: a healthy server answers in microseconds.
const SLACK: Duration = Duration::from_secs(2);

/// Reply text of a call the server did not answer within its wait plus [`SLACK`].
pub const NO_REPLY: &str = "(no reply: timed out";

/// Reply text of a `BLOCK` call the client itself abandoned early (`disconnect_share`).
pub const GAVE_UP: &str = "(no reply: the client gave up waiting and disconnected)";

pub fn lock_key(i: usize) -> String {
    format!("lock:{i}")
}

/// The fenced resource (a list) guarded by `lock`.
pub fn fenced_key(lock: &str) -> String {
    lock.replacen("lock:", "res:", 1)
}

/// The unfenced resource (a counter) guarded by `lock`.
pub fn plain_key(lock: &str) -> String {
    lock.replacen("lock:", "cnt:", 1)
}

/// What the workload does; every range is inclusive.
#[derive(Clone, Debug)]
pub struct Config {
    /// Client threads.
    pub workers: usize,
    /// Lock keys `lock:0 .. lock:{keys-1}`.
    pub keys: usize,
    /// Hold ttl, ms.
    pub ttl_ms: (i64, i64),
    /// Time spent holding after the writes, ms.
    pub hold_ms: (u64, u64),
    /// Share of acquires that use `BLOCK`.
    pub block_share: f64,
    /// `BLOCK` timeout, ms (never 0: every wait ends).
    pub block_ms: (i64, i64),
    /// Share of acquires that are `SHARED` (the rest are exclusive).
    pub shared_share: f64,
    /// `LIMIT` of the shared acquires: key `lock:i` takes `shared_limits[i % len]`, always the
    /// same, so the key's limit never conflicts; empty for `SHARED` without `LIMIT`.
    pub shared_limits: Vec<u64>,
    /// Share of holds extended once (with the same ttl, so the deadline only moves later).
    pub extend_share: f64,
    /// Share of holds left to expire instead of released.
    pub expire_share: f64,
    /// Share of writes with a "GC pause" past the ttl between the read and the write.
    pub pause_share: f64,
    /// Time between a write's read and its write, ms.
    pub gap_ms: (u64, u64),
    /// Share of `BLOCK` acquires whose client gives up (read timeout, then disconnects)
    /// before the `BLOCK` timeout.
    pub disconnect_share: f64,
    /// `WAIT 1 1000` after each grant.
    pub wait_replicas: bool,
    /// With `wait_replicas`: a grant that `WAIT` did not see acknowledged is released at once
    /// and never used, as the clients' `durable` option does.
    pub durable: bool,
    /// Share of lock attempts that take 2 or 3 keys (in random order) at once with
    /// `LOCK.MACQUIRE`; each key granted is then held on its own, one after the other. Their
    /// owners end in [`MULTI_SUFFIX`].
    pub multi_share: f64,
}

/// The end of the owner string of a `LOCK.MACQUIRE` attempt.
pub const MULTI_SUFFIX: &str = "-m";

impl Default for Config {
    fn default() -> Config {
        Config {
            workers: 6,
            keys: 3,
            ttl_ms: (40, 200),
            hold_ms: (0, 20),
            block_share: 0.5,
            block_ms: (20, 300),
            shared_share: 0.0,
            shared_limits: Vec::new(),
            extend_share: 0.25,
            expire_share: 0.15,
            pause_share: 0.0,
            gap_ms: (0, 2),
            disconnect_share: 0.0,
            wait_replicas: false,
            durable: false,
            multi_share: 0.0,
        }
    }
}

/// The server the workload talks to. `None` while it is down (between a kill and the restart
/// or promotion), so that no client connects to a port another test may have taken meanwhile.
pub struct Target {
    port: Mutex<Option<u16>>,
    /// Bumped on every change: clients drop connections made to an older target.
    generation: AtomicU64,
}

impl Target {
    pub fn new(port: u16) -> Arc<Target> {
        Arc::new(Target {
            port: Mutex::new(Some(port)),
            generation: AtomicU64::new(0),
        })
    }

    pub fn set(&self, port: Option<u16>) {
        *self.port.lock().unwrap_or_else(|e| e.into_inner()) = port;
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    fn get(&self) -> (Option<u16>, u64) {
        let port = *self.port.lock().unwrap_or_else(|e| e.into_inner());
        (port, self.generation.load(Ordering::SeqCst))
    }
}

/// A connection to 127.0.0.1:`port` named `name` (`CLIENT SETNAME`, so the nemesis can find
/// a client's waiters in `CLIENT LIST`).
pub fn connect(port: u16, name: &str, timeout: Duration) -> redis::RedisResult<Connection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let mut conn = client.get_connection_with_timeout(timeout)?;
    conn.set_read_timeout(Some(SLACK))?;
    conn.set_write_timeout(Some(SLACK))?;
    redis::cmd("CLIENT")
        .arg("SETNAME")
        .arg(name)
        .query::<()>(&mut conn)?;
    Ok(conn)
}

/// A reply as the history sees it.
enum Reply {
    Value(Value),
    /// An error reply: the server answered, nothing changed.
    Error(String),
    /// No reply: the connection failed or timed out.
    Lost(String),
}

impl Reply {
    fn text(&self) -> String {
        match self {
            Reply::Value(Value::Nil) => "nil".to_string(),
            Reply::Value(Value::Int(n)) => n.to_string(),
            Reply::Value(Value::Okay) => "OK".to_string(),
            Reply::Value(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Reply::Value(Value::SimpleString(s)) => s.clone(),
            Reply::Value(v) => format!("{v:?}"),
            Reply::Error(e) => e.clone(),
            Reply::Lost(e) => e.clone(),
        }
    }

    fn int(&self) -> Option<i64> {
        match self {
            Reply::Value(Value::Int(n)) => Some(*n),
            _ => None,
        }
    }
}

/// The outcome of `op` given its reply.
fn classify(op: &Op, reply: &Reply) -> Outcome {
    match reply {
        Reply::Lost(_) => Outcome::Unknown,
        Reply::Error(_) => Outcome::Fail,
        Reply::Value(v) => {
            let ok = match op {
                Op::Acquire { .. } => matches!(v, Value::Int(t) if *t > 0),
                Op::FencedRead => matches!(v, Value::Int(n) if *n >= 0),
                Op::Release | Op::Extend { .. } | Op::FencedWrite { .. } => *v == Value::Int(1),
                Op::Wait => matches!(v, Value::Int(n) if *n >= 1),
                Op::UnfencedWrite { .. } => *v == Value::Okay,
            };
            if ok {
                Outcome::Ok
            } else {
                Outcome::Fail
            }
        }
    }
}

/// One workload client.
pub struct Worker {
    /// `w3` or `proc7`: the history's client name and the connection's `CLIENT SETNAME`.
    name: String,
    cfg: Config,
    target: Arc<Target>,
    sink: Arc<dyn Sink>,
    stop: Arc<AtomicBool>,
    rng: StdRng,
    /// The open connection and the target generation it was made for.
    conn: Option<(Connection, u64)>,
    /// Locks attempted so far: owner strings are `{name}-{attempts}`.
    attempts: u64,
    /// Fenced writes so far: each write's tag is unique.
    writes: u64,
    /// The call in flight is a wait this client means to abandon early.
    giving_up: bool,
}

/// Start `cfg.workers` client threads `w0 .. wN` against `target`.
pub fn start_workers(
    cfg: &Config,
    target: &Arc<Target>,
    sink: Arc<dyn Sink>,
    stop: &Arc<AtomicBool>,
    seed: u64,
) -> Vec<thread::JoinHandle<()>> {
    (0..cfg.workers)
        .map(|i| {
            let worker = Worker::new(
                format!("w{i}"),
                cfg.clone(),
                target.clone(),
                sink.clone(),
                stop.clone(),
                seed.wrapping_add(i as u64),
            );
            thread::Builder::new()
                .name(format!("torture-w{i}"))
                .spawn(move || worker.run())
                .expect("cannot spawn a worker thread")
        })
        .collect()
}
