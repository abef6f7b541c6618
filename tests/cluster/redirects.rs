//! `MOVED`, `ASK` and `CROSSSLOT` for lock commands: the same replies as built-in commands on
//! the same keys.

use super::*;

/// A lock command on the wrong node gets exactly the `MOVED` a built-in command on the same key
/// gets; a blocking one too, without blocking. `CROSSSLOT` comes only from transactions and
/// scripts over two slots, and is the same as for `SET`/`GET`.
#[test]
fn wrong_node_and_cross_slot_errors_are_those_of_built_in_commands() {
    let _turn = one_at_a_time();
    let cluster = Cluster::start();
    let mut any = cluster.nodes[0].conn();

    // MOVED, from every other master, for every lock command.
    for s in 0..MASTERS {
        let key = &cluster.keys_on(&mut any, s, 1, "moved")[0];
        let slot = keyslot(&mut any, key);
        let moved = format!("MOVED {slot} {}", cluster.master_node(s).addr());
        for other in (0..MASTERS).filter(|&o| o != s) {
            let mut c = cluster.master(other);
            let pairs: [(&[&str], &[&str]); 5] = [
                (&["LOCK.ACQUIRE", key, "a", "1000"], &["SET", key, "v"]),
                (
                    &["LOCK.ACQUIRE", key, "a", "1000", "BLOCK", "0"],
                    &["BLPOP", key, "0"],
                ),
                (&["LOCK.RELEASE", key, "a"], &["DEL", key]),
                (
                    &["LOCK.EXTEND", key, "a", "1000"],
                    &["PEXPIRE", key, "1000"],
                ),
                (&["LOCK.FENCE", key], &["GET", key]),
            ];
            for (lock_cmd, builtin) in pairs {
                let ours = error_text(lock_cmd[0], run(&mut c, lock_cmd));
                assert_eq!(ours, moved, "{lock_cmd:?} on master {other}");
                assert_eq!(error_text(builtin[0], run(&mut c, builtin)), moved);
            }
            assert_eq!(
                error_text("LOCK.INFO", run(&mut c, &["LOCK.INFO", key])),
                moved
            );
            assert_eq!(
                blocked_clients(&mut c),
                0,
                "a redirected BLOCK must not block"
            );
        }
        // The owner serves it.
        let mut m = cluster.master(s);
        must_acquire(&mut m, key, "a", 10_000);
        assert_eq!(release(&mut m, key, "a"), 1);
    }

    // Two keys of one master, in different slots.
    let [k1, k2]: [String; 2] = cluster
        .keys_on(&mut any, 0, 2, "crossslot")
        .try_into()
        .unwrap();
    let remote = &cluster.keys_on(&mut any, 1, 1, "crossslot-remote")[0];
    let mut m = cluster.master(0);
    let transaction = |c: &mut Connection, cmds: &[&[&str]]| -> Vec<String> {
        let mut out = vec![reply_text(run(c, &["MULTI"]))];
        out.extend(cmds.iter().map(|cmd| reply_text(run(c, cmd))));
        out.push(reply_text(run(c, &["EXEC"])));
        out
    };
    let crossslot = "CROSSSLOT Keys in request don't hash to the same slot";
    let locks = transaction(
        &mut m,
        &[
            &["LOCK.ACQUIRE", &k1, "a", "10000"],
            &["LOCK.ACQUIRE", &k2, "a", "10000"],
        ],
    );
    let sets = transaction(&mut m, &[&["SET", &k1, "v"], &["SET", &k2, "v"]]);
    assert_eq!(locks, sets, "MULTI over two slots: lock vs SET");
    assert_eq!(locks, ["OK", "QUEUED", "QUEUED", crossslot]);
    let mixed = transaction(
        &mut m,
        &[&["LOCK.ACQUIRE", &k1, "a", "10000"], &["SET", &k2, "v"]],
    );
    assert_eq!(mixed, ["OK", "QUEUED", "QUEUED", crossslot]);
    assert_eq!(
        fence(&mut m, &k1),
        None,
        "nothing of a CROSSSLOT EXEC applies"
    );

    // A key of another master inside MULTI: MOVED when queued, then EXECABORT, as for SET.
    let locks = transaction(
        &mut m,
        &[
            &["LOCK.ACQUIRE", &k1, "a", "10000"],
            &["LOCK.ACQUIRE", remote, "a", "10000"],
        ],
    );
    let sets = transaction(&mut m, &[&["SET", &k1, "v"], &["SET", remote, "v"]]);
    assert_eq!(locks, sets, "MULTI with a remote key: lock vs SET");
    assert_eq!(
        locks[3],
        "EXECABORT Transaction discarded because of previous errors."
    );
    assert_eq!(fence(&mut m, &k1), None);

    // One slot through a hash tag: the transaction runs.
    let (t1, t2) = ("{order:7}:a", "{order:7}:b");
    let tag_slot = keyslot(&mut any, t1);
    let mut tm = cluster.master(cluster.shard_of(tag_slot));
    let tagged = transaction(
        &mut tm,
        &[
            &["LOCK.ACQUIRE", t1, "a", "10000"],
            &["LOCK.ACQUIRE", t2, "a", "10000"],
        ],
    );
    assert!(
        tagged[3].starts_with('[') && !tagged[3].contains("nil"),
        "MULTI over one hash tag: {tagged:?}"
    );
    assert!(fence(&mut tm, t1).is_some() && fence(&mut tm, t2).is_some());

    // LOCK.MACQUIRE / LOCK.MRELEASE: the key specs (numkeys) let the server itself answer
    // CROSSSLOT for keys of two slots, as for MSET, and MOVED from a node that does not own
    // the slot; keys sharing a hash tag are taken and released together on their master.
    let multi: [&[&str]; 2] = [
        &["LOCK.MACQUIRE", "2", &k1, &k2, "a", "10000"],
        &["LOCK.MRELEASE", "2", &k1, &k2, "a"],
    ];
    for cmd in multi {
        assert_eq!(reply_text(run(&mut m, cmd)), crossslot, "{cmd:?}");
    }
    assert_eq!(
        reply_text(run(&mut m, &["MSET", &k1, "v", &k2, "v"])),
        crossslot
    );
    assert_eq!(fence(&mut m, &k1), None);
    let (o1, o2) = ("{order:8}:a", "{order:8}:b");
    let order_slot = keyslot(&mut any, o1);
    let order_shard = cluster.shard_of(order_slot);
    let mut other = cluster.master((order_shard + 1) % MASTERS);
    let moved = format!(
        "MOVED {order_slot} {}",
        cluster.master_node(order_shard).addr()
    );
    let take: &[&str] = &["LOCK.MACQUIRE", "2", o1, o2, "a", "10000"];
    assert_eq!(error_text("LOCK.MACQUIRE", run(&mut other, take)), moved);
    let mut om = cluster.master(order_shard);
    let tokens = reply_text(run(&mut om, take));
    assert!(
        tokens.starts_with('[') && !tokens.contains("nil"),
        "{tokens}"
    );
    assert!(fence(&mut om, o1).is_some() && fence(&mut om, o2).is_some());
    assert_eq!(
        reply_text(run(&mut om, &["LOCK.MRELEASE", "2", o1, o2, "a"])),
        "2"
    );
    assert_eq!(fence(&mut om, o1), None);

    // Scripts declaring keys of two slots.
    let script_over = |c: &mut Connection, command: &str| {
        let body = format!("return redis.call('{command}', KEYS[1])");
        reply_text(run(c, &["EVAL", &body, "2", &k1, &k2]))
    };
    assert_eq!(script_over(&mut m, "LOCK.FENCE"), crossslot);
    assert_eq!(script_over(&mut m, "GET"), crossslot);
    // A script touching a key it did not declare: on another master, refused as for SET; in
    // another slot of the same master, whatever the server does for SET (Redis 7.0 runs both).
    // The error names the script, so compare up to that.
    let undeclared = |c: &mut Connection, call: &str, key: &str| {
        let body = format!("return redis.call({call})");
        match run(c, &["EVAL", &body, "1", &k1, key]) {
            Ok(_) => "ran".to_string(),
            Err(e) => reply_text(Err(e))
                .split(" script:")
                .next()
                .unwrap_or_default()
                .to_string(),
        }
    };
    let lock_call = "'LOCK.ACQUIRE', ARGV[1], 'a', 1000";
    let set_call = "'SET', ARGV[1], 'v'";
    let ours = undeclared(&mut m, lock_call, remote);
    assert_eq!(
        ours,
        undeclared(&mut m, set_call, remote),
        "undeclared remote key"
    );
    assert!(ours.starts_with("ERR "), "undeclared remote key: {ours}");
    let [k3, k4]: [String; 2] = cluster
        .keys_on(&mut any, 0, 4, "crossslot")
        .split_off(2)
        .try_into()
        .unwrap();
    let ours = undeclared(&mut m, lock_call, &k3);
    let theirs = undeclared(&mut m, set_call, &k4);
    assert_eq!(ours, theirs, "undeclared key of another local slot");
    println!("a script touching an undeclared key of another slot on its node: {ours}");

    // The fenced write of the README works across keys that share a hash tag.
    let (lock_key, data_key) = ("{invoice:42}", "{invoice:42}:total");
    let mut im = cluster.master(cluster.shard_of(keyslot(&mut any, lock_key)));
    let token = must_acquire(&mut im, lock_key, "w", 10_000).to_string();
    let fenced_write = "if redis.call('LOCK.FENCE', KEYS[1], ARGV[1]) == 1 then \
                          return redis.call('SET', KEYS[2], ARGV[2]) \
                        end \
                        return redis.error_reply('STALE lock lost')";
    assert_eq!(
        reply_text(run(
            &mut im,
            &["EVAL", fenced_write, "2", lock_key, data_key, &token, "100"]
        )),
        "OK"
    );
    assert_eq!(reply_text(run(&mut im, &["GET", data_key])), "100");
}
