//! The history of one scenario: every operation a workload client sent, every fault the nemesis
//! injected, and what the nemesis read back from the server, all stamped on one clock.
//!
//! Times are microseconds since the scenario started, on the monotonic clock ([`Clock`]) that
//! every thread of the test shares. A holder *process* cannot share an `Instant`, so it stamps
//! the wall clock and writes its operations to a file ([`FileSink`]); the test converts the
//! stamps when it loads that file ([`load_child`]). The conversion uses the offset between the
//! two clocks at load time, a few seconds after the stamps were taken, so it is off by no more
//! than what NTP slewing does in that time (microseconds).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::{self, File};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Microseconds since the scenario started (monotonic), or since the epoch (wall) in a child.
pub type Micros = i64;

/// Wall-clock microseconds since the Unix epoch.
pub fn wall_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock before 1970")
        .as_micros() as i64
}

/// The scenario's clock: monotonic microseconds since it started.
pub struct Clock {
    /// When the scenario started.
    start: Instant,
}

impl Clock {
    pub fn new() -> Clock {
        Clock {
            start: Instant::now(),
        }
    }

    /// Microseconds since the scenario started.
    pub fn now(&self) -> Micros {
        self.start.elapsed().as_micros() as Micros
    }

    /// A wall-clock stamp (microseconds since the epoch, taken by another process on this
    /// machine) on this clock's scale.
    pub fn of_wall(&self, wall: i64) -> Micros {
        let offset = self.now() - wall_us();
        wall + offset
    }
}

/// What became of an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    /// The server answered and the operation took effect (a token, `1`, `OK`).
    Ok,
    /// The server answered and the operation did not take effect (`nil`, `0`, an error reply:
    /// an error changes nothing).
    Fail,
    /// No answer (connection error, timeout, server killed): it may or may not have taken
    /// effect, and if it did, at any time after it was invoked.
    Unknown,
}

/// How an acquire asks to hold its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Alone (no `SHARED`).
    Exclusive,
    /// `SHARED`, and `LIMIT n` when `limit` is set: beside other shared holders, at most `n`
    /// of them at once.
    Shared { limit: Option<u64> },
}

impl Mode {
    pub fn is_shared(self) -> bool {
        matches!(self, Mode::Shared { .. })
    }

    /// As the history file writes it: `x`, `s`, or `s3` for `SHARED LIMIT 3`.
    fn code(self) -> String {
        match self {
            Mode::Exclusive => "x".to_string(),
            Mode::Shared { limit: None } => "s".to_string(),
            Mode::Shared { limit: Some(n) } => format!("s{n}"),
        }
    }

    fn parse(code: &str) -> Option<Mode> {
        match code.strip_prefix('s') {
            None if code == "x" => Some(Mode::Exclusive),
            None => None,
            Some("") => Some(Mode::Shared { limit: None }),
            Some(n) => Some(Mode::Shared {
                limit: Some(n.parse().ok()?),
            }),
        }
    }
}

/// The options of `LOCK.ACQUIRE` that `mode` adds.
impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Exclusive => Ok(()),
            Mode::Shared { limit: None } => write!(f, " SHARED"),
            Mode::Shared { limit: Some(n) } => write!(f, " SHARED LIMIT {n}"),
        }
    }
}

/// One client operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `LOCK.ACQUIRE key owner ttl [SHARED [LIMIT n]] [BLOCK timeout]`.
    Acquire {
        ttl: i64,
        block: Option<i64>,
        mode: Mode,
    },
    /// `LOCK.RELEASE key owner`.
    Release,
    /// `LOCK.EXTEND key owner ttl`.
    Extend { ttl: i64 },
    /// `WAIT 1 1000` right after a grant: ok when at least one replica acknowledged it.
    Wait,
    /// `LLEN res:k`, then the fenced append (`EVAL`) of `tag`: `read` is the length read.
    FencedWrite { read: i64, tag: String },
    /// `GET cnt:k`, then `SET cnt:k read+1`, with no fence at all.
    UnfencedWrite { read: i64 },
    /// The fenced read (`EVAL` of `FENCED_READ`) of a shared holder: the list's length if the
    /// token is live (the reply), else -1.
    FencedRead,
}

