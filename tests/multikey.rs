//! `LOCK.MACQUIRE` and `LOCK.MRELEASE` against a real server: all keys or none, the
//! idempotent retry on a partly held set, no barging past queued waiters, the errors (which
//! change nothing), key specs (`COMMAND GETKEYS`), replication and the AOF (one MULTI/EXEC per
//! set, so a replica never sees part of one), and, with `BLOCK`, the multi-key queue.
//!
//! Every blocked call runs on its own thread with its own connection, started only once the
//! previous ones are known to be blocked (`INFO clients` `blocked_clients`), so the arrival
//! order is known. Nothing sleeps to wait for the server.

mod common;

use std::thread::{self, JoinHandle};

use common::*;
use redis::{Connection, RedisResult, Value};

const LONG_TTL: i64 = 100_000;

fn keys(n: usize) -> Vec<String> {
    // One hash tag: the same slot, as a cluster requires (and harmless elsewhere).
    let tag = unique_key("multikey");
    (0..n).map(|i| format!("{{{tag}}}:{i}")).collect()
}

fn macquire_args(keys: &[String], owner: &str, ttl: i64, extra: &[&str]) -> Vec<String> {
    let mut args = vec![keys.len().to_string()];
    args.extend(keys.iter().cloned());
    args.push(owner.into());
    args.push(ttl.to_string());
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// The reply of `LOCK.MACQUIRE`: `Some(tokens)` or `None` for nil; panics on anything else.
#[track_caller]
fn tokens(reply: RedisResult<Value>) -> Option<Vec<i64>> {
    match reply {
        Ok(Value::Nil) => None,
        Ok(Value::Array(items)) => Some(
            items
                .into_iter()
                .map(|v| match v {
                    Value::Int(t) => t,
                    other => panic!("LOCK.MACQUIRE: a token must be an integer, got {other:?}"),
                })
                .collect(),
        ),
        other => panic!("LOCK.MACQUIRE: expected an array or nil, got {other:?}"),
    }
}

/// `LOCK.MACQUIRE n keys... owner ttl` -> tokens or `None`.
fn macquire(c: &mut Connection, keys: &[String], owner: &str, ttl: i64) -> Option<Vec<i64>> {
    tokens(call(
        c,
        "LOCK.MACQUIRE",
        &macquire_args(keys, owner, ttl, &[]),
    ))
}

/// `LOCK.MRELEASE n keys... owner` -> how many were released.
fn mrelease(c: &mut Connection, keys: &[String], owner: &str) -> i64 {
    let mut args = vec![keys.len().to_string()];
    args.extend(keys.iter().cloned());
    args.push(owner.into());
    match call(c, "LOCK.MRELEASE", &args) {
        Ok(Value::Int(n)) => n,
        other => panic!("LOCK.MRELEASE: expected an integer, got {other:?}"),
    }
}

#[track_caller]
fn assert_all_absent(c: &mut Connection, keys: &[String]) {
    for key in keys {
        assert_absent(c, key);
    }
}

// --- Non-blocking --------------------------------------------------------------

#[test]
fn free_keys_are_all_granted_with_increasing_tokens_in_key_order() {
    let server = Server::start();
    let mut c = server.conn();
    let ks = keys(3);
    let got = macquire(&mut c, &ks, "order-1", LONG_TTL).expect("a grant");
    assert_eq!(got.len(), 3);
    assert!(got.windows(2).all(|w| w[0] < w[1]), "tokens {got:?}");
    for (key, token) in ks.iter().zip(&got) {
        assert_held(&mut c, key, *token, LONG_TTL);
        assert_eq!(acquire(&mut c, key, "other", LONG_TTL), None);
    }
    // One deadline for the set: the keys' expiries were set from the same `now`.
    let ttls: Vec<i64> = ks.iter().map(|k| pttl(&mut c, k)).collect();
    assert!(
        ttls.iter().max().unwrap() - ttls.iter().min().unwrap() <= 5,
        "{ttls:?}"
    );

    assert_eq!(mrelease(&mut c, &ks, "order-1"), 3);
    assert_all_absent(&mut c, &ks);
    assert_eq!(mrelease(&mut c, &ks, "order-1"), 0);
}

#[test]
fn one_busy_key_refuses_the_whole_set_and_changes_nothing() {
    let server = Server::start();
    let mut c = server.conn();
    let ks = keys(3);
    let held = must_acquire(&mut c, &ks[2], "someone", LONG_TTL);
    assert_eq!(macquire(&mut c, &ks, "order-1", LONG_TTL), None);
    assert_all_absent(&mut c, &ks[..2]);
    assert_held(&mut c, &ks[2], held, LONG_TTL);
    assert_eq!(mrelease(&mut c, &ks, "order-1"), 0);
    assert_held(&mut c, &ks[2], held, LONG_TTL);
    // Once it is free the set is granted.
    assert_eq!(release(&mut c, &ks[2], "someone"), 1);
    let got = macquire(&mut c, &ks, "order-1", LONG_TTL).expect("a grant");
    assert!(got.iter().all(|t| *t > held));
}

#[test]
fn a_partly_held_set_is_an_idempotent_retry() {
    let server = Server::start();
    let mut c = server.conn();
    let ks = keys(3);
    let mine = must_acquire(&mut c, &ks[1], "order-1", 1_000);
    let got = macquire(&mut c, &ks, "order-1", LONG_TTL).expect("a grant");
    assert_eq!(got[1], mine, "the held key keeps its token");
    assert!(got[0] > mine && got[2] > got[0]);
    // Its deadline moved with the others.
    assert!(pttl(&mut c, &ks[1]) > 1_000);
    // The whole retry again: the same tokens.
    assert_eq!(
        macquire(&mut c, &ks, "order-1", LONG_TTL),
        Some(got.clone())
    );
    // Single-key retries agree.
    assert_eq!(acquire(&mut c, &ks[0], "order-1", LONG_TTL), Some(got[0]));
}

#[test]
fn a_freed_key_goes_to_its_queued_waiter_not_to_a_later_set() {
    let server = Server::start();
    let mut c = server.conn();
    let ks = keys(2);
    must_acquire(&mut c, &ks[1], "holder", LONG_TTL);
    let before = blocked_clients(&mut c);
    let mut w = server.conn();
    let key = ks[1].clone();
    let waiter = thread::spawn(move || {
        call(
            &mut w,
            "LOCK.ACQUIRE",
            &[key.as_str(), "waiter", "10000", "BLOCK", "0"],
        )
    });
    wait_blocked(&mut c, before + 1);
    // Freed by its holder: the waiter is granted it, not the set.
    assert_eq!(release(&mut c, &ks[1], "holder"), 1);
    let token = match waiter.join().unwrap() {
        Ok(Value::Int(t)) => t,
        other => panic!("waiter: {other:?}"),
    };
    assert_eq!(macquire(&mut c, &ks, "order-1", LONG_TTL), None);
    assert_held(&mut c, &ks[1], token, 10_000);
    assert_absent(&mut c, &ks[0]);
}

#[test]
fn bad_key_lists_are_errors_that_change_nothing() {
    let server = Server::start();
    let mut c = server.conn();
    let ks = keys(3);
    redis::cmd("SET").arg(&ks[2]).arg("x").exec(&mut c).unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            macquire_args(
                &[ks[0].clone(), ks[1].clone(), ks[0].clone()],
                "o",
                1000,
                &[],
            ),
            "ERR duplicate key '{}'",
        ),
        (
            vec!["0".into(), ks[0].clone(), "o".into(), "1000".into()],
            "ERR numkeys must be a positive integer",
        ),
        (
            vec!["x".into(), ks[0].clone(), "o".into(), "1000".into()],
            "ERR numkeys must be a positive integer",
        ),
        (
            vec![
                "3".into(),
                ks[0].clone(),
                ks[1].clone(),
                "o".into(),
                "1000".into(),
            ],
            "ERR numkeys is larger than the number of keys given",
        ),
        (
            macquire_args(&ks, "o", 1000, &[]),
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        ),
        (
            macquire_args(&ks[..2], "o", 1000, &["SHARED"]),
            "ERR syntax error: unexpected argument 'SHARED'",
        ),
        (
            macquire_args(&ks[..2], "o", 0, &[]),
            "ERR ttl-ms must be a positive integer",
        ),
    ];
    for (args, expected) in cases {
        let expected = expected.replace("{}", &ks[0]);
        assert_err(call(&mut c, "LOCK.MACQUIRE", &args), &expected);
        assert_all_absent(&mut c, &ks[..2]);
    }
    // MRELEASE: the same checks, before anything is released.
    must_acquire(&mut c, &ks[0], "o", LONG_TTL);
    assert_err(
        call(&mut c, "LOCK.MRELEASE", &["2", &ks[0], &ks[2], "o"]),
        "WRONGTYPE Operation against a key holding the wrong kind of value",
    );
    assert_err(
        call(&mut c, "LOCK.MRELEASE", &["2", &ks[0], &ks[0], "o"]),
        &format!("ERR duplicate key '{}'", ks[0]),
    );
    assert_err(
        call(&mut c, "LOCK.MRELEASE", &["1", &ks[0], "o", "extra"]),
        "ERR syntax error: unexpected argument 'extra'",
    );
    assert!(
        fence(&mut c, &ks[0]).is_some(),
        "still held after the errors"
    );
    assert_err(
        call(&mut c, "LOCK.MACQUIRE", &["1", &ks[0], "o"]),
        "ERR wrong number of arguments for 'lock.macquire' command",
    );
}

