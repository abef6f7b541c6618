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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::{Cmd, Connection, ConnectionLike, Value};

use crate::history::{Entry, FileSink, Micros, Mode, Op, Outcome, Sink};

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

impl Worker {
    pub fn new(
        name: String,
        cfg: Config,
        target: Arc<Target>,
        sink: Arc<dyn Sink>,
        stop: Arc<AtomicBool>,
        seed: u64,
    ) -> Worker {
        Worker {
            name,
            cfg,
            target,
            sink,
            stop,
            rng: StdRng::seed_from_u64(seed),
            conn: None,
            attempts: 0,
            writes: 0,
            giving_up: false,
        }
    }

    /// Take locks until told to stop.
    pub fn run(mut self) {
        while !self.stop.load(Ordering::Relaxed) {
            let i = self.rng.gen_range(0..self.cfg.keys);
            let key = lock_key(i);
            let ttl = self.rng.gen_range(self.cfg.ttl_ms.0..=self.cfg.ttl_ms.1);
            // Drawn only when shared acquires are configured, so the other scenarios' seeds
            // make the same choices as before shared holders existed.
            let mode = match self.cfg.shared_share > 0.0 && self.rng.gen_bool(self.cfg.shared_share)
            {
                false => Mode::Exclusive,
                true => Mode::Shared {
                    limit: self
                        .cfg
                        .shared_limits
                        .get(i % self.cfg.shared_limits.len().max(1))
                        .copied(),
                },
            };
            self.attempts += 1;
            let owner = format!("{}-{}", self.name, self.attempts);
            if self.cfg.keys >= 2 && self.rng.gen_bool(self.cfg.multi_share) {
                let n = self.rng.gen_range(2..=self.cfg.keys.min(3));
                let keys: Vec<String> = rand::seq::index::sample(&mut self.rng, self.cfg.keys, n)
                    .into_iter()
                    .map(lock_key)
                    .collect();
                let owner = format!("{owner}{MULTI_SUFFIX}");
                match self.macquire(&keys, &owner, ttl) {
                    Some(tokens) => {
                        for (key, token) in keys.iter().zip(tokens) {
                            self.hold(key, &owner, ttl, token, Mode::Exclusive);
                        }
                    }
                    None => self.sleep_ms((0, 3)),
                }
                continue;
            }
            match self.acquire(&key, &owner, ttl, mode) {
                Some(token) => self.hold(&key, &owner, ttl, token, mode),
                // Refused, or the wait timed out: back off a little so that non-blocking
                // callers do not spin.
                None => self.sleep_ms((0, 3)),
            }
        }
    }

    fn sleep_ms(&mut self, range: (u64, u64)) {
        let ms = self.rng.gen_range(range.0..=range.1);
        if ms > 0 {
            thread::sleep(Duration::from_millis(ms));
        }
    }

    /// A connection to the current target, made if needed; `None` once told to stop.
    fn take_conn(&mut self) -> Option<(Connection, u64)> {
        loop {
            let (port, generation) = self.target.get();
            if let Some((conn, made_for)) = self.conn.take() {
                if made_for == generation {
                    return Some((conn, made_for));
                }
            }
            if self.stop.load(Ordering::Relaxed) {
                return None;
            }
            match port.map(|p| connect(p, &self.name, Duration::from_millis(500))) {
                Some(Ok(conn)) => return Some((conn, generation)),
                // The server is down or being replaced: try again shortly.
                _ => thread::sleep(Duration::from_millis(5)),
            }
        }
    }

