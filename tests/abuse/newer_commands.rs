//! Every bad input of the commands and options added after the core: `SHARED`/`LIMIT`,
//! `SESSION` and `LOCKDELAY` on `LOCK.ACQUIRE`, `LOCK.MACQUIRE`, `LOCK.MRELEASE`, every
//! subcommand of `LOCK.SESSION`, `LOCK.WATCH`/`LOCK.UNWATCH`. Against the same fixture as
//! `arguments` (a held key with a waiter behind it, a free key, keys of other types), each is
//! refused with its exact error and changes nothing; the replies that are not errors (nil for
//! an unknown session) are asserted exactly too.

use super::arguments::{args, arity, oversized_owner, Fixture, FREE, HASH, HELD, LIST, STRING};
use super::arguments::{BLOCK_INVALID, BLOCK_NEEDS, NOT_POSITIVE, OWNER_EMPTY, OWNER_TOO_LONG};
use super::arguments::{TOO_LARGE, WRONGTYPE};
use super::*;

const LIMIT_INVALID: &str = "ERR LIMIT must be a positive integer";
const LIMIT_NEEDS_SHARED: &str =
    "ERR syntax error: LIMIT needs SHARED (a semaphore is a shared lock with n permits)";
const DELAY_INVALID: &str = "ERR LOCKDELAY must be an integer from 0 to 60000";
const DELAY_WITH_SESSION: &str = "ERR syntax error: a hold in a SESSION takes the session's \
                                  LOCKDELAY; give it to LOCK.SESSION OPEN";
const NO_SUCH_SESSION: &str = "ERR no such session on this server (closed, expired, its \
                               connection closed, or opened on another node)";
const OTHER_SESSION: &str = "ERR owner holds this lock in another session (or outside any); \
                             release it before acquiring it with another SESSION";
const HELD_EXCLUSIVELY: &str =
    "ERR owner holds this lock exclusively; release it before acquiring it SHARED";
/// A well-formed id that no session has.
const UNKNOWN_ID: &str = "{abc}00000000000000000000000000000000";

/// Open a session on `c` (ttl long enough for the whole test) and return its id.
pub(super) fn open_session(c: &mut Connection, extra: &[&str]) -> String {
    let mut args = vec!["OPEN", "600000"];
    args.extend_from_slice(extra);
    match call(c, "LOCK.SESSION", &args) {
        Ok(Value::BulkString(id)) => String::from_utf8(id).unwrap(),
        other => panic!("LOCK.SESSION OPEN: {other:?}"),
    }
}

