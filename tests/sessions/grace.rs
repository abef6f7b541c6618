//! `BOUND GRACE ms` (issue 29, "a connection blip is not a death"): a bound session whose
//! connection closes is detached, not ended; a connection that `ATTACH`es it within the grace
//! keeps every hold with its token; after the grace it ends as a disconnect did (lock-delay,
//! waiters served). The grace survives replication and restarts, and the feed says `detached`
//! and `attached`.

use super::*;
use common::feed::FeedSubscriber;

/// `CLIENT KILL ID` of `victim`'s connection, from `ctl`.
fn kill(ctl: &mut Connection, victim: &mut Connection) {
    let id = client_id(victim);
    let killed: i64 = redis::cmd("CLIENT")
        .arg(&["KILL", "ID", &id.to_string()])
        .query(ctl)
        .unwrap();
    assert_eq!(killed, 1);
}

fn int(v: Value) -> i64 {
    match v {
        Value::Int(n) => n,
        other => panic!("expected an integer, got {other:?}"),
    }
}

#[test]
fn attach_within_the_grace_keeps_every_hold_with_its_token() {
    let (server, mut c) = start();
    let mut holder = server.conn();
    let id = open(&mut holder, 30_000, &["BOUND", "GRACE", "10000"]);
    let (a, b) = (new_key(), new_key());
    let ta = acquire_in(&mut holder, &a, "me", 0, &id, &[]);
    let tb = acquire_in(
        &mut holder,
        &b,
        "me",
        30_000,
        &id,
        &["SHARED", "LIMIT", "1"],
    );
    assert_eq!(info_of(&mut c, &id, "grace"), Value::Int(10_000));
    assert_eq!(info_of(&mut c, &id, "detached"), Value::Nil);
    // A waiter queues behind the hold; it must still be waiting after the blip.
    let waiter = Waiter::start(
        &server,
        &mut c,
        "LOCK.ACQUIRE",
        &[&a, "next", "1000", "BLOCK", "20000"],
    );
    kill(&mut c, &mut holder);
    drop(holder);
    // Detached: unbound, the deadline brought in to the grace's end, the holds kept.
    wait_until("the session is detached", Duration::from_secs(5), || {
        info_int(&mut c, "lock", "lock_sessions_detached") == 1
    });
    assert_eq!(info_of(&mut c, &id, "bound"), Value::Nil);
    let left = int(info_of(&mut c, &id, "detached"));
    assert!((1..=10_000).contains(&left), "detached {left}");
    assert!(int(info_of(&mut c, &id, "ttl")) <= 10_000);
    assert_eq!(info_of(&mut c, &id, "holds"), Value::Int(2));
    // A new connection attaches it: bound there, renewed for its ttl, every token kept.
    let mut back = server.conn();
    assert_eq!(session(&mut back, "ATTACH", &[&id]), Ok(Value::Okay));
    assert_eq!(
        info_of(&mut c, &id, "bound"),
        Value::Int(client_id(&mut back))
    );
    assert_eq!(info_of(&mut c, &id, "detached"), Value::Nil);
    assert!(int(info_of(&mut c, &id, "ttl")) > 10_000);
    assert_eq!(fence(&mut c, &a), Some(ta));
    assert_eq!(fence(&mut c, &b), Some(tb));
    assert_eq!(blocked_clients(&mut c), 1, "the waiter is still queued");
    assert_eq!(info_int(&mut c, "lock", "lock_sessions_reattached"), 1);
    assert_eq!(info_int(&mut c, "lock", "lock_sessions_grace_expired"), 0);
    assert_eq!(info_int(&mut c, "lock", "lock_sessions_disconnected"), 0);
    assert_eq!(info_int(&mut c, "lock", "lock_sessions"), 1);
    // Bound again: its keepalives renew as ever, and the hold is handed on when released.
    assert_eq!(keepalive(&mut back, &id), Some(30_000));
    assert_eq!(release(&mut back, &a, "me"), 1);
    assert!(waiter.granted().0 > ta);
}