impl Op {
    /// The row of the operations table this operation counts in.
    pub fn row(&self) -> &'static str {
        match self {
            Op::Acquire { block, mode, .. } => match (mode, block) {
                (Mode::Exclusive, None) => "LOCK.ACQUIRE",
                (Mode::Exclusive, Some(_)) => "LOCK.ACQUIRE BLOCK",
                (Mode::Shared { limit: None }, None) => "LOCK.ACQUIRE SHARED",
                (Mode::Shared { limit: None }, Some(_)) => "LOCK.ACQUIRE SHARED BLOCK",
                (Mode::Shared { limit: Some(_) }, None) => "LOCK.ACQUIRE SHARED LIMIT",
                (Mode::Shared { limit: Some(_) }, Some(_)) => "LOCK.ACQUIRE SHARED LIMIT BLOCK",
            },
            Op::Release => "LOCK.RELEASE",
            Op::Extend { .. } => "LOCK.EXTEND",
            Op::Wait => "WAIT 1",
            Op::FencedWrite { .. } => "fenced write (LLEN+EVAL)",
            Op::UnfencedWrite { .. } => "unfenced write (GET+SET)",
            Op::FencedRead => "fenced read (EVAL LLEN)",
        }
    }

    /// The ttl (ms) of an operation that sets the hold's deadline: grants, retries, extends.
    pub fn ttl(&self) -> Option<i64> {
        match self {
            Op::Acquire { ttl, .. } | Op::Extend { ttl } => Some(*ttl),
            _ => None,
        }
    }

    pub fn is_acquire(&self) -> bool {
        matches!(self, Op::Acquire { .. })
    }

    /// The mode an acquire asked for; every other operation acts on a hold of either mode.
    pub fn mode(&self) -> Option<Mode> {
        match self {
            Op::Acquire { mode, .. } => Some(*mode),
            _ => None,
        }
    }
}

/// One operation of the history.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Position in the merged history, ordered by invocation (set by [`Recorder::finish`]).
    pub id: usize,
    /// The client: `w3` (a thread) or `proc7` (a holder process).
    pub client: String,
    /// The lock key the operation is about (the resources are derived from it).
    pub key: String,
    /// The owner string; unique per attempt to take a lock, reused only to retry that attempt.
    pub owner: String,
    pub op: Op,
    /// When the first command of the operation was sent.
    pub invoke: Micros,
    /// When its last reply arrived (or the connection failed).
    pub complete: Micros,
    /// Wall clock at invocation, in ms since the epoch, to find the moment in a server log.
    pub wall_ms: i64,
    pub outcome: Outcome,
    /// The granted token (acquire), or the token the client believed it held (the others).
    pub token: Option<i64>,
    /// The server's reply, or the error.
    pub reply: String,
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match &self.op {
            Op::Acquire {
                ttl,
                block: None,
                mode,
            } => format!("LOCK.ACQUIRE ttl={ttl}{mode}"),
            Op::Acquire {
                ttl,
                block: Some(b),
                mode,
            } => format!("LOCK.ACQUIRE ttl={ttl}{mode} BLOCK {b}"),
            Op::Release => "LOCK.RELEASE".to_string(),
            Op::Extend { ttl } => format!("LOCK.EXTEND ttl={ttl}"),
            Op::Wait => "WAIT 1".to_string(),
            Op::FencedWrite { read, tag } => format!("fenced write read={read} tag={tag}"),
            Op::UnfencedWrite { read } => format!("unfenced write read={read}"),
            Op::FencedRead => "fenced read".to_string(),
        };
        write!(
            f,
            "#{} [{:.3} .. {:.3} ms, wall {}] {} {} {} owner={} token={} -> {:?} {}",
            self.id,
            self.invoke as f64 / 1000.0,
            self.complete as f64 / 1000.0,
            self.wall_ms,
            self.client,
            op,
            self.key,
            self.owner,
            self.token.map_or("-".to_string(), |t| t.to_string()),
            self.outcome,
            self.reply
        )
    }
}

/// What a fault may do to the holds of the keys it covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Keeps every hold (a client-side fault, an fsynced restart, `DEBUG RELOAD`, ...).
    Keeps,
    /// May drop holds: restart after `appendfsync everysec`, failover, eviction.
    MayLose,
    /// Drops every live hold of the keys it covers: `FLUSHALL`, `RENAME` away, a restart with
    /// no persistence.
    Destroys,
}

