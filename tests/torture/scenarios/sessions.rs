//! Sessions (issue 19): two holder processes take their locks in `BOUND` sessions
//! (`sessions/holder.rs`: ttl 250 ms, one `KEEPALIVE` every 40 ms, holds with no deadline that
//! matters, 60 s) while the workload's threads queue on the same keys (`BLOCK`). Each process
//! reaches the server through a proxy of its own (`netfault::SlowLink`, no delay). The nemesis,
//! in turn, on a process that holds a lock if one does within 300 ms:
//!
//! - SIGKILLs it: the bound connection closes, the session must end at once (`LOCK.SESSION INFO`
//!   nil before the session's ttl could have run out);
//! - SIGSTOPs it until the server has expired its session (`INFO` polled every 5 ms: nil), then
//!   continues it: it wakes up between a read and a write and sends its write;
//! - cuts it off: its proxy holds every byte both ways (the server sees silence, as in a
//!   partition; nothing is closed) until the server has expired its session, then lets them
//!   through: whatever it sent meanwhile arrives after its session ended.
//!
//! Every loss is a fault in the history that may drop the holds of every key (`MayLose`), from
//! the last moment the session was seen alive, so the common checks (`exclusive-holds` on the
//! fencing tokens' holds, `stale-fenced-writes`, ...) judge the session holds with the threads'.
//! The scenario's own checks:
//!
//! - `session-ends-on-kill`: a killed holder's bound session is gone before its ttl could have
//!   run out (it ended on the disconnect);
//! - `session-expires-unattended`: a stopped or cut-off holder's session is gone within its ttl
//!   plus 1 s;
//! - `fenced-write-after-session-loss`: no fenced write that a stopped or cut-off holder sent
//!   after its session was gone is accepted (the fence refuses it);
//! - `lock-delay` (`sessions_lock_delay`, sessions opened with `LOCKDELAY 150`): after a loss, no
//!   key the session held is granted to anyone before the loss + 150 ms, with the checker's 2 ms
//!   tolerance (the server's whole-millisecond clock, and the two clocks' rates). The loss is
//!   taken at its earliest possible moment (the last `INFO` that saw the session alive, or its
//!   deadline by that `INFO`'s ttl), so the check is sound and the grant may in fact have waited
//!   longer.

use std::collections::HashMap;
use std::fs::{self, File};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use super::*;
use crate::checker::TOLERANCE;
use crate::history::{load_child, Entry};
use crate::netfault::SlowLink;

mod holder;

pub use holder::session_holder_main;
use holder::{Spec, HOLD_TTL_MS, SESSION_ENV};

/// The lock delay of `sessions_lock_delay`'s sessions, ms.
const LOCK_DELAY_MS: u64 = 150;

/// Session holder processes alive at once.
const HOLDERS: usize = 2;

/// The holder processes the nemesis keeps alive (`election.rs` runs candidates with it).
pub(super) struct Holders {
    /// How many at once.
    pub count: usize,
    /// Their sessions' `LOCKDELAY`, ms.
    pub lock_delay_ms: u64,
    /// Candidates of the election on `lock:0` (`holder.rs`), named `cand{n}`, instead of
    /// holders of the workload's keys (`sproc{n}`).
    pub campaign: bool,
}

pub(super) const KILL: &str = "SIGKILL of a session holder (bound connection closes)";
pub(super) const STOP: &str = "SIGSTOP of a session holder until its session expired";
pub(super) const CUT: &str =
    "network cut of a session holder (its proxy holds every byte) until its \
                   session expired";
const END: &str = "SIGKILL of a session holder at the end of its run";
const LOST: &str = "a session holder's KEEPALIVE answered nil (or an error)";
const CLOSED: &str = "LOCK.SESSION CLOSE released holds";

pub fn sessions_bound() -> Scenario {
    Scenario::new(
        "sessions_bound",
        "holder processes in BOUND sessions (ttl 250 ms) are SIGKILLed, SIGSTOPped past the \
         session ttl and cut off (proxy frozen) past it, while threads queue on the same keys",
        |env| session_faults(env, &holders(0), &mut |_| {}),
    )
    .workload(workload())
    .post(|h, _| session_checks(h, 0))
}

