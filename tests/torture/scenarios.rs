//! The scenarios: one fault (family) each, injected again and again while the workload runs.
//! Each nemesis states its pass criteria where it tallies them; the common checks of
//! `checker.rs` apply to every scenario.

use std::thread;
use std::time::{Duration, Instant};

use rand::Rng;
use redis::Value;

use crate::checker::{Check, Verdict};
use crate::common::{info_field, wait_until};
use crate::faults::{self, Holder};
use crate::history::{Effect, History, Op, Outcome, Survival};
use crate::run::{Env, Scenario};
use crate::workload::{Config, GAVE_UP};

// The scenarios with shared holders live in their own file; the test list finds them here.
pub use crate::pause::{client_pause, client_pause_replica};
pub use crate::shared::{
    semaphore_failover_wait, semaphore_limit, shared_debug_reload, shared_readers_writers,
};

const APPENDFSYNC_ALWAYS: &[&str] = &["--appendonly", "yes", "--appendfsync", "always"];

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn int(v: Option<&Value>) -> Option<i64> {
    match v {
        Some(Value::Int(n)) => Some(*n),
        _ => None,
    }
}

fn is_error(v: Option<&Value>, code: &str) -> bool {
    matches!(v, Some(Value::ServerError(e)) if e.code() == code)
}

/// True if `after` (a `LOCK.FENCE` reply read later in the same transaction) shows the hold
/// `before` (a `LOCK.INFO` reply) unchanged: the same token, or nil when it was free. The module
/// checks liveness against the clock at each command, not once per `EXEC`, so a hold with at
/// most 1 ms left (`ttl` = deadline - now) may read as expired a few microseconds later in the
/// same transaction; nil is accepted for it.
fn same_hold(before: &Value, after: &Value) -> bool {
    match (faults::parse_lock_info(before), after) {
        (Some((_, token, _)), Value::Int(t)) => *t == token,
        (Some((_, _, ttl)), Value::Nil) => ttl <= 1,
        (None, Value::Nil) => true,
        _ => false,
    }
}

/// The token of a `LOCK.INFO` reply.
fn info_token(info: &Value) -> Option<i64> {
    faults::parse_lock_info(info).map(|(_, token, _)| token)
}

// --- No server faults ----------------------------------------------------------------------

pub fn baseline() -> Scenario {
    Scenario {
        name: "baseline",
        what: "the workload alone, no faults",
        server_args: &[],
        replica: false,
        workload: Config::default(),
        durable: true,
        nemesis: watch,
        post: None,
    }
}

pub fn multikey() -> Scenario {
    Scenario {
        name: "multikey",
        what: "half the lock attempts take 2-3 keys at once with LOCK.MACQUIRE (half of them \
               BLOCK), the rest single keys, no faults",
        server_args: &[],
        replica: false,
        workload: Config {
            multi_share: 0.5,
            ..Config::default()
        },
        durable: true,
        nemesis: watch,
        post: None,
    }
}

/// Only watch: read every key's token now and then (tokens known for the epoch check).
fn watch(env: &mut Env) {
    while env.running() {
        env.sleep((50, 150));
        env.observe_tokens();
    }
}

// --- Client faults --------------------------------------------------------------------------

pub fn gc_pause_threads() -> Scenario {
    Scenario {
        name: "gc_pause_threads",
        what: "holders stall past their ttl between reading and writing (thread sleep)",
        server_args: &[],
        replica: false,
        workload: Config {
            pause_share: 0.3,
            ..Config::default()
        },
        durable: true,
        nemesis: watch,
        post: Some(pauses_bite),
    }
}

/// Pass: the pauses did what they are for. The unfenced counter lost updates (a paused holder
/// wrote over a newer holder's write) and the fence refused stale writes; the fenced list lost
/// none (checked by `fenced-lost-updates`). Zero unfenced losses would mean the scenario tested
/// nothing.
fn pauses_bite(_h: &History, v: &Verdict) -> Vec<Check> {
    let mut c = Check::new(
        "pauses-bite",
        "the pauses made the unfenced counter lose updates and the fence refuse stale writes",
    );
    c.checked = 1;
    if v.lost_unfenced == 0 || v.refused == 0 {
        c.violations.push(format!(
            "unfenced lost updates {}, refused fenced writes {}: the pauses never overlapped \
             another holder (the scenario tested nothing)",
            v.lost_unfenced, v.refused
        ));
    }
    vec![c]
}

pub fn sigstop_holders() -> Scenario {
    Scenario {
        name: "sigstop_holders",
        what: "holder processes are SIGSTOPped past their ttl, and SIGKILLed (also while waiting)",
        server_args: &[],
        replica: false,
        workload: Config {
            workers: 4,
            ..Config::default()
        },
        durable: true,
        nemesis: stop_and_kill_holders,
        post: Some(pauses_bite),
    }
}

