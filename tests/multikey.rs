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

#[test]
fn acl_key_patterns_apply_to_every_key() {
    let server = Server::start();
    let mut c = server.conn();
    call(
        &mut c,
        "ACL",
        &["SETUSER", "orders", "on", ">pw", "~allowed:*", "+@all"],
    )
    .unwrap();
    let mut u = server.conn();
    call(&mut u, "AUTH", &["orders", "pw"]).unwrap();
    let (ok, other) = (["allowed:a", "allowed:b"], ["allowed:c", "forbidden:d"]);
    assert_err_code(
        call(
            &mut u,
            "LOCK.MACQUIRE",
            &["2", other[0], other[1], "o", "1000"],
        ),
        "NOPERM",
    );
    assert_absent(&mut c, other[0]);
    let got = tokens(call(
        &mut u,
        "LOCK.MACQUIRE",
        &["2", ok[0], ok[1], "o", "1000"],
    ));
    assert_eq!(got.map(|t| t.len()), Some(2));
    assert_err_code(
        call(&mut u, "LOCK.MRELEASE", &["2", ok[0], other[1], "o"]),
        "NOPERM",
    );
    assert!(fence(&mut c, ok[0]).is_some());
}

/// The replication stream and the AOF are fed the same propagation: one MULTI/EXEC per set.
fn aof_incr(server: &Server) -> String {
    let dir = server.dir().join("appendonlydir");
    let manifest = std::fs::read_to_string(dir.join("appendonly.aof.manifest")).unwrap();
    let name = manifest
        .lines()
        // `file <name> seq <n> type i`; Redis 8 appends more fields (offsets) after the type.
        .find(|line| {
            line.split_whitespace()
                .collect::<Vec<_>>()
                .windows(2)
                .any(|w| w == ["type", "i"])
        })
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
    // SELECT may come anywhere (Valkey puts it inside the MULTI): leave it out.
    let commands = aof_commands(&aof_incr(&primary));
    let names: Vec<&str> = commands
        .iter()
        .map(|c| c[0].as_str())
        .filter(|n| *n != "SELECT")
        .collect();
    assert_eq!(
        names,
        ["MULTI", "LOCK.LOAD", "LOCK.LOAD", "LOCK.LOAD", "EXEC"],
        "{commands:?}"
    );

    assert_eq!(mrelease(&mut p, &ks[..2], "order-1"), 2);
    // One replication entry: the command itself.
    let commands = aof_commands(&aof_incr(&primary));
    let after: Vec<&str> = commands
        .iter()
        .map(|c| c[0].as_str())
        .filter(|n| *n != "SELECT")
        .skip(names.len())
        .collect();
    assert_eq!(after.len(), 1, "{commands:?}");
    assert_eq!(after[0].to_uppercase(), "LOCK.MRELEASE", "{commands:?}");
    wait_for_replica_sync(&primary, &replica);
    assert_all_absent(&mut r, &ks[..2]);
    assert_eq!(fence(&mut r, &ks[2]), Some(got[2]));

    primary.kill9();
    primary.restart();
    let mut p = primary.conn();
    assert_all_absent(&mut p, &ks[..2]);
    assert_eq!(fence(&mut p, &ks[2]), Some(got[2]));
}

// --- BLOCK ---------------------------------------------------------------------

/// A client blocked in `LOCK.MACQUIRE ... BLOCK` or `LOCK.ACQUIRE ... BLOCK` on its own thread.
struct Blocked {
    name: String,
    /// Its `CLIENT ID`, taken before it blocked.
    id: i64,
    handle: JoinHandle<RedisResult<Value>>,
}

impl Blocked {
    /// Send `command args...` on a new connection; return once one more client is blocked.
    fn start(server: &Server, ctl: &mut Connection, command: &str, args: Vec<String>) -> Blocked {
        let before = blocked_clients(ctl);
        let mut conn = server.conn();
        let id: i64 = redis::cmd("CLIENT").arg("ID").query(&mut conn).unwrap();
        let name = format!("{command} {}", args.join(" "));
        let command = command.to_string();
        let handle = thread::spawn(move || call(&mut conn, &command, &args));
        wait_blocked(ctl, before + 1);
        Blocked { name, id, handle }
    }

