//! What an operator sees of the module, against a real server: `LOCK.INFO`, the `INFO lock`
//! section, the `lock.*` configs, `COMMAND DOCS` / `COMMAND INFO` metadata, keyspace events of
//! class `d`, and ACL key permissions.
//!
//! Each test has its own server, so the `INFO lock` counters start at zero and every value is
//! asserted exactly after each step. Blocked calls run on their own thread (or a bare socket
//! whose reply is never read) and a waiter is started only once the previous ones are counted in
//! `INFO clients` `blocked_clients`. Nothing sleeps to wait for the server: tests poll
//! observable state or wait for a reply; the only fixed ttls are ones the test set itself.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::TcpStream;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use common::*;
use redis::{Connection, RedisResult, Value};

/// A ttl long enough that no hold in these tests expires by accident.
const LONG_TTL: i64 = 100_000;

/// The ttl waiters ask for: far longer than the test needs them to hold.
const WAITER_TTL: i64 = 10_000;

/// How long to wait for the server to reach an observable state. Generous, so a slow (shared,
/// two-core) machine does not fail the tests; a healthy run never comes near it.
const PATIENCE: Duration = Duration::from_secs(10);

/// The `WRONGTYPE` reply, as the server words it.
const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

// --- Helpers -----------------------------------------------------------------

/// The packed `LOCK.ACQUIRE key owner ttl BLOCK timeout`.
fn block_cmd(key: &str, owner: &str, ttl: i64, timeout: i64) -> redis::Cmd {
    let mut cmd = redis::cmd("LOCK.ACQUIRE");
    cmd.arg(key).arg(owner).arg(ttl).arg("BLOCK").arg(timeout);
    cmd
}

/// Run `LOCK.ACQUIRE key owner ttl BLOCK timeout` on a new connection on its own thread and
/// return once the server counts one more blocked client. The handle yields the reply.
fn start_waiter(
    server: &Server,
    ctl: &mut Connection,
    key: &str,
    owner: &str,
    ttl: i64,
    timeout: i64,
) -> JoinHandle<RedisResult<Value>> {
    let before = blocked_clients(ctl);
    let mut conn = server.conn();
    let cmd = block_cmd(key, owner, ttl, timeout);
    let handle = thread::spawn(move || cmd.query(&mut conn));
    wait_blocked(ctl, before + 1);
    handle
}

/// A waiter on a bare socket whose reply the test never reads: write the blocking
/// `LOCK.ACQUIRE` and return once the server counts it as blocked. No thread is left behind.
fn raw_waiter(server: &Server, ctl: &mut Connection, key: &str, owner: &str) -> TcpStream {
    let before = blocked_clients(ctl);
    let mut stream = TcpStream::connect(("127.0.0.1", server.port())).expect("connect");
    stream
        .write_all(&block_cmd(key, owner, 1_000, 0).get_packed_command())
        .expect("write LOCK.ACQUIRE");
    wait_blocked(ctl, before + 1);
    stream
}

/// Join a waiter whose reply must be a token.
#[track_caller]
fn granted(waiter: JoinHandle<RedisResult<Value>>) -> i64 {
    match waiter.join().expect("waiter thread panicked") {
        Ok(Value::Int(token)) => token,
        other => panic!("waiter: expected a token, got {other:?}"),
    }
}

/// `LOCK.INFO key`, raw reply.
fn lock_info(conn: &mut Connection, key: &str) -> RedisResult<Value> {
    redis::cmd("LOCK.INFO").arg(key).query(conn)
}

fn bulk(s: impl AsRef<[u8]>) -> Value {
    Value::BulkString(s.as_ref().to_vec())
}

/// Check a RESP2 `LOCK.INFO` reply: a flat array `owner <bulk> token <int> ttl <int> waiters
/// <int>` in that order, with `0 < ttl <= max_ttl`.
#[track_caller]
fn assert_info_resp2(reply: Value, owner: &[u8], token: i64, max_ttl: i64, waiters: i64) {
    let Value::Array(items) = reply else {
        panic!("LOCK.INFO: expected an array, got {reply:?}");
    };
    assert_eq!(
        items.len(),
        16,
        "LOCK.INFO: expected 16 elements, got {items:?}"
    );
    let ttl = match items[5] {
        Value::Int(ttl) => ttl,
        ref other => panic!("LOCK.INFO ttl: expected an integer, got {other:?}"),
    };
    assert!(
        ttl > 0 && ttl <= max_ttl,
        "LOCK.INFO ttl = {ttl}, expected in 1..={max_ttl}"
    );
    assert_eq!(
        items[..14],
        vec![
            bulk("owner"),
            bulk(owner),
            bulk("token"),
            Value::Int(token),
            bulk("ttl"),
            Value::Int(ttl),
            bulk("waiters"),
            Value::Int(waiters),
            bulk("mode"),
            Value::SimpleString("exclusive".into()),
            bulk("limit"),
            Value::Nil,
            bulk("holders"),
            Value::Array(vec![Value::Array(vec![
                bulk("owner"),
                bulk(owner),
                bulk("token"),
                Value::Int(token),
                bulk("ttl"),
                Value::Int(ttl),
            ])]),
        ],
        "LOCK.INFO reply"
    );
    assert_eq!(items[14], bulk("queue"));
    match &items[15] {
        Value::Array(queue) => assert_eq!(queue.len() as i64, waiters, "queue {queue:?}"),
        other => panic!("LOCK.INFO queue: expected an array, got {other:?}"),
    }
}

