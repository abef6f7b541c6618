//! Locks on every master: acquired, waited for, handed off and released on the owning master,
//! and answered the same by that master's replica.

use super::*;

/// On every master: acquire, refuse a second owner, queue a waiter on the owning master, hand
/// off on release, release; the master's replica (`READONLY`, after `WAIT 1`) answers
/// `LOCK.FENCE` and `LOCK.INFO` as the master does, and redirects writes like `SET`.
#[test]
fn locks_on_every_master_block_hand_off_release_and_reach_the_replicas() {
    let _turn = one_at_a_time();
    let cluster = Cluster::start();
    let mut any = cluster.nodes[0].conn();
    let keys: Vec<Vec<String>> = (0..MASTERS)
        .map(|s| cluster.keys_on(&mut any, s, 2, "job"))
        .collect();
    let mut masters: Vec<Connection> = (0..MASTERS).map(|s| cluster.master(s)).collect();

    // Holders on every master.
    let mut first = Vec::new();
    for (s, shard_keys) in keys.iter().enumerate() {
        for key in shard_keys {
            let token = must_acquire(&mut masters[s], key, "holder", LONG_TTL);
            assert_eq!(acquire(&mut masters[s], key, "other", LONG_TTL), None);
            first.push((s, key.clone(), token));
        }
    }

    // One waiter per key, each on the master that owns the key.
    let waiters: Vec<_> = first
        .iter()
        .map(|(s, key, _)| {
            let port = cluster.master_node(*s).port();
            spawn_waiter(port, key, &format!("waiter-{key}"), 20_000, false)
        })
        .collect();
    for (s, m) in masters.iter_mut().enumerate() {
        wait_blocked(m, keys[s].len() as i64);
    }
    for (s, key, token) in &first {
        assert_eq!(
            lock_info(&mut masters[*s], key),
            Some(("holder".to_string(), *token, 1)),
            "LOCK.INFO {key} with one waiter"
        );
    }

    // Release: each lock goes to its waiter, with a larger token.
    for (s, key, _) in &first {
        assert_eq!(release(&mut masters[*s], key, "holder"), 1);
    }
    let mut handed = Vec::new();
    for ((s, key, old), rx) in first.into_iter().zip(waiters) {
        let (reply, _) = rx
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|_| panic!("the waiter on {key} was not answered"));
        let token = match reply {
            Ok(Value::Int(t)) => t,
            other => panic!("the waiter on {key}: expected a token, got {other:?}"),
        };
        assert!(token > old, "{key}: handoff token {token} <= {old}");
        let owner = format!("waiter-{key}");
        assert_eq!(
            lock_info(&mut masters[s], &key),
            Some((owner.clone(), token, 0))
        );
        handed.push((s, key, owner, token));
    }

    // Each replica matches its master once WAIT says it has the writes.
    for (s, m) in masters.iter_mut().enumerate() {
        assert!(wait_one_replica(m) >= 1, "WAIT 1 1000 on master {s}");
    }
    for (s, key, owner, token) in &handed {
        let master_addr = cluster.master_node(*s).addr();
        let mut r = cluster.replica(*s);
        let slot = keyslot(&mut r, key);
        // Without READONLY a replica redirects reads to its master, as for GET.
        let moved = format!("MOVED {slot} {master_addr}");
        assert_eq!(
            error_text("LOCK.FENCE", run(&mut r, &["LOCK.FENCE", key])),
            moved
        );
        assert_eq!(error_text("GET", run(&mut r, &["GET", key])), moved);
        let _: () = redis::cmd("READONLY").query(&mut r).expect("READONLY");
        assert_eq!(
            fence(&mut r, key),
            Some(*token),
            "LOCK.FENCE on the replica"
        );
        assert_eq!(fence_check(&mut r, key, *token), 1);
        assert_eq!(lock_info(&mut r, key), Some((owner.clone(), *token, 0)));
        // Writes go to the master even with READONLY, as for SET.
        assert_eq!(
            error_text(
                "LOCK.ACQUIRE on a replica",
                run(&mut r, &["LOCK.ACQUIRE", key, "x", "1000"])
            ),
            error_text("SET on a replica", run(&mut r, &["SET", key, "v"]))
        );
        assert_eq!(
            error_text(
                "LOCK.RELEASE on a replica",
                run(&mut r, &["LOCK.RELEASE", key, owner])
            ),
            moved
        );
    }

    // Release everything; the replicas follow.
    for (s, key, owner, _) in &handed {
        assert_eq!(release(&mut masters[*s], key, owner.as_str()), 1);
    }
    for (s, m) in masters.iter_mut().enumerate() {
        assert!(wait_one_replica(m) >= 1, "WAIT 1 1000 on master {s}");
        assert_eq!(nodes::info_int(m, "lock", "lock_locks"), 0);
        assert_eq!(nodes::info_int(m, "lock", "lock_waiters"), 0);
        assert_eq!(
            nodes::info_int(m, "lock", "lock_handed_off"),
            keys[s].len() as i64
        );
        let mut r = cluster.replica(s);
        assert_eq!(
            nodes::info_int(&mut r, "lock", "lock_locks"),
            0,
            "replica {s}"
        );
    }
}