    /// Send `cmd` and read its reply; the connection is dropped if no reply came.
    fn send(&mut self, cmd: &Cmd, timeout: Duration) -> Option<Reply> {
        let (mut conn, generation) = self.take_conn()?;
        let _ = conn.set_read_timeout(Some(timeout));
        let reply = match conn.req_command(cmd) {
            Ok(Value::ServerError(e)) => Reply::Error(match e.details() {
                Some(d) => format!("{} {d}", e.code()),
                None => e.code().to_string(),
            }),
            Ok(v) => Reply::Value(v),
            Err(e) if e.is_timeout() && self.giving_up => Reply::Lost(GAVE_UP.to_string()),
            Err(e) if e.is_timeout() => Reply::Lost(format!("{NO_REPLY} after {timeout:?}: {e})")),
            Err(e) if e.is_io_error() || e.is_connection_dropped() => {
                Reply::Lost(format!("(no reply: {e})"))
            }
            Err(e) => Reply::Error(e.to_string()),
        };
        if !matches!(reply, Reply::Lost(_)) {
            self.conn = Some((conn, generation));
        }
        Some(reply)
    }

    /// Run one recorded operation: `cmd` (the write, for a read-modify-write whose read was
    /// sent at `invoke`). `None` if the worker is stopping and nothing was sent.
    #[allow(clippy::too_many_arguments)]
    fn op(
        &mut self,
        key: &str,
        owner: &str,
        op: Op,
        token: Option<i64>,
        cmd: &Cmd,
        timeout: Duration,
        invoke: Option<Micros>,
    ) -> Option<(Outcome, Option<i64>)> {
        // Connect first: time spent reconnecting (a server being restarted) is not part of
        // the operation, and nothing is recorded if the worker stops meanwhile.
        let conn = self.take_conn()?;
        self.conn = Some(conn);
        let invoke = invoke.unwrap_or_else(|| self.sink.now());
        let mut entry = Entry {
            id: 0,
            client: self.name.clone(),
            key: key.to_string(),
            owner: owner.to_string(),
            op,
            invoke,
            complete: invoke,
            wall_ms: crate::history::wall_us() / 1000,
            outcome: Outcome::Unknown,
            token,
            reply: String::new(),
        };
        let id = self.sink.begin(&entry);
        let Some(reply) = self.send(cmd, timeout) else {
            // The target changed under us and the worker is stopping: nothing was sent.
            entry.outcome = Outcome::Fail;
            entry.reply = "(not sent: stopping)".to_string();
            self.sink.end(id, entry);
            return None;
        };
        entry.complete = self.sink.now();
        entry.outcome = classify(&entry.op, &reply);
        entry.reply = reply.text();
        if entry.op.is_acquire() {
            entry.token = (entry.outcome == Outcome::Ok)
                .then(|| reply.int())
                .flatten();
        }
        let result = (entry.outcome, entry.token);
        self.sink.end(id, entry);
        Some(result)
    }

    /// `LOCK.ACQUIRE` in `mode`, blocking or not; after a lost reply, one retry as the same
    /// owner (which answers the same token if the first one was granted). Returns the token.
    fn acquire(&mut self, key: &str, owner: &str, ttl: i64, mode: Mode) -> Option<i64> {
        let block = self.rng.gen_bool(self.cfg.block_share).then(|| {
            self.rng
                .gen_range(self.cfg.block_ms.0..=self.cfg.block_ms.1)
        });
        let give_up = block.is_some() && self.rng.gen_bool(self.cfg.disconnect_share);
        let mut cmd = acquire_cmd(key, owner, ttl, mode);
        if let Some(b) = block {
            cmd.arg("BLOCK").arg(b);
        }
        let timeout = match block {
            Some(b) if give_up => {
                Duration::from_millis(self.rng.gen_range(1..=(b as u64 / 2).max(1)))
            }
            Some(b) => Duration::from_millis(b as u64) + SLACK,
            None => SLACK,
        };
        let started = self.sink.now();
        self.giving_up = give_up;
        let sent = self.op(
            key,
            owner,
            Op::Acquire { ttl, block, mode },
            None,
            &cmd,
            timeout,
            None,
        );
        self.giving_up = false;
        let (outcome, token) = sent?;
        if give_up && outcome == Outcome::Unknown {
            self.sink.client_fault(
                "waiter disconnected before its BLOCK timeout",
                started,
                self.sink.now(),
                format!("{owner} on {key}"),
            );
        }
        match outcome {
            Outcome::Ok => token,
            Outcome::Fail => None,
            Outcome::Unknown => {
                let retry = acquire_cmd(key, owner, ttl, mode);
                let (outcome, token) = self.op(
                    key,
                    owner,
                    Op::Acquire {
                        ttl,
                        block: None,
                        mode,
                    },
                    None,
                    &retry,
                    SLACK,
                    None,
                )?;
                (outcome == Outcome::Ok).then_some(token).flatten()
            }
        }
    }