/// The `INFO lock` counters, all integers.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Counters {
    locks: i64,
    waiters: i64,
    waiting_keys: i64,
    acquired: i64,
    contended: i64,
    handed_off: i64,
    released: i64,
    extended: i64,
    expired: i64,
    timed_out: i64,
    token_high_water: i64,
}

/// One of `lock_wait_ms` / `lock_hold_ms`: `count=N,mean=F,p50=F,p90=F,p99=F,max=F`.
#[derive(Debug, Default, Clone, PartialEq)]
struct Summary {
    count: i64,
    mean: f64,
    p50: f64,
    p90: f64,
    p99: f64,
    max: f64,
}

/// The whole `INFO lock` section.
#[derive(Debug)]
struct LockInfo {
    counters: Counters,
    wait: Summary,
    hold: Summary,
}

/// The field names `INFO lock` must print, in order.
const INFO_FIELDS: [&str; 13] = [
    "lock_locks",
    "lock_waiters",
    "lock_waiting_keys",
    "lock_acquired",
    "lock_contended",
    "lock_handed_off",
    "lock_released",
    "lock_extended",
    "lock_expired",
    "lock_timed_out",
    "lock_token_high_water",
    "lock_wait_ms",
    "lock_hold_ms",
];

/// Parse `count=N,mean=F,...`, checking the keys and their order and that the statistics are
/// consistent (`p50 <= p90 <= p99 <= max`, `mean <= max`, all zero when `count` is 0).
#[track_caller]
fn parse_summary(field: &str, text: &str) -> Summary {
    let parts: Vec<(&str, &str)> = text
        .split(',')
        .map(|kv| {
            kv.split_once('=')
                .unwrap_or_else(|| panic!("{field}: {kv:?} in {text:?} is not name=value"))
        })
        .collect();
    let names: Vec<&str> = parts.iter().map(|(k, _)| *k).collect();
    assert_eq!(
        names,
        ["count", "mean", "p50", "p90", "p99", "max"],
        "{field} = {text:?}"
    );
    let float = |i: usize| -> f64 {
        parts[i]
            .1
            .parse()
            .unwrap_or_else(|e| panic!("{field}: {:?} in {text:?}: {e}", parts[i].1))
    };
    let s = Summary {
        count: parts[0]
            .1
            .parse()
            .unwrap_or_else(|e| panic!("{field}: count in {text:?}: {e}")),
        mean: float(1),
        p50: float(2),
        p90: float(3),
        p99: float(4),
        max: float(5),
    };
    assert!(s.count >= 0, "{field} = {text:?}");
    assert!(
        0.0 <= s.p50 && s.p50 <= s.p90 && s.p90 <= s.p99 && s.p99 <= s.max && s.mean <= s.max,
        "{field} = {text:?}: statistics out of order"
    );
    if s.count == 0 {
        assert_eq!(s, Summary::default(), "{field} = {text:?} with no samples");
    }
    s
}

/// Read and parse `INFO lock`: exactly the fields in `INFO_FIELDS`, in that order.
#[track_caller]
fn lock_stats(conn: &mut Connection) -> LockInfo {
    let text: String = redis::cmd("INFO")
        .arg("lock")
        .query(conn)
        .expect("INFO lock");
    let fields: Vec<(String, String)> = text
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l
                .split_once(':')
                .unwrap_or_else(|| panic!("INFO lock line {l:?}"));
            (k.to_string(), v.to_string())
        })
        .collect();
    let names: Vec<&str> = fields.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, INFO_FIELDS, "INFO lock fields:\n{text}");
    let int = |i: usize| -> i64 {
        fields[i]
            .1
            .parse()
            .unwrap_or_else(|e| panic!("{} = {:?}: {e}", fields[i].0, fields[i].1))
    };
    LockInfo {
        counters: Counters {
            locks: int(0),
            waiters: int(1),
            waiting_keys: int(2),
            acquired: int(3),
            contended: int(4),
            handed_off: int(5),
            released: int(6),
            extended: int(7),
            expired: int(8),
            timed_out: int(9),
            token_high_water: int(10),
        },
        wait: parse_summary(&fields[11].0, &fields[11].1),
        hold: parse_summary(&fields[12].0, &fields[12].1),
    }
}

/// Assert every `INFO lock` counter equals `expected`.
#[track_caller]
fn assert_counters(conn: &mut Connection, expected: &Counters, after: &str) {
    assert_eq!(
        lock_stats(conn).counters,
        *expected,
        "INFO lock after {after}"
    );
}

/// Milliseconds elapsed since `start`, as a float.
fn ms_since(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1000.0
}

