//! With `BLOCK`, the multi-key queue: a set is granted all at once when its last key frees, in
//! arrival order with single-key waiters and without deadlock; timeouts, expiry, type changes,
//! a full queue, deletion and demotion.

use super::*;

#[test]
fn a_blocked_set_is_granted_all_at_once_when_its_last_key_frees() {
    let (server, mut c) = start();
    let ks = keys(3);
    let a = must_acquire(&mut c, &ks[0], "h-a", LONG_TTL);
    let b = must_acquire(&mut c, &ks[2], "h-b", LONG_TTL);
    let set = Blocked::set(&server, &mut c, &ks, "order-1", "0");
    assert_eq!(lock_info_field(&mut c, "waiting_keys"), 3);
    // One key freed: still nothing for the set, and the freed key stays free.
    assert_eq!(release(&mut c, &ks[0], "h-a"), 1);
    assert_eq!(blocked_clients(&mut c), 1);
    assert_all_absent(&mut c, &ks[..2]);
    assert_eq!(release(&mut c, &ks[2], "h-b"), 1);
    let got = set.tokens();
    assert_eq!(got.len(), 3);
    assert!(got.iter().all(|t| *t > a.max(b)));
    for (key, token) in ks.iter().zip(&got) {
        assert_held(&mut c, key, *token, WAITER_TTL);
    }
    assert_eq!(lock_info_field(&mut c, "waiting_keys"), 0);
    assert_eq!(mrelease(&mut c, &ks, "order-1"), 3);
}

#[test]
fn a_later_single_key_waiter_never_overtakes_a_set_and_disjoint_keys_are_not_delayed() {
    let (server, mut c) = start();
    let ks = keys(3); // ks[0], ks[1]: the set; ks[2]: a key outside it
    must_acquire(&mut c, &ks[0], "h-0", LONG_TTL);
    must_acquire(&mut c, &ks[1], "h-1", LONG_TTL);
    must_acquire(&mut c, &ks[2], "h-2", LONG_TTL);
    let set = Blocked::set(&server, &mut c, &ks[..2], "order-1", "0");
    let later = Blocked::one(&server, &mut c, &ks[0], "later");
    let disjoint = Blocked::one(&server, &mut c, &ks[2], "disjoint");
    // ks[0] is freed while the set still waits for ks[1]: it stays free for the set.
    assert_eq!(release(&mut c, &ks[0], "h-0"), 1);
    assert_eq!(blocked_clients(&mut c), 3);
    assert_absent(&mut c, &ks[0]);
    // ... and a non-blocking acquire or set on it is refused (queued waiters go first).
    assert_eq!(acquire(&mut c, &ks[0], "barger", LONG_TTL), None);
    assert_eq!(macquire(&mut c, &ks[..1], "barger", LONG_TTL), None);
    // A key outside the set is handed off at once.
    assert_eq!(release(&mut c, &ks[2], "h-2"), 1);
    let d = disjoint.token();
    assert_held(&mut c, &ks[2], d, WAITER_TTL);
    // The set goes first, then the later waiter.
    assert_eq!(release(&mut c, &ks[1], "h-1"), 1);
    let got = set.tokens();
    assert_eq!(blocked_clients(&mut c), 1);
    assert_eq!(mrelease(&mut c, &ks[..2], "order-1"), 2);
    let t = later.token();
    assert!(t > got[1]);
    assert_held(&mut c, &ks[0], t, WAITER_TTL);
}

#[test]
fn overlapping_sets_and_a_single_waiter_keep_arrival_order_without_deadlock() {
    let (server, mut c) = start();
    let ks = keys(3); // A, B, C
    let (a, b, cc) = (&ks[0], &ks[1], &ks[2]);
    macquire(&mut c, &[a.clone(), cc.clone()], "holder", LONG_TTL).unwrap();
    // w1 wants {A, B}, w2 wants {B, C} (listed the other way round), w3 wants B alone.
    let w1 = Blocked::set(&server, &mut c, &[a.clone(), b.clone()], "w1", "0");
    let w2 = Blocked::set(&server, &mut c, &[cc.clone(), b.clone()], "w2", "0");
    let w3 = Blocked::one(&server, &mut c, b, "w3");
    assert_eq!(mrelease(&mut c, &[a.clone(), cc.clone()], "holder"), 2);
    // w1 goes; w2 is at the head of C (free) but behind w1 on B: it waits, C stays free.
    let t1 = w1.tokens();
    assert_eq!(blocked_clients(&mut c), 2);
    assert_absent(&mut c, cc);
    assert_eq!(mrelease(&mut c, &[a.clone(), b.clone()], "w1"), 2);
    let t2 = w2.tokens();
    assert!(t2.iter().min() > t1.iter().max());
    assert_held(&mut c, cc, t2[0], WAITER_TTL);
    assert_held(&mut c, b, t2[1], WAITER_TTL);
    assert_absent(&mut c, a);
    assert_eq!(blocked_clients(&mut c), 1);
    assert_eq!(mrelease(&mut c, &[b.clone(), cc.clone()], "w2"), 2);
    let t3 = w3.token();
    assert!(t3 > t2[1]);
    assert_eq!(lock_info_field(&mut c, "waiting_keys"), 0);
}