pub fn sessions_lock_delay() -> Scenario {
    Scenario::new(
        "sessions_lock_delay",
        "sessions_bound with LOCKDELAY 150: after each loss, no grant of what the session held \
         for 150 ms",
        |env| session_faults(env, &holders(LOCK_DELAY_MS), &mut |_| {}),
    )
    .workload(workload())
    .post(|h, _| session_checks(h, LOCK_DELAY_MS))
}

fn holders(lock_delay_ms: u64) -> Holders {
    Holders {
        count: HOLDERS,
        lock_delay_ms,
        campaign: false,
    }
}

/// Four threads on two keys, most of them waiting in `BLOCK`: every session hold has a queue.
fn workload() -> Config {
    Config {
        workers: 4,
        keys: 2,
        block_share: 0.8,
        block_ms: (50, 600),
        ..Config::default()
    }
}

/// A session holder process, its proxy and its files.
struct SessionHolder {
    child: Child,
    name: String,
    history: PathBuf,
    side: PathBuf,
    link: SlowLink,
    started: Micros,
    /// Killed by the nemesis (its loss is in the history already).
    killed: bool,
    /// After this time (the end of a pause, the start of a cut) the session was gone, and every
    /// fenced write the holder sends must be refused.
    lost_after: Option<Micros>,
}

/// The side file of a holder, read back (see `holder.rs`), times on the scenario's clock.
#[derive(Default)]
struct SideFile {
    id: Option<String>,
    /// Tag of each fenced write -> when it was about to be sent.
    sent: HashMap<String, Micros>,
    /// `KEEPALIVE` answered nil (or an error): (last ok invoke, when, the reply).
    lost: Option<(Micros, Micros, String)>,
    /// `CLOSE`: (invoke, complete, reply).
    close: Option<(Micros, Micros, String)>,
}

impl SessionHolder {
    fn spawn(env: &mut Env, holders: &Holders) -> SessionHolder {
        env.spawned += 1;
        let prefix = if holders.campaign { "cand" } else { "sproc" };
        let name = format!("{prefix}{}", env.spawned);
        let dir = env.primary.dir().to_path_buf();
        let (history, side) = (
            dir.join(format!("{name}.history")),
            dir.join(format!("{name}.side")),
        );
        let link = SlowLink::start(env.primary.port(), Duration::ZERO, Duration::ZERO);
        let spec = Spec {
            port: link.port,
            keys: env.cfg.keys,
            name: name.clone(),
            secs: env.rng.gen_range(1.0..3.0),
            lock_delay_ms: holders.lock_delay_ms,
            seed: env.rng.gen(),
            history: history.to_string_lossy().into_owned(),
            side: side.to_string_lossy().into_owned(),
            campaign: holders.campaign,
        };
        let stderr = File::create(dir.join(format!("{name}.stderr")))
            .unwrap_or_else(|e| panic!("cannot create {name}.stderr: {e}"));
        let exe = std::env::current_exe().expect("the test binary's path");
        let child = Command::new(exe)
            .args([
                "session_holder_process",
                "--exact",
                "--ignored",
                "--nocapture",
            ])
            .args(["--test-threads", "1", "-q"])
            .env(SESSION_ENV, spec.encode())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start a session holder process: {e}"));
        env.rec
            .count("session holders started (each one BOUND session)", 1);
        SessionHolder {
            child,
            name,
            history,
            side,
            link,
            started: env.now(),
            killed: false,
            lost_after: None,
        }
    }

    fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    fn read_side(&self, env: &Env) -> SideFile {
        let text = fs::read_to_string(&self.side).unwrap_or_default();
        let at = |s: &str| s.parse::<i64>().ok().map(|w| env.rec.clock.of_wall(w));
        let mut side = SideFile::default();
        for line in text.lines() {
            let f: Vec<&str> = line.split('\t').collect();
            match f.as_slice() {
                ["open", id, _, _] => side.id = Some(id.to_string()),
                ["send", tag, t] => {
                    if let Some(t) = at(t) {
                        side.sent.insert(tag.to_string(), t);
                    }
                }
                ["lost", last_ok, t, reply] => {
                    side.lost = at(last_ok)
                        .zip(at(t))
                        .map(|(l, t)| (l, t, reply.to_string()))
                }
                ["close", invoke, complete, reply] => {
                    if let (Some(i), Some(c)) = (at(invoke), at(complete)) {
                        side.close = Some((i, c, reply.to_string()));
                    }
                }
                _ => {} // a torn last line
            }
        }
        side
    }

