//! A session holder process: the test binary re-executed (`session_holder_process` in
//! `tests/torture.rs`, with [`SESSION_ENV`] set). It opens one `BOUND` session on a connection
//! of its own that stays idle, keeps it alive from a second connection, and from a third takes
//! locks in it (`LOCK.ACQUIRE key owner 60000 SESSION id [BLOCK ms]`, exclusive), writes the two
//! resources while it believes it holds them (as the workload's holders do: read, 10-30 ms, write)
//! and releases them. Its operations go to a history file ([`FileSink`]); what only a session
//! has goes to a side file of tab-separated lines, each written with one `write` call, wall-clock
//! microseconds:
//!
//! - `open id invoke complete`: the session is open.
//! - `send tag at`: the fenced write `tag` is about to be sent (`at` is before the `EVAL` left).
//! - `lost last-ok at reply`: `KEEPALIVE` answered `reply` (nil, or an error) at `at`; the last
//!   one that answered a ttl was sent at `last-ok` (the session was alive then).
//! - `close invoke complete reply`: `CLOSE` at the end of its life (the holds it released).
//!
//! Once its session is lost it stops taking locks and exits (the nemesis starts another); a
//! write it was about to send when it lost it is still sent, as a holder that trusts its lock
//! would: the fence must refuse it.
//!
//! A candidate (`Spec::campaign`, the election scenario) does the same on the one key
//! `lock:0`, the election, with a hold that lives by its session alone: it campaigns with
//! `LOCK.ACQUIRE lock:0 owner 0 SESSION id BLOCK 200..1000` (ttl 0: no deadline of its own),
//! leads for 1 to 6 writes with its term (the token), resigns (`RELEASE`) and campaigns again.
//! Its history records the campaign's ttl as [`HOLD_TTL_MS`], the checker's bound for "no
//! deadline of its own" (no candidate lives that long).

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::{Cmd, Connection, ConnectionLike, Value};

use crate::history::{wall_us, Entry, FileSink, Micros, Mode, Op, Outcome, Sink};
use crate::workload::{
    connect, fenced_key, lock_key, plain_key, write_step, Reads, Recording, NO_REPLY,
};

/// The environment variable that turns the test binary into a session holder process.
pub const SESSION_ENV: &str = "TORTURE_SESSION_HOLDER";

/// The sessions' ttl, ms: short, so that a pause or a cut outlives it quickly.
const SESSION_TTL_MS: u64 = 250;

/// How often the keepalive thread sends `KEEPALIVE` (six times per ttl).
const KEEPALIVE_EVERY: Duration = Duration::from_millis(40);

/// The holds' own ttl, ms: far beyond anything the scenario waits, so a hold ends by its
/// release or by its session's end, never by its own deadline.
pub const HOLD_TTL_MS: i64 = 60_000;

/// How long past a command's own wait a reply may take (as the workload's `SLACK`).
const SLACK: Duration = Duration::from_secs(2);

/// What a session holder is told, as [`SESSION_ENV`]'s value:
/// `port keys name secs lockdelay seed history-file side-file campaign`.
pub struct Spec {
    pub port: u16,
    pub keys: usize,
    pub name: String,
    pub secs: f64,
    pub lock_delay_ms: u64,
    pub seed: u64,
    pub history: String,
    pub side: String,
    /// A candidate of the election on `lock:0` (see the module docs).
    pub campaign: bool,
}

impl Spec {
    pub fn encode(&self) -> String {
        format!(
            "{} {} {} {} {} {} {} {} {}",
            self.port,
            self.keys,
            self.name,
            self.secs,
            self.lock_delay_ms,
            self.seed,
            self.history,
            self.side,
            u8::from(self.campaign)
        )
    }

