//! The basic contract of LOCK.ACQUIRE / LOCK.RELEASE / LOCK.EXTEND / LOCK.FENCE
//! against a real server: replies, deadlines, expiry, errors, Lua and config.
//!
//! Every test starts its own server, so tests are independent and run in
//! parallel. Error tests assert the exact code and message, then that nothing
//! changed.

mod common;

use std::time::{Duration, Instant};

use common::*;
use redis::{Connection, Value};

/// A ttl long enough that no hold in these tests expires by accident.
const LONG_TTL: i64 = 100_000;

fn new_key() -> String {
    unique_key("contract")
}

// --- ACQUIRE -----------------------------------------------------------------

#[test]
fn acquire_free_lock_grants_a_token() {
    let (_server, mut c) = start();
    let key = new_key();

    let token = must_acquire(&mut c, &key, "alice", LONG_TTL);

    assert_eq!(fence(&mut c, &key), Some(token));
    assert_eq!(key_type(&mut c, &key), "redislock");
    assert_eq!(exists(&mut c, &key), 1);
    let left = pttl(&mut c, &key);
    assert!(
        left > 0 && left <= LONG_TTL,
        "PTTL {left} not in 1..={LONG_TTL}"
    );
}

#[test]
fn first_token_is_derived_from_the_wall_clock() {
    // Tokens are roughly `unix_ms << 11`, which is what keeps them increasing
    // across restarts that lose all state, and stay below 2^53 (exact in JS and Lua numbers).
    // The first token after a start is `lock.failover-token-margin-ms` (60 s by default)
    // ahead of that: margin 0 here, to see the clock alone.
    let server = Server::start_with_module_args(&["failover-token-margin-ms", "0"], &[]);
    let mut c = server.conn();
    let key = new_key();

    let before = unix_ms();
    let token = must_acquire(&mut c, &key, "alice", LONG_TTL);
    let after = unix_ms();

    let token_ms = token >> 11;
    assert!(
        token_ms >= before - 1_000 && token_ms <= after + 1_000,
        "token {token} >> 11 = {token_ms}, wall clock was {before}..={after}"
    );
    assert!(token < 1 << 53, "token {token} is not exact as a double");
}

#[test]
fn same_owner_reacquire_returns_same_token_and_resets_deadline() {
    let (_server, mut c) = start();
    let key = new_key();

    let token = must_acquire(&mut c, &key, "alice", 1_000);

    // Longer ttl: the deadline moves later.
    assert_eq!(acquire(&mut c, &key, "alice", LONG_TTL), Some(token));
    let left = pttl(&mut c, &key);
    assert!(
        left > 1_000 && left <= LONG_TTL,
        "PTTL {left} after retry with ttl {LONG_TTL}"
    );

    // Shorter ttl: the deadline moves earlier (reset, not max).
    assert_eq!(acquire(&mut c, &key, "alice", 2_000), Some(token));
    let left = pttl(&mut c, &key);
    assert!(
        left > 0 && left <= 2_000,
        "PTTL {left} after retry with ttl 2000"
    );

    assert_eq!(fence(&mut c, &key), Some(token));
}

#[test]
fn other_owner_gets_nil_and_hold_is_unchanged() {
    let (_server, mut c) = start();
    let key = new_key();

    let token = must_acquire(&mut c, &key, "alice", 10_000);
    assert_eq!(acquire(&mut c, &key, "bob", LONG_TTL), None);

    assert_held(&mut c, &key, token, 10_000);
    // alice still holds it: her retry is idempotent, bob's release fails.
    assert_eq!(release(&mut c, &key, "bob"), 0);
    assert_eq!(acquire(&mut c, &key, "alice", 10_000), Some(token));
}

#[test]
fn tokens_strictly_increase_across_grants_of_a_key() {
    let (_server, mut c) = start();
    let (k1, k2) = (new_key(), new_key());

    let (mut last1, mut last2) = (0i64, 0i64);
    for i in 0..200 {
        let owner = format!("owner-{i}");
        let t1 = must_acquire(&mut c, &k1, &owner, LONG_TTL);
        let t2 = must_acquire(&mut c, &k2, &owner, LONG_TTL);
        assert!(
            t1 > last1,
            "grant {i} of {k1}: token {t1} not above {last1}"
        );
        assert!(
            t2 > last2,
            "grant {i} of {k2}: token {t2} not above {last2}"
        );
        assert_eq!(release(&mut c, &k1, &owner), 1);
        assert_eq!(release(&mut c, &k2, &owner), 1);
        last1 = t1;
        last2 = t2;
    }
}