    /// The session id, once the process has opened it.
    fn id(&self, env: &Env) -> Option<String> {
        self.read_side(env).id
    }

    /// Kill it if it still runs (recorded as a loss), reap it, add its operations to the
    /// history, record the losses only its side file knows, judge the writes it sent after a
    /// loss, and wait until the server has ended its session.
    fn finish(mut self, env: &mut Env, c: &mut Connection) {
        let id = self.id(env);
        if !self.exited() {
            let alive = id.as_deref().and_then(|id| session_ttl(c, id));
            let invoke = env.now();
            let _ = self.child.kill();
            let _ = self.child.wait();
            self.killed = true;
            if alive.is_some() {
                let note = format!("holder={} loss_from_us={invoke} (still running)", self.name);
                env.fault_at(END, None, Effect::MayLose, false, invoke, env.now(), note);
            }
        }
        let (entries, faults) = load_child(&self.history, &env.rec.clock, env.now());
        let side = self.read_side(env);
        if let Some((last_ok, at, reply)) = &side.lost {
            let (last_ok, at) = (*last_ok, *at);
            let note = format!(
                "{}: KEEPALIVE answered {reply} (the session was alive at the last ok one)",
                self.name
            );
            env.fault_at(LOST, None, Effect::MayLose, false, last_ok, at, note);
            if self.lost_after.is_none() {
                env.rec.count(
                    "sessions lost outside the nemesis's faults (KEEPALIVE nil)",
                    1,
                );
            }
        }
        match &side.close {
            Some((_, _, reply)) if reply == "0" => {}
            Some((invoke, complete, reply)) => {
                let note = format!("{}: CLOSE answered {reply}", self.name);
                env.fault_at(
                    CLOSED,
                    None,
                    Effect::MayLose,
                    false,
                    *invoke,
                    *complete,
                    note,
                );
            }
            None if !self.killed && side.lost.is_none() && side.id.is_some() => {
                // Neither closed nor lost nor killed above: it exited on its own (a panic, in
                // its stderr file); its session ended then, at some time since it started.
                let note = format!("{}: exited without CLOSE", self.name);
                let (from, now) = (self.started, env.now());
                env.fault_at(END, None, Effect::MayLose, false, from, now, note);
            }
            None => {}
        }
        if let Some(after) = self.lost_after {
            let (checked, accepted, refused) = writes_after_loss(&entries, &side.sent, after);
            env.rec
                .count("fenced writes sent after a session loss", checked as i64);
            env.rec.count(
                "fenced writes sent after a session loss, refused by the fence",
                refused as i64,
            );
            for w in &accepted {
                env.check(WRITE_AFTER_LOSS, WRITE_AFTER_LOSS_CRITERION, false, || {
                    format!(
                        "{} lost its session before {after} us:\n      {w}",
                        self.name
                    )
                });
            }
            for _ in 0..checked - accepted.len() {
                env.check(
                    WRITE_AFTER_LOSS,
                    WRITE_AFTER_LOSS_CRITERION,
                    true,
                    String::new,
                );
            }
        }
        env.rec.push_entries(entries);
        env.rec.push_faults(faults);
        if let Some(id) = id {
            wait_until("a finished holder's session ends", ms(2000), || {
                session_ttl(c, &id).is_none()
            });
        }
        drop(self.link);
    }
}

const WRITE_AFTER_LOSS: &str = "fenced-write-after-session-loss";
const WRITE_AFTER_LOSS_CRITERION: &str =
    "a fenced write a holder sent after its session was gone (paused or cut off past its ttl) \
     is refused";

