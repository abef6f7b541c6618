//! What a watcher and a waiter of a key hear from the servers when a planned `CLUSTER
//! FAILOVER` moves the key's shard to its replica (issue 34). The module's own `demoted`
//! message cannot reach them: the old master drops every shard-channel subscription of the
//! slots it gives up (Redis sends each subscriber `sunsubscribe`) before the role change reaches
//! the module, and the waiters get Redis's own `UNBLOCKED` text. Clients treat that unrequested
//! `sunsubscribe` as the resynchronisation marker: `LOCK.WATCH` on the new master (its seq
//! starts again at 0), `LOCK.INFO` there, and the channel's next messages come from there.

use harness::feed::{FeedSubscriber, Resp};

use super::*;

/// Redis's reply to a client blocked on a node that turns replica (`disconnectAllBlockedClients`,
/// on a cluster failover as on `REPLICAOF`).
const REDIS_UNBLOCKED: &str =
    "UNBLOCKED force unblock from blocking operation, instance state changed (master -> replica?)";

#[test]
fn planned_failover_unsubscribes_watchers_and_unblocks_waiters_with_redis_text() {
    let _turn = one_at_a_time();
    let cluster = Cluster::start();
    let mut any = cluster.nodes[0].conn();
    let key = cluster.keys_on(&mut any, 0, 1, "planned").remove(0);
    let old_port = cluster.master_node(0).port();
    let mut old = cluster.master(0);
    let mut replica = cluster.replica(0);
    let token = must_acquire(&mut old, &key, "holder", LONG_TTL);
    let (mut watcher, seq) = FeedSubscriber::watching(old_port, 0, key.as_bytes());
    assert_eq!(seq, 0);
    let channel = watcher.channel.clone();
    let waiter = spawn_waiter(old_port, &key, "waiter", 20_000, false);
    wait_blocked(&mut old, 1);
    assert_eq!(wait_one_replica(&mut old), 1);

    let ok: Value = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .query(&mut replica)
        .expect("CLUSTER FAILOVER");
    assert_eq!(ok, Value::Okay);

    // The waiter: Redis's own text on Redis; on Valkey 9.1 (seen in CI's matrix run) the
    // module's role-change answer comes first. Either way an UNBLOCKED, never a grant.
    let (reply, _) = waiter.recv_timeout(PATIENCE).expect("the waiter's answer");
    let e = reply.expect_err("a waiter on the demoted master is not granted");
    assert_eq!(e.code(), Some("UNBLOCKED"), "{e}");
    let text = format!("UNBLOCKED {}", e.detail().unwrap_or(""));
    assert!(
        text == REDIS_UNBLOCKED
            || text == "UNBLOCKED this server became a replica while the client waited",
        "{text}"
    );

    // The watcher: the server's sunsubscribe of the key's channel is the first thing it hears.
    let first = watcher
        .read_within(PATIENCE)
        .expect("a frame within PATIENCE");
    assert_eq!(
        first,
        Resp::Array(vec![
            Resp::Bulk(b"sunsubscribe".to_vec()),
            Resp::Bulk(channel.clone()),
            Resp::Int(0),
        ])
    );

    // The hold is on the new master; a watch there starts again at seq 0 on the same channel
    // and hears the next change as seq 1.
    let new_port = cluster.nodes[cluster.shards[0].replica].port();
    nodes::wait_for("the replica to become master", PATIENCE, || {
        (nodes::info_field(&mut replica, "replication", "role").as_deref() == Some("master"))
            .then_some(())
    });
    assert_eq!(
        lock_info(&mut replica, &key).map(|(owner, t, _)| (owner, t)),
        Some(("holder".to_string(), token as i64))
    );
    let (mut again, seq) = FeedSubscriber::watching(new_port, 0, key.as_bytes());
    assert_eq!((seq, again.channel.clone()), (0, channel));
    assert_eq!(release(&mut replica, &key, "holder"), 1);
    let released = again.next_message();
    assert_eq!((released.seq, released.event.as_str()), (1, "released"));
}
