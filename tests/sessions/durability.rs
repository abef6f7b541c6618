//! Sessions and their holds across restarts (RDB, AOF with and without the RDB preamble, AOF
//! rewrite), `DEBUG RELOAD`, replication and promotion. Client ids restart with every process:
//! after a restart or a promotion a `BOUND` session is unbound and lives by its ttl until a
//! connection `ATTACH`es it.

use super::*;

/// A session with two holds (one with no deadline of its own) and an empty session, opened on
/// `c`; returns (session with holds, empty session, keys, tokens).
fn sessions_to_keep(c: &mut Connection) -> (String, String, [String; 2], [i64; 2]) {
    let id = open(c, 60_000, &["BOUND", "LOCKDELAY", "100"]);
    let empty = open(c, 60_000, &[]);
    let keys = [new_key(), new_key()];
    let tokens = [
        acquire_in(c, &keys[0], "me", 0, &id, &[]),
        acquire_in(c, &keys[1], "me", 50_000, &id, &["SHARED", "LIMIT", "4"]),
    ];
    (id, empty, keys, tokens)
}

/// After a restart: the sessions are there, unbound, with their deadlines; the holds are
/// there with their tokens and still the session's (CLOSE releases both).
#[track_caller]
fn assert_kept(c: &mut Connection, id: &str, keys: &[String; 2], tokens: [i64; 2], what: &str) {
    assert_eq!(info_of(c, id, "bound"), Value::Nil, "{what}: still bound");
    assert_eq!(info_of(c, id, "holds"), Value::Int(2), "{what}");
    assert_eq!(info_of(c, id, "lockdelay"), Value::Int(100), "{what}");
    let Value::Int(ttl) = info_of(c, id, "ttl") else {
        panic!()
    };
    assert!((1..60_000).contains(&ttl), "{what}: ttl {ttl}");
    assert_eq!(fence(c, &keys[0]), Some(tokens[0]), "{what}");
    assert_eq!(fence(c, &keys[1]), Some(tokens[1]), "{what}");
    assert_eq!(pttl(c, &keys[0]), -1, "{what}");
}

#[test]
fn sessions_survive_an_rdb_restart_unbound_and_attach_binds_again() {
    let mut server = Server::start();
    let mut c = server.conn();
    let (id, empty, keys, tokens) = sessions_to_keep(&mut c);
    redis::cmd("SAVE").query::<()>(&mut c).unwrap();
    server.kill9();
    drop(c);
    server.restart();
    let mut c = server.conn();
    assert_kept(&mut c, &id, &keys, tokens, "RDB restart");
    assert!(
        keepalive(&mut c, &empty).is_some(),
        "the empty session was lost"
    );
    // ATTACH binds it to this connection; closing it then ends the session.
    let mut attached = server.conn();
    assert_eq!(session(&mut attached, "ATTACH", &[&id]), Ok(Value::Okay));
    assert_eq!(
        info_of(&mut c, &id, "bound"),
        Value::Int(client_id(&mut attached))
    );
    drop(attached);
    wait_until(
        "the attached connection's close ends the session",
        Duration::from_secs(5),
        || keepalive(&mut c, &id).is_none(),
    );
    // After the session's 100 ms lock-delay.
    wait_until("the lock-delay ends", Duration::from_secs(5), || {
        exists(&mut c, &keys[1]) == 0
    });
    // Tokens after the restart stay above the ones before.
    assert!(must_acquire(&mut c, &keys[1], "next", 1000) > tokens[1]);
}

#[test]
fn sessions_survive_aof_restarts_and_rewrites() {
    for preamble in ["yes", "no"] {
        let mut server = Server::start_aof_always(preamble);
        let mut c = server.conn();
        let (id, empty, keys, tokens) = sessions_to_keep(&mut c);
        // A keepalive and an ended session, replayed from the AOF as they happened.
        assert!(keepalive(&mut c, &id).is_some());
        let gone = open(&mut c, 60_000, &[]);
        let gone_key = new_key();
        acquire_in(&mut c, &gone_key, "me", 0, &gone, &[]);
        assert_eq!(session(&mut c, "CLOSE", &[&gone]), Ok(Value::Int(1)));
        // Killed with the bound connection open: the session is not ended by a disconnect.
        server.kill9();
        drop(c);
        server.restart();
        let mut c = server.conn();
        let what = format!("AOF restart (preamble {preamble})");
        assert_kept(&mut c, &id, &keys, tokens, &what);
        assert!(
            keepalive(&mut c, &empty).is_some(),
            "{what}: the empty session"
        );
        assert_eq!(keepalive(&mut c, &gone), None, "{what}");
        assert_absent(&mut c, &gone_key);

        wait_no_aof_rewrite(&server);
        redis::cmd("BGREWRITEAOF").query::<String>(&mut c).unwrap();
        wait_no_aof_rewrite(&server);
        assert_eq!(
            server
                .info_field("persistence", "aof_last_bgrewrite_status")
                .as_deref(),
            Some("ok")
        );
        server.kill9();
        drop(c);
        server.restart();
        let mut c = server.conn();
        let what = format!("AOF rewrite (preamble {preamble})");
        assert_kept(&mut c, &id, &keys, tokens, &what);
        // A session with no holds is written in the RDB preamble's aux data; a rewrite
        // without the preamble has no place for it (docs/commands.md says so).
        assert_eq!(
            keepalive(&mut c, &empty).is_some(),
            preamble == "yes",
            "{what}: the empty session"
        );
        assert_eq!(
            session(&mut c, "CLOSE", &[&id]),
            Ok(Value::Int(2)),
            "{what}"
        );
    }
}

