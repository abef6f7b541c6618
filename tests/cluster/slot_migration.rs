//! A slot migrated away under a held lock with waiters: the waiters are answered, and the lock
//! keeps one owner on one node.

use super::*;

/// Migrate the slot of a held lock with two waiters (`CLUSTER SETSLOT ... IMPORTING/MIGRATING`,
/// `MIGRATE`, `CLUSTER SETSLOT ... NODE`): the waiters on the old node are answered promptly
/// with an error or a redirect, never granted there; afterwards exactly one node has the key,
/// with the original holder and token, and a waiter that follows the redirect gets the lock
/// from the new node.
#[test]
fn waiters_of_a_migrated_slot_get_an_error_and_the_lock_keeps_one_owner() {
    let _turn = one_at_a_time();
    let cluster = Cluster::start();
    let mut any = cluster.nodes[0].conn();
    let (src, dst, third) = (0, 1, 2);
    let key = &cluster.keys_on(&mut any, src, 1, "migrating")[0];
    let slot = keyslot(&mut any, key);
    let (slot_arg, key_str) = (slot.to_string(), key.as_str());
    let src_node = cluster.master_node(src);
    let dst_node = cluster.master_node(dst);
    let (src_id, dst_id) = (
        &cluster.shards[src].master_id,
        &cluster.shards[dst].master_id,
    );
    let mut a = cluster.master(src);
    let mut b = cluster.master(dst);

    let token = must_acquire(&mut a, key, "holder", LONG_TTL);
    // Queued in a known order: w2 starts once w1 is blocked.
    let waiters: Vec<_> = ["w1", "w2"]
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let rx = spawn_waiter(src_node.port(), key, w, 20_000, false);
            wait_blocked(&mut a, i as i64 + 1);
            rx
        })
        .collect();
    assert_eq!(lock_info(&mut a, key), Some(("holder".into(), token, 2)));

    // Open the migration. While the key is still on the source, the source serves it.
    let ok = |reply: RedisResult<Value>, what: &str| {
        assert_eq!(reply_text(reply), "OK", "{what}");
    };
    ok(
        run(
            &mut b,
            &["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", src_id],
        ),
        "SETSLOT IMPORTING on the target",
    );
    ok(
        run(
            &mut a,
            &["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", dst_id],
        ),
        "SETSLOT MIGRATING on the source",
    );
    assert_eq!(acquire(&mut a, key, "other", LONG_TTL), None);

    // Move the key.
    let migrated_at = Instant::now();
    ok(
        run(
            &mut a,
            &[
                "MIGRATE",
                "127.0.0.1",
                &dst_node.port().to_string(),
                key_str,
                "0",
                "5000",
            ],
        ),
        "MIGRATE",
    );

    // The waiters: an error or a redirect, promptly; never a token from the old node.
    // (refused with an error or a redirect, what happened)
    let outcomes: Vec<(bool, String)> = waiters
        .into_iter()
        .zip(["w1", "w2"])
        .map(|(rx, w)| match rx.recv_timeout(PROMPT) {
            Ok((reply, at)) => {
                let after = at.duration_since(migrated_at).as_millis();
                let refused = matches!(&reply, Err(e)
                    if matches!(e.code(), Some("TRYAGAIN" | "MOVED" | "ASK")));
                let what = match reply {
                    Ok(Value::Int(t)) => {
                        format!("was GRANTED token {t} on the old node {}", src_node.addr())
                    }
                    Ok(Value::Nil) => "got nil (its BLOCK timeout)".to_string(),
                    other => format!("got {}", reply_text(other)),
                };
                (refused, format!("{w} {what}, {after} ms after the MIGRATE"))
            }
            Err(RecvTimeoutError::Timeout) => (
                false,
                format!("{w} was still blocked {PROMPT:?} after the MIGRATE"),
            ),
            Err(RecvTimeoutError::Disconnected) => (false, format!("{w}: its thread died")),
        })
        .collect();
    let outcomes_text: Vec<&str> = outcomes.iter().map(|(_, o)| o.as_str()).collect();
    if !outcomes.iter().all(|(refused, _)| *refused) {
        let (src_keys, dst_keys) = (keys_in_slot(&mut a, slot), keys_in_slot(&mut b, slot));
        let src_info = reply_text(run(&mut a, &["LOCK.INFO", key]));
        let _: RedisResult<Value> = run(&mut b, &["ASKING"]);
        let dst_info = reply_text(run(&mut b, &["LOCK.INFO", key]));
        panic!(
            "waiters of a migrated slot:\n  {}\nsource {} now holds {src_keys} key(s) in slot \
             {slot}, LOCK.INFO there: {src_info}; target {} holds {dst_keys}, LOCK.INFO there \
             (ASKING): {dst_info}",
            outcomes_text.join("\n  "),
            src_node.addr(),
            dst_node.addr(),
        );
    }
    println!("waiters after the MIGRATE: {outcomes_text:?}");
    assert_eq!(blocked_clients(&mut a), 0);
    assert_eq!(nodes::info_int(&mut a, "lock", "lock_waiters"), 0);

    // Mid-migration, the source answers ASK for the absent key, as for SET; the target serves
    // it after ASKING and redirects without.
    let ask = format!("ASK {slot} {}", dst_node.addr());
    assert_eq!(
        error_text(
            "LOCK.ACQUIRE",
            run(&mut a, &["LOCK.ACQUIRE", key, "x", "1000"])
        ),
        ask
    );
    assert_eq!(error_text("SET", run(&mut a, &["SET", key, "v"])), ask);
    assert_eq!(
        error_text("LOCK.FENCE", run(&mut b, &["LOCK.FENCE", key])),
        format!("MOVED {slot} {}", src_node.addr())
    );
    ok(run(&mut b, &["ASKING"]), "ASKING");
    assert_eq!(lock_info(&mut b, key), Some(("holder".into(), token, 0)));

    // Close the migration: target, source, and the third master.
    let node_cmd = ["CLUSTER", "SETSLOT", &slot_arg, "NODE", dst_id];
    ok(run(&mut b, &node_cmd), "SETSLOT NODE on the target");
    ok(run(&mut a, &node_cmd), "SETSLOT NODE on the source");
    ok(
        run(&mut cluster.master(third), &node_cmd),
        "SETSLOT NODE on the third master",
    );
    let dst_port = dst_node.port();
    cluster.wait_converged(|view| {
        view.iter()
            .any(|n| n.port == dst_port && n.slots.iter().any(|&(x, y)| (x..=y).contains(&slot)))
    });

    // Exactly one master holds the key, the target, with the original holder and token; each
    // replica has what its master has.
    for s in 0..MASTERS {
        let mut m = cluster.master(s);
        assert!(wait_one_replica(&mut m) >= 1, "WAIT 1 1000 on master {s}");
        let expected = i64::from(s == dst);
        assert_eq!(
            keys_in_slot(&mut m, slot),
            expected,
            "keys in slot {slot} on master {s}"
        );
        // WAIT counts a replica's acknowledgement, but one that the cluster's start had sent
        // into a full sync may still be loading it (seen once on Valkey 8.1): wait for it.
        let mut r = cluster.replica(s);
        common::wait_until(
            &format!("{expected} key(s) in slot {slot} on replica {s}"),
            std::time::Duration::from_secs(10),
            || {
                let n: redis::RedisResult<i64> = redis::cmd("CLUSTER")
                    .arg("COUNTKEYSINSLOT")
                    .arg(slot)
                    .query(&mut r);
                n == Ok(expected)
            },
        );
    }
    assert_eq!(lock_info(&mut b, key), Some(("holder".into(), token, 0)));
    assert_eq!(fence_check(&mut b, key, token), 1);
    let moved = format!("MOVED {slot} {}", dst_node.addr());
    assert_eq!(
        error_text(
            "LOCK.ACQUIRE",
            run(&mut a, &["LOCK.ACQUIRE", key, "x", "1000"])
        ),
        moved
    );
    assert_eq!(error_text("SET", run(&mut a, &["SET", key, "v"])), moved);

    // A waiter that retries from the old node follows MOVED, waits on the new one, and gets
    // the lock when the holder (also redirected) releases it.
    let retry = spawn_waiter(src_node.port(), key, "w1", 20_000, true);
    wait_blocked(&mut b, 1);
    assert_eq!(
        reply_text(run_routed(
            src_node.port(),
            &["LOCK.RELEASE", key, "holder"]
        )),
        "1"
    );
    let (reply, _) = retry.recv_timeout(PATIENCE).expect("the retried waiter");
    let next = match reply {
        Ok(Value::Int(t)) => t,
        other => panic!("the retried waiter: expected a token, got {other:?}"),
    };
    assert!(next > token, "token after the migration {next} <= {token}");
    assert_eq!(lock_info(&mut b, key), Some(("w1".into(), next, 0)));
    assert_eq!(release(&mut b, key, "w1"), 1);
}
