//! `LOCK.INFO`: nil for a free or expired lock; owner, token, ttl and waiters of a held one,
//! as a flat array under RESP2 and a map under RESP3; its errors.

use super::*;

/// Check a RESP2 `LOCK.INFO` reply: a flat array `owner <bulk> token <int> ttl <int> waiters
/// <int>` in that order, with `0 < ttl <= max_ttl`.
#[track_caller]
fn assert_info_resp2(reply: Value, owner: &[u8], token: i64, max_ttl: i64, waiters: i64) {
    let Value::Array(items) = reply else {
        panic!("LOCK.INFO: expected an array, got {reply:?}");
    };
    assert_eq!(
        items.len(),
        16,
        "LOCK.INFO: expected 16 elements, got {items:?}"
    );
    let ttl = match items[5] {
        Value::Int(ttl) => ttl,
        ref other => panic!("LOCK.INFO ttl: expected an integer, got {other:?}"),
    };
    assert!(
        ttl > 0 && ttl <= max_ttl,
        "LOCK.INFO ttl = {ttl}, expected in 1..={max_ttl}"
    );
    // The hold, at the top and again as the only holder.
    let hold = vec![
        bulk("owner"),
        bulk(owner),
        bulk("token"),
        Value::Int(token),
        bulk("ttl"),
        Value::Int(ttl),
    ];
    let mut want = hold.clone();
    want.extend([
        bulk("waiters"),
        Value::Int(waiters),
        bulk("mode"),
        Value::SimpleString("exclusive".into()),
        bulk("limit"),
        Value::Nil,
        bulk("holders"),
        Value::Array(vec![Value::Array(hold)]),
    ]);
    assert_eq!(items[..14], want, "LOCK.INFO reply");
    assert_eq!(items[14], bulk("queue"));
    match &items[15] {
        Value::Array(queue) => assert_eq!(queue.len() as i64, waiters, "queue {queue:?}"),
        other => panic!("LOCK.INFO queue: expected an array, got {other:?}"),
    }
}

#[test]
fn info_is_nil_for_a_free_lock_and_describes_a_held_one() {
    let (_server, mut c) = start();
    let key = unique_key("info");
    let owner: &[u8] = b"own\x00er\xff\r\n";

    assert_eq!(lock_info(&mut c, &key), Ok(Value::Nil), "never acquired");

    let token = must_acquire(&mut c, &key, owner, 10_000);
    assert_info_resp2(lock_info(&mut c, &key).unwrap(), owner, token, 10_000, 0);

    // Extending keeps the token and moves the ttl.
    assert_eq!(extend(&mut c, &key, owner, 60_000), 1);
    let reply = lock_info(&mut c, &key).unwrap();
    let Value::Array(ref items) = reply else {
        panic!("LOCK.INFO after EXTEND: {reply:?}");
    };
    assert!(
        matches!(items[5], Value::Int(ttl) if ttl > 10_000 && ttl <= 60_000),
        "ttl after EXTEND to 60000: {:?}",
        items[5]
    );
    assert_info_resp2(reply, owner, token, 60_000, 0);

    assert_eq!(release(&mut c, &key, owner), 1);
    assert_eq!(lock_info(&mut c, &key), Ok(Value::Nil), "released");
}

#[test]
fn info_is_nil_once_the_hold_expired() {
    let (_server, mut c) = start();
    let key = unique_key("info");
    // With active expiry off the key stays until something touches it: LOCK.INFO must not
    // report a hold past its deadline either way.
    let _: () = redis::cmd("DEBUG")
        .arg("SET-ACTIVE-EXPIRE")
        .arg(0)
        .query(&mut c)
        .unwrap();
    let token = must_acquire(&mut c, &key, "a", 30);
    match lock_info(&mut c, &key).unwrap() {
        Value::Nil => {} // a slow machine may already be past 30 ms
        reply => assert_info_resp2(reply, b"a", token, 30, 0),
    }
    wait_until("LOCK.INFO to turn nil after the ttl", PATIENCE, || {
        lock_info(&mut c, &key) == Ok(Value::Nil)
    });
    assert_eq!(
        fence(&mut c, &key),
        None,
        "LOCK.FENCE agrees the lock is free"
    );
}