/// Two holder processes run beside the threads. Every 30-120 ms the nemesis waits (up to
/// 300 ms) for one of them to hold a lock (`LOCK.INFO` shows its owner) and stops it for
/// longer than the longest ttl, then continues it; a holder spends most of a hold between a
/// write's read and its write, so that is where the stop usually lands. Every 0.4-0.8 s one is
/// SIGKILLed, preferably while it waits in `BLOCK` (`CLIENT LIST`), and replaced.
fn stop_and_kill_holders(env: &mut Env) {
    let mut holders: Vec<Holder> = (0..2).map(|_| Holder::spawn(env)).collect();
    let mut c = env.conn();
    let mut next_kill = Instant::now() + ms(env.rng.gen_range(400..=800));
    while env.running() {
        env.sleep((30, 120));
        for slot in holders.iter_mut() {
            if slot.exited() {
                let fresh = Holder::spawn(env);
                std::mem::replace(slot, fresh).finish(env);
            }
        }
        let holding = |c: &mut redis::Connection, env: &Env, holders: &[Holder]| {
            env.keys().iter().find_map(|key| {
                let (owner, _, _) = faults::lock_info(c, key)?;
                holders
                    .iter()
                    .position(|h| owner.starts_with(&format!("{}-", h.name)))
            })
        };
        let give_up = Instant::now() + ms(300);
        let mut target = holding(&mut c, env, &holders);
        while target.is_none() && Instant::now() < give_up && env.running() {
            thread::sleep(ms(2));
            target = holding(&mut c, env, &holders);
        }
        let (kind, i) = match target {
            Some(i) => (
                "SIGSTOP of a holder process (holding a lock) past its ttl",
                i,
            ),
            None => (
                "SIGSTOP of a holder process past its ttl",
                env.rng.gen_range(0..holders.len()),
            ),
        };
        let (pid, name) = (holders[i].pid(), holders[i].name.clone());
        let pause = env.cfg.ttl_ms.1 as u64 + env.rng.gen_range(20..=80);
        env.inject(kind, None, Effect::Keeps, false, |_| {
            faults::signal(pid, "STOP");
            thread::sleep(ms(pause));
            faults::signal(pid, "CONT");
            ((), format!("{name} (pid {pid}) stopped {pause} ms"))
        });
        if Instant::now() < next_kill {
            continue;
        }
        let blocked = |c: &mut redis::Connection, holders: &[Holder]| {
            let waiting = faults::waiters(c, "proc");
            holders
                .iter()
                .position(|h| waiting.iter().any(|w| w.name == h.name))
        };
        let give_up = Instant::now() + ms(300);
        let mut victim = blocked(&mut c, &holders);
        while victim.is_none() && Instant::now() < give_up {
            thread::sleep(ms(2));
            victim = blocked(&mut c, &holders);
        }
        let (kind, i) = match victim {
            Some(i) => ("SIGKILL of a holder process waiting in BLOCK", i),
            None => (
                "SIGKILL of a holder process",
                env.rng.gen_range(0..holders.len()),
            ),
        };
        let name = holders[i].name.clone();
        env.inject(kind, None, Effect::Keeps, false, |_| {
            holders[i].kill();
            ((), name)
        });
        let fresh = Holder::spawn(env);
        std::mem::replace(&mut holders[i], fresh).finish(env);
        next_kill = Instant::now() + ms(env.rng.gen_range(400..=800));
    }
    for holder in holders {
        holder.finish(env);
    }
}

pub fn waiters_killed_and_unblocked() -> Scenario {
    Scenario {
        name: "waiters_killed_and_unblocked",
        what: "waiters are CLIENT KILLed, CLIENT UNBLOCKed (TIMEOUT and ERROR), or disconnect",
        server_args: &[],
        replica: false,
        workload: Config {
            block_share: 0.8,
            block_ms: (50, 400),
            disconnect_share: 0.1,
            ..Config::default()
        },
        durable: true,
        nemesis: disturb_waiters,
        post: Some(unblocked_waiters_get_no_lock),
    }
}

const UNBLOCK_TIMEOUT: &str = "CLIENT UNBLOCK of a waiter";
const UNBLOCK_ERROR: &str = "CLIENT UNBLOCK ... ERROR of a waiter";

/// Every 20-80 ms, pick a client blocked in `LOCK.ACQUIRE ... BLOCK` and kill it, unblock it
/// like a timeout, or unblock it with an error. (The workload's own clients also give up on
/// 10% of their waits: read timeout, disconnect.)
pub fn disturb_waiters(env: &mut Env) {
    let mut c = env.conn();
    while env.running() {
        env.sleep((20, 80));
        let Some(victim) = env.choose(&faults::waiters(&mut c, "w")) else {
            continue;
        };
        let id = victim.id.to_string();
        let (kind, args) = match env.rng.gen_range(0..3) {
            0 => ("CLIENT KILL of a waiter", vec!["KILL", "ID", &id]),
            1 => (UNBLOCK_TIMEOUT, vec!["UNBLOCK", &id, "TIMEOUT"]),
            _ => (UNBLOCK_ERROR, vec!["UNBLOCK", &id, "ERROR"]),
        };
        env.inject(kind, None, Effect::Keeps, false, |_| {
            let reply: Value = redis::cmd("CLIENT")
                .arg(&args)
                .query(&mut c)
                .unwrap_or_else(|e| panic!("CLIENT {args:?}: {e}"));
            ((), format!("victim={} reply={reply:?}", victim.name))
        });
    }
}