    /// `LOCK.MACQUIRE` on `keys`, blocking or not, recorded as one acquire entry per key
    /// (same owner, same times, each with its own token). A refusal (nil) is followed by a
    /// `LOCK.MRELEASE` of the same keys by the same owner, recorded as one release entry with no
    /// token: it must release 0 (the checker's `multi-all-or-nothing`). A lost reply is not
    /// retried: a grant nobody heard of expires. Returns the tokens.
    fn macquire(&mut self, keys: &[String], owner: &str, ttl: i64) -> Option<Vec<i64>> {
        let block = self.rng.gen_bool(self.cfg.block_share).then(|| {
            self.rng
                .gen_range(self.cfg.block_ms.0..=self.cfg.block_ms.1)
        });
        let mut cmd = redis::cmd("LOCK.MACQUIRE");
        cmd.arg(keys.len()).arg(keys).arg(owner).arg(ttl);
        if let Some(b) = block {
            cmd.arg("BLOCK").arg(b);
        }
        let timeout = block.map_or(SLACK, |b| Duration::from_millis(b as u64) + SLACK);
        let conn = self.take_conn()?;
        self.conn = Some(conn);
        let invoke = self.sink.now();
        let mut entries: Vec<Entry> = keys
            .iter()
            .map(|key| Entry {
                id: 0,
                client: self.name.clone(),
                key: key.clone(),
                owner: owner.to_string(),
                op: Op::Acquire {
                    ttl,
                    block,
                    mode: Mode::Exclusive,
                },
                invoke,
                complete: invoke,
                wall_ms: crate::history::wall_us() / 1000,
                outcome: Outcome::Unknown,
                token: None,
                reply: String::new(),
            })
            .collect();
        let ids: Vec<u64> = entries.iter().map(|e| self.sink.begin(e)).collect();
        let reply = self.send(&cmd, timeout);
        let complete = self.sink.now();
        let tokens: Option<Vec<i64>> = match &reply {
            Some(Reply::Value(Value::Array(items))) if items.len() == keys.len() => items
                .iter()
                .map(|v| match v {
                    Value::Int(t) if *t > 0 => Some(*t),
                    _ => None,
                })
                .collect(),
            _ => None,
        };
        let outcome = match (&reply, &tokens) {
            (_, Some(_)) => Outcome::Ok,
            (Some(Reply::Lost(_)), None) => Outcome::Unknown,
            _ => Outcome::Fail,
        };
        let text = reply
            .as_ref()
            .map_or("(not sent: stopping)".to_string(), Reply::text);
        for (i, (id, mut entry)) in ids.into_iter().zip(entries.drain(..)).enumerate() {
            entry.complete = complete;
            entry.outcome = outcome;
            entry.token = tokens.as_ref().map(|t| t[i]);
            entry.reply = text.clone();
            self.sink.end(id, entry);
        }
        if matches!(reply, Some(Reply::Value(Value::Nil))) {
            let mut probe = redis::cmd("LOCK.MRELEASE");
            probe.arg(keys.len()).arg(keys).arg(owner);
            let _ = self.op(
                &keys.join(" "),
                owner,
                Op::Release,
                None,
                &probe,
                SLACK,
                None,
            );
        }
        tokens
    }