// --- RELEASE -----------------------------------------------------------------

#[test]
fn release_by_holder_frees_the_key() {
    let (_server, mut c) = start();
    let key = new_key();

    let token = must_acquire(&mut c, &key, "alice", LONG_TTL);
    assert_eq!(release(&mut c, &key, "alice"), 1);

    assert_absent(&mut c, &key);
    assert_eq!(fence_check(&mut c, &key, token), 0);
    // A second release finds nothing.
    assert_eq!(release(&mut c, &key, "alice"), 0);
    assert_eq!(exists(&mut c, &key), 0);
    // Free for anyone, with a larger token.
    let next = must_acquire(&mut c, &key, "bob", LONG_TTL);
    assert!(next > token, "token after release {next} not above {token}");
}

#[test]
fn release_by_non_holder_or_of_free_key_returns_zero() {
    let (_server, mut c) = start();
    let (held, free) = (new_key(), new_key());

    let token = must_acquire(&mut c, &held, "alice", 10_000);
    assert_eq!(release(&mut c, &held, "bob"), 0);
    assert_eq!(release(&mut c, &held, "alic"), 0);
    assert_eq!(release(&mut c, &held, "alice2"), 0);
    assert_held(&mut c, &held, token, 10_000);

    assert_eq!(release(&mut c, &free, "alice"), 0);
    assert_absent(&mut c, &free);
}

// --- EXTEND ------------------------------------------------------------------

#[test]
fn extend_by_holder_moves_the_deadline() {
    let (_server, mut c) = start();
    let key = new_key();

    let token = must_acquire(&mut c, &key, "alice", 1_000);

    assert_eq!(extend(&mut c, &key, "alice", LONG_TTL), 1);
    let left = pttl(&mut c, &key);
    assert!(
        left > 1_000 && left <= LONG_TTL,
        "PTTL {left} after extend to {LONG_TTL}"
    );

    // The deadline becomes now+ttl even when that is earlier.
    assert_eq!(extend(&mut c, &key, "alice", 2_000), 1);
    let left = pttl(&mut c, &key);
    assert!(
        left > 0 && left <= 2_000,
        "PTTL {left} after extend to 2000"
    );

    // Extending keeps the token.
    assert_eq!(fence(&mut c, &key), Some(token));
}

#[test]
fn extend_by_non_holder_or_of_free_key_returns_zero() {
    let (_server, mut c) = start();
    let (held, free) = (new_key(), new_key());

    let token = must_acquire(&mut c, &held, "alice", 10_000);
    assert_eq!(extend(&mut c, &held, "bob", LONG_TTL), 0);
    assert_held(&mut c, &held, token, 10_000);

    assert_eq!(extend(&mut c, &free, "alice", LONG_TTL), 0);
    assert_absent(&mut c, &free);
}

// --- FENCE -------------------------------------------------------------------

#[test]
fn fence_reports_the_holder_token_and_checks_tokens() {
    let (_server, mut c) = start();
    let key = new_key();

    assert_eq!(fence(&mut c, &key), None);
    assert_eq!(fence_check(&mut c, &key, 1), 0);
    assert_eq!(exists(&mut c, &key), 0, "FENCE must not create the key");

    let old = must_acquire(&mut c, &key, "alice", LONG_TTL);
    assert_eq!(fence(&mut c, &key), Some(old));
    assert_eq!(fence_check(&mut c, &key, old), 1);
    assert_eq!(fence_check(&mut c, &key, old + 1), 0);
    assert_eq!(fence_check(&mut c, &key, old - 1), 0);

    assert_eq!(release(&mut c, &key, "alice"), 1);
    let new = must_acquire(&mut c, &key, "bob", LONG_TTL);
    assert_eq!(fence(&mut c, &key), Some(new));
    assert_eq!(fence_check(&mut c, &key, new), 1);
    assert_eq!(fence_check(&mut c, &key, old), 0, "stale token accepted");
}

