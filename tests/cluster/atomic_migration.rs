//! Valkey 9's atomic slot migration (`CLUSTER MIGRATESLOTS`) of a slot holding a plain lock with
//! a queued waiter, a semaphore and a session hold. On a server without it the test says so and
//! checks nothing (`make test-asm` runs it on Valkey 9.1).

use std::io::Write;

use harness::feed::{FeedSubscriber, Resp};

use super::*;

/// `valkey_version` major of the server under test, from `--version` ("Valkey server v=9.1.2").
fn valkey_major() -> Option<u32> {
    let out = Command::new(nodes::server_bin())
        .arg("--version")
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let version = text.strip_prefix("Valkey server v=")?;
    version.split('.').next()?.parse().ok()
}

/// Milliseconds since the epoch, the clock the server's deadlines are in (same machine).
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// `PEXPIRETIME key`: the absolute deadline of the key, -1 none, -2 no key.
fn pexpiretime(conn: &mut Connection, key: &str) -> i64 {
    redis::cmd("PEXPIRETIME")
        .arg(key)
        .query(conn)
        .expect("PEXPIRETIME")
}

/// The holders in `LOCK.INFO key`: (owner, token, in a session), in grant order.
fn holders(conn: &mut Connection, key: &str) -> Vec<(String, i64, bool)> {
    let items = match run(conn, &["LOCK.INFO", key]) {
        Ok(Value::Array(items)) => items,
        other => panic!("LOCK.INFO {key}: {}", reply_text(other)),
    };
    let Some(Value::Array(list)) = items
        .chunks(2)
        .find(|kv| kv[0] == Value::BulkString(b"holders".to_vec()))
        .map(|kv| kv[1].clone())
    else {
        panic!("LOCK.INFO {key}: no holders field in {items:?}")
    };
    list.iter()
        .map(|h| {
            let Value::Array(fields) = h else {
                panic!("LOCK.INFO {key}: holder {h:?}")
            };
            let field = |name: &str| {
                fields
                    .chunks(2)
                    .find(|kv| kv[0] == Value::BulkString(name.as_bytes().to_vec()))
                    .map(|kv| kv[1].clone())
            };
            let owner = match field("owner") {
                Some(Value::BulkString(o)) => String::from_utf8(o).unwrap(),
                other => panic!("LOCK.INFO {key}: owner {other:?}"),
            };
            let token = match field("token") {
                Some(Value::Int(t)) => t,
                other => panic!("LOCK.INFO {key}: token {other:?}"),
            };
            (owner, token, field("session") == Some(Value::Int(1)))
        })
        .collect()
}

fn token_of(reply: RedisResult<Value>, what: &str) -> i64 {
    match reply {
        Ok(Value::Int(t)) => t,
        other => panic!("{what}: expected a token, got {}", reply_text(other)),
    }
}

/// True (and said on stderr) when the server under test has no atomic slot migration.
fn skipped(test: &str) -> bool {
    if valkey_major().is_some_and(|major| major >= 9) {
        return false;
    }
    // Straight to stderr, not through println!: the test harness captures that, and the
    // suite's log must show that nothing was checked here.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test}: {} has no CLUSTER MIGRATESLOTS (Valkey 9.0+); run it with \
         REDIS_SERVER set to Valkey 9.1 (make test-asm)",
        nodes::server_bin()
    );
    true
}

fn open_session(conn: &mut Connection, ttl: &str) -> String {
    match run(conn, &["LOCK.SESSION", "OPEN", ttl]) {
        Ok(Value::BulkString(id)) => String::from_utf8(id).unwrap(),
        other => panic!("OPEN: {}", reply_text(other)),
    }
}

