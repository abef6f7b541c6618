//! The change feed in a cluster: a key's channel lives on the key's shard, for keys with a hash
//! tag, without one, and with braces that are not a tag; a subscriber on the key's master (and
//! on its replica: sharded pub/sub forwards to the shard's replicas) hears every change.

use harness::feed::{FeedSubscriber, Resp};

use super::*;

/// The harness's raw subscriber on node `port`, subscribed to `channel`.
fn listener(port: u16, channel: &[u8]) -> FeedSubscriber {
    FeedSubscriber::listen(port, channel)
}

/// The next message's body, past any `probe`.
fn message(l: &mut FeedSubscriber) -> String {
    loop {
        let body = String::from_utf8(l.message()).unwrap();
        if body != "probe" {
            return body;
        }
    }
}

/// True once a `probe` arrives within `wait`.
fn probe_arrives(l: &mut FeedSubscriber, wait: Duration) -> bool {
    l.message_within(wait).is_some_and(|body| body == b"probe")
}

#[test]
fn a_keys_feed_lives_on_its_shard_and_reaches_its_replica() {
    let _turn = one_at_a_time();
    let cluster = Cluster::start();
    let mut any = cluster.nodes[0].conn();
    let keys = [
        "plain:feed".to_string(),
        "{orders}:feed".to_string(),
        "braces{}not{a}tag".to_string(),
    ];
    for key in &keys {
        let slot = keyslot(&mut any, key);
        let s = cluster.shard_of(slot);
        let mut master = cluster.master(s);
        let channel = match run(&mut master, &["LOCK.WATCH", key]) {
            Ok(Value::Array(v)) => match &v[0] {
                Value::BulkString(ch) => ch.clone(),
                other => panic!("{other:?}"),
            },
            other => panic!("LOCK.WATCH {key}: {}", reply_text(other)),
        };
        let channel_text = String::from_utf8(channel.clone()).unwrap();
        // The server's own routing: the channel hashes to the key's slot.
        assert_eq!(keyslot(&mut any, &channel_text), slot, "{channel_text}");
        assert!(
            channel_text.ends_with(&format!(":0:{key}")),
            "{channel_text}"
        );
        let master_port = cluster.master_node(s).port();
        let mut on_master = listener(master_port, &channel);
        let replica_port = cluster.nodes[cluster.shards[s].replica].port();
        let mut on_replica = listener(replica_port, &channel);
        // The master forwards shard messages to its replica over the cluster bus, which may not
        // be up yet right after the cluster formed (seen on Valkey 8.1: the replica heard
        // nothing): probe until the replica hears a message, then test.
        common::wait_until("the replica hears the shard channel", PATIENCE, || {
            let _: i64 = redis::cmd("SPUBLISH")
                .arg(&channel)
                .arg("probe")
                .query(&mut master)
                .unwrap();
            probe_arrives(&mut on_replica, Duration::from_millis(200))
        });
        let token = must_acquire(&mut master, key, "alice", LONG_TTL);
        assert_eq!(release(&mut master, key, "alice"), 1);
        for l in [&mut on_master, &mut on_replica] {
            let acquired = message(l);
            let ttl: i64 = acquired
                .strip_prefix(&format!("1 acquired {token} "))
                .and_then(|rest| rest.strip_suffix(" alice"))
                .unwrap_or_else(|| panic!("{acquired}"))
                .parse()
                .unwrap();
            assert!((LONG_TTL - 1_000..=LONG_TTL).contains(&ttl), "{acquired}");
            assert_eq!(message(l), format!("2 released {token} 0 alice"));
        }
        // Another master refuses the channel's shard, as for the key.
        let other = (s + 1) % MASTERS;
        let mut wrong = FeedSubscriber::on(cluster.master_node(other).port());
        wrong.send(&[b"SSUBSCRIBE", &channel]);
        match wrong.read() {
            Resp::Error(e) => assert!(e.starts_with(&format!("MOVED {slot} ")), "{e}"),
            other => panic!("SSUBSCRIBE on another master: {other:?}"),
        }
    }
}