/// A fault the nemesis (or a workload client, for its own pauses) injected.
#[derive(Clone, Debug)]
pub struct Fault {
    /// What it was, as the faults table shows it.
    pub kind: String,
    pub invoke: Micros,
    pub complete: Micros,
    pub wall_ms: i64,
    /// The lock keys it may change; `None` for every key.
    pub keys: Option<Vec<String>>,
    pub effect: Effect,
    /// Done to the server (restart, flush, failover...): the token checks look at its before and
    /// after. Client-side faults (pauses, kills of a client) are not.
    pub server_side: bool,
    /// Details for the report (replies, pids, which waiter...).
    pub note: String,
}

impl Fault {
    pub fn covers(&self, key: &str) -> bool {
        self.keys
            .as_ref()
            .is_none_or(|keys| keys.iter().any(|k| k == key))
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "fault [{:.3} .. {:.3} ms, wall {}] {} ({:?}) {}",
            self.invoke as f64 / 1000.0,
            self.complete as f64 / 1000.0,
            self.wall_ms,
            self.kind,
            self.effect,
            self.note
        )
    }
}

/// A token the nemesis saw the server hold or report (`LOCK.FENCE`, `INFO lock`, the dead
/// primary's AOF): it was issued no later than `time`.
#[derive(Clone, Debug)]
pub struct Observation {
    pub time: Micros,
    pub token: i64,
    pub source: String,
}

/// Which held locks a [`Snapshot`] must show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Survival {
    /// Every grant acknowledged before the fault whose hold is still live (restart from an
    /// `appendfsync always` AOF, `DEBUG RELOAD`).
    Acked,
    /// Every grant acknowledged by `WAIT 1` before the fault (failover with `WAIT`).
    WaitAcked,
    /// Counted, not required (everysec restart, asynchronous failover).
    Informational,
}

/// The holds of every lock key, read right after a fault, before any workload client could
/// reach the server again (or atomically with the fault, inside `MULTI`).
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// Index in [`History::faults`] of the fault whose survivors this checks.
    pub fault: usize,
    pub invoke: Micros,
    pub complete: Micros,
    /// Lock key -> (owner, token) of each of its live holders (none when free).
    pub holds: BTreeMap<String, Vec<(String, i64)>>,
    pub survival: Survival,
}

/// A scenario's own criterion (e.g. "RESTORE of a truncated DUMP is refused"), tallied while
/// the nemesis runs.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    pub criterion: String,
    pub passed: u64,
    pub violations: Vec<String>,
}

/// Everything recorded in one scenario.
#[derive(Default)]
pub struct History {
    pub entries: Vec<Entry>,
    pub faults: Vec<Fault>,
    pub observations: Vec<Observation>,
    pub snapshots: Vec<Snapshot>,
    pub tallies: BTreeMap<String, Tally>,
    /// Figures for the report (OOM replies seen, keys evicted, ...).
    pub counters: BTreeMap<String, i64>,
}

/// Where the workload writes its operations.
pub trait Sink: Send + Sync {
    /// The time to stamp an operation with.
    fn now(&self) -> Micros;
    /// An operation is about to be sent; returns its id for [`Sink::end`].
    fn begin(&self, entry: &Entry) -> u64;
    /// The operation `id` completed (or failed) as `entry` says.
    fn end(&self, id: u64, entry: Entry);
    /// A fault the client itself caused: a pause, a disconnect while waiting.
    fn client_fault(&self, kind: &str, invoke: Micros, complete: Micros, note: String);
}