/// Pass: a waiter that `CLIENT UNBLOCK` reports as unblocked (reply 1) gets `nil` (TIMEOUT) or
/// an `UNBLOCKED` error (ERROR), never a token: its call of `LOCK.ACQUIRE` spanning the
/// unblock is not granted.
pub fn unblocked_waiters_get_no_lock(h: &History, _v: &Verdict) -> Vec<Check> {
    let mut c = Check::new(
        "unblocked-waiter-not-granted",
        "a waiter CLIENT UNBLOCK unblocked answers nil (TIMEOUT) or UNBLOCKED (ERROR), never a token",
    );
    for f in h
        .faults
        .iter()
        .filter(|f| f.kind == UNBLOCK_TIMEOUT || f.kind == UNBLOCK_ERROR)
    {
        if !f.note.ends_with("reply=int(1)") {
            continue; // it was no longer blocked
        }
        let victim = f
            .note
            .strip_prefix("victim=")
            .and_then(|n| n.split(' ').next())
            .unwrap_or("");
        let Some(call) = h.entries.iter().find(|e| {
            e.client == victim
                && matches!(e.op, Op::Acquire { block: Some(_), .. })
                && e.invoke < f.invoke
                && e.complete > f.invoke
        }) else {
            continue;
        };
        if call.reply == GAVE_UP {
            // The client gave up on this wait (read timeout, then disconnect) while the unblock
            // was on its way: it read no reply, so there is nothing to judge (a token would
            // have been read as one). Seen once in a 60 s run of shared_readers_writers.
            continue;
        }
        c.checked += 1;
        let expected = if f.kind == UNBLOCK_ERROR {
            call.reply.starts_with("UNBLOCKED")
        } else {
            call.reply == "nil"
        };
        if call.outcome == Outcome::Ok || !expected {
            c.violations.push(format!("{f}\n      answered: {call}"));
        }
    }
    vec![c]
}

// --- Server restarts ------------------------------------------------------------------------

pub fn kill9_aof_always() -> Scenario {
    Scenario {
        name: "kill9_aof_always",
        what: "redis-server is killed with -9 and restarted, AOF with appendfsync always",
        server_args: APPENDFSYNC_ALWAYS,
        replica: false,
        workload: Config::default(),
        durable: true,
        nemesis: |env| {
            restarts(
                env,
                "kill -9 + restart (appendfsync always)",
                Effect::Keeps,
                Some(Survival::Acked),
            )
        },
        post: None,
    }
}

pub fn kill9_aof_everysec() -> Scenario {
    Scenario {
        name: "kill9_aof_everysec",
        what: "redis-server is killed with -9 and restarted, AOF with appendfsync everysec",
        server_args: &["--appendonly", "yes", "--appendfsync", "everysec"],
        replica: false,
        workload: Config::default(),
        durable: false,
        nemesis: |env| {
            restarts(
                env,
                "kill -9 + restart (appendfsync everysec)",
                Effect::MayLose,
                Some(Survival::Informational),
            )
        },
        post: None,
    }
}

pub fn kill9_no_persistence() -> Scenario {
    Scenario {
        name: "kill9_no_persistence",
        what: "redis-server is killed with -9 and restarted with no RDB and no AOF",
        server_args: &[],
        replica: false,
        workload: Config::default(),
        durable: false,
        nemesis: |env| {
            restarts(
                env,
                "kill -9 + restart (no persistence)",
                Effect::Destroys,
                None,
            )
        },
        post: None,
    }
}

/// Every 0.3-0.7 s: kill the server with SIGKILL and restart it on the same port and files.
/// The workload cannot reach it until the holds were read back (`survival`).
pub fn restarts(env: &mut Env, kind: &str, effect: Effect, survival: Option<Survival>) {
    while env.running() {
        env.sleep((300, 700));
        if env.running() {
            restart(env, kind, effect, survival);
        }
    }
}

/// One kill -9 and restart. Tokens issued before it are known from `INFO` and from the AOF.
/// Returns how many `LOCK.LOAD`s the AOF's base files hold (written by a rewrite).
fn restart(env: &mut Env, kind: &str, effect: Effect, survival: Option<Survival>) -> u64 {
    env.observe_high_water();
    env.target.set(None);
    let (fault, ()) = env.inject(kind, None, effect, true, |env| {
        env.primary.kill9();
        env.primary.restart();
        ((), String::new())
    });
    // Read before any client is back, so only what the killed server wrote is in there.
    let (aof_max, in_base) = faults::aof_tokens(env.primary.dir());
    if let Some(token) = aof_max {
        let at = env.rec.with_fault(fault, |f| f.invoke);
        env.rec.observe(
            at,
            token,
            "the largest token in the killed server's AOF".to_string(),
        );
    }
    if let Some(survival) = survival {
        env.snapshot(fault, survival);
    }
    env.target.set(Some(env.primary.port()));
    in_base
}

pub fn debug_reload() -> Scenario {
    Scenario {
        name: "debug_reload",
        what: "DEBUG RELOAD (save, flush, load the RDB) in the middle of the workload",
        server_args: &[],
        replica: false,
        workload: Config::default(),
        durable: true,
        nemesis: reloads,
        post: None,
    }
}

/// Every 150-400 ms: `MULTI; DEBUG RELOAD; LOCK.INFO` of every key; `EXEC`. The reads are
/// atomic with the reload, so every acknowledged live hold must be among them (`Acked`).
pub fn reloads(env: &mut Env) {
    let mut c = env.conn();
    while env.running() {
        env.sleep((150, 400));
        let keys = env.keys();
        let mut cmds = vec![redis::cmd("DEBUG").arg("RELOAD").clone()];
        cmds.extend(keys.iter().map(|k| redis::cmd("LOCK.INFO").arg(k).clone()));
        let (replies, invoke, complete) =
            faults::transaction(&env.rec, &mut c, &cmds).expect("MULTI DEBUG RELOAD");
        let fault = env.fault_at(
            "DEBUG RELOAD",
            None,
            Effect::Keeps,
            true,
            invoke,
            complete,
            String::new(),
        );
        env.check(
            "debug-reload-ok",
            "DEBUG RELOAD answers OK",
            replies.first() == Some(&Value::Okay),
            || format!("DEBUG RELOAD answered {:?}", replies.first()),
        );
        let holds = keys
            .iter()
            .zip(&replies[1..])
            .map(|(k, v)| {
                let holders = faults::parse_holders(v).into_iter();
                (
                    k.clone(),
                    holders.map(|(owner, token, _)| (owner, token)).collect(),
                )
            })
            .collect();
        env.rec.snapshot(crate::history::Snapshot {
            fault,
            invoke,
            complete,
            holds,
            survival: Survival::Acked,
        });
    }
}