// --- Expiry ------------------------------------------------------------------

#[test]
fn expired_hold_is_free_for_every_command_before_the_key_is_deleted() {
    let (_server, mut c) = start();
    // With active expiry off the server deletes an expired key only when a
    // command looks it up, so each command below meets a hold that is past its
    // deadline but still stored. One key per command, so each is the first to
    // touch its key.
    redis::cmd("DEBUG")
        .arg("SET-ACTIVE-EXPIRE")
        .arg(0)
        .query::<()>(&mut c)
        .unwrap();

    const TTL: i64 = 30;
    let names = [
        "fence",
        "fence-token",
        "release",
        "extend",
        "acquire-other",
        "acquire-same",
    ];
    let keys: Vec<String> = names.iter().map(|n| unique_key(n)).collect();
    let mut tokens = Vec::new();
    let mut granted_by = Instant::now();
    for key in &keys {
        tokens.push(must_acquire(&mut c, key, "alice", TTL));
        granted_by = Instant::now();
    }
    // Every deadline is at most TTL ms after the last reply arrived; the extra
    // milliseconds cover the server clock's millisecond rounding.
    sleep_until(granted_by + Duration::from_millis(TTL as u64 + 5));
    let dbsize: i64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    assert_eq!(
        dbsize,
        keys.len() as i64,
        "expired holds should not be deleted yet"
    );

    assert_eq!(fence(&mut c, &keys[0]), None, "FENCE of an expired hold");
    assert_eq!(
        fence_check(&mut c, &keys[1], tokens[1]),
        0,
        "FENCE token of an expired hold"
    );
    assert_eq!(
        release(&mut c, &keys[2], "alice"),
        0,
        "RELEASE of an expired hold"
    );
    assert_eq!(exists(&mut c, &keys[2]), 0);
    assert_eq!(
        extend(&mut c, &keys[3], "alice", LONG_TTL),
        0,
        "EXTEND of an expired hold"
    );
    assert_absent(&mut c, &keys[3]);

    let other = must_acquire(&mut c, &keys[4], "bob", LONG_TTL);
    assert!(
        other > tokens[4],
        "token {other} after expiry not above {}",
        tokens[4]
    );
    assert_eq!(fence(&mut c, &keys[4]), Some(other));

    // The old owner gets a new grant, not an idempotent retry of the old one.
    let again = must_acquire(&mut c, &keys[5], "alice", LONG_TTL);
    assert!(
        again > tokens[5],
        "token {again} after expiry not above {}",
        tokens[5]
    );
    let left = pttl(&mut c, &keys[5]);
    assert!(
        left > TTL && left <= LONG_TTL,
        "PTTL {left} of the new grant"
    );
}

// --- Errors ------------------------------------------------------------------

#[test]
fn wrong_arity_uses_the_server_message() {
    let (_server, mut c) = start();
    let key = new_key();
    let token = must_acquire(&mut c, &key, "alice", 10_000);
    let t = token.to_string();
    let free = new_key();

    // Sent in upper case: the server's own message names the command as
    // registered, in lower case.
    let cases: Vec<(&str, Vec<&str>)> = vec![
        ("LOCK.ACQUIRE", vec![]),
        ("LOCK.ACQUIRE", vec![&key]),
        ("LOCK.ACQUIRE", vec![&key, "alice"]),
        ("LOCK.ACQUIRE", vec![&free]),
        ("LOCK.ACQUIRE", vec![&free, "alice"]),
        ("LOCK.RELEASE", vec![]),
        ("LOCK.RELEASE", vec![&key]),
        ("LOCK.RELEASE", vec![&key, "alice", "x"]),
        ("LOCK.EXTEND", vec![]),
        ("LOCK.EXTEND", vec![&key]),
        ("LOCK.EXTEND", vec![&key, "alice"]),
        ("LOCK.EXTEND", vec![&key, "alice", "50000", "x"]),
        ("LOCK.FENCE", vec![]),
        ("LOCK.FENCE", vec![&key, &t, "x"]),
    ];
    for (name, args) in &cases {
        let expected = format!(
            "ERR wrong number of arguments for '{}' command",
            name.to_lowercase()
        );
        assert_err(call(&mut c, name, args), &expected);
    }
    assert_held(&mut c, &key, token, 10_000);
    assert_absent(&mut c, &free);
}

