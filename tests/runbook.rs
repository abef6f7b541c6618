//! RUNBOOK.md as written: every `redis-cli` line of its `sh` blocks is run here, with its
//! `<placeholders>` filled in, through the real `redis-cli` against a real server (and a
//! replica for the failover), in the situation its section describes, and its reply checked.
//! A command added to the runbook and not run here (or run here and gone from the runbook)
//! fails the test, naming it.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::thread;
use std::time::Duration;

use common::*;
use redis::Value;

/// The runbook's commands, and which of them ran.
struct Book {
    ran: BTreeSet<String>,
}

impl Book {
    /// Run `template` (a runbook line) on the server at `port` with `fill` substituted; its
    /// standard output (redis-cli's plain form: one line per reply element).
    #[track_caller]
    fn run(&mut self, port: u16, template: &str, fill: &[(&str, &str)]) -> String {
        self.ran.insert(template.to_string());
        let mut line = template.to_string();
        for (name, value) in fill {
            line = line.replace(name, value);
        }
        assert!(!line.contains('<'), "unfilled placeholder in {line:?}");
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words[0], "redis-cli", "{line}");
        let out = Command::new(cli_bin())
            .args(["-p", &port.to_string()])
            .args(&words[1..])
            .output()
            .expect("run redis-cli");
        assert!(out.status.success(), "{line}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    }
}

/// The `redis-cli` lines of RUNBOOK.md's `sh` blocks.
fn runbook_commands() -> BTreeSet<String> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("RUNBOOK.md"))
        .expect("RUNBOOK.md");
    let mut inside = false;
    let mut commands = BTreeSet::new();
    for line in text.lines() {
        if line.starts_with("```") {
            inside = line == "```sh";
            continue;
        }
        if inside && line.starts_with("redis-cli ") {
            commands.insert(line.trim_end().to_string());
        }
    }
    commands
}

/// The value after `name` in redis-cli's plain output of a map.
fn after<'a>(out: &'a str, name: &str) -> &'a str {
    let lines: Vec<&str> = out.lines().collect();
    let i = lines
        .iter()
        .position(|l| *l == name)
        .unwrap_or_else(|| panic!("no {name} in {out}"));
    lines[i + 1]
}

/// A blocked `LOCK.ACQUIRE key owner 60000 BLOCK 0` on its own connection: (its client id,
/// the thread that gets its reply).
fn waiter(
    server: &Server,
    ctl: &mut redis::Connection,
    key: &str,
    owner: &str,
) -> (i64, thread::JoinHandle<redis::RedisResult<Value>>) {
    let before = blocked_clients(ctl);
    let mut conn = server.conn();
    let id: i64 = redis::cmd("CLIENT").arg("ID").query(&mut conn).unwrap();
    let (key, owner) = (key.to_string(), owner.to_string());
    let handle = thread::spawn(move || {
        call(
            &mut conn,
            "LOCK.ACQUIRE",
            &[&key, &owner, "60000", "BLOCK", "0"],
        )
    });
    wait_blocked(ctl, before + 1);
    (id, handle)
}

