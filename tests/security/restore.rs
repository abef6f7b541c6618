//! `SECURITY.md`, "Fencing tokens, `DUMP`/`RESTORE` and `LOCK.LOAD`": what a `RESTORE` may and
//! may not do to a key's token, to the server's token mint and to a session (issue 28 items 1
//! and 2, issue 33's `DUMP`/`RESTORE` findings). A refused restore gets the server's own
//! `ERR Bad data format` (the rule is in the server log) and changes nothing.

use std::time::Duration;

use redis::{Connection, RedisResult, Value};

use super::common::feed::FeedSubscriber;
use super::common::*;

/// What the server answers when the module refuses a value (the reply is the server's).
const REFUSED: &str = "ERR Bad data format";
/// `lock::restore::RESTORE_AHEAD_MS`: how far ahead of the clock a restored token may be.
const AHEAD_MS: i64 = 7 * 86_400_000;
/// Tokens are `ms << 11` at least (`lock::CLOCK_SHIFT`).
const SHIFT: u32 = 11;

/// `payload` (a `DUMP`: the RDB-encoded value, the 2-byte RDB version, the CRC-64) with the
/// token `from` replaced by `to` and the checksum fixed, as an attacker with `DUMP` would.
/// Tokens of the clock era (above 2^32) are saved as the 9-byte length `0x81` + 8 bytes big
/// endian after the module opcode for an unsigned (2), and so is any forged one.
fn forge(payload: &[u8], from: i64, to: u64) -> Vec<u8> {
    assert!(from > 1 << 32, "token {from} is not in the 8-byte encoding");
    let mut needle = vec![2u8, 0x81];
    needle.extend_from_slice(&(from as u64).to_be_bytes());
    let body = payload.len() - 8;
    let at = payload[..body]
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("token {from} not found in the dump {payload:?}"));
    let mut out = payload[..body].to_vec();
    out[at + 2..at + 10].copy_from_slice(&to.to_be_bytes());
    harness::dump::with_checksum(out)
}

#[track_caller]
fn dump(c: &mut Connection, key: &str) -> Vec<u8> {
    match call(c, "DUMP", &[key]) {
        Ok(Value::BulkString(b)) => b,
        other => panic!("DUMP {key}: {other:?}"),
    }
}

fn restore(c: &mut Connection, key: &str, payload: &[u8], replace: bool) -> RedisResult<Value> {
    let mut cmd = redis::cmd("RESTORE");
    cmd.arg(key).arg(0).arg(payload);
    if replace {
        cmd.arg("REPLACE");
    }
    cmd.query(c)
}

#[track_caller]
fn ok(reply: RedisResult<Value>, what: &str) {
    match reply {
        Ok(Value::Okay) => {}
        Ok(Value::SimpleString(s)) if s == "OK" => {}
        other => panic!("{what}: expected OK, got {other:?}"),
    }
}

/// `LOCK.INFO key` as (field, value) pairs; `None` for nil.
fn info(c: &mut Connection, key: &str) -> Option<Vec<(String, Value)>> {
    match call(c, "LOCK.INFO", &[key]) {
        Ok(Value::Nil) => None,
        Ok(Value::Array(items)) => Some(
            items
                .chunks(2)
                .map(|kv| match &kv[0] {
                    Value::BulkString(k) => (String::from_utf8_lossy(k).into(), kv[1].clone()),
                    other => panic!("LOCK.INFO field {other:?}"),
                })
                .collect(),
        ),
        other => panic!("LOCK.INFO {key}: {other:?}"),
    }
}

fn field(info: &[(String, Value)], name: &str) -> Option<Value> {
    info.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
}

/// The owner of an exclusive lock and its token, from `LOCK.INFO`.
#[track_caller]
fn holder(c: &mut Connection, key: &str) -> (String, i64) {
    let i = info(c, key).unwrap_or_else(|| panic!("LOCK.INFO {key}: nil"));
    match (field(&i, "owner"), field(&i, "token")) {
        (Some(Value::BulkString(o)), Some(Value::Int(t))) => (String::from_utf8(o).unwrap(), t),
        other => panic!("LOCK.INFO {key}: {other:?}"),
    }
}

/// ms left of `key`'s lock-delay (`delayed` of `LOCK.INFO`), `None` when there is none.
fn delayed(c: &mut Connection, key: &str) -> Option<i64> {
    match info(c, key).and_then(|i| field(&i, "delayed")) {
        Some(Value::Int(ms)) => Some(ms),
        None => None,
        other => panic!("LOCK.INFO {key} delayed: {other:?}"),
    }
}

