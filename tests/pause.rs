//! Client pauses and planned failover: while writes are paused (`CLIENT PAUSE ms WRITE|ALL`,
//! `FAILOVER`) the module writes and replicates nothing, and what fell due during the pause
//! (a holder's deadline, a `BLOCK` timeout that lets the next waiter in, the revoke of a grant
//! whose client vanished) is done as soon as the pause ends.
//!
//! Every scenario runs under both pause kinds, once with AOF on and once with a replica. The
//! pause starts in the same `MULTI` as the step that makes the work fall due inside it (an
//! `EXTEND` to a short ttl, a release plus `CLIENT KILL`), so a slow machine cannot move the
//! deadline out of the pause. While paused, a client of the primary cannot even send `INFO`
//! (`ALL`), so "nothing written" is read from outside: the replica's offset, the AOF files'
//! size on disk.

mod common;

use std::fs;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use redis::{Connection, RedisResult, Value};

/// How long each pause lasts. The work falls due `DUE_MS` after it starts.
const PAUSE_MS: u64 = 1_500;
const DUE_MS: i64 = 400;
/// Holds that must outlive the test.
const LONG_TTL: i64 = 60_000;
/// Waiters' ttl and `BLOCK` timeout: far beyond the pause, so a grant that comes "after the
/// pause" cannot be a timeout or a second deadline in disguise.
const WAITER_TTL: i64 = 30_000;
const WAITER_BLOCK: i64 = 20_000;

#[derive(Clone, Copy, Debug)]
enum Pause {
    Write,
    All,
}