#[test]
fn atomic_slot_migration_moves_holds_answers_waiters_and_caps_session_holds() {
    if skipped("atomic_slot_migration") {
        return;
    }
    let _turn = one_at_a_time();
    let cluster = Cluster::start();
    let mut any = cluster.nodes[0].conn();
    let (src, dst) = (0, 1);
    let mut a = cluster.master(src);
    let mut b = cluster.master(dst);
    let src_node = cluster.master_node(src);
    let dst_id = cluster.shards[dst].master_id.clone();

    // Three keys in one slot of the source: a lock with a waiter, a semaphore, a session hold.
    let tag = &cluster.keys_on(&mut any, src, 1, "asm")[0];
    let slot = keyslot(&mut any, tag);
    let (plain, sem, held) = (
        format!("{{{tag}}}:plain"),
        format!("{{{tag}}}:sem"),
        format!("{{{tag}}}:session"),
    );
    let t_plain = must_acquire(&mut a, &plain, "holder", LONG_TTL);
    let t_r1 = token_of(
        run(
            &mut a,
            &["LOCK.ACQUIRE", &sem, "r1", "100000", "SHARED", "LIMIT", "2"],
        ),
        "r1",
    );
    let t_r2 = token_of(
        run(
            &mut a,
            &["LOCK.ACQUIRE", &sem, "r2", "100000", "SHARED", "LIMIT", "2"],
        ),
        "r2",
    );
    let session_ttl = 15_000;
    let opened_at = now_ms();
    let id = match run(&mut a, &["LOCK.SESSION", "OPEN", &session_ttl.to_string()]) {
        Ok(Value::BulkString(id)) => String::from_utf8(id).unwrap(),
        other => panic!("OPEN: {}", reply_text(other)),
    };
    // The session's deadline is no later than this (the server read its clock after ours).
    let session_deadline_max = now_ms() + session_ttl;
    assert_ne!(
        keyslot(&mut any, &id),
        slot,
        "the session id landed in the migrated slot"
    );
    let t_held = token_of(
        run(&mut a, &["LOCK.ACQUIRE", &held, "me", "0", "SESSION", &id]),
        "session hold",
    );
    assert_eq!(
        pexpiretime(&mut a, &held),
        -1,
        "a session hold has no deadline of its own"
    );
    // A second session, without holds, whose id's own slot moves too: its id then routes to
    // the target, which does not know it.
    let other = match run(&mut a, &["LOCK.SESSION", "OPEN", "60000"]) {
        Ok(Value::BulkString(id)) => String::from_utf8(id).unwrap(),
        other => panic!("OPEN: {}", reply_text(other)),
    };
    let other_slot = keyslot(&mut any, &other);
    // A fourth session, with no hold: it may not take one in the slot while it migrates, and
    // its waiter queued there is answered when the migration starts.
    let late = match run(&mut a, &["LOCK.SESSION", "OPEN", "20000"]) {
        Ok(Value::BulkString(id)) => String::from_utf8(id).unwrap(),
        other => panic!("OPEN: {}", reply_text(other)),
    };
    let late_key = format!("{{{tag}}}:late");
    let session_waiter = {
        let (port, sem, late) = (src_node.port(), sem.clone(), late.clone());
        thread::spawn(move || {
            let mut conn = nodes::connect(port);
            conn.set_read_timeout(Some(PATIENCE)).unwrap();
            reply_text(run(
                &mut conn,
                &[
                    "LOCK.ACQUIRE",
                    &sem,
                    "r3",
                    "0",
                    "SHARED",
                    "LIMIT",
                    "2",
                    "BLOCK",
                    "60000",
                    "SESSION",
                    &late,
                ],
            ))
        })
    };
    // A third session, whose hold is closed while the migration streams.
    let closing = match run(&mut a, &["LOCK.SESSION", "OPEN", "60000"]) {
        Ok(Value::BulkString(id)) => String::from_utf8(id).unwrap(),
        other => panic!("OPEN: {}", reply_text(other)),
    };
    let closed = format!("{{{tag}}}:closed");
    token_of(
        run(
            &mut a,
            &["LOCK.ACQUIRE", &closed, "me", "0", "SESSION", &closing],
        ),
        "the hold closed during the migration",
    );
    wait_blocked(&mut a, 1);
    // A watcher of the plain lock's feed on the source.
    let mut watcher = cluster.master(src);
    let channel = match run(&mut watcher, &["LOCK.WATCH", &plain]) {
        Ok(Value::Array(v)) => match &v[0] {
            Value::BulkString(ch) => ch.clone(),
            other => panic!("LOCK.WATCH: {other:?}"),
        },
        other => panic!("LOCK.WATCH: {}", reply_text(other)),
    };
    let mut feed = FeedSubscriber::listen(src_node.port(), &channel);
    let waiter = spawn_waiter(src_node.port(), &plain, "w1", 60_000, false);
    wait_blocked(&mut a, 2);
    let deadlines = (pexpiretime(&mut a, &plain), pexpiretime(&mut a, &sem));

    // On main this is refused: "The module lock does not support atomic slot migrations".
    let (slot_arg, other_arg) = (slot.to_string(), other_slot.to_string());
    let mut migrate = vec![
        "CLUSTER",
        "MIGRATESLOTS",
        "SLOTSRANGE",
        &slot_arg,
        &slot_arg,
    ];
    if other_slot != slot {
        migrate.extend([other_arg.as_str(), other_arg.as_str()]);
    }
    migrate.extend(["NODE", dst_id.as_str()]);
    // Held open after its snapshot (the source does not pause writes to hand the slots over)
    // while a session with a hold there is closed on the source.
    assert_eq!(
        reply_text(run(
            &mut a,
            &["DEBUG", "SLOTMIGRATION", "PREVENT-PAUSE", "1"]
        )),
        "OK"
    );
    assert_eq!(reply_text(run(&mut a, &migrate)), "OK");
    nodes::wait_for(
        "the migration to stream after its snapshot",
        PATIENCE,
        || {
            reply_text(run(&mut a, &["CLUSTER", "GETSLOTMIGRATIONS"]))
                .contains("waiting-to-pause")
                .then_some(())
        },
    );
    assert_eq!(
        reply_text(run(&mut a, &["LOCK.SESSION", "CLOSE", &closing])),
        "1"
    );
    let refused = "TRYAGAIN the key's slot is migrating to another node: no session may take a \
                   hold in it now; retry";
    assert_eq!(
        reply_text(run(
            &mut a,
            &["LOCK.ACQUIRE", &late_key, "me", "0", "SESSION", &late]
        )),
        refused
    );
    assert_eq!(
        reply_text(run(
            &mut a,
            &["LOCK.MACQUIRE", "1", &late_key, "me", "0", "SESSION", &late]
        )),
        refused
    );
    assert_eq!(session_waiter.join().unwrap(), refused);
    assert_eq!(reply_text(run(&mut a, &["EXISTS", &late_key])), "0");
    assert_eq!(
        reply_text(run(
            &mut a,
            &["DEBUG", "SLOTMIGRATION", "PREVENT-PAUSE", "0"]
        )),
        "OK"
    );
    let dst_port = cluster.master_node(dst).port();
    cluster.wait_converged(|view| {
        view.iter()
            .any(|n| n.port == dst_port && n.slots.iter().any(|&(x, y)| (x..=y).contains(&slot)))
    });
    nodes::wait_for("the slot's keys to leave the source", PATIENCE, || {
        (keys_in_slot(&mut a, slot) == 0).then_some(())
    });

    // The hold whose session was closed on the source during the migration did not arrive
    // (the release reached the target in the migration's stream); the other three did.
    assert_eq!(reply_text(run(&mut b, &["LOCK.INFO", &closed])), "nil");
    assert_eq!(keys_in_slot(&mut b, slot), 3);
    // The feed's subscriber on the source is unsubscribed by the server when the slot goes (no
    // message about the lock comes first): it must subscribe again on the new node.
    assert_eq!(
        feed.read_within(PATIENCE),
        Some(Resp::Array(vec![
            Resp::Bulk(b"sunsubscribe".to_vec()),
            Resp::Bulk(channel.clone()),
            Resp::Int(0),
        ]))
    );

    // The waiter on the source: told to retry, never granted there.
    let (reply, _) = waiter.recv_timeout(PROMPT).expect("the waiter's answer");
    assert_eq!(
        reply_text(reply),
        "TRYAGAIN the lock key's slot moved to another node while the client waited; retry"
    );
    assert_eq!(blocked_clients(&mut a), 0);

    // Owners, tokens and deadlines as they were.
    assert_eq!(
        holders(&mut b, &plain),
        vec![("holder".into(), t_plain, false)]
    );
    assert_eq!(
        holders(&mut b, &sem),
        vec![("r1".into(), t_r1, false), ("r2".into(), t_r2, false)]
    );
    assert_eq!(
        (pexpiretime(&mut b, &plain), pexpiretime(&mut b, &sem)),
        deadlines
    );
    assert_eq!(
        reply_text(run(
            &mut b,
            &["LOCK.ACQUIRE", &sem, "r3", "1000", "SHARED", "LIMIT", "2"]
        )),
        "nil",
        "the semaphore's limit moved with it"
    );

    // The session hold: same owner and token, now a plain hold that ends no later than its
    // session's deadline (the session stays on the source, which the target never hears from).
    assert_eq!(holders(&mut b, &held), vec![("me".into(), t_held, false)]);
    let capped = pexpiretime(&mut b, &held);
    assert!(
        capped > 0 && capped <= session_deadline_max,
        "the moved session hold's deadline {capped} (session deadline <= \
         {session_deadline_max}, opened at {opened_at})"
    );
    assert_eq!(nodes::info_int(&mut b, "lock", "lock_sessions"), 0);
    // The target's replica applies the same stream and events: the same holds and deadlines.
    let mut br = cluster.replica(dst);
    assert_eq!(reply_text(run(&mut br, &["READONLY"])), "OK");
    nodes::wait_for(
        "the target's replica to have the slot's keys",
        PATIENCE,
        || (keys_in_slot(&mut br, slot) == 3).then_some(()),
    );
    for key in [&plain, &sem, &held] {
        assert_eq!(
            holders(&mut br, key),
            holders(&mut b, key),
            "{key} on the replica"
        );
        assert_eq!(
            pexpiretime(&mut br, key),
            pexpiretime(&mut b, key),
            "{key} on the replica"
        );
    }
    assert_eq!(nodes::info_int(&mut br, "lock", "lock_sessions"), 0);
    assert_eq!(
        reply_text(run(&mut b, &["LOCK.SESSION", "KEEPALIVE", &id])),
        format!("MOVED {} {}", keyslot(&mut any, &id), src_node.addr()),
        "the target did not take the session over"
    );

    assert_eq!(
        reply_text(run(&mut a, &["LOCK.SESSION", "KEEPALIVE", &other])),
        format!("MOVED {other_slot} {}", cluster.master_node(dst).addr())
    );
    assert_eq!(
        reply_text(run(&mut b, &["LOCK.SESSION", "KEEPALIVE", &other])),
        "nil",
        "a session whose id's slot moved is lost to its client"
    );

    // A new grant on the target gets a larger token than any moved one, also on a moved key.
    let t_new = token_of(
        run(
            &mut b,
            &["LOCK.ACQUIRE", &format!("{{{tag}}}:new"), "x", "10000"],
        ),
        "new",
    );
    assert!(
        t_new > t_plain.max(t_r2).max(t_held),
        "{t_new} after {t_plain}/{t_r2}/{t_held}"
    );
    assert_eq!(release(&mut b, &plain, "holder"), 1);
    let t_next = must_acquire(&mut b, &plain, "w1", LONG_TTL);
    assert!(t_next > t_new, "{t_next} after {t_new}");

    // The session, closed on its own node: the moved hold is gone by the session's deadline.
    assert_eq!(
        reply_text(run(&mut a, &["LOCK.SESSION", "CLOSE", &id])),
        "0"
    );
    nodes::wait_for(
        "the moved session hold to end",
        Duration::from_millis((session_deadline_max - now_ms()).max(0) as u64 + 5_000),
        || (reply_text(run(&mut b, &["EXISTS", &held])) == "0").then_some(()),
    );
    let gone_at = now_ms();
    assert!(
        gone_at <= capped + 1_000,
        "the moved session hold ended at {gone_at}, its deadline was {capped}"
    );
}

