//! Every bad input each command can get, against a server holding one lock with a waiter
//! behind it, a free key and keys of other types: each is refused with its exact error and
//! changes nothing (the whole keyspace and `INFO lock` are compared before and after).

use super::*;

pub(super) const HELD: &str = "abuse:held";
pub(super) const FREE: &str = "abuse:free";
pub(super) const STRING: &str = "abuse:string";
pub(super) const LIST: &str = "abuse:list";
pub(super) const HASH: &str = "abuse:hash";

pub(super) const NOT_POSITIVE: &str = "ERR ttl-ms must be a positive integer";
pub(super) const TOO_LARGE: &str = "ERR ttl-ms is too large";
pub(super) const OWNER_EMPTY: &str = "ERR owner must not be empty";
pub(super) const OWNER_TOO_LONG: &str = "ERR owner is longer than lock.max-owner-bytes (1024)";
pub(super) const WRONGTYPE: &str =
    "WRONGTYPE Operation against a key holding the wrong kind of value";
pub(super) const TOKEN_INVALID: &str = "ERR token must be a positive integer";
pub(super) const BLOCK_INVALID: &str = "ERR BLOCK timeout-ms must be a non-negative integer";
pub(super) const BLOCK_TOO_LARGE: &str = "ERR BLOCK timeout-ms is too large";
pub(super) const BLOCK_NEEDS: &str = "ERR syntax error: BLOCK needs a timeout in milliseconds";
pub(super) const BLOCK_TWICE: &str = "ERR syntax error: BLOCK given more than once";

/// Not integers at all, or not in the strict form (`+`, spaces, decimals, hex, exponent).
pub(super) const MALFORMED: &[&str] = &[
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

pub(super) fn oversized_owner() -> Vec<u8> {
    vec![b'x'; 1025]
}

fn binary_oversized_owner() -> Vec<u8> {
    (0..1025u32).map(|i| (i % 256) as u8).collect()
}

/// A server with: `HELD` locked by `alice` with one client blocked on it, `FREE` absent, and
/// a string, a list and a hash.
pub(super) struct Fixture {
    pub(super) server: Server,
    pub(super) c: Connection,
    pub(super) token: i64,
    /// The blocked waiter (`bob`, `BLOCK 0`); kept open so the queue stays non-empty.
    _waiter: TcpStream,
}

impl Fixture {
    pub(super) fn new() -> Fixture {
        let (server, mut c) = start();
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
    pub(super) fn snapshot(&mut self) -> Snapshot {
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
    pub(super) fn refuses(&mut self, cmd: &str, args: Vec<Vec<u8>>, expected: &str) {
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

    pub(super) fn finish(self) {
        let mut c = self.c;
        assert_eq!(fence(&mut c, HELD), Some(self.token), "the hold survived");
        assert_clean_log(&self.server);
    }
}

#[derive(Debug, PartialEq)]
pub(super) struct Snapshot {
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
pub(super) use args;

pub(super) fn arity(cmd: &str) -> String {
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
        let (server, mut c) = start();
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
    let (_server, mut c) = start();
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