#[test]
fn invalid_ttl_is_rejected_and_changes_nothing() {
    let (_server, mut c) = start();
    let held = new_key();
    let free = new_key();
    let token = must_acquire(&mut c, &held, "alice", 10_000);

    for bad in ["abc", "0", "-5", "1.5", ""] {
        let msg = "ERR ttl-ms must be a positive integer";
        // Free key, held key by the holder (idempotent retry path) and by
        // someone else; EXTEND by the holder.
        assert_err(call(&mut c, "LOCK.ACQUIRE", &[&free, "alice", bad]), msg);
        assert_err(call(&mut c, "LOCK.ACQUIRE", &[&held, "alice", bad]), msg);
        assert_err(call(&mut c, "LOCK.ACQUIRE", &[&held, "bob", bad]), msg);
        assert_err(call(&mut c, "LOCK.EXTEND", &[&held, "alice", bad]), msg);
        assert_err(call(&mut c, "LOCK.EXTEND", &[&free, "alice", bad]), msg);
    }
    assert_held(&mut c, &held, token, 10_000);
    assert_absent(&mut c, &free);
}

#[test]
fn ttl_whose_deadline_overflows_is_rejected() {
    let (_server, mut c) = start();
    let held = new_key();
    let free = new_key();
    let token = must_acquire(&mut c, &held, "alice", 10_000);

    for huge in ["9223372036854775807", "9223372036854775000"] {
        let msg = "ERR ttl-ms is too large";
        assert_err(call(&mut c, "LOCK.ACQUIRE", &[&free, "alice", huge]), msg);
        assert_err(call(&mut c, "LOCK.ACQUIRE", &[&held, "alice", huge]), msg);
        assert_err(call(&mut c, "LOCK.EXTEND", &[&held, "alice", huge]), msg);
    }
    assert_held(&mut c, &held, token, 10_000);
    assert_absent(&mut c, &free);
}

#[test]
fn empty_owner_is_rejected() {
    let (_server, mut c) = start();
    let held = new_key();
    let free = new_key();
    let token = must_acquire(&mut c, &held, "alice", 10_000);

    let msg = "ERR owner must not be empty";
    assert_err(call(&mut c, "LOCK.ACQUIRE", &[&free, "", "10000"]), msg);
    assert_err(call(&mut c, "LOCK.ACQUIRE", &[&held, "", "10000"]), msg);
    assert_err(call(&mut c, "LOCK.RELEASE", &[&held, ""]), msg);
    assert_err(call(&mut c, "LOCK.EXTEND", &[&held, "", "50000"]), msg);
    assert_held(&mut c, &held, token, 10_000);
    assert_absent(&mut c, &free);
}

#[test]
fn owner_length_limit_default_and_config_set_apply_to_acquire() {
    let (_server, mut c) = start();

    assert_eq!(config_get(&mut c, "lock.max-owner-bytes"), "1024");
    let at_limit = "o".repeat(1024);
    let over_limit = "o".repeat(1025);
    let key = new_key();
    must_acquire(&mut c, &key, &at_limit, LONG_TTL);
    let free = new_key();
    assert_err(
        call(&mut c, "LOCK.ACQUIRE", &[&free, &over_limit, "10000"]),
        "ERR owner is longer than lock.max-owner-bytes (1024)",
    );
    assert_absent(&mut c, &free);

    let ok: Value = redis::cmd("CONFIG")
        .arg("SET")
        .arg("lock.max-owner-bytes")
        .arg(8)
        .query(&mut c)
        .unwrap();
    assert_eq!(ok, Value::Okay);
    assert_eq!(config_get(&mut c, "lock.max-owner-bytes"), "8");

    must_acquire(&mut c, &new_key(), "12345678", LONG_TTL);
    assert_err(
        call(&mut c, "LOCK.ACQUIRE", &[&free, "123456789", "10000"]),
        "ERR owner is longer than lock.max-owner-bytes (8)",
    );
    assert_absent(&mut c, &free);
}