impl Pause {
    fn arg(self) -> &'static str {
        match self {
            Pause::Write => "WRITE",
            Pause::All => "ALL",
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Setup {
    Aof,
    Replica,
}

/// A primary with AOF on, or a primary with a replica.
struct Rig {
    setup: Setup,
    primary: Server,
    replica: Option<Server>,
}

impl Rig {
    fn new(setup: Setup) -> Rig {
        match setup {
            Setup::Aof => Rig {
                setup,
                primary: Server::start_with(&["--appendonly", "yes", "--appendfsync", "always"]),
                replica: None,
            },
            Setup::Replica => {
                let (primary, replica) = primary_and_replica(&[]);
                Rig {
                    setup,
                    primary,
                    replica: Some(replica),
                }
            }
        }
    }

    /// How much the primary has written out so far: the replica's processed offset, or the
    /// size of the AOF files on disk. Readable while the primary's clients are paused.
    fn written(&self) -> u64 {
        match &self.replica {
            Some(replica) => replica
                .info_field("replication", "slave_repl_offset")
                .and_then(|v| v.parse().ok())
                .expect("slave_repl_offset on the replica"),
            None => fs::read_dir(self.primary.dir().join("appendonlydir"))
                .expect("appendonlydir")
                .flatten()
                .map(|f| f.metadata().map_or(0, |m| m.len()))
                .sum(),
        }
    }

    /// After the pause: the server is up, and what it wrote out holds exactly its holders of
    /// `keys` (the replica's copy, or the AOF read back with `DEBUG LOADAOF`).
    #[track_caller]
    fn assert_written_exactly(&self, keys: &[&str]) {
        let mut p = self.primary.conn();
        let pong: String = redis::cmd("PING")
            .query(&mut p)
            .expect("PING after the pause");
        assert_eq!(pong, "PONG");
        let expected: Vec<_> = keys.iter().map(|k| holders(&mut p, k)).collect();
        match &self.replica {
            Some(replica) => {
                wait_for_replica_sync(&self.primary, replica);
                let mut r = replica.conn();
                for (k, want) in keys.iter().zip(&expected) {
                    assert_eq!(&holders(&mut r, k), want, "holders of {k} on the replica");
                }
            }
            None => {
                let ok: String = redis::cmd("DEBUG")
                    .arg("LOADAOF")
                    .query(&mut p)
                    .expect("DEBUG LOADAOF");
                assert_eq!(ok, "OK");
                for (k, want) in keys.iter().zip(&expected) {
                    assert_eq!(
                        &holders(&mut p, k),
                        want,
                        "holders of {k} after DEBUG LOADAOF"
                    );
                }
            }
        }
    }
}

/// `(owner, token)` of every holder of `key`, in grant order, from `LOCK.INFO` (empty when
/// the key is not a lock).
fn holders(c: &mut Connection, key: &str) -> Vec<(String, i64)> {
    let reply: Value = redis::cmd("LOCK.INFO").arg(key).query(c).unwrap();
    let items = match reply {
        Value::Nil => return vec![],
        Value::Array(items) => items,
        other => panic!("LOCK.INFO {key}: {other:?}"),
    };
    let holders = items
        .chunks(2)
        .find(|kv| kv[0] == Value::BulkString(b"holders".to_vec()))
        .map(|kv| kv[1].clone())
        .unwrap_or_else(|| panic!("LOCK.INFO {key} has no holders field"));
    let Value::Array(holders) = holders else {
        panic!("holders of {key}: {holders:?}")
    };
    holders
        .iter()
        .map(|h| match h {
            Value::Array(kv) => match (&kv[1], &kv[3]) {
                (Value::BulkString(o), Value::Int(t)) => {
                    (String::from_utf8_lossy(o).into_owned(), *t)
                }
                other => panic!("holder of {key}: {other:?}"),
            },
            other => panic!("holder of {key}: {other:?}"),
        })
        .collect()
}

/// A blocked acquirer on its own connection and thread; its reply arrives on a channel.
struct Waiter {
    id: i64,
    reply: mpsc::Receiver<(RedisResult<Value>, Instant)>,
}

impl Waiter {
    /// Send `command args...` on a new connection and return once one more client is blocked.
    fn start(server: &Server, ctl: &mut Connection, command: &str, args: &[String]) -> Waiter {
        let before = blocked_clients(ctl);
        let mut conn = server.conn();
        conn.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let id: i64 = redis::cmd("CLIENT").arg("ID").query(&mut conn).unwrap();
        let (tx, reply) = mpsc::channel();
        let (command, args) = (command.to_string(), args.to_vec());
        thread::spawn(move || {
            let r = call(&mut conn, &command, &args);
            let _ = tx.send((r, Instant::now()));
        });
        wait_blocked(ctl, before + 1);
        Waiter { id, reply }
    }

    /// `LOCK.ACQUIRE key owner WAITER_TTL [extra...] BLOCK WAITER_BLOCK`.
    fn acquire(
        server: &Server,
        ctl: &mut Connection,
        key: &str,
        owner: &str,
        extra: &[&str],
    ) -> Waiter {
        let mut args = vec![key.to_string(), owner.to_string(), WAITER_TTL.to_string()];
        args.extend(extra.iter().map(|s| s.to_string()));
        args.extend(["BLOCK".to_string(), WAITER_BLOCK.to_string()]);
        Waiter::start(server, ctl, "LOCK.ACQUIRE", &args)
    }

    /// No reply yet.
    #[track_caller]
    fn assert_waiting(&self, what: &str) {
        if let Ok(reply) = self.reply.try_recv() {
            panic!("{what}: replied during the pause: {reply:?}");
        }
    }

    /// The reply, waiting up to 20 s for it.
    fn wait(&self) -> (RedisResult<Value>, Instant) {
        self.reply
            .recv_timeout(Duration::from_secs(20))
            .expect("no reply from the waiter")
    }
}

/// Run `steps` in one `MULTI`, the last being `CLIENT PAUSE PAUSE_MS kind`; returns when the
/// pause started (at the latest).
fn exec_then_pause(c: &mut Connection, steps: &[Vec<String>], kind: Pause) -> Instant {
    let mut pipe = redis::pipe();
    pipe.atomic();
    for step in steps {
        let mut cmd = redis::cmd(&step[0]);
        for arg in &step[1..] {
            cmd.arg(arg);
        }
        pipe.add_command(cmd);
    }
    pipe.cmd("CLIENT")
        .arg("PAUSE")
        .arg(PAUSE_MS)
        .arg(kind.arg());
    let sent = Instant::now();
    let replies: Vec<Value> = pipe.query(c).expect("MULTI ... CLIENT PAUSE ... EXEC");
    assert_eq!(
        replies.last(),
        Some(&Value::Okay),
        "CLIENT PAUSE in {replies:?}"
    );
    sent
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// How much later than our clock's idea of the pause's end the server may end it: the server
/// takes the pause's start from its cached clock, which can be a little behind the moment we
/// sent the command (seen: 19-39 µs on Redis 8.2 and Valkey 8.1); something done during the
/// pause would come about 1,100 ms early.
const SLACK: Duration = Duration::from_millis(100);

/// How long to wait for something the test caused: a deadline for a loaded machine.
const PATIENCE: Duration = Duration::from_secs(20);

impl Rig {
    /// What the primary has written out once everything before now has reached the replica
    /// (or the AOF, written before each reply with `appendfsync always`): read before the
    /// `MULTI` that starts a pause.
    fn settled(&self) -> u64 {
        if let Some(replica) = &self.replica {
            wait_for_replica_sync(&self.primary, replica);
        }
        self.written()
    }
}

/// The pause that began at `started`: nothing is written out until it ends. `base` is what was
/// written out before its `MULTI` ([`Rig::settled`]); the `MULTI` itself writes once
/// (`multi_writes`: its steps change a key) or not at all. Polled from the `EXEC` on, the
/// first write after the `MULTI`'s own must come when the pause ended (our clock, less
/// [`SLACK`]), never before. Only a lower bound: a slow machine makes it come later, which
/// passes; it cannot make a correct server fail. Returns the pause's end by our clock.
#[track_caller]
fn assert_nothing_written_during(
    rig: &Rig,
    started: Instant,
    base: u64,
    multi_writes: bool,
) -> Instant {
    let end = started + Duration::from_millis(PAUSE_MS);
    let base = match multi_writes {
        true => wait_for("the MULTI's own write", PATIENCE, || {
            let now = rig.written();
            (now > base).then_some(now)
        }),
        false => base,
    };
    let written = wait_for(
        "the primary to write out what the pause held back",
        PATIENCE,
        || (rig.written() > base).then(Instant::now),
    );
    assert!(
        written + SLACK >= end,
        "{:?}: the primary wrote out {} bytes while writes were paused ({:?} before it ended)",
        rig.setup,
        rig.written() - base,
        end - written
    );
    end
}

/// A grant that came when the pause ended (not before).
#[track_caller]
fn assert_granted_after(waiter: &Waiter, end: Instant, what: &str) -> Value {
    let (reply, at) = waiter.wait();
    let reply = reply.unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        matches!(reply, Value::Int(_) | Value::Array(_)),
        "{what}: expected a grant, got {reply:?}"
    );
    // Not before the pause ended (see `SLACK`). And a grant, not a timeout or a second
    // deadline in disguise: waiters' BLOCK and ttl are far beyond the pause.
    assert!(
        at + SLACK >= end,
        "{what}: granted {:?} before the pause ended",
        end - at
    );
    reply
}

fn token(v: &Value) -> i64 {
    match v {
        Value::Int(t) => *t,
        other => panic!("expected a token, got {other:?}"),
    }
}

fn each_combination(scenario: fn(&Rig, Pause)) {
    for setup in [Setup::Aof, Setup::Replica] {
        let rig = Rig::new(setup);
        for pause in [Pause::Write, Pause::All] {
            eprintln!("{setup:?}, CLIENT PAUSE {}", pause.arg());
            scenario(&rig, pause);
        }
    }
}

// --- The paths that write outside a client's command ----------------------------------------

/// A holder's deadline passes during the pause: the queued waiter gets the lock once it ends.
fn deadline_handoff(rig: &Rig, pause: Pause) {
    let mut c = rig.primary.conn();
    let k = unique_key("pause-deadline");
    let held = must_acquire(&mut c, &k, "holder", LONG_TTL);
    let w = Waiter::acquire(&rig.primary, &mut c, &k, "waiter", &[]);
    let extend = strings(&["LOCK.EXTEND", &k, "holder", &DUE_MS.to_string()]);
    let base = rig.settled();
    let started = exec_then_pause(&mut c, &[extend], pause);
    let end = assert_nothing_written_during(rig, started, base, true);
    let granted = token(&assert_granted_after(&w, end, "waiter"));
    assert!(granted > held, "token {granted} after {held}");
    assert_eq!(holders(&mut c, &k), vec![("waiter".to_string(), granted)]);
    rig.assert_written_exactly(&[&k]);
}

#[test]
fn a_deadline_passing_during_a_pause_hands_over_when_it_ends() {
    each_combination(deadline_handoff);
}

/// One permit of a semaphore expires during the pause: the first waiter takes it when the
/// pause ends, the second keeps waiting.
fn shared_expiry(rig: &Rig, pause: Pause) {
    let mut c = rig.primary.conn();
    let k = unique_key("pause-shared");
    let lim = ["SHARED", "LIMIT", "2"];
    for owner in ["h1", "h2"] {
        let args: Vec<String> = [&k, owner, &LONG_TTL.to_string()]
            .iter()
            .map(|s| s.to_string())
            .chain(lim.iter().map(|s| s.to_string()))
            .collect();
        assert!(matches!(
            call(&mut c, "LOCK.ACQUIRE", &args),
            Ok(Value::Int(_))
        ));
    }
    let w1 = Waiter::acquire(&rig.primary, &mut c, &k, "w1", &lim);
    let w2 = Waiter::acquire(&rig.primary, &mut c, &k, "w2", &lim);
    let extend = strings(&["LOCK.EXTEND", &k, "h1", &DUE_MS.to_string()]);
    let base = rig.settled();
    let started = exec_then_pause(&mut c, &[extend], pause);
    let end = assert_nothing_written_during(rig, started, base, true);
    let t1 = token(&assert_granted_after(&w1, end, "w1"));
    let owners: Vec<String> = holders(&mut c, &k).into_iter().map(|(o, _)| o).collect();
    assert_eq!(owners, ["h2", "w1"]);
    assert_eq!(holders(&mut c, &k)[1].1, t1);
    w2.assert_waiting("w2 (no permit free)");
    assert_eq!(blocked_clients(&mut c), 1);
    rig.assert_written_exactly(&[&k]);
    assert_eq!(release(&mut c, &k, "h2"), 1);
    assert!(matches!(w2.wait().0, Ok(Value::Int(_))));
}

#[test]
fn a_shared_holder_expiring_during_a_pause_frees_its_permit_when_it_ends() {
    each_combination(shared_expiry);
}

/// A `LOCK.MACQUIRE` waiter whose last busy key expires during the pause gets the whole set
/// when it ends.
fn macquire_last_key(rig: &Rig, pause: Pause) {
    let mut c = rig.primary.conn();
    let a = format!("{{pause-multi}}:{}", unique_key("a"));
    let b = format!("{{pause-multi}}:{}", unique_key("b"));
    must_acquire(&mut c, &a, "ha", LONG_TTL);
    must_acquire(&mut c, &b, "hb", LONG_TTL);
    let args = strings(&[
        "2",
        &a,
        &b,
        "set-owner",
        &WAITER_TTL.to_string(),
        "BLOCK",
        &WAITER_BLOCK.to_string(),
    ]);
    let w = Waiter::start(&rig.primary, &mut c, "LOCK.MACQUIRE", &args);
    assert_eq!(release(&mut c, &a, "ha"), 1);
    let extend = strings(&["LOCK.EXTEND", &b, "hb", &DUE_MS.to_string()]);
    let base = rig.settled();
    let started = exec_then_pause(&mut c, &[extend], pause);
    let end = assert_nothing_written_during(rig, started, base, true);
    let Value::Array(tokens) = assert_granted_after(&w, end, "set waiter") else {
        panic!("LOCK.MACQUIRE replied with no array")
    };
    let tokens: Vec<i64> = tokens.iter().map(token).collect();
    assert_eq!(
        holders(&mut c, &a),
        vec![("set-owner".to_string(), tokens[0])]
    );
    assert_eq!(
        holders(&mut c, &b),
        vec![("set-owner".to_string(), tokens[1])]
    );
    rig.assert_written_exactly(&[&a, &b]);
}

#[test]
fn a_multi_key_waiter_whose_last_key_expires_during_a_pause_is_granted_when_it_ends() {
    each_combination(macquire_last_key);
}

/// A writer queued between readers times out during the pause: it is answered nil then (a
/// reply, not a write), and the reader behind it joins the readers when the pause ends.
fn block_timeout(rig: &Rig, pause: Pause) {
    let mut c = rig.primary.conn();
    let shared = ["SHARED"];
    // The writer's BLOCK timeout is the one thing a MULTI cannot start with the pause: when
    // a slow machine lets it pass before the pause starts, that attempt tested nothing and is
    // made again with a new key (never counted as a pass, never a failure of the server).
    let timeout = 700;
    for attempt in 1..=3 {
        let k = unique_key("pause-timeout");
        let args = strings(&[&k, "r1", &LONG_TTL.to_string(), "SHARED"]);
        assert!(matches!(
            call(&mut c, "LOCK.ACQUIRE", &args),
            Ok(Value::Int(_))
        ));
        let writer_args = strings(&[
            &k,
            "writer",
            &WAITER_TTL.to_string(),
            "BLOCK",
            &timeout.to_string(),
        ]);
        let writer = Waiter::start(&rig.primary, &mut c, "LOCK.ACQUIRE", &writer_args);
        let reader = Waiter::acquire(&rig.primary, &mut c, &k, "r2", &shared);
        let base = rig.settled();
        let started = exec_then_pause(&mut c, &[strings(&["PING"])], pause);
        let (reply, at) = writer.wait();
        assert_eq!(
            reply.expect("writer"),
            Value::Nil,
            "the writer's timeout reply"
        );
        if at < started {
            eprintln!("attempt {attempt}: the writer timed out before the pause began; again");
            let t2 = token(&reader.wait().0.expect("r2"));
            assert_eq!(holders(&mut c, &k)[1], ("r2".to_string(), t2));
            continue;
        }
        let end = assert_nothing_written_during(rig, started, base, false);
        let (reply, granted_at) = reader.wait();
        let t2 = token(&reply.expect("r2"));
        assert!(
            granted_at + SLACK >= end,
            "r2 granted {:?} before the pause ended",
            end - granted_at
        );
        // The timeout's nil (a reply, not a write) was not held back behind the pause's end:
        // it came before the grant the pause held back.
        assert!(at <= granted_at, "the writer's nil came after r2's grant");
        let owners = holders(&mut c, &k);
        assert_eq!(owners.len(), 2);
        assert_eq!(owners[1], ("r2".to_string(), t2));
        rig.assert_written_exactly(&[&k]);
        return;
    }
    panic!("in 3 attempts the writer's {timeout} ms BLOCK timeout always passed before the pause began");
}

#[test]
fn a_block_timeout_during_a_pause_lets_the_next_waiter_in_when_it_ends() {
    each_combination(block_timeout);
}

/// A waiter granted and killed before its reply (in one MULTI with the pause): the revoke of
/// that grant waits for the pause, then the next waiter is granted.
fn revoke(rig: &Rig, pause: Pause) {
    let mut c = rig.primary.conn();
    let k = unique_key("pause-revoke");
    let held = must_acquire(&mut c, &k, "holder", LONG_TTL);
    let gone = Waiter::acquire(&rig.primary, &mut c, &k, "gone", &[]);
    let next = Waiter::acquire(&rig.primary, &mut c, &k, "next", &[]);
    let steps = [
        strings(&["LOCK.RELEASE", &k, "holder"]),
        strings(&["CLIENT", "KILL", "ID", &gone.id.to_string()]),
    ];
    let base = rig.settled();
    let started = exec_then_pause(&mut c, &steps, pause);
    // The MULTI's release granted `gone` (its one write); the revoke waits for the pause.
    let end = assert_nothing_written_during(rig, started, base, true);
    let granted = token(&assert_granted_after(&next, end, "next"));
    assert!(
        granted > held + 1,
        "the revoked grant had a token of its own"
    );
    let reply = gone.wait().0;
    assert!(
        matches!(&reply, Err(e) if e.is_connection_dropped()),
        "the killed waiter's connection is closed: {reply:?}"
    );
    assert_eq!(holders(&mut c, &k), vec![("next".to_string(), granted)]);
    rig.assert_written_exactly(&[&k]);
}

#[test]
fn a_grant_revoked_during_a_pause_goes_to_the_next_waiter_when_it_ends() {
    each_combination(revoke);
}

// --- Reads during a pause --------------------------------------------------------------------

#[test]
fn reads_answer_during_a_write_pause() {
    let (_server, mut c) = start();
    let k = unique_key("pause-read");
    let t = must_acquire(&mut c, &k, "holder", LONG_TTL);
    let ok: Value = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(PAUSE_MS)
        .arg("WRITE")
        .query(&mut c)
        .unwrap();
    assert_eq!(ok, Value::Okay);
    assert_eq!(fence(&mut c, &k), Some(t));
    assert_eq!(fence_check(&mut c, &k, t), 1);
    assert_eq!(holders(&mut c, &k), vec![("holder".to_string(), t)]);
    let _: Value = redis::cmd("CLIENT").arg("UNPAUSE").query(&mut c).unwrap();
}

// --- Planned failover ------------------------------------------------------------------------

/// `FAILOVER TO` a replica that lags (stopped), while a queued lock's deadline passes: the old
/// primary holds writes back, survives, becomes a replica; the new primary's tokens are above
/// every token the old one issued.
#[test]
fn failover_with_deadlines_due_keeps_both_servers_up_and_tokens_rising() {
    let (primary, replica) = primary_and_replica(&[]);
    let mut p = primary.conn();
    let k = unique_key("failover");
    let held = must_acquire(&mut p, &k, "holder", 800);
    let w = Waiter::acquire(&primary, &mut p, &k, "waiter", &[]);
    let pid = replica
        .info_field("server", "process_id")
        .expect("process_id of the replica");
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .expect("kill");
        assert!(ok.success(), "kill {sig} {pid}");
    };
    signal("-STOP");
    let ok: RedisResult<Value> = redis::cmd("FAILOVER")
        .arg("TO")
        .arg("127.0.0.1")
        .arg(replica.port())
        .arg("TIMEOUT")
        .arg(5_000)
        .query(&mut p);
    // The primary now pauses writes and waits for the stopped replica while the holder's
    // deadline passes.
    let ok = ok.expect("FAILOVER TO");
    assert_eq!(ok, Value::Okay);
    thread::sleep(Duration::from_millis(1_500));
    signal("-CONT");
    let mut r = replica.conn();
    wait_until(
        "the replica to become primary",
        Duration::from_secs(15),
        || info_field(&mut r, "replication", "role").as_deref() == Some("master"),
    );
    let mut p = primary.conn();
    wait_until(
        "the old primary to follow it",
        Duration::from_secs(15),
        || info_field(&mut p, "replication", "role").as_deref() == Some("slave"),
    );
    let pong: String = redis::cmd("PING").query(&mut p).unwrap();
    assert_eq!(pong, "PONG");
    // The waiter was on a server that became a replica: it is told so, never granted there.
    let (reply, _) = w.wait();
    match reply {
        Err(e) => assert_eq!(e.code(), Some("UNBLOCKED"), "waiter: {e}"),
        Ok(v) => panic!("the waiter on the demoted primary got {v:?}"),
    }
    let old_high: i64 = info_field(&mut p, "lock", "lock_token_high_water")
        .and_then(|v| v.parse().ok())
        .expect("lock_token_high_water");
    assert!(old_high >= held);
    let fresh = must_acquire(&mut r, &unique_key("after-failover"), "new", LONG_TTL);
    assert!(
        fresh > old_high,
        "token {fresh} on the new primary, old primary's mark {old_high}"
    );
    let taken = must_acquire(&mut r, &k, "after", LONG_TTL);
    assert!(taken > held, "token {taken} for {k} after {held}");
}