/// The server's clock in ms (`TIME`).
fn server_ms(c: &mut Connection) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query(c).unwrap();
    s * 1000 + us / 1000
}

fn open_session(c: &mut Connection, ttl: i64, options: &[&str]) -> String {
    let mut args = vec!["OPEN".to_string(), ttl.to_string()];
    args.extend(options.iter().map(|o| o.to_string()));
    match call(c, "LOCK.SESSION", &args) {
        Ok(Value::BulkString(id)) => String::from_utf8(id).unwrap(),
        other => panic!("LOCK.SESSION OPEN: {other:?}"),
    }
}

/// `holds` of `LOCK.SESSION INFO id`.
fn session_holds(c: &mut Connection, id: &str) -> i64 {
    let reply = call(c, "LOCK.SESSION", &["INFO", id]);
    let Ok(Value::Array(items)) = reply else {
        panic!("LOCK.SESSION INFO: {reply:?}");
    };
    for kv in items.chunks(2) {
        if kv[0] == Value::BulkString(b"holds".to_vec()) {
            if let Value::Int(n) = kv[1] {
                return n;
            }
        }
    }
    panic!("LOCK.SESSION INFO: no holds in {items:?}")
}

fn acquire_in(c: &mut Connection, key: &str, owner: &str, ttl: i64, id: &str) -> i64 {
    match call(
        c,
        "LOCK.ACQUIRE",
        &[key, owner, &ttl.to_string(), "SESSION", id],
    ) {
        Ok(Value::Int(t)) => t,
        other => panic!("LOCK.ACQUIRE {key} SESSION: {other:?}"),
    }
}

#[track_caller]
fn assert_logged(server: &Server, line: &str) {
    let log = server.log();
    assert!(log.contains(line), "server log lacks {line:?}:\n{log}");
}

#[test]
fn a_forged_max_token_from_a_scratch_user_is_refused_and_tokens_keep_growing() {
    let server = Server::start();
    let mut admin = server.conn();
    ok(
        call(
            &mut admin,
            "ACL",
            &["SETUSER", "scratch", "on", ">pw", "~scratch:*", "+@all"],
        ),
        "ACL SETUSER",
    );
    let url = format!("redis://scratch:pw@127.0.0.1:{}/", server.port());
    let mut scratch = redis::Client::open(url)
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(5)))
        .expect("connect as scratch");
    let mine = must_acquire(&mut scratch, "scratch:mine", "me", 60_000);
    let forged = forge(&dump(&mut scratch, "scratch:mine"), mine, u64::MAX);
    assert_err(
        restore(&mut scratch, "scratch:forged", &forged, false),
        REFUSED,
    );
    assert_eq!(exists(&mut scratch, "scratch:forged"), 0);
    assert_logged(
        &server,
        "RESTORE of key 'scratch:forged' (db 0) refused: token 18446744073709551615 is above",
    );
    // Every key's tokens go on growing, below 2^53, also after a reload.
    let a = must_acquire(&mut admin, &unique_key("a"), "x", 60_000);
    let b = must_acquire(&mut admin, &unique_key("b"), "x", 60_000);
    assert!(mine < a && a < b && b < 1 << 53, "tokens {mine} {a} {b}");
    ok(call(&mut admin, "DEBUG", &["RELOAD"]), "DEBUG RELOAD");
    let c = must_acquire(&mut admin, &unique_key("c"), "x", 60_000);
    assert!(b < c && c < 1 << 53, "after DEBUG RELOAD: {b} then {c}");
}

#[test]
fn tokens_just_inside_and_just_outside_the_restore_limit() {
    let server = Server::start();
    let mut c = server.conn();
    let key = unique_key("restore");
    let t = must_acquire(&mut c, &key, "me", 60_000);
    let payload = dump(&mut c, &key);
    let now = server_ms(&mut c);
    // The limit is at least (now + 7 days) << 11 from here on (the clock only moves on); a
    // minute of clock past it stays out while the restores below run within that minute.
    let inside = ((now + AHEAD_MS) as u64) << SHIFT;
    let outside = ((now + AHEAD_MS + 60_000) as u64) << SHIFT;
    let far = unique_key("far");
    assert_err(
        restore(&mut c, &far, &forge(&payload, t, outside), false),
        REFUSED,
    );
    assert_logged(&server, &format!("refused: token {outside} is above"));
    let near = unique_key("near");
    ok(
        restore(&mut c, &near, &forge(&payload, t, inside), false),
        "RESTORE inside",
    );
    assert_eq!(holder(&mut c, &near), ("me".to_string(), inside as i64));
    assert_eq!(exists(&mut c, &far), 0);
    // The mint follows the restored token (its key's next grant must exceed it), by one.
    let next = must_acquire(&mut c, &unique_key("next"), "x", 60_000);
    assert_eq!(next, inside as i64 + 1);
    ok(call(&mut c, "DEBUG", &["RELOAD"]), "DEBUG RELOAD");
    assert_eq!(holder(&mut c, &near), ("me".to_string(), inside as i64));
    let after = must_acquire(&mut c, &unique_key("after"), "x", 60_000);
    assert_eq!(after, inside as i64 + 2);
}