#[test]
fn acquire_options_bad_input_is_refused_and_changes_nothing() {
    let mut fx = Fixture::new();
    let id = open_session(&mut fx.c, &[]);
    let acq = "LOCK.ACQUIRE";
    let options: &[(&[&str], &str)] = &[
        (
            &["SHARED", "SHARED"],
            "ERR syntax error: SHARED given more than once",
        ),
        (
            &["shared", "Shared"],
            "ERR syntax error: SHARED given more than once",
        ),
        (&["LIMIT", "2"], LIMIT_NEEDS_SHARED),
        (&["limit", "2", "BLOCK", "10"], LIMIT_NEEDS_SHARED),
        (
            &["SHARED", "LIMIT"],
            "ERR syntax error: LIMIT needs a number of permits",
        ),
        (&["SHARED", "LIMIT", "0"], LIMIT_INVALID),
        (&["SHARED", "LIMIT", "-1"], LIMIT_INVALID),
        (&["SHARED", "LIMIT", "x"], LIMIT_INVALID),
        (&["SHARED", "LIMIT", ""], LIMIT_INVALID),
        (&["SHARED", "LIMIT", "+2"], LIMIT_INVALID),
        (&["SHARED", "LIMIT", "99999999999999999999"], LIMIT_INVALID),
        (
            &["SHARED", "LIMIT", "1", "LIMIT", "2"],
            "ERR syntax error: LIMIT given more than once",
        ),
        (&["SESSION"], "ERR syntax error: SESSION needs a session id"),
        (
            &["SESSION", ""],
            "ERR syntax error: SESSION needs a session id",
        ),
        (
            &["SESSION", "x", "SESSION", "y"],
            "ERR syntax error: SESSION given more than once",
        ),
        (&["SESSION", UNKNOWN_ID], NO_SUCH_SESSION),
        (&["SESSION", "garbage"], NO_SUCH_SESSION),
        (&["SESSION", "\u{4E00}"], NO_SUCH_SESSION),
        (
            &["LOCKDELAY"],
            "ERR syntax error: LOCKDELAY needs milliseconds",
        ),
        (&["LOCKDELAY", "-1"], DELAY_INVALID),
        (&["LOCKDELAY", "60001"], DELAY_INVALID),
        (&["LOCKDELAY", "1.5"], DELAY_INVALID),
        (&["LOCKDELAY", ""], DELAY_INVALID),
        (&["LOCKDELAY", "9223372036854775808"], DELAY_INVALID),
        (
            &["LOCKDELAY", "1", "lockdelay", "1"],
            "ERR syntax error: LOCKDELAY given more than once",
        ),
        (&["SESSION", &id, "LOCKDELAY", "5"], DELAY_WITH_SESSION),
        (&["LOCKDELAY", "0", "SESSION", &id], DELAY_WITH_SESSION),
        (
            &["SHARED", "LIMIT", "2", "FOO"],
            "ERR syntax error: unexpected argument 'FOO'",
        ),
        (&["BOUND"], "ERR syntax error: unexpected argument 'BOUND'"),
        (&["SHARED", "BLOCK"], BLOCK_NEEDS),
        (&["SHARED", "BLOCK", "-5"], BLOCK_INVALID),
    ];
    for owner in ["carol", "alice"] {
        for (opts, want) in options {
            let mut a = args![HELD, owner, "1000"];
            a.extend(opts.iter().map(|o| o.as_bytes().to_vec()));
            fx.refuses(acq, a, want);
        }
    }
    // ttl 0 is for session holds only; with an unknown session it is refused for the session.
    fx.refuses(acq, args![FREE, "carol", "0"], NOT_POSITIVE);
    fx.refuses(
        acq,
        args![FREE, "carol", "0", "LOCKDELAY", "10"],
        NOT_POSITIVE,
    );
    fx.refuses(
        acq,
        args![FREE, "carol", "0", "SESSION", UNKNOWN_ID],
        NO_SUCH_SESSION,
    );
    // alice holds HELD alone and outside any session: no SHARED, no other session.
    fx.refuses(
        acq,
        args![HELD, "alice", "1000", "SHARED"],
        HELD_EXCLUSIVELY,
    );
    fx.refuses(
        acq,
        args![HELD, "alice", "1000", "SHARED", "LIMIT", "3"],
        HELD_EXCLUSIVELY,
    );
    fx.refuses(
        acq,
        args![HELD, "alice", "1000", "SESSION", &id],
        OTHER_SESSION,
    );
    fx.refuses(
        acq,
        args![HELD, "alice", "0", "SESSION", &id],
        OTHER_SESSION,
    );
    for key in [STRING, LIST, HASH] {
        fx.refuses(acq, args![key, "alice", "1000", "SHARED"], WRONGTYPE);
        fx.refuses(acq, args![key, "alice", "0", "SESSION", &id], WRONGTYPE);
        fx.refuses(
            acq,
            args![key, "alice", "1000", "LOCKDELAY", "5"],
            WRONGTYPE,
        );
    }
    fx.finish();
}

