//! The replies of every `LOCK.SESSION` subcommand and of `SESSION id` on acquires, and every
//! refusal (each changes nothing).

use super::*;

#[test]
fn open_keepalive_info_close() {
    let (_server, mut c) = start();
    let id = open(&mut c, 5_000, &["LOCKDELAY", "250"]);
    // `{tag}` and 32 hex digits: 128 random bits.
    let (tag, hex) = id[1..].split_once('}').expect("hash tag");
    assert!((1..=4).contains(&tag.len()), "{id}");
    assert_eq!(hex.len(), 32, "{id}");
    assert!(hex.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
    assert_ne!(open(&mut c, 5_000, &[]), id, "ids are fresh");

    let a = new_key();
    let b = new_key();
    let ta = acquire_in(&mut c, &a, "me", 0, &id, &[]);
    let tb = acquire_in(&mut c, &b, "me", 60_000, &id, &["SHARED", "LIMIT", "2"]);
    assert!(tb > ta);
    // ttl 0: no deadline of its own, so no Redis TTL.
    assert_eq!(pttl(&mut c, &a), -1);
    assert!(pttl(&mut c, &b) > 59_000);
    assert_eq!(info_of(&mut c, &id, "holds"), Value::Int(2));
    assert_eq!(info_of(&mut c, &id, "lockdelay"), Value::Int(250));
    assert_eq!(info_of(&mut c, &id, "bound"), Value::Nil);
    let Value::Int(ttl) = info_of(&mut c, &id, "ttl") else {
        panic!()
    };
    assert!((4_000..=5_000).contains(&ttl), "{ttl}");
    // A retry in the same session keeps the token.
    assert_eq!(acquire_in(&mut c, &a, "me", 0, &id, &[]), ta);
    // LOCK.INFO says a hold is in a session, never which one.
    assert_eq!(lock_info_field(&mut c, &a, "ttl"), Some(Value::Int(-1)));
    let info = format!("{:?}", call(&mut c, "LOCK.INFO", &[&a]).unwrap());
    assert!(!info.contains(hex), "LOCK.INFO shows the id: {info}");

    assert_eq!(
        session(&mut c, "KEEPALIVE", &[&id, "8000"]),
        Ok(Value::Int(8000))
    );
    assert_eq!(keepalive(&mut c, &id), Some(8000), "the new ttl sticks");
    assert_eq!(session(&mut c, "CLOSE", &[&id]), Ok(Value::Int(2)));
    assert_absent(&mut c, &a);
    assert_absent(&mut c, &b);
    assert_eq!(keepalive(&mut c, &id), None);
    assert_eq!(session_info(&mut c, &id), None);
    assert_eq!(session(&mut c, "CLOSE", &[&id]), Ok(Value::Nil));
    assert_eq!(session(&mut c, "ATTACH", &[&id]), Ok(Value::Nil));
    assert_eq!(info_int(&mut c, "lock", "lock_sessions_closed"), 1);
    assert_eq!(info_int(&mut c, "lock", "lock_session_holds_released"), 2);
    assert_eq!(info_int(&mut c, "lock", "lock_sessions"), 1);
}

#[test]
fn help_names_every_subcommand_a_client_may_send() {
    let (_server, mut c) = start();
    let Ok(Value::Array(lines)) = session(&mut c, "HELP", &[]) else {
        panic!("LOCK.SESSION HELP is not an array")
    };
    let lines: Vec<String> = lines
        .iter()
        .map(|l| match l {
            Value::SimpleString(s) => s.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        lines[0],
        "LOCK.SESSION <subcommand> [<arg> [value] [opt] ...]. Subcommands are:"
    );
    // A line per subcommand, then its description indented: the shape of the server's HELPs.
    let names: Vec<&str> = lines[1..]
        .iter()
        .filter(|l| !l.starts_with(' '))
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "OPEN",
            "KEEPALIVE",
            "CLOSE",
            "ATTACH",
            "INFO",
            "LIST",
            "KILL",
            "HELP"
        ]
    );
    assert_eq!(lines.len(), 1 + 2 * names.len());
    // The server's answer to an unknown subcommand points here, and HELP takes nothing.
    let unknown = session(&mut c, "NOSUCH", &[]).unwrap_err();
    assert!(
        unknown.to_string().contains("Try LOCK.SESSION HELP"),
        "{unknown}"
    );
    let extra = session(&mut c, "HELP", &["x"]).unwrap_err();
    assert_eq!(extra.code(), Some("ERR"), "{extra}");
    assert!(
        extra.to_string().contains("wrong number of arguments"),
        "{extra}"
    );
}