#[test]
fn restore_replace_never_moves_a_key_token_backwards() {
    let server = Server::start();
    let mut c = server.conn();
    let key = unique_key("restore");
    let old = must_acquire(&mut c, &key, "old", 60_000);
    let old_dump = dump(&mut c, &key);
    assert_eq!(release(&mut c, &key, "old"), 1);
    let new = must_acquire(&mut c, &key, "new", 60_000);
    assert_err(
        restore(&mut c, &key, &old_dump, false),
        "BUSYKEY Target key name already exists.",
    );
    assert_err(restore(&mut c, &key, &old_dump, true), REFUSED);
    assert_eq!(holder(&mut c, &key), ("new".to_string(), new));
    assert_logged(
        &server,
        &format!("refused: token {old} is not above the key's current token {new}"),
    );
    // The same value again, and a newer lock over it, may be restored.
    let same = dump(&mut c, &key);
    ok(
        restore(&mut c, &key, &same, true),
        "RESTORE REPLACE of its own dump",
    );
    assert_eq!(holder(&mut c, &key), ("new".to_string(), new));
    let other = unique_key("other");
    let newer = must_acquire(&mut c, &other, "newer", 60_000);
    let newer_dump = dump(&mut c, &other);
    ok(
        restore(&mut c, &key, &newer_dump, true),
        "RESTORE REPLACE of a newer lock",
    );
    assert_eq!(holder(&mut c, &key), ("newer".to_string(), newer));
    // An older dump under a fresh name is a grant that name never had: allowed, owner and
    // token kept, and the next grant is above every token.
    let fresh = unique_key("fresh");
    ok(
        restore(&mut c, &fresh, &old_dump, false),
        "RESTORE under another key",
    );
    assert_eq!(holder(&mut c, &fresh), ("old".to_string(), old));
    assert!(must_acquire(&mut c, &unique_key("n"), "x", 60_000) > newer);
}

#[test]
fn a_refused_restore_onto_a_watched_key_says_nothing_on_the_feed() {
    let server = Server::start();
    let mut c = server.conn();
    let key = unique_key("watched");
    let (mut sub, _) = FeedSubscriber::watching(server.port(), 0, key.as_bytes());
    let old = must_acquire(&mut c, &key, "old", 60_000);
    let old_dump = dump(&mut c, &key);
    assert_eq!(release(&mut c, &key, "old"), 1);
    let new = must_acquire(&mut c, &key, "new", 60_000);
    assert_err(restore(&mut c, &key, &old_dump, true), REFUSED);
    assert_eq!(release(&mut c, &key, "new"), 1);
    // The release is the next message after the grant: the refused restore sent none.
    let seen: Vec<(String, i64, Vec<u8>)> = (0..4)
        .map(|_| sub.next_message())
        .map(|m| (m.event, m.token, m.owner))
        .collect();
    assert_eq!(
        seen,
        vec![
            ("acquired".into(), old, b"old".to_vec()),
            ("released".into(), old, b"old".to_vec()),
            ("acquired".into(), new, b"new".to_vec()),
            ("released".into(), new, b"new".to_vec()),
        ]
    );
}

#[test]
fn a_session_hold_restored_under_another_key_does_not_join_the_session() {
    let server = Server::start();
    let mut c = server.conn();
    let id = open_session(&mut c, 30_000, &[]);
    let key = unique_key("s");
    let t = acquire_in(&mut c, &key, "me", 0, &id);
    assert_eq!(session_holds(&mut c, &id), 1);
    let copy = unique_key("copy");
    let payload = dump(&mut c, &key);
    ok(
        restore(&mut c, &copy, &payload, false),
        "RESTORE under another key",
    );
    assert_eq!(
        session_holds(&mut c, &id),
        1,
        "the restored hold joined the session"
    );
    // A plain hold now, ending by the session's deadline as it stood (its own had none).
    let i = info(&mut c, &copy).expect("the restored hold");
    assert_eq!(field(&i, "token"), Some(Value::Int(t)));
    let left = pttl(&mut c, &copy);
    assert!(left > 0 && left <= 30_000, "PTTL {copy} = {left}");
    let Some(Value::Array(holders)) = field(&i, "holders") else {
        panic!("LOCK.INFO holders: {i:?}")
    };
    let Value::Array(entry) = &holders[0] else {
        panic!("holder {holders:?}")
    };
    assert!(
        !entry.contains(&Value::BulkString(b"session".to_vec())),
        "restored hold still in a session: {entry:?}"
    );
    // Closing the session releases only its own hold.
    assert_eq!(
        call(&mut c, "LOCK.SESSION", &["CLOSE", &id]).unwrap(),
        Value::Int(1)
    );
}