#[test]
fn more_keys_than_max_multi_keys_is_an_error() {
    let server = Server::start();
    let mut c = server.conn();
    let ks = keys(65);
    assert_err(
        call(&mut c, "LOCK.MACQUIRE", &macquire_args(&ks, "o", 1000, &[])),
        "ERR too many keys (lock.max-multi-keys is 64)",
    );
    assert_all_absent(&mut c, &ks);
    assert_eq!(
        macquire(&mut c, &ks[..64], "o", 1000).map(|t| t.len()),
        Some(64)
    );
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("lock.max-multi-keys")
        .arg("2")
        .exec(&mut c)
        .unwrap();
    assert_err(
        call(&mut c, "LOCK.MRELEASE", &["3", &ks[0], &ks[1], &ks[2], "o"]),
        "ERR too many keys (lock.max-multi-keys is 2)",
    );
    assert_eq!(mrelease(&mut c, &ks[..2], "o"), 2);
}

#[test]
fn mrelease_releases_only_what_owner_holds_and_hands_keys_to_waiters() {
    let server = Server::start();
    let mut c = server.conn();
    let ks = keys(3);
    macquire(&mut c, &ks[..2], "order-1", LONG_TTL).expect("a grant");
    let other = must_acquire(&mut c, &ks[2], "order-2", LONG_TTL);
    let before = blocked_clients(&mut c);
    let mut w = server.conn();
    let key = ks[0].clone();
    let waiter = thread::spawn(move || {
        call(
            &mut w,
            "LOCK.ACQUIRE",
            &[key.as_str(), "waiter", "10000", "BLOCK", "0"],
        )
    });
    wait_blocked(&mut c, before + 1);
    assert_eq!(mrelease(&mut c, &ks, "order-1"), 2);
    let token = match waiter.join().unwrap() {
        Ok(Value::Int(t)) => t,
        other => panic!("waiter: {other:?}"),
    };
    assert_held(&mut c, &ks[0], token, 10_000);
    assert_absent(&mut c, &ks[1]);
    assert_held(&mut c, &ks[2], other, LONG_TTL);
}