/// `CONFIG GET name` for one exact name.
fn config_get(c: &mut Connection, name: &str) -> String {
    let pair: Vec<String> = redis::cmd("CONFIG").arg("GET").arg(name).query(c).unwrap();
    assert_eq!(pair.len(), 2, "CONFIG GET {name}: {pair:?}");
    assert_eq!(pair[0], name);
    pair[1].clone()
}

fn config_set(c: &mut Connection, name: &str, value: &str) -> RedisResult<Value> {
    redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(c)
}

/// A bulk or simple string reply as text.
#[track_caller]
fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).expect("non-UTF-8 string"),
        Value::SimpleString(s) => s.clone(),
        other => panic!("expected a string, got {other:?}"),
    }
}

/// A RESP2 flat `name value name value ...` array (or a RESP3 map) as ordered pairs.
#[track_caller]
fn pairs(v: &Value) -> Vec<(String, Value)> {
    match v {
        Value::Array(items) => {
            assert!(items.len() % 2 == 0, "odd field/value array {items:?}");
            items
                .chunks(2)
                .map(|kv| (text(&kv[0]), kv[1].clone()))
                .collect()
        }
        Value::Map(kvs) => kvs.iter().map(|(k, v)| (text(k), v.clone())).collect(),
        other => panic!("expected field/value pairs, got {other:?}"),
    }
}

/// The value of `name` among `pairs`.
#[track_caller]
fn field<'a>(pairs: &'a [(String, Value)], name: &str) -> &'a Value {
    &pairs
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no field {name:?} in {pairs:?}"))
        .1
}

/// A reply array of strings (e.g. command flags) as text.
#[track_caller]
fn strings(v: &Value) -> Vec<String> {
    match v {
        Value::Array(items) | Value::Set(items) => items.iter().map(text).collect(),
        other => panic!("expected an array of strings, got {other:?}"),
    }
}

/// A connection authenticated as `user` with password `pass`.
fn conn_as(server: &Server, user: &str, pass: &str) -> Connection {
    let mut conn = server.conn();
    let _: () = redis::cmd("AUTH")
        .arg(user)
        .arg(pass)
        .query(&mut conn)
        .unwrap_or_else(|e| panic!("AUTH {user}: {e}"));
    conn
}

// --- LOCK.INFO ---------------------------------------------------------------

#[test]
fn info_is_nil_for_a_free_lock_and_describes_a_held_one() {
    let server = Server::start();
    let mut c = server.conn();
    let key = unique_key("info");
    let owner: &[u8] = b"own\x00er\xff\r\n";

    assert_eq!(lock_info(&mut c, &key), Ok(Value::Nil), "never acquired");

    let token = must_acquire(&mut c, &key, owner, 10_000);
    assert_info_resp2(lock_info(&mut c, &key).unwrap(), owner, token, 10_000, 0);

    // Extending keeps the token and moves the ttl.
    assert_eq!(extend(&mut c, &key, owner, 60_000), 1);
    let reply = lock_info(&mut c, &key).unwrap();
    let Value::Array(ref items) = reply else {
        panic!("LOCK.INFO after EXTEND: {reply:?}");
    };
    assert!(
        matches!(items[5], Value::Int(ttl) if ttl > 10_000 && ttl <= 60_000),
        "ttl after EXTEND to 60000: {:?}",
        items[5]
    );
    assert_info_resp2(reply, owner, token, 60_000, 0);

    assert_eq!(release(&mut c, &key, owner), 1);
    assert_eq!(lock_info(&mut c, &key), Ok(Value::Nil), "released");
}

#[test]
fn info_is_nil_once_the_hold_expired() {
    let server = Server::start();
    let mut c = server.conn();
    let key = unique_key("info");
    // With active expiry off the key stays until something touches it: LOCK.INFO must not
    // report a hold past its deadline either way.
    let _: () = redis::cmd("DEBUG")
        .arg("SET-ACTIVE-EXPIRE")
        .arg(0)
        .query(&mut c)
        .unwrap();
    let token = must_acquire(&mut c, &key, "a", 30);
    match lock_info(&mut c, &key).unwrap() {
        Value::Nil => {} // a slow machine may already be past 30 ms
        reply => assert_info_resp2(reply, b"a", token, 30, 0),
    }
    wait_until("LOCK.INFO to turn nil after the ttl", PATIENCE, || {
        lock_info(&mut c, &key) == Ok(Value::Nil)
    });
    assert_eq!(
        fence(&mut c, &key),
        None,
        "LOCK.FENCE agrees the lock is free"
    );
}

#[test]
fn info_counts_the_waiters_in_the_queue() {
    let server = Server::start();
    let mut c = server.conn();
    let key = unique_key("info");
    let token = must_acquire(&mut c, &key, "holder", LONG_TTL);

    let first = start_waiter(&server, &mut c, &key, "other-1", WAITER_TTL, 0);
    let second = start_waiter(&server, &mut c, &key, "other-2", WAITER_TTL, 0);
    assert_eq!(blocked_clients(&mut c), 2);
    assert_info_resp2(
        lock_info(&mut c, &key).unwrap(),
        b"holder",
        token,
        LONG_TTL,
        2,
    );

    // Handoff: the first waiter holds it now, one is still queued.
    assert_eq!(release(&mut c, &key, "holder"), 1);
    let first_token = granted(first);
    assert!(
        first_token > token,
        "handoff token {first_token} <= {token}"
    );
    assert_info_resp2(
        lock_info(&mut c, &key).unwrap(),
        b"other-1",
        first_token,
        WAITER_TTL,
        1,
    );

    assert_eq!(release(&mut c, &key, "other-1"), 1);
    let second_token = granted(second);
    assert_info_resp2(
        lock_info(&mut c, &key).unwrap(),
        b"other-2",
        second_token,
        WAITER_TTL,
        0,
    );
    assert_eq!(blocked_clients(&mut c), 0);
}

