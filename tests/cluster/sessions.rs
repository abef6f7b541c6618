//! Sessions in a cluster: a session belongs to the node that opened it, its id routes there by
//! its hash tag, `CLOSE` releases holds in every slot of that node, and a hold whose key is
//! migrated to a node that does not know its session keeps a deadline of its own there.

use super::*;

fn open_session(conn: &mut Connection, ttl: &str) -> String {
    match run(conn, &["LOCK.SESSION", "OPEN", ttl]) {
        Ok(Value::BulkString(id)) => String::from_utf8(id).unwrap(),
        other => panic!("OPEN: {}", reply_text(other)),
    }
}

#[test]
fn a_session_lives_on_its_node_and_its_holds_keep_a_deadline_when_migrated() {
    let _turn = one_at_a_time();
    let cluster = Cluster::start();
    let mut any = cluster.nodes[0].conn();
    let (src, dst) = (0, 1);
    let mut a = cluster.master(src);
    let mut b = cluster.master(dst);
    let src_node = cluster.master_node(src);
    let dst_node = cluster.master_node(dst);

    // The id's tag is a slot of the opening node: the other node redirects there, like a key.
    let id = open_session(&mut a, "30000");
    let id_slot = keyslot(&mut any, &id);
    assert_eq!(
        error_text(
            "KEEPALIVE",
            run(&mut b, &["LOCK.SESSION", "KEEPALIVE", &id])
        ),
        format!("MOVED {id_slot} {}", src_node.addr())
    );
    assert_eq!(
        reply_text(run(&mut a, &["LOCK.SESSION", "KEEPALIVE", &id])),
        "30000"
    );

    // Holds in two other slots of the node; CLOSE (answered from a timer in a cluster)
    // releases both.
    let keys = cluster.keys_on(&mut any, src, 3, "session");
    for k in &keys[..2] {
        assert!(
            reply_text(run(&mut a, &["LOCK.ACQUIRE", k, "me", "0", "SESSION", &id]))
                .parse::<i64>()
                .is_ok()
        );
    }
    let Ok(Value::Array(info)) = run(&mut a, &["LOCK.SESSION", "INFO", &id]) else {
        panic!("LOCK.SESSION INFO")
    };
    let holds = info
        .chunks(2)
        .find(|kv| kv[0] == Value::BulkString(b"holds".to_vec()))
        .map(|kv| kv[1].clone());
    assert_eq!(holds, Some(Value::Int(2)));
    assert_eq!(
        reply_text(run(&mut a, &["LOCK.SESSION", "CLOSE", &id])),
        "2"
    );
    for k in &keys[..2] {
        assert_eq!(
            reply_text(run(&mut a, &["EXISTS", k])),
            "0",
            "{k} after CLOSE"
        );
    }

    // A session hold with no deadline of its own, migrated to a node without the session:
    // there it ends no later than the session would have (30 s), never lives forever.
    let id = open_session(&mut a, "30000");
    let key = &keys[2];
    let token: i64 = reply_text(run(
        &mut a,
        &["LOCK.ACQUIRE", key, "me", "0", "SESSION", &id],
    ))
    .parse()
    .unwrap();
    assert_eq!(reply_text(run(&mut a, &["PTTL", key])), "-1");
    let slot = keyslot(&mut any, key).to_string();
    let (src_id, dst_id) = (
        &cluster.shards[src].master_id,
        &cluster.shards[dst].master_id,
    );
    assert_eq!(
        reply_text(run(
            &mut b,
            &["CLUSTER", "SETSLOT", &slot, "IMPORTING", src_id]
        )),
        "OK"
    );
    assert_eq!(
        reply_text(run(
            &mut a,
            &["CLUSTER", "SETSLOT", &slot, "MIGRATING", dst_id]
        )),
        "OK"
    );
    let port = dst_node.port().to_string();
    assert_eq!(
        reply_text(run(
            &mut a,
            &["MIGRATE", "127.0.0.1", &port, key, "0", "5000"]
        )),
        "OK"
    );
    // The key's expiry follows from a timer right after the load.
    let pttl = |b: &mut Connection| {
        assert_eq!(reply_text(run(b, &["ASKING"])), "OK");
        reply_text(run(b, &["PTTL", key])).parse::<i64>().unwrap()
    };
    common::wait_until("the migrated key gets an expiry", PATIENCE, || {
        pttl(&mut b) != -1
    });
    let left = pttl(&mut b);
    assert!((1..=30_000).contains(&left), "PTTL {left} on the target");
    assert_eq!(reply_text(run(&mut b, &["ASKING"])), "OK");
    assert_eq!(
        fence_check(&mut b, key, token),
        1,
        "the hold moved with its token"
    );
    // The target does not know the session.
    let other = &cluster.keys_on(&mut any, dst, 1, "session-dst")[0];
    assert_eq!(
        error_text("SESSION", run(&mut b, &["LOCK.ACQUIRE", other, "me", "0", "SESSION", &id])),
        "ERR no such session on this server (closed, expired, its connection closed, or opened on another node)"
    );
    // The source's session no longer counts the migrated hold.
    assert_eq!(
        reply_text(run(&mut a, &["LOCK.SESSION", "CLOSE", &id])),
        "0"
    );
}

/// `LOCK.SESSION KILL` in a cluster (issue 32): the session's holds in other slots of its node
/// are lost from the deferred work (a command cannot reach them); the reply is the holds on
/// record, and each key stays taken for the lock-delay.
#[test]
fn kill_ends_a_session_whose_holds_are_in_other_slots() {
    let _turn = one_at_a_time();
    let cluster = Cluster::start();
    let mut any = cluster.nodes[0].conn();
    let mut a = cluster.master(0);
    let id = match run(
        &mut a,
        &["LOCK.SESSION", "OPEN", "30000", "LOCKDELAY", "60000"],
    ) {
        Ok(Value::BulkString(id)) => String::from_utf8(id).unwrap(),
        other => panic!("OPEN: {}", reply_text(other)),
    };
    let keys = cluster.keys_on(&mut any, 0, 2, "kill");
    for k in &keys {
        run(&mut a, &["LOCK.ACQUIRE", k, "me", "0", "SESSION", &id]).unwrap();
    }
    let Ok(Value::Array(page)) = run(&mut a, &["LOCK.SESSION", "LIST"]) else {
        panic!("LIST")
    };
    let Value::Array(entries) = &page[1] else {
        panic!("{page:?}")
    };
    let Value::Array(entry) = &entries[0] else {
        panic!("{entries:?}")
    };
    let serial = reply_text(Ok(entry[1].clone()));
    assert_eq!(
        reply_text(run(&mut a, &["LOCK.SESSION", "KILL", &serial])),
        "2"
    );
    assert_eq!(
        run(&mut a, &["LOCK.SESSION", "KEEPALIVE", &id]),
        Ok(Value::Nil)
    );
    for k in &keys {
        common::wait_until(&format!("{k} lost"), Duration::from_secs(10), || {
            matches!(run(&mut a, &["LOCK.FENCE", k]), Ok(Value::Nil))
        });
        // Lost, not released: the lock-delay keeps the key.
        assert_eq!(reply_text(run(&mut a, &["EXISTS", k])), "1", "{k}");
    }
}
