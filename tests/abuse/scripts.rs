//! Every command and option sent from `EVAL` and from `FCALL` (a library loaded with
//! `FUNCTION LOAD`, Redis 7.0+), and as an ACL user with narrow key and channel patterns, each
//! reply and error asserted exactly; afterwards the server is alive, its log is clean, and
//! nothing is held, queued, blocked or open that should not be.

use super::*;

/// How a command reaches the server.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Via {
    /// Not through a script (`acl_user` sends each command this way too).
    Direct,
    Eval,
    Fcall,
}

/// The library every test loads: `call` runs its arguments as a command; `ro` does the same
/// but is flagged `no-writes` (what `FCALL_RO` may run).
const LIBRARY: &str = "#!lua name=abuse\n\
     redis.register_function('call', function(keys, args) return redis.call(unpack(args)) end)\n\
     redis.register_function{function_name='ro', callback=function(keys, args) \
     return redis.call(unpack(args)) end, flags={'no-writes'}}\n";

pub(super) const EVAL_BODY: &str = "return redis.call(unpack(ARGV))";

pub(super) fn load_library(c: &mut Connection) {
    let name: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(LIBRARY)
        .query(c)
        .expect("FUNCTION LOAD");
    assert_eq!(name, "abuse");
}

/// Send `cmd` with `keys` declared as the script's keys (EVAL, FCALL) and return the raw reply.
pub(super) fn run(c: &mut Connection, via: Via, keys: &[&str], cmd: &[&str]) -> RedisResult<Value> {
    let mut r = match via {
        Via::Direct => redis::cmd(cmd[0]),
        Via::Eval => redis::cmd("EVAL"),
        Via::Fcall => redis::cmd("FCALL"),
    };
    match via {
        Via::Direct => {
            r.arg(&cmd[1..]);
        }
        Via::Eval | Via::Fcall => {
            r.arg(if via == Via::Eval { EVAL_BODY } else { "call" });
            r.arg(keys.len()).arg(keys).arg(cmd);
        }
    }
    r.query(c)
}

/// `expected` exactly from a client; from a script the server adds where it happened
/// (` script: <name>, on @user_...`): the module's words must come first, unchanged.
#[track_caller]
pub(super) fn assert_error(reply: RedisResult<Value>, via: Via, expected: &str) {
    let (code, detail) = expected.split_once(' ').unwrap_or((expected, ""));
    let e = match reply {
        Err(e) => e,
        Ok(v) => panic!("{via:?}: expected {expected:?}, got {v:?}"),
    };
    assert_eq!(e.code(), Some(code), "{via:?}: {e}");
    let got = e.detail().unwrap_or("");
    match via {
        Via::Direct => assert_eq!(got, detail, "{via:?}"),
        Via::Eval | Via::Fcall => {
            let rest = got
                .strip_prefix(detail)
                .unwrap_or_else(|| panic!("{via:?}: expected {expected:?}..., got {e}"));
            assert!(rest.starts_with(" script: "), "{via:?}: {e}");
        }
    }
}

#[track_caller]
pub(super) fn int(reply: RedisResult<Value>, what: &str) -> i64 {
    match reply {
        Ok(Value::Int(n)) => n,
        other => panic!("{what}: expected an integer, got {other:?}"),
    }
}

#[track_caller]
pub(super) fn ints(reply: RedisResult<Value>, what: &str) -> Vec<i64> {
    match reply {
        Ok(Value::Array(items)) => items
            .into_iter()
            .map(|v| match v {
                Value::Int(n) => n,
                other => panic!("{what}: expected integers, got {other:?}"),
            })
            .collect(),
        other => panic!("{what}: expected an array, got {other:?}"),
    }
}

#[track_caller]
pub(super) fn bulk(reply: RedisResult<Value>, what: &str) -> String {
    match reply {
        Ok(Value::BulkString(b)) => String::from_utf8(b).unwrap(),
        other => panic!("{what}: expected a bulk string, got {other:?}"),
    }
}

/// Nothing held, queued, blocked or open, and the server is the one we started, with a clean
/// log.
#[track_caller]
pub(super) fn assert_quiet(server: &Server, c: &mut Connection, pid: &str) {
    assert_eq!(dbsize(c), 0, "keys left: {:?}", {
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(c).unwrap();
        keys
    });
    for stat in ["locks", "waiters", "waiting_keys", "sessions"] {
        assert_eq!(lock_stat(c, stat), 0, "lock_{stat}");
    }
    assert_eq!(info_int(c, "clients", "blocked_clients"), 0);
    assert_alive(server, pid);
    assert_clean_log(server);
}