#[test]
fn info_is_a_map_under_resp3() {
    let server = Server::start();
    let client = redis::Client::open(format!(
        "redis://127.0.0.1:{}/?protocol=resp3",
        server.port()
    ))
    .unwrap();
    let mut c = client.get_connection().expect("RESP3 connection");
    c.set_read_timeout(Some(PATIENCE)).unwrap();
    let key = unique_key("info");

    assert_eq!(
        lock_info(&mut c, &key),
        Ok(Value::Nil),
        "free lock under RESP3"
    );

    let owner: &[u8] = b"bin\x00ary";
    let token = must_acquire(&mut c, &key, owner, 10_000);
    let reply = lock_info(&mut c, &key).unwrap();
    let Value::Map(ref kvs) = reply else {
        panic!("LOCK.INFO under RESP3: expected a map, got {reply:?}");
    };
    assert_eq!(kvs.len(), 8, "LOCK.INFO map: {kvs:?}");
    let ttl = match kvs[2].1 {
        Value::Int(ttl) => ttl,
        ref other => panic!("ttl: expected an integer, got {other:?}"),
    };
    assert!(ttl > 0 && ttl <= 10_000, "ttl {ttl}");
    assert_eq!(
        *kvs,
        vec![
            (bulk("owner"), bulk(owner)),
            (bulk("token"), Value::Int(token)),
            (bulk("ttl"), Value::Int(ttl)),
            (bulk("waiters"), Value::Int(0)),
            (bulk("mode"), Value::SimpleString("exclusive".into())),
            (bulk("limit"), Value::Nil),
            (
                bulk("holders"),
                Value::Array(vec![Value::Map(vec![
                    (bulk("owner"), bulk(owner)),
                    (bulk("token"), Value::Int(token)),
                    (bulk("ttl"), Value::Int(ttl)),
                ])])
            ),
            (bulk("queue"), Value::Array(vec![])),
        ]
    );
}

#[test]
fn info_rejects_bad_arity_and_other_types() {
    let server = Server::start();
    let mut c = server.conn();
    let arity = "ERR wrong number of arguments for 'lock.info' command";
    assert_err(call::<&str>(&mut c, "LOCK.INFO", &[]), arity);
    assert_err(call(&mut c, "LOCK.INFO", &["a", "b"]), arity);
    assert_err(call(&mut c, "LOCK.INFO", &["a", "b", "c"]), arity);

    let key = unique_key("info");
    let _: () = redis::cmd("SET").arg(&key).arg("v").query(&mut c).unwrap();
    assert_err(lock_info(&mut c, &key), WRONGTYPE);
}

// --- INFO lock -----------------------------------------------------------------

