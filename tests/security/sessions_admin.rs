//! `LOCK.SESSION LIST` and `KILL` are for administrators (issue 32): the default user may run
//! them on any session; a user granted the lock commands (`+@lock` where the server has that
//! category, the commands by name on Redis 7.0, the whole `lock.session` container, or
//! `+@all -@admin`) may not. "Administrator" is a user that may also run `CLIENT KILL`.
//! What they reveal: serials, ACL user names, client ids, ttls; never an id.

use redis::Value;

use crate::common::*;
use crate::sessions_common::*;

/// (the server has the built-in categories, it has `@lock`), from `INFO server`.
fn categories(c: &mut redis::Connection) -> (bool, bool) {
    let version = info_field(c, "server", "redis_version").unwrap();
    let valkey = info_field(c, "server", "valkey_version").is_some();
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap());
    let (major, minor) = (parts.next().unwrap(), parts.next().unwrap());
    (
        valkey || (major, minor) >= (7, 2),
        valkey || (major, minor) >= (7, 4),
    )
}

/// The serial of the one session on the node, as the default user lists it.
fn only_serial(admin: &mut redis::Connection) -> String {
    match session(admin, "LIST", &[]).unwrap() {
        Value::Array(reply) => match &reply[..] {
            [Value::BulkString(cursor), Value::Array(entries)] if cursor == b"0" => {
                assert_eq!(entries.len(), 1, "{entries:?}");
                match &entries[0] {
                    Value::Array(flat) => match &flat[..2] {
                        [Value::BulkString(k), Value::Int(serial)] if k == b"serial" => {
                            serial.to_string()
                        }
                        other => panic!("{other:?}"),
                    },
                    other => panic!("{other:?}"),
                }
            }
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

const BY_MODULE: &str =
    "NOPERM LOCK.SESSION {} is for administrators: the ACL user must also be allowed CLIENT KILL";

fn by_module(sub: &str) -> String {
    BY_MODULE.replace("{}", sub)
}

/// The server's own refusal of a command the user was not granted (the same words on Redis
/// 7.2+ and Valkey).
fn by_acl(user: &str, sub: &str) -> String {
    format!("NOPERM User {user} has no permissions to run the 'lock.session|{sub}' command")
}

#[test]
fn the_default_user_lists_and_kills_another_users_session() {
    let server = Server::start();
    let mut admin = server.conn();
    let mut app = user_conn(&server, &mut admin, "app", &["~lock:*", "+@all"]);
    let id = open(&mut app, 30_000, &[]);
    call(
        &mut app,
        "LOCK.ACQUIRE",
        &["lock:a", "me", "0", "SESSION", &id],
    )
    .unwrap();
    let page = format!("{:?}", session(&mut admin, "LIST", &[]).unwrap());
    assert!(page.contains("app"), "the user is shown: {page}");
    assert!(!page.contains(secret(&id)), "never the id: {page}");
    let serial = only_serial(&mut admin);
    assert_eq!(session(&mut admin, "KILL", &[&serial]), Ok(Value::Int(1)));
    assert_eq!(session(&mut app, "KEEPALIVE", &[&id]), Ok(Value::Nil));
}

#[test]
fn a_user_granted_the_lock_commands_is_refused() {
    let server = Server::start();
    let mut admin = server.conn();
    let (builtin, own) = categories(&mut admin);
    let mut app = user_conn(&server, &mut admin, "app", &["~lock:*", "+@all"]);
    open(&mut app, 30_000, &[]);
    let serial = only_serial(&mut admin);
    // Granted by name, the whole container: the command runs, the module refuses.
    let mut named = user_conn(
        &server,
        &mut admin,
        "named",
        &["~lock:*", "+lock.acquire", "+lock.release", "+lock.session"],
    );
    assert_err(session(&mut named, "LIST", &[]), &by_module("LIST"));
    assert_err(session(&mut named, "KILL", &[&serial]), &by_module("KILL"));
    // Everything but @admin: where module commands have categories the server refuses it;
    // on Redis 7.0 (none) the module does.
    let mut most = user_conn(&server, &mut admin, "most", &["~*", "+@all", "-@admin"]);
    for (sub, args) in [("list", vec![]), ("kill", vec![serial.as_str()])] {
        let want = if builtin {
            by_acl("most", sub)
        } else {
            by_module(&sub.to_uppercase())
        };
        assert_err(session(&mut most, &sub.to_uppercase(), &args), &want);
    }
    if own {
        // `+@lock` grants every lock command, and not these two.
        let mut locker = user_conn(&server, &mut admin, "locker", &["~lock:*", "+@lock"]);
        assert!(matches!(
            session(&mut locker, "OPEN", &["1000"]),
            Ok(Value::BulkString(_))
        ));
        for (sub, args) in [("list", vec![]), ("kill", vec![serial.as_str()])] {
            assert_err(
                session(&mut locker, &sub.to_uppercase(), &args),
                &by_acl("locker", sub),
            );
        }
    }
    // Nothing was ended by the refusals.
    assert_eq!(only_serial_count(&mut admin), if own { 2 } else { 1 });
    // An operator granted the two subcommands and CLIENT KILL may run them.
    let mut operator = user_conn(
        &server,
        &mut admin,
        "operator",
        &["+lock.session|list", "+lock.session|kill", "+client|kill"],
    );
    assert!(session(&mut operator, "LIST", &[]).is_ok());
    assert_eq!(
        session(&mut operator, "KILL", &[&serial]),
        Ok(Value::Int(0))
    );
}

fn only_serial_count(admin: &mut redis::Connection) -> usize {
    match session(admin, "LIST", &["0", "COUNT", "1000"]).unwrap() {
        Value::Array(reply) => match &reply[..] {
            [_, Value::Array(entries)] => entries.len(),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}