    fn decode(s: &str) -> Option<Spec> {
        let f: Vec<&str> = s.split(' ').collect();
        Some(Spec {
            port: f.first()?.parse().ok()?,
            keys: f.get(1)?.parse().ok()?,
            name: f.get(2)?.to_string(),
            secs: f.get(3)?.parse().ok()?,
            lock_delay_ms: f.get(4)?.parse().ok()?,
            seed: f.get(5)?.parse().ok()?,
            history: f.get(6)?.to_string(),
            side: f.get(7)?.to_string(),
            campaign: *f.get(8)? == "1",
        })
    }
}

/// The side file (see the module docs).
struct Side(Mutex<File>);

impl Side {
    fn line(&self, fields: &[&str]) {
        let mut line = fields.join("\t");
        line.push('\n');
        let mut file = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // Best effort, as the history file: a missing line only makes the checks weaker.
        let _ = file.write_all(line.as_bytes());
    }
}

/// The body of a session holder process; does nothing when [`SESSION_ENV`] is not set.
pub fn session_holder_main() {
    let Ok(spec) = std::env::var(SESSION_ENV) else {
        return;
    };
    let spec = Spec::decode(&spec).unwrap_or_else(|| panic!("bad {SESSION_ENV}: {spec:?}"));
    let sink = Arc::new(FileSink::create(Path::new(&spec.history)));
    let side = Arc::new(Side(Mutex::new(
        File::create(&spec.side).unwrap_or_else(|e| panic!("cannot create {}: {e}", spec.side)),
    )));
    let name = spec.name.clone();
    let mut bound = connect(spec.port, &format!("{name}-bound"), SLACK)
        .unwrap_or_else(|e| panic!("{name}: the bound connection: {e}"));
    let mut open = redis::cmd("LOCK.SESSION");
    open.arg("OPEN").arg(SESSION_TTL_MS).arg("BOUND");
    if spec.lock_delay_ms > 0 {
        open.arg("LOCKDELAY").arg(spec.lock_delay_ms);
    }
    let opened = wall_us();
    let id: String = open
        .query(&mut bound)
        .unwrap_or_else(|e| panic!("{name}: LOCK.SESSION OPEN: {e}"));
    side.line(&["open", &id, &opened.to_string(), &wall_us().to_string()]);

    let (stop, lost) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let keepalive = {
        let (id, side, stop, lost) = (id.clone(), side.clone(), stop.clone(), lost.clone());
        let mut c = connect(spec.port, &format!("{name}-ka"), SLACK)
            .unwrap_or_else(|e| panic!("{name}: the keepalive connection: {e}"));
        // A cut lasts about one session ttl: its KEEPALIVE waits it out and is answered after.
        let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
        thread::spawn(move || keep_alive(&mut c, &id, opened, &side, &stop, &lost))
    };
    let worker = {
        let mut w = SessionWorker {
            name: name.clone(),
            id: id.clone(),
            port: spec.port,
            keys: spec.keys,
            campaign: spec.campaign,
            sink: sink.clone(),
            side: side.clone(),
            rng: StdRng::seed_from_u64(spec.seed),
            conn: None,
            attempts: 0,
            writes: 0,
        };
        let (stop, lost) = (stop.clone(), lost.clone());
        thread::spawn(move || w.run(&stop, &lost))
    };
    let until = Instant::now() + Duration::from_secs_f64(spec.secs);
    while Instant::now() < until && !lost.load(Ordering::Relaxed) {
        thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::Relaxed);
    let _ = worker.join();
    if !lost.load(Ordering::Relaxed) {
        let invoke = wall_us();
        let reply = match redis::cmd("LOCK.SESSION")
            .arg("CLOSE")
            .arg(&id)
            .query::<Value>(&mut bound)
        {
            Ok(Value::Int(n)) => n.to_string(),
            Ok(other) => format!("{other:?}"),
            Err(e) => format!("(no reply: {e})"),
        };
        side.line(&["close", &invoke.to_string(), &wall_us().to_string(), &reply]);
    }
    let _ = keepalive.join();
}