#[test]
fn owner_length_limit_applies_to_release_and_extend() {
    let (_server, mut c) = start();
    let key = new_key();
    let token = must_acquire(&mut c, &key, "alice", 10_000);
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("lock.max-owner-bytes")
        .arg(8)
        .query::<()>(&mut c)
        .unwrap();

    let msg = "ERR owner is longer than lock.max-owner-bytes (8)";
    assert_err(call(&mut c, "LOCK.RELEASE", &[&key, "123456789"]), msg);
    assert_err(
        call(&mut c, "LOCK.EXTEND", &[&key, "123456789", "50000"]),
        msg,
    );
    assert_held(&mut c, &key, token, 10_000);
}

#[test]
fn owner_length_limit_as_module_argument() {
    let server = Server::start_with_module_args(&["max-owner-bytes", "8"], &[]);
    let mut c = server.conn();

    assert_eq!(config_get(&mut c, "lock.max-owner-bytes"), "8");
    let free = new_key();
    assert_err(
        call(&mut c, "LOCK.ACQUIRE", &[&free, "123456789", "10000"]),
        "ERR owner is longer than lock.max-owner-bytes (8)",
    );
    assert_absent(&mut c, &free);
    must_acquire(&mut c, &free, "12345678", LONG_TTL);
}

#[test]
fn unknown_acquire_argument_is_a_syntax_error() {
    let (_server, mut c) = start();
    let held = new_key();
    let free = new_key();
    let token = must_acquire(&mut c, &held, "alice", 10_000);

    let msg = "ERR syntax error: unexpected argument 'FOO'";
    assert_err(
        call(&mut c, "LOCK.ACQUIRE", &[&free, "alice", "10000", "FOO"]),
        msg,
    );
    assert_err(
        call(&mut c, "LOCK.ACQUIRE", &[&held, "alice", "50000", "FOO"]),
        msg,
    );
    assert_held(&mut c, &held, token, 10_000);
    assert_absent(&mut c, &free);
}

#[test]
fn invalid_fence_token_is_rejected() {
    let (_server, mut c) = start();
    let held = new_key();
    let token = must_acquire(&mut c, &held, "alice", 10_000);

    for bad in ["abc", "0", "-1", "1.5", ""] {
        assert_err(
            call(&mut c, "LOCK.FENCE", &[&held, bad]),
            "ERR token must be a positive integer",
        );
    }
    assert_held(&mut c, &held, token, 10_000);
}

#[test]
fn commands_on_a_key_of_another_type_reply_wrongtype() {
    let (_server, mut c) = start();
    let key = new_key();
    redis::cmd("SET")
        .arg(&key)
        .arg("plain")
        .query::<()>(&mut c)
        .unwrap();

    let msg = "WRONGTYPE Operation against a key holding the wrong kind of value";
    assert_err(call(&mut c, "LOCK.ACQUIRE", &[&key, "alice", "10000"]), msg);
    assert_err(call(&mut c, "LOCK.RELEASE", &[&key, "alice"]), msg);
    assert_err(call(&mut c, "LOCK.EXTEND", &[&key, "alice", "10000"]), msg);
    assert_err(call(&mut c, "LOCK.FENCE", &[&key]), msg);
    assert_err(call(&mut c, "LOCK.FENCE", &[&key, "12345"]), msg);

    let value: String = redis::cmd("GET").arg(&key).query(&mut c).unwrap();
    assert_eq!(value, "plain");
    assert_eq!(
        pttl(&mut c, &key),
        -1,
        "the string must keep having no expiry"
    );
}