pub fn bgrewriteaof() -> Scenario {
    Scenario {
        name: "bgrewriteaof",
        what: "BGREWRITEAOF (plain AOF, no RDB preamble: the module rewrites holds as \
               LOCK.LOAD), with a kill -9 and restart from the rewritten AOF after every second",
        server_args: &[
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--aof-use-rdb-preamble",
            "no",
        ],
        replica: false,
        workload: Config::default(),
        durable: true,
        nemesis: rewrites,
        post: None,
    }
}

/// Every 100-300 ms: `BGREWRITEAOF` and wait for it to finish; after every second rewrite,
/// kill -9 and restart (the restart loads the rewritten base).
fn rewrites(env: &mut Env) {
    let mut done = 0;
    while env.running() {
        env.sleep((100, 300));
        if !env.running() {
            break;
        }
        env.inject("BGREWRITEAOF", None, Effect::Keeps, true, |env| {
            let mut c = env.conn();
            let reply: String = redis::cmd("BGREWRITEAOF")
                .query(&mut c)
                .expect("BGREWRITEAOF");
            wait_until("the AOF rewrite", Duration::from_secs(20), || {
                info_field(&mut c, "persistence", "aof_rewrite_in_progress").as_deref() == Some("0")
                    && info_field(&mut c, "persistence", "aof_rewrite_scheduled").as_deref()
                        == Some("0")
            });
            ((), reply)
        });
        done += 1;
        if done % 2 == 0 && env.running() {
            let in_base = restart(
                env,
                "kill -9 + restart from a rewritten AOF",
                Effect::Keeps,
                Some(Survival::Acked),
            );
            env.rec.count(
                "LOCK.LOAD commands in the rewritten AOF bases loaded",
                in_base as i64,
            );
        }
    }
}

// --- Keyspace commands ----------------------------------------------------------------------

pub fn flushall() -> Scenario {
    Scenario {
        name: "flushall",
        what: "FLUSHALL, FLUSHALL ASYNC and FLUSHDB in the middle of the workload",
        server_args: &[],
        replica: false,
        workload: Config::default(),
        durable: false,
        nemesis: flushes,
        post: None,
    }
}

/// Every 80-250 ms, one of the flushes. They drop every hold (`Destroys`): the holders'
/// fenced writes must be refused from then on, and tokens keep growing.
fn flushes(env: &mut Env) {
    let mut c = env.conn();
    while env.running() {
        env.sleep((80, 250));
        let which = env
            .choose(&["FLUSHALL", "FLUSHALL ASYNC", "FLUSHDB"])
            .unwrap();
        env.inject(which, None, Effect::Destroys, true, |_| {
            let args: Vec<&str> = which.split(' ').collect();
            let reply = faults::raw(&mut c, &args);
            ((), format!("{reply:?}"))
        });
    }
}

pub fn swapdb() -> Scenario {
    Scenario {
        name: "swapdb",
        what: "SWAPDB 0 1 (db 1 emptied first) in the middle of the workload",
        server_args: &[],
        replica: false,
        workload: Config::default(),
        durable: false,
        nemesis: swaps,
        post: None,
    }
}

/// Every 120-300 ms, atomically: empty db 1, read db 0's holds, `SWAPDB 0 1`, read db 1's.
/// The workload's keys are then empty (`Destroys`). Pass: each hold swapped away is in db 1
/// with the token it had (a swap moves holds, it grants nothing).
fn swaps(env: &mut Env) {
    let mut c = env.conn();
    while env.running() {
        env.sleep((120, 300));
        let keys = env.keys();
        let fence = |k: &String| redis::cmd("LOCK.FENCE").arg(k).clone();
        let info = |k: &String| redis::cmd("LOCK.INFO").arg(k).clone();
        let mut cmds = vec![
            redis::cmd("SELECT").arg(1).clone(),
            redis::cmd("FLUSHDB").clone(),
            redis::cmd("SELECT").arg(0).clone(),
        ];
        cmds.extend(keys.iter().map(info));
        cmds.push(redis::cmd("SWAPDB").arg(0).arg(1).clone());
        cmds.push(redis::cmd("SELECT").arg(1).clone());
        cmds.extend(keys.iter().map(fence));
        cmds.push(redis::cmd("SELECT").arg(0).clone());
        let (replies, invoke, complete) =
            faults::transaction(&env.rec, &mut c, &cmds).expect("MULTI SWAPDB");
        let n = keys.len();
        let (before, after) = (&replies[3..3 + n], &replies[5 + n..5 + 2 * n]);
        env.fault_at(
            "SWAPDB 0 1",
            None,
            Effect::Destroys,
            true,
            invoke,
            complete,
            format!("db 0 tokens {before:?}"),
        );
        for (k, (b, a)) in keys.iter().zip(before.iter().zip(after)) {
            env.check(
                "swapped-hold-keeps-token",
                "a hold swapped into db 1 has the token it had in db 0",
                same_hold(b, a),
                || format!("{k}: {b:?} in db 0 before SWAPDB, {a:?} in db 1 after"),
            );
            if let Some(t) = info_token(b) {
                env.rec
                    .observe(complete, t, format!("LOCK.INFO {k} before SWAPDB"));
            }
        }
    }
}