/// `KEEPALIVE` every [`KEEPALIVE_EVERY`] until told to stop or the session is gone.
fn keep_alive(
    c: &mut Connection,
    id: &str,
    opened: Micros,
    side: &Side,
    stop: &AtomicBool,
    lost: &AtomicBool,
) {
    let mut last_ok = opened;
    while !stop.load(Ordering::Relaxed) {
        thread::sleep(KEEPALIVE_EVERY);
        let invoke = wall_us();
        let reply = redis::cmd("LOCK.SESSION")
            .arg("KEEPALIVE")
            .arg(id)
            .query::<Value>(c);
        if let Ok(Value::Int(_)) = reply {
            last_ok = invoke;
            continue;
        }
        let reply = match reply {
            Ok(v) => format!("{v:?}"),
            Err(e) => format!("(no reply: {e})"),
        };
        side.line(&["lost", &last_ok.to_string(), &wall_us().to_string(), &reply]);
        lost.store(true, Ordering::Relaxed);
        return;
    }
}

/// The client that takes locks in the session.
struct SessionWorker {
    name: String,
    id: String,
    port: u16,
    keys: usize,
    campaign: bool,
    sink: Arc<FileSink>,
    side: Arc<Side>,
    rng: StdRng,
    conn: Option<Connection>,
    attempts: u64,
    writes: u64,
}

impl SessionWorker {
    fn run(&mut self, stop: &AtomicBool, lost: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) && !lost.load(Ordering::Relaxed) {
            let key = lock_key(self.rng.gen_range(0..self.keys));
            self.attempts += 1;
            let owner = format!("{}-{}", self.name, self.attempts);
            let block = if self.campaign {
                Some(self.rng.gen_range(200..=1000i64))
            } else {
                self.rng
                    .gen_bool(0.5)
                    .then(|| self.rng.gen_range(20..=300i64))
            };
            let mut cmd = redis::cmd("LOCK.ACQUIRE");
            cmd.arg(&key)
                .arg(&owner)
                .arg(if self.campaign { 0 } else { HOLD_TTL_MS })
                .arg("SESSION")
                .arg(&self.id);
            if let Some(b) = block {
                cmd.arg("BLOCK").arg(b);
            }
            let op = Op::Acquire {
                ttl: HOLD_TTL_MS,
                block,
                mode: Mode::Exclusive,
            };
            let timeout = Duration::from_millis(block.unwrap_or(0) as u64) + SLACK;
            match self.op(&key, &owner, op, None, &cmd, timeout, None) {
                Some((Outcome::Ok, Some(token))) => self.hold(&key, &owner, token),
                // Refused (or its session ended while it waited): back off a little.
                Some((Outcome::Fail, _)) => self.sleep_ms((0, 3)),
                // A lost reply (or no connection): a grant nobody heard of ends with the session.
                _ => return,
            }
        }
    }

    fn sleep_ms(&mut self, range: (u64, u64)) {
        let ms = self.rng.gen_range(range.0..=range.1);
        if ms > 0 {
            thread::sleep(Duration::from_millis(ms));
        }
    }

    /// One or two writes (a candidate's term: 1 to 6), a short hold, then the release (a
    /// session hold is never left to expire: its end is the session's).
    fn hold(&mut self, key: &str, owner: &str, token: i64) {
        let writes = if self.campaign { 6 } else { 2 };
        for _ in 0..self.rng.gen_range(1..=writes) {
            if !self.write(key, owner, token) {
                return;
            }
        }
        self.sleep_ms((0, 5));
        let mut release = redis::cmd("LOCK.RELEASE");
        release.arg(key).arg(owner);
        let _ = self.op(key, owner, Op::Release, Some(token), &release, SLACK, None);
    }

    /// A read-modify-write of each resource: the reads, 10-30 ms, then the workload's
    /// [`write_step`]; the side file notes when the fenced write is sent. False if a reply was
    /// lost.
    fn write(&mut self, key: &str, owner: &str, token: i64) -> bool {
        let (list, counter) = (fenced_key(key), plain_key(key));
        let fenced_invoke = self.sink.now();
        let Some(Ok(Value::Int(read_len))) = self.send(redis::cmd("LLEN").arg(&list), SLACK) else {
            return false;
        };
        let plain_invoke = self.sink.now();
        let read = match self.send(redis::cmd("GET").arg(&counter), SLACK) {
            Some(Ok(Value::Nil)) => 0,
            Some(Ok(Value::BulkString(b))) => match String::from_utf8_lossy(&b).parse::<i64>() {
                Ok(n) => n,
                Err(_) => return false,
            },
            _ => return false,
        };
        self.sleep_ms((10, 30));
        self.writes += 1;
        let reads = Reads {
            fenced: (fenced_invoke, read_len),
            plain: (plain_invoke, read),
        };
        let writer = format!("{}.{}", self.name, self.writes);
        let side = self.side.clone();
        write_step(self, key, owner, token, reads, &writer, |tag| {
            side.line(&["send", tag, &wall_us().to_string()])
        })
    }

    /// Send `cmd` on the worker's connection (made if needed); `None` if none could be made.
    /// The connection is dropped when no reply came.
    fn send(&mut self, cmd: &Cmd, timeout: Duration) -> Option<redis::RedisResult<Value>> {
        let mut conn = match self.conn.take() {
            Some(c) => c,
            None => connect(self.port, &self.name, SLACK).ok()?,
        };
        let _ = conn.set_read_timeout(Some(timeout));
        let reply = conn.req_command(cmd);
        if reply.is_ok() {
            self.conn = Some(conn);
        }
        Some(reply)
    }
}