#[test]
fn a_session_hold_restored_after_its_session_closed_does_not_come_back() {
    let server = Server::start();
    let mut c = server.conn();
    let id = open_session(&mut c, 60_000, &[]);
    let key = unique_key("s");
    let t = acquire_in(&mut c, &key, "me", 0, &id);
    let payload = dump(&mut c, &key);
    assert_eq!(
        call(&mut c, "LOCK.SESSION", &["CLOSE", &id]).unwrap(),
        Value::Int(1)
    );
    ok(
        restore(&mut c, &key, &payload, false),
        "RESTORE after CLOSE",
    );
    // The hold ended with its session: the key is free now, for a larger token.
    assert_eq!(info(&mut c, &key), None);
    let next = must_acquire(&mut c, &key, "other", 60_000);
    assert!(next > t, "{next} after {t}");
}

#[test]
fn a_restore_in_lock_delay_ends_no_later_than_the_delay() {
    let server = Server::start();
    let mut c = server.conn();
    let mut holder_conn = server.conn();
    let id = open_session(&mut holder_conn, 60_000, &["BOUND", "LOCKDELAY", "30000"]);
    let key = unique_key("delayed");
    acquire_in(&mut holder_conn, &key, "me", 0, &id);
    let before_loss = dump(&mut c, &key);
    drop(holder_conn); // the BOUND session is lost: its hold's lock-delay starts
    let left = wait_for("the lock-delay to start", Duration::from_secs(10), || {
        delayed(&mut c, &key)
    });
    assert!(left > 0 && left <= 30_000, "delayed {left}");
    // A dump taken in the delay, under another key: delayed no longer than the original.
    let during = dump(&mut c, &key);
    let copy = unique_key("copy");
    ok(
        restore(&mut c, &copy, &during, false),
        "RESTORE in lock-delay",
    );
    let key_left = delayed(&mut c, &key).expect("still delayed");
    let copy_left = delayed(&mut c, &copy).expect("the copy is delayed");
    assert!(
        copy_left <= key_left + 1,
        "copy {copy_left} ms, key {key_left} ms"
    );
    // A dump from before the loss: its session is gone, so the hold ends at the loss and
    // only the delay is left (before the fix it lived out the session's 60 s ttl, no delay).
    let old = unique_key("old");
    ok(
        restore(&mut c, &old, &before_loss, false),
        "RESTORE of a dump before the loss",
    );
    let key_left = delayed(&mut c, &key).expect("still delayed");
    let old_left = delayed(&mut c, &old).expect("the old dump's hold is in its delay");
    assert!(
        old_left <= key_left + 1,
        "old {old_left} ms, key {key_left} ms"
    );
    assert_eq!(acquire(&mut c, &old, "other", 1_000), None);
}

#[test]
fn migrate_keeps_owner_and_token_and_refuses_going_backwards() {
    let source = Server::start();
    let target = Server::start();
    let (mut s, mut t) = (source.conn(), target.conn());
    let port = target.port().to_string();
    let migrate = |c: &mut Connection, key: &str, extra: &[&str]| {
        let mut cmd = redis::cmd("MIGRATE");
        cmd.arg("127.0.0.1").arg(&port).arg(key).arg(0).arg(5000);
        for e in extra {
            cmd.arg(*e);
        }
        cmd.query::<Value>(c)
    };
    let (key, moved) = (unique_key("m"), unique_key("moved"));
    let older = must_acquire(&mut s, &key, "older", 60_000);
    let token = must_acquire(&mut s, &moved, "me", 60_000);
    ok(migrate(&mut s, &moved, &[]), "MIGRATE");
    assert_eq!(holder(&mut t, &moved), ("me".to_string(), token));
    assert_eq!(exists(&mut s, &moved), 0);
    // The target's next grant is above what it received, so above `older` too; the source's
    // older value of that key may not replace it.
    let newer = must_acquire(&mut t, &key, "newer", 60_000);
    assert!(newer > token && token > older);
    assert_err(
        migrate(&mut s, &key, &["COPY", "REPLACE"]),
        "ERR Target instance replied with error: ERR Bad data format",
    );
    assert_eq!(holder(&mut t, &key), ("newer".to_string(), newer));
    assert_eq!(holder(&mut s, &key), ("older".to_string(), older));
}