#[test]
fn binary_owners_round_trip() {
    let (_server, mut c) = start();
    let key = new_key();
    let owner: &[u8] = b"a\0b\xff\xfe\0";

    let token = must_acquire(&mut c, &key, owner, LONG_TTL);
    // Owners that match only up to the NUL byte, or differ in the high bytes,
    // are different owners.
    assert_eq!(acquire(&mut c, &key, &b"a"[..], LONG_TTL), None);
    assert_eq!(
        acquire(&mut c, &key, &b"a\0b\xff\xfe\x01"[..], LONG_TTL),
        None
    );
    assert_eq!(release(&mut c, &key, &b"a"[..]), 0);
    assert_eq!(release(&mut c, &key, &b"a\0b\xff\xfe"[..]), 0);

    assert_eq!(acquire(&mut c, &key, owner, LONG_TTL), Some(token));
    assert_eq!(extend(&mut c, &key, owner, LONG_TTL), 1);
    assert_eq!(release(&mut c, &key, owner), 1);
    assert_absent(&mut c, &key);
}

#[test]
fn lock_load_is_refused_for_normal_clients() {
    let (_server, mut c) = start();
    let held = new_key();
    let free = new_key();
    let token = must_acquire(&mut c, &held, "alice", 10_000);
    let far = (unix_ms() + LONG_TTL).to_string();
    let big = (token + 1_000).to_string();

    assert_err_code(
        call(&mut c, "LOCK.LOAD", &[&free, "mallory", &big, &far]),
        "ERR",
    );
    assert_err_code(
        call(&mut c, "LOCK.LOAD", &[&held, "mallory", &big, &far]),
        "ERR",
    );
    assert_absent(&mut c, &free);
    assert_held(&mut c, &held, token, 10_000);
}

// --- Lua ---------------------------------------------------------------------

fn eval(
    c: &mut Connection,
    script: &str,
    keys: &[&str],
    args: &[&str],
) -> redis::RedisResult<Value> {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script).arg(keys.len());
    for k in keys {
        cmd.arg(*k);
    }
    for a in args {
        cmd.arg(*a);
    }
    cmd.query(c)
}

#[test]
fn lua_calls_reply_like_direct_calls() {
    let (_server, mut c) = start();
    let key = new_key();
    let acquire_lua = "return redis.call('LOCK.ACQUIRE', KEYS[1], ARGV[1], ARGV[2])";
    let release_lua = "return redis.call('LOCK.RELEASE', KEYS[1], ARGV[1])";
    let extend_lua = "return redis.call('LOCK.EXTEND', KEYS[1], ARGV[1], ARGV[2])";
    let fence_lua = "return redis.call('LOCK.FENCE', KEYS[1])";
    let check_lua = "return redis.call('LOCK.FENCE', KEYS[1], ARGV[1])";

    let token = match eval(&mut c, acquire_lua, &[&key], &["alice", "100000"]) {
        Ok(Value::Int(t)) if t > 0 => t,
        other => panic!("EVAL LOCK.ACQUIRE: expected a positive integer, got {other:?}"),
    };
    let t = token.to_string();
    assert_eq!(fence(&mut c, &key), Some(token));
    assert_eq!(
        eval(&mut c, acquire_lua, &[&key], &["alice", "100000"]).unwrap(),
        Value::Int(token)
    );
    assert_eq!(
        eval(&mut c, acquire_lua, &[&key], &["bob", "100000"]).unwrap(),
        Value::Nil
    );
    assert_eq!(
        eval(&mut c, fence_lua, &[&key], &[]).unwrap(),
        Value::Int(token)
    );
    assert_eq!(
        eval(&mut c, check_lua, &[&key], &[&t]).unwrap(),
        Value::Int(1)
    );
    let stale = (token - 1).to_string();
    assert_eq!(
        eval(&mut c, check_lua, &[&key], &[&stale]).unwrap(),
        Value::Int(0)
    );
    assert_eq!(
        eval(&mut c, extend_lua, &[&key], &["bob", "100000"]).unwrap(),
        Value::Int(0)
    );
    assert_eq!(
        eval(&mut c, extend_lua, &[&key], &["alice", "200000"]).unwrap(),
        Value::Int(1)
    );
    let left = pttl(&mut c, &key);
    assert!(
        left > 100_000 && left <= 200_000,
        "PTTL {left} after EXTEND from Lua"
    );
    assert_eq!(
        eval(&mut c, release_lua, &[&key], &["bob"]).unwrap(),
        Value::Int(0)
    );
    assert_eq!(
        eval(&mut c, release_lua, &[&key], &["alice"]).unwrap(),
        Value::Int(1)
    );
    assert_absent(&mut c, &key);
    assert_eq!(eval(&mut c, fence_lua, &[&key], &[]).unwrap(), Value::Nil);
    assert_eq!(
        eval(&mut c, check_lua, &[&key], &[&t]).unwrap(),
        Value::Int(0)
    );
    assert_eq!(
        eval(&mut c, release_lua, &[&key], &["alice"]).unwrap(),
        Value::Int(0)
    );

    // Errors surface from Lua with the same code and message.
    let bad_ttl = eval(&mut c, acquire_lua, &[&key], &["alice", "0"]);
    match bad_ttl {
        Err(e) => assert!(
            e.code() == Some("ERR")
                && e.detail()
                    .unwrap_or("")
                    .contains("ttl-ms must be a positive integer"),
            "EVAL LOCK.ACQUIRE with ttl 0: got {e}"
        ),
        Ok(v) => panic!("EVAL LOCK.ACQUIRE with ttl 0: expected an error, got {v:?}"),
    }
    assert_absent(&mut c, &key);
}