/// Of a holder's `entries`, the fenced writes sent (by `sent`, from its side file) after
/// `after`: how many, those accepted (each a violation), and how many the fence refused.
fn writes_after_loss<'e>(
    entries: &'e [Entry],
    sent: &HashMap<String, Micros>,
    after: Micros,
) -> (usize, Vec<&'e Entry>, usize) {
    let (mut checked, mut accepted, mut refused) = (0, Vec::new(), 0);
    for e in entries {
        let Op::FencedWrite { tag, .. } = &e.op else {
            continue;
        };
        if e.outcome == Outcome::Unknown || sent.get(tag).is_none_or(|t| *t <= after) {
            continue;
        }
        checked += 1;
        match e.outcome {
            Outcome::Ok => accepted.push(e),
            _ if e.reply == "0" => refused += 1,
            _ => {}
        }
    }
    (checked, accepted, refused)
}

/// `LOCK.SESSION INFO id`'s ttl (ms left), or `None` once the session is gone.
pub(super) fn session_ttl(c: &mut Connection, id: &str) -> Option<i64> {
    let reply = faults::raw(c, &["LOCK.SESSION", "INFO", id]);
    let pairs: Vec<(Value, Value)> = match reply {
        Value::Nil => return None,
        Value::Array(items) => items
            .chunks(2)
            .map(|kv| (kv[0].clone(), kv[1].clone()))
            .collect(),
        Value::Map(items) => items,
        other => panic!("LOCK.SESSION INFO {id}: {other:?}"),
    };
    let ttl = pairs
        .iter()
        .find(|(k, _)| *k == Value::BulkString(b"ttl".to_vec()));
    match ttl {
        Some((_, Value::Int(ms))) => Some(*ms),
        other => panic!("LOCK.SESSION INFO {id}: no ttl ({other:?})"),
    }
}

/// Poll `INFO id` every 5 ms until the session is gone or `patience` has passed; when it went.
fn gone_within(env: &Env, c: &mut Connection, id: &str, patience: Duration) -> Option<Micros> {
    let deadline = Instant::now() + patience;
    loop {
        if session_ttl(c, id).is_none() {
            return Some(env.now());
        }
        if Instant::now() > deadline {
            return None;
        }
        thread::sleep(ms(5));
    }
}

/// Open and close one session on the server `c` reaches (see the comment inside).
fn warm_up(c: &mut Connection) {
    // The first OPEN of a server process builds the module's table of slot tags. Before
    // 2022ebe that came out of the session's ttl (150-250 ms in a debug build here, so a first
    // session of 250 ms reached its holder all but expired); it no longer does, but the first
    // OPEN still keeps the server busy a moment. Open and close one first, so that the
    // holders' sessions start on a server that answers at once.
    let warm = faults::raw(c, &["LOCK.SESSION", "OPEN", "10000"]);
    let Value::BulkString(warm) = warm else {
        panic!("LOCK.SESSION OPEN answered {warm:?}")
    };
    let warm = String::from_utf8_lossy(&warm).into_owned();
    assert_eq!(
        faults::raw(c, &["LOCK.SESSION", "CLOSE", &warm]),
        Value::Int(0)
    );
}