#[test]
fn a_session_hold_ends_at_its_own_deadline_or_the_sessions() {
    let (_server, mut c) = start();
    let id = open(&mut c, 60_000, &[]);
    let short = new_key();
    acquire_in(&mut c, &short, "me", 150, &id, &[]);
    // Its own deadline first: the session lives on.
    wait_until("the short hold expires", Duration::from_secs(5), || {
        acquire(&mut c, &short, "other", 1000).is_some()
    });
    assert!(keepalive(&mut c, &id).is_some());

    // EXTEND sets a session hold's own deadline, 0 for none; a plain hold refuses 0.
    let k = new_key();
    acquire_in(&mut c, &k, "me", 5_000, &id, &[]);
    assert_eq!(extend(&mut c, &k, "me", 0), 1);
    assert_eq!(pttl(&mut c, &k), -1);
    assert_eq!(extend(&mut c, &k, "me", 20_000), 1);
    assert!(pttl(&mut c, &k) > 19_000);
    let plain = new_key();
    must_acquire(&mut c, &plain, "me", 5_000);
    assert_err(
        call(&mut c, "LOCK.EXTEND", &[plain.as_str(), "me", "0"]),
        "ERR ttl-ms must be a positive integer",
    );
    assert_err(
        call(&mut c, "LOCK.EXTEND", &[new_key().as_str(), "me", "0"]),
        "ERR ttl-ms must be a positive integer",
    );
    assert!(pttl(&mut c, &plain) > 4_000);
}

#[test]
fn the_session_expires_without_keepalive() {
    let (server, mut c) = start();
    let id = open(&mut c, 300, &[]);
    let (a, b) = (new_key(), new_key());
    acquire_in(&mut c, &a, "me", 0, &id, &[]);
    acquire_in(&mut c, &b, "me", 0, &id, &["SHARED"]);
    // A waiter queued on `a` is served when the session expires, not at any TTL (there is
    // none).
    let waiter = Waiter::start(
        &server,
        &mut c,
        "LOCK.ACQUIRE",
        &[&a, "next", "5000", "BLOCK", "10000"],
    );
    // Granted within its 10 s wait, with no TTL anywhere: by the session's expiry (counted
    // below), not by a deadline of the hold's own.
    let (token, _) = waiter.granted();
    assert!(token > 0);
    assert_eq!(keepalive(&mut c, &id), None);
    assert_absent(&mut c, &b);
    assert_eq!(info_int(&mut c, "lock", "lock_sessions_expired"), 1);
    assert_eq!(info_int(&mut c, "lock", "lock_sessions"), 0);
}

#[test]
fn refusals_change_nothing() {
    let (_server, mut c) = start();
    let id = open(&mut c, 10_000, &[]);
    let k = new_key();
    let token = acquire_in(&mut c, &k, "me", 10_000, &id, &[]);
    let unknown = "{a}00000000000000000000000000000000";
    let no_such = "ERR no such session on this server (closed, expired, its connection closed, or opened on another node)";
    for extra in [&["SESSION", unknown][..], &["SESSION", "garbage"]] {
        assert_err(acquire_with(&mut c, &new_key(), "x", 1000, extra), no_such);
    }
    assert_err(
        call(
            &mut c,
            "LOCK.MACQUIRE",
            &["1", new_key().as_str(), "x", "0", "SESSION", unknown],
        ),
        no_such,
    );
    assert_eq!(keepalive(&mut c, unknown), None);
    // The same owner in another session, or outside any: an error, the hold unchanged.
    let other = open(&mut c, 10_000, &[]);
    let conflict = "ERR owner holds this lock in another session (or outside any); release it before acquiring it with another SESSION";
    assert_err(
        acquire_with(&mut c, &k, "me", 1000, &["SESSION", &other]),
        conflict,
    );
    assert_err(acquire_with(&mut c, &k, "me", 1000, &[]), conflict);
    assert_eq!(fence(&mut c, &k), Some(token));
    for (args, want) in [
        (
            &["OPEN"][..],
            "ERR wrong number of arguments for 'lock.session|open' command",
        ),
        (&["OPEN", "0"], "ERR ttl-ms must be a positive integer"),
        (&["OPEN", "-5"], "ERR ttl-ms must be a positive integer"),
        (&["OPEN", "x"], "ERR ttl-ms must be a positive integer"),
        (
            &["OPEN", "100", "LOCKDELAY", "60001"],
            "ERR LOCKDELAY must be an integer from 0 to 60000",
        ),
        (
            &["OPEN", "100", "BOUND", "BOUND"],
            "ERR syntax error: BOUND given more than once",
        ),
        (
            &["OPEN", "100", "NOPE"],
            "ERR syntax error: unexpected argument 'NOPE'",
        ),
        (
            &["OPEN", "86400001"],
            "ERR ttl-ms is larger than lock.max-session-ttl-ms (86400000)",
        ),
        (
            &["KEEPALIVE", id.as_str(), "0"],
            "ERR ttl-ms must be a positive integer",
        ),
        (
            &["KEEPALIVE"],
            "ERR wrong number of arguments for 'lock.session|keepalive' command",
        ),
        (
            &["ATTACH", id.as_str()],
            "ERR the session was opened without BOUND; only a BOUND session can be attached",
        ),
        (
            &["FROB", "x"],
            "ERR unknown subcommand 'FROB'. Try LOCK.SESSION HELP.",
        ),
        (
            &["RESTORE", "{a}x", "1", "1", "1", "0", "0", "default"],
            "ERR LOCK.SESSION RESTORE is internal: only the replication link and AOF loading may call it",
        ),
        (
            &["ENDED", "1", "1", "LOST"],
            "ERR LOCK.SESSION ENDED is internal: only the replication link and AOF loading may call it",
        ),
        (
            &["renew", "x", "y", "z"],
            "ERR LOCK.SESSION RENEW is internal: only the replication link and AOF loading may call it",
        ),
    ] {
        assert_err(call(&mut c, "LOCK.SESSION", args), want);
    }
    assert_err(
        acquire_with(&mut c, &new_key(), "x", 1000, &["SESSION", &id, "LOCKDELAY", "5"]),
        "ERR syntax error: a hold in a SESSION takes the session's LOCKDELAY; give it to LOCK.SESSION OPEN",
    );
    assert_err(
        acquire_with(&mut c, &new_key(), "x", 0, &[]),
        "ERR ttl-ms must be a positive integer",
    );
    // Nothing above changed the session or the hold.
    assert_eq!(info_of(&mut c, &id, "holds"), Value::Int(1));
    assert_eq!(fence(&mut c, &k), Some(token));
    assert_eq!(info_int(&mut c, "lock", "lock_sessions"), 2);
}