#[test]
fn macquire_bad_input_is_refused_and_changes_nothing() {
    let mut fx = Fixture::new();
    let id = open_session(&mut fx.c, &[]);
    let m = "LOCK.MACQUIRE";
    let arity = arity(m);
    fx.refuses(m, args![], &arity);
    fx.refuses(m, args!["1"], &arity);
    fx.refuses(m, args!["1", FREE], &arity);
    fx.refuses(m, args!["1", FREE, "carol"], &arity);
    let numkeys = "ERR numkeys must be a positive integer";
    for n in [
        "0",
        "-1",
        "-0",
        "x",
        "",
        "1.5",
        "+1",
        "-99999999999999999999",
    ] {
        fx.refuses(m, args![n, FREE, "carol", "1000"], numkeys);
    }
    let larger = "ERR numkeys is larger than the number of keys given";
    fx.refuses(m, args!["2", FREE, "carol", "1000"], larger);
    fx.refuses(m, args!["3", FREE, HELD, "carol", "1000"], larger);
    let many = "ERR too many keys (lock.max-multi-keys is 64)";
    fx.refuses(m, args!["65", FREE, "carol", "1000"], many);
    fx.refuses(
        m,
        args!["99999999999999999999", FREE, "carol", "1000"],
        many,
    );
    fx.refuses(
        m,
        args!["2", FREE, FREE, "carol", "1000"],
        "ERR duplicate key 'abuse:free'",
    );
    fx.refuses(
        m,
        args!["3", FREE, HELD, FREE, "carol", "1000"],
        "ERR duplicate key 'abuse:free'",
    );
    for keys in [[FREE, HELD], [HELD, FREE]] {
        let with = |rest: &[&str]| {
            let mut a = args!["2", keys[0], keys[1]];
            a.extend(rest.iter().map(|r| r.as_bytes().to_vec()));
            a
        };
        fx.refuses(m, with(&["", "1000"]), OWNER_EMPTY);
        fx.refuses(m, with(&["carol", "0"]), NOT_POSITIVE);
        fx.refuses(m, with(&["carol", "-1"]), NOT_POSITIVE);
        fx.refuses(m, with(&["carol", "x"]), NOT_POSITIVE);
        fx.refuses(m, with(&["carol", "99999999999999999999"]), TOO_LARGE);
        fx.refuses(m, with(&["carol", "1000", "BLOCK"]), BLOCK_NEEDS);
        fx.refuses(m, with(&["carol", "1000", "BLOCK", "-1"]), BLOCK_INVALID);
        fx.refuses(
            m,
            with(&["carol", "1000", "SESSION"]),
            "ERR syntax error: SESSION needs a session id",
        );
        fx.refuses(
            m,
            with(&["carol", "1000", "SESSION", UNKNOWN_ID]),
            NO_SUCH_SESSION,
        );
        fx.refuses(
            m,
            with(&["carol", "0", "SESSION", UNKNOWN_ID]),
            NO_SUCH_SESSION,
        );
        for opt in ["SHARED", "LIMIT", "LOCKDELAY", "BOUND"] {
            fx.refuses(
                m,
                with(&["carol", "1000", opt, "1"]),
                &format!("ERR syntax error: unexpected argument '{opt}'"),
            );
        }
        // alice holds HELD outside any session.
        fx.refuses(m, with(&["alice", "1000", "SESSION", &id]), OTHER_SESSION);
    }
    fx.refuses(
        m,
        args!["1", FREE, oversized_owner(), "1000"],
        OWNER_TOO_LONG,
    );
    for key in [STRING, LIST, HASH] {
        fx.refuses(m, args!["2", FREE, key, "carol", "1000"], WRONGTYPE);
        fx.refuses(
            m,
            args!["2", key, FREE, "carol", "1000", "BLOCK", "0"],
            WRONGTYPE,
        );
    }
    fx.finish();
}

#[test]
fn mrelease_bad_input_is_refused_and_changes_nothing() {
    let mut fx = Fixture::new();
    let m = "LOCK.MRELEASE";
    let arity = arity(m);
    fx.refuses(m, args![], &arity);
    fx.refuses(m, args!["1"], &arity);
    fx.refuses(m, args!["1", HELD], &arity);
    for n in ["0", "-1", "x", ""] {
        fx.refuses(
            m,
            args![n, HELD, "alice"],
            "ERR numkeys must be a positive integer",
        );
    }
    fx.refuses(
        m,
        args!["2", HELD, "alice"],
        "ERR numkeys is larger than the number of keys given",
    );
    fx.refuses(
        m,
        args!["65", HELD, "alice"],
        "ERR too many keys (lock.max-multi-keys is 64)",
    );
    fx.refuses(
        m,
        args!["2", HELD, HELD, "alice"],
        "ERR duplicate key 'abuse:held'",
    );
    fx.refuses(
        m,
        args!["1", HELD, "alice", "extra"],
        "ERR syntax error: unexpected argument 'extra'",
    );
    fx.refuses(m, args!["1", HELD, ""], OWNER_EMPTY);
    fx.refuses(m, args!["1", HELD, oversized_owner()], OWNER_TOO_LONG);
    for key in [STRING, LIST, HASH] {
        fx.refuses(m, args!["2", HELD, key, "alice"], WRONGTYPE);
    }
    fx.finish();
}