#[test]
fn command_getkeys_and_command_info_see_every_key() {
    let server = Server::start();
    let mut c = server.conn();
    let got: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("LOCK.MACQUIRE")
        .arg(&["3", "a", "b", "c", "me", "1000", "BLOCK", "0"])
        .query(&mut c)
        .unwrap();
    assert_eq!(got, ["a", "b", "c"]);
    let got: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("LOCK.MRELEASE")
        .arg(&["2", "a", "b", "me"])
        .query(&mut c)
        .unwrap();
    assert_eq!(got, ["a", "b"]);
    let info = format!(
        "{:?}",
        call(&mut c, "COMMAND", &["INFO", "LOCK.MACQUIRE"]).unwrap()
    );
    assert!(info.contains("movablekeys"), "COMMAND INFO: {info}");
    assert!(info.contains("keynum"), "COMMAND INFO: {info}");
}

/// The replication stream and the AOF are fed the same propagation: one MULTI/EXEC per set.
fn aof_incr(server: &Server) -> String {
    let dir = server.dir().join("appendonlydir");
    let manifest = std::fs::read_to_string(dir.join("appendonly.aof.manifest")).unwrap();
    let name = manifest
        .lines()
        .find(|line| line.ends_with("type i"))
        .and_then(|line| line.split_whitespace().nth(1))
        .expect("an incremental AOF file")
        .to_string();
    String::from_utf8_lossy(&std::fs::read(dir.join(name)).unwrap()).replace("\r\n", " ")
}