#[test]
fn every_runbook_command_works_as_written() {
    let (primary, replica) = primary_and_replica(&[]);
    let port = primary.port();
    let mut c = primary.conn();
    let mut book = Book {
        ran: BTreeSet::new(),
    };

    // First look, and a stuck lock: a plain hold by a holder that went away, one waiter.
    let key = "orders:42";
    let stuck = must_acquire(&mut c, key, "worker-1", 600_000);
    let (_, next) = waiter(&primary, &mut c, key, "worker-2");
    let info = book.run(port, "redis-cli INFO lock", &[]);
    assert!(
        info.contains("lock_locks:1") && info.contains("lock_waiters:1"),
        "{info}"
    );
    let waiting = book.run(port, "redis-cli LOCK.WAITING COUNT 10", &[]);
    assert_eq!(after(&waiting, "key"), key);
    assert_eq!(after(&waiting, "waiters"), "1");
    let scan = book.run(port, "redis-cli SCAN 0 TYPE redislock COUNT 1000", &[]);
    assert!(scan.lines().any(|l| l == key), "{scan}");
    let look = book.run(port, "redis-cli LOCK.INFO <key>", &[("<key>", key)]);
    assert_eq!(after(&look, "owner"), "worker-1");
    assert_eq!(after(&look, "token"), stuck.to_string());
    let released = book.run(
        port,
        "redis-cli LOCK.RELEASE <key> <owner>",
        &[("<key>", key), ("<owner>", "worker-1")],
    );
    assert_eq!(released.trim(), "1");
    let Ok(Value::Int(granted)) = next.join().unwrap() else {
        panic!("the waiter was not granted")
    };
    assert!(granted > stuck);
    assert_eq!(release(&mut c, key, "worker-2"), 1);

    // A stuck session: bound to a connection that stays open, two holds, a lock-delay.
    let mut holder = primary.conn();
    let holder_id: i64 = redis::cmd("CLIENT").arg("ID").query(&mut holder).unwrap();
    let Value::BulkString(sid) = call(
        &mut holder,
        "LOCK.SESSION",
        &["OPEN", "600000", "BOUND", "LOCKDELAY", "100"],
    )
    .unwrap() else {
        panic!("OPEN")
    };
    let sid = String::from_utf8(sid).unwrap();
    for k in ["jobs:a", "jobs:b"] {
        call(
            &mut holder,
            "LOCK.ACQUIRE",
            &[k, "batch", "0", "SESSION", &sid],
        )
        .unwrap();
    }
    let sessions = book.run(port, "redis-cli LOCK.SESSION LIST 0 COUNT 100", &[]);
    let serial = after(&sessions, "serial").to_string();
    assert_eq!(after(&sessions, "bound"), holder_id.to_string());
    assert_eq!(after(&sessions, "holds"), "2");
    let client = book.run(
        port,
        "redis-cli CLIENT LIST ID <client-id>",
        &[("<client-id>", &holder_id.to_string())],
    );
    assert!(client.starts_with(&format!("id={holder_id} ")), "{client}");
    let killed = book.run(
        port,
        "redis-cli LOCK.SESSION KILL <serial>",
        &[("<serial>", &serial)],
    );
    assert_eq!(killed.trim(), "2");
    assert_eq!(
        call(&mut holder, "LOCK.SESSION", &["KEEPALIVE", &sid]),
        Ok(Value::Nil)
    );
    let delayed = book.run(port, "redis-cli LOCK.INFO <key>", &[("<key>", "jobs:a")]);
    assert!(delayed.lines().any(|l| l == "delayed"), "{delayed}");
    let cap = book.run(
        port,
        "redis-cli CONFIG SET lock.max-session-holds 1000",
        &[],
    );
    assert_eq!(cap.trim(), "OK");

    // A holder paused past its ttl: another is granted; the old token no longer fences.
    let gc = "report:daily";
    let paused = must_acquire(&mut c, gc, "paused", 50);
    let mut other = primary.conn();
    let now = wait_for("the paused hold to expire", Duration::from_secs(10), || {
        acquire(&mut other, gc, "other", 60_000)
    });
    let current = book.run(port, "redis-cli LOCK.FENCE <key>", &[("<key>", gc)]);
    assert_eq!(current.trim(), now.to_string());
    let old = book.run(
        port,
        "redis-cli LOCK.FENCE <key> <token>",
        &[("<key>", gc), ("<token>", &paused.to_string())],
    );
    assert_eq!(old.trim(), "0");

    // A queue that grows: one waiter removed by its connection, the other keeps its place.
    let busy = "busy:1";
    must_acquire(&mut c, busy, "slow", 600_000);
    let (first, w1) = waiter(&primary, &mut c, busy, "w1");
    let (_, w2) = waiter(&primary, &mut c, busy, "w2");
    let queue = book.run(port, "redis-cli LOCK.INFO <key>", &[("<key>", busy)]);
    assert_eq!(after(&queue, "client"), first.to_string());
    let kill = book.run(
        port,
        "redis-cli CLIENT KILL ID <client-id>",
        &[("<client-id>", &first.to_string())],
    );
    assert_eq!(kill.trim(), "1");
    assert!(
        w1.join().unwrap().is_err(),
        "the killed waiter's connection closed"
    );
    wait_blocked(&mut c, 1);
    assert_eq!(waiters_of(&mut c, busy), 1);
    let get = book.run(port, "redis-cli CONFIG GET lock.max-waiters", &[]);
    assert_eq!(
        get.lines().collect::<Vec<_>>(),
        ["lock.max-waiters", "10000"]
    );
    let set = book.run(port, "redis-cli CONFIG SET lock.max-waiters 1000", &[]);
    assert_eq!(set.trim(), "OK");
    assert_eq!(release(&mut c, busy, "slow"), 1);
    assert!(matches!(w2.join().unwrap(), Ok(Value::Int(_))));

    // Memory.
    let usage = book.run(port, "redis-cli MEMORY USAGE <key>", &[("<key>", gc)]);
    assert!(usage.trim().parse::<i64>().unwrap() > 0, "{usage}");
    let memory = book.run(port, "redis-cli INFO memory", &[]);
    assert!(memory.contains("used_memory:"), "{memory}");

    // Upgrading: the module and the replica's link.
    let modules = book.run(port, "redis-cli MODULE LIST", &[]);
    assert!(modules.lines().any(|l| l == "lock"), "{modules}");
    wait_for_replica_sync(&primary, &replica);
    let link = book.run(replica.port(), "redis-cli INFO replication", &[]);
    assert!(
        link.contains("role:slave") && link.contains("master_link_status:up"),
        "{link}"
    );

    // A failover: the margin, and the promoted replica's mark above every token given.
    let margin = book.run(
        replica.port(),
        "redis-cli CONFIG GET lock.failover-token-margin-ms",
        &[],
    );
    assert_eq!(
        margin.lines().collect::<Vec<_>>(),
        ["lock.failover-token-margin-ms", "60000"]
    );
    let last = info_int(&mut c, "lock", "lock_token_high_water");
    promote(&replica);
    let promoted = book.run(replica.port(), "redis-cli INFO lock", &[]);
    let mark: i64 = promoted
        .lines()
        .find_map(|l| l.trim().strip_prefix("lock_token_high_water:"))
        .unwrap()
        .parse()
        .unwrap();
    assert!(mark > last, "{mark} <= {last}");

    let written = runbook_commands();
    assert_eq!(
        written.difference(&book.ran).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "RUNBOOK.md commands this test does not run"
    );
    assert_eq!(
        book.ran.difference(&written).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "commands run here that RUNBOOK.md no longer has"
    );
}

/// `waiters` of `LOCK.INFO key`.
fn waiters_of(c: &mut redis::Connection, key: &str) -> i64 {
    match call(c, "LOCK.INFO", &[key]).unwrap() {
        Value::Array(f) => f
            .chunks(2)
            .find_map(|kv| match (&kv[0], &kv[1]) {
                (Value::BulkString(k), Value::Int(n)) if k == b"waiters" => Some(*n),
                _ => None,
            })
            .unwrap(),
        other => panic!("{other:?}"),
    }
}