#[test]
fn bound_and_attach_are_refused_from_scripts() {
    let (_server, mut c) = start();
    let from_script = |c: &mut Connection, script: &str, args: &[&str]| {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(script).arg(0);
        for a in args {
            cmd.arg(*a);
        }
        cmd.query::<Value>(c)
    };
    let bound = from_script(
        &mut c,
        "return redis.call('LOCK.SESSION', 'OPEN', '1000', 'BOUND')",
        &[],
    );
    assert!(
        format!("{bound:?}").contains(
            "BOUND cannot be used from a script or function (its client never disconnects)"
        ),
        "{bound:?}"
    );
    assert_eq!(info_int(&mut c, "lock", "lock_sessions"), 0);
    // An unbound session from a script is fine, and so are keepalives.
    let id = match from_script(
        &mut c,
        "return redis.call('LOCK.SESSION', 'OPEN', '1000')",
        &[],
    ) {
        Ok(Value::BulkString(id)) => String::from_utf8(id).unwrap(),
        other => panic!("{other:?}"),
    };
    let attach = from_script(
        &mut c,
        "return redis.call('LOCK.SESSION', 'ATTACH', ARGV[1])",
        &[&id],
    );
    assert!(
        format!("{attach:?}").contains("ATTACH cannot be used from a script"),
        "{attach:?}"
    );
    assert_eq!(keepalive(&mut c, &id), Some(1000));
}

#[test]
fn a_session_belongs_to_the_acl_user_that_opened_it() {
    let (_server, mut c) = start();
    redis::cmd("ACL")
        .arg(&["SETUSER", "eve", "on", ">pw", "~*", "&*", "+@all"])
        .query::<()>(&mut c)
        .unwrap();
    let id = open(&mut c, 10_000, &[]);
    let mut eve = _server.conn();
    redis::cmd("AUTH")
        .arg("eve")
        .arg("pw")
        .query::<()>(&mut eve)
        .unwrap();
    let theirs = "NOPERM this session was opened by another ACL user";
    for sub in ["KEEPALIVE", "CLOSE", "INFO"] {
        assert_err(session(&mut eve, sub, &[&id]), theirs);
    }
    assert_err(
        acquire_with(&mut eve, &new_key(), "eve", 1000, &["SESSION", &id]),
        theirs,
    );
    assert!(
        keepalive(&mut c, &id).is_some(),
        "the owner's session is untouched"
    );
}