/// The commands of a RESP stream, as words (bulk strings only).
fn aof_commands(text: &str) -> Vec<Vec<String>> {
    let mut commands = vec![];
    let mut words = text.split(' ').filter(|w| !w.is_empty()).peekable();
    while let Some(w) = words.next() {
        if let Some(n) = w.strip_prefix('*') {
            let n: usize = n.parse().unwrap();
            let mut command = vec![];
            for _ in 0..n {
                words.next(); // $len
                command.push(words.next().unwrap_or_default().to_string());
            }
            commands.push(command);
        }
    }
    commands
}

#[test]
fn a_set_is_replicated_and_persisted_as_one_transaction() {
    let mut primary = Server::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let replica = Server::replica_of(&primary);
    wait_for_replica_sync(&primary, &replica);
    let mut p = primary.conn();
    let mut r = replica.conn();
    let ks = keys(3);
    let got = macquire(&mut p, &ks, "order-1", LONG_TTL).expect("a grant");
    wait_for_replica_sync(&primary, &replica);
    for (key, token) in ks.iter().zip(&got) {
        assert_eq!(fence(&mut r, key), Some(*token), "{key} on the replica");
    }
    assert_err_code(
        call(&mut r, "LOCK.MACQUIRE", &macquire_args(&ks, "x", 1000, &[])),
        "READONLY",
    );
    let commands = aof_commands(&aof_incr(&primary));
    let at = commands
        .iter()
        .position(|c| c[0] == "MULTI")
        .unwrap_or_else(|| panic!("no MULTI in the AOF: {commands:?}"));
    let names: Vec<&str> = commands[at + 1..at + 4]
        .iter()
        .map(|c| c[0].as_str())
        .collect();
    assert_eq!(names, ["LOCK.LOAD"; 3], "{commands:?}");
    assert_eq!(commands[at + 4][0], "EXEC", "{commands:?}");

    assert_eq!(mrelease(&mut p, &ks[..2], "order-1"), 2);
    wait_for_replica_sync(&primary, &replica);
    assert_all_absent(&mut r, &ks[..2]);
    assert_eq!(fence(&mut r, &ks[2]), Some(got[2]));

    primary.kill9();
    primary.restart();
    let mut p = primary.conn();
    assert_all_absent(&mut p, &ks[..2]);
    assert_eq!(fence(&mut p, &ks[2]), Some(got[2]));
}

// Silence unused warnings until the blocking tests use these.
#[allow(dead_code)]
type Blocked = JoinHandle<RedisResult<Value>>;
