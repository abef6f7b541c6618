//! `LOCK.SESSION LIST` and `KILL` (issue 32): an administrator pages through every session of
//! the node and ends one as an expiry would. Who may run them is in
//! `tests/security/sessions_admin.rs`.

use super::*;
use harness::feed::FeedSubscriber;

/// One entry of `LOCK.SESSION LIST`: its fields in the reply's order.
type Entry = Vec<(String, Value)>;

fn pairs(v: Value) -> Entry {
    let items: Vec<(Value, Value)> = match v {
        Value::Array(flat) => flat
            .chunks(2)
            .map(|kv| (kv[0].clone(), kv[1].clone()))
            .collect(),
        Value::Map(m) => m,
        other => panic!("LIST entry {other:?}"),
    };
    items
        .into_iter()
        .map(|(k, v)| match k {
            Value::BulkString(k) => (String::from_utf8(k).unwrap(), v),
            other => panic!("field name {other:?}"),
        })
        .collect()
}

/// `LOCK.SESSION LIST args...` -> (next cursor, entries).
#[track_caller]
fn list(c: &mut Connection, args: &[&str]) -> (String, Vec<Entry>) {
    match session(c, "LIST", args) {
        Ok(Value::Array(reply)) => match <[Value; 2]>::try_from(reply) {
            Ok([Value::BulkString(cursor), Value::Array(entries)]) => (
                String::from_utf8(cursor).unwrap(),
                entries.into_iter().map(pairs).collect(),
            ),
            Ok(other) => panic!("LIST: {other:?}"),
            Err(other) => panic!("LIST: {other:?}"),
        },
        other => panic!("LIST: {other:?}"),
    }
}

fn field<'a>(entry: &'a Entry, name: &str) -> &'a Value {
    &entry.iter().find(|(k, _)| k == name).unwrap().1
}

fn int(v: &Value) -> i64 {
    match v {
        Value::Int(n) => *n,
        other => panic!("not an integer: {other:?}"),
    }
}

/// Every session on the node, page by page with `COUNT count`: (entries, pages).
fn list_all(c: &mut Connection, count: usize) -> (Vec<Entry>, usize) {
    let (mut all, mut cursor, mut pages) = (vec![], "0".to_string(), 0);
    loop {
        let (next, entries) = list(c, &[&cursor, "COUNT", &count.to_string()]);
        assert!(entries.len() <= count);
        all.extend(entries);
        pages += 1;
        if next == "0" {
            return (all, pages);
        }
        cursor = next;
    }
}

#[test]
fn list_pages_through_every_session_once_and_never_shows_an_id() {
    let (server, mut c) = start();
    assert_eq!(list(&mut c, &[]), ("0".to_string(), vec![]));
    let mut ids = vec![];
    for _ in 0..24 {
        ids.push(open(&mut c, 30_000, &[]));
    }
    // One of a kind: bound to `holder`, a lock-delay, two holds.
    let mut holder = server.conn();
    let bound = open(&mut holder, 20_000, &["BOUND", "LOCKDELAY", "250"]);
    acquire_in(&mut holder, &new_key(), "h", 0, &bound, &[]);
    acquire_in(&mut holder, &new_key(), "h", 0, &bound, &[]);
    ids.push(bound.clone());
    let holder_id = client_id(&mut holder);

    let (all, pages) = list_all(&mut c, 7);
    assert_eq!((all.len(), pages), (25, 4));
    let mut serials: Vec<i64> = all.iter().map(|e| int(field(e, "serial"))).collect();
    serials.sort_unstable();
    serials.dedup();
    assert_eq!(serials.len(), 25, "a serial seen twice");
    // The default page is 10.
    assert_eq!(list(&mut c, &[]).1.len(), 10);
    for entry in &all {
        let names: Vec<&str> = entry.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "serial",
                "user",
                "bound",
                "ttl",
                "lockdelay",
                "holds",
                "grace",
                "detached"
            ]
        );
        assert_eq!(
            field(entry, "user"),
            &Value::BulkString(b"default".to_vec())
        );
    }
    let special: Vec<&Entry> = all
        .iter()
        .filter(|e| field(e, "lockdelay") == &Value::Int(250))
        .collect();
    assert_eq!(special.len(), 1);
    assert_eq!(field(special[0], "bound"), &Value::Int(holder_id));
    assert_eq!(field(special[0], "holds"), &Value::Int(2));
    assert!((1..=20_000).contains(&int(field(special[0], "ttl"))));
    for plain in all
        .iter()
        .filter(|e| field(e, "lockdelay") == &Value::Int(0))
    {
        assert_eq!(field(plain, "bound"), &Value::Nil);
        assert_eq!(field(plain, "holds"), &Value::Int(0));
        assert!((20_000..=30_000).contains(&int(field(plain, "ttl"))));
    }
    // The ids are secrets: no part of one is in any page.
    let text = format!("{:?}", session(&mut c, "LIST", &["0", "COUNT", "1000"]));
    for id in &ids {
        assert!(!text.contains(&id[id.find('}').unwrap() + 1..]));
    }
    // A page started from a serial that is not a session starts at the next one.
    let (_, from) = list(&mut c, &[&(serials[3] + 1).to_string(), "COUNT", "1"]);
    assert_eq!(field(&from[0], "serial"), &Value::Int(serials[4]));
    // Past the last serial: an empty last page.
    let past = (serials[24] + 1).to_string();
    assert_eq!(list(&mut c, &[&past]), ("0".to_string(), vec![]));
}