pub(super) const SCRIPT_VIAS: [Via; 2] = [Via::Eval, Via::Fcall];

#[test]
fn every_command_and_option_from_eval_and_fcall() {
    let (server, mut c) = start();
    let pid = info_field(&mut c, "server", "process_id").unwrap();
    load_library(&mut c);
    for via in SCRIPT_VIAS {
        let p = format!("{via:?}:").to_lowercase();
        let names =
            ["a", "sh", "ld", "m1", "m2", "m3", "s1", "s2", "s3", "s4"].map(|s| format!("{p}{s}"));
        let [a, sh, ld, m1, m2, m3, s1, s2, s3, s4] = names.each_ref().map(String::as_str);
        let mut go = |keys: &[&str], cmd: &[&str]| run(&mut c, via, keys, cmd);

        // Plain holds: grant, retry, no blocking inside a script, extend, fence, info.
        let t = int(go(&[a], &["LOCK.ACQUIRE", a, "o", "10000"]), "acquire");
        assert!(t > 0);
        assert_eq!(
            go(&[a], &["LOCK.ACQUIRE", a, "o", "10000"]),
            Ok(Value::Int(t))
        );
        assert_eq!(
            go(&[a], &["LOCK.ACQUIRE", a, "p", "10000", "BLOCK", "0"]),
            Ok(Value::Nil)
        );
        assert_eq!(
            go(&[a], &["LOCK.ACQUIRE", a, "p", "10000", "block", "50"]),
            Ok(Value::Nil)
        );
        assert_eq!(
            go(&[a], &["LOCK.EXTEND", a, "o", "20000"]),
            Ok(Value::Int(1))
        );
        assert_eq!(
            go(&[a], &["LOCK.EXTEND", a, "p", "20000"]),
            Ok(Value::Int(0))
        );
        assert_eq!(go(&[a], &["LOCK.FENCE", a]), Ok(Value::Int(t)));
        assert_eq!(
            go(&[a], &["LOCK.FENCE", a, t.to_string().as_str()]),
            Ok(Value::Int(1))
        );
        assert_eq!(
            go(&[a], &["LOCK.FENCE", a, (t + 1).to_string().as_str()]),
            Ok(Value::Int(0))
        );
        let info = go(&[a], &["LOCK.INFO", a]).expect("LOCK.INFO");
        let (owner, token, ttl, waiters) = parse_lock_info(&info).expect("LOCK.INFO nil");
        assert_eq!((owner, token, waiters), (b"o".to_vec(), t, 0));
        assert!(ttl > 0 && ttl <= 20_000, "{via:?}: ttl {ttl}");
        assert_error(
            go(&[a], &["LOCK.ACQUIRE", a, "", "1000"]),
            via,
            "ERR owner must not be empty",
        );
        assert_error(
            go(&[a], &["LOCK.ACQUIRE", a, "o", "0"]),
            via,
            "ERR ttl-ms must be a positive integer",
        );

        // Shared holds and a semaphore.
        let r = int(
            go(
                &[sh],
                &["LOCK.ACQUIRE", sh, "r", "10000", "SHARED", "LIMIT", "2"],
            ),
            "r",
        );
        let s = int(
            go(
                &[sh],
                &["LOCK.ACQUIRE", sh, "s", "10000", "shared", "limit", "2"],
            ),
            "s",
        );
        assert!(s > r && r > t);
        let full = [
            "LOCK.ACQUIRE",
            sh,
            "x",
            "10000",
            "SHARED",
            "LIMIT",
            "2",
            "BLOCK",
            "100",
        ];
        assert_eq!(go(&[sh], &full), Ok(Value::Nil));
        assert_error(
            go(&[sh], &["LOCK.ACQUIRE", sh, "x", "10000", "SHARED"]),
            via,
            "ERR this lock is held SHARED with LIMIT 2; acquire it with SHARED LIMIT 2",
        );
        assert_error(
            go(&[sh], &["LOCK.ACQUIRE", sh, "r", "10000"]),
            via,
            "ERR owner holds this lock SHARED; release it before acquiring it exclusively",
        );

        // LOCKDELAY on a plain hold: a clean release ends it with the hold.
        int(
            go(
                &[ld],
                &["LOCK.ACQUIRE", ld, "o", "60000", "LOCKDELAY", "60000"],
            ),
            "ld",
        );
        assert_eq!(go(&[ld], &["LOCK.RELEASE", ld, "o"]), Ok(Value::Int(1)));
        let next = int(
            go(&[ld], &["LOCK.ACQUIRE", ld, "p", "60000", "LOCKDELAY", "0"]),
            "ld p",
        );
        assert_error(
            go(
                &[ld],
                &["LOCK.ACQUIRE", ld, "p", "1000", "LOCKDELAY", "60001"],
            ),
            via,
            "ERR LOCKDELAY must be an integer from 0 to 60000",
        );

        // Multi-key sets: all or none, no blocking, retry keeps the tokens.
        let set = ints(
            go(&[m1, m2], &["LOCK.MACQUIRE", "2", m1, m2, "o", "10000"]),
            "set",
        );
        assert!(
            set.len() == 2 && set[0] > next && set[1] > set[0],
            "{set:?}"
        );
        let busy = ["LOCK.MACQUIRE", "2", m1, m3, "p", "10000", "BLOCK", "0"];
        assert_eq!(go(&[m1, m3], &busy), Ok(Value::Nil));
        assert_eq!(
            ints(
                go(&[m1, m2], &["LOCK.MACQUIRE", "2", m1, m2, "o", "5000"]),
                "retry"
            ),
            set
        );
        assert_error(
            go(&[m1, m2], &["LOCK.MACQUIRE", "2", m1, m1, "o", "5000"]),
            via,
            &format!("ERR duplicate key '{m1}'"),
        );
        assert_eq!(
            go(&[m1, m2], &["LOCK.MRELEASE", "2", m1, m2, "o"]),
            Ok(Value::Int(2))
        );
        assert_eq!(
            go(&[m1, m2], &["LOCK.MRELEASE", "2", m1, m2, "o"]),
            Ok(Value::Int(0))
        );

        // Sessions: open, keepalive, info, holds (ttl 0), close; BOUND and ATTACH are refused
        // (a script's client never disconnects).
        assert_error(
            go(&[], &["LOCK.SESSION", "OPEN", "1000", "BOUND"]),
            via,
            "ERR BOUND cannot be used from a script or function (its client never disconnects)",
        );
        let id = bulk(go(&[], &["LOCK.SESSION", "OPEN", "600000"]), "open");
        let id = id.as_str();
        assert_eq!(
            go(&[id], &["LOCK.SESSION", "KEEPALIVE", id, "300000"]),
            Ok(Value::Int(300_000))
        );
        assert_error(
            go(&[id], &["LOCK.SESSION", "ATTACH", id]),
            via,
            "ERR ATTACH cannot be used from a script or function (its client never disconnects)",
        );
        int(
            go(&[s1], &["LOCK.ACQUIRE", s1, "o", "0", "SESSION", id]),
            "session hold",
        );
        let pair = ["LOCK.MACQUIRE", "2", s2, s3, "o", "0", "SESSION", id];
        assert_eq!(ints(go(&[s2, s3], &pair), "session set").len(), 2);
        assert_error(
            go(&[s1], &["LOCK.ACQUIRE", s1, "o", "1000"]),
            via,
            "ERR owner holds this lock in another session (or outside any); release it before \
             acquiring it with another SESSION",
        );
        assert_error(
            go(
                &[s1],
                &[
                    "LOCK.ACQUIRE",
                    s1,
                    "o",
                    "0",
                    "SESSION",
                    id,
                    "LOCKDELAY",
                    "1",
                ],
            ),
            via,
            "ERR syntax error: a hold in a SESSION takes the session's LOCKDELAY; give it to \
             LOCK.SESSION OPEN",
        );
        match go(&[id], &["LOCK.SESSION", "INFO", id]) {
            // RESP2 through Lua: the map as a flat array; `bound` is nil (not bound).
            // The public serial last (the connection name of a BOUND session carries it).
            // Then `grace` and `detached` (issue 29).
            Ok(Value::Array(items)) if items.len() == 14 => {
                let b = |s: &str| Value::BulkString(s.as_bytes().to_vec());
                let ttl = match items[7] {
                    Value::Int(n) if n > 0 && n <= 300_000 => n,
                    ref other => panic!("{via:?}: ttl {other:?}"),
                };
                let serial = match items[9] {
                    Value::Int(n) if n > 0 => n,
                    ref other => panic!("{via:?}: serial {other:?}"),
                };
                let want = [b("bound"), Value::Nil, b("holds"), Value::Int(3)];
                assert_eq!(items[..4], want, "{via:?}");
                let want = [b("lockdelay"), Value::Int(0), b("ttl"), Value::Int(ttl)];
                assert_eq!(items[4..8], want, "{via:?}");
                assert_eq!(items[8..10], [b("serial"), Value::Int(serial)], "{via:?}");
                let want = [b("grace"), Value::Int(0), b("detached"), Value::Nil];
                assert_eq!(items[10..], want, "{via:?}");
            }
            other => panic!("{via:?}: LOCK.SESSION INFO: {other:?}"),
        }
        assert_eq!(go(&[id], &["LOCK.SESSION", "CLOSE", id]), Ok(Value::Int(3)));
        assert_eq!(go(&[id], &["LOCK.SESSION", "CLOSE", id]), Ok(Value::Nil));
        assert_eq!(
            go(&[id], &["LOCK.SESSION", "KEEPALIVE", id]),
            Ok(Value::Nil)
        );
        assert_eq!(go(&[id], &["LOCK.SESSION", "INFO", id]), Ok(Value::Nil));
        let delayed = bulk(
            go(&[], &["LOCK.SESSION", "OPEN", "600000", "LOCKDELAY", "100"]),
            "open",
        );
        let delayed = delayed.as_str();
        int(
            go(
                &[s4],
                &["LOCK.ACQUIRE", s4, "o", "10000", "SESSION", delayed],
            ),
            "s4",
        );
        assert_eq!(
            go(&[delayed], &["LOCK.SESSION", "CLOSE", delayed]),
            Ok(Value::Int(1))
        );

        // The internal forms are refused from a script as from a client, each naming itself.
        let internal = |what: &str| {
            format!("ERR {what} is internal: only the replication link and AOF loading may call it")
        };
        let far = (unix_ms() + 600_000).to_string();
        let far = far.as_str();
        assert_error(
            go(&[a], &["LOCK.LOAD", a, "mallory", "1", far]),
            via,
            &internal("LOCK.LOAD"),
        );
        for form in [
            &[
                "LOCK.SESSION",
                "RESTORE",
                id,
                "7",
                "1000",
                far,
                "0",
                "0",
                "default",
            ][..],
            &["LOCK.SESSION", "RENEW", "7", "1000", far],
            &["LOCK.SESSION", "ENDED", "7", "1", "LOST"],
        ] {
            assert_error(
                go(&[], form),
                via,
                &internal(&format!("LOCK.SESSION {}", form[1])),
            );
        }

        // LOCK.WATCH and LOCK.UNWATCH are refused in a script: its client never disconnects,
        // so a watch there would never end (issue 28, item 9).
        for cmd in ["LOCK.WATCH", "LOCK.UNWATCH"] {
            assert_error(
                go(&[a], &[cmd, a]),
                via,
                &format!(
                    "ERR {cmd} cannot be used from a script or function (its client never \
                     disconnects)"
                ),
            );
        }

        // Clean up through the same path; every release answers 1.
        for (key, owner) in [(a, "o"), (sh, "r"), (sh, "s"), (ld, "p")] {
            assert_eq!(go(&[key], &["LOCK.RELEASE", key, owner]), Ok(Value::Int(1)));
        }
    }

    // Read-only scripts may read a lock and may not take one.
    let key = "ro:a";
    let token = must_acquire(&mut c, key, "o", 10_000);
    let fence: RedisResult<Value> = redis::cmd("FCALL_RO")
        .arg("ro")
        .arg(1)
        .arg(key)
        .arg("LOCK.FENCE")
        .arg(key)
        .query(&mut c);
    assert_eq!(fence, Ok(Value::Int(token)));
    let eval_ro: RedisResult<Value> = redis::cmd("EVAL_RO")
        .arg(EVAL_BODY)
        .arg(1)
        .arg(key)
        .arg("LOCK.INFO")
        .arg(key)
        .query(&mut c);
    assert!(matches!(eval_ro, Ok(Value::Array(_))), "{eval_ro:?}");
    for (cmd, body) in [("FCALL_RO", "ro"), ("FCALL", "ro"), ("EVAL_RO", EVAL_BODY)] {
        let reply: RedisResult<Value> = redis::cmd(cmd)
            .arg(body)
            .arg(1)
            .arg(key)
            .arg("LOCK.ACQUIRE")
            .arg(key)
            .arg("p")
            .arg(1000)
            .query(&mut c);
        let e = reply.expect_err(cmd);
        assert_eq!(e.code(), Some("ERR"), "{cmd}: {e}");
        assert!(
            e.detail().is_some_and(
                |d| d.starts_with("Write commands are not allowed from read-only scripts")
            ),
            "{cmd}: {e}"
        );
    }
    assert_eq!(release(&mut c, key, "o"), 1);
    assert_quiet(&server, &mut c, &pid);
}
