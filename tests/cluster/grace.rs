//! `BOUND GRACE` in a cluster (issue 29): a session detached by its connection's close keeps
//! holds in several slots of its node; `ATTACH` (routed by the id's tag) rescues them, and the
//! feed's `detached` and `attached` come once per key, from the key's master only (a command
//! cannot look at keys of other slots, so the messages about them come from a zero-delay
//! timer on the master; a replica publishes nothing of its own).

use harness::feed::FeedSubscriber;

use super::*;

#[test]
fn attach_in_a_cluster_keeps_holds_in_every_slot_and_the_feed_says_so_once() {
    let _turn = one_at_a_time();
    let cluster = Cluster::start();
    let mut any = cluster.nodes[0].conn();
    let s = 0;
    let port = cluster.master_node(s).port();
    let keys = cluster.keys_on(&mut any, s, 2, "grace");
    let mut holder = cluster.master(s);
    let id = match run(
        &mut holder,
        &["LOCK.SESSION", "OPEN", "60000", "BOUND", "GRACE", "20000"],
    ) {
        Ok(Value::BulkString(id)) => String::from_utf8(id).unwrap(),
        other => panic!("OPEN: {}", reply_text(other)),
    };
    let mut tokens = vec![];
    let mut subs = vec![];
    for key in &keys {
        let (sub, seq) = FeedSubscriber::watching(port, 0, key.as_bytes());
        assert_eq!(seq, 0);
        subs.push(sub);
        let token: i64 = reply_text(run(
            &mut holder,
            &["LOCK.ACQUIRE", key, "me", "0", "SESSION", &id],
        ))
        .parse()
        .unwrap();
        tokens.push(token);
    }
    let victim: i64 = redis::cmd("CLIENT").arg("ID").query(&mut holder).unwrap();
    let mut master = cluster.master(s);
    let killed: i64 = redis::cmd("CLIENT")
        .arg(&["KILL", "ID", &victim.to_string()])
        .query(&mut master)
        .unwrap();
    assert_eq!(killed, 1);
    for (sub, token) in subs.iter_mut().zip(&tokens) {
        let m = sub.next_message();
        assert_eq!((m.seq, m.event.as_str(), m.token), (1, "acquired", *token));
        let m = sub.next_message();
        assert_eq!((m.seq, m.event.as_str(), m.token), (2, "detached", *token));
    }
    assert_eq!(
        reply_text(run(&mut master, &["LOCK.SESSION", "ATTACH", &id])),
        "OK"
    );
    for (sub, token) in subs.iter_mut().zip(&tokens) {
        let m = sub.next_message();
        assert_eq!(
            (m.seq, m.event.as_str(), m.token, m.ttl),
            (3, "attached", *token, -1)
        );
    }
    for (key, token) in keys.iter().zip(&tokens) {
        assert_eq!(fence(&mut master, key), Some(*token));
    }
    // Nothing more: no second copy of either message from anywhere.
    for sub in subs.iter_mut() {
        sub.expect_silence(Duration::from_millis(300));
    }
    assert_eq!(
        reply_text(run(&mut master, &["LOCK.SESSION", "CLOSE", &id])),
        "2"
    );
}