#[test]
fn info_section_counts_a_known_sequence_exactly() {
    let server = Server::start();
    let mut c = server.conn();
    let mut want = Counters::default();
    let start = lock_stats(&mut c);
    assert_eq!(start.counters, want, "fresh server");
    assert_eq!((start.wait.count, start.hold.count), (0, 0));

    // Three grants on distinct keys.
    let keys: Vec<String> = (1..=3).map(|i| unique_key(&format!("stats{i}"))).collect();
    let before_k3 = Instant::now();
    let tokens: Vec<i64> = keys
        .iter()
        .map(|k| must_acquire(&mut c, k, "a", LONG_TTL))
        .collect();
    want.acquired = 3;
    want.locks = 3;
    want.token_high_water = *tokens.iter().max().unwrap();
    assert_counters(&mut c, &want, "3 grants");

    // A retry by the holder returns the same token: no new grant.
    assert_eq!(must_acquire(&mut c, &keys[0], "a", LONG_TTL), tokens[0]);
    assert_counters(&mut c, &want, "an idempotent retry");

    // A contended, non-blocking acquire.
    assert_eq!(acquire(&mut c, &keys[0], "b", LONG_TTL), None);
    want.contended = 1;
    assert_counters(&mut c, &want, "a contended acquire");

    // One release; a release by a non-owner changes nothing.
    assert_eq!(release(&mut c, &keys[2], "b"), 0);
    assert_eq!(release(&mut c, &keys[2], "a"), 1);
    let k3_bound = ms_since(before_k3);
    want.released = 1;
    want.locks = 2;
    assert_counters(&mut c, &want, "a release");
    let stats = lock_stats(&mut c);
    assert_eq!((stats.wait.count, stats.hold.count), (0, 1));
    // One sample: every statistic is that sample, at most the time the test saw pass. Hold
    // times come from the server's millisecond clock (grant and release each truncated to the
    // millisecond), so a sub-millisecond hold can read as 1 ms.
    let h = &stats.hold;
    assert!(
        h.mean == h.max && h.p50 == h.max && h.p90 == h.max && h.p99 == h.max,
        "one hold sample: {h:?}"
    );
    assert!(
        h.max <= k3_bound + 1.0,
        "hold {h:?} longer than the {k3_bound} ms observed (+1 ms clock resolution)"
    );

    // One extend; an extend by a non-owner changes nothing.
    assert_eq!(extend(&mut c, &keys[1], "b", LONG_TTL), 0);
    assert_eq!(extend(&mut c, &keys[1], "a", LONG_TTL), 1);
    want.extended = 1;
    assert_counters(&mut c, &want, "an extend");

    // A blocked waiter (contended too), handed the lock on release.
    let queued = Instant::now();
    let waiter = start_waiter(&server, &mut c, &keys[0], "w", LONG_TTL, 0);
    want.contended = 2;
    want.waiters = 1;
    want.waiting_keys = 1;
    assert_counters(&mut c, &want, "a waiter blocked");
    assert_eq!(release(&mut c, &keys[0], "a"), 1);
    let w_token = granted(waiter);
    let wait_bound = ms_since(queued);
    assert!(w_token > want.token_high_water);
    want.waiters = 0;
    want.waiting_keys = 0;
    want.released = 2;
    want.handed_off = 1;
    want.acquired = 4;
    want.token_high_water = w_token;
    assert_counters(&mut c, &want, "a handoff");
    let stats = lock_stats(&mut c);
    assert_eq!((stats.wait.count, stats.hold.count), (1, 2));
    let w = &stats.wait;
    assert!(
        w.mean == w.max && w.p50 == w.max && w.p90 == w.max && w.p99 == w.max,
        "one wait sample: {w:?}"
    );
    assert!(
        w.max <= wait_bound,
        "wait {w:?} longer than the {wait_bound} ms observed"
    );

    // A waiter whose BLOCK timeout passes first. It runs on this connection: polling
    // `blocked_clients` could miss a 50 ms wait on a loaded machine, and the reply is enough.
    let reply = block_cmd(&keys[1], "t", LONG_TTL, 50).query::<Value>(&mut c);
    assert_eq!(reply, Ok(Value::Nil), "timed-out waiter");
    want.contended = 3;
    want.timed_out = 1;
    assert_counters(&mut c, &want, "a waiter timed out");

    // A hold left to expire; Redis deletes the key. Active expiry is off until the counters
    // were read, so a slow machine cannot expire it before the test looks.
    let _: () = redis::cmd("DEBUG")
        .arg("SET-ACTIVE-EXPIRE")
        .arg(0)
        .query(&mut c)
        .unwrap();
    let short = unique_key("stats-expire");
    let e_token = must_acquire(&mut c, &short, "e", 50);
    want.acquired = 5;
    want.locks = 3;
    want.token_high_water = e_token;
    assert_counters(&mut c, &want, "a short grant");
    let _: () = redis::cmd("DEBUG")
        .arg("SET-ACTIVE-EXPIRE")
        .arg(1)
        .query(&mut c)
        .unwrap();
    wait_until("the short lock's key to expire", PATIENCE, || {
        exists(&mut c, &short) == 0
    });
    want.expired = 1;
    want.locks = 2;
    assert_counters(&mut c, &want, "an expiry");

    // The histograms only count releases and grants to waiters.
    let stats = lock_stats(&mut c);
    assert_eq!((stats.wait.count, stats.hold.count), (1, 2), "{stats:?}");
}

#[test]
fn info_section_counts_an_expiry_replaced_by_a_new_grant_once() {
    let server = Server::start();
    let mut c = server.conn();
    let key = unique_key("stats");
    let mut want = Counters::default();
    // Active expiry off: nothing deletes the key in the background, so the next command on it
    // finds the expired hold (Redis may delete it lazily, or the module replaces it).
    let _: () = redis::cmd("DEBUG")
        .arg("SET-ACTIVE-EXPIRE")
        .arg(0)
        .query(&mut c)
        .unwrap();
    let first = must_acquire(&mut c, &key, "e1", 30);
    want.acquired = 1;
    want.locks = 1;
    want.token_high_water = first;
    assert_counters(&mut c, &want, "a short grant");

    wait_until("LOCK.FENCE to see the hold expired", PATIENCE, || {
        fence(&mut c, &key).is_none()
    });
    let second = must_acquire(&mut c, &key, "e2", LONG_TTL);
    assert!(second > first);
    want.acquired = 2;
    want.expired = 1;
    want.token_high_water = second;
    assert_counters(&mut c, &want, "a grant over an expired hold");

    assert_eq!(release(&mut c, &key, "e2"), 1);
    want.released = 1;
    want.locks = 0;
    assert_counters(&mut c, &want, "releasing the new hold");
}