    /// `LOCK.MACQUIRE n keys... owner ttl BLOCK timeout`, blocked.
    fn set(server: &Server, ctl: &mut Connection, keys: &[String], owner: &str, t: &str) -> Self {
        let args = macquire_args(keys, owner, WAITER_TTL, &["BLOCK", t]);
        Blocked::start(server, ctl, "LOCK.MACQUIRE", args)
    }

    /// `LOCK.ACQUIRE key owner ttl BLOCK 0`, blocked.
    fn one(server: &Server, ctl: &mut Connection, key: &str, owner: &str) -> Self {
        let args = [key, owner, &WAITER_TTL.to_string(), "BLOCK", "0"].map(String::from);
        Blocked::start(server, ctl, "LOCK.ACQUIRE", args.to_vec())
    }

    fn reply(self) -> RedisResult<Value> {
        self.handle.join().expect("waiter thread panicked")
    }

    /// The reply, which must be an array of tokens.
    #[track_caller]
    fn tokens(self) -> Vec<i64> {
        let name = self.name.clone();
        tokens(self.reply()).unwrap_or_else(|| panic!("{name}: nil, expected tokens"))
    }

    /// The reply, which must be one token.
    #[track_caller]
    fn token(self) -> i64 {
        let name = self.name.clone();
        match self.reply() {
            Ok(Value::Int(t)) => t,
            other => panic!("{name}: expected a token, got {other:?}"),
        }
    }
}

/// The ttl blocked waiters ask for.
const WAITER_TTL: i64 = 10_000;

/// `INFO lock` `field` as a number.
fn lock_info_field(c: &mut Connection, field: &str) -> i64 {
    info_field(c, "lock", &format!("lock_{field}"))
        .unwrap_or_else(|| panic!("INFO lock has no {field}"))
        .parse()
        .unwrap()
}

#[test]
fn a_blocked_set_is_granted_all_at_once_when_its_last_key_frees() {
    let server = Server::start();
    let mut c = server.conn();
    let ks = keys(3);
    let a = must_acquire(&mut c, &ks[0], "h-a", LONG_TTL);
    let b = must_acquire(&mut c, &ks[2], "h-b", LONG_TTL);
    let set = Blocked::set(&server, &mut c, &ks, "order-1", "0");
    assert_eq!(lock_info_field(&mut c, "waiting_keys"), 3);
    // One key freed: still nothing for the set, and the freed key stays free.
    assert_eq!(release(&mut c, &ks[0], "h-a"), 1);
    assert_eq!(blocked_clients(&mut c), 1);
    assert_all_absent(&mut c, &ks[..2]);
    assert_eq!(release(&mut c, &ks[2], "h-b"), 1);
    let got = set.tokens();
    assert_eq!(got.len(), 3);
    assert!(got.iter().all(|t| *t > a.max(b)));
    for (key, token) in ks.iter().zip(&got) {
        assert_held(&mut c, key, *token, WAITER_TTL);
    }
    assert_eq!(lock_info_field(&mut c, "waiting_keys"), 0);
    assert_eq!(mrelease(&mut c, &ks, "order-1"), 3);
}

