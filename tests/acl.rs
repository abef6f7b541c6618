//! ACL categories: where the server can set them (Redis 7.2+, Valkey), the commands are in the
//! built-in categories that match their flags, and in `@lock` where the server lets a module
//! add a category (Redis 7.4+, Valkey 8+). On Redis 7.0 they are in none, and the module loads:
//! there a user is granted them by name, and no category grants or denies them.

mod common;

use common::*;
use redis::Connection;

/// What the running server should support, from `INFO server`.
fn expected(con: &mut Connection) -> (bool, bool) {
    let version = info_field(con, "server", "redis_version").unwrap();
    let valkey = info_field(con, "server", "valkey_version").is_some();
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap());
    let (major, minor) = (parts.next().unwrap(), parts.next().unwrap());
    let builtin = valkey || (major, minor) >= (7, 2);
    let own = valkey || (major, minor) >= (7, 4);
    (builtin, own)
}

fn category(con: &mut Connection, name: &str) -> Vec<String> {
    let mut cmds: Vec<String> = redis::cmd("ACL")
        .arg("CAT")
        .arg(name)
        .query::<Vec<String>>(con)
        .unwrap()
        .into_iter()
        .filter(|c| c.starts_with("lock."))
        .collect();
    cmds.sort();
    cmds
}

#[test]
fn commands_are_in_the_categories_the_server_supports() {
    let srv = Server::start();
    let mut con = srv.conn();
    let (builtin, own) = expected(&mut con);
    if !builtin {
        for cat in ["write", "read", "fast", "slow", "blocking"] {
            assert_eq!(category(&mut con, cat), Vec::<String>::new(), "@{cat}");
        }
        assert_err(
            redis::cmd("ACL")
                .arg("CAT")
                .arg("lock")
                .query::<Vec<String>>(&mut con),
            "ERR Unknown category 'lock'",
        );
        assert!(srv.log().contains("commands are in no ACL category"));
        must_acquire(&mut con, &unique_key("acl"), "me", 10_000);
        return;
    }
    assert_eq!(
        category(&mut con, "write"),
        [
            "lock.acquire",
            "lock.extend",
            "lock.load",
            "lock.macquire",
            "lock.mrelease",
            "lock.release",
            "lock.session|attach",
            "lock.session|close",
            "lock.session|ended",
            "lock.session|keepalive",
            "lock.session|kill",
            "lock.session|open",
            "lock.session|renew",
            "lock.session|restore",
            "lock.unwatch",
            "lock.watch"
        ]
    );
    assert_eq!(
        category(&mut con, "read"),
        [
            "lock.fence",
            "lock.info",
            "lock.session|info",
            "lock.session|list",
            "lock.waiting"
        ]
    );
    // The administrators' subcommands (issue 32), and only they.
    for admin in ["admin", "dangerous"] {
        assert_eq!(
            category(&mut con, admin),
            ["lock.session|kill", "lock.session|list"]
        );
    }
    assert_eq!(
        category(&mut con, "blocking"),
        ["lock.acquire", "lock.macquire"]
    );
    assert_eq!(
        category(&mut con, "slow"),
        [
            "lock.load",
            "lock.macquire",
            "lock.mrelease",
            "lock.session|attach",
            "lock.session|close",
            "lock.session|ended",
            "lock.session|help",
            "lock.session|info",
            "lock.session|keepalive",
            "lock.session|kill",
            "lock.session|list",
            "lock.session|open",
            "lock.session|renew",
            "lock.session|restore",
            "lock.waiting"
        ]
    );
    assert_eq!(
        category(&mut con, "fast"),
        [
            "lock.acquire",
            "lock.extend",
            "lock.fence",
            "lock.info",
            "lock.release",
            "lock.unwatch",
            "lock.watch"
        ]
    );
    if own {
        // Eleven commands and nine of LOCK.SESSION's subcommands (each has its own ACL bit):
        // not LIST and KILL, which are for administrators.
        assert_eq!(category(&mut con, "lock").len(), 20);
    } else {
        assert_err(
            redis::cmd("ACL")
                .arg("CAT")
                .arg("lock")
                .query::<Vec<String>>(&mut con),
            "ERR Unknown category 'lock'",
        );
    }
}

#[test]
fn a_user_granted_write_and_read_can_lock_and_one_denied_write_cannot() {
    let srv = Server::start();
    let mut con = srv.conn();
    let builtin = expected(&mut con).0;
    for (user, rules) in [
        ("app", "on >pw ~* +@write +@read"),
        ("viewer", "on >pw ~* +@read"),
        ("named", "on >pw ~* +lock.acquire +lock.fence +lock.release"),
        ("nowrite", "on >pw ~* +@all -@write"),
    ] {
        let mut cmd = redis::cmd("ACL");
        cmd.arg("SETUSER").arg(user);
        for r in rules.split(' ') {
            cmd.arg(r);
        }
        let _: () = cmd.query(&mut con).unwrap();
    }
    let key = unique_key("acl");
    let auth = |con: &mut Connection, user: &str| {
        let _: () = redis::cmd("AUTH").arg(user).arg("pw").query(con).unwrap();
    };
    if !builtin {
        // Redis 7.0 and 7.1: the commands are in no category, so a category grants or denies
        // none of them; a user is granted them by name.
        let login = |user: &str| {
            let mut c = srv.conn();
            auth(&mut c, user);
            c
        };
        let (mut app, mut named, mut nowrite) = (login("app"), login("named"), login("nowrite"));
        let refused =
            |cmd: &str| format!("NOPERM this user has no permissions to run the '{cmd}' command");
        assert_err(
            call(&mut app, "LOCK.ACQUIRE", &[key.as_str(), "me", "10000"]),
            &refused("lock.acquire"),
        );
        assert_err(
            call(&mut app, "LOCK.FENCE", &[key.as_str()]),
            &refused("lock.fence"),
        );
        let token = must_acquire(&mut named, &key, "me", 10_000);
        assert_eq!(fence(&mut named, &key), Some(token));
        assert_err(
            call(&mut named, "LOCK.EXTEND", &[key.as_str(), "me", "10000"]),
            &refused("lock.extend"),
        );
        // And `-@write` cannot keep a user from taking a lock there.
        let other = unique_key("acl");
        assert!(must_acquire(&mut nowrite, &other, "me", 10_000) > token);
        assert_eq!(release(&mut nowrite, &other, "me"), 1);
        assert_eq!(release(&mut named, &key, "me"), 1);
        return;
    }
    let mut app = srv.conn();
    auth(&mut app, "app");
    let token = must_acquire(&mut app, &key, "me", 10_000);
    assert_eq!(fence(&mut app, &key), Some(token));
    let mut viewer = srv.conn();
    auth(&mut viewer, "viewer");
    assert_eq!(fence(&mut viewer, &key), Some(token));
    assert_err_code(
        call(
            &mut viewer,
            "LOCK.ACQUIRE",
            &[key.as_str(), "other", "10000"],
        ),
        "NOPERM",
    );
    assert_eq!(release(&mut app, &key, "me"), 1);
}
