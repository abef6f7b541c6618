//! A `BOUND` session ends the moment its connection closes, however it closes; its holds count
//! as released and every queue they blocked is served in its FIFO order, with no wait for any
//! TTL.

use super::*;

/// The scenario: a holder process with a bound session holds two exclusive locks and a
/// semaphore permit, waiters queue on each, and the holder is killed with SIGKILL. Every waiter
/// is granted, in order, long before any of the 30 s ttls.
#[test]
fn a_killed_holder_process_hands_everything_over_at_once() {
    let (server, mut c) = start();
    let (a, b, sem) = (new_key(), new_key(), new_key());
    let mut holder = HolderProcess::start(&server);
    let id = holder.send("LOCK.SESSION OPEN 30000 BOUND");
    assert!(id.starts_with('{'), "{id}");
    for line in [
        format!("LOCK.ACQUIRE {a} holder 30000 SESSION {id}"),
        format!("LOCK.ACQUIRE {b} holder 30000 SESSION {id}"),
        format!("LOCK.ACQUIRE {sem} holder 30000 SHARED LIMIT 1 SESSION {id}"),
    ] {
        let token: i64 = holder
            .send(&line)
            .parse()
            .unwrap_or_else(|_| panic!("{line}"));
        assert!(token > 0);
    }
    assert!(matches!(info_of(&mut c, &id, "bound"), Value::Int(_)));
    let w = |key: &str, owner: &str, extra: &[&str]| {
        let mut args = vec![key, owner, "30000"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["BLOCK", "20000"]);
        args.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let mut waiters = vec![];
    for args in [
        w(&a, "a1", &[]),
        w(&a, "a2", &[]),
        w(&b, "b1", &[]),
        w(&sem, "s1", &["SHARED", "LIMIT", "1"]),
    ] {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        waiters.push(Waiter::start(&server, &mut c, "LOCK.ACQUIRE", &refs));
    }
    holder.kill9();
    // Each granted within its 20 s wait, where every ttl is 30 s: by the session's end with
    // its connection (`lock_sessions_disconnected` below), not by a ttl.
    let mut replies: Vec<(i64, Instant)> = vec![];
    let a2 = waiters.remove(1);
    for waiter in waiters {
        replies.push(waiter.granted());
    }
    // a2 queued behind a1: still waiting, and first in line.
    assert_eq!(
        lock_info_field(&mut c, &a, "owner"),
        Some(Value::BulkString(b"a1".to_vec()))
    );
    assert_eq!(release(&mut c, &a, "a1"), 1);
    let (t2, _) = a2.granted();
    assert!(t2 > replies[0].0);
    assert_eq!(keepalive(&mut c, &id), None);
    assert_eq!(info_int(&mut c, "lock", "lock_sessions_disconnected"), 1);
    assert_eq!(info_int(&mut c, "lock", "lock_session_holds_released"), 3);
}

#[test]
fn client_kill_and_idle_timeout_end_a_bound_session() {
    let (server, mut c) = start();
    for (ended, how) in [(1, "CLIENT KILL"), (2, "timeout")] {
        let key = new_key();
        let mut holder = server.conn();
        let id = open(&mut holder, 30_000, &["BOUND"]);
        acquire_in(&mut holder, &key, "holder", 30_000, &id, &[]);
        let waiter = Waiter::start(
            &server,
            &mut c,
            "LOCK.ACQUIRE",
            &[&key, "next", "30000", "BLOCK", "20000"],
        );
        if how == "CLIENT KILL" {
            let victim = client_id(&mut holder);
            let killed: i64 = redis::cmd("CLIENT")
                .arg(&["KILL", "ID", &victim.to_string()])
                .query(&mut c)
                .unwrap();
            assert_eq!(killed, 1);
        } else {
            // The holder goes idle; the server closes it after `timeout` seconds.
            config_set(&mut c, "timeout", "1").unwrap();
        }
        // Granted within its 20 s wait, where the ttls are 30 s: the connection's end ended
        // the session.
        waiter.granted();
        // The idle timeout closes this connection too, when it sat idle long enough.
        c = server.conn();
        assert_eq!(
            info_int(&mut c, "lock", "lock_sessions_disconnected"),
            ended,
            "{how}"
        );
        assert_eq!(keepalive(&mut c, &id), None, "{how}");
        config_set(&mut c, "timeout", "0").unwrap();
        drop(holder);
    }
}

#[test]
fn an_unbound_session_survives_its_connection() {
    let (server, mut c) = start();
    let key = new_key();
    let id = {
        let mut gone = server.conn();
        let id = open(&mut gone, 30_000, &[]);
        acquire_in(&mut gone, &key, "me", 0, &id, &[]);
        id
    };
    // The connection closed; the session and its hold stay.
    wait_until("the connection is gone", Duration::from_secs(5), || {
        info_int(&mut c, "clients", "connected_clients") == 1
    });
    assert!(keepalive(&mut c, &id).is_some());
    assert!(fence(&mut c, &key).is_some());
}

#[test]
fn attach_moves_the_binding_to_another_connection() {
    let (server, mut c) = start();
    let key = new_key();
    let mut first = server.conn();
    let id = open(&mut first, 30_000, &["BOUND"]);
    acquire_in(&mut first, &key, "me", 0, &id, &[]);
    let mut second = server.conn();
    assert_err(
        session(&mut second, "ATTACH", &[&id]),
        "ERR the session is bound to another connection that is still open",
    );
    assert_eq!(
        info_of(&mut c, &id, "bound"),
        Value::Int(client_id(&mut first))
    );
    // Attaching again from the bound connection is a no-op.
    assert_eq!(session(&mut first, "ATTACH", &[&id]), Ok(Value::Okay));
    drop(first);
    wait_until(
        "the first connection is gone",
        Duration::from_secs(5),
        || {
            info_int(&mut c, "clients", "connected_clients") == 2
                || keepalive(&mut c, &id).is_none()
        },
    );
    // The first connection's close ended the session: ATTACH is too late.
    assert_eq!(keepalive(&mut c, &id), None);
    assert_absent(&mut c, &key);

    // ATTACH while the old connection is still open is refused; once bound connections are
    // swapped by ATTACH (after a restart, see durability.rs) the new one ends it.
    drop(second);
}

#[test]
fn a_waiter_whose_session_ends_is_never_granted() {
    let (server, mut c) = start();
    let key = new_key();
    must_acquire(&mut c, &key, "holder", 30_000);
    let id = open(&mut c, 30_000, &[]);
    let waiter = Waiter::start(
        &server,
        &mut c,
        "LOCK.ACQUIRE",
        &[&key, "w", "0", "SESSION", &id, "BLOCK", "20000"],
    );
    let multi_key = new_key();
    let multi = Waiter::start(
        &server,
        &mut c,
        "LOCK.MACQUIRE",
        &[
            "2", &key, &multi_key, "w", "1000", "SESSION", &id, "BLOCK", "20000",
        ],
    );
    assert_eq!(session(&mut c, "CLOSE", &[&id]), Ok(Value::Int(0)));
    for w in [waiter, multi] {
        let (reply, _) = w.reply();
        assert!(
            format!("{reply:?}")
                .contains("the session ended while the client waited; it was not granted"),
            "{reply:?}"
        );
    }
    assert_eq!(release(&mut c, &key, "holder"), 1);
    assert_absent(&mut c, &key);
    assert_absent(&mut c, &multi_key);
}

#[test]
fn multi_key_holds_in_a_session_go_together() {
    let (server, mut c) = start();
    let (a, b) = (new_key(), new_key());
    let mut holder = server.conn();
    let id = open(&mut holder, 30_000, &["BOUND"]);
    let tokens: Vec<i64> = redis::cmd("LOCK.MACQUIRE")
        .arg(&["2", &a, &b, "holder", "0", "SESSION", &id])
        .query(&mut holder)
        .unwrap();
    assert_eq!(tokens.len(), 2);
    assert_eq!(pttl(&mut c, &a), -1);
    let waiter = Waiter::start(
        &server,
        &mut c,
        "LOCK.MACQUIRE",
        &["2", &a, &b, "next", "5000", "BLOCK", "20000"],
    );
    let victim = client_id(&mut holder);
    redis::cmd("CLIENT")
        .arg(&["KILL", "ID", &victim.to_string()])
        .query::<i64>(&mut c)
        .unwrap();
    match waiter.reply() {
        (Ok(Value::Array(t)), _) => assert_eq!(t.len(), 2),
        other => panic!("{other:?}"),
    }
}
