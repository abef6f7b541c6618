//! `MONITOR`, `SLOWLOG`, `ACL LOG` and error messages never show a session id (issue 28,
//! item 6): `LOCK.SESSION` is flagged out of `MONITOR` and `SLOWLOG`, the value of `SESSION` in
//! `LOCK.ACQUIRE`/`LOCK.MACQUIRE` is redacted, the id is no key an ACL check could deny, and an
//! id sent where it does not belong is not echoed.

use std::io::{BufRead, BufReader, Write};

use redis::Value;

use crate::common::*;
use crate::sessions_common::*;

#[test]
fn session_ids_stay_out_of_monitor_and_slowlog() {
    let server = Server::start();
    let mut c = server.conn();
    config_set(&mut c, "slowlog-log-slower-than", "0").unwrap();
    redis::cmd("SLOWLOG")
        .arg("RESET")
        .query::<()>(&mut c)
        .unwrap();
    // Valkey 8.1+ keeps a COMMANDLOG of slow, large-request and large-reply commands too.
    let commandlog = config_set(&mut c, "commandlog-request-larger-than", "1").is_ok();
    let mut monitor = std::net::TcpStream::connect(server.addr()).unwrap();
    monitor.write_all(b"MONITOR\r\n").unwrap();
    let mut reader = BufReader::new(monitor.try_clone().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert_eq!(line.trim_end(), "+OK");

    let id = open(&mut c, 30_000, &[]);
    let k = unique_key("secret");
    let (m1, m2) = (unique_key("secret"), unique_key("secret"));
    let granted = call(&mut c, "LOCK.ACQUIRE", &[&k, "me", "0", "SESSION", &id]);
    assert!(matches!(granted, Ok(Value::Int(_))), "{granted:?}");
    let multi = call(
        &mut c,
        "LOCK.MACQUIRE",
        &["2", &m1, &m2, "me", "0", "session", &id],
    );
    assert!(matches!(multi, Ok(Value::Array(_))), "{multi:?}");
    // A refused one (bad ttl) and a blocked one that times out are redacted too.
    assert_err(
        call(&mut c, "LOCK.ACQUIRE", &[&k, "me", "-1", "SESSION", &id]),
        "ERR ttl-ms must be a positive integer",
    );
    let other = open(&mut c, 30_000, &[]);
    assert_eq!(
        call(
            &mut c,
            "LOCK.ACQUIRE",
            &[&k, "you", "0", "BLOCK", "20", "SESSION", &other]
        ),
        Ok(Value::Nil)
    );
    redis::cmd("PING")
        .arg("marker")
        .query::<String>(&mut c)
        .unwrap();
    let mut seen = String::new();
    loop {
        line.clear();
        reader.read_line(&mut line).unwrap();
        seen.push_str(&line);
        if line.contains("marker") {
            break;
        }
    }
    for s in [secret(&id), secret(&other)] {
        assert!(!seen.contains(s), "MONITOR shows a session id: {seen}");
    }
    assert!(
        seen.matches("(redacted)").count() >= 4,
        "MONITOR shows the commands, redacted: {seen}"
    );
    let slowlog = format!(
        "{:?}",
        redis::cmd("SLOWLOG")
            .arg("GET")
            .arg(1000)
            .query::<Value>(&mut c)
            .unwrap()
    );
    for s in [secret(&id), secret(&other)] {
        assert!(!slowlog.contains(s), "SLOWLOG has a session id: {slowlog}");
    }
    assert!(slowlog.contains("LOCK.MACQUIRE"), "SLOWLOG: {slowlog}");
    if commandlog {
        let log = format!(
            "{:?}",
            redis::cmd("COMMANDLOG")
                .arg(&["GET", "1000", "large-request"])
                .query::<Value>(&mut c)
                .unwrap()
        );
        for s in [secret(&id), secret(&other)] {
            assert!(!log.contains(s), "COMMANDLOG has a session id: {log}");
        }
        assert!(log.contains("LOCK.MACQUIRE"), "COMMANDLOG: {log}");
    }
}

#[test]
fn acl_log_and_errors_never_name_an_id() {
    let server = Server::start();
    let mut admin = server.conn();
    let mut app = user_conn(&server, &mut admin, "app", &["~lock:*", "+@all"]);
    let id = open(&mut app, 30_000, &[]);
    // Denied for the key, not for the id: the log's object is the key.
    assert_noperm(
        call(
            &mut app,
            "LOCK.ACQUIRE",
            &["other:k", "me", "0", "SESSION", &id],
        ),
        &id,
    );
    assert!(matches!(
        session(&mut app, "KEEPALIVE", &[&id]),
        Ok(Value::Int(30000))
    ));
    let log = acl_log(&mut admin);
    assert!(log.contains("other:k"), "ACL LOG: {log}");
    assert!(!log.contains(secret(&id)), "ACL LOG has the id: {log}");
    // An id where an option was expected (SESSION forgotten) is not echoed back.
    assert_err(
        call(&mut app, "LOCK.ACQUIRE", &["lock:k", "me", "1000", &id]),
        "ERR syntax error: unexpected argument (a session id; give it after SESSION)",
    );
    assert_err(
        session(&mut app, "OPEN", &["1000", &id]),
        "ERR syntax error: unexpected argument (a session id; give it after SESSION)",
    );
}