#[test]
fn a_later_single_key_waiter_never_overtakes_a_set_and_disjoint_keys_are_not_delayed() {
    let server = Server::start();
    let mut c = server.conn();
    let ks = keys(3); // ks[0], ks[1]: the set; ks[2]: a key outside it
    must_acquire(&mut c, &ks[0], "h-0", LONG_TTL);
    must_acquire(&mut c, &ks[1], "h-1", LONG_TTL);
    must_acquire(&mut c, &ks[2], "h-2", LONG_TTL);
    let set = Blocked::set(&server, &mut c, &ks[..2], "order-1", "0");
    let later = Blocked::one(&server, &mut c, &ks[0], "later");
    let disjoint = Blocked::one(&server, &mut c, &ks[2], "disjoint");
    // ks[0] is freed while the set still waits for ks[1]: it stays free for the set.
    assert_eq!(release(&mut c, &ks[0], "h-0"), 1);
    assert_eq!(blocked_clients(&mut c), 3);
    assert_absent(&mut c, &ks[0]);
    // ... and a non-blocking acquire or set on it is refused (queued waiters go first).
    assert_eq!(acquire(&mut c, &ks[0], "barger", LONG_TTL), None);
    assert_eq!(macquire(&mut c, &ks[..1], "barger", LONG_TTL), None);
    // A key outside the set is handed off at once.
    assert_eq!(release(&mut c, &ks[2], "h-2"), 1);
    let d = disjoint.token();
    assert_held(&mut c, &ks[2], d, WAITER_TTL);
    // The set goes first, then the later waiter.
    assert_eq!(release(&mut c, &ks[1], "h-1"), 1);
    let got = set.tokens();
    assert_eq!(blocked_clients(&mut c), 1);
    assert_eq!(mrelease(&mut c, &ks[..2], "order-1"), 2);
    let t = later.token();
    assert!(t > got[1]);
    assert_held(&mut c, &ks[0], t, WAITER_TTL);
}

#[test]
fn overlapping_sets_and_a_single_waiter_keep_arrival_order_without_deadlock() {
    let server = Server::start();
    let mut c = server.conn();
    let ks = keys(3); // A, B, C
    let (a, b, cc) = (&ks[0], &ks[1], &ks[2]);
    macquire(&mut c, &[a.clone(), cc.clone()], "holder", LONG_TTL).unwrap();
    // w1 wants {A, B}, w2 wants {B, C} (listed the other way round), w3 wants B alone.
    let w1 = Blocked::set(&server, &mut c, &[a.clone(), b.clone()], "w1", "0");
    let w2 = Blocked::set(&server, &mut c, &[cc.clone(), b.clone()], "w2", "0");
    let w3 = Blocked::one(&server, &mut c, b, "w3");
    assert_eq!(mrelease(&mut c, &[a.clone(), cc.clone()], "holder"), 2);
    // w1 goes; w2 is at the head of C (free) but behind w1 on B: it waits, C stays free.
    let t1 = w1.tokens();
    assert_eq!(blocked_clients(&mut c), 2);
    assert_absent(&mut c, cc);
    assert_eq!(mrelease(&mut c, &[a.clone(), b.clone()], "w1"), 2);
    let t2 = w2.tokens();
    assert!(t2.iter().min() > t1.iter().max());
    assert_held(&mut c, cc, t2[0], WAITER_TTL);
    assert_held(&mut c, b, t2[1], WAITER_TTL);
    assert_absent(&mut c, a);
    assert_eq!(blocked_clients(&mut c), 1);
    assert_eq!(mrelease(&mut c, &[b.clone(), cc.clone()], "w2"), 2);
    let t3 = w3.token();
    assert!(t3 > t2[1]);
    assert_eq!(lock_info_field(&mut c, "waiting_keys"), 0);
}

#[test]
fn sets_in_opposite_key_order_do_not_deadlock() {
    let server = Server::start();
    let mut c = server.conn();
    let ks = keys(2);
    let rev = vec![ks[1].clone(), ks[0].clone()];
    must_acquire(&mut c, &ks[0], "h", LONG_TTL);
    let mut waiters = vec![];
    for i in 0..6 {
        let order = if i % 2 == 0 { &ks } else { &rev };
        waiters.push((
            format!("w{i}"),
            Blocked::set(&server, &mut c, order, &format!("w{i}"), "0"),
        ));
    }
    assert_eq!(release(&mut c, &ks[0], "h"), 1);
    let mut last = 0;
    for (owner, w) in waiters {
        let got = w.tokens();
        assert!(
            got.iter().all(|t| *t > last),
            "{owner}: {got:?} after {last}"
        );
        last = *got.iter().max().unwrap();
        assert_eq!(mrelease(&mut c, &ks, &owner), 2);
    }
}