#[test]
fn a_replica_applies_what_its_primary_restored() {
    let (primary, replica) = primary_and_replica(&[]);
    let (mut p, mut r) = (primary.conn(), replica.conn());
    let key = unique_key("r");
    let t = must_acquire(&mut p, &key, "me", 60_000);
    let payload = dump(&mut p, &key);
    let copy = unique_key("copy");
    ok(restore(&mut p, &copy, &payload, false), "RESTORE");
    assert_err(
        restore(
            &mut p,
            &unique_key("x"),
            &forge(&payload, t, u64::MAX),
            false,
        ),
        REFUSED,
    );
    wait_for_replica_sync(&primary, &replica);
    assert_eq!(holder(&mut r, &copy), ("me".to_string(), t));
    assert_eq!(
        call(&mut r, "DBSIZE", &[] as &[&str]).unwrap(),
        Value::Int(2)
    );
}

#[test]
fn a_loaded_token_the_module_never_mints_is_not_followed() {
    // An AOF edited on disk (or written by a primary without these checks) with a hold whose
    // token is past 2^53: the load must work, but the mint must not follow it.
    let server = Server::start_aof_always("no");
    let mut c = server.conn();
    let t = must_acquire(&mut c, &unique_key("before"), "me", 60_000);
    let dir = server.dir().join("appendonlydir");
    let incr = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{dir:?}: {e}"))
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".incr.aof"))
        .expect("an incremental AOF file");
    let deadline = (server_ms(&mut c) + 60_000).to_string();
    let forged = i64::MAX.to_string();
    let args = ["LOCK.LOAD", "forged", "them", &forged, &deadline];
    let mut resp = format!("*{}\r\n", args.len());
    for a in args {
        resp.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&incr)
        .unwrap();
    std::io::Write::write_all(&mut file, resp.as_bytes()).unwrap();
    drop(file);
    ok(call(&mut c, "DEBUG", &["LOADAOF"]), "DEBUG LOADAOF");
    assert_eq!(holder(&mut c, "forged"), ("them".to_string(), i64::MAX));
    let next = call(
        &mut c,
        "LOCK.ACQUIRE",
        &[&unique_key("after"), "me", "60000"],
    );
    let Ok(Value::Int(next)) = next else {
        panic!("LOCK.ACQUIRE: {next:?}")
    };
    assert!(t < next && next < 1 << 53, "{t} then {next}");
    assert_logged(
        &server,
        &format!("LOCK.LOAD with token {forged} (at or above 2^53"),
    );
    // The same hold through an RDB load (DEBUG RELOAD saves it and loads it back).
    ok(call(&mut c, "DEBUG", &["RELOAD"]), "DEBUG RELOAD");
    assert_eq!(holder(&mut c, "forged"), ("them".to_string(), i64::MAX));
    assert_logged(
        &server,
        &format!("key 'forged' (db 0) was loaded with token {forged} which this module"),
    );
    let last = must_acquire(&mut c, &unique_key("last"), "me", 60_000);
    assert!(next < last && last < 1 << 53, "{next} then {last}");
}

#[test]
fn restore_replace_over_a_lock_that_expired_unnoticed_works() {
    // The replaced key is read while the new value loads; a key whose expiry passed but which
    // the server has not removed yet is removed by that read, inside `RESTORE`.
    let server = Server::start();
    let mut c = server.conn();
    ok(
        call(&mut c, "DEBUG", &["SET-ACTIVE-EXPIRE", "0"]),
        "DEBUG SET-ACTIVE-EXPIRE",
    );
    let key = unique_key("expired");
    let old = must_acquire(&mut c, &key, "old", 60_000);
    let old_dump = dump(&mut c, &key);
    assert_eq!(release(&mut c, &key, "old"), 1);
    let ttl = 100;
    let until = std::time::Instant::now() + Duration::from_millis(ttl as u64 + 5);
    let newer = must_acquire(&mut c, &key, "new", ttl);
    assert!(newer > old);
    sleep_until(until); // the deadline this test set
    ok(
        restore(&mut c, &key, &old_dump, true),
        "RESTORE REPLACE over an expired lock",
    );
    assert_eq!(holder(&mut c, &key), ("old".to_string(), old));
    assert_eq!(
        call(&mut c, "PING", &[] as &[&str]).unwrap(),
        Value::SimpleString("PONG".into())
    );
}