/// The nemesis (see the module docs), on the processes `holders` describes; `between` runs
/// once a round, before the holder to hit is chosen (the election's observer faults and
/// failovers: after one, every holder is replaced by a fresh one on the new primary).
pub(super) fn session_faults(env: &mut Env, holders: &Holders, between: &mut dyn FnMut(&mut Env)) {
    let spec = holders;
    let mut c = env.conn();
    let mut port = env.primary.port();
    warm_up(&mut c);
    let mut holders: Vec<SessionHolder> = (0..spec.count)
        .map(|_| SessionHolder::spawn(env, spec))
        .collect();
    let kinds = [KILL, STOP, CUT];
    let mut round = 0;
    // The longest a killed holder's session outlived the kill (INFO polled every 5 ms), us.
    let mut kill_to_gone: Micros = 0;
    while env.running() {
        env.sleep((30, 100));
        for slot in holders.iter_mut() {
            if slot.exited() {
                let fresh = SessionHolder::spawn(env, spec);
                std::mem::replace(slot, fresh).finish(env, &mut c);
            }
        }
        if !env.running() {
            break;
        }
        between(env);
        if env.primary.port() != port {
            // `between` failed the primary over (`election_failover`): the holders' proxies
            // lead to the dead one. Retire them and start fresh ones on the new primary.
            port = env.primary.port();
            c = env.conn();
            warm_up(&mut c);
            for slot in holders.iter_mut() {
                let fresh = SessionHolder::spawn(env, spec);
                std::mem::replace(slot, fresh).finish(env, &mut c);
            }
            continue;
        }
        // A holder that holds a lock, if one does within 300 ms.
        let names: Vec<String> = holders.iter().map(|h| format!("{}-", h.name)).collect();
        let holding = |c: &mut Connection, env: &Env| {
            env.keys().iter().find_map(|key| {
                let (owner, _, _) = faults::lock_info(c, key)?;
                names.iter().position(|n| owner.starts_with(n))
            })
        };
        let give_up = Instant::now() + ms(300);
        let mut target = holding(&mut c, env);
        while target.is_none() && Instant::now() < give_up && env.running() {
            thread::sleep(ms(2));
            target = holding(&mut c, env);
        }
        let i = target.unwrap_or_else(|| env.rng.gen_range(0..holders.len()));
        let Some(id) = holders[i].id(env) else {
            continue; // not open yet
        };
        let kind = kinds[round % kinds.len()];
        let info_invoke = env.now();
        let Some(ttl) = session_ttl(&mut c, &id) else {
            continue; // its session is already gone: the holder is on its way out
        };
        round += 1;
        // The session's deadline by that INFO, at the earliest: its loss by expiry is no sooner.
        let expiry_from = info_invoke + (ttl - 1) * 1000;
        let name = holders[i].name.clone();
        let held = if target == Some(i) {
            "holding a lock"
        } else {
            "maybe holding nothing"
        };
        if kind == KILL {
            let invoke = env.now();
            let _ = holders[i].child.kill();
            let _ = holders[i].child.wait();
            holders[i].killed = true;
            let killed = env.now();
            let gone = gone_within(env, &mut c, &id, ms(1000));
            let note = format!(
                "holder={name} loss_from_us={} ({held}; INFO ttl {ttl} ms before the kill; \
                 session gone {})",
                invoke.min(expiry_from),
                gone.map_or("never".to_string(), |g| format!("{} us after", g - killed))
            );
            env.fault_at(
                kind,
                None,
                Effect::MayLose,
                false,
                info_invoke,
                killed,
                note,
            );
            env.check(
                "session-ends-on-kill",
                "a SIGKILLed holder's BOUND session is gone before its ttl could have run out",
                gone.is_some_and(|g| g < expiry_from),
                || {
                    format!(
                        "{name}: INFO ttl {ttl} ms at {info_invoke} us, killed at {killed} us, \
                         gone {gone:?}"
                    )
                },
            );
            if let Some(g) = gone {
                kill_to_gone = kill_to_gone.max(g - killed);
            }
            let fresh = SessionHolder::spawn(env, spec);
            std::mem::replace(&mut holders[i], fresh).finish(env, &mut c);
            continue;
        }
        let pid = holders[i].child.id();
        let patience = ms(ttl as u64 + 1000);
        let (after, gone) = if kind == STOP {
            faults::signal(pid, "STOP");
            let gone = gone_within(env, &mut c, &id, patience);
            let cont = env.now();
            faults::signal(pid, "CONT");
            (cont, gone)
        } else {
            holders[i].link.freeze(Duration::from_secs(60));
            let frozen = env.now();
            let gone = gone_within(env, &mut c, &id, patience);
            holders[i].link.freeze(Duration::ZERO);
            (frozen, gone)
        };
        let note = format!(
            "holder={name} loss_from_us={expiry_from} ({held}; INFO ttl {ttl} ms; session gone \
             {} us after the INFO)",
            gone.map_or("never".to_string(), |g| (g - info_invoke).to_string())
        );
        env.fault_at(
            kind,
            None,
            Effect::MayLose,
            false,
            info_invoke,
            env.now(),
            note,
        );
        env.check(
            "session-expires-unattended",
            "a stopped or cut-off holder's session is gone within its ttl + 1 s",
            gone.is_some(),
            || format!("{name}: {kind}: session {id} still alive {patience:?} after INFO"),
        );
        if gone.is_some() {
            holders[i].lost_after = Some(after);
        }
    }
    for holder in holders {
        holder.finish(env, &mut c);
    }
    env.rec.count(
        "longest from a SIGKILL to its session gone, us (INFO polled every 5 ms)",
        kill_to_gone,
    );
}