pub fn rename_and_move() -> Scenario {
    Scenario {
        name: "rename_and_move",
        what: "RENAME of a lock key to another name, MOVE to db 1, in the middle of the workload",
        server_args: &[],
        replica: false,
        workload: Config::default(),
        durable: true,
        nemesis: renames_and_moves,
        post: None,
    }
}

/// Every 40-150 ms, atomically with reading the hold before and after: `RENAME lock:i
/// moved:n` or `MOVE lock:i 1` (then the moved key is deleted). The lock key is then empty
/// (`Destroys` for that key). Pass: the moved hold carries the token it had (it is not a new
/// grant, and its token is not above the ones already issued).
fn renames_and_moves(env: &mut Env) {
    let mut c = env.conn();
    let mut n = 0;
    while env.running() {
        env.sleep((40, 150));
        let key = env.random_key();
        n += 1;
        let fence = |k: &str| redis::cmd("LOCK.FENCE").arg(k).clone();
        let info = redis::cmd("LOCK.INFO").arg(&key).clone();
        let (kind, cmds, moved_at) = if env.rng.gen_bool(0.5) {
            let dest = format!("moved:{n}");
            let cmds = vec![
                info.clone(),
                redis::cmd("RENAME").arg(&key).arg(&dest).clone(),
                fence(&dest),
                redis::cmd("DEL").arg(&dest).clone(),
            ];
            ("RENAME of a lock key", cmds, 2)
        } else {
            let cmds = vec![
                info,
                redis::cmd("MOVE").arg(&key).arg(1).clone(),
                redis::cmd("SELECT").arg(1).clone(),
                fence(&key),
                redis::cmd("DEL").arg(&key).clone(),
                redis::cmd("SELECT").arg(0).clone(),
            ];
            ("MOVE of a lock key to db 1", cmds, 3)
        };
        let (replies, invoke, complete) =
            faults::transaction(&env.rec, &mut c, &cmds).expect("MULTI RENAME/MOVE");
        let moved = matches!(replies[1], Value::Okay | Value::Int(1));
        env.fault_at(
            kind,
            Some(vec![key.clone()]),
            Effect::Destroys,
            true,
            invoke,
            complete,
            format!("{key}: {:?} -> {:?}", replies[0], replies[1]),
        );
        if moved {
            env.check(
                "moved-hold-keeps-token",
                "after RENAME or MOVE the hold carries the token it had (no new grant)",
                same_hold(&replies[0], &replies[moved_at]),
                || {
                    format!(
                        "{kind} {key}: token {:?} before, {:?} after",
                        replies[0], replies[moved_at]
                    )
                },
            );
        }
        if let Some(t) = info_token(&replies[0]) {
            env.rec
                .observe(complete, t, format!("LOCK.INFO {key} before {kind}"));
        }
    }
}

pub fn restore_truncated_dump() -> Scenario {
    Scenario {
        name: "restore_truncated_dump",
        what: "RESTORE ... REPLACE of truncated DUMPs over live locks (bad and valid checksums), \
               RESTORE of an intact DUMP under another name",
        server_args: &[],
        replica: false,
        workload: Config::default(),
        durable: true,
        nemesis: restores,
        post: None,
    }
}