#[test]
fn info_counts_the_waiters_in_the_queue() {
    let (server, mut c) = start();
    let key = unique_key("info");
    let token = must_acquire(&mut c, &key, "holder", LONG_TTL);
    let info = |c: &mut Connection| lock_info(c, &key).unwrap();

    let first = start_waiter(&server, &mut c, &key, "other-1", WAITER_TTL, 0);
    let second = start_waiter(&server, &mut c, &key, "other-2", WAITER_TTL, 0);
    assert_eq!(blocked_clients(&mut c), 2);
    assert_info_resp2(info(&mut c), b"holder", token, LONG_TTL, 2);

    // Handoff: the first waiter holds it now, one is still queued.
    assert_eq!(release(&mut c, &key, "holder"), 1);
    let first_token = granted(first);
    assert!(
        first_token > token,
        "handoff token {first_token} <= {token}"
    );
    assert_info_resp2(info(&mut c), b"other-1", first_token, WAITER_TTL, 1);

    assert_eq!(release(&mut c, &key, "other-1"), 1);
    let second_token = granted(second);
    assert_info_resp2(info(&mut c), b"other-2", second_token, WAITER_TTL, 0);
    assert_eq!(blocked_clients(&mut c), 0);
}

#[test]
fn info_is_a_map_under_resp3() {
    let server = Server::start();
    let client = redis::Client::open(format!(
        "redis://127.0.0.1:{}/?protocol=resp3",
        server.port()
    ))
    .unwrap();
    let mut c = client.get_connection().expect("RESP3 connection");
    c.set_read_timeout(Some(PATIENCE)).unwrap();
    let key = unique_key("info");

    assert_eq!(
        lock_info(&mut c, &key),
        Ok(Value::Nil),
        "free lock under RESP3"
    );

    let owner: &[u8] = b"bin\x00ary";
    let token = must_acquire(&mut c, &key, owner, 10_000);
    let reply = lock_info(&mut c, &key).unwrap();
    let Value::Map(ref kvs) = reply else {
        panic!("LOCK.INFO under RESP3: expected a map, got {reply:?}");
    };
    assert_eq!(kvs.len(), 8, "LOCK.INFO map: {kvs:?}");
    let ttl = match kvs[2].1 {
        Value::Int(ttl) => ttl,
        ref other => panic!("ttl: expected an integer, got {other:?}"),
    };
    assert!(ttl > 0 && ttl <= 10_000, "ttl {ttl}");
    assert_eq!(
        *kvs,
        vec![
            (bulk("owner"), bulk(owner)),
            (bulk("token"), Value::Int(token)),
            (bulk("ttl"), Value::Int(ttl)),
            (bulk("waiters"), Value::Int(0)),
            (bulk("mode"), Value::SimpleString("exclusive".into())),
            (bulk("limit"), Value::Nil),
            (
                bulk("holders"),
                Value::Array(vec![Value::Map(vec![
                    (bulk("owner"), bulk(owner)),
                    (bulk("token"), Value::Int(token)),
                    (bulk("ttl"), Value::Int(ttl)),
                ])])
            ),
            (bulk("queue"), Value::Array(vec![])),
        ]
    );
}

#[test]
fn info_rejects_bad_arity_and_other_types() {
    let (_server, mut c) = start();
    let arity = "ERR wrong number of arguments for 'lock.info' command";
    assert_err(call::<&str>(&mut c, "LOCK.INFO", &[]), arity);
    assert_err(call(&mut c, "LOCK.INFO", &["a", "b"]), arity);
    assert_err(call(&mut c, "LOCK.INFO", &["a", "b", "c"]), arity);

    let key = unique_key("info");
    let _: () = redis::cmd("SET").arg(&key).arg("v").query(&mut c).unwrap();
    assert_err(lock_info(&mut c, &key), WRONGTYPE);
}