#[test]
fn a_waiting_set_whose_key_expires_is_granted_from_the_timer_in_one_transaction() {
    let primary = Server::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let replica = Server::replica_of(&primary);
    wait_for_replica_sync(&primary, &replica);
    let mut c = primary.conn();
    let ks = keys(2);
    must_acquire(&mut c, &ks[0], "short", 300);
    let set = Blocked::set(&primary, &mut c, &ks, "order-1", "0");
    // Nobody releases: the holder's deadline passes and the timer hands over the set.
    let got = set.tokens();
    for (key, token) in ks.iter().zip(&got) {
        assert_held(&mut c, key, *token, WAITER_TTL);
    }
    wait_for_replica_sync(&primary, &replica);
    let mut r = replica.conn();
    for (key, token) in ks.iter().zip(&got) {
        assert_eq!(fence(&mut r, key), Some(*token), "{key} on the replica");
    }
    let commands = aof_commands(&aof_incr(&primary));
    let loads: Vec<usize> = commands
        .iter()
        .enumerate()
        .filter(|(_, c)| c[0] == "LOCK.LOAD" && c[2] == "order-1")
        .map(|(i, _)| i)
        .collect();
    assert_eq!(loads.len(), 2, "{commands:?}");
    let multi = commands[..loads[0]].iter().rposition(|c| c[0] == "MULTI");
    let exec = commands[loads[1]..].iter().position(|c| c[0] == "EXEC");
    let (Some(multi), Some(exec)) = (multi, exec) else {
        panic!("the grant is not inside MULTI/EXEC: {commands:?}");
    };
    assert!(
        commands[multi..loads[1] + exec]
            .iter()
            .all(|c| c[0] != "EXEC"),
        "one transaction: {commands:?}"
    );
}

#[test]
fn a_set_that_times_out_or_leaves_wakes_the_waiter_behind_it() {
    let server = Server::start();
    let mut c = server.conn();
    let ks = keys(2);
    must_acquire(&mut c, &ks[1], "holder", LONG_TTL);
    // ks[0] is free; each set blocks the single waiter queued on ks[0] behind it.
    for how in ["timeout", "kill", "unblock", "unblock-error"] {
        let timeout = if how == "timeout" { "100" } else { "0" };
        let set = Blocked::set(&server, &mut c, &ks, "order-1", timeout);
        let behind = Blocked::one(&server, &mut c, &ks[0], "behind");
        let id = set.id.to_string();
        match how {
            "timeout" => assert_eq!(set.reply(), Ok(Value::Nil), "{how}"),
            "kill" => {
                assert_eq!(
                    call(&mut c, "CLIENT", &["KILL", "ID", &id]),
                    Ok(Value::Int(1))
                );
                assert!(set.reply().is_err(), "{how}");
            }
            "unblock" => {
                assert_eq!(call(&mut c, "CLIENT", &["UNBLOCK", &id]), Ok(Value::Int(1)));
                assert_eq!(set.reply(), Ok(Value::Nil), "{how}");
            }
            _ => {
                assert_eq!(
                    call(&mut c, "CLIENT", &["UNBLOCK", &id, "ERROR"]),
                    Ok(Value::Int(1))
                );
                assert_err_code(set.reply(), "UNBLOCKED");
            }
        }
        // Out of both queues, and the waiter behind it on the free key is woken.
        let t = behind.token();
        assert_held(&mut c, &ks[0], t, WAITER_TTL);
        assert_eq!(lock_info_field(&mut c, "waiting_keys"), 0, "{how}");
        assert_eq!(release(&mut c, &ks[0], "behind"), 1);
    }
    assert_eq!(mrelease(&mut c, &ks, "order-1"), 0);
}

