//! Shared holders survive what exclusive ones survive: DEBUG RELOAD, RDB and AOF restarts after
//! SIGKILL (AOF with and without the RDB preamble, before and after a rewrite), and a replica
//! sees the same holders as its primary after grants, releases, handoffs and expiries. An RDB
//! written by the previous release of the module (encoding version 1) still loads.

mod common;

use std::thread::{self, JoinHandle};
use std::time::Duration;

use common::*;
use redis::{Connection, RedisResult, Value};

const LONG_TTL: i64 = 100_000;

/// Everything `LOCK.INFO` says about a key except the ttls (which move with the clock): mode,
/// limit, and each holder's owner and token in order; `None` when free.
type Snapshot = Option<(Value, Value, Vec<(Value, Value)>)>;

fn snapshot(c: &mut Connection, key: &str) -> Snapshot {
    let reply: Value = redis::cmd("LOCK.INFO").arg(key).query(c).unwrap();
    let items = match reply {
        Value::Nil => return None,
        Value::Array(items) => items,
        other => panic!("LOCK.INFO {key}: {other:?}"),
    };
    let get = |name: &str| -> Value {
        let at = items
            .iter()
            .position(|v| *v == Value::BulkString(name.as_bytes().to_vec()))
            .unwrap_or_else(|| panic!("LOCK.INFO {key} has no {name}"));
        items[at + 1].clone()
    };
    let Value::Array(holders) = get("holders") else {
        panic!("holders")
    };
    let holders = holders
        .into_iter()
        .map(|h| match h {
            Value::Array(kv) => (kv[1].clone(), kv[3].clone()),
            other => panic!("holder {other:?}"),
        })
        .collect();
    Some((get("mode"), get("limit"), holders))
}

fn take(c: &mut Connection, key: &str, owner: &str, ttl: i64, opts: &[&str]) -> Option<i64> {
    let mut cmd = redis::cmd("LOCK.ACQUIRE");
    cmd.arg(key).arg(owner).arg(ttl).arg(opts);
    match cmd.query(c) {
        Ok(Value::Int(t)) => Some(t),
        Ok(Value::Nil) => None,
        other => panic!("LOCK.ACQUIRE {key} {owner} {opts:?}: {other:?}"),
    }
}

/// Three keys: a semaphore of 3 with two holders, an unlimited shared key with three readers,
/// and an exclusive lock. Returns their names.
fn populate(c: &mut Connection) -> [String; 3] {
    let keys = [unique_key("sem"), unique_key("rw"), unique_key("x")];
    for (owner, ttl) in [("p1", LONG_TTL), ("p2", LONG_TTL / 2)] {
        take(c, &keys[0], owner, ttl, &["SHARED", "LIMIT", "3"]).unwrap();
    }
    for owner in ["r1", "r2", "r3"] {
        take(c, &keys[1], owner, LONG_TTL, &["SHARED"]).unwrap();
    }
    must_acquire(c, &keys[2], "w", LONG_TTL);
    keys
}

fn snapshots(c: &mut Connection, keys: &[String]) -> Vec<Snapshot> {
    keys.iter().map(|k| snapshot(c, k)).collect()
}

/// After a reload: same holders, same tokens, PTTL not longer than before (absolute
/// deadlines, not re-applied ttls), and the next grant's token above every earlier one.
#[track_caller]
fn assert_survived(c: &mut Connection, keys: &[String], before: &[Snapshot], pttls: &[i64]) {
    assert_eq!(snapshots(c, keys), before, "holders after the reload");
    for (k, was) in keys.iter().zip(pttls) {
        let now = pttl(c, k);
        assert!(now > 0 && now <= was + 2, "PTTL {k}: {now}, before {was}");
    }
    let highest = before
        .iter()
        .flatten()
        .flat_map(|(_, _, hs)| hs.iter().map(|(_, t)| t.clone()))
        .map(|t| match t {
            Value::Int(t) => t,
            other => panic!("token {other:?}"),
        })
        .max()
        .unwrap();
    let next = take(c, &keys[0], "p3", LONG_TTL, &["SHARED", "LIMIT", "3"]).unwrap();
    assert!(next > highest, "next token {next} not above {highest}");
}

fn reload_round_trip(server: &mut Server, reload: impl FnOnce(&mut Server, &mut Connection)) {
    let mut c = server.conn();
    let keys = populate(&mut c);
    let before = snapshots(&mut c, &keys);
    thread::sleep(Duration::from_millis(50)); // let the holds age, see assert_survived
    let pttls: Vec<i64> = keys.iter().map(|k| pttl(&mut c, k)).collect();
    reload(server, &mut c);
    let mut c = server.conn();
    assert_survived(&mut c, &keys, &before, &pttls);
}