/// The in-memory history of the test process, shared by its threads.
pub struct Recorder {
    pub clock: Clock,
    state: Mutex<History>,
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder {
            clock: Clock::new(),
            state: Mutex::new(History::default()),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut History) -> T) -> T {
        // A panicking worker must not hide the history from the report: ignore poisoning.
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut state)
    }

    pub fn push_entries(&self, entries: Vec<Entry>) {
        self.with(|h| h.entries.extend(entries));
    }

    /// Read fault `index`.
    pub fn with_fault<T>(&self, index: usize, f: impl FnOnce(&Fault) -> T) -> T {
        self.with(|h| f(&h.faults[index]))
    }

    pub fn push_faults(&self, faults: Vec<Fault>) {
        self.with(|h| h.faults.extend(faults));
    }

    /// Record a fault; returns its index.
    pub fn fault(&self, fault: Fault) -> usize {
        self.with(|h| {
            h.faults.push(fault);
            h.faults.len() - 1
        })
    }

    pub fn observe(&self, time: Micros, token: i64, source: String) {
        self.with(|h| {
            h.observations.push(Observation {
                time,
                token,
                source,
            })
        });
    }

    pub fn snapshot(&self, snapshot: Snapshot) {
        self.with(|h| h.snapshots.push(snapshot));
    }

    /// Tally the scenario criterion `name` (described by `criterion`): a pass, or a violation
    /// described by `detail`.
    pub fn check(&self, name: &str, criterion: &str, ok: bool, detail: impl FnOnce() -> String) {
        let detail = (!ok).then(detail);
        self.with(|h| {
            let tally = h.tallies.entry(name.to_string()).or_default();
            tally.criterion = criterion.to_string();
            match detail {
                None => tally.passed += 1,
                Some(d) => tally.violations.push(d),
            }
        });
    }

    pub fn count(&self, name: &str, n: i64) {
        self.with(|h| *h.counters.entry(name.to_string()).or_default() += n);
    }

    /// The history so far, entries ordered by invocation and numbered.
    pub fn finish(&self) -> History {
        let mut history = self.with(std::mem::take);
        history
            .entries
            .sort_by_key(|e| (e.invoke, e.complete, e.client.clone()));
        for (i, e) in history.entries.iter_mut().enumerate() {
            e.id = i;
        }
        // Faults stay in recording order: snapshots refer to them by index.
        history
    }
}

impl Sink for Recorder {
    fn now(&self) -> Micros {
        self.clock.now()
    }

    fn begin(&self, _entry: &Entry) -> u64 {
        0
    }

    fn end(&self, _id: u64, entry: Entry) {
        self.with(|h| h.entries.push(entry));
    }

    fn client_fault(&self, kind: &str, invoke: Micros, complete: Micros, note: String) {
        self.fault(Fault {
            kind: kind.to_string(),
            invoke,
            complete,
            wall_ms: wall_us() / 1000,
            keys: None,
            effect: Effect::Keeps,
            server_side: false,
            note,
        });
    }
}

/// The history file of a holder process: one line when an operation is sent (`B`), one when it
/// completes (`E`). A process killed in between leaves only the `B` line: that operation's
/// outcome is unknown. Each line is written with one `write` call, so a kill never leaves half
/// a line behind except possibly the last, which [`load_child`] ignores.
pub struct FileSink {
    file: Mutex<File>,
    next: AtomicU64,
}

impl FileSink {
    pub fn create(path: &Path) -> FileSink {
        let file =
            File::create(path).unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
        FileSink {
            file: Mutex::new(file),
            next: AtomicU64::new(1),
        }
    }

    fn line(&self, line: String) {
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        // Best effort: a child that cannot write its history shows up as missing operations,
        // which only makes the checks weaker, never wrong.
        let _ = file.write_all(line.as_bytes());
    }
}

impl Sink for FileSink {
    fn now(&self) -> Micros {
        wall_us()
    }

    fn begin(&self, entry: &Entry) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.line(format!("B\t{id}\t{}\n", encode(entry)));
        id
    }

    fn end(&self, id: u64, entry: Entry) {
        self.line(format!("E\t{id}\t{}\n", encode(&entry)));
    }

    fn client_fault(&self, kind: &str, invoke: Micros, complete: Micros, note: String) {
        self.line(format!(
            "F\t{}\t{invoke}\t{complete}\t{}\n",
            escape(kind),
            escape(&note)
        ));
    }
}