#[test]
fn sets_in_opposite_key_order_do_not_deadlock() {
    let (server, mut c) = start();
    let ks = keys(2);
    let rev = vec![ks[1].clone(), ks[0].clone()];
    must_acquire(&mut c, &ks[0], "h", LONG_TTL);
    let mut waiters = vec![];
    for i in 0..6 {
        let order = if i % 2 == 0 { &ks } else { &rev };
        waiters.push((
            format!("w{i}"),
            Blocked::set(&server, &mut c, order, &format!("w{i}"), "0"),
        ));
    }
    assert_eq!(release(&mut c, &ks[0], "h"), 1);
    let mut last = 0;
    for (owner, w) in waiters {
        let got = w.tokens();
        assert!(
            got.iter().all(|t| *t > last),
            "{owner}: {got:?} after {last}"
        );
        last = *got.iter().max().unwrap();
        assert_eq!(mrelease(&mut c, &ks, &owner), 2);
    }
}

#[test]
fn a_waiting_set_whose_key_expires_is_granted_from_the_timer_in_one_transaction() {
    let (primary, replica) =
        primary_and_replica(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut c = primary.conn();
    let ks = keys(2);
    must_acquire(&mut c, &ks[0], "short", 300);
    let set = Blocked::set(&primary, &mut c, &ks, "order-1", "0");
    // Nobody releases: the holder's deadline passes and the timer hands over the set.
    let got = set.tokens();
    for (key, token) in ks.iter().zip(&got) {
        assert_held(&mut c, key, *token, WAITER_TTL);
    }
    wait_for_replica_sync(&primary, &replica);
    let mut r = replica.conn();
    for (key, token) in ks.iter().zip(&got) {
        assert_eq!(fence(&mut r, key), Some(*token), "{key} on the replica");
    }
    let commands = aof_commands(&aof_incr(&primary));
    let loads: Vec<usize> = commands
        .iter()
        .enumerate()
        .filter(|(_, c)| c[0] == "LOCK.LOAD" && c[2] == "order-1")
        .map(|(i, _)| i)
        .collect();
    assert_eq!(loads.len(), 2, "{commands:?}");
    let multi = commands[..loads[0]].iter().rposition(|c| c[0] == "MULTI");
    let exec = commands[loads[1]..].iter().position(|c| c[0] == "EXEC");
    let (Some(multi), Some(exec)) = (multi, exec) else {
        panic!("the grant is not inside MULTI/EXEC: {commands:?}");
    };
    assert!(
        commands[multi..loads[1] + exec]
            .iter()
            .all(|c| c[0] != "EXEC"),
        "one transaction: {commands:?}"
    );
}

#[test]
fn a_set_that_times_out_or_leaves_wakes_the_waiter_behind_it() {
    let (server, mut c) = start();
    let ks = keys(2);
    must_acquire(&mut c, &ks[1], "holder", LONG_TTL);
    // ks[0] is free; each set blocks the single waiter queued on ks[0] behind it.
    for how in ["timeout", "kill", "unblock", "unblock-error"] {
        let timeout = if how == "timeout" { "100" } else { "0" };
        let set = Blocked::set(&server, &mut c, &ks, "order-1", timeout);
        let behind = Blocked::one(&server, &mut c, &ks[0], "behind");
        let id = set.id.to_string();
        match how {
            "timeout" => assert_eq!(set.reply(), Ok(Value::Nil), "{how}"),
            "kill" => {
                assert_eq!(
                    call(&mut c, "CLIENT", &["KILL", "ID", &id]),
                    Ok(Value::Int(1))
                );
                // The killed connection is closed: no reply, not an error reply.
                let reply = set.reply();
                assert!(
                    matches!(&reply, Err(e) if e.is_connection_dropped()),
                    "{how}: {reply:?}"
                );
            }
            "unblock" => {
                assert_eq!(call(&mut c, "CLIENT", &["UNBLOCK", &id]), Ok(Value::Int(1)));
                assert_eq!(set.reply(), Ok(Value::Nil), "{how}");
            }
            _ => {
                assert_eq!(
                    call(&mut c, "CLIENT", &["UNBLOCK", &id, "ERROR"]),
                    Ok(Value::Int(1))
                );
                assert_err_code(set.reply(), "UNBLOCKED");
            }
        }
        // Out of both queues, and the waiter behind it on the free key is woken.
        let t = behind.token();
        assert_held(&mut c, &ks[0], t, WAITER_TTL);
        assert_eq!(lock_info_field(&mut c, "waiting_keys"), 0, "{how}");
        assert_eq!(release(&mut c, &ks[0], "behind"), 1);
    }
    assert_eq!(mrelease(&mut c, &ks, "order-1"), 0);
}

#[test]
fn block_inside_multi_or_a_script_does_not_block() {
    let (_server, mut c) = start();
    let ks = keys(2);
    must_acquire(&mut c, &ks[1], "holder", LONG_TTL);
    let args = macquire_args(&ks, "o", 1000, &["BLOCK", "0"]);
    let replies: Vec<Value> = redis::pipe()
        .atomic()
        .cmd("LOCK.MACQUIRE")
        .arg(&args)
        .query(&mut c)
        .unwrap();
    assert_eq!(replies, [Value::Nil]);
    let mut script_args = vec!["0".to_string()];
    script_args.extend(args);
    let mut eval = vec!["return redis.call('LOCK.MACQUIRE', unpack(ARGV))".to_string()];
    eval.extend(script_args);
    assert_eq!(call(&mut c, "EVAL", &eval), Ok(Value::Nil));
    assert_absent(&mut c, &ks[0]);
}

#[test]
fn a_key_that_changes_type_fails_the_waiting_set() {
    let (server, mut c) = start();
    let ks = keys(2);
    must_acquire(&mut c, &ks[1], "holder", LONG_TTL);
    let set = Blocked::set(&server, &mut c, &ks, "order-1", "0");
    redis::cmd("SET").arg(&ks[1]).arg("x").exec(&mut c).unwrap();
    assert_err_code(set.reply(), "WRONGTYPE");
    assert_absent(&mut c, &ks[0]);
    assert_eq!(lock_info_field(&mut c, "waiting_keys"), 0);
}

#[test]
fn a_full_queue_on_any_key_refuses_the_set() {
    let server = Server::start_with_module_args(&["max-waiters", "1"], &[]);
    let mut c = server.conn();
    let ks = keys(2);
    must_acquire(&mut c, &ks[1], "holder", LONG_TTL);
    let _w = Blocked::one(&server, &mut c, &ks[1], "w");
    assert_err(
        call(
            &mut c,
            "LOCK.MACQUIRE",
            &macquire_args(&ks, "o", 1000, &["BLOCK", "0"]),
        ),
        "ERR too many waiters on this key (lock.max-waiters is 1)",
    );
    assert_eq!(lock_info_field(&mut c, "waiting_keys"), 1);
}

#[test]
fn a_waiting_set_is_granted_when_its_held_keys_are_deleted_or_flushed() {
    let (server, mut c) = start();
    for how in ["DEL", "FLUSHALL"] {
        let ks = keys(3);
        must_acquire(&mut c, &ks[1], "holder", LONG_TTL);
        must_acquire(&mut c, &ks[2], "holder", LONG_TTL);
        let set = Blocked::set(&server, &mut c, &ks, "order-1", "0");
        match how {
            "DEL" => redis::cmd("DEL").arg(&ks[1..]).exec(&mut c).unwrap(),
            _ => redis::cmd("FLUSHALL").exec(&mut c).unwrap(),
        }
        let got = set.tokens();
        for (key, token) in ks.iter().zip(&got) {
            assert_held(&mut c, key, *token, WAITER_TTL);
        }
    }
}

#[test]
fn demotion_to_replica_fails_a_waiting_set() {
    let server = Server::start();
    let other = Server::start();
    let mut c = server.conn();
    let ks = keys(2);
    must_acquire(&mut c, &ks[1], "holder", LONG_TTL);
    let set = Blocked::set(&server, &mut c, &ks, "order-1", "0");
    let port = other.port().to_string();
    assert_eq!(
        call(&mut c, "REPLICAOF", &["127.0.0.1", &port]),
        Ok(Value::Okay)
    );
    match set.reply() {
        Err(e) if e.code().is_some() => {}
        other => panic!("after demotion: expected an error reply, got {other:?}"),
    }
    wait_blocked(&mut c, 0);
    assert_eq!(lock_info_field(&mut c, "waiting_keys"), 0);
}
