//! Every event of the feed, in order, with owner and token.

use super::*;

#[test]
fn acquire_extend_release_and_a_handoff_as_one_message() {
    let (server, mut c) = start();
    let key = new_key();
    let mut sub = Subscriber::start(&server, 0, &key);
    assert_eq!(sub.seq, 0);
    let t1 = grant(&mut c, &key, "alice", 5_000, &[]);
    assert_eq!(extend(&mut c, &key, "alice", 8_000), 1);
    // A retry by the same owner moves the deadline: `extended`.
    assert_eq!(grant(&mut c, &key, "alice", 9_000, &[]), t1);
    let bob = waiter(&server, &mut c, &[&key, "bob", "5000", "BLOCK", "10000"]);
    assert_eq!(release(&mut c, &key, "alice"), 1);
    let t2 = bob.join().unwrap();
    assert_eq!(release(&mut c, &key, "bob"), 1);
    sub.expect(&[
        ("acquired", "alice", t1),
        ("extended", "alice", t1),
        ("extended", "alice", t1),
        // Release and grant to the waiter: one message, never "no holder" in between.
        ("handoff", "bob", t2),
        ("released", "bob", t2),
    ]);
    sub.expect_silence(Duration::from_millis(100));
}

#[test]
fn acquired_and_extended_carry_the_ttl() {
    let (server, mut c) = start();
    let key = new_key();
    let mut sub = Subscriber::start(&server, 0, &key);
    grant(&mut c, &key, "alice", 5_000, &[]);
    let m = sub.next();
    assert!((4_900..=5_000).contains(&m.ttl), "{m:?}");
    let id = match call(&mut c, "LOCK.SESSION", &["OPEN", "10000"]).unwrap() {
        Value::BulkString(id) => String::from_utf8(id).unwrap(),
        other => panic!("{other:?}"),
    };
    let k2 = new_key();
    let mut sub2 = Subscriber::start(&server, 0, &k2);
    grant(&mut c, &k2, "me", 0, &["SESSION", &id]);
    let m = sub2.next();
    assert_eq!((m.event.as_str(), m.ttl), ("acquired", -1), "{m:?}");
}

#[test]
fn shared_holders_and_a_semaphore_handoff() {
    let (server, mut c) = start();
    let key = new_key();
    let mut sub = Subscriber::start(&server, 0, &key);
    let r1 = grant(&mut c, &key, "r1", 5_000, &["SHARED"]);
    let r2 = grant(&mut c, &key, "r2", 5_000, &["SHARED"]);
    let w = waiter(&server, &mut c, &[&key, "w", "5000", "BLOCK", "10000"]);
    assert_eq!(release(&mut c, &key, "r1"), 1);
    assert_eq!(release(&mut c, &key, "r2"), 1);
    let tw = w.join().unwrap();
    sub.expect(&[
        ("acquired", "r1", r1),
        ("acquired", "r2", r2),
        ("released", "r1", r1),
        // The last reader leaves and the writer is granted in the same step.
        ("handoff", "w", tw),
    ]);
}

#[test]
fn expiry_noticed_by_a_grant_and_by_redis() {
    let (server, mut c) = start();
    let key = new_key();
    let mut sub = Subscriber::start(&server, 0, &key);
    // A queued waiter is granted at the holder's deadline: one handoff after the expiry. The
    // 1 s is for the waiter to connect and queue first on a loaded machine (100 ms was not).
    let t1 = grant(&mut c, &key, "alice", 1_000, &[]);
    let bob = waiter(&server, &mut c, &[&key, "bob", "200", "BLOCK", "10000"]);
    let t2 = bob.join().unwrap();
    sub.expect(&[("acquired", "alice", t1), ("handoff", "bob", t2)]);
    // Nobody waiting: Redis expires the key (active expiry), and the feed says `expired`.
    sub.expect(&[("expired", "bob", t2)]);
    // A shared holder expires while another holds on: reported when a grant prunes it.
    let r1 = grant(&mut c, &key, "r1", 100, &["SHARED"]);
    let r2 = grant(&mut c, &key, "r2", 10_000, &["SHARED"]);
    std::thread::sleep(Duration::from_millis(150));
    let r3 = grant(&mut c, &key, "r3", 10_000, &["SHARED"]);
    sub.expect(&[
        ("acquired", "r1", r1),
        ("acquired", "r2", r2),
        ("expired", "r1", r1),
        ("acquired", "r3", r3),
    ]);
}