#[test]
fn shared_holders_survive_debug_reload() {
    let mut server = Server::start();
    reload_round_trip(&mut server, |_, c| {
        redis::cmd("DEBUG").arg("RELOAD").query::<()>(c).unwrap();
    });
}

#[test]
fn shared_holders_survive_an_rdb_restart_after_kill9() {
    let mut server = Server::start_with(&["--save", "900", "1"]);
    reload_round_trip(&mut server, |s, c| {
        redis::cmd("SAVE").query::<()>(c).unwrap();
        s.kill9();
        s.restart();
    });
}

fn aof_round_trip(preamble: &str) {
    let mut server = Server::start_aof_always(preamble);
    reload_round_trip(&mut server, |s, c| {
        // Half in the rewritten base, half in the incremental file after it.
        redis::cmd("BGREWRITEAOF").query::<String>(c).unwrap();
        wait_no_aof_rewrite(s);
        take(c, "after-rewrite", "r", LONG_TTL, &["SHARED", "LIMIT", "2"]).unwrap();
        s.kill9();
        s.restart();
        let mut c = s.conn();
        assert_eq!(holders_of(&mut c, "after-rewrite"), ["r"]);
    });
}

fn holders_of(c: &mut Connection, key: &str) -> Vec<String> {
    snapshot(c, key).map_or(vec![], |(_, _, hs)| {
        hs.into_iter()
            .map(|(o, _)| match o {
                Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
                other => panic!("owner {other:?}"),
            })
            .collect()
    })
}

#[test]
fn shared_holders_survive_an_aof_restart_with_rdb_preamble() {
    aof_round_trip("yes");
}

#[test]
fn shared_holders_survive_an_aof_restart_without_rdb_preamble() {
    aof_round_trip("no");
}

/// A server that has just loaded `tests/fixtures/<name>` (an RDB as `xxd -p` text).
fn load_fixture(name: &str) -> (Server, Connection) {
    let server = Server::start();
    let hex = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name),
    )
    .unwrap();
    let hex: String = hex.split_whitespace().collect();
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    std::fs::write(server.dir().join("dump.rdb"), bytes).unwrap();
    let mut c = server.conn();
    redis::cmd("DEBUG")
        .arg("RELOAD")
        .arg("NOSAVE")
        .query::<()>(&mut c)
        .unwrap();
    (server, c)
}

#[test]
fn an_rdb_of_encoding_version_2_still_loads() {
    // See tests/fixtures/README.md: written before sessions (lock values of version 2, aux
    // data of version 1).
    let (server, mut c) = load_fixture("encoding-v2.rdb.hex");
    let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
    assert_eq!(
        snapshot(&mut c, "v2:job"),
        Some((
            Value::SimpleString("exclusive".into()),
            Value::Nil,
            vec![(bulk("worker-1"), Value::Int(3678481889155073))],
        ))
    );
    assert_eq!(
        snapshot(&mut c, "v2:readers"),
        Some((
            Value::SimpleString("shared".into()),
            Value::Int(3),
            vec![
                (bulk("r1"), Value::Int(3678481889155074)),
                (bulk("r2"), Value::Int(3678481889155075)),
            ],
        ))
    );
    assert_eq!(
        snapshot(&mut c, "v2:short"),
        None,
        "expired before it was saved"
    );
    let deadline_2100 = 4_102_444_800_000 - unix_ms();
    let left = pttl(&mut c, "v2:job");
    assert!(
        (left - deadline_2100).abs() < 5_000,
        "PTTL {left}, want about {deadline_2100}"
    );
    let high: u64 = server
        .info_field("lock", "lock_token_high_water")
        .unwrap()
        .parse()
        .unwrap();
    assert!(high >= 3678481889155076, "high-water mark {high}");
    // No session came with it, and the holds are plain ones.
    assert_eq!(
        server.info_field("lock", "lock_sessions").as_deref(),
        Some("0")
    );
    assert_eq!(release(&mut c, "v2:readers", "r1"), 1);
    assert_eq!(release(&mut c, "v2:job", "worker-1"), 1);
}