#[test]
fn without_attach_the_waiter_is_granted_after_the_grace_and_the_lock_delay() {
    const GRACE: u64 = 300;
    const DELAY: u64 = 200;
    let (server, mut c) = start();
    let mut holder = server.conn();
    let id = open(
        &mut holder,
        30_000,
        &["LOCKDELAY", "200", "BOUND", "GRACE", "300"],
    );
    let key = new_key();
    let old = acquire_in(&mut holder, &key, "me", 0, &id, &[]);
    let waiter = Waiter::start(
        &server,
        &mut c,
        "LOCK.ACQUIRE",
        &[&key, "next", "1000", "BLOCK", "20000"],
    );
    let before_kill = Instant::now();
    kill(&mut c, &mut holder);
    let (token, at) = waiter.granted();
    assert!(token > old);
    let waited = at - before_kill;
    // Not a speed assertion: the grace and then the lock-delay must both have been honoured
    // (the server's clock counts whole ms, hence the 2 ms). The upper bound is the 20 s BLOCK
    // and the 30 s ttl: the grant came from the grace's end, long before either.
    assert!(
        waited >= Duration::from_millis(GRACE + DELAY - 2),
        "granted after {waited:?}, before the {GRACE} ms grace and {DELAY} ms lock-delay"
    );
    assert_eq!(keepalive(&mut c, &id), None);
    assert_eq!(info_int(&mut c, "lock", "lock_sessions_detached"), 1);
    assert_eq!(info_int(&mut c, "lock", "lock_sessions_grace_expired"), 1);
    assert_eq!(info_int(&mut c, "lock", "lock_sessions_expired"), 0);
    assert_eq!(info_int(&mut c, "lock", "lock_sessions_disconnected"), 0);
    assert_eq!(info_int(&mut c, "lock", "lock_session_holds_released"), 1);
}

#[test]
fn a_keepalive_while_detached_does_not_extend_it() {
    let (server, mut c) = start();
    let mut holder = server.conn();
    let id = open(&mut holder, 30_000, &["BOUND", "GRACE", "1500"]);
    let key = new_key();
    acquire_in(&mut holder, &key, "me", 0, &id, &[]);
    kill(&mut c, &mut holder);
    wait_until("the session is detached", Duration::from_secs(5), || {
        info_int(&mut c, "lock", "lock_sessions_detached") == 1
    });
    // The keepalive answers what is left of the grace, not the ttl it asked for.
    let left = keepalive(&mut c, &id).expect("still there");
    assert!((1..=1500).contains(&left), "{left}");
    match session(&mut c, "KEEPALIVE", &[&id, "60000"]) {
        Ok(Value::Int(ms)) => assert!((1..=1500).contains(&ms), "{ms}"),
        other => panic!("{other:?}"),
    }
    assert!(int(info_of(&mut c, &id, "ttl")) <= 1500);
    assert_eq!(info_of(&mut c, &id, "bound"), Value::Nil);
    // Kept alive all along, it still ends at the grace's end (well before 30 s).
    wait_until(
        "the grace ends the session",
        Duration::from_secs(10),
        || keepalive(&mut c, &id).is_none(),
    );
    assert_eq!(info_int(&mut c, "lock", "lock_sessions_grace_expired"), 1);
    assert!(acquire(&mut c, &key, "next", 1000).is_some());
    // ATTACH after the grace: the session is gone, nil.
    assert_eq!(session(&mut c, "ATTACH", &[&id]), Ok(Value::Nil));
}

#[test]
fn attach_after_the_grace_is_nil_and_by_another_user_noperm() {
    let (server, mut c) = start();
    redis::cmd("ACL")
        .arg(&["SETUSER", "eve", "on", ">pw", "~*", "&*", "+@all"])
        .query::<()>(&mut c)
        .unwrap();
    let mut eve = server.conn();
    redis::cmd("AUTH")
        .arg("eve")
        .arg("pw")
        .query::<()>(&mut eve)
        .unwrap();
    // Another ACL user cannot take over a detached session, even knowing its id.
    let mut holder = server.conn();
    let id = open(&mut holder, 30_000, &["BOUND", "GRACE", "20000"]);
    let key = new_key();
    let token = acquire_in(&mut holder, &key, "me", 0, &id, &[]);
    kill(&mut c, &mut holder);
    wait_until("the session is detached", Duration::from_secs(5), || {
        info_int(&mut c, "lock", "lock_sessions_detached") == 1
    });
    assert_err(
        session(&mut eve, "ATTACH", &[&id]),
        "NOPERM this session was opened by another ACL user",
    );
    assert_eq!(info_of(&mut c, &id, "bound"), Value::Nil);
    assert!(matches!(info_of(&mut c, &id, "detached"), Value::Int(_)));
    assert_eq!(info_int(&mut c, "lock", "lock_sessions_reattached"), 0);
    let mut back = server.conn();
    assert_eq!(session(&mut back, "ATTACH", &[&id]), Ok(Value::Okay));
    assert_eq!(fence(&mut c, &key), Some(token));
    // A short grace that runs out: ATTACH then finds nothing.
    let mut holder = server.conn();
    let short = open(&mut holder, 30_000, &["BOUND", "GRACE", "100"]);
    kill(&mut c, &mut holder);
    wait_until("the short grace ends", Duration::from_secs(5), || {
        session_info(&mut c, &short).is_none()
    });
    assert_eq!(session(&mut back, "ATTACH", &[&short]), Ok(Value::Nil));
    assert_eq!(info_int(&mut c, "lock", "lock_sessions_grace_expired"), 1);
}

