//! `LOCK.WAITING` reveals key names (issue 32): a user sees only the contended keys it could
//! read with `LOCK.INFO`, by its ACL key patterns; the default user sees them all.

use std::thread;

use redis::Value;

use crate::common::*;
use crate::sessions_common::*;

/// The key names `LOCK.WAITING` shows this connection.
fn shown(c: &mut redis::Connection) -> Vec<String> {
    match call(c, "LOCK.WAITING", &["COUNT", "1000"]).unwrap() {
        Value::Array(rows) => rows
            .into_iter()
            .map(|r| match r {
                Value::Array(f) => match &f[3] {
                    Value::BulkString(k) => String::from_utf8(k.clone()).unwrap(),
                    other => panic!("{other:?}"),
                },
                other => panic!("{other:?}"),
            })
            .collect(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_user_sees_only_the_contended_keys_its_patterns_let_it_read() {
    let server = Server::start();
    let mut admin = server.conn();
    let mut waiters = vec![];
    for key in ["app:a", "other:b", "app:c"] {
        must_acquire(&mut admin, key, "holder", 60_000);
        let before = blocked_clients(&mut admin);
        let mut conn = server.conn();
        let key = key.to_string();
        waiters.push(thread::spawn(move || {
            call(
                &mut conn,
                "LOCK.ACQUIRE",
                &[&key, "w", "1000", "BLOCK", "0"],
            )
        }));
        wait_blocked(&mut admin, before + 1);
    }
    let mut all = shown(&mut admin);
    all.sort();
    assert_eq!(all, ["app:a", "app:c", "other:b"]);
    let mut app = user_conn(&server, &mut admin, "app", &["~app:*", "+@all"]);
    let mut mine = shown(&mut app);
    mine.sort();
    assert_eq!(mine, ["app:a", "app:c"]);
    // Write-only patterns do not let it read a key: nothing shown.
    let mut writer = user_conn(&server, &mut admin, "writer", &["%W~*", "+@all"]);
    assert_eq!(shown(&mut writer), Vec::<String>::new());
    let mut nothing = user_conn(&server, &mut admin, "nokeys", &["+@all"]);
    assert_eq!(shown(&mut nothing), Vec::<String>::new());
    for key in ["app:a", "other:b", "app:c"] {
        assert_eq!(release(&mut admin, key, "holder"), 1);
    }
    for w in waiters {
        assert!(matches!(w.join().unwrap(), Ok(Value::Int(_))));
    }
}