/// The scenario's checks over the history: with a lock delay, `lock-delay`; always, the
/// handoffs after each loss are printed (how long the queue waited).
fn session_checks(h: &History, lock_delay_ms: u64) -> Vec<Check> {
    let (check, waits) = lock_delay(h, lock_delay_ms);
    if let (Some(min), Some(max)) = (waits.iter().min(), waits.iter().max()) {
        println!(
            "sessions: {} handoffs after a session loss; the next grant came {:.1} .. {:.1} ms \
             after the loss's earliest moment (lock delay {lock_delay_ms} ms)",
            waits.len(),
            *min as f64 / 1000.0,
            *max as f64 / 1000.0
        );
    }
    if lock_delay_ms > 0 {
        vec![check]
    } else {
        Vec::new()
    }
}

/// Pass: after each loss of a session with a lock delay of `delay_ms`, the first grant of a key
/// the session held (a larger token on that key) completed no sooner than the loss's earliest
/// moment + the delay - [`TOLERANCE`]. A hold counts as held at the loss when its grant
/// completed before that earliest moment and no release of it was sent before the fault ended.
/// Also returns, for every such handoff, how long after the loss's earliest moment it came.
fn lock_delay(h: &History, delay_ms: u64) -> (Check, Vec<Micros>) {
    let mut c = Check::new(
        "lock-delay",
        "after a session loss, nothing it held is granted within its LOCKDELAY (2 ms tolerance)",
    );
    let mut waits = Vec::new();
    for f in &h.faults {
        let Some(rest) = f.note.strip_prefix("holder=") else {
            continue;
        };
        let mut words = rest.split(' ');
        let name = words.next().unwrap_or("");
        let Some(from) = words
            .next()
            .and_then(|w| w.strip_prefix("loss_from_us="))
            .and_then(|w| w.parse::<Micros>().ok())
        else {
            continue;
        };
        let prefix = format!("{name}-");
        for g in h.entries.iter().filter(|e| {
            e.op.is_acquire()
                && e.outcome == Outcome::Ok
                && e.owner.starts_with(&prefix)
                && e.complete <= from
        }) {
            let token = g.token.unwrap_or(0);
            let released = h.entries.iter().any(|e| {
                e.op == Op::Release && e.owner == g.owner && e.key == g.key && e.invoke < f.complete
            });
            if released {
                continue;
            }
            let next = h
                .entries
                .iter()
                .filter(|e| {
                    e.op.is_acquire()
                        && e.key == g.key
                        && e.outcome == Outcome::Ok
                        && e.token.is_some_and(|t| t > token)
                })
                .min_by_key(|e| e.complete);
            let Some(next) = next else { continue };
            c.checked += 1;
            waits.push(next.complete - from);
            if next.complete < from + delay_ms as i64 * 1000 - TOLERANCE {
                c.violations.push(format!(
                    "{} granted {:.3} ms after the loss's earliest moment, within the {delay_ms} \
                     ms lock delay:\n      {f}\n      held: {g}\n      next: {next}",
                    g.key,
                    (next.complete - from) as f64 / 1000.0
                ));
            }
        }
    }
    (c, waits)
}

#[cfg(test)]
mod tests {
    //! The scenario's checks on hand-made histories: each must catch the violation written
    //! into it and accept the same history without it.
    use super::*;
    use crate::checker::{self, Expect};
    use crate::history::{Fault, Mode};

    fn entry(owner: &str, op: Op, at: (f64, f64), outcome: Outcome, token: i64) -> Entry {
        Entry {
            id: 0,
            client: owner.split('-').next().unwrap_or(owner).to_string(),
            key: "lock:0".to_string(),
            owner: owner.to_string(),
            op,
            invoke: (at.0 * 1000.0) as i64,
            complete: (at.1 * 1000.0) as i64,
            wall_ms: 0,
            outcome,
            token: Some(token),
            reply: if outcome == Outcome::Ok {
                "1".into()
            } else {
                "0".into()
            },
        }
    }