/// A migration cancelled while it streams: the locks and the session stay on the source as
/// they were, the refusal of new session holds ends with it, and the target drops what it got.
#[test]
#[ignore = "flaky under make test-servers' load (CI run 4 of 2026-12-02, Valkey 9.1: the session hold's flag); run with make test-asm"]
fn a_cancelled_atomic_migration_leaves_locks_and_sessions_on_the_source() {
    if skipped("cancelled_atomic_migration") {
        return;
    }
    let _turn = one_at_a_time();
    let cluster = Cluster::start();
    let mut any = cluster.nodes[0].conn();
    let (src, dst) = (0, 1);
    let mut a = cluster.master(src);
    let mut b = cluster.master(dst);
    let dst_id = cluster.shards[dst].master_id.clone();
    let tag = &cluster.keys_on(&mut any, src, 1, "cancel")[0];
    let slot = keyslot(&mut any, tag);
    let (plain, held, later) = (
        format!("{{{tag}}}:plain"),
        format!("{{{tag}}}:session"),
        format!("{{{tag}}}:later"),
    );
    let t_plain = must_acquire(&mut a, &plain, "holder", LONG_TTL);
    let id = open_session(&mut a, "60000");
    let t_held = token_of(
        run(&mut a, &["LOCK.ACQUIRE", &held, "me", "0", "SESSION", &id]),
        "session hold",
    );

    assert_eq!(
        reply_text(run(
            &mut a,
            &["DEBUG", "SLOTMIGRATION", "PREVENT-PAUSE", "1"]
        )),
        "OK"
    );
    let slot_arg = slot.to_string();
    let migrate = [
        "CLUSTER",
        "MIGRATESLOTS",
        "SLOTSRANGE",
        &slot_arg,
        &slot_arg,
        "NODE",
        &dst_id,
    ];
    assert_eq!(reply_text(run(&mut a, &migrate)), "OK");
    nodes::wait_for(
        "the migration to stream after its snapshot",
        PATIENCE,
        || {
            reply_text(run(&mut a, &["CLUSTER", "GETSLOTMIGRATIONS"]))
                .contains("waiting-to-pause")
                .then_some(())
        },
    );
    assert_eq!(
        reply_text(run(
            &mut a,
            &["LOCK.ACQUIRE", &later, "me", "0", "SESSION", &id]
        )),
        "TRYAGAIN the key's slot is migrating to another node: no session may take a hold in \
         it now; retry"
    );
    assert_eq!(
        reply_text(run(&mut a, &["CLUSTER", "CANCELSLOTMIGRATIONS"])),
        "OK"
    );
    assert_eq!(
        reply_text(run(
            &mut a,
            &["DEBUG", "SLOTMIGRATION", "PREVENT-PAUSE", "0"]
        )),
        "OK"
    );
    nodes::wait_for("the target to drop the cancelled import", PATIENCE, || {
        (keys_in_slot(&mut b, slot) == 0).then_some(())
    });

    // The source: the same holds, the session hold still the session's, and new session holds
    // accepted again.
    assert_eq!(
        holders(&mut a, &plain),
        vec![("holder".into(), t_plain, false)]
    );
    assert_eq!(holders(&mut a, &held), vec![("me".into(), t_held, true)]);
    assert_eq!(pexpiretime(&mut a, &held), -1);
    let t_later = token_of(
        run(&mut a, &["LOCK.ACQUIRE", &later, "me", "0", "SESSION", &id]),
        "a session hold after the cancel",
    );
    assert!(t_later > t_held);
    assert_eq!(
        reply_text(run(&mut a, &["LOCK.SESSION", "CLOSE", &id])),
        "2"
    );
    assert_eq!(nodes::info_int(&mut b, "lock", "lock_sessions"), 0);
}