/// Every 40-120 ms, on a random held key:
/// 1. `RESTORE key 0 <prefix of its DUMP> REPLACE` (the checksum fails), and
/// 2. the same with the value cut short (by more than 10 bytes) but a valid checksum, so the
///    module's own loader meets the short data;
///
/// each between `LOCK.INFO key` and `LOCK.FENCE key` in one transaction. Pass: refused with an
/// error, the hold unchanged, the server still answers.
/// 3. `RESTORE restored:n 0 <the DUMP>`: pass: it carries the dumped token (or is already
///    expired), no new grant.
fn restores(env: &mut Env) {
    let mut c = env.conn();
    let mut n = 0;
    while env.running() {
        env.sleep((40, 120));
        let key = env.random_key();
        n += 1;
        let fence = || redis::cmd("LOCK.FENCE").arg(&key).clone();
        let info = || redis::cmd("LOCK.INFO").arg(&key).clone();
        let dump = redis::cmd("DUMP").arg(&key).clone();
        let (replies, _, complete) =
            faults::transaction(&env.rec, &mut c, &[fence(), dump]).expect("MULTI DUMP");
        let (token, Value::BulkString(payload)) = (replies[0].clone(), replies[1].clone()) else {
            continue; // free: nothing to dump
        };
        if let Value::Int(t) = token {
            env.rec
                .observe(complete, t, format!("LOCK.FENCE {key} before DUMP"));
        }
        assert!(
            faults::checksum_matches(&payload),
            "crc64 here disagrees with the server's DUMP checksum: fix faults::crc64"
        );
        // The value is followed by the 10-byte footer, and the server's parser reads on into
        // it: a value missing 10 bytes or fewer can be completed by the footer's own bytes
        // into a different but valid lock (a cut in the deadline's last byte yields a deadline
        // ending in the RDB version byte 0x0a, then its 0x00 reads as the end marker). The
        // server is right to accept that, so the cut leaves more than 10 bytes missing.
        let value_len = payload.len() - 10;
        let bad_checksum = payload[..env.rng.gen_range(1..payload.len())].to_vec();
        let short_value = faults::truncated_dump(&payload, env.rng.gen_range(1..value_len - 10));
        for (kind, bytes) in [
            ("RESTORE of a truncated DUMP (bad checksum)", bad_checksum),
            ("RESTORE of a truncated DUMP (valid checksum)", short_value),
        ] {
            let restore = redis::cmd("RESTORE")
                .arg(&key)
                .arg(0)
                .arg(&bytes)
                .arg("REPLACE")
                .clone();
            let (r, invoke, complete) =
                faults::transaction(&env.rec, &mut c, &[info(), restore, fence()])
                    .expect("MULTI RESTORE");
            env.fault_at(
                kind,
                Some(vec![key.clone()]),
                Effect::Keeps,
                true,
                invoke,
                complete,
                format!("{} of {} bytes: {:?}", key, bytes.len(), r[1]),
            );
            env.check(
                "truncated-restore-refused",
                "RESTORE of a truncated DUMP answers an error and leaves the hold as it was",
                matches!(r[1], Value::ServerError(_)) && same_hold(&r[0], &r[2]),
                || {
                    format!(
                        "{kind} {key}: {:?}, hold {:?} before, token {:?} after",
                        r[1], r[0], r[2]
                    )
                },
            );
            let pong: Result<String, _> = redis::cmd("PING").query(&mut c);
            env.check(
                "server-survives-restore",
                "the server still answers PING after RESTORE of a truncated DUMP",
                pong.as_deref() == Ok("PONG"),
                || format!("PING after {kind}: {pong:?}"),
            );
        }
        let dest = format!("restored:{n}");
        let (r, invoke, complete) = faults::transaction(
            &env.rec,
            &mut c,
            &[
                redis::cmd("RESTORE")
                    .arg(&dest)
                    .arg(0)
                    .arg(&payload)
                    .clone(),
                redis::cmd("LOCK.FENCE").arg(&dest).clone(),
                redis::cmd("DEL").arg(&dest).clone(),
            ],
        )
        .expect("MULTI RESTORE intact");
        env.fault_at(
            "RESTORE of an intact DUMP under another name",
            Some(Vec::new()),
            Effect::Keeps,
            true,
            invoke,
            complete,
            format!("{dest}: {:?}, {:?}", r[0], r[1]),
        );
        env.check(
            "restored-hold-keeps-token",
            "RESTORE of a lock's DUMP carries the dumped token (or is already expired): no grant",
            r[0] == Value::Okay && (r[1] == token || r[1] == Value::Nil),
            || {
                format!(
                    "{dest} from {key} (token {token:?}): {:?}, {:?}",
                    r[0], r[1]
                )
            },
        );
    }
}

// --- Failover -------------------------------------------------------------------------------

/// Primaries and replicas keep an AOF (`appendfsync no`: written before each reply, which is
/// all a SIGKILL needs) only so that every token a killed primary issued can be read back.
pub const FORENSIC_AOF: &[&str] = &["--appendonly", "yes", "--appendfsync", "no"];

pub fn failover_async() -> Scenario {
    Scenario {
        name: "failover_async",
        what: "the replica is SIGSTOPped (misses grants), the primary killed -9, the replica \
               continued and promoted",
        server_args: FORENSIC_AOF,
        replica: true,
        workload: Config::default(),
        durable: false,
        nemesis: |env| failovers(env, (200, 400), Survival::Informational),
        post: None,
    }
}

pub fn failover_wait() -> Scenario {
    Scenario {
        name: "failover_wait",
        what: "as failover_async, with WAIT 1 1000 after every grant and longer ttls: waited \
               locks must survive promotion",
        server_args: FORENSIC_AOF,
        replica: true,
        workload: Config {
            keys: 6,
            ttl_ms: (300, 2000),
            expire_share: 0.3,
            wait_replicas: true,
            ..Config::default()
        },
        durable: false,
        nemesis: |env| failovers(env, (50, 150), Survival::WaitAcked),
        post: None,
    }
}

/// Every 0.4-0.8 s: stop the replica for `stop_ms`, kill -9 the primary, continue the replica,
/// `REPLICAOF NO ONE`, read its holds (before the workload can reach it), point the workload
/// at it and give it a new replica. Tokens the dead primary issued are known from its AOF.
pub fn failovers(env: &mut Env, stop_ms: (u64, u64), survival: Survival) {
    while env.running() {
        env.sleep((400, 800));
        if !env.running() {
            break;
        }
        let replica = env.replica.take().expect("a replica");
        let pid = faults::server_pid(&replica);
        env.inject("SIGSTOP of the replica", None, Effect::Keeps, true, |env| {
            faults::signal(pid, "STOP");
            let pause = env.rng.gen_range(stop_ms.0..=stop_ms.1);
            thread::sleep(ms(pause));
            (
                (),
                format!("pid {pid} for {pause} ms, then the primary is killed"),
            )
        });
        env.observe_high_water();
        env.target.set(None);
        let (fault, ()) = env.inject(
            "kill -9 of the primary, promotion of the stopped replica",
            None,
            Effect::MayLose,
            true,
            |env| {
                env.primary.kill9();
                faults::signal(pid, "CONT");
                let mut r = replica.conn();
                redis::cmd("REPLICAOF")
                    .arg("NO")
                    .arg("ONE")
                    .query::<()>(&mut r)
                    .expect("REPLICAOF NO ONE");
                wait_until(
                    "the promoted replica's role",
                    Duration::from_secs(10),
                    || info_field(&mut r, "replication", "role").as_deref() == Some("master"),
                );
                ((), format!("new primary on port {}", replica.port()))
            },
        );
        let (aof_max, _) = faults::aof_tokens(env.primary.dir());
        if let Some(token) = aof_max {
            let at = env.rec.with_fault(fault, |f| f.invoke);
            env.rec.observe(
                at,
                token,
                "the largest token in the dead primary's AOF".to_string(),
            );
        }
        let dead = std::mem::replace(&mut env.primary, replica);
        env.retired.push(dead);
        env.snapshot(fault, survival);
        env.target.set(Some(env.primary.port()));
        env.replica = Some(env.start_replica());
    }
}