#[test]
fn block_inside_multi_or_a_script_does_not_block() {
    let server = Server::start();
    let mut c = server.conn();
    let ks = keys(2);
    must_acquire(&mut c, &ks[1], "holder", LONG_TTL);
    let args = macquire_args(&ks, "o", 1000, &["BLOCK", "0"]);
    let replies: Vec<Value> = redis::pipe()
        .atomic()
        .cmd("LOCK.MACQUIRE")
        .arg(&args)
        .query(&mut c)
        .unwrap();
    assert_eq!(replies, [Value::Nil]);
    let mut script_args = vec!["0".to_string()];
    script_args.extend(args);
    let mut eval = vec!["return redis.call('LOCK.MACQUIRE', unpack(ARGV))".to_string()];
    eval.extend(script_args);
    assert_eq!(call(&mut c, "EVAL", &eval), Ok(Value::Nil));
    assert_absent(&mut c, &ks[0]);
}

#[test]
fn a_key_that_changes_type_fails_the_waiting_set() {
    let server = Server::start();
    let mut c = server.conn();
    let ks = keys(2);
    must_acquire(&mut c, &ks[1], "holder", LONG_TTL);
    let set = Blocked::set(&server, &mut c, &ks, "order-1", "0");
    redis::cmd("SET").arg(&ks[1]).arg("x").exec(&mut c).unwrap();
    assert_err_code(set.reply(), "WRONGTYPE");
    assert_absent(&mut c, &ks[0]);
    assert_eq!(lock_info_field(&mut c, "waiting_keys"), 0);
}

#[test]
fn a_full_queue_on_any_key_refuses_the_set() {
    let server = Server::start_with_module_args(&["max-waiters", "1"], &[]);
    let mut c = server.conn();
    let ks = keys(2);
    must_acquire(&mut c, &ks[1], "holder", LONG_TTL);
    let _w = Blocked::one(&server, &mut c, &ks[1], "w");
    assert_err(
        call(
            &mut c,
            "LOCK.MACQUIRE",
            &macquire_args(&ks, "o", 1000, &["BLOCK", "0"]),
        ),
        "ERR too many waiters on this key (lock.max-waiters is 1)",
    );
    assert_eq!(lock_info_field(&mut c, "waiting_keys"), 1);
}

#[test]
fn a_waiting_set_is_granted_when_its_held_keys_are_deleted_or_flushed() {
    let server = Server::start();
    let mut c = server.conn();
    for how in ["DEL", "FLUSHALL"] {
        let ks = keys(3);
        must_acquire(&mut c, &ks[1], "holder", LONG_TTL);
        must_acquire(&mut c, &ks[2], "holder", LONG_TTL);
        let set = Blocked::set(&server, &mut c, &ks, "order-1", "0");
        match how {
            "DEL" => redis::cmd("DEL").arg(&ks[1..]).exec(&mut c).unwrap(),
            _ => redis::cmd("FLUSHALL").exec(&mut c).unwrap(),
        }
        let got = set.tokens();
        for (key, token) in ks.iter().zip(&got) {
            assert_held(&mut c, key, *token, WAITER_TTL);
        }
    }
}

#[test]
fn demotion_to_replica_fails_a_waiting_set() {
    let server = Server::start();
    let other = Server::start();
    let mut c = server.conn();
    let ks = keys(2);
    must_acquire(&mut c, &ks[1], "holder", LONG_TTL);
    let set = Blocked::set(&server, &mut c, &ks, "order-1", "0");
    let port = other.port().to_string();
    assert_eq!(
        call(&mut c, "REPLICAOF", &["127.0.0.1", &port]),
        Ok(Value::Okay)
    );
    match set.reply() {
        Err(e) if e.code().is_some() => {}
        other => panic!("after demotion: expected an error reply, got {other:?}"),
    }
    wait_blocked(&mut c, 0);
    assert_eq!(lock_info_field(&mut c, "waiting_keys"), 0);
}