#[test]
fn info_section_counts_an_expiry_handed_to_a_waiter() {
    let server = Server::start();
    let mut c = server.conn();
    let key = unique_key("stats");
    let mut want = Counters::default();
    // Long enough for the waiter to be seen blocked before the deadline on a loaded machine.
    let first = must_acquire(&mut c, &key, "e1", 250);
    let waiter = start_waiter(&server, &mut c, &key, "e2", LONG_TTL, 0);
    let second = granted(waiter);
    assert!(second > first);
    want.acquired = 2;
    want.contended = 1;
    want.handed_off = 1;
    want.expired = 1;
    want.locks = 1;
    want.token_high_water = second;
    assert_counters(&mut c, &want, "an expired hold handed to a waiter");
    let stats = lock_stats(&mut c);
    assert_eq!((stats.wait.count, stats.hold.count), (1, 0), "{stats:?}");
}

#[test]
fn info_section_gauges_follow_blocked_clients() {
    let server = Server::start();
    let mut c = server.conn();
    let (k1, k2) = (unique_key("gauge1"), unique_key("gauge2"));
    must_acquire(&mut c, &k1, "a", LONG_TTL);
    must_acquire(&mut c, &k2, "a", LONG_TTL);
    let gauges = |c: &mut Connection| {
        let s = lock_stats(c).counters;
        (s.waiters, s.waiting_keys)
    };
    assert_eq!(gauges(&mut c), (0, 0));

    let w1 = start_waiter(&server, &mut c, &k1, "w1", LONG_TTL, 0);
    assert_eq!(gauges(&mut c), (1, 1));
    let w2 = start_waiter(&server, &mut c, &k1, "w2", LONG_TTL, 0);
    assert_eq!(gauges(&mut c), (2, 1));
    let w3 = start_waiter(&server, &mut c, &k2, "w3", LONG_TTL, 0);
    assert_eq!(gauges(&mut c), (3, 2));

    assert_eq!(release(&mut c, &k2, "a"), 1);
    granted(w3);
    assert_eq!(gauges(&mut c), (2, 1), "after the handoff on {k2}");
    assert_eq!(release(&mut c, &k1, "a"), 1);
    granted(w1);
    assert_eq!(gauges(&mut c), (1, 1), "after the first handoff on {k1}");
    assert_eq!(release(&mut c, &k1, "w1"), 1);
    granted(w2);
    assert_eq!(gauges(&mut c), (0, 0), "after the last handoff");
    assert_eq!(blocked_clients(&mut c), 0);
}

// --- Configuration -----------------------------------------------------------

