//! Naming waiters (issue 32): `LOCK.INFO` gives each queued waiter's client id, how long it has
//! waited and how long it may still wait, and a session hold's serial; `LOCK.WAITING` lists the
//! keys with waiters, most contended first.

use super::command_metadata::{field, pairs, text};
use super::*;

/// A waiter on a connection whose client id the test knows: (client id, its reply).
fn waiter_with_id(
    server: &Server,
    ctl: &mut Connection,
    key: &str,
    owner: &str,
    timeout: i64,
) -> (i64, JoinHandle<RedisResult<Value>>) {
    let before = blocked_clients(ctl);
    let mut conn = server.conn();
    let id: i64 = redis::cmd("CLIENT").arg("ID").query(&mut conn).unwrap();
    let cmd = block_cmd(key, owner, 10_000, timeout);
    let handle = thread::spawn(move || cmd.query(&mut conn));
    wait_blocked(ctl, before + 1);
    (id, handle)
}

fn int(v: &Value) -> i64 {
    match v {
        Value::Int(n) => *n,
        other => panic!("not an integer: {other:?}"),
    }
}

/// `LOCK.INFO key`'s queue: each waiter's fields in reply order.
fn queue(c: &mut Connection, key: &str) -> Vec<Vec<(String, Value)>> {
    let info = pairs(&lock_info(c, key).unwrap());
    match field(&info, "queue") {
        Value::Array(entries) => entries.iter().map(pairs).collect(),
        other => panic!("queue {other:?}"),
    }
}

#[test]
fn lock_info_names_each_waiter_and_the_session_of_a_hold() {
    let (server, mut c) = start();
    let key = unique_key("waiters");
    let id = match call(&mut c, "LOCK.SESSION", &["OPEN", "30000"]).unwrap() {
        Value::BulkString(id) => String::from_utf8(id).unwrap(),
        other => panic!("{other:?}"),
    };
    call(
        &mut c,
        "LOCK.ACQUIRE",
        &[&key, "holder", "0", "SESSION", &id],
    )
    .unwrap();
    let (first, w1) = waiter_with_id(&server, &mut c, &key, "w1", 0);
    let (second, w2) = waiter_with_id(&server, &mut c, &key, "w2", 20_000);

    // The hold names its session by serial, as LOCK.SESSION LIST shows it.
    let listed = match call(&mut c, "LOCK.SESSION", &["LIST"]).unwrap() {
        Value::Array(page) => match &page[1] {
            Value::Array(entries) => int(field(&pairs(&entries[0]), "serial")),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    };
    let info = pairs(&lock_info(&mut c, &key).unwrap());
    let Value::Array(holders) = field(&info, "holders") else {
        panic!("{info:?}")
    };
    let holder = pairs(&holders[0]);
    assert_eq!(field(&holder, "session"), &Value::Int(listed));
    assert!(!format!("{info:?}").contains(&id[id.find('}').unwrap() + 1..]));

    // Each waiter: the fields it always had first, then who and how long.
    let q = queue(&mut c, &key);
    assert_eq!(q.len(), 2);
    for (entry, (owner, client)) in q.iter().zip([("w1", first), ("w2", second)]) {
        let names: Vec<&str> = entry.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["mode", "owner", "client", "waited", "timeout"]);
        assert_eq!(
            field(entry, "mode"),
            &Value::SimpleString("exclusive".into())
        );
        assert_eq!(field(entry, "owner"), &bulk(owner));
        assert_eq!(field(entry, "client"), &Value::Int(client));
        assert!(int(field(entry, "waited")) >= 0);
    }
    assert_eq!(
        field(&q[0], "timeout"),
        &Value::Int(-1),
        "BLOCK 0: no limit"
    );
    let left = int(field(&q[1], "timeout"));
    assert!((1..=20_000).contains(&left), "{left}");
    // The client id is the one CLIENT LIST shows blocked in LOCK.ACQUIRE.
    let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut c).unwrap();
    let line = list
        .lines()
        .find(|l| l.starts_with(&format!("id={second} ")))
        .unwrap();
    assert!(
        line.contains("cmd=lock.acquire") && line.contains("flags=b"),
        "{line}"
    );
    // Time passes for the waiters: `waited` grows and `timeout` shrinks by as much.
    let before = (int(field(&q[1], "waited")), left);
    let after = wait_for("the waiters to have waited longer", PATIENCE, || {
        let q = queue(&mut c, &key);
        let now = (int(field(&q[1], "waited")), int(field(&q[1], "timeout")));
        (now.0 >= before.0 + 20).then_some(now)
    });
    assert!(after.1 < before.1, "{before:?} -> {after:?}");
    assert!(after.0 + after.1 <= 20_000 + 1, "{after:?}");

    assert_eq!(
        call(&mut c, "LOCK.SESSION", &["CLOSE", &id]),
        Ok(Value::Int(1))
    );
    granted(w1);
    assert_eq!(release(&mut c, &key, "w1"), 1);
    granted(w2);
}