// --- Memory pressure ------------------------------------------------------------------------

const OOM_WINDOW: &str = "maxmemory below used memory (noeviction)";

pub fn maxmemory_noeviction() -> Scenario {
    Scenario {
        name: "maxmemory_noeviction",
        what: "maxmemory set below used memory with noeviction, for 100-250 ms at a time",
        server_args: &["--maxmemory-policy", "noeviction"],
        replica: false,
        workload: Config::default(),
        durable: true,
        nemesis: oom_windows,
        post: Some(oom_refuses_grants_not_releases),
    }
}

/// Every 150-350 ms: `CONFIG SET maxmemory` to half the used memory for 100-250 ms, then back
/// to 0. The fault's interval is the window in which the limit certainly applied.
fn oom_windows(env: &mut Env) {
    let mut c = env.conn();
    while env.running() {
        env.sleep((150, 350));
        let used: i64 = info_field(&mut c, "memory", "used_memory")
            .and_then(|u| u.parse().ok())
            .expect("used_memory");
        let set = |c: &mut redis::Connection, limit: i64| {
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("maxmemory")
                .arg(limit)
                .query::<()>(c)
                .expect("CONFIG SET maxmemory")
        };
        set(&mut c, used / 2);
        let invoke = env.now();
        env.sleep((100, 250));
        let complete = env.now();
        set(&mut c, 0);
        env.fault_at(
            OOM_WINDOW,
            None,
            Effect::Keeps,
            true,
            invoke,
            complete,
            format!("maxmemory {} (used {used})", used / 2),
        );
    }
}

/// Pass: inside a window, every `LOCK.ACQUIRE` answers the `OOM` error (none is granted), and
/// every `LOCK.RELEASE` answers 1 or 0 (never an error: releasing frees memory). At least one
/// `OOM` was seen (else the scenario tested nothing).
fn oom_refuses_grants_not_releases(h: &History, _v: &Verdict) -> Vec<Check> {
    let mut acquire = Check::new(
        "oom-refuses-acquire",
        "under maxmemory with noeviction, LOCK.ACQUIRE answers OOM (and at least one did)",
    );
    let mut release = Check::new(
        "oom-allows-release",
        "under maxmemory with noeviction, LOCK.RELEASE still answers 1 or 0",
    );
    let mut ooms = 0;
    for f in h.faults.iter().filter(|f| f.kind == OOM_WINDOW) {
        for e in h
            .entries
            .iter()
            .filter(|e| e.invoke > f.invoke && e.complete < f.complete)
        {
            match e.op {
                Op::Acquire { .. } => {
                    acquire.checked += 1;
                    if e.reply.starts_with("OOM") {
                        ooms += 1;
                    } else {
                        acquire.violations.push(format!("{f}\n      {e}"));
                    }
                }
                Op::Release => {
                    release.checked += 1;
                    if e.outcome == Outcome::Fail && e.reply != "0" {
                        release.violations.push(format!("{f}\n      {e}"));
                    }
                }
                _ => {}
            }
        }
    }
    if ooms == 0 {
        acquire
            .violations
            .push("no LOCK.ACQUIRE answered OOM: the windows never bit".to_string());
    }
    vec![acquire, release]
}

pub fn maxmemory_allkeys_lru() -> Scenario {
    Scenario {
        name: "maxmemory_allkeys_lru",
        what: "maxmemory 1 byte with allkeys-lru for an instant: every key, locks included, \
               is evicted",
        server_args: &["--maxmemory-policy", "allkeys-lru"],
        replica: false,
        workload: Config::default(),
        durable: false,
        nemesis: evictions,
        post: None,
    }
}