#[test]
fn grace_errors_change_nothing() {
    let (_server, mut c) = start();
    let opened = info_int(&mut c, "lock", "lock_sessions_opened");
    let cases: [(&[&str], &str); 8] = [
        (
            &["1000", "GRACE", "100"],
            "ERR syntax error: GRACE needs BOUND (only a bound session outlives its connection)",
        ),
        (
            &["1000", "LOCKDELAY", "5", "GRACE", "100"],
            "ERR syntax error: GRACE needs BOUND (only a bound session outlives its connection)",
        ),
        (
            &["1000", "BOUND", "GRACE", "-1"],
            "ERR GRACE must be an integer from 0 to 60000",
        ),
        (
            &["100000", "BOUND", "GRACE", "60001"],
            "ERR GRACE must be an integer from 0 to 60000",
        ),
        (
            &["1000", "BOUND", "GRACE", "1001"],
            "ERR GRACE must not be longer than the session's ttl-ms",
        ),
        (
            &["1000", "BOUND", "GRACE", "abc"],
            "ERR GRACE must be an integer from 0 to 60000",
        ),
        (
            &["1000", "BOUND", "GRACE"],
            "ERR syntax error: GRACE needs milliseconds",
        ),
        (
            &["1000", "BOUND", "GRACE", "1", "grace", "2"],
            "ERR syntax error: GRACE given more than once",
        ),
    ];
    for (args, want) in cases {
        let mut all = vec!["OPEN"];
        all.extend_from_slice(args);
        assert_err(call(&mut c, "LOCK.SESSION", &all), want);
    }
    // Inside a script BOUND (so GRACE) is refused, as ever.
    let script = redis::cmd("EVAL")
        .arg("return redis.call('LOCK.SESSION', 'OPEN', 1000, 'BOUND', 'GRACE', 100)")
        .arg(0)
        .query::<Value>(&mut c);
    let text = format!("{script:?}");
    assert!(
        text.contains("BOUND cannot be used from a script or function"),
        "{text}"
    );
    assert_eq!(info_int(&mut c, "lock", "lock_sessions"), 0);
    assert_eq!(info_int(&mut c, "lock", "lock_sessions_opened"), opened);
    // GRACE 0 is today's BOUND: the close ends it at once.
    let mut holder = _server.conn();
    let id = open(&mut holder, 30_000, &["BOUND", "GRACE", "0"]);
    assert_eq!(info_of(&mut c, &id, "grace"), Value::Int(0));
    kill(&mut c, &mut holder);
    wait_until(
        "the session ends with its connection",
        Duration::from_secs(5),
        || keepalive(&mut c, &id).is_none(),
    );
    assert_eq!(info_int(&mut c, "lock", "lock_sessions_disconnected"), 1);
    assert_eq!(info_int(&mut c, "lock", "lock_sessions_detached"), 0);
}