#[test]
fn a_session_end_is_released_or_lost() {
    let (server, mut c) = start();
    let (a, b) = (new_key(), new_key());
    let mut sub_a = Subscriber::start(&server, 0, &a);
    let mut sub_b = Subscriber::start(&server, 0, &b);
    let open = |c: &mut Connection, opts: &[&str]| {
        let mut args = vec!["OPEN", "30000"];
        args.extend_from_slice(opts);
        match call(c, "LOCK.SESSION", &args).unwrap() {
            Value::BulkString(id) => String::from_utf8(id).unwrap(),
            other => panic!("{other:?}"),
        }
    };
    // CLOSE: released.
    let id = open(&mut c, &[]);
    let ta = grant(&mut c, &a, "me", 0, &["SESSION", &id]);
    assert_eq!(
        call(&mut c, "LOCK.SESSION", &["CLOSE", &id]),
        Ok(Value::Int(1))
    );
    sub_a.expect(&[("acquired", "me", ta), ("released", "me", ta)]);
    // A bound connection killed, with a waiter: `lost` and the waiter's grant are one handoff.
    let mut holder = server.conn();
    let id = open(&mut holder, &["BOUND"]);
    let tb = grant(&mut holder, &b, "holder", 0, &["SESSION", &id]);
    let next = waiter(&server, &mut c, &[&b, "next", "5000", "BLOCK", "10000"]);
    let victim: i64 = redis::cmd("CLIENT").arg("ID").query(&mut holder).unwrap();
    redis::cmd("CLIENT")
        .arg(&["KILL", "ID", &victim.to_string()])
        .query::<i64>(&mut c)
        .unwrap();
    let tn = next.join().unwrap();
    sub_b.expect(&[("acquired", "holder", tb), ("handoff", "next", tn)]);
    // Without a waiter: `lost`.
    let mut holder = server.conn();
    let id = open(&mut holder, &["BOUND"]);
    assert_eq!(release(&mut c, &b, "next"), 1);
    let tb = grant(&mut holder, &b, "holder", 0, &["SESSION", &id]);
    drop(holder);
    sub_b.expect(&[
        ("released", "next", tn),
        ("acquired", "holder", tb),
        ("lost", "holder", tb),
    ]);
}

#[test]
fn the_key_going_away_by_any_other_way() {
    let (server, mut c) = start();
    let key = new_key();
    let mut sub = Subscriber::start(&server, 0, &key);
    let mut expect_gone = |c: &mut Connection, how: &[&str], event: &str| {
        let t = grant(c, &key, "me", 60_000, &[]);
        let mut cmd = redis::cmd(how[0]);
        for a in &how[1..] {
            cmd.arg(*a);
        }
        cmd.query::<Value>(c).unwrap();
        sub.expect(&[("acquired", "me", t), (event, "", 0)]);
    };
    expect_gone(&mut c, &["DEL", &key], "deleted");
    expect_gone(&mut c, &["UNLINK", &key], "deleted");
    let other = new_key();
    expect_gone(&mut c, &["RENAME", &key, &other], "deleted");
    expect_gone(&mut c, &["MOVE", &key, "1"], "deleted");
    expect_gone(&mut c, &["FLUSHDB"], "flushed");
    expect_gone(&mut c, &["FLUSHALL"], "flushed");
    expect_gone(&mut c, &["SWAPDB", "0", "1"], "swapped");
    // RESTORE ... REPLACE over the lock: a string replaces it.
    let t = grant(&mut c, &key, "me", 60_000, &[]);
    let string = new_key();
    redis::cmd("SET")
        .arg(&string)
        .arg("v")
        .query::<()>(&mut c)
        .unwrap();
    let dump: Vec<u8> = redis::cmd("DUMP").arg(&string).query(&mut c).unwrap();
    redis::cmd("RESTORE")
        .arg(&key)
        .arg(0)
        .arg(dump)
        .arg("REPLACE")
        .query::<()>(&mut c)
        .unwrap();
    sub.expect(&[("acquired", "me", t), ("deleted", "", 0)]);
    drop(server);
}

#[test]
fn a_demotion_is_told() {
    let (primary, replica) = primary_and_replica(&[]);
    let key = new_key();
    let mut c = primary.conn();
    let mut sub = Subscriber::start(&primary, 0, &key);
    let t = grant(&mut c, &key, "me", 60_000, &[]);
    // The replica becomes the primary, and the old primary its replica.
    promote(&replica);
    redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(replica.port())
        .query::<()>(&mut c)
        .unwrap();
    sub.expect(&[("acquired", "me", t), ("demoted", "", 0)]);
}

#[test]
fn a_lock_delay_starts_with_the_loss_and_ends_with_the_next_grant() {
    let (server, mut c) = start();
    let key = new_key();
    let mut sub = Subscriber::start(&server, 0, &key);
    let mut holder = server.conn();
    let id = match call(
        &mut holder,
        "LOCK.SESSION",
        &["OPEN", "30000", "BOUND", "LOCKDELAY", "200"],
    )
    .unwrap()
    {
        Value::BulkString(id) => String::from_utf8(id).unwrap(),
        other => panic!("{other:?}"),
    };
    let t = grant(&mut holder, &key, "holder", 0, &["SESSION", &id]);
    let next = waiter(&server, &mut c, &[&key, "next", "5000", "BLOCK", "10000"]);
    let victim: i64 = redis::cmd("CLIENT").arg("ID").query(&mut holder).unwrap();
    redis::cmd("CLIENT")
        .arg(&["KILL", "ID", &victim.to_string()])
        .query::<i64>(&mut c)
        .unwrap();
    let tn = next.join().unwrap();
    sub.expect(&[("acquired", "holder", t), ("lost", "holder", t)]);
    let delayed = sub.next();
    assert_eq!(
        (delayed.event.as_str(), delayed.token),
        ("delayed", t),
        "{delayed:?}"
    );
    assert!((1..=200).contains(&delayed.ttl), "{delayed:?}");
    sub.seq = delayed.seq;
    // When the delay ends the waiter is granted: the delayed hold's end and the grant, one
    // handoff.
    sub.expect(&[("handoff", "next", tn)]);
}
