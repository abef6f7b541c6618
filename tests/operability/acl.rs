//! ACL key patterns (`%R~`, `%W~`, `~`) apply to the lock commands as to built-in ones.

use super::*;

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

#[test]
fn acl_key_patterns_apply_to_lock_commands() {
    let (server, mut c) = start();
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