impl Recording for SessionWorker {
    /// One recorded operation (see `workload/worker.rs`): its outcome and, for a grant, the
    /// token. `None` if no connection could be made (nothing recorded).
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
        if self.conn.is_none() {
            self.conn = Some(connect(self.port, &self.name, SLACK).ok()?);
        }
        let invoke = invoke.unwrap_or_else(|| self.sink.now());
        let mut entry = Entry {
            id: 0,
            client: self.name.clone(),
            key: key.to_string(),
            owner: owner.to_string(),
            op,
            invoke,
            complete: invoke,
            wall_ms: invoke / 1000,
            outcome: Outcome::Unknown,
            token,
            reply: String::new(),
        };
        let id = self.sink.begin(&entry);
        let reply = self.send(cmd, timeout)?;
        entry.complete = self.sink.now();
        let (outcome, text, int) = match reply {
            Ok(Value::ServerError(e)) => (
                Outcome::Fail,
                format!("{} {}", e.code(), e.details().unwrap_or("")),
                None,
            ),
            Ok(v) => {
                let int = match v {
                    Value::Int(n) => Some(n),
                    _ => None,
                };
                let ok = match entry.op {
                    Op::Acquire { .. } => int.is_some_and(|t| t > 0),
                    Op::UnfencedWrite { .. } => v == Value::Okay,
                    _ => int == Some(1),
                };
                let text = match &v {
                    Value::Nil => "nil".to_string(),
                    Value::Int(n) => n.to_string(),
                    Value::Okay => "OK".to_string(),
                    other => format!("{other:?}"),
                };
                let outcome = if ok { Outcome::Ok } else { Outcome::Fail };
                (outcome, text, int)
            }
            Err(e) if e.is_timeout() => (
                Outcome::Unknown,
                format!("{NO_REPLY} after {timeout:?}: {e})"),
                None,
            ),
            Err(e) => (Outcome::Unknown, format!("(no reply: {e})"), None),
        };
        entry.outcome = outcome;
        entry.reply = text;
        if entry.op.is_acquire() {
            entry.token = (outcome == Outcome::Ok).then_some(int).flatten();
        }
        let result = (entry.outcome, entry.token);
        self.sink.end(id, entry);
        Some(result)
    }
}