#[test]
fn configs_have_defaults_and_reject_out_of_range_values() {
    let server = Server::start();
    let mut c = server.conn();
    let all: BTreeMap<String, String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("lock.*")
        .query(&mut c)
        .unwrap();
    let expected: BTreeMap<String, String> = [
        ("lock.max-multi-keys", "64"),
        ("lock.max-owner-bytes", "1024"),
        ("lock.max-waiters", "10000"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(all, expected, "CONFIG GET lock.*");

    assert_eq!(config_set(&mut c, "lock.max-waiters", "5"), Ok(Value::Okay));
    assert_eq!(config_get(&mut c, "lock.max-waiters"), "5");

    for (name, bad) in [
        ("lock.max-owner-bytes", "0"),
        ("lock.max-owner-bytes", "-1"),
        ("lock.max-owner-bytes", "abc"),
        ("lock.max-waiters", "-1"),
        ("lock.max-waiters", "abc"),
        ("lock.max-multi-keys", "0"),
    ] {
        let before = config_get(&mut c, name);
        assert_err_code(config_set(&mut c, name, bad), "ERR");
        assert_eq!(
            config_get(&mut c, name),
            before,
            "{name} after CONFIG SET {bad}"
        );
    }
    assert_eq!(config_get(&mut c, "lock.max-owner-bytes"), "1024");
    assert_eq!(config_get(&mut c, "lock.max-waiters"), "5");

    // A new value takes effect at once.
    assert_eq!(
        config_set(&mut c, "lock.max-owner-bytes", "4"),
        Ok(Value::Okay)
    );
    let key = unique_key("config");
    assert_err(
        call(&mut c, "LOCK.ACQUIRE", &[key.as_str(), "abcde", "1000"]),
        "ERR owner is longer than lock.max-owner-bytes (4)",
    );
    must_acquire(&mut c, &key, "abcd", 1_000);
}

#[test]
fn configs_accept_module_arguments_at_load() {
    let server =
        Server::start_with_module_args(&["max-owner-bytes", "16", "max-waiters", "3"], &[]);
    let mut c = server.conn();
    assert_eq!(config_get(&mut c, "lock.max-owner-bytes"), "16");
    assert_eq!(config_get(&mut c, "lock.max-waiters"), "3");

    let key = unique_key("config");
    assert_err(
        call(
            &mut c,
            "LOCK.ACQUIRE",
            &[key.as_str(), &"o".repeat(17), "1000"],
        ),
        "ERR owner is longer than lock.max-owner-bytes (16)",
    );
    must_acquire(&mut c, &key, "o".repeat(16), LONG_TTL);

    // Three waiters fit, the fourth is refused at once.
    let _waiters: Vec<TcpStream> = (1..=3)
        .map(|i| raw_waiter(&server, &mut c, &key, &format!("w{i}")))
        .collect();
    assert_err(
        block_cmd(&key, "w4", 1_000, 0).query::<Value>(&mut c),
        "ERR too many waiters on this key (lock.max-waiters is 3)",
    );
    assert_eq!(blocked_clients(&mut c), 3);
}

// --- Command metadata --------------------------------------------------------

#[test]
fn command_docs_describe_every_command() {
    let server = Server::start();
    let mut c = server.conn();
    let reply: Value = redis::cmd("COMMAND")
        .arg("DOCS")
        .arg("lock.acquire")
        .arg("lock.release")
        .arg("lock.extend")
        .arg("lock.fence")
        .arg("lock.info")
        .query(&mut c)
        .unwrap();
    let docs: BTreeMap<String, Vec<(String, Value)>> = pairs(&reply)
        .into_iter()
        .map(|(name, doc)| (name, pairs(&doc)))
        .collect();

    // name, then per argument: (name, token, optional).
    type ArgSpec = (&'static str, Option<&'static str>, bool);
    let expected: [(&str, &[ArgSpec]); 5] = [
        (
            "lock.acquire",
            &[
                ("key", None, false),
                ("owner", None, false),
                ("ttl-ms", None, false),
                ("shared", Some("SHARED"), true),
                ("limit", Some("LIMIT"), true),
                ("timeout-ms", Some("BLOCK"), true),
            ],
        ),
        (
            "lock.release",
            &[("key", None, false), ("owner", None, false)],
        ),
        (
            "lock.extend",
            &[
                ("key", None, false),
                ("owner", None, false),
                ("ttl-ms", None, false),
            ],
        ),
        ("lock.fence", &[("key", None, false), ("token", None, true)]),
        ("lock.info", &[("key", None, false)]),
    ];
    let mut names: Vec<&str> = expected.iter().map(|(n, _)| *n).collect();
    names.sort_unstable();
    assert_eq!(
        docs.keys().map(String::as_str).collect::<Vec<_>>(),
        names,
        "COMMAND DOCS names: {reply:?}"
    );

    for (name, args) in expected {
        let doc = &docs[name];
        let summary = text(field(doc, "summary"));
        assert!(!summary.trim().is_empty(), "{name}: empty summary");
        assert!(!text(field(doc, "since")).is_empty(), "{name}: empty since");
        let complexity = text(field(doc, "complexity"));
        assert!(
            complexity.starts_with("O("),
            "{name} complexity: {complexity}"
        );
        assert_eq!(text(field(doc, "module")), "lock", "{name} module");

        let Value::Array(got) = field(doc, "arguments") else {
            panic!("{name}: arguments is not an array: {doc:?}");
        };
        let got: Vec<Vec<(String, Value)>> = got.iter().map(pairs).collect();
        let names: Vec<String> = got.iter().map(|a| text(field(a, "name"))).collect();
        let want: Vec<&str> = args.iter().map(|(n, _, _)| *n).collect();
        assert_eq!(names, want, "{name} argument names");
        for (arg, (arg_name, token, optional)) in got.iter().zip(args) {
            let has = |f: &str| arg.iter().any(|(k, _)| k == f);
            let got_token = has("token").then(|| text(field(arg, "token")));
            assert_eq!(
                got_token.as_deref(),
                *token,
                "{name} {arg_name} token: {arg:?}"
            );
            let flags = if has("flags") {
                strings(field(arg, "flags"))
            } else {
                Vec::new()
            };
            assert_eq!(
                flags.iter().any(|f| f == "optional"),
                *optional,
                "{name} {arg_name} optional: {arg:?}"
            );
            if *arg_name == "key" {
                assert_eq!(text(field(arg, "type")), "key", "{name} key type: {arg:?}");
            }
        }
    }
}

#[test]
fn command_info_flags_and_getkeys() {
    let server = Server::start();
    let mut c = server.conn();
    let flags = |c: &mut Connection, name: &str| -> Vec<String> {
        let reply: Value = redis::cmd("COMMAND")
            .arg("INFO")
            .arg(name)
            .query(c)
            .unwrap();
        let Value::Array(entries) = reply else {
            panic!("COMMAND INFO {name}: {reply:?}");
        };
        assert_eq!(entries.len(), 1, "COMMAND INFO {name}: {entries:?}");
        let Value::Array(ref info) = entries[0] else {
            panic!("COMMAND INFO {name}: not found: {entries:?}");
        };
        assert_eq!(text(&info[0]), name, "COMMAND INFO {name}");
        strings(&info[2])
    };

    let fence_flags = flags(&mut c, "lock.fence");
    for f in ["readonly", "fast"] {
        assert!(
            fence_flags.iter().any(|g| g == f),
            "lock.fence flags {fence_flags:?} lack {f}"
        );
    }
    let acquire_flags = flags(&mut c, "lock.acquire");
    for f in ["write", "denyoom"] {
        assert!(
            acquire_flags.iter().any(|g| g == f),
            "lock.acquire flags {acquire_flags:?} lack {f}"
        );
    }

    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("LOCK.ACQUIRE")
        .arg("mykey")
        .arg("o")
        .arg(10)
        .query(&mut c)
        .unwrap();
    assert_eq!(keys, ["mykey"]);
}

// --- Keyspace events ---------------------------------------------------------

/// The pattern every test subscribes to, and a marker channel it matches, published by the
/// test after the commands so the subscriber knows it has seen everything before it.
const LOCK_EVENTS: &str = "__keyevent@0__:lock.*";
const MARKER: &str = "__keyevent@0__:lock.test-marker";

#[test]
fn keyspace_events_follow_the_lock_lifecycle() {
    let server = Server::start();
    let mut c = server.conn();
    assert_eq!(
        config_set(&mut c, "notify-keyspace-events", "KEd"),
        Ok(Value::Okay)
    );
    let mut sub = server.conn();
    let mut pubsub = sub.as_pubsub();
    pubsub.set_read_timeout(Some(PATIENCE)).unwrap();
    pubsub.psubscribe(LOCK_EVENTS).unwrap();

    let key = unique_key("events");
    must_acquire(&mut c, &key, "a", LONG_TTL);
    assert_eq!(extend(&mut c, &key, "a", LONG_TTL), 1);
    let waiter = start_waiter(&server, &mut c, &key, "b", LONG_TTL, 0);
    assert_eq!(release(&mut c, &key, "a"), 1);
    granted(waiter);
    assert_eq!(release(&mut c, &key, "b"), 1);
    let _: i64 = redis::cmd("PUBLISH")
        .arg(MARKER)
        .arg("end")
        .query(&mut c)
        .unwrap();

    let mut got = Vec::new();
    loop {
        let msg = pubsub.get_message().expect("keyspace event");
        let channel = msg.get_channel_name().to_string();
        let payload: String = msg.get_payload().unwrap();
        if channel == MARKER {
            break;
        }
        got.push((channel, payload));
    }
    let want: Vec<(String, String)> = [
        "lock.acquired",
        "lock.extended",
        "lock.released",
        "lock.acquired",
        "lock.released",
    ]
    .iter()
    .map(|e| (format!("__keyevent@0__:{e}"), key.clone()))
    .collect();
    assert_eq!(got, want);
}

#[test]
fn keyspace_events_are_off_by_default() {
    let server = Server::start();
    let mut c = server.conn();
    assert_eq!(config_get(&mut c, "notify-keyspace-events"), "");
    let mut sub = server.conn();
    let mut pubsub = sub.as_pubsub();
    pubsub.set_read_timeout(Some(PATIENCE)).unwrap();
    pubsub.psubscribe(LOCK_EVENTS).unwrap();

    let key = unique_key("events");
    must_acquire(&mut c, &key, "a", LONG_TTL);
    assert_eq!(extend(&mut c, &key, "a", LONG_TTL), 1);
    assert_eq!(release(&mut c, &key, "a"), 1);
    let _: i64 = redis::cmd("PUBLISH")
        .arg(MARKER)
        .arg("end")
        .query(&mut c)
        .unwrap();

    let msg = pubsub.get_message().expect("the marker");
    assert_eq!(
        (msg.get_channel_name(), msg.get_payload::<String>().unwrap()),
        (MARKER, "end".to_string()),
        "the first message after the commands must be the marker"
    );
}

// --- ACL -----------------------------------------------------------------------

#[test]
fn acl_key_patterns_apply_to_lock_commands() {
    let server = Server::start();
    let mut c = server.conn();
    for rule in [
        vec!["SETUSER", "elsewhere", "on", ">pw", "~other:*", "+@all"],
        vec!["SETUSER", "reader", "on", ">pw", "%R~lock:*", "+@all"],
    ] {
        let _: () = redis::cmd("ACL").arg(&rule).query(&mut c).unwrap();
    }

    let mut elsewhere = conn_as(&server, "elsewhere", "pw");
    assert_err_code(
        call(&mut elsewhere, "LOCK.ACQUIRE", &["lockkey", "o", "10"]),
        "NOPERM",
    );
    assert_eq!(exists(&mut c, "lockkey"), 0);
    // Its own keys are fine.
    must_acquire(&mut elsewhere, "other:k", "o", LONG_TTL);

    let mut reader = conn_as(&server, "reader", "pw");
    assert_eq!(fence(&mut reader, "lock:x"), None);
    assert_eq!(lock_info(&mut reader, "lock:x"), Ok(Value::Nil));
    assert_err_code(
        call(&mut reader, "LOCK.ACQUIRE", &["lock:x", "o", "10"]),
        "NOPERM",
    );
    assert_err_code(
        call(&mut reader, "LOCK.RELEASE", &["lock:x", "o"]),
        "NOPERM",
    );
    assert_err_code(
        call(&mut reader, "LOCK.EXTEND", &["lock:x", "o", "10"]),
        "NOPERM",
    );
    assert_eq!(exists(&mut c, "lock:x"), 0);

    // Read access sees a lock someone else holds.
    let token = must_acquire(&mut c, "lock:x", "writer", LONG_TTL);
    assert_eq!(fence(&mut reader, "lock:x"), Some(token));
    assert_eq!(fence_check(&mut reader, "lock:x", token), 1);
}
