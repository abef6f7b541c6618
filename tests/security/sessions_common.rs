//! Helpers of the session rows (`sessions_acl`, `secrets`, `replicas`, `admin_reload_in_pause`).

use std::time::Duration;

use redis::{Connection, RedisResult, Value};

use crate::common::*;

/// A connection as ACL user `user` (password `pw`), made with `rules` first.
pub fn user_conn(
    server: &Server,
    admin: &mut Connection,
    user: &str,
    rules: &[&str],
) -> Connection {
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER")
        .arg(user)
        .arg("reset")
        .arg("on")
        .arg(">pw");
    for rule in rules {
        cmd.arg(*rule);
    }
    cmd.query::<()>(admin).unwrap();
    let client = redis::Client::open(format!("redis://{user}:pw@{}/", server.addr())).unwrap();
    let conn = client.get_connection().unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    conn
}

/// `LOCK.SESSION OPEN ttl [options]` -> the id.
#[track_caller]
pub fn open(c: &mut Connection, ttl: i64, options: &[&str]) -> String {
    let mut args = vec!["OPEN".to_string(), ttl.to_string()];
    args.extend(options.iter().map(|o| o.to_string()));
    match call(c, "LOCK.SESSION", &args) {
        Ok(Value::BulkString(id)) => String::from_utf8(id).unwrap(),
        other => panic!("LOCK.SESSION OPEN: {other:?}"),
    }
}

/// `LOCK.SESSION sub args...`, raw.
pub fn session(c: &mut Connection, sub: &str, args: &[&str]) -> RedisResult<Value> {
    let mut all = vec![sub];
    all.extend_from_slice(args);
    call(c, "LOCK.SESSION", &all)
}

/// The id's secret part (after its hash tag): what must never be shown.
pub fn secret(id: &str) -> &str {
    &id[id.find('}').unwrap() + 1..]
}

/// `ACL LOG` as text.
pub fn acl_log(c: &mut Connection) -> String {
    format!(
        "{:?}",
        redis::cmd("ACL").arg("LOG").query::<Value>(c).unwrap()
    )
}

/// One field of `LOCK.SESSION INFO id` (RESP2 array or RESP3 map).
#[track_caller]
pub fn info_field_of(c: &mut Connection, id: &str, field: &str) -> Value {
    let pairs: Vec<(Value, Value)> = match session(c, "INFO", &[id]) {
        Ok(Value::Array(items)) => items
            .chunks(2)
            .map(|kv| (kv[0].clone(), kv[1].clone()))
            .collect(),
        Ok(Value::Map(items)) => items,
        other => panic!("LOCK.SESSION INFO: {other:?}"),
    };
    pairs
        .into_iter()
        .find(|(k, _)| *k == Value::BulkString(field.as_bytes().to_vec()))
        .unwrap_or_else(|| panic!("no {field} in LOCK.SESSION INFO"))
        .1
}

/// A refusal by the ACL: `NOPERM` (the wording differs between servers) and no id in it.
#[track_caller]
pub fn assert_noperm<T: std::fmt::Debug>(reply: RedisResult<T>, id: &str) {
    let text = format!("{reply:?}");
    assert_err_code(reply, "NOPERM");
    assert!(
        !text.contains(secret(id)),
        "the refusal names the id: {text}"
    );
}
