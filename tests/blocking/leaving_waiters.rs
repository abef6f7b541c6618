//! Waiters that leave (disconnect, `CLIENT KILL`, `CLIENT UNBLOCK`) are skipped by the handoff.

use super::*;

#[test]
fn disconnected_waiter_is_skipped() {
    let (server, mut c, key, holder_token) = held_key();

    let gone = raw_waiter(&server, &mut c, &key, "gone", "0");
    let next = Waiter::start(&server, &mut c, &key, "next", WAITER_TTL, "0");
    drop(gone);
    wait_blocked(&mut c, 1);

    release_to(&mut c, &key, "holder", next, holder_token);
    assert_eq!(release(&mut c, &key, "gone"), 0);

    // The disconnected waiter is not queued any more either: the key is freed.
    release_last(&mut c, &key, "next");
}

#[test]
fn disconnected_only_waiter_leaves_the_key_free_after_release() {
    let (server, mut c, key, _) = held_key();

    let gone = raw_waiter(&server, &mut c, &key, "gone", "0");
    drop(gone);
    wait_blocked(&mut c, 0);

    release_last(&mut c, &key, "holder");
}

#[test]
fn client_killed_waiter_is_skipped() {
    let (server, mut c, key, holder_token) = held_key();

    let killed = Waiter::start(&server, &mut c, &key, "killed", WAITER_TTL, "0");
    let next = Waiter::start(&server, &mut c, &key, "next", WAITER_TTL, "0");
    assert_eq!(
        call(&mut c, "CLIENT", &["KILL", "ID", &killed.id.to_string()]),
        Ok(Value::Int(1))
    );
    match killed.reply().0 {
        Err(e) if e.is_io_error() || e.is_connection_dropped() => {}
        other => panic!("killed waiter: expected its connection closed, got {other:?}"),
    }
    wait_blocked(&mut c, 1);

    release_to(&mut c, &key, "holder", next, holder_token);
    assert_eq!(release(&mut c, &key, "killed"), 0);
    release_last(&mut c, &key, "next");
}

#[test]
fn client_unblock_gives_nil_or_error_and_leaves_the_queue() {
    let (server, mut c, key, holder_token) = held_key();

    let plain = Waiter::start(&server, &mut c, &key, "plain", WAITER_TTL, "0");
    let timeout = Waiter::start(&server, &mut c, &key, "timeout", WAITER_TTL, "0");
    let error = Waiter::start(&server, &mut c, &key, "error", WAITER_TTL, "0");
    let last = Waiter::start(&server, &mut c, &key, "last", WAITER_TTL, "0");

    let id = plain.id.to_string();
    assert_eq!(call(&mut c, "CLIENT", &["UNBLOCK", &id]), Ok(Value::Int(1)));
    assert_eq!(plain.reply().0, Ok(Value::Nil), "CLIENT UNBLOCK {id}");
    wait_blocked(&mut c, 3);

    let id = timeout.id.to_string();
    assert_eq!(
        call(&mut c, "CLIENT", &["UNBLOCK", &id, "TIMEOUT"]),
        Ok(Value::Int(1))
    );
    assert_eq!(
        timeout.reply().0,
        Ok(Value::Nil),
        "CLIENT UNBLOCK {id} TIMEOUT"
    );
    wait_blocked(&mut c, 2);

    let id = error.id.to_string();
    assert_eq!(
        call(&mut c, "CLIENT", &["UNBLOCK", &id, "ERROR"]),
        Ok(Value::Int(1))
    );
    assert_err_code(error.reply().0, "UNBLOCKED");
    wait_blocked(&mut c, 1);
    assert_held(&mut c, &key, holder_token, LONG_TTL);

    // None of the unblocked clients is still queued: the last one gets the lock,
    // and after it nobody.
    release_to(&mut c, &key, "holder", last, holder_token);
    release_last(&mut c, &key, "last");
}

