//! Abuse against a live server: every bad input each command can get, random command
//! sequences mixed with the keyspace commands that pull locks out from under the module,
//! thousands of blocked waiters on one key, and many locks at once (with their memory cost).
//!
//! Every test starts its own server. Environment knobs (all optional):
//! - `ABUSE_SEED`: seed of the random sequence test (printed by every run; set it to replay).
//! - `ABUSE_OPS`: commands in the random sequence test (default 5000).
//! - `WAITERS`: blocked clients in the waiter test (default 2000; capped by the fd limit).
//! - `LOCK_COUNT`: locks in the many-locks test (default 100000; the torture run uses
//!   `LOCK_COUNT=1000000 cargo test --test abuse many_locks -- --nocapture`).
//!
//! The memory figures are printed; run with `--nocapture` to see them.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::{Connection, RedisResult, Value};

/// Long enough that no hold in these tests expires by accident.
const LONG_TTL: i64 = 600_000;

/// How long to wait for the server to reach a state (blocked count, expiry of many keys...).
const PATIENCE: Duration = Duration::from_secs(60);

// --- Helpers -------------------------------------------------------------------

/// An integer field of `INFO <section>`.
fn info_int(c: &mut Connection, section: &str, field: &str) -> i64 {
    let value = info_field(c, section, field)
        .unwrap_or_else(|| panic!("INFO {section} has no field {field}"));
    value
        .parse()
        .unwrap_or_else(|e| panic!("INFO {section} {field} = {value:?}: {e}"))
}

fn used_memory(c: &mut Connection) -> i64 {
    info_int(c, "memory", "used_memory")
}

fn lock_stat(c: &mut Connection, name: &str) -> i64 {
    info_int(c, "lock", &format!("lock_{name}"))
}

fn dbsize(c: &mut Connection) -> i64 {
    redis::cmd("DBSIZE").query(c).expect("DBSIZE")
}

/// `LOCK.INFO key` as (owner, token, ttl, waiters), or `None` for nil.
fn lock_info(c: &mut Connection, key: &str) -> Option<(Vec<u8>, i64, i64, i64)> {
    let reply = redis::cmd("LOCK.INFO").arg(key).query(c);
    parse_lock_info(&reply.unwrap_or_else(|e| panic!("LOCK.INFO {key}: {e}")))
}

/// Parse a RESP2 `LOCK.INFO` reply of an exclusive lock (flat array `owner o token t ttl l
/// waiters w mode m limit l holders h queue q`) or nil. The first four fields are what this
/// suite compares; the rest describe the same hold again (checked in tests/operability.rs).
fn parse_lock_info(reply: &Value) -> Option<(Vec<u8>, i64, i64, i64)> {
    let items = match reply {
        Value::Nil => return None,
        Value::Array(items) if items.len() == 16 => items,
        other => panic!("LOCK.INFO: expected nil or 16 elements, got {other:?}"),
    };
    let name = |i: usize| match &items[i] {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        other => panic!("LOCK.INFO field name: {other:?}"),
    };
    let int = |i: usize| match items[i] {
        Value::Int(n) => n,
        ref other => panic!(
            "LOCK.INFO {}: expected an integer, got {other:?}",
            name(i - 1)
        ),
    };
    let names: Vec<String> = [0, 2, 4, 6].into_iter().map(name).collect();
    assert_eq!(
        names,
        ["owner", "token", "ttl", "waiters"],
        "LOCK.INFO fields"
    );
    let owner = match &items[1] {
        Value::BulkString(b) => b.clone(),
        other => panic!("LOCK.INFO owner: expected a bulk string, got {other:?}"),
    };
    Some((owner, int(3), int(5), int(7)))
}

/// The soft limit on open files of this process, from `/proc/self/limits`.
fn fd_soft_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

fn env_usize(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|e| panic!("{name}={v:?} is not a number: {e}")),
        Err(_) => default,
    }
}