#[test]
fn the_feed_says_detached_then_attached() {
    let (server, mut c) = start();
    let key = new_key();
    let (mut sub, seq) = FeedSubscriber::watching(server.port(), 0, key.as_bytes());
    let mut holder = server.conn();
    let id = open(&mut holder, 30_000, &["BOUND", "GRACE", "10000"]);
    let token = acquire_in(&mut holder, &key, "me", 0, &id, &[]);
    let m = sub.next_message();
    assert_eq!(
        (m.seq, m.event.as_str(), m.token),
        (seq + 1, "acquired", token)
    );
    kill(&mut c, &mut holder);
    let m = sub.next_message();
    assert_eq!(
        (m.seq, m.event.as_str(), m.token, m.owner.as_slice()),
        (seq + 2, "detached", token, &b"me"[..])
    );
    assert!((1..=10_000).contains(&m.ttl), "ttl {}", m.ttl);
    let mut back = server.conn();
    assert_eq!(session(&mut back, "ATTACH", &[&id]), Ok(Value::Okay));
    let m = sub.next_message();
    // The hold has no deadline of its own: -1, as `acquired` says it.
    assert_eq!(
        (m.seq, m.event.as_str(), m.token, m.ttl, m.owner.as_slice()),
        (seq + 3, "attached", token, -1, &b"me"[..])
    );
    // A second blip, then an administrator's KILL: detached, then lost.
    kill(&mut c, &mut back);
    assert_eq!(sub.next_message().event, "detached");
    assert_eq!(info_of(&mut c, &id, "bound"), Value::Nil);
    let serial = serial_of(&mut c, &id);
    assert_eq!(session(&mut c, "KILL", &[&serial]), Ok(Value::Int(1)));
    let m = sub.next_message();
    assert_eq!((m.event.as_str(), m.token), ("lost", token));
}

fn serial_of(c: &mut Connection, id: &str) -> String {
    int(info_of(c, id, "serial")).to_string()
}

#[test]
fn a_replica_learns_the_shortened_deadline_and_the_grace() {
    let primary = Server::start();
    let mut p = primary.conn();
    // Opened before the replica exists: the replica gets it by a full sync (aux data).
    let mut holder = primary.conn();
    let id = open(&mut holder, 60_000, &["BOUND", "GRACE", "3000"]);
    let key = new_key();
    let token = acquire_in(&mut holder, &key, "me", 0, &id, &[]);
    let replica = Server::replica_of(&primary);
    wait_for_replica_sync(&primary, &replica);
    let mut r = replica.conn();
    assert_eq!(info_of(&mut r, &id, "grace"), Value::Int(3000));
    assert!(int(info_of(&mut r, &id, "ttl")) > 3000);
    // Opened after: the replica gets it from the stream (`RESTORE ... grace`).
    let late = open(&mut holder, 60_000, &["BOUND", "GRACE", "2500"]);
    kill(&mut p, &mut holder);
    wait_until("both detached", Duration::from_secs(5), || {
        info_int(&mut p, "lock", "lock_sessions_detached") == 2
    });
    wait_for_replica_sync(&primary, &replica);
    assert_eq!(info_of(&mut r, &late, "grace"), Value::Int(2500));
    let ttl = int(info_of(&mut r, &id, "ttl"));
    assert!((1..=3000).contains(&ttl), "the replica's ttl {ttl}");
    assert!((1..=2500).contains(&int(info_of(&mut r, &late, "ttl"))));
    // A replica never detaches anything itself.
    assert_eq!(info_of(&mut r, &id, "detached"), Value::Nil);
    assert_eq!(fence(&mut r, &key), Some(token));
    // The grace ends on the primary; the replica follows its ENDED.
    wait_until("the replica sees the end", Duration::from_secs(10), || {
        session_info(&mut r, &id).is_none()
    });
    assert_absent(&mut r, &key);
}

/// The grace survives `DEBUG RELOAD` (aux data), a rewrite without the RDB preamble
/// (`RESTORE ... grace` before the first hold) and a restart from the AOF; after the restart the
/// session is unbound until `ATTACH`, and then its grace works again.
#[test]
fn the_grace_survives_reload_rewrite_and_an_aof_restart() {
    let mut server = Server::start_aof_always("no");
    let mut c = server.conn();
    let mut holder = server.conn();
    let id = open(&mut holder, 60_000, &["BOUND", "GRACE", "4000"]);
    let key = new_key();
    let token = acquire_in(&mut holder, &key, "me", 0, &id, &[]);
    redis::cmd("DEBUG")
        .arg("RELOAD")
        .query::<()>(&mut c)
        .unwrap();
    assert_eq!(info_of(&mut c, &id, "grace"), Value::Int(4000));
    assert_eq!(
        info_of(&mut c, &id, "bound"),
        Value::Int(client_id(&mut holder)),
        "DEBUG RELOAD keeps the binding"
    );
    redis::cmd("BGREWRITEAOF").query::<()>(&mut c).unwrap();
    wait_until("the rewrite is done", Duration::from_secs(10), || {
        info_int(&mut c, "persistence", "aof_rewrite_in_progress") == 0
            && info_int(&mut c, "persistence", "aof_rewrite_scheduled") == 0
    });
    server.kill9();
    drop((c, holder));
    server.restart();
    let mut c = server.conn();
    assert_eq!(info_of(&mut c, &id, "grace"), Value::Int(4000));
    assert_eq!(info_of(&mut c, &id, "bound"), Value::Nil);
    assert_eq!(fence(&mut c, &key), Some(token));
    let mut holder = server.conn();
    assert_eq!(session(&mut holder, "ATTACH", &[&id]), Ok(Value::Okay));
    kill(&mut c, &mut holder);
    wait_until("detached after the restart", Duration::from_secs(5), || {
        matches!(info_of(&mut c, &id, "detached"), Value::Int(_))
    });
    assert_eq!(fence(&mut c, &key), Some(token));
}