/// Load a holder process's history file. Stamps are wall-clock there; `clock` converts them.
/// Operations that never completed end at `died` with an unknown outcome.
pub fn load_child(path: &Path, clock: &Clock, died: Micros) -> (Vec<Entry>, Vec<Fault>) {
    let text = fs::read_to_string(path).unwrap_or_default();
    let mut ops: HashMap<u64, (Entry, bool)> = HashMap::new();
    let mut faults = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        match fields.first() {
            Some(&"B") | Some(&"E") if fields.len() == 16 => {
                let Ok(id) = fields[1].parse::<u64>() else {
                    continue;
                };
                let Some(mut entry) = decode(&fields[2..]) else {
                    continue;
                };
                let done = fields[0] == "E";
                entry.invoke = clock.of_wall(entry.invoke);
                entry.complete = if done {
                    clock.of_wall(entry.complete)
                } else {
                    died
                };
                ops.insert(id, (entry, done));
            }
            Some(&"F") if fields.len() == 5 => {
                let (Ok(invoke), Ok(complete)) =
                    (fields[2].parse::<i64>(), fields[3].parse::<i64>())
                else {
                    continue;
                };
                faults.push(Fault {
                    kind: unescape(fields[1]),
                    invoke: clock.of_wall(invoke),
                    complete: clock.of_wall(complete),
                    wall_ms: invoke / 1000,
                    keys: None,
                    effect: Effect::Keeps,
                    server_side: false,
                    note: unescape(fields[4]),
                });
            }
            _ => {} // a torn last line
        }
    }
    let mut entries: Vec<Entry> = ops
        .into_values()
        .map(|(mut e, done)| {
            if !done {
                e.outcome = Outcome::Unknown;
                e.reply = "(no reply: the process was killed)".to_string();
            }
            e
        })
        .collect();
    entries.sort_by_key(|e| e.invoke);
    (entries, faults)
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('\t', "\\t")
        .replace('\n', "\\n")
}

fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some(other) => out.push(other),
            None => {}
        }
    }
    out
}

/// 14 tab-separated fields.
fn encode(e: &Entry) -> String {
    let (kind, a, b, tag) = match &e.op {
        Op::Acquire { ttl, block, .. } => ("A", *ttl, block.unwrap_or(-1), ""),
        Op::Release => ("R", 0, 0, ""),
        Op::Extend { ttl } => ("X", *ttl, 0, ""),
        Op::Wait => ("W", 0, 0, ""),
        Op::FencedWrite { read, tag } => ("F", *read, 0, tag.as_str()),
        Op::UnfencedWrite { read } => ("U", *read, 0, ""),
        Op::FencedRead => ("Q", 0, 0, ""),
    };
    let outcome = match e.outcome {
        Outcome::Ok => "o",
        Outcome::Fail => "f",
        Outcome::Unknown => "u",
    };
    [
        escape(&e.client),
        escape(&e.key),
        escape(&e.owner),
        kind.to_string(),
        a.to_string(),
        b.to_string(),
        escape(tag),
        e.invoke.to_string(),
        e.complete.to_string(),
        e.wall_ms.to_string(),
        outcome.to_string(),
        e.token.map_or("-".to_string(), |t| t.to_string()),
        escape(&e.reply),
        e.op.mode().map_or("-".to_string(), Mode::code),
    ]
    .join("\t")
}

fn decode(f: &[&str]) -> Option<Entry> {
    let a: i64 = f[4].parse().ok()?;
    let b: i64 = f[5].parse().ok()?;
    let op = match f[3] {
        "A" => Op::Acquire {
            ttl: a,
            block: (b >= 0).then_some(b),
            mode: Mode::parse(f[13])?,
        },
        "R" => Op::Release,
        "X" => Op::Extend { ttl: a },
        "W" => Op::Wait,
        "F" => Op::FencedWrite {
            read: a,
            tag: unescape(f[6]),
        },
        "U" => Op::UnfencedWrite { read: a },
        "Q" => Op::FencedRead,
        _ => return None,
    };
    Some(Entry {
        id: 0,
        client: unescape(f[0]),
        key: unescape(f[1]),
        owner: unescape(f[2]),
        op,
        invoke: f[7].parse().ok()?,
        complete: f[8].parse().ok()?,
        wall_ms: f[9].parse().ok()?,
        outcome: match f[10] {
            "o" => Outcome::Ok,
            "f" => Outcome::Fail,
            _ => Outcome::Unknown,
        },
        token: f[11].parse().ok(),
        reply: unescape(f[12]),
    })
}