/// The server log must show no panic, assertion or crash report.
#[track_caller]
fn assert_clean_log(server: &Server) {
    let log = server.log();
    for bad in [
        "panicked",
        "ASSERTION",
        "crashed",
        "BUG REPORT",
        "Guru Meditation",
    ] {
        assert!(
            !log.contains(bad),
            "server log contains {bad:?}:\n{}",
            log.lines()
                .filter(|l| !l.starts_with("*** Preparing"))
                .take(80)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// The server still answers and its process is the one we started.
#[track_caller]
fn assert_alive(server: &Server, pid: &str) {
    let mut c = server.conn();
    let pong: String = redis::cmd("PING").query(&mut c).expect("PING");
    assert_eq!(pong, "PONG");
    assert_eq!(
        info_field(&mut c, "server", "process_id").as_deref(),
        Some(pid),
        "a different process answers on the port"
    );
    assert!(
        std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "server process {pid} is gone"
    );
}

/// True if the server accepts a connection and answers `PING`.
fn answers_ping(server: &Server) -> bool {
    let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{}/", server.port())) else {
        return false;
    };
    let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_secs(2)) else {
        return false;
    };
    redis::cmd("PING")
        .query::<String>(&mut conn)
        .is_ok_and(|p| p == "PONG")
}

/// One line of RESP from a raw socket (without the CRLF).
fn read_resp_line(reader: &mut BufReader<TcpStream>) -> String {
    let mut line = String::new();
    reader.read_line(&mut line).expect("read reply");
    assert!(line.ends_with("\r\n"), "truncated reply {line:?}");
    line.truncate(line.len() - 2);
    line
}

// --- Bad-input matrix ------------------------------------------------------------

const HELD: &str = "abuse:held";
const FREE: &str = "abuse:free";
const STRING: &str = "abuse:string";
const LIST: &str = "abuse:list";
const HASH: &str = "abuse:hash";

const NOT_POSITIVE: &str = "ERR ttl-ms must be a positive integer";
const TOO_LARGE: &str = "ERR ttl-ms is too large";
const OWNER_EMPTY: &str = "ERR owner must not be empty";
const OWNER_TOO_LONG: &str = "ERR owner is longer than lock.max-owner-bytes (1024)";
const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
const TOKEN_INVALID: &str = "ERR token must be a positive integer";
const BLOCK_INVALID: &str = "ERR BLOCK timeout-ms must be a non-negative integer";
const BLOCK_TOO_LARGE: &str = "ERR BLOCK timeout-ms is too large";
const BLOCK_NEEDS: &str = "ERR syntax error: BLOCK needs a timeout in milliseconds";
const BLOCK_TWICE: &str = "ERR syntax error: BLOCK given more than once";

/// Not integers at all, or not in the strict form (`+`, spaces, decimals, hex, exponent).
const MALFORMED: &[&str] = &[
    "abc", "1.5", "", "+5", " 5", "5 ", "0x10", "1e3", "-", "--1", "5\0", "\u{FF15}",
];
/// Zero, negative, and below `i64::MIN`.
const NOT_POSITIVE_NUMBERS: &[&str] = &[
    "0",
    "-0",
    "-1",
    "-9223372036854775808",
    "-9223372036854775809",
    "-99999999999999999999",
];
/// Positive, but beyond `i64` or beyond the deadline cap.
const HUGE: &[&str] = &[
    "9223372036854775808",
    "99999999999999999999",
    "9223372036854775807",
    "4611686018427387904",
    "4611686018427387903",
];

fn oversized_owner() -> Vec<u8> {
    vec![b'x'; 1025]
}

fn binary_oversized_owner() -> Vec<u8> {
    (0..1025u32).map(|i| (i % 256) as u8).collect()
}

/// A server with: `HELD` locked by `alice` with one client blocked on it, `FREE` absent, and
/// a string, a list and a hash.
struct Fixture {
    server: Server,
    c: Connection,
    token: i64,
    /// The blocked waiter (`bob`, `BLOCK 0`); kept open so the queue stays non-empty.
    _waiter: TcpStream,
}

impl Fixture {
    fn new() -> Fixture {
        let server = Server::start();
        let mut c = server.conn();
        let token = must_acquire(&mut c, HELD, "alice", LONG_TTL);
        let _: () = redis::cmd("SET")
            .arg(STRING)
            .arg("v")
            .query(&mut c)
            .unwrap();
        let _: i64 = redis::cmd("RPUSH")
            .arg(LIST)
            .arg("a")
            .arg("b")
            .query(&mut c)
            .unwrap();
        let _: i64 = redis::cmd("HSET")
            .arg(HASH)
            .arg("f")
            .arg("v")
            .query(&mut c)
            .unwrap();
        let mut waiter = TcpStream::connect(("127.0.0.1", server.port())).expect("connect");
        let mut cmd = redis::cmd("LOCK.ACQUIRE");
        cmd.arg(HELD).arg("bob").arg(1000).arg("BLOCK").arg(0);
        waiter.write_all(&cmd.get_packed_command()).unwrap();
        wait_until("the waiter to block", PATIENCE, || {
            lock_stat(&mut c, "waiters") == 1
        });
        Fixture {
            server,
            c,
            token,
            _waiter: waiter,
        }
    }

    /// Everything an erroneous command could have changed.
    fn snapshot(&mut self) -> Snapshot {
        let c = &mut self.c;
        let info_lock: String = redis::cmd("INFO").arg("lock").query(c).unwrap();
        let types = [HELD, FREE, STRING, LIST, HASH].map(|k| key_type(c, k));
        let pttls = [STRING, LIST, HASH].map(|k| pttl(c, k));
        Snapshot {
            dbsize: dbsize(c),
            types,
            pttls,
            fence: fence(c, HELD),
            info: lock_info(c, HELD).map(|(owner, token, _ttl, waiters)| (owner, token, waiters)),
            string: redis::cmd("GET").arg(STRING).query(c).unwrap(),
            list: redis::cmd("LRANGE")
                .arg(LIST)
                .arg(0)
                .arg(-1)
                .query(c)
                .unwrap(),
            hash: redis::cmd("HGETALL").arg(HASH).query(c).unwrap(),
            info_lock: info_lock
                .lines()
                .filter(|l| l.starts_with("lock_"))
                .map(str::to_string)
                .collect(),
            blocked_clients: info_int(c, "clients", "blocked_clients"),
        }
    }

    /// Send `cmd args`; it must answer exactly `expected` (code and message) and change
    /// nothing; the server must still answer `PING`.
    #[track_caller]
    fn refuses(&mut self, cmd: &str, args: Vec<Vec<u8>>, expected: &str) {
        let before = self.snapshot();
        let pttl_before = pttl(&mut self.c, HELD);
        let reply = call(&mut self.c, cmd, &args);
        let shown: Vec<String> = args
            .iter()
            .map(|a| {
                if a.len() > 24 {
                    format!("<{} bytes>", a.len())
                } else {
                    a.escape_ascii().to_string()
                }
            })
            .collect();
        let context = format!("{cmd} {shown:?}");
        let (code, detail) = expected.split_once(' ').unwrap_or((expected, ""));
        match &reply {
            Err(e) => assert_eq!(
                (e.code(), e.detail().unwrap_or("")),
                (Some(code), detail),
                "{context}: wrong error"
            ),
            Ok(v) => panic!("{context}: expected {expected:?}, got {v:?}"),
        }
        let after = self.snapshot();
        assert_eq!(before, after, "{context}: state changed after an error");
        let pttl_after = pttl(&mut self.c, HELD);
        assert!(
            pttl_after > 0 && pttl_after <= pttl_before,
            "{context}: PTTL {HELD} went from {pttl_before} to {pttl_after}"
        );
        let pong: String = redis::cmd("PING").query(&mut self.c).expect("PING");
        assert_eq!(pong, "PONG", "{context}: no PONG");
    }

    fn finish(self) {
        let mut c = self.c;
        assert_eq!(fence(&mut c, HELD), Some(self.token), "the hold survived");
        assert_clean_log(&self.server);
    }
}

#[derive(Debug, PartialEq)]
struct Snapshot {
    dbsize: i64,
    types: [String; 5],
    pttls: [i64; 3],
    fence: Option<i64>,
    info: Option<(Vec<u8>, i64, i64)>,
    string: Option<Vec<u8>>,
    list: Vec<Vec<u8>>,
    hash: Vec<Vec<u8>>,
    /// Every `lock_*` line of `INFO lock` (counters, high-water mark, histograms).
    info_lock: Vec<String>,
    blocked_clients: i64,
}

/// Arguments from a mix of string and byte slices.
macro_rules! args {
    ($($a:expr),* $(,)?) => { vec![$(AsRef::<[u8]>::as_ref(&$a).to_vec()),*] };
}

fn arity(cmd: &str) -> String {
    format!(
        "ERR wrong number of arguments for '{}' command",
        cmd.to_lowercase()
    )
}

#[test]
fn acquire_bad_input_is_refused_and_changes_nothing() {
    let mut fx = Fixture::new();
    let acq = "LOCK.ACQUIRE";
    let arity = arity(acq);

    fx.refuses(acq, args![], &arity);
    fx.refuses(acq, args![HELD], &arity);
    fx.refuses(acq, args![HELD, "alice"], &arity);
    fx.refuses(acq, args![FREE, "carol"], &arity);

    for key in [HELD, FREE] {
        // alice holds HELD: a retry would move its deadline; carol would be refused or granted.
        for owner in ["alice", "carol"] {
            for ttl in MALFORMED.iter().chain(NOT_POSITIVE_NUMBERS) {
                fx.refuses(acq, args![key, owner, ttl], NOT_POSITIVE);
                fx.refuses(acq, args![key, owner, ttl, "BLOCK", "10"], NOT_POSITIVE);
            }
            for ttl in HUGE {
                fx.refuses(acq, args![key, owner, ttl], TOO_LARGE);
                fx.refuses(acq, args![key, owner, ttl, "block", "0"], TOO_LARGE);
            }
        }
        fx.refuses(acq, args![key, "", "1000"], OWNER_EMPTY);
        fx.refuses(acq, args![key, "", "1000", "BLOCK", "10"], OWNER_EMPTY);
        fx.refuses(acq, args![key, oversized_owner(), "1000"], OWNER_TOO_LONG);
        fx.refuses(
            acq,
            args![key, binary_oversized_owner(), "1000"],
            OWNER_TOO_LONG,
        );
    }

    // Options, on the held key with another owner (a wrongly accepted BLOCK would wait) and
    // with the holder (a wrongly accepted retry would move the deadline).
    for owner in ["carol", "alice"] {
        let options: &[(&[&str], &str)] = &[
            (&["FOO"], "ERR syntax error: unexpected argument 'FOO'"),
            (&["NX"], "ERR syntax error: unexpected argument 'NX'"),
            (
                &["BLOCKS", "1"],
                "ERR syntax error: unexpected argument 'BLOCKS'",
            ),
            (
                &["BLOCK", "10", "10"],
                "ERR syntax error: unexpected argument '10'",
            ),
            (
                &["BLOCK", "10", "FOO"],
                "ERR syntax error: unexpected argument 'FOO'",
            ),
            (&["BLOCK"], BLOCK_NEEDS),
            (&["block"], BLOCK_NEEDS),
            (&["bLoCk"], BLOCK_NEEDS),
            (&["BLOCK", "1", "BLOCK", "2"], BLOCK_TWICE),
            (&["block", "1", "Block", "2"], BLOCK_TWICE),
            (&["BLOCK", "1", "block"], BLOCK_TWICE),
            (&["BLOCK", "-1"], BLOCK_INVALID),
            (&["block", "-1"], BLOCK_INVALID),
            (&["BLOCK", "x"], BLOCK_INVALID),
            (&["BLOCK", ""], BLOCK_INVALID),
            (&["BLOCK", "1.5"], BLOCK_INVALID),
            (&["BLOCK", "+1"], BLOCK_INVALID),
            (&["BLOCK", "-9223372036854775809"], BLOCK_INVALID),
            (&["BLOCK", "100000000001"], BLOCK_TOO_LARGE),
            (&["Block", "9223372036854775807"], BLOCK_TOO_LARGE),
            (&["BLOCK", "9223372036854775808"], BLOCK_TOO_LARGE),
            (&["BLOCK", "99999999999999999999"], BLOCK_TOO_LARGE),
        ];
        for (opts, want) in options {
            let mut a = args![HELD, owner, "1000"];
            a.extend(opts.iter().map(|o| o.as_bytes().to_vec()));
            fx.refuses(acq, a, want);
        }
    }

    for key in [STRING, LIST, HASH] {
        fx.refuses(acq, args![key, "alice", "1000"], WRONGTYPE);
        fx.refuses(acq, args![key, "alice", "1000", "BLOCK", "10"], WRONGTYPE);
        fx.refuses(acq, args![key, "alice", "1000", "block", "0"], WRONGTYPE);
    }
    fx.finish();
}

#[test]
fn release_bad_input_is_refused_and_changes_nothing() {
    let mut fx = Fixture::new();
    let rel = "LOCK.RELEASE";
    let arity = arity(rel);
    fx.refuses(rel, args![], &arity);
    fx.refuses(rel, args![HELD], &arity);
    fx.refuses(rel, args![HELD, "alice", "x"], &arity);
    fx.refuses(rel, args![HELD, "alice", "BLOCK", "1"], &arity);
    for key in [HELD, FREE] {
        fx.refuses(rel, args![key, ""], OWNER_EMPTY);
        fx.refuses(rel, args![key, oversized_owner()], OWNER_TOO_LONG);
        fx.refuses(rel, args![key, binary_oversized_owner()], OWNER_TOO_LONG);
    }
    for key in [STRING, LIST, HASH] {
        fx.refuses(rel, args![key, "alice"], WRONGTYPE);
        fx.refuses(rel, args![key, b"\x00\xff"], WRONGTYPE);
    }
    fx.finish();
}

#[test]
fn extend_bad_input_is_refused_and_changes_nothing() {
    let mut fx = Fixture::new();
    let ext = "LOCK.EXTEND";
    let arity = arity(ext);
    fx.refuses(ext, args![], &arity);
    fx.refuses(ext, args![HELD], &arity);
    fx.refuses(ext, args![HELD, "alice"], &arity);
    fx.refuses(ext, args![HELD, "alice", "1000", "x"], &arity);
    fx.refuses(ext, args![HELD, "alice", "1000", "BLOCK", "1"], &arity);
    for key in [HELD, FREE] {
        // alice holds HELD: an accepted bad ttl would move its deadline.
        for ttl in MALFORMED.iter().chain(NOT_POSITIVE_NUMBERS) {
            fx.refuses(ext, args![key, "alice", ttl], NOT_POSITIVE);
        }
        for ttl in HUGE {
            fx.refuses(ext, args![key, "alice", ttl], TOO_LARGE);
        }
        fx.refuses(ext, args![key, "", "1000"], OWNER_EMPTY);
        fx.refuses(ext, args![key, oversized_owner(), "1000"], OWNER_TOO_LONG);
        fx.refuses(
            ext,
            args![key, binary_oversized_owner(), "1000"],
            OWNER_TOO_LONG,
        );
    }
    for key in [STRING, LIST, HASH] {
        fx.refuses(ext, args![key, "alice", "1000"], WRONGTYPE);
    }
    fx.finish();
}

#[test]
fn fence_bad_input_is_refused_and_changes_nothing() {
    let mut fx = Fixture::new();
    let fen = "LOCK.FENCE";
    let arity = arity(fen);
    let token = fx.token.to_string();
    fx.refuses(fen, args![], &arity);
    fx.refuses(fen, args![HELD, token, "1"], &arity);
    fx.refuses(fen, args![HELD, "1", "2", "3"], &arity);
    for key in [HELD, FREE] {
        for bad in MALFORMED
            .iter()
            .chain(NOT_POSITIVE_NUMBERS)
            .chain(["9223372036854775808", "99999999999999999999"].iter())
        {
            fx.refuses(fen, args![key, bad], TOKEN_INVALID);
        }
        // The live token with junk around it is not the live token.
        fx.refuses(fen, args![key, format!("{token} ")], TOKEN_INVALID);
        fx.refuses(fen, args![key, format!("+{token}")], TOKEN_INVALID);
    }
    for key in [STRING, LIST, HASH] {
        fx.refuses(fen, args![key], WRONGTYPE);
        fx.refuses(fen, args![key, "1"], WRONGTYPE);
    }
    fx.finish();
}

#[test]
fn info_bad_input_is_refused_and_changes_nothing() {
    let mut fx = Fixture::new();
    let inf = "LOCK.INFO";
    let arity = arity(inf);
    fx.refuses(inf, args![], &arity);
    fx.refuses(inf, args![HELD, "x"], &arity);
    fx.refuses(inf, args![HELD, HELD], &arity);
    for key in [STRING, LIST, HASH] {
        fx.refuses(inf, args![key], WRONGTYPE);
    }
    fx.finish();
}

#[test]
fn load_from_a_client_is_refused_and_changes_nothing() {
    // LOCK.LOAD would let anyone forge a hold with any token and deadline.
    let mut fx = Fixture::new();
    let internal =
        "ERR LOCK.LOAD is internal: only the replication link and AOF loading may call it";
    let far = (unix_ms() + LONG_TTL * 10).to_string();
    for key in [HELD, FREE, STRING] {
        fx.refuses(
            "LOCK.LOAD",
            args![key, "mallory", "9000000000000000000", far],
            internal,
        );
        fx.refuses("LOCK.LOAD", args![key, "mallory", "1", "0"], internal);
    }
    fx.refuses("LOCK.LOAD", args![HELD], &arity("LOCK.LOAD"));
    fx.finish();
}

#[test]
fn owner_limits_follow_config_and_binary_owners_round_trip() {
    let mut fx = Fixture::new();
    // Binary owners are accepted and kept byte for byte.
    let binary: &[u8] = b"\x00\xff\r\n\x1b[0m \"'";
    let token = must_acquire(&mut fx.c, FREE, binary, LONG_TTL);
    assert_eq!(
        lock_info(&mut fx.c, FREE).map(|i| (i.0, i.1)),
        Some((binary.to_vec(), token))
    );
    assert_eq!(
        release(&mut fx.c, FREE, b"\x00\xff\r\n\x1b[0m \"".as_slice()),
        0
    );
    assert_eq!(release(&mut fx.c, FREE, binary), 1);
    // Exactly max-owner-bytes is accepted, one more is refused.
    let at_cap = vec![0xffu8; 1024];
    must_acquire(&mut fx.c, FREE, at_cap.as_slice(), LONG_TTL);
    assert_eq!(release(&mut fx.c, FREE, at_cap.as_slice()), 1);

    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("lock.max-owner-bytes")
        .arg(8)
        .query(&mut fx.c)
        .unwrap();
    let short = "ERR owner is longer than lock.max-owner-bytes (8)";
    for (cmd, args) in [
        ("LOCK.ACQUIRE", args![FREE, "123456789", "1000"]),
        (
            "LOCK.ACQUIRE",
            args![HELD, "123456789", "1000", "BLOCK", "0"],
        ),
        ("LOCK.RELEASE", args![HELD, "123456789"]),
        ("LOCK.EXTEND", args![HELD, "123456789", "1000"]),
        (
            "LOCK.ACQUIRE",
            args![FREE, b"\xff\xff\xff\xff\xff\xff\xff\xff\x00", "1000"],
        ),
    ] {
        fx.refuses(cmd, args, short);
    }
    // The current holder's owner (alice, 5 bytes) still works under the lower cap.
    assert_eq!(extend(&mut fx.c, HELD, "alice", LONG_TTL), 1);
    fx.finish();
}

#[test]
fn non_ascii_unknown_option_is_refused_without_crashing_the_server() {
    // The unknown option is echoed in the error message. A character whose code point is a
    // multiple of 256 (U+4E00 `一`, U+0100 `Ā`, U+0400 `Ѐ`) must not take the server down,
    // and the message must reach the client intact (other non-ASCII, like `é`). Each option
    // gets a server of its own, so that one crash does not hide what the others do.
    let mut failures = Vec::new();
    for option in ["\u{e9}", "\u{4E00}", "\u{100}", "\u{400}"] {
        let server = Server::start();
        let mut c = server.conn();
        let pid = info_field(&mut c, "server", "process_id").unwrap();
        let token = must_acquire(&mut c, HELD, "alice", LONG_TTL);
        let reply = call(&mut c, "LOCK.ACQUIRE", &[HELD, "alice", "1000", option]);
        // The argument may come back verbatim or escaped; the reply must parse, though.
        let want = "syntax error: unexpected argument '";
        let ok = matches!(&reply, Err(e) if e.code() == Some("ERR")
            && e.detail().is_some_and(|d| d.starts_with(want)));
        let alive = answers_ping(&server);
        if ok && alive {
            assert_alive(&server, &pid);
            assert_eq!(fence(&mut c, HELD), Some(token));
            assert_clean_log(&server);
            continue;
        }
        let log = server.log();
        let excerpt: Vec<&str> = log
            .lines()
            .filter(|l| {
                l.contains("crashed by signal")
                    || l.contains("unwrap")
                    || l.contains("str_as_legal_resp_string")
                    || l.contains("argv[4]")
            })
            .take(6)
            .collect();
        failures.push(format!(
            "LOCK.ACQUIRE {HELD} alice 1000 {option:?} ({}): expected `ERR {want}...'`, got \
             {reply:?}; server {}; log: {excerpt:#?}",
            option.escape_unicode(),
            if alive { "alive" } else { "DEAD" }
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn lowercase_and_mixed_case_block_work_like_block() {
    let server = Server::start();
    let mut c = server.conn();
    let token = must_acquire(&mut c, HELD, "alice", LONG_TTL);
    for spelling in ["block", "Block", "bLoCk"] {
        let started = Instant::now();
        let reply = call(
            &mut c,
            "LOCK.ACQUIRE",
            &[HELD, "bob", "1000", spelling, "30"],
        );
        assert!(matches!(reply, Ok(Value::Nil)), "{spelling}: {reply:?}");
        assert!(
            started.elapsed() >= Duration::from_millis(25),
            "{spelling} 30 answered after {:?}: it did not wait",
            started.elapsed()
        );
    }
    assert_eq!(lock_stat(&mut c, "timed_out"), 3);
    assert_eq!(fence(&mut c, HELD), Some(token));
    assert_eq!(lock_stat(&mut c, "waiters"), 0);
}

// --- Random command sequences ------------------------------------------------------

const RANDOM_KEYS: &[&str] = &["rnd:0", "rnd:1", "rnd:2"];
/// Owners the main connection acquires with; blocked waiters use `w0`..`w3`, so every token a
/// main-connection acquire returns is either new or one this test has already seen.
const MAIN_OWNERS: &[&[u8]] = &[b"o0", b"o1", b"o2", b"o\x00\xff"];
const WAITER_OWNERS: &[&[u8]] = &[b"w0", b"w1", b"w2", b"w3"];
const TTLS: &[i64] = &[1, 1, 2, 5, 20, 100, 1_000, 60_000];

/// Prints the seed and the last commands if the test panics, so the run can be replayed.
struct SeedNote {
    seed: u64,
    recent: std::collections::VecDeque<String>,
}

impl SeedNote {
    fn record(&mut self, line: String) {
        if self.recent.len() == 40 {
            self.recent.pop_front();
        }
        self.recent.push_back(line);
    }
}

impl Drop for SeedNote {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "random_command_sequences: failed with ABUSE_SEED={0}; replay with \
                 ABUSE_SEED={0} cargo test --test abuse random_command_sequences\n\
                 last commands:\n  {1}",
                self.seed,
                Vec::from(self.recent.clone()).join("\n  ")
            );
        }
    }
}

/// A connection that may have a blocked `LOCK.ACQUIRE` in flight.
struct Side {
    conn: Connection,
    /// A command was sent and its reply not read yet.
    busy: bool,
    /// The last command sent, for failure messages.
    sent: String,
    /// The owner this connection acquires as.
    owner: &'static [u8],
}

impl Side {
    fn new(server: &Server, owner: &'static [u8]) -> Side {
        let conn = server.conn();
        conn.set_read_timeout(Some(SIDE_REPLY_TIMEOUT)).unwrap();
        Side {
            conn,
            busy: false,
            sent: String::new(),
            owner,
        }
    }
}

/// Atomically read every random key: `TYPE`, `LOCK.FENCE`, `LOCK.INFO`, errors turned into
/// strings so that one reply carries all of them.
const PROBE: &str = r#"
local out = {}
for i, k in ipairs(KEYS) do
  local t = redis.call('TYPE', k)['ok']
  local f = redis.pcall('LOCK.FENCE', k)
  if type(f) == 'table' and f['err'] then f = 'error:' .. f['err'] end
  local info = redis.pcall('LOCK.INFO', k)
  if type(info) == 'table' and info['err'] then info = 'error:' .. info['err'] end
  out[i] = {t, f, info}
end
return out
"#;

/// Check that `LOCK.FENCE` and `LOCK.INFO` agree for every random key, read atomically.
#[track_caller]
fn check_consistent(c: &mut Connection, step: usize, what: &str) {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(PROBE).arg(RANDOM_KEYS.len());
    for k in RANDOM_KEYS {
        cmd.arg(*k);
    }
    let reply: Value = cmd
        .query(c)
        .unwrap_or_else(|e| panic!("step {step} ({what}): probe: {e}"));
    let Value::Array(keys) = reply else {
        panic!("probe: {reply:?}")
    };
    for (k, entry) in RANDOM_KEYS.iter().zip(keys) {
        let Value::Array(parts) = entry else {
            panic!("probe entry {entry:?}")
        };
        let ty = match &parts[0] {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            Value::SimpleString(s) => s.clone(),
            other => panic!("TYPE {other:?}"),
        };
        let ctx = format!("step {step} ({what}), key {k} of type {ty}: {parts:?}");
        let is_wrongtype =
            |v: &Value| matches!(v, Value::BulkString(b) if b.starts_with(b"error:WRONGTYPE"));
        match ty.as_str() {
            "redislock" => {
                let fence = match &parts[1] {
                    Value::Int(t) => Some(*t),
                    Value::Nil => None,
                    _ => panic!("{ctx}: FENCE"),
                };
                let info = parse_lock_info(&parts[2]);
                match (fence, &info) {
                    (Some(t), Some((owner, t2, ttl, waiters))) => {
                        assert_eq!(t, *t2, "{ctx}: FENCE and INFO disagree");
                        assert!(*ttl >= 0 && *waiters >= 0, "{ctx}");
                        assert!(
                            MAIN_OWNERS.contains(&owner.as_slice())
                                || WAITER_OWNERS.contains(&owner.as_slice()),
                            "{ctx}: unknown owner"
                        );
                    }
                    // The deadline may pass between the two reads.
                    (Some(_), None) | (None, None) => {}
                    (None, Some(_)) => panic!("{ctx}: FENCE nil but INFO shows a holder"),
                }
            }
            "none" => assert!(
                matches!(parts.get(1), None | Some(Value::Nil))
                    && matches!(parts.get(2), None | Some(Value::Nil)),
                "{ctx}: a missing key has a holder"
            ),
            _ => assert!(
                is_wrongtype(&parts[1]) && is_wrongtype(&parts[2]),
                "{ctx}: expected WRONGTYPE from FENCE and INFO"
            ),
        }
    }
}

/// Tokens seen so far and whom they were granted to. A token only ever belongs to one owner.
/// A token from a main-connection acquire is a retry (seen before, same owner) or a new grant
/// (above every token seen). A waiter's token may arrive after later grants were seen, so it
/// is only checked for its owner.
#[derive(Default)]
struct Tokens {
    seen: HashMap<i64, Vec<u8>>,
    max: i64,
}

impl Tokens {
    fn granted(&mut self, t: i64, owner: &[u8], ctx: &str) {
        assert!(
            t > self.max || self.seen.contains_key(&t),
            "{ctx}: token {t} is neither new (max so far {}) nor a retry",
            self.max
        );
        self.record(t, owner, ctx);
    }

    fn record(&mut self, t: i64, owner: &[u8], ctx: &str) {
        assert!(t > 0, "{ctx}: token {t}");
        let first = self.seen.entry(t).or_insert_with(|| owner.to_vec());
        assert_eq!(
            first.escape_ascii().to_string(),
            owner.escape_ascii().to_string(),
            "{ctx}: token {t} granted to two owners"
        );
        self.max = self.max.max(t);
    }
}

#[track_caller]
fn expect_int_nil_or_wrongtype(reply: &RedisResult<Value>, ctx: &str) {
    match reply {
        Ok(Value::Int(_)) | Ok(Value::Nil) => {}
        Err(e) if e.code() == Some("WRONGTYPE") => {}
        other => panic!("{ctx}: unexpected reply {other:?}"),
    }
}

#[track_caller]
fn expect_bool_or_wrongtype(reply: &RedisResult<Value>, ctx: &str) {
    match reply {
        Ok(Value::Int(0 | 1)) => {}
        Err(e) if e.code() == Some("WRONGTYPE") => {}
        other => panic!("{ctx}: unexpected reply {other:?}"),
    }
}

/// How long a side connection waits for its blocked acquire to answer. Its `BLOCK` timeout
/// is at most 50 ms (Redis 7.0 may notice it up to one `serverCron` tick, 100 ms, late), so
/// anything near this is a waiter that will never be answered.
const SIDE_REPLY_TIMEOUT: Duration = Duration::from_secs(2);

/// Collect the reply of a side connection's blocked acquire: a token, nil (timeout), or
/// `WRONGTYPE` (the key was overwritten while it waited). A waiter that is never answered is
/// recorded in `hangs` (with the server's view of it) and its connection replaced, so that
/// the run goes on and reports every such case at the end.
fn collect(
    server: &Server,
    side: &mut Side,
    tokens: &mut Tokens,
    hangs: &mut Vec<String>,
    ctx: &str,
) {
    if !side.busy {
        return;
    }
    side.busy = false;
    match side.conn.recv_response().and_then(Value::extract_error) {
        Ok(Value::Int(t)) => tokens.record(t, side.owner, ctx),
        Ok(Value::Nil) => {}
        Err(e) if e.code() == Some("WRONGTYPE") => {}
        Err(e) if e.is_timeout() => {
            hangs.push(format!(
                "{ctx}: `{}` got no reply within {SIDE_REPLY_TIMEOUT:?}\n{}",
                side.sent,
                diagnose(server)
            ));
            *side = Side::new(server, side.owner);
        }
        other => panic!(
            "{ctx}: blocked acquire answered {other:?}\n{}",
            diagnose(server)
        ),
    }
}

/// What the server says about its clients and the random keys, for a failure message.
fn diagnose(server: &Server) -> String {
    let mut c = server.conn();
    let mut out = String::new();
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut c)
        .unwrap_or_default();
    out.push_str(&format!("CLIENT LIST at {}:\n{clients}", unix_ms()));
    let info: String = redis::cmd("INFO")
        .arg("lock")
        .query(&mut c)
        .unwrap_or_default();
    out.push_str(&info);
    for db in [0, 1] {
        let _: RedisResult<()> = redis::cmd("SELECT").arg(db).query(&mut c);
        for k in RANDOM_KEYS {
            let ty = key_type(&mut c, k);
            let ttl = pttl(&mut c, k);
            let info = call(&mut c, "LOCK.INFO", &[*k]);
            out.push_str(&format!(
                "\ndb{db} {k}: TYPE {ty} PTTL {ttl} LOCK.INFO {info:?}"
            ));
        }
    }
    out
}

#[test]
fn random_command_sequences_never_crash_and_stay_consistent() {
    let seed: u64 = std::env::var("ABUSE_SEED")
        .ok()
        .map(|s| s.parse().expect("ABUSE_SEED is not a u64"))
        .unwrap_or_else(rand::random);
    let ops = env_usize("ABUSE_OPS", 5000);
    let mut note = SeedNote {
        seed,
        recent: Default::default(),
    };
    eprintln!("random_command_sequences: ABUSE_SEED={seed} ABUSE_OPS={ops}");
    let mut rng = StdRng::seed_from_u64(seed);

    let server = Server::start();
    let mut c = server.conn();
    let pid = info_field(&mut c, "server", "process_id").unwrap();
    let mut sides: Vec<Side> = WAITER_OWNERS
        .iter()
        .map(|owner| Side::new(&server, owner))
        .collect();
    let mut hangs: Vec<String> = Vec::new();
    let mut tokens = Tokens::default();
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();

    for step in 0..ops {
        let key = RANDOM_KEYS[rng.gen_range(0..RANDOM_KEYS.len())];
        let other = RANDOM_KEYS[rng.gen_range(0..RANDOM_KEYS.len())];
        let owner = MAIN_OWNERS[rng.gen_range(0..MAIN_OWNERS.len())];
        let any_owner = if rng.gen_bool(0.5) {
            owner
        } else {
            WAITER_OWNERS[rng.gen_range(0..WAITER_OWNERS.len())]
        };
        let ttl = TTLS[rng.gen_range(0..TTLS.len())];
        let roll = rng.gen_range(0..1000);
        let what: &str;
        let ctx = |what: &str| format!("step {step}: {what} {key}");
        match roll {
            0..=279 => {
                what = "LOCK.ACQUIRE";
                let reply = call(
                    &mut c,
                    what,
                    &[key.as_bytes(), owner, ttl.to_string().as_bytes()],
                );
                expect_int_nil_or_wrongtype(&reply, &ctx(what));
                if let Ok(Value::Int(t)) = reply {
                    tokens.granted(t, owner, &ctx(what));
                }
            }
            280..=399 => {
                what = "LOCK.RELEASE";
                let reply = call(&mut c, what, &[key.as_bytes(), any_owner]);
                expect_bool_or_wrongtype(&reply, &ctx(what));
            }
            400..=479 => {
                what = "LOCK.EXTEND";
                let reply = call(
                    &mut c,
                    what,
                    &[key.as_bytes(), any_owner, ttl.to_string().as_bytes()],
                );
                expect_bool_or_wrongtype(&reply, &ctx(what));
            }
            480..=529 => {
                what = "LOCK.FENCE";
                if rng.gen_bool(0.5) || tokens.seen.is_empty() {
                    let r = call(&mut c, what, &[key]);
                    expect_int_nil_or_wrongtype(&r, &ctx(what));
                } else {
                    let i = rng.gen_range(0..tokens.seen.len());
                    let t = *tokens.seen.keys().nth(i).unwrap();
                    let r = call(&mut c, what, &[key.to_string(), t.to_string()]);
                    expect_bool_or_wrongtype(&r, &ctx(what));
                }
            }
            530..=559 => {
                what = "LOCK.INFO";
                match call(&mut c, what, &[key]) {
                    Ok(v) => {
                        parse_lock_info(&v);
                    }
                    Err(e) if e.code() == Some("WRONGTYPE") => {}
                    Err(e) => panic!("{}: {e}", ctx(what)),
                }
            }
            560..=669 => {
                // A blocked acquire on a side connection, with a small timeout.
                what = "LOCK.ACQUIRE BLOCK";
                let i = rng.gen_range(0..sides.len());
                note.record(format!("{step}: collect side {i} (busy {})", sides[i].busy));
                collect(
                    &server,
                    &mut sides[i],
                    &mut tokens,
                    &mut hangs,
                    &ctx("collect"),
                );
                let timeout = rng.gen_range(1..=50).to_string();
                let ttl = rng.gen_range(1..=200).to_string();
                let mut cmd = redis::cmd("LOCK.ACQUIRE");
                cmd.arg(key)
                    .arg(WAITER_OWNERS[i])
                    .arg(&ttl)
                    .arg("BLOCK")
                    .arg(&timeout);
                sides[i]
                    .conn
                    .send_packed_command(&cmd.get_packed_command())
                    .expect("send blocked acquire");
                sides[i].busy = true;
                sides[i].sent = format!(
                    "LOCK.ACQUIRE {key} {} {ttl} BLOCK {timeout}",
                    String::from_utf8_lossy(WAITER_OWNERS[i])
                );
                note.record(format!("{step} @{}: side {i} {}", unix_ms(), sides[i].sent));
            }
            670..=709 => {
                what = "collect";
                let i = rng.gen_range(0..sides.len());
                note.record(format!("{step}: collect side {i} (busy {})", sides[i].busy));
                collect(&server, &mut sides[i], &mut tokens, &mut hangs, &ctx(what));
            }
            710..=719 => {
                // A waiter that goes away while blocked.
                what = "disconnect waiter";
                let i = rng.gen_range(0..sides.len());
                sides[i] = Side::new(&server, WAITER_OWNERS[i]);
            }
            720..=759 => {
                what = if rng.gen_bool(0.5) { "DEL" } else { "UNLINK" };
                let _: i64 = redis::cmd(what).arg(key).query(&mut c).unwrap();
            }
            760..=784 => {
                what = if rng.gen_bool(0.7) {
                    "RENAME"
                } else {
                    "RENAMENX"
                };
                match call(&mut c, what, &[key, other]) {
                    Ok(_) => {}
                    Err(e) if e.detail() == Some("no such key") => {}
                    Err(e) => panic!("{}: {e}", ctx(what)),
                }
            }
            785..=804 => {
                what = "SET";
                let mut cmd = redis::cmd(what);
                cmd.arg(key).arg("plain");
                if rng.gen_bool(0.5) {
                    cmd.arg("PX").arg(ttl);
                }
                let _: Value = cmd.query(&mut c).unwrap();
            }
            805..=814 => {
                what = "LPUSH/HSET";
                let _: Value = if rng.gen_bool(0.5) {
                    call(&mut c, "LPUSH", &[key, "x"])
                } else {
                    call(&mut c, "HSET", &[key, "f", "v"])
                }
                .or_else(|e| {
                    assert_eq!(e.code(), Some("WRONGTYPE"), "{}: {e}", ctx(what));
                    Ok::<Value, redis::RedisError>(Value::Nil)
                })
                .unwrap();
            }
            815..=854 => {
                what = match rng.gen_range(0..4) {
                    0 => "PEXPIRE",
                    1 => "EXPIRE",
                    2 => "PERSIST",
                    _ => "PEXPIRE",
                };
                let reply = match what {
                    "PEXPIRE" => call(
                        &mut c,
                        what,
                        &[key.to_string(), rng.gen_range(0..50).to_string()],
                    ),
                    "EXPIRE" => call(&mut c, what, &[key, "1"]),
                    _ => call(&mut c, what, &[key]),
                };
                expect_bool_or_wrongtype(&reply, &ctx(what));
            }
            855..=869 => {
                what = "COPY/MOVE";
                let reply = if rng.gen_bool(0.5) {
                    call(&mut c, "COPY", &[key, other, "REPLACE"])
                } else {
                    call(&mut c, "MOVE", &[key, "1"])
                };
                match reply {
                    Ok(Value::Int(_)) => {}
                    // COPY of a lock is refused on purpose.
                    Err(e) if e.code() == Some("ERR") => {}
                    other => panic!("{}: {other:?}", ctx(what)),
                }
            }
            870..=899 => {
                // Inside MULTI and Lua a BLOCK never blocks.
                what = "MULTI/EVAL BLOCK";
                let ttl = ttl.to_string();
                let args = [key.as_bytes(), owner, ttl.as_bytes(), b"BLOCK", b"0"];
                let in_lua = rng.gen_bool(0.5);
                let reply: RedisResult<Value> = if in_lua {
                    let mut cmd = redis::cmd("EVAL");
                    cmd.arg(
                        "return redis.call('LOCK.ACQUIRE', KEYS[1], ARGV[1], ARGV[2], 'BLOCK', '0')",
                    )
                    .arg(1);
                    for a in args.iter().take(3) {
                        cmd.arg(*a);
                    }
                    cmd.query(&mut c)
                } else {
                    let mut pipe = redis::pipe();
                    pipe.atomic().cmd("LOCK.ACQUIRE");
                    for a in args {
                        pipe.arg(a);
                    }
                    pipe.query::<Vec<Value>>(&mut c).map(|mut v| v.remove(0))
                };
                match reply {
                    // Lua numbers are doubles: a token (about 2^61) comes out of a script
                    // rounded to a multiple of 256. Read the exact one outside Lua.
                    Ok(Value::Int(rounded)) if in_lua => {
                        if let Some((holder, t, _, _)) = lock_info(&mut c, key) {
                            if holder == owner {
                                assert!(
                                    (t - rounded).abs() <= 256,
                                    "{}: Lua returned {rounded}, the hold has {t}",
                                    ctx(what)
                                );
                                tokens.record(t, owner, &ctx(what));
                            }
                        }
                    }
                    Ok(Value::Int(t)) => tokens.granted(t, owner, &ctx(what)),
                    Ok(Value::Nil) => {}
                    Err(e)
                        if e.code() == Some("WRONGTYPE") || e.to_string().contains("WRONGTYPE") => {
                    }
                    other => panic!("{}: {other:?}", ctx(what)),
                }
            }
            900..=929 => {
                // Garbage arguments: always an ERR, never an internal error.
                what = "bad input";
                let cmd = [
                    "LOCK.ACQUIRE",
                    "LOCK.RELEASE",
                    "LOCK.EXTEND",
                    "LOCK.FENCE",
                    "LOCK.INFO",
                ][rng.gen_range(0..5)];
                let junk: Vec<Vec<u8>> = (0..rng.gen_range(0..6))
                    .map(|_| {
                        [
                            &b""[..],
                            b"-1",
                            b"0",
                            b"x",
                            b"BLOCK",
                            b"block",
                            b"99999999999999999999",
                            b"\x00\xff",
                            b"FOO",
                        ][rng.gen_range(0..9)]
                        .to_vec()
                    })
                    .collect();
                let mut all = vec![key.as_bytes().to_vec()];
                all.extend(junk);
                match call(&mut c, cmd, &all) {
                    Err(e) => assert!(
                        matches!(e.code(), Some("ERR" | "WRONGTYPE"))
                            && !e.to_string().contains("internal"),
                        "{}: {cmd} {all:?}: {e}",
                        ctx(what)
                    ),
                    // Some junk is valid (e.g. `LOCK.FENCE key` or `LOCK.RELEASE key x`).
                    Ok(v) => {
                        if let (Value::Int(t), "LOCK.ACQUIRE") = (&v, cmd) {
                            tokens.granted(*t, &all[1], &ctx(what));
                        }
                    }
                }
            }
            930..=959 => {
                what = "SWAPDB";
                let _: () = redis::cmd("SWAPDB").arg(0).arg(1).query(&mut c).unwrap();
            }
            960..=974 => {
                what = if rng.gen_bool(0.5) {
                    "FLUSHDB"
                } else {
                    "FLUSHALL"
                };
                let _: () = redis::cmd(what).query(&mut c).unwrap();
            }
            975..=989 => {
                what = "DEBUG RELOAD";
                let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
            }
            _ => {
                what = "sleep 2ms";
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        *counts.entry(what).or_default() += 1;
        note.record(format!(
            "{step} @{}: {what} key={key} other={other} owner={} any_owner={} ttl={ttl}",
            unix_ms(),
            owner.escape_ascii(),
            any_owner.escape_ascii()
        ));
        check_consistent(&mut c, step, what);
        if step % 500 == 0 {
            assert_alive(&server, &pid);
        }
    }

    for (i, side) in sides.iter_mut().enumerate() {
        collect(
            &server,
            side,
            &mut tokens,
            &mut hangs,
            &format!("final collect {i}"),
        );
    }
    assert!(
        hangs.is_empty(),
        "{} blocked LOCK.ACQUIRE never answered; the first:\n{}",
        hangs.len(),
        hangs[0]
    );
    wait_until("no blocked clients", PATIENCE, || {
        lock_stat(&mut c, "waiters") == 0 && info_int(&mut c, "clients", "blocked_clients") == 0
    });
    assert_eq!(lock_stat(&mut c, "waiting_keys"), 0);
    let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    wait_until("lock_locks == 0 after FLUSHALL", PATIENCE, || {
        lock_stat(&mut c, "locks") == 0
    });
    assert_alive(&server, &pid);
    assert_clean_log(&server);
    eprintln!(
        "random_command_sequences: {ops} commands, {} distinct tokens, mix {counts:?}",
        tokens.seen.len()
    );
}

// --- Thousands of waiters ------------------------------------------------------------

#[test]
fn thousands_of_waiters_are_served_in_order_and_their_memory_comes_back() {
    let wanted = env_usize("WAITERS", 2000);
    // Each waiter is one socket here and one client there; leave room for everything else.
    let limit = fd_soft_limit().unwrap_or(1024) as usize;
    let n = wanted.min(limit.saturating_sub(256));
    if n < wanted {
        eprintln!("waiters: the open-file limit is {limit}; using {n} waiters instead of {wanted}");
    }
    assert!(
        n >= 100,
        "open-file limit {limit} leaves room for only {n} waiters"
    );
    let maxclients = (n + 64).to_string();
    let server = Server::start_with(&["--maxclients", &maxclients]);
    let mut c = server.conn();
    let key = "waiters:k";
    let holder_token = must_acquire(&mut c, key, "holder", LONG_TTL);

    let baseline = used_memory(&mut c);
    let mut streams: Vec<TcpStream> = (0..n)
        .map(|_| TcpStream::connect(("127.0.0.1", server.port())).expect("connect waiter"))
        .collect();
    wait_until("every waiter connected", PATIENCE, || {
        info_int(&mut c, "clients", "connected_clients") as usize > n
    });
    let connected = used_memory(&mut c);

    // One at a time, so that arrival order is known: waiter i is queued i-th.
    for (i, stream) in streams.iter_mut().enumerate() {
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let cmd = format!(
            "*6\r\n$12\r\nLOCK.ACQUIRE\r\n${}\r\n{key}\r\n${}\r\nw{i}\r\n$4\r\n1000\r\n$5\r\nBLOCK\r\n$1\r\n0\r\n",
            key.len(),
            format!("w{i}").len()
        );
        stream.write_all(cmd.as_bytes()).expect("send waiter");
        let deadline = Instant::now() + PATIENCE;
        while lock_stat(&mut c, "waiters") < i as i64 + 1 {
            assert!(Instant::now() < deadline, "waiter {i} never blocked");
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    assert_eq!(lock_stat(&mut c, "waiters"), n as i64);
    assert_eq!(lock_stat(&mut c, "waiting_keys"), 1);
    assert_eq!(info_int(&mut c, "clients", "blocked_clients"), n as i64);
    assert_eq!(lock_info(&mut c, key).map(|i| i.3), Some(n as i64));
    let blocked = used_memory(&mut c);

    // Hand the lock down the queue: each release must go to the next waiter in arrival order
    // (the release by w{i} returns 1 only if w{i} was granted), with increasing tokens.
    let handed_before = lock_stat(&mut c, "handed_off");
    assert_eq!(release(&mut c, key, "holder"), 1);
    let mut last = holder_token;
    let mut readers: Vec<BufReader<TcpStream>> = streams.drain(..).map(BufReader::new).collect();
    for (i, reader) in readers.iter_mut().enumerate() {
        let line = read_resp_line(reader);
        let token: i64 = line
            .strip_prefix(':')
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("waiter {i}: expected a token, got {line:?}"));
        assert!(token > last, "waiter {i}: token {token} not above {last}");
        last = token;
        if i % 97 == 0 || i == n - 1 {
            let info = lock_info(&mut c, key).expect("held");
            assert_eq!(
                (info.0, info.1, info.3),
                (format!("w{i}").into_bytes(), token, (n - 1 - i) as i64),
                "sample {i}"
            );
        }
        assert_eq!(
            release(&mut c, key, format!("w{i}")),
            1,
            "w{i} should hold the lock (arrival order)"
        );
    }
    assert_eq!(fence(&mut c, key), None);
    assert_eq!(lock_stat(&mut c, "waiters"), 0);
    assert_eq!(lock_stat(&mut c, "waiting_keys"), 0);
    assert_eq!(lock_stat(&mut c, "handed_off") - handed_before, n as i64);
    let served = used_memory(&mut c);

    drop(readers);
    wait_until("the waiters to disconnect", PATIENCE, || {
        info_int(&mut c, "clients", "connected_clients") == 1
    });
    let disconnected = used_memory(&mut c);
    // Some slack: the module keeps the capacity of its client map, the allocator its caches.
    let slack = (512 * 1024).max((blocked - baseline) / 100);
    // The server keeps a pool of the reply clients it made for blocked module clients (about
    // 32 KB each on 7.0) and trims it over a few seconds: wait for that.
    let settle_started = Instant::now();
    let after = settle_memory(&mut c, baseline, slack);
    let per_client = (connected - baseline) as f64 / n as f64;
    let per_waiter = (blocked - connected) as f64 / n as f64;
    let pool = (disconnected - baseline) as f64 / n as f64;
    eprintln!(
        "waiters: n={n} used_memory baseline={baseline} connected={connected} \
         (+{per_client:.0} B per idle client) blocked={blocked} (+{per_waiter:.0} B per \
         blocked waiter; {:.0} B per client in all) all-served={served} \
         disconnected={disconnected} (baseline {:+}, {pool:.0} B per waiter kept by the \
         server's pool of module reply clients) settled={after} (baseline {:+}, after {:?})",
        (blocked - baseline) as f64 / n as f64,
        disconnected - baseline,
        after - baseline,
        settle_started.elapsed()
    );
    assert!(
        after - baseline <= slack,
        "used_memory {after} is {} above the baseline {baseline} {:?} after every waiter \
         left (slack {slack})",
        after - baseline,
        settle_started.elapsed()
    );

    // For comparison, what the server itself charges for a client blocked in BLPOP (its
    // query buffer and blocking state, no module involved).
    let blpop_baseline = used_memory(&mut c);
    let mut streams: Vec<TcpStream> = (0..n)
        .map(|_| TcpStream::connect(("127.0.0.1", server.port())).expect("connect"))
        .collect();
    wait_until("every BLPOP client connected", PATIENCE, || {
        info_int(&mut c, "clients", "connected_clients") as usize > n
    });
    let blpop_connected = used_memory(&mut c);
    for stream in &mut streams {
        stream
            .write_all(b"*3\r\n$5\r\nBLPOP\r\n$6\r\nblpop:\r\n$1\r\n0\r\n")
            .expect("send BLPOP");
    }
    wait_until("every BLPOP client blocked", PATIENCE, || {
        info_int(&mut c, "clients", "blocked_clients") as usize == n
    });
    let blpop_blocked = used_memory(&mut c);
    drop(streams);
    eprintln!(
        "waiters: for comparison, BLPOP: +{:.0} B per blocked client (baseline \
         {blpop_baseline}, connected {blpop_connected}, blocked {blpop_blocked})",
        (blpop_blocked - blpop_connected) as f64 / n as f64
    );
    assert_clean_log(&server);
}

/// Wait until `used_memory` is within `slack` of `baseline` and has stopped falling for a
/// second (the server shrinks its hash tables and trims its pool of module reply clients from
/// its cron, a little at a time), or 30 s have passed; return the last reading.
fn settle_memory(c: &mut Connection, baseline: i64, slack: i64) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut lowest = used_memory(c);
    let mut lowest_at = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let now = used_memory(c);
        if now < lowest {
            lowest = now;
            lowest_at = Instant::now();
        }
        let stable = lowest_at.elapsed() >= Duration::from_secs(1);
        if (now - baseline <= slack && stable) || Instant::now() >= deadline {
            return now;
        }
    }
}

// --- Many locks ------------------------------------------------------------------------

/// Pipeline `cmd key(i) ...` for every `i` in `range`, in batches; return every reply.
fn pipelined(
    c: &mut Connection,
    range: std::ops::Range<usize>,
    mut build: impl FnMut(&mut redis::Pipeline, usize),
) -> Vec<Value> {
    const BATCH: usize = 10_000;
    let mut replies = Vec::with_capacity(range.len());
    let mut start = range.start;
    while start < range.end {
        let end = (start + BATCH).min(range.end);
        let mut pipe = redis::pipe();
        for i in start..end {
            build(&mut pipe, i);
        }
        let batch: Vec<Value> = pipe.query(c).expect("pipeline");
        replies.extend(batch);
        start = end;
    }
    replies
}

fn lock_key(i: usize) -> String {
    format!("many:{i:08}")
}

/// A typical owner: 36 bytes, like a UUID.
fn lock_owner(i: usize) -> String {
    format!("{i:08x}-0000-4000-8000-000000000000")
}

#[test]
fn many_locks_cost_and_cleanup() {
    let count = env_usize("LOCK_COUNT", 100_000);
    let server = Server::start();
    let mut c = server.conn();
    let started = Instant::now();

    let baseline = used_memory(&mut c);
    let replies = pipelined(&mut c, 0..count, |p, i| {
        p.cmd("LOCK.ACQUIRE")
            .arg(lock_key(i))
            .arg(lock_owner(i))
            .arg(LONG_TTL);
    });
    let mut last = 0;
    for (i, r) in replies.iter().enumerate() {
        match r {
            Value::Int(t) if *t > last => last = *t,
            other => panic!(
                "LOCK.ACQUIRE {}: {other:?} (previous token {last})",
                lock_key(i)
            ),
        }
    }
    assert_eq!(lock_stat(&mut c, "locks"), count as i64);
    assert_eq!(dbsize(&mut c), count as i64);
    let held = used_memory(&mut c);
    let acquire_time = started.elapsed();

    // Release the even ones; let the odd ones expire (deadline moved to 1 ms from now).
    let expired_before = lock_stat(&mut c, "expired");
    let replies = pipelined(&mut c, 0..count, |p, i| {
        if i % 2 == 0 {
            p.cmd("LOCK.RELEASE").arg(lock_key(i)).arg(lock_owner(i));
        } else {
            p.cmd("LOCK.EXTEND")
                .arg(lock_key(i))
                .arg(lock_owner(i))
                .arg(1);
        }
    });
    assert!(
        replies.iter().all(|r| *r == Value::Int(1)),
        "every release and extend should answer 1"
    );
    wait_until("lock_locks == 0 after release and expiry", PATIENCE, || {
        lock_stat(&mut c, "locks") == 0
    });
    assert_eq!(dbsize(&mut c), 0);
    assert!(
        lock_stat(&mut c, "expired") - expired_before >= (count / 2) as i64 - 1,
        "lock_expired should count the expired half"
    );
    let slack = (1 << 20).max((held - baseline) / 50);
    let freed = settle_memory(&mut c, baseline, slack);

    // The same thing with the usual recipe: SET key owner NX PX ttl.
    let set_baseline = used_memory(&mut c);
    let replies = pipelined(&mut c, 0..count, |p, i| {
        p.cmd("SET")
            .arg(lock_key(i))
            .arg(lock_owner(i))
            .arg("NX")
            .arg("PX")
            .arg(LONG_TTL);
    });
    assert!(replies.iter().all(|r| *r == Value::Okay));
    let set_held = used_memory(&mut c);
    let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    let set_freed = settle_memory(&mut c, set_baseline, slack);

    let per_lock = (held - baseline) as f64 / count as f64;
    let per_set = (set_held - set_baseline) as f64 / count as f64;
    eprintln!(
        "many_locks: {count} locks (key {} B, owner {} B) acquired in {acquire_time:?}; \
         used_memory baseline={baseline} held={held} ({per_lock:.1} B per lock) \
         after release+expiry={freed} (baseline {:+}); SET NX PX: baseline={set_baseline} \
         held={set_held} ({per_set:.1} B per key) after FLUSHALL={set_freed} (baseline {:+}); \
         lock/SET = {:.2}",
        lock_key(0).len(),
        lock_owner(0).len(),
        freed - baseline,
        set_freed - set_baseline,
        per_lock / per_set
    );
    assert!(
        freed - baseline <= slack,
        "used_memory {freed} did not return near the baseline {baseline} (slack {slack})"
    );
    assert_eq!(lock_stat(&mut c, "locks"), 0);
    assert_clean_log(&server);
}
