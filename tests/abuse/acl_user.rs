//! Every command and option as an ACL user whose keys (`~app:*`) and channels (`&app:*`) are
//! narrow, sent directly, from `EVAL` and from `FCALL`: what is inside the patterns works as
//! for anyone, what is outside is refused with the server's exact `NOPERM` and changes
//! nothing; a session belongs to the user that opened it. Afterwards nothing is held, queued,
//! blocked or open.
//!
//! A session id is no key: the user keeps alive, reads and closes its own session whatever
//! its key patterns. `LOCK.WATCH` hands a user the channel of a key even when it may not
//! subscribe to that channel: the channel patterns of SECURITY.md are what keep it out.

use super::newer_commands::open_session;
use super::scripts::{assert_error, assert_quiet, bulk, int, ints, load_library, run, Via};
use super::*;

/// The server's refusal of a key or channel outside the user's patterns: Redis 7.0 and 7.1
/// say it one way, 7.2+ and Valkey another.
fn noperm(c: &mut Connection, what: &str) -> String {
    let version = info_field(c, "server", "redis_version").unwrap();
    let valkey = info_field(c, "server", "valkey_version").is_some();
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap());
    let old = !valkey && (parts.next().unwrap(), parts.next().unwrap()) < (7, 2);
    match old {
        true => format!(
            "NOPERM this user has no permissions to access one of the {what}s used as arguments"
        ),
        false => format!("NOPERM No permissions to access a {what}"),
    }
}

/// The refusal inside a script of a key the script did not declare (followed by where).
fn script_noperm(c: &mut Connection) -> String {
    match noperm(c, "key").starts_with("NOPERM this") {
        true => "ERR The user executing the script can't access at least one of the keys \
                 mentioned in the command arguments"
            .into(),
        false => "ERR ACL failure in script: No permissions to access a key".into(),
    }
}

fn setuser(c: &mut Connection, user: &str, rules: &str) {
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER")
        .arg(user)
        .arg(rules.split(' ').collect::<Vec<_>>());
    let _: () = cmd
        .query(c)
        .unwrap_or_else(|e| panic!("ACL SETUSER {user}: {e}"));
}

fn login(server: &Server, user: &str) -> Connection {
    redis::Client::open(format!("redis://{user}:pw@127.0.0.1:{}/", server.port()))
        .unwrap()
        .get_connection()
        .unwrap_or_else(|e| panic!("AUTH {user}: {e}"))
}

const OTHER_USERS_SESSION: &str = "NOPERM this session was opened by another ACL user";