    /// Use a granted lock: (`WAIT`), write (read, when shared), hold, maybe extend and write
    /// again, then release or walk away and let it expire. Abandons the hold when an
    /// operation's reply is lost.
    fn hold(&mut self, key: &str, owner: &str, ttl: i64, token: i64, mode: Mode) {
        if self.cfg.wait_replicas {
            let mut wait = redis::cmd("WAIT");
            wait.arg(1).arg(1000);
            let timeout = Duration::from_secs(1) + SLACK;
            // Whatever WAIT answers, go on: the checker decides what an acknowledgement buys.
            match self.op(key, owner, Op::Wait, Some(token), &wait, timeout, None) {
                Some((Outcome::Unknown, _)) | None => return,
                Some(_) => {}
            }
        }
        for _ in 0..self.rng.gen_range(1..=2) {
            if !self.use_resource(key, owner, ttl, token, mode) {
                return;
            }
        }
        self.sleep_ms(self.cfg.hold_ms);
        if self.rng.gen_bool(self.cfg.extend_share) {
            let mut extend = redis::cmd("LOCK.EXTEND");
            extend.arg(key).arg(owner).arg(ttl);
            let extended = self.op(
                key,
                owner,
                Op::Extend { ttl },
                Some(token),
                &extend,
                SLACK,
                None,
            );
            match extended {
                Some((Outcome::Ok, _)) => {
                    if !self.use_resource(key, owner, ttl, token, mode) {
                        return;
                    }
                    self.sleep_ms(self.cfg.hold_ms);
                }
                Some((Outcome::Fail, _)) => {}
                _ => return,
            }
        }
        if self.rng.gen_bool(self.cfg.expire_share) {
            return;
        }
        let mut release = redis::cmd("LOCK.RELEASE");
        release.arg(key).arg(owner);
        let _ = self.op(key, owner, Op::Release, Some(token), &release, SLACK, None);
    }

    /// What a holder does with the resources: an exclusive holder writes, a shared one only
    /// reads (see the module docs). False if a reply was lost.
    fn use_resource(&mut self, key: &str, owner: &str, ttl: i64, token: i64, mode: Mode) -> bool {
        if !mode.is_shared() {
            return self.write(key, owner, ttl, token);
        }
        let mut eval = redis::cmd("EVAL");
        eval.arg(FENCED_READ)
            .arg(2)
            .arg(key)
            .arg(fenced_key(key))
            .arg(token);
        let read = self.op(key, owner, Op::FencedRead, Some(token), &eval, SLACK, None);
        matches!(read, Some((Outcome::Ok | Outcome::Fail, _)))
    }

    /// One read-modify-write of each resource while believing `token` is held: read both,
    /// wait (maybe pause past the ttl), write both. False if a reply was lost.
    fn write(&mut self, key: &str, owner: &str, ttl: i64, token: i64) -> bool {
        let (list, counter) = (fenced_key(key), plain_key(key));
        let fenced_invoke = self.sink.now();
        let Some(Reply::Value(Value::Int(read_len))) =
            self.send(redis::cmd("LLEN").arg(&list), SLACK)
        else {
            return false;
        };
        let plain_invoke = self.sink.now();
        let read = match self.send(redis::cmd("GET").arg(&counter), SLACK) {
            Some(Reply::Value(Value::Nil)) => 0,
            Some(Reply::Value(Value::BulkString(b))) => {
                match String::from_utf8_lossy(&b).parse::<i64>() {
                    Ok(n) => n,
                    Err(_) => return false,
                }
            }
            _ => return false,
        };
        self.sleep_ms(self.cfg.gap_ms);
        if self.cfg.pause_share > 0.0 && self.rng.gen_bool(self.cfg.pause_share) {
            let started = self.sink.now();
            let pause = ttl as u64 + self.rng.gen_range(20..=60);
            thread::sleep(Duration::from_millis(pause));
            self.sink.client_fault(
                "holder paused past its ttl (thread sleep)",
                started,
                self.sink.now(),
                format!("{owner} token {token} on {key}, {pause} ms"),
            );
        }
        self.writes += 1;
        let tag = format!("{token}|{read_len}|{owner}|{}.{}", self.name, self.writes);
        let mut eval = redis::cmd("EVAL");
        eval.arg(FENCED_APPEND)
            .arg(2)
            .arg(key)
            .arg(&list)
            .arg(token)
            .arg(&tag);
        let fenced = Op::FencedWrite {
            read: read_len,
            tag,
        };
        match self.op(
            key,
            owner,
            fenced,
            Some(token),
            &eval,
            SLACK,
            Some(fenced_invoke),
        ) {
            Some((Outcome::Unknown, _)) | None => return false,
            Some(_) => {}
        }
        let mut set = redis::cmd("SET");
        set.arg(&counter).arg(read + 1);
        let plain = Op::UnfencedWrite { read };
        matches!(
            self.op(
                key,
                owner,
                plain,
                Some(token),
                &set,
                SLACK,
                Some(plain_invoke)
            ),
            Some((Outcome::Ok | Outcome::Fail, _))
        )
    }
}