    fn grant(owner: &str, ttl: i64, at: (f64, f64), token: i64) -> Entry {
        let op = Op::Acquire {
            ttl,
            block: Some(500),
            mode: Mode::Exclusive,
        };
        entry(owner, op, at, Outcome::Ok, token)
    }

    /// The kill of `sproc1` as the nemesis records it: seen alive at `at.0` ms, killed by `at.1`.
    fn kill(at: (f64, f64)) -> Fault {
        let invoke = (at.0 * 1000.0) as i64;
        Fault {
            kind: KILL.to_string(),
            invoke,
            complete: (at.1 * 1000.0) as i64,
            wall_ms: 0,
            keys: None,
            effect: Effect::MayLose,
            server_side: false,
            note: format!("holder=sproc1 loss_from_us={invoke} (test)"),
        }
    }

    fn history(entries: Vec<Entry>, faults: Vec<Fault>) -> History {
        let mut h = History {
            entries,
            faults,
            ..History::default()
        };
        h.entries.sort_by_key(|e| (e.invoke, e.complete));
        for (i, e) in h.entries.iter_mut().enumerate() {
            e.id = i;
        }
        h
    }

    fn violations(h: &History, name: &str) -> usize {
        let v = checker::check(h, &Default::default(), &Expect { durable: false });
        let c = v.checks.iter().find(|c| c.name == name).expect("the check");
        c.violations.len()
    }

    /// A session hold (60 s ttl) and a waiter granted after it: an overlap unless the kill of
    /// its holder (the session's end) is in the history before the waiter's grant.
    #[test]
    fn overlap_checker_sees_a_session_hold_until_its_loss() {
        let held = grant("sproc1-1", HOLD_TTL_MS, (0.0, 1.0), 10);
        let next = grant("w0-1", 100, (5.0, 20.0), 11);
        let h = history(vec![held.clone(), next.clone()], vec![]);
        assert_eq!(violations(&h, "exclusive-holds"), 1);
        let h = history(vec![held, next], vec![kill((10.0, 11.0))]);
        assert_eq!(violations(&h, "exclusive-holds"), 0);
    }

    #[test]
    fn lock_delay_check_catches_a_grant_inside_the_delay() {
        let held = grant("sproc1-1", HOLD_TTL_MS, (0.0, 1.0), 10);
        let early = grant("w0-1", 100, (5.0, 157.0), 11);
        let h = history(vec![held.clone(), early], vec![kill((10.0, 11.0))]);
        assert_eq!(lock_delay(&h, LOCK_DELAY_MS).0.violations.len(), 1);
        let late = grant("w0-1", 100, (5.0, 161.0), 11);
        let h = history(vec![held.clone(), late.clone()], vec![kill((10.0, 11.0))]);
        assert_eq!(lock_delay(&h, LOCK_DELAY_MS).0.violations.len(), 0);
        // Released before the kill: no delay applies.
        let release = entry("sproc1-1", Op::Release, (8.0, 9.0), Outcome::Ok, 10);
        let early = grant("w0-1", 100, (5.0, 12.0), 11);
        let h = history(vec![held, release, early], vec![kill((10.0, 11.0))]);
        let (check, _) = lock_delay(&h, LOCK_DELAY_MS);
        assert_eq!((check.checked, check.violations.len()), (0, 0));
    }

    #[test]
    fn writes_after_a_loss_must_be_refused() {
        let write = |tag: &str, outcome| {
            let op = Op::FencedWrite {
                read: 0,
                tag: tag.to_string(),
            };
            entry("sproc1-1", op, (0.0, 400.0), outcome, 10)
        };
        let entries = vec![
            write("before", Outcome::Ok),
            write("refused", Outcome::Fail),
            write("accepted", Outcome::Ok),
        ];
        let sent: HashMap<String, Micros> = [("before", 1_000), ("refused", 300_000)]
            .into_iter()
            .chain([("accepted", 300_001)])
            .map(|(t, at)| (t.to_string(), at))
            .collect();
        let (checked, accepted, refused) = writes_after_loss(&entries, &sent, 290_000);
        assert_eq!((checked, accepted.len(), refused), (2, 1, 1));
        assert_eq!(accepted[0].op, entries[2].op);
    }
}