/// Every 150-350 ms: take a probe lock, set `maxmemory 1`, write once (the server evicts every
/// key it can), check the probe is gone, lift the limit, take the probe lock again. Pass: the
/// evicted lock's next token is larger.
fn evictions(env: &mut Env) {
    let mut c = env.conn();
    let mut n = 0;
    while env.running() {
        env.sleep((150, 350));
        n += 1;
        let probe = format!("probe:{n}");
        let acquire = |c: &mut redis::Connection, owner: &str| -> Option<i64> {
            redis::cmd("LOCK.ACQUIRE")
                .arg(&probe)
                .arg(owner)
                .arg(60_000)
                .query(c)
                .ok()
        };
        let Some(first) = acquire(&mut c, "probe-a") else {
            continue;
        };
        env.rec
            .observe(env.now(), first, format!("probe lock {probe}"));
        let (_, evicted) = env.inject(
            "maxmemory 1 byte (allkeys-lru): every key evicted",
            None,
            Effect::MayLose,
            true,
            |_| {
                let set = |c: &mut redis::Connection, limit: i64| {
                    redis::cmd("CONFIG")
                        .arg("SET")
                        .arg("maxmemory")
                        .arg(limit)
                        .query::<()>(c)
                        .expect("CONFIG SET maxmemory")
                };
                set(&mut c, 1);
                let write: Value = redis::cmd("SET")
                    .arg(format!("filler:{n}"))
                    .arg("x")
                    .query(&mut c)
                    .unwrap_or(Value::Nil);
                let gone: i64 = redis::cmd("EXISTS")
                    .arg(&probe)
                    .query(&mut c)
                    .expect("EXISTS");
                set(&mut c, 0);
                (
                    gone == 0,
                    format!("SET answered {write:?}; probe evicted: {}", gone == 0),
                )
            },
        );
        if evicted {
            env.rec.count("lock keys evicted (probes)", 1);
            let next = acquire(&mut c, "probe-b");
            env.check(
                "evicted-lock-next-token-larger",
                "after a lock key is evicted, its next grant has a larger token",
                next.is_some_and(|t| t > first),
                || format!("{probe}: token {first} before eviction, {next:?} after"),
            );
        }
        let _: i64 = redis::cmd("DEL")
            .arg(&probe)
            .query(&mut c)
            .expect("DEL probe");
    }
    let evicted = info_field(&mut c, "stats", "evicted_keys")
        .and_then(|e| e.parse().ok())
        .unwrap_or(0);
    env.rec.count("keys evicted (INFO stats)", evicted);
}

// --- ACL ------------------------------------------------------------------------------------

pub fn acl() -> Scenario {
    Scenario {
        name: "acl",
        what: "users limited to ~other:* and to %R~lock:* probe the lock keys while they are used",
        server_args: &[],
        replica: false,
        workload: Config::default(),
        durable: true,
        nemesis: acl_probes,
        post: None,
    }
}

/// Every 20-80 ms, on a random key (and its live owner and token, read as the admin):
/// - as `other` (`~other:*`): pass: every lock command answers `NOPERM`;
/// - as `reader` (`%R~lock:*`): pass: `LOCK.FENCE` (with and without a token) and `LOCK.INFO`
///   answer, the writes answer `NOPERM`.
fn acl_probes(env: &mut Env) {
    let mut admin = env.conn();
    for rule in [
        ["SETUSER", "other", "on", ">pw", "~other:*", "+@all"],
        ["SETUSER", "reader", "on", ">pw", "%R~lock:*", "+@all"],
    ] {
        redis::cmd("ACL")
            .arg(&rule)
            .query::<()>(&mut admin)
            .expect("ACL SETUSER");
    }
    let mut other = faults::conn_as(&env.primary, "other", "pw");
    let mut reader = faults::conn_as(&env.primary, "reader", "pw");
    while env.running() {
        env.sleep((20, 80));
        let key = env.random_key();
        let (owner, token) = match faults::lock_info(&mut admin, &key) {
            Some((owner, token, _)) => (owner, token),
            None => ("nobody".to_string(), 1),
        };
        let token = token.to_string();
        let acquire = ["LOCK.ACQUIRE", &key, "intruder", "1000"];
        let acquire_block = ["LOCK.ACQUIRE", &key, "intruder", "1000", "BLOCK", "10"];
        let release = ["LOCK.RELEASE", &key, &owner];
        let extend = ["LOCK.EXTEND", &key, &owner, "100000"];
        let fence = ["LOCK.FENCE", &key];
        let fence_token = ["LOCK.FENCE", &key, &token];
        let info = ["LOCK.INFO", &key];
        let writes: [&[&str]; 4] = [&acquire, &acquire_block, &release, &extend];
        let reads: [&[&str]; 3] = [&fence, &fence_token, &info];
        env.inject(
            "ACL probe as a ~other:* user",
            None,
            Effect::Keeps,
            false,
            |env| {
                for cmd in writes.iter().chain(reads.iter()) {
                    let r = faults::raw(&mut other, cmd);
                    env.check(
                    "acl-denies-foreign-user",
                    "a user limited to ~other:* gets NOPERM for every lock command on a lock key",
                    is_error(Some(&r), "NOPERM"),
                    || format!("{cmd:?} as other: {r:?}"),
                );
                }
                ((), key.clone())
            },
        );
        env.inject(
            "ACL probe as a %R~lock:* user",
            None,
            Effect::Keeps,
            false,
            |env| {
                for cmd in writes {
                    let r = faults::raw(&mut reader, cmd);
                    env.check(
                        "acl-read-only-no-writes",
                        "a %R~lock:* user gets NOPERM for LOCK.ACQUIRE, RELEASE and EXTEND",
                        is_error(Some(&r), "NOPERM"),
                        || format!("{cmd:?} as reader: {r:?}"),
                    );
                }
                for cmd in reads {
                    let r = faults::raw(&mut reader, cmd);
                    env.check(
                        "acl-read-only-fence",
                        "a %R~lock:* user can run LOCK.FENCE (and LOCK.INFO)",
                        !matches!(r, Value::ServerError(_)),
                        || format!("{cmd:?} as reader: {r:?}"),
                    );
                    if let (Some(t), true) =
                        (int(Some(&r)), cmd.len() == 2 && cmd[0] == "LOCK.FENCE")
                    {
                        env.rec
                            .observe(env.now(), t, format!("LOCK.FENCE {} as reader", cmd[1]));
                    }
                }
                ((), key.clone())
            },
        );
    }
}
