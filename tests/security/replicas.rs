//! Replicas, read-only and writable: a replica never ends a session by its own clock or
//! connections, so it takes none (issue 28, item 10): with `replica-read-only no` every
//! session subcommand but `INFO`, and every hold in a session, is refused with `READONLY`.

use std::time::Duration;

use redis::Value;

use crate::common::*;
use crate::sessions_common::*;

const REFUSED: &str = "READONLY sessions and session holds are taken on the primary only: a replica never ends a session by its own clock or connections (replica-read-only no does not change that)";

#[test]
fn a_writable_replica_takes_no_session_and_no_session_hold() {
    let primary = Server::start();
    let replica = Server::replica_of(&primary);
    let mut p = primary.conn();
    let mut r = replica.conn();
    config_set(&mut r, "replica-read-only", "no").unwrap();
    let id = open(&mut p, 30_000, &[]);
    wait_until(
        "the replica has the session",
        Duration::from_secs(10),
        || {
            matches!(
                session(&mut r, "INFO", &[&id]),
                Ok(Value::Array(_) | Value::Map(_))
            )
        },
    );
    assert_err(session(&mut r, "OPEN", &["1000"]), REFUSED);
    assert_err(session(&mut r, "OPEN", &["1000", "BOUND"]), REFUSED);
    for sub in ["KEEPALIVE", "CLOSE", "ATTACH"] {
        assert_err(session(&mut r, sub, &[&id]), REFUSED);
    }
    let k = unique_key("replica");
    assert_err(
        call(&mut r, "LOCK.ACQUIRE", &[&k, "me", "0", "SESSION", &id]),
        REFUSED,
    );
    assert_err(
        call(
            &mut r,
            "LOCK.MACQUIRE",
            &["1", &k, "me", "0", "SESSION", &id],
        ),
        REFUSED,
    );
    assert_eq!(exists(&mut r, &k), 0);
    // The primary's session is whole, and what it does still reaches the replica.
    assert_eq!(session(&mut p, "KEEPALIVE", &[&id]), Ok(Value::Int(30000)));
    let token = match call(&mut p, "LOCK.ACQUIRE", &[&k, "me", "0", "SESSION", &id]) {
        Ok(Value::Int(t)) => t,
        other => panic!("{other:?}"),
    };
    wait_until("the replica has the hold", Duration::from_secs(10), || {
        fence(&mut r, &k) == Some(token)
    });
    assert_eq!(session(&mut p, "CLOSE", &[&id]), Ok(Value::Int(1)));
    wait_until(
        "the replica follows the close",
        Duration::from_secs(10),
        || exists(&mut r, &k) == 0,
    );
}

#[test]
fn a_read_only_replica_answers_info_and_refuses_the_rest() {
    let primary = Server::start();
    let replica = Server::replica_of(&primary);
    let mut p = primary.conn();
    let mut r = replica.conn();
    let id = open(&mut p, 30_000, &[]);
    let k = unique_key("replica");
    assert!(matches!(
        call(&mut p, "LOCK.ACQUIRE", &[&k, "me", "0", "SESSION", &id]),
        Ok(Value::Int(_))
    ));
    // INFO changes nothing (flagged readonly): it reads the replicated session.
    wait_until("the replica has the hold", Duration::from_secs(10), || {
        matches!(
            session(&mut r, "INFO", &[&id]),
            Ok(Value::Array(_) | Value::Map(_))
        ) && info_field_of(&mut r, &id, "holds") == Value::Int(1)
    });
    for sub in ["KEEPALIVE", "CLOSE", "ATTACH"] {
        assert_err_code(session(&mut r, sub, &[&id]), "READONLY");
    }
    assert_err_code(session(&mut r, "OPEN", &["1000"]), "READONLY");
}
