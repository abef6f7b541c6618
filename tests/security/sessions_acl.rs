//! Sessions under ACL users: a user limited by key patterns keeps its session alive and uses
//! every subcommand, because the id is not a key (issue 28, item 5); it still locks only the
//! keys its patterns allow, and nobody else's session.

use crate::common::*;
use crate::sessions_common::*;

#[test]
fn a_user_limited_to_lock_keys_keeps_its_session_alive() {
    let server = Server::start();
    let mut admin = server.conn();
    let mut app = user_conn(&server, &mut admin, "app", &["~lock:*", "+@all"]);
    let id = open(&mut app, 30_000, &[]);
    let token = match call(
        &mut app,
        "LOCK.ACQUIRE",
        &["lock:a", "me", "0", "SESSION", &id],
    ) {
        Ok(redis::Value::Int(t)) => t,
        other => panic!("LOCK.ACQUIRE in the session: {other:?}"),
    };
    assert_eq!(
        session(&mut app, "KEEPALIVE", &[&id, "20000"]),
        Ok(redis::Value::Int(20000))
    );
    assert_eq!(
        session(&mut app, "KEEPALIVE", &[&id]),
        Ok(redis::Value::Int(20000))
    );
    assert_eq!(info_field_of(&mut app, &id, "holds"), redis::Value::Int(1));
    assert_eq!(fence(&mut app, "lock:a"), Some(token));
    // Its key patterns still apply to the keys it locks.
    assert_noperm(
        call(
            &mut app,
            "LOCK.ACQUIRE",
            &["other:a", "me", "0", "SESSION", &id],
        ),
        &id,
    );
    assert_eq!(session(&mut app, "CLOSE", &[&id]), Ok(redis::Value::Int(1)));
    assert_absent(&mut app, "lock:a");
    // A bound session is attached again by the same user.
    let bound = open(&mut app, 30_000, &["BOUND"]);
    assert_eq!(
        session(&mut app, "ATTACH", &[&bound]),
        Ok(redis::Value::Okay)
    );
    // Nothing about sessions was denied: ACL LOG has no id and no entry about them.
    let log = acl_log(&mut admin);
    assert!(!log.contains(secret(&id)), "ACL LOG: {log}");
    assert!(!log.contains("lock.session"), "ACL LOG: {log}");
}

#[test]
fn another_user_cannot_use_a_session_it_learned_the_id_of() {
    let server = Server::start();
    let mut admin = server.conn();
    let mut app = user_conn(&server, &mut admin, "app", &["~lock:*", "+@all"]);
    let mut other = user_conn(&server, &mut admin, "other", &["~lock:*", "+@all"]);
    let id = open(&mut app, 30_000, &[]);
    let refused = "NOPERM this session was opened by another ACL user";
    for sub in ["KEEPALIVE", "CLOSE", "INFO"] {
        assert_err(session(&mut other, sub, &[&id]), refused);
    }
    assert_err(
        call(
            &mut other,
            "LOCK.ACQUIRE",
            &["lock:b", "x", "0", "SESSION", &id],
        ),
        refused,
    );
    assert_eq!(exists(&mut admin, "lock:b"), 0);
    assert!(matches!(
        session(&mut app, "KEEPALIVE", &[&id]),
        Ok(redis::Value::Int(30000))
    ));
}

#[test]
fn subcommands_are_granted_one_by_one() {
    // Each subcommand has its own ACL bit: a user may keep sessions alive without opening any.
    let server = Server::start();
    let mut admin = server.conn();
    let mut app = user_conn(&server, &mut admin, "app", &["~lock:*", "+@all"]);
    let id = open(&mut app, 30_000, &[]);
    let mut keeper = user_conn(
        &server,
        &mut admin,
        "app",
        &["~lock:*", "+lock.session|keepalive"],
    );
    assert_eq!(
        session(&mut keeper, "KEEPALIVE", &[&id]),
        Ok(redis::Value::Int(30000))
    );
    let refused = session(&mut keeper, "OPEN", &["1000"]);
    assert!(
        format!("{refused:?}").contains("'lock.session|open'"),
        "{refused:?}"
    );
    assert_noperm(refused, &id);
    assert!(!acl_log(&mut admin).contains(secret(&id)));
}
