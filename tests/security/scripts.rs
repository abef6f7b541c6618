//! Scripts (`EVAL`, `FCALL`): what lasts until a connection closes is refused inside them,
//! because a script's client is the server's own and never disconnects. `LOCK.WATCH` from a
//! script would watch for ever (its memory never comes back), so it and `LOCK.UNWATCH` are
//! refused, from `EVAL` and from a function, with an error that names the rule; nothing is left
//! watched. (`BOUND` and `ATTACH`: `tests/sessions/commands.rs`; `BLOCK`, which answers as
//! without it: `tests/blocking/multi_and_lua.rs`.)

use redis::{Connection, Value};

use crate::common::*;

/// The library a function test loads: `lock_watch` and `lock_unwatch`, each calling the
/// command on `keys[1]` with `pcall`, so the module's error comes back exactly as it was made.
const LIBRARY: &str = "#!lua name=feedsec
redis.register_function('lock_watch', function(keys, args)
  return redis.pcall('LOCK.WATCH', keys[1])
end)
redis.register_function('lock_unwatch', function(keys, args)
  return redis.pcall('LOCK.UNWATCH', keys[1])
end)";

const WATCH_REFUSED: &str =
    "ERR LOCK.WATCH cannot be used from a script or function (its client never disconnects)";
const UNWATCH_REFUSED: &str =
    "ERR LOCK.UNWATCH cannot be used from a script or function (its client never disconnects)";

/// The key's `LOCK.INFO` field `name`, if it shows one.
fn info_field_of(c: &mut Connection, key: &str, name: &str) -> Option<Value> {
    let reply = call(c, "LOCK.INFO", &[key]).expect("LOCK.INFO");
    let Value::Array(pairs) = reply else {
        panic!("LOCK.INFO {key}: {reply:?}");
    };
    pairs
        .chunks(2)
        .find(|p| p[0] == Value::BulkString(name.as_bytes().to_vec()))
        .map(|p| p[1].clone())
}

/// Held, and watched by nobody: `LOCK.INFO` shows no `seq` (it does while a watch exists).
fn assert_unwatched(c: &mut Connection, key: &str) {
    assert_eq!(info_field_of(c, key, "seq"), None, "{key} is watched");
}

fn eval(c: &mut Connection, script: &str, key: &str) -> redis::RedisResult<Value> {
    call(c, "EVAL", &[script, "1", key])
}

fn fcall(c: &mut Connection, function: &str, key: &str) -> redis::RedisResult<Value> {
    call(c, "FCALL", &[function, "1", key])
}

#[test]
fn watch_and_unwatch_are_refused_from_eval_and_leave_no_watch() {
    let server = Server::start();
    let mut c = server.conn();
    let key = unique_key("scripts");
    must_acquire(&mut c, &key, "holder", 60_000);
    assert_err(
        eval(&mut c, "return redis.pcall('LOCK.WATCH', KEYS[1])", &key),
        WATCH_REFUSED,
    );
    assert_unwatched(&mut c, &key);
    // Many tries leave nothing either (on main each one stayed for good).
    for _ in 0..100 {
        assert_err(
            eval(&mut c, "return redis.pcall('LOCK.WATCH', KEYS[1])", &key),
            WATCH_REFUSED,
        );
    }
    assert_unwatched(&mut c, &key);
    assert_err(
        eval(&mut c, "return redis.pcall('LOCK.UNWATCH', KEYS[1])", &key),
        UNWATCH_REFUSED,
    );
    // With `call` the script fails as a whole, with the same rule in its message.
    let failed = eval(&mut c, "return redis.call('LOCK.WATCH', KEYS[1])", &key);
    assert!(
        format!("{failed:?}").contains(
            "LOCK.WATCH cannot be used from a script or function (its client never disconnects)"
        ),
        "{failed:?}"
    );
    assert_unwatched(&mut c, &key);
    // A real connection still watches, also inside MULTI (the clients read state that way),
    // and its watch shows.
    let mut watcher = server.conn();
    match call(&mut watcher, "LOCK.WATCH", &[&key]).unwrap() {
        Value::Array(v) if v.len() == 2 && v[1] == Value::Int(0) => {
            let channel = String::from_utf8(match &v[0] {
                Value::BulkString(b) => b.clone(),
                other => panic!("channel {other:?}"),
            })
            .unwrap();
            assert!(
                channel.starts_with("lock.feed:{") && channel.ends_with(&format!(":0:{key}")),
                "{channel}"
            );
        }
        other => panic!("LOCK.WATCH: {other:?}"),
    }
    assert_eq!(info_field_of(&mut c, &key, "seq"), Some(Value::Int(0)));
    let (_w, _i): (Value, Value) = redis::pipe()
        .atomic()
        .cmd("LOCK.WATCH")
        .arg(&key)
        .cmd("LOCK.INFO")
        .arg(&key)
        .query(&mut watcher)
        .expect("MULTI LOCK.WATCH LOCK.INFO EXEC");
    drop(watcher);
    wait_for("the watch to end with its connection", READ_TIMEOUT, || {
        info_field_of(&mut c, &key, "seq").is_none().then_some(())
    });
}

#[test]
fn watch_and_unwatch_are_refused_from_fcall_and_leave_no_watch() {
    let server = Server::start();
    let mut c = server.conn();
    assert_eq!(
        call(&mut c, "FUNCTION", &["LOAD", LIBRARY]).unwrap(),
        Value::BulkString(b"feedsec".to_vec())
    );
    let key = unique_key("scripts");
    must_acquire(&mut c, &key, "holder", 60_000);
    for _ in 0..100 {
        assert_err(fcall(&mut c, "lock_watch", &key), WATCH_REFUSED);
    }
    assert_unwatched(&mut c, &key);
    assert_err(fcall(&mut c, "lock_unwatch", &key), UNWATCH_REFUSED);
    assert_unwatched(&mut c, &key);
}