#[test]
fn debug_reload_keeps_the_binding() {
    let (server, mut c) = start();
    let mut holder = server.conn();
    let (id, _, keys, tokens) = sessions_to_keep(&mut holder);
    let bound = client_id(&mut holder);
    redis::cmd("DEBUG")
        .arg("RELOAD")
        .query::<()>(&mut c)
        .unwrap();
    assert_eq!(info_of(&mut c, &id, "bound"), Value::Int(bound));
    assert_eq!(info_of(&mut c, &id, "holds"), Value::Int(2));
    assert_eq!(fence(&mut c, &keys[0]), Some(tokens[0]));
    drop(holder);
    wait_until(
        "the bound connection's close ends the session",
        Duration::from_secs(5),
        || keepalive(&mut c, &id).is_none(),
    );
    drop(server);
}

#[test]
fn a_replica_follows_and_a_promoted_replica_keeps_every_session() {
    let (primary, replica) = primary_and_replica(&[]);
    let mut p = primary.conn();
    let mut holder = primary.conn();
    let (id, empty, keys, tokens) = sessions_to_keep(&mut holder);
    let ended = open(&mut p, 60_000, &["BOUND"]);
    let ended_key = new_key();
    acquire_in(&mut p, &ended_key, "me", 0, &ended, &[]);
    // `ended` is bound to `p`: end it by closing `p` after everything reached the replica.
    let victim = client_id(&mut p);
    let mut ctl = primary.conn();
    redis::cmd("CLIENT")
        .arg(&["KILL", "ID", &victim.to_string()])
        .query::<i64>(&mut ctl)
        .unwrap();
    wait_until("the session ended", Duration::from_secs(5), || {
        keepalive(&mut ctl, &ended).is_none()
    });
    wait_for_replica_sync(&primary, &replica);
    let mut r = replica.conn();
    // The replica has the holds, as session holds, and not the ended session's.
    assert_eq!(fence(&mut r, &keys[0]), Some(tokens[0]));
    assert_eq!(
        lock_info_field(&mut r, &keys[0], "ttl"),
        Some(Value::Int(-1))
    );
    assert_absent(&mut r, &ended_key);
    // Promoted: every session is there with its deadline, unbound.
    drop(ctl);
    promote(&replica);
    assert_kept(&mut r, &id, &keys, tokens, "promotion");
    assert!(keepalive(&mut r, &empty).is_some());
    assert_eq!(keepalive(&mut r, &ended), None);
    assert_eq!(session(&mut r, "CLOSE", &[&id]), Ok(Value::Int(2)));
    drop(holder);
}

#[test]
fn a_replica_never_ends_a_session_by_its_own_clock() {
    let (primary, replica) = primary_and_replica(&[]);
    let mut p = primary.conn();
    let id = open(&mut p, 400, &[]);
    let key = new_key();
    let token = acquire_in(&mut p, &key, "me", 0, &id, &[]);
    wait_for_replica_sync(&primary, &replica);
    // The primary stops (no ENDED can come); the session's deadline passes on the replica.
    primary.signal("STOP");
    thread::sleep(Duration::from_millis(800));
    let mut r = replica.conn();
    assert_eq!(
        fence(&mut r, &key),
        Some(token),
        "the replica ended the session itself"
    );
    // Promoted, it ends the session by its own clock now: the deadline has passed.
    promote(&replica);
    wait_until(
        "the promoted replica expires the session",
        Duration::from_secs(5),
        || keepalive(&mut r, &id).is_none(),
    );
    assert_absent(&mut r, &key);
    primary.signal("CONT");
}