/// `LOCK.ACQUIRE key owner ttl` with `mode`'s options.
fn acquire_cmd(key: &str, owner: &str, ttl: i64, mode: Mode) -> Cmd {
    let mut cmd = redis::cmd("LOCK.ACQUIRE");
    cmd.arg(key).arg(owner).arg(ttl);
    if let Mode::Shared { limit } = mode {
        cmd.arg("SHARED");
        if let Some(n) = limit {
            cmd.arg("LIMIT").arg(n);
        }
    }
    cmd
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

/// The environment variable that turns the test binary into a holder process.
pub const HOLDER_ENV: &str = "TORTURE_HOLDER";

/// What a holder process is told, as `HOLDER_ENV`'s value:
/// `port keys name secs ttl_min ttl_max seed history-file`.
pub struct HolderSpec {
    pub port: u16,
    pub keys: usize,
    pub name: String,
    pub secs: f64,
    pub ttl_ms: (i64, i64),
    pub seed: u64,
    pub file: String,
}

impl HolderSpec {
    pub fn encode(&self) -> String {
        format!(
            "{} {} {} {} {} {} {} {}",
            self.port,
            self.keys,
            self.name,
            self.secs,
            self.ttl_ms.0,
            self.ttl_ms.1,
            self.seed,
            self.file
        )
    }

    fn decode(s: &str) -> Option<HolderSpec> {
        let f: Vec<&str> = s.splitn(8, ' ').collect();
        Some(HolderSpec {
            port: f.first()?.parse().ok()?,
            keys: f.get(1)?.parse().ok()?,
            name: f.get(2)?.to_string(),
            secs: f.get(3)?.parse().ok()?,
            ttl_ms: (f.get(4)?.parse().ok()?, f.get(5)?.parse().ok()?),
            seed: f.get(6)?.parse().ok()?,
            file: f.get(7)?.to_string(),
        })
    }
}

/// The body of a holder process: one worker for `secs`, history to a file. It spends most of
/// each hold between a write's read and its write, so that a `SIGSTOP` usually lands there.
/// Does nothing when `HOLDER_ENV` is not set (a normal test run).
pub fn holder_process_main() {
    let Ok(spec) = std::env::var(HOLDER_ENV) else {
        return;
    };
    let spec = HolderSpec::decode(&spec).unwrap_or_else(|| panic!("bad {HOLDER_ENV}: {spec:?}"));
    let cfg = Config {
        workers: 1,
        keys: spec.keys,
        ttl_ms: spec.ttl_ms,
        hold_ms: (0, 5),
        gap_ms: (10, 30),
        ..Config::default()
    };
    let sink: Arc<dyn Sink> = Arc::new(FileSink::create(std::path::Path::new(&spec.file)));
    let stop = Arc::new(AtomicBool::new(false));
    let worker = Worker::new(
        spec.name.clone(),
        cfg,
        Target::new(spec.port),
        sink,
        stop.clone(),
        spec.seed,
    );
    let until = Instant::now() + Duration::from_secs_f64(spec.secs);
    let handle = thread::spawn(move || worker.run());
    while Instant::now() < until {
        thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    let _ = handle.join();
}