#[test]
fn session_commands_stay_out_of_monitor_and_slowlog() {
    let (server, mut c) = start();
    redis::cmd("CONFIG")
        .arg(&["SET", "slowlog-log-slower-than", "0"])
        .query::<()>(&mut c)
        .unwrap();
    redis::cmd("SLOWLOG")
        .arg("RESET")
        .query::<()>(&mut c)
        .unwrap();
    // MONITOR on a raw socket: everything it prints until our marker.
    let mut monitor = std::net::TcpStream::connect(server.addr()).unwrap();
    monitor.write_all(b"MONITOR\r\n").unwrap();
    let mut reader = BufReader::new(monitor.try_clone().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert_eq!(line.trim_end(), "+OK");
    let id = open(&mut c, 10_000, &[]);
    keepalive(&mut c, &id);
    redis::cmd("PING")
        .arg("marker")
        .query::<String>(&mut c)
        .unwrap();
    let mut seen = String::new();
    loop {
        line.clear();
        reader.read_line(&mut line).unwrap();
        seen.push_str(&line);
        if line.contains("marker") {
            break;
        }
    }
    assert!(
        !seen.to_lowercase().contains("lock.session"),
        "MONITOR saw: {seen}"
    );
    let slowlog = format!(
        "{:?}",
        redis::cmd("SLOWLOG")
            .arg("GET")
            .arg(100)
            .query::<Value>(&mut c)
            .unwrap()
    );
    assert!(!slowlog.contains(&id[5..]), "SLOWLOG has the id: {slowlog}");
    assert!(
        slowlog.contains("marker"),
        "SLOWLOG recorded nothing at all: {slowlog}"
    );
}

/// The id is declared as a key flagged `NOT_KEY` of each subcommand that takes one: `COMMAND
/// INFO` gives its position (a cluster client routes by it, and the server redirects by it:
/// `tests/cluster/sessions.rs`), while `COMMAND GETKEYS`, like the ACL key check, skips it.
#[test]
fn the_id_routes_like_a_key_but_is_not_one() {
    let (_server, mut c) = start();
    let id = open(&mut c, 10_000, &[]);
    let info: Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("lock.session")
        .query(&mut c)
        .unwrap();
    let Value::Array(commands) = info else {
        panic!("COMMAND INFO: {info:?}")
    };
    let Value::Array(container) = &commands[0] else {
        panic!("COMMAND INFO lock.session: {commands:?}")
    };
    let Value::Array(subs) = &container[9] else {
        panic!("no subcommands: {container:?}")
    };
    let mut positions: Vec<(String, i64, i64, i64, String)> = subs
        .iter()
        .map(|sub| {
            let Value::Array(f) = sub else {
                panic!("{sub:?}")
            };
            let int = |v: &Value| match v {
                Value::Int(n) => *n,
                other => panic!("{other:?}"),
            };
            let name = match &f[0] {
                Value::BulkString(b) => String::from_utf8(b.clone()).unwrap(),
                Value::SimpleString(s) => s.clone(),
                other => panic!("{other:?}"),
            };
            (
                name,
                int(&f[3]),
                int(&f[4]),
                int(&f[5]),
                format!("{:?}", f[8]),
            )
        })
        .collect();
    positions.sort();
    let named: Vec<(&str, i64, i64, i64)> = positions
        .iter()
        .map(|(n, a, b, c, _)| (n.as_str(), *a, *b, *c))
        .collect();
    assert_eq!(
        named,
        [
            ("lock.session|attach", 2, 2, 1),
            ("lock.session|close", 2, 2, 1),
            ("lock.session|ended", 0, 0, 0),
            ("lock.session|help", 0, 0, 0),
            ("lock.session|info", 2, 2, 1),
            ("lock.session|keepalive", 2, 2, 1),
            ("lock.session|kill", 0, 0, 0),
            ("lock.session|list", 0, 0, 0),
            ("lock.session|open", 0, 0, 0),
            ("lock.session|renew", 0, 0, 0),
            ("lock.session|restore", 0, 0, 0),
        ]
    );
    for (name, first, _, _, specs) in &positions {
        if *first == 2 {
            assert!(specs.contains("not_key"), "{name} key spec: {specs}");
        }
    }
    for sub in ["KEEPALIVE", "CLOSE", "ATTACH", "INFO"] {
        assert_err(
            redis::cmd("COMMAND")
                .arg("GETKEYS")
                .arg("LOCK.SESSION")
                .arg(sub)
                .arg(&id)
                .query::<Value>(&mut c),
            "ERR The command has no key arguments",
        );
    }
}

#[test]
fn session_limits() {
    let server =
        Server::start_with_module_args(&["max-sessions", "2", "max-session-holds", "2"], &[]);
    let mut c = server.conn();
    let id = open(&mut c, 10_000, &[]);
    open(&mut c, 10_000, &[]);
    assert_err(
        session(&mut c, "OPEN", &["1000"]),
        "ERR too many sessions (lock.max-sessions is 2)",
    );
    acquire_in(&mut c, &new_key(), "me", 0, &id, &[]);
    let second = new_key();
    acquire_in(&mut c, &second, "me", 0, &id, &[]);
    assert_err(
        acquire_with(&mut c, &new_key(), "me", 0, &["SESSION", &id]),
        "ERR the session has too many holds (lock.max-session-holds is 2)",
    );
    // A hold released makes room again.
    assert_eq!(release(&mut c, &second, "me"), 1);
    acquire_in(&mut c, &new_key(), "me", 0, &id, &[]);
}
