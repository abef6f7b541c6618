//! Client pauses: nothing is written while writes are paused, and a session never expires
//! because its keepalive was held back by a pause longer than its ttl.

use super::*;

#[test]
fn a_pause_longer_than_the_ttl_does_not_end_a_session() {
    let server = Server::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut c = server.conn();
    let key = new_key();
    let id = open(&mut c, 10_000, &[]);
    acquire_in(&mut c, &key, "me", 0, &id, &[]);
    // From now on the session lives 300 ms past each keepalive.
    assert_eq!(
        session(&mut c, "KEEPALIVE", &[&id, "300"]),
        Ok(Value::Int(300))
    );
    let token = fence(&mut c, &key).unwrap();
    // The holder keeps sending keepalives through the pause: the server holds them back.
    let mut client = server.conn();
    let keeper_id = id.clone();
    let keeper = thread::spawn(move || {
        let mut replies = vec![];
        for _ in 0..8 {
            replies.push(keepalive(&mut client, &keeper_id));
            thread::sleep(Duration::from_millis(100));
        }
        replies
    });
    redis::cmd("CLIENT")
        .arg(&["PAUSE", "1200", "WRITE"])
        .query::<()>(&mut c)
        .unwrap();
    // During the pause the session is past its deadline and nothing may be written.
    let offset = aof_size(&mut c);
    thread::sleep(Duration::from_millis(900));
    assert_eq!(aof_size(&mut c), offset);
    assert_eq!(
        fence(&mut c, &key),
        Some(token),
        "the hold is there during the pause"
    );
    let replies = keeper.join().unwrap();
    assert!(
        replies.iter().all(Option::is_some),
        "a keepalive found no session: {replies:?}"
    );
    assert_eq!(fence(&mut c, &key), Some(token));
    assert_eq!(info_int(&mut c, "lock", "lock_sessions_expired"), 0);
    // Without keepalives it expires as usual.
    wait_until("the session expires", Duration::from_secs(5), || {
        session_info(&mut c, &id).is_none()
    });
    assert_absent(&mut c, &key);
}

#[test]
fn a_disconnect_during_a_pause_ends_the_session_after_it() {
    let server = Server::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut c = server.conn();
    let key = new_key();
    let mut holder = server.conn();
    let id = open(&mut holder, 30_000, &["BOUND"]);
    acquire_in(&mut holder, &key, "holder", 0, &id, &[]);
    let waiter = Waiter::start(
        &server,
        &mut c,
        "LOCK.ACQUIRE",
        &[&key, "next", "1000", "BLOCK", "20000"],
    );
    let victim = client_id(&mut holder);
    let offset = aof_size(&mut c);
    let mut tx = redis::pipe();
    tx.atomic()
        .cmd("CLIENT")
        .arg(&["PAUSE", "600", "WRITE"])
        .ignore()
        .cmd("CLIENT")
        .arg(&["KILL", "ID", &victim.to_string()])
        .ignore();
    tx.query::<()>(&mut c).unwrap();
    let paused = Instant::now();
    thread::sleep(Duration::from_millis(300));
    assert_eq!(aof_size(&mut c), offset);
    let (_, at) = waiter.granted();
    assert!(
        at - paused >= Duration::from_millis(500),
        "granted during the pause"
    );
}

/// What the AOF holds: anything written during the pause would grow it.
fn aof_size(c: &mut Connection) -> i64 {
    info_int(c, "persistence", "aof_current_size")
}