/// `LOCK.WAITING args...` as (db, key, waiters, oldest) rows.
fn waiting(c: &mut Connection, args: &[&str]) -> Vec<(i64, String, i64, i64)> {
    match call(c, "LOCK.WAITING", args).unwrap() {
        Value::Array(rows) => rows
            .iter()
            .map(|r| {
                let f = pairs(r);
                let names: Vec<&str> = f.iter().map(|(k, _)| k.as_str()).collect();
                assert_eq!(names, ["db", "key", "waiters", "oldest"]);
                (
                    int(field(&f, "db")),
                    text(field(&f, "key")),
                    int(field(&f, "waiters")),
                    int(field(&f, "oldest")),
                )
            })
            .collect(),
        other => panic!("LOCK.WAITING: {other:?}"),
    }
}

#[test]
fn waiting_lists_the_contended_keys_most_first() {
    let (server, mut c) = start();
    assert_eq!(waiting(&mut c, &[]), vec![]);
    let (a, b, d) = (unique_key("busy"), unique_key("older"), unique_key("newer"));
    for k in [&a, &b, &d] {
        must_acquire(&mut c, k, "holder", 60_000);
    }
    // b's waiter queues first, then three on a, then one on d.
    let mut waiters = vec![start_waiter(&server, &mut c, &b, "x", 1000, 0)];
    for i in 0..3 {
        waiters.push(start_waiter(&server, &mut c, &a, &format!("a{i}"), 1000, 0));
    }
    waiters.push(start_waiter(&server, &mut c, &d, "y", 1000, 0));
    // `oldest` is in whole ms: wait until b's waiter is ahead of d's by one.
    let rows = wait_for("b's waiter to be older than d's", PATIENCE, || {
        let rows = waiting(&mut c, &[]);
        (rows.len() == 3 && rows[1].3 > rows[2].3).then_some(rows)
    });
    let shape: Vec<(i64, &str, i64)> = rows.iter().map(|r| (r.0, r.1.as_str(), r.2)).collect();
    assert_eq!(
        shape,
        [(0, a.as_str(), 3), (0, b.as_str(), 1), (0, d.as_str(), 1)]
    );
    assert!(rows[0].3 >= rows[2].3, "{rows:?}");
    assert_eq!(waiting(&mut c, &["COUNT", "1"]).len(), 1);
    assert_err(
        call(&mut c, "LOCK.WAITING", &["COUNT", "0"]),
        "ERR COUNT must be an integer from 1 to 1000",
    );
    // Once served, a key leaves the list.
    assert_eq!(release(&mut c, &b, "holder"), 1);
    wait_until("b has no waiter", PATIENCE, || {
        waiting(&mut c, &[]).iter().all(|r| r.1 != b)
    });
    for k in [&a, &d] {
        assert_eq!(call(&mut c, "DEL", &[k.as_str()]), Ok(Value::Int(1)));
    }
    for w in waiters {
        w.join().unwrap().unwrap();
    }
}