#[test]
fn fenced_write_script_accepts_current_token_and_refuses_stale() {
    let (_server, mut c) = start();
    let lock = new_key();
    let data = new_key();
    let script = "if redis.call('LOCK.FENCE', KEYS[1], ARGV[1]) == 1 then \
                  return redis.call('SET', KEYS[2], ARGV[2]) else return false end";

    let old = must_acquire(&mut c, &lock, "alice", LONG_TTL);
    let old_s = old.to_string();
    assert_eq!(
        eval(&mut c, script, &[&lock, &data], &[&old_s, "v1"]).unwrap(),
        Value::Okay
    );
    let v: String = redis::cmd("GET").arg(&data).query(&mut c).unwrap();
    assert_eq!(v, "v1");

    assert_eq!(release(&mut c, &lock, "alice"), 1);
    let new = must_acquire(&mut c, &lock, "bob", LONG_TTL);
    let new_s = new.to_string();

    assert_eq!(
        eval(&mut c, script, &[&lock, &data], &[&old_s, "stale"]).unwrap(),
        Value::Nil
    );
    let v: String = redis::cmd("GET").arg(&data).query(&mut c).unwrap();
    assert_eq!(v, "v1", "a stale token must not write");

    assert_eq!(
        eval(&mut c, script, &[&lock, &data], &[&new_s, "v2"]).unwrap(),
        Value::Okay
    );
    let v: String = redis::cmd("GET").arg(&data).query(&mut c).unwrap();
    assert_eq!(v, "v2");
}

// --- Config ------------------------------------------------------------------

#[test]
fn tokens_survive_lua_numbers_exactly() {
    // Inside a script a token is a Lua number (a double). Tokens stay below 2^53, so a token
    // read in Lua, compared in Lua, or passed back to LOCK.FENCE is exact, including tokens
    // that are not the first of their millisecond (floor + 1, + 2, ...).
    let (_server, mut c) = start();
    let keys: Vec<String> = (0..8).map(|_| new_key()).collect();
    let mut pipe = redis::pipe();
    for key in &keys {
        pipe.cmd("LOCK.ACQUIRE").arg(key).arg("alice").arg(LONG_TTL);
    }
    let tokens: Vec<i64> = pipe.query(&mut c).unwrap();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens {tokens:?} do not increase"
    );
    let roundtrip = "local t = redis.call('LOCK.FENCE', KEYS[1]) \
                     return {t, redis.call('LOCK.FENCE', KEYS[1], t)}";
    for (key, token) in keys.iter().zip(&tokens) {
        assert_eq!(
            eval(&mut c, roundtrip, &[key], &[]).unwrap(),
            Value::Array(vec![Value::Int(*token), Value::Int(1)]),
            "key {key}"
        );
    }
    let distinct = "return redis.call('LOCK.FENCE', KEYS[1]) ~= redis.call('LOCK.FENCE', KEYS[2])";
    assert_eq!(
        eval(&mut c, distinct, &[&keys[0], &keys[1]], &[]).unwrap(),
        Value::Int(1)
    );
}