#[test]
fn list_and_kill_refuse_bad_arguments() {
    let (_server, mut c) = start();
    let cases: [(&[&str], &str); 8] = [
        (
            &["LIST", "x"],
            "ERR cursor must be an integer from 0 (a serial LIST returned)",
        ),
        (
            &["LIST", "0", "COUNT", "0"],
            "ERR COUNT must be an integer from 1 to 1000",
        ),
        (
            &["LIST", "COUNT", "1001"],
            "ERR COUNT must be an integer from 1 to 1000",
        ),
        (
            &["LIST", "0", "COUNT"],
            "ERR syntax error: COUNT needs a number",
        ),
        (
            &["LIST", "0", "MATCH", "x"],
            "ERR syntax error: unexpected argument 'MATCH'",
        ),
        (
            &["KILL"],
            "ERR wrong number of arguments for 'lock.session|kill' command",
        ),
        (
            &["KILL", "0"],
            "ERR serial must be a positive integer (as LOCK.SESSION LIST shows it)",
        ),
        (
            &["KILL", "1", "2"],
            "ERR wrong number of arguments for 'lock.session|kill' command",
        ),
    ];
    for (args, want) in cases {
        assert_err(call(&mut c, "LOCK.SESSION", args), want);
    }
    assert_eq!(session(&mut c, "KILL", &["12345"]), Ok(Value::Nil));
}

/// The one session on the node: its serial.
fn only_serial(c: &mut Connection) -> String {
    let (_, entries) = list(c, &[]);
    assert_eq!(entries.len(), 1, "{entries:?}");
    int(field(&entries[0], "serial")).to_string()
}

#[test]
fn kill_ends_a_session_as_an_expiry_would_and_the_replica_agrees() {
    let (primary, replica) = primary_and_replica(&[]);
    let mut c = primary.conn();
    let (key, other) = (new_key(), new_key());
    let (mut feed, _) = FeedSubscriber::watching(primary.port(), 0, key.as_bytes());
    // Another user's unbound session: only an administrator's KILL ends it before its ttl.
    redis::cmd("ACL")
        .arg(&["SETUSER", "app", "on", ">pw", "~*", "&*", "+@all"])
        .query::<()>(&mut c)
        .unwrap();
    let mut app = redis::Client::open(format!("redis://app:pw@{}/", primary.addr()))
        .unwrap()
        .get_connection()
        .unwrap();
    let id = open(&mut app, 60_000, &["LOCKDELAY", "60000"]);
    let token = acquire_in(&mut app, &key, "holder", 0, &id, &[]);
    acquire_in(&mut app, &other, "holder", 0, &id, &[]);
    let serial = only_serial(&mut c);
    wait_for_replica_sync(&primary, &replica);
    let mut r = replica.conn();
    assert_eq!(only_serial(&mut r), serial, "the replica lists it too");
    assert_err_code(session(&mut r, "KILL", &[&serial]), "READONLY");

    assert_eq!(session(&mut c, "KILL", &[&serial]), Ok(Value::Int(2)));
    assert_eq!(session(&mut c, "KILL", &[&serial]), Ok(Value::Nil));
    assert_eq!(keepalive(&mut app, &id), None, "the session is gone");
    assert_eq!(list(&mut c, &[]), ("0".to_string(), vec![]));
    // The holds are lost, not released: the lock-delay keeps both keys.
    for k in [&key, &other] {
        assert_eq!(
            lock_info_field(&mut c, k, "holders"),
            Some(Value::Array(vec![]))
        );
        let Some(Value::Int(delayed)) = lock_info_field(&mut c, k, "delayed") else {
            panic!("{k}: no lock-delay");
        };
        assert!((1..=60_000).contains(&delayed), "{delayed}");
        assert_eq!(acquire(&mut c, k, "someone", 1000), None);
    }
    let acquired = feed.next_message();
    assert_eq!(
        (acquired.event.as_str(), acquired.token),
        ("acquired", token)
    );
    let lost = feed.next_message();
    assert_eq!(
        (lost.event.as_str(), lost.token),
        ("lost", token),
        "{lost:?}"
    );
    assert_eq!(lost.owner, b"holder");
    let delayed = feed.next_message();
    assert_eq!((delayed.event.as_str(), delayed.token), ("delayed", token));
    assert_eq!(info_int(&mut c, "lock", "lock_sessions_killed"), 1);
    assert_eq!(info_int(&mut c, "lock", "lock_sessions_expired"), 0);
    assert_eq!(info_int(&mut c, "lock", "lock_keys_in_lock_delay"), 2);
    // The replica ended it the same way (`ENDED ... LOST`): no session, the keys in delay.
    wait_for_replica_sync(&primary, &replica);
    assert_eq!(list(&mut r, &[]), ("0".to_string(), vec![]));
    for k in [&key, &other] {
        assert_eq!(
            lock_info_field(&mut r, k, "holders"),
            Some(Value::Array(vec![]))
        );
        assert!(matches!(lock_info_field(&mut r, k, "delayed"), Some(Value::Int(d)) if d > 0));
    }
}

#[test]
fn kill_hands_the_key_to_the_next_waiter() {
    let (server, mut c) = start();
    let key = new_key();
    let mut holder = server.conn();
    let id = open(&mut holder, 60_000, &["BOUND"]);
    acquire_in(&mut holder, &key, "holder", 0, &id, &[]);
    let next = Waiter::start(
        &server,
        &mut c,
        "LOCK.ACQUIRE",
        &[&key, "next", "10000", "BLOCK", "20000"],
    );
    let serial = only_serial(&mut c);
    assert_eq!(session(&mut c, "KILL", &[&serial]), Ok(Value::Int(1)));
    let (token, _) = next.granted();
    assert_eq!(fence(&mut c, &key), Some(token));
    // The connection it was bound to is still open; it just has no session any more.
    assert_eq!(keepalive(&mut holder, &id), None);
}