/// An AOF written by a module from before `GRACE` (`RESTORE` with 7 arguments) still loads:
/// the session has no grace, and its bound connection's close will end it at once.
#[test]
fn an_aof_with_the_old_restore_form_still_loads() {
    let mut server = Server::start_aof_always("no");
    let mut c = server.conn();
    let serial = 4_321_987_654_321u64;
    let id = "{a}0123456789abcdef0123456789abcdef";
    let deadline = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 60_000;
    let args = [
        "LOCK.SESSION".to_string(),
        "RESTORE".into(),
        id.into(),
        serial.to_string(),
        "60000".into(),
        deadline.to_string(),
        "0".into(),
        "1".into(),
        "default".into(),
    ];
    let mut resp = format!("*{}\r\n", args.len());
    for a in &args {
        resp.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    server.kill9();
    drop(c);
    let aof_dir = server.dir().join("appendonlydir");
    let incr = std::fs::read_dir(&aof_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".incr.aof"))
        .expect("an incr AOF file");
    let mut file = std::fs::OpenOptions::new().append(true).open(incr).unwrap();
    file.write_all(resp.as_bytes()).unwrap();
    drop(file);
    server.restart();
    c = server.conn();
    assert_eq!(info_of(&mut c, id, "grace"), Value::Int(0));
    assert_eq!(info_of(&mut c, id, "serial"), Value::Int(serial as i64));
    assert_eq!(info_of(&mut c, id, "bound"), Value::Nil);
    let mut holder = server.conn();
    assert_eq!(session(&mut holder, "ATTACH", &[id]), Ok(Value::Okay));
    kill(&mut c, &mut holder);
    wait_until(
        "no grace: the close ends it",
        Duration::from_secs(5),
        || keepalive(&mut c, id).is_none(),
    );
}

#[test]
fn a_narrow_acl_user_opens_and_reattaches_a_session_with_a_grace() {
    let (server, mut c) = start();
    redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "app",
            "on",
            ">pw",
            "resetkeys",
            "~lock:*",
            "&*",
            "+@all",
            "-@admin",
        ])
        .query::<()>(&mut c)
        .unwrap();
    let login = |conn: &mut Connection| {
        redis::cmd("AUTH")
            .arg("app")
            .arg("pw")
            .query::<()>(conn)
            .unwrap()
    };
    let mut holder = server.conn();
    login(&mut holder);
    let id = open(&mut holder, 30_000, &["BOUND", "GRACE", "10000"]);
    let key = format!("lock:{}", new_key());
    let token = acquire_in(&mut holder, &key, "me", 0, &id, &[]);
    assert_err_code(
        acquire_with(&mut holder, &new_key(), "me", 0, &["SESSION", &id]),
        "NOPERM",
    );
    kill(&mut c, &mut holder);
    wait_until("the session is detached", Duration::from_secs(5), || {
        info_int(&mut c, "lock", "lock_sessions_detached") == 1
    });
    let mut back = server.conn();
    login(&mut back);
    assert_eq!(session(&mut back, "ATTACH", &[&id]), Ok(Value::Okay));
    assert_eq!(fence(&mut back, &key), Some(token));
    assert_eq!(
        info_of(&mut back, &id, "bound"),
        Value::Int(client_id(&mut back))
    );
    assert_eq!(info_int(&mut c, "lock", "lock_sessions_reattached"), 1);
}