#[test]
fn an_rdb_from_the_previous_encoding_still_loads() {
    let (server, mut c) = load_fixture("encoding-v1.rdb.hex");

    // See tests/fixtures/README.md for how it was made.
    let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
    let excl = |owner: &str, token: i64| {
        Some((
            Value::SimpleString("exclusive".into()),
            Value::Nil,
            vec![(bulk(owner), Value::Int(token))],
        ))
    };
    assert_eq!(
        snapshot(&mut c, "v1:job"),
        excl("worker-1", 3678324466022400)
    );
    assert_eq!(
        snapshot(&mut c, "v1:leader"),
        excl("binary owner", 3678324466044928)
    );
    assert_eq!(
        snapshot(&mut c, "v1:short"),
        None,
        "expired before it was saved"
    );
    let deadline_2100 = 4_102_444_800_000 - unix_ms();
    let left = pttl(&mut c, "v1:job");
    assert!(
        (left - deadline_2100).abs() < 5_000,
        "PTTL {left}, want about {deadline_2100}"
    );
    // The file's aux field (the high-water mark, 3678324466059264) has the version-1 layout:
    // had aux_load refused it, the whole load would have failed and no key would be here. Its
    // value is below what this server's clock floor and start-up jump already give.
    let high: u64 = server
        .info_field("lock", "lock_token_high_water")
        .unwrap()
        .parse()
        .unwrap();
    assert!(high >= 3678324466059264, "high-water mark {high}");
    assert_eq!(release(&mut c, "v1:job", "worker-1"), 1);
}

fn waiter(
    server: &Server,
    key: &str,
    owner: &str,
    opts: &[&str],
) -> JoinHandle<RedisResult<Value>> {
    let mut ctl = server.conn();
    let before = blocked_clients(&mut ctl);
    let mut conn = server.conn();
    let mut cmd = redis::cmd("LOCK.ACQUIRE");
    cmd.arg(key).arg(owner).arg(LONG_TTL).arg(opts);
    let handle = thread::spawn(move || cmd.query(&mut conn));
    wait_blocked(&mut ctl, before + 1);
    handle
}

#[test]
fn a_replica_matches_its_primary_through_shared_grants_releases_handoffs_and_expiries() {
    let primary = Server::start();
    let mut p = primary.conn();
    // Before the replica attaches: reaches it through the full sync.
    let mut keys = populate(&mut p).to_vec();
    let replica = Server::replica_of(&primary);
    wait_for_replica_sync(&primary, &replica);
    let mut r = replica.conn();
    let check = |p: &mut Connection, r: &mut Connection, keys: &[String], step: &str| {
        wait_for_replica_sync(&primary, &replica);
        assert_eq!(snapshots(r, keys), snapshots(p, keys), "after {step}");
    };
    check(&mut p, &mut r, &keys, "the full sync");

    // Through the stream: grants, a retry, an extend, releases.
    take(&mut p, &keys[0], "p3", LONG_TTL, &["SHARED", "LIMIT", "3"]).unwrap();
    take(&mut p, &keys[1], "r2", LONG_TTL, &["SHARED"]).unwrap();
    assert_eq!(extend(&mut p, &keys[1], "r3", 2 * LONG_TTL), 1);
    assert_eq!(release(&mut p, &keys[1], "r1"), 1);
    check(&mut p, &mut r, &keys, "grants, retry, extend, release");

    // Handoffs: a writer queued behind readers, then readers behind the writer.
    let w = waiter(&primary, &keys[1], "writer", &["BLOCK", "0"]);
    let r4 = waiter(&primary, &keys[1], "r4", &["SHARED", "BLOCK", "0"]);
    assert_eq!(release(&mut p, &keys[1], "r2"), 1);
    assert_eq!(release(&mut p, &keys[1], "r3"), 1);
    assert!(matches!(w.join().unwrap(), Ok(Value::Int(_))));
    check(&mut p, &mut r, &keys, "the handoff to the writer");
    assert_eq!(release(&mut p, &keys[1], "writer"), 1);
    assert!(matches!(r4.join().unwrap(), Ok(Value::Int(_))));
    check(&mut p, &mut r, &keys, "the handoff to the reader");

    // A semaphore permit that expires and is handed to a waiter by the timer.
    let e = unique_key("expiring");
    take(&mut p, &e, "short", 100, &["SHARED", "LIMIT", "1"]).unwrap();
    let next = waiter(
        &primary,
        &e,
        "next",
        &["SHARED", "LIMIT", "1", "BLOCK", "0"],
    );
    assert!(matches!(next.join().unwrap(), Ok(Value::Int(_))));
    keys.push(e.clone());
    check(&mut p, &mut r, &keys, "the expiry handoff");

    // Every holder released: the key is gone on both sides.
    for owner in ["p1", "p2", "p3"] {
        assert_eq!(release(&mut p, &keys[0], owner), 1);
    }
    check(&mut p, &mut r, &keys, "the last release");
    assert_eq!(exists(&mut r, &keys[0]), 0);
}