/// `CLIENT UNBLOCK` in the event-loop turn that granted the waiter (one pipeline: the release
/// that hands it the lock, then the unblock; the server answers the unblock 1, as the client is
/// still flagged blocked). Redis 7.4+ and Valkey 8+ skip such a client and it gets its token.
/// Older servers drop its reply and answer it nothing at all; there the module closes its
/// connection (an error at once, not a wait forever) and revokes the grant, which goes on to
/// the next waiter. Seen as a `calls-answered` violation of the torture suite on Redis 7.0.15.
#[test]
fn client_unblock_in_the_turn_of_a_grant_never_leaves_the_waiter_unanswered() {
    let (server, mut c, key, holder_token) = held_key();
    let (raced, next) = release_and_unblock_in_one_turn(&server, &mut c, &key, None);
    let id = raced.id;

    if drops_raced_replies(&server) {
        match raced.reply().0 {
            Err(e) if e.is_io_error() || e.is_connection_dropped() => {}
            other => panic!("raced waiter: expected its connection closed, got {other:?}"),
        }
        let token = next.token();
        assert!(token > holder_token, "next: {token} <= {holder_token}");
        assert_fresh_grant(&mut c, &key, token);
        let log = server.log();
        assert!(
            log.contains(&format!("closed client id {id}: CLIENT UNBLOCK reached it")),
            "no notice of the close in the log:\n{log}"
        );
    } else {
        let token = raced.token();
        assert!(token > holder_token, "raced: {token} <= {holder_token}");
        assert_held(&mut c, &key, token, WAITER_TTL);
        release_to(&mut c, &key, "raced", next, token);
    }
    release_last(&mut c, &key, "next");
}

/// The same race with `CLIENT UNBLOCK ... ERROR`: on every server the waiter reads the
/// `UNBLOCKED` error and the grant it never heard of goes on to the next waiter.
#[test]
fn client_unblock_error_in_the_turn_of_a_grant_answers_unblocked_and_revokes() {
    let (server, mut c, key, holder_token) = held_key();
    let (raced, next) = release_and_unblock_in_one_turn(&server, &mut c, &key, Some("ERROR"));
    assert_err_code(raced.reply().0, "UNBLOCKED");
    let token = next.token();
    assert!(token > holder_token, "next: {token} <= {holder_token}");
    assert_fresh_grant(&mut c, &key, token);
    assert_eq!(release(&mut c, &key, "raced"), 0);
    release_last(&mut c, &key, "next");
}

/// Queue waiters `raced` then `next` behind `holder`, then send `LOCK.RELEASE` (which grants
/// `raced`) and `CLIENT UNBLOCK raced [reason]` in one pipeline, so that the server reads and runs
/// both in one event-loop turn; both answer 1.
fn release_and_unblock_in_one_turn(
    server: &Server,
    c: &mut Connection,
    key: &str,
    reason: Option<&str>,
) -> (Waiter, Waiter) {
    let raced = Waiter::start(server, c, key, "raced", WAITER_TTL, "0");
    let next = Waiter::start(server, c, key, "next", WAITER_TTL, "0");
    let mut pipe = redis::pipe();
    pipe.cmd("LOCK.RELEASE").arg(key).arg("holder");
    pipe.cmd("CLIENT").arg("UNBLOCK").arg(raced.id).arg(reason);
    let replies: (i64, i64) = pipe.query(c).expect("pipeline");
    assert_eq!(
        replies,
        (1, 1),
        "LOCK.RELEASE, CLIENT UNBLOCK {} {reason:?}",
        raced.id
    );
    (raced, next)
}

/// Redis before 7.4 and Valkey before 8 drop the reply of a module-blocked client that
/// `CLIENT UNBLOCK` reaches in the turn the module unblocked it (redis/redis#13015).
fn drops_raced_replies(server: &Server) -> bool {
    let release = |field: &str| {
        let v = server.info_field("server", field)?;
        let mut parts = v
            .split('.')
            .map(|p| p.parse::<u32>().expect("numeric version"));
        Some((parts.next()?, parts.next()?))
    };
    match release("valkey_version") {
        Some(valkey) => valkey < (8, 0),
        None => release("redis_version").expect("redis_version") < (7, 4),
    }
}