#[test]
fn session_bad_input_is_refused_and_changes_nothing() {
    let mut fx = Fixture::new();
    let id = open_session(&mut fx.c, &[]);
    let s = "LOCK.SESSION";
    // Each subcommand is a command of its own (`lock.session|open`, ...): the server checks
    // its arity and words the error with its full name.
    let arity_of = |sub: &str| arity(&format!("{s}|{sub}"));
    fx.refuses(s, args![], &arity(s));
    fx.refuses(s, args!["OPEN"], &arity_of("open"));
    fx.refuses(s, args!["KEEPALIVE"], &arity_of("keepalive"));
    fx.refuses(s, args!["CLOSE"], &arity_of("close"));
    fx.refuses(s, args!["CLOSE", &id, "x"], &arity_of("close"));
    fx.refuses(s, args!["ATTACH", &id, "x"], &arity_of("attach"));
    fx.refuses(s, args!["INFO", &id, "x"], &arity_of("info"));
    fx.refuses(
        s,
        args!["KEEPALIVE", &id, "1000", "x"],
        &arity_of("keepalive"),
    );
    for ttl in ["0", "-1", "x", "", "1.5", "+5"] {
        fx.refuses(s, args!["OPEN", ttl], NOT_POSITIVE);
        fx.refuses(s, args!["KEEPALIVE", &id, ttl], NOT_POSITIVE);
    }
    fx.refuses(s, args!["OPEN", "99999999999999999999"], TOO_LARGE);
    let too_long = "ERR ttl-ms is larger than lock.max-session-ttl-ms (86400000)";
    fx.refuses(s, args!["OPEN", "86400001"], too_long);
    fx.refuses(s, args!["KEEPALIVE", &id, "86400001"], too_long);
    fx.refuses(
        s,
        args!["OPEN", "1000", "BOUND", "bound"],
        "ERR syntax error: BOUND given more than once",
    );
    fx.refuses(
        s,
        args!["OPEN", "1000", "LOCKDELAY"],
        "ERR syntax error: LOCKDELAY needs milliseconds",
    );
    fx.refuses(
        s,
        args!["OPEN", "1000", "LOCKDELAY", "60001"],
        DELAY_INVALID,
    );
    fx.refuses(s, args!["OPEN", "1000", "LOCKDELAY", "-1"], DELAY_INVALID);
    fx.refuses(
        s,
        args!["OPEN", "1000", "SESSION", "x"],
        "ERR syntax error: unexpected argument 'SESSION'",
    );
    fx.refuses(
        s,
        args!["OPEN", "1000", "\u{4E00}"],
        "ERR syntax error: unexpected argument '\\xe4\\xb8\\x80'",
    );
    // An unknown subcommand is refused by the server itself, in its own words.
    for sub in ["NOPE", "OPENX", "", "\u{e9}"] {
        fx.refuses(
            s,
            args![sub, "1000"],
            &format!("ERR unknown subcommand '{sub}'. Try LOCK.SESSION HELP."),
        );
    }
    // The internal forms, from a client: each refusal names the form.
    let internal = |form: &str| {
        format!(
            "ERR LOCK.SESSION {form} is internal: only the replication link and AOF loading may \
             call it"
        )
    };
    fx.refuses(
        s,
        args![
            "RESTORE",
            UNKNOWN_ID,
            "7",
            "1000",
            "99999999999999",
            "0",
            "0",
            "default"
        ],
        &internal("RESTORE"),
    );
    fx.refuses(
        s,
        args!["RENEW", "7", "1000", "99999999999999"],
        &internal("RENEW"),
    );
    fx.refuses(s, args!["ENDED", "7", "1", "LOST"], &internal("ENDED"));
    fx.refuses(s, args!["RESTORE", UNKNOWN_ID], &arity_of("restore"));
    // ATTACH needs a BOUND session, and never from a script (checked in `scripts`).
    fx.refuses(
        s,
        args!["ATTACH", &id],
        "ERR the session was opened without BOUND; only a BOUND session can be attached",
    );
    // Unknown ids are nil, not an error, and change nothing.
    let before = fx.snapshot();
    for sub in ["KEEPALIVE", "CLOSE", "ATTACH", "INFO"] {
        for bad in [UNKNOWN_ID, "garbage", ""] {
            let reply = call(&mut fx.c, s, &[sub, bad]);
            assert_eq!(reply, Ok(Value::Nil), "{sub} {bad:?}");
        }
    }
    assert_eq!(fx.snapshot(), before, "unknown ids changed something");
    fx.finish();
}

#[test]
fn watch_bad_input_is_refused_and_changes_nothing() {
    let mut fx = Fixture::new();
    for cmd in ["LOCK.WATCH", "LOCK.UNWATCH"] {
        let arity = arity(cmd);
        fx.refuses(cmd, args![], &arity);
        fx.refuses(cmd, args![HELD, "x"], &arity);
        fx.refuses(cmd, args![HELD, HELD], &arity);
    }
    for key in [STRING, LIST, HASH] {
        fx.refuses("LOCK.WATCH", args![key], WRONGTYPE);
    }
    // UNWATCH of a key this connection does not watch (whatever its type) is 0.
    let before = fx.snapshot();
    for key in [HELD, FREE, STRING, LIST, HASH] {
        assert_eq!(
            call(&mut fx.c, "LOCK.UNWATCH", &[key]),
            Ok(Value::Int(0)),
            "{key}"
        );
    }
    assert_eq!(fx.snapshot(), before);
    fx.finish();
}