#[test]
fn an_acl_user_with_narrow_key_and_channel_patterns() {
    let (server, mut admin) = start();
    let pid = info_field(&mut admin, "server", "process_id").unwrap();
    load_library(&mut admin);
    setuser(
        &mut admin,
        "app",
        "on >pw resetkeys ~app:* resetchannels &app:* +@all",
    );
    setuser(
        &mut admin,
        "feeder",
        "on >pw resetkeys ~app:* resetchannels &lock.feed:* +@all",
    );
    setuser(&mut admin, "other", "on >pw ~* &* +@all");
    let (key_denied, channel_denied) = (noperm(&mut admin, "key"), noperm(&mut admin, "channel"));
    let undeclared = script_noperm(&mut admin);
    let mut app = login(&server, "app");

    for via in [Via::Direct, Via::Eval, Via::Fcall] {
        let names =
            ["app:a", "app:b", "app:s", "other:a", "other:b"].map(|n| format!("{n}:{via:?}"));
        let [mine, mine2, held_in_session, theirs, theirs2] = names.each_ref().map(String::as_str);
        let mut go = |keys: &[&str], cmd: &[&str]| run(&mut app, via, keys, cmd);

        // Inside the patterns: as for anyone.
        let t = int(
            go(&[mine], &["LOCK.ACQUIRE", mine, "o", "10000"]),
            "acquire",
        );
        assert_eq!(
            go(&[mine], &["LOCK.EXTEND", mine, "o", "10000"]),
            Ok(Value::Int(1))
        );
        assert_eq!(go(&[mine], &["LOCK.FENCE", mine]), Ok(Value::Int(t)));
        let set = ints(
            go(&[mine2], &["LOCK.MACQUIRE", "1", mine2, "o", "10000"]),
            "set",
        );
        assert_eq!(set.len(), 1);
        assert_eq!(
            go(&[mine2], &["LOCK.MRELEASE", "1", mine2, "o"]),
            Ok(Value::Int(1))
        );
        int(
            go(
                &[mine2],
                &["LOCK.ACQUIRE", mine2, "r", "10000", "SHARED", "LIMIT", "2"],
            ),
            "r",
        );
        // An exclusive acquire beside a shared holder waits its turn: nil.
        let beside = ["LOCK.ACQUIRE", mine2, "x", "10000", "LOCKDELAY", "5"];
        assert_eq!(go(&[mine2], &beside), Ok(Value::Nil));

        // Outside them: the server's NOPERM, before the module sees anything (from a script
        // with the key declared, at the EVAL/FCALL itself, so the same words).
        let denied: [(&[&str], &[&str]); 14] = [
            (&[theirs], &["LOCK.ACQUIRE", theirs, "o", "10000"]),
            (
                &[theirs],
                &["LOCK.ACQUIRE", theirs, "o", "10000", "BLOCK", "0"],
            ),
            (
                &[theirs],
                &["LOCK.ACQUIRE", theirs, "o", "10000", "SHARED", "LIMIT", "2"],
            ),
            (
                &[theirs],
                &["LOCK.ACQUIRE", theirs, "o", "10000", "LOCKDELAY", "100"],
            ),
            (
                &[mine2, theirs],
                &["LOCK.MACQUIRE", "2", mine2, theirs, "o", "10000"],
            ),
            (
                &[theirs, theirs2],
                &[
                    "LOCK.MACQUIRE",
                    "2",
                    theirs,
                    theirs2,
                    "o",
                    "10000",
                    "BLOCK",
                    "0",
                ],
            ),
            (&[mine, theirs], &["LOCK.MRELEASE", "2", mine, theirs, "o"]),
            (&[theirs], &["LOCK.RELEASE", theirs, "o"]),
            (&[theirs], &["LOCK.EXTEND", theirs, "o", "1000"]),
            (&[theirs], &["LOCK.FENCE", theirs]),
            (&[theirs], &["LOCK.FENCE", theirs, "1"]),
            (&[theirs], &["LOCK.INFO", theirs]),
            (&[theirs], &["LOCK.WATCH", theirs]),
            (&[theirs], &["LOCK.UNWATCH", theirs]),
        ];
        for (keys, cmd) in denied {
            assert_error(go(keys, cmd), Via::Direct, &key_denied);
            if via != Via::Direct {
                // Not declared: refused inside the script, with the script's words.
                assert_error(go(&[], cmd), via, &undeclared);
            }
        }

        // Sessions: any user may open one (no key); its holds follow the key patterns.
        let id = bulk(go(&[], &["LOCK.SESSION", "OPEN", "300"]), "open");
        let id = id.as_str();
        let hold = ["LOCK.ACQUIRE", held_in_session, "o", "0", "SESSION", id];
        int(go(&[held_in_session], &hold), "session hold");
        let theirs_in_session = ["LOCK.ACQUIRE", theirs, "o", "0", "SESSION", id];
        assert_error(go(&[theirs], &theirs_in_session), Via::Direct, &key_denied);
        // The id is no key (issue 28, item 5): a user limited to `~app:*` keeps its own
        // session alive, looks at it and closes it, directly and from a script (the id passed
        // as an argument, not a key: EVAL checks declared keys against the patterns itself).
        assert_eq!(
            go(&[], &["LOCK.SESSION", "KEEPALIVE", id]),
            Ok(Value::Int(300)),
            "{via:?}: KEEPALIVE"
        );
        match go(&[], &["LOCK.SESSION", "INFO", id]) {
            Ok(Value::Array(_)) | Ok(Value::Map(_)) => {}
            other => panic!("{via:?}: LOCK.SESSION INFO: {other:?}"),
        }
        assert_eq!(
            go(&[], &["LOCK.SESSION", "CLOSE", id]),
            Ok(Value::Int(1)),
            "{via:?}: CLOSE releases the session's one hold"
        );

        if via != Via::Direct {
            assert_error(
                go(&[mine], &["LOCK.WATCH", mine]),
                via,
                "ERR LOCK.WATCH cannot be used from a script or function (its client never disconnects)",
            );
        } else {
            // LOCK.WATCH on a key inside the patterns hands out its channel, which this user may
            // not subscribe to (`&app:*`): the subscription is the server's to refuse, by the
            // channel patterns SECURITY.md gives. From a script LOCK.WATCH is refused.
            let channel = match go(&[mine], &["LOCK.WATCH", mine]) {
                Ok(Value::Array(v)) => match &v[..] {
                    [Value::BulkString(ch), Value::Int(0)] => {
                        String::from_utf8(ch.clone()).unwrap()
                    }
                    other => panic!("{via:?}: LOCK.WATCH: {other:?}"),
                },
                other => panic!("{via:?}: LOCK.WATCH: {other:?}"),
            };
            assert_eq!(go(&[mine], &["LOCK.UNWATCH", mine]), Ok(Value::Int(1)));
            let sub: RedisResult<Value> = redis::cmd("SSUBSCRIBE").arg(&channel).query(&mut app);
            assert_err(sub, &channel_denied);
            let mut feeder = login(&server, "feeder");
            let sub: Value = redis::cmd("SSUBSCRIBE")
                .arg(&channel)
                .query(&mut feeder)
                .unwrap();
            let want = [b"ssubscribe".to_vec(), channel.clone().into_bytes()];
            assert!(
                matches!(&sub, Value::Array(v) if v.len() == 3
                    && v[0] == Value::BulkString(want[0].clone())
                    && v[1] == Value::BulkString(want[1].clone())
                    && v[2] == Value::Int(1)),
                "{sub:?}"
            );
            drop(feeder);
        }

        let mut go = |keys: &[&str], cmd: &[&str]| run(&mut app, via, keys, cmd);
        assert_eq!(go(&[mine], &["LOCK.RELEASE", mine, "o"]), Ok(Value::Int(1)));
        assert_eq!(
            go(&[mine2], &["LOCK.RELEASE", mine2, "r"]),
            Ok(Value::Int(1))
        );
    }

    // A session belongs to the user that opened it, whatever the other user's patterns.
    let mut other = login(&server, "other");
    let sid = open_session(&mut admin, &[]);
    for (cmd, args) in [
        ("LOCK.SESSION", vec!["KEEPALIVE", &sid]),
        ("LOCK.SESSION", vec!["KEEPALIVE", &sid, "1000"]),
        ("LOCK.SESSION", vec!["INFO", &sid]),
        ("LOCK.SESSION", vec!["CLOSE", &sid]),
        ("LOCK.ACQUIRE", vec!["k", "o", "0", "SESSION", &sid]),
        (
            "LOCK.ACQUIRE",
            vec!["k", "o", "1000", "SHARED", "SESSION", &sid],
        ),
        (
            "LOCK.MACQUIRE",
            vec!["1", "k", "o", "1000", "SESSION", &sid],
        ),
    ] {
        assert_err(call(&mut other, cmd, &args), OTHER_USERS_SESSION);
    }
    assert_eq!(exists(&mut admin, "k"), 0);
    assert_eq!(
        call(&mut admin, "LOCK.SESSION", &["CLOSE", &sid]),
        Ok(Value::Int(0))
    );

    // app closed its three sessions itself (their holds with them); admin closed its one.
    assert_eq!(lock_stat(&mut admin, "sessions"), 0);
    assert_eq!(dbsize(&mut admin), 0);
    assert_eq!(lock_stat(&mut admin, "sessions_closed"), 4);
    assert_eq!(lock_stat(&mut admin, "sessions_expired"), 0);
    assert_eq!(lock_stat(&mut admin, "session_holds_released"), 3);
    assert_quiet(&server, &mut admin, &pid);
}
