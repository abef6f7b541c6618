//! The lock commands as the tests send them. Each helper checks the exact reply type (an
//! integer reply must not arrive as a bulk string, nil must be nil) and panics with the raw
//! reply if not; and the assertions on error replies and holds.

use redis::{Connection, RedisResult, ToRedisArgs, Value};

/// Run `name args...` and return the raw reply (or the error reply).
pub fn call<A: ToRedisArgs>(conn: &mut Connection, name: &str, args: &[A]) -> RedisResult<Value> {
    let mut cmd = redis::cmd(name);
    for arg in args {
        cmd.arg(arg);
    }
    cmd.query(conn)
}

fn int_or_nil(what: &str, reply: RedisResult<Value>) -> Option<i64> {
    match reply {
        Ok(Value::Int(n)) => Some(n),
        Ok(Value::Nil) => None,
        other => panic!("{what}: expected an integer or nil reply, got {other:?}"),
    }
}

fn int(what: &str, reply: RedisResult<Value>) -> i64 {
    match reply {
        Ok(Value::Int(n)) => n,
        other => panic!("{what}: expected an integer reply, got {other:?}"),
    }
}

/// `LOCK.ACQUIRE key owner ttl` -> `Some(token)` or `None` (nil).
pub fn acquire(
    conn: &mut Connection,
    key: &str,
    owner: impl ToRedisArgs,
    ttl_ms: i64,
) -> Option<i64> {
    let reply = redis::cmd("LOCK.ACQUIRE")
        .arg(key)
        .arg(owner)
        .arg(ttl_ms)
        .query(conn);
    int_or_nil("LOCK.ACQUIRE", reply)
}

/// `LOCK.ACQUIRE` that must grant; returns the token and checks it is positive.
pub fn must_acquire(conn: &mut Connection, key: &str, owner: impl ToRedisArgs, ttl_ms: i64) -> i64 {
    let token = acquire(conn, key, owner, ttl_ms)
        .unwrap_or_else(|| panic!("LOCK.ACQUIRE {key}: expected a token, got nil"));
    assert!(
        token > 0,
        "LOCK.ACQUIRE {key}: token {token} is not positive"
    );
    token
}

/// `LOCK.RELEASE key owner` -> 1 or 0.
pub fn release(conn: &mut Connection, key: &str, owner: impl ToRedisArgs) -> i64 {
    int(
        "LOCK.RELEASE",
        redis::cmd("LOCK.RELEASE").arg(key).arg(owner).query(conn),
    )
}

/// `LOCK.EXTEND key owner ttl` -> 1 or 0.
pub fn extend(conn: &mut Connection, key: &str, owner: impl ToRedisArgs, ttl_ms: i64) -> i64 {
    int(
        "LOCK.EXTEND",
        redis::cmd("LOCK.EXTEND")
            .arg(key)
            .arg(owner)
            .arg(ttl_ms)
            .query(conn),
    )
}

/// `LOCK.FENCE key` -> `Some(token)` of the live hold, or `None`.
pub fn fence(conn: &mut Connection, key: &str) -> Option<i64> {
    int_or_nil("LOCK.FENCE", redis::cmd("LOCK.FENCE").arg(key).query(conn))
}

/// `LOCK.FENCE key token` -> 1 or 0.
pub fn fence_check(conn: &mut Connection, key: &str, token: i64) -> i64 {
    int(
        "LOCK.FENCE",
        redis::cmd("LOCK.FENCE").arg(key).arg(token).query(conn),
    )
}

/// `PTTL key`.
pub fn pttl(conn: &mut Connection, key: &str) -> i64 {
    int("PTTL", redis::cmd("PTTL").arg(key).query(conn))
}

/// `EXISTS key`.
pub fn exists(conn: &mut Connection, key: &str) -> i64 {
    int("EXISTS", redis::cmd("EXISTS").arg(key).query(conn))
}

/// `TYPE key`.
pub fn key_type(conn: &mut Connection, key: &str) -> String {
    match redis::cmd("TYPE").arg(key).query(conn) {
        Ok(Value::SimpleString(s)) => s,
        other => panic!("TYPE {key}: expected a status reply, got {other:?}"),
    }
}

/// Assert `reply` is the error `expected`, written as the server sends it
/// (`"ERR ttl-ms must be a positive integer"`): the code and the message text.
#[track_caller]
pub fn assert_err<T: std::fmt::Debug>(reply: RedisResult<T>, expected: &str) {
    let (code, detail) = match expected.split_once(' ') {
        Some((code, detail)) => (code, Some(detail)),
        None => (expected, None),
    };
    match reply {
        Err(e) => assert!(
            e.code() == Some(code) && e.detail() == detail,
            "expected error {expected:?}, got code {:?} detail {:?} ({e})",
            e.code(),
            e.detail()
        ),
        Ok(v) => panic!("expected error {expected:?}, got reply {v:?}"),
    }
}

/// Assert `reply` is an error with code `code` (message not checked).
#[track_caller]
pub fn assert_err_code<T: std::fmt::Debug>(reply: RedisResult<T>, code: &str) {
    match reply {
        Err(e) => assert_eq!(e.code(), Some(code), "expected error code {code}, got {e}"),
        Ok(v) => panic!("expected error code {code}, got reply {v:?}"),
    }
}

/// Assert `key` is held with `token` and its deadline has not moved later
/// than `max_pttl` ms from now (and has not passed).
#[track_caller]
pub fn assert_held(conn: &mut Connection, key: &str, token: i64, max_pttl: i64) {
    assert_eq!(fence(conn, key), Some(token), "LOCK.FENCE {key}");
    let left = pttl(conn, key);
    assert!(
        left > 0 && left <= max_pttl,
        "PTTL {key} = {left}, expected in 1..={max_pttl}"
    );
}

/// Assert `key` is free and does not exist.
#[track_caller]
pub fn assert_absent(conn: &mut Connection, key: &str) {
    assert_eq!(exists(conn, key), 0, "EXISTS {key}");
    assert_eq!(fence(conn, key), None, "LOCK.FENCE {key}");
}
