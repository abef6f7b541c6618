//! Fenced writes against a real server, sync and async from one definition: a live token
//! writes, a token that lost its lock (by expiry, or released and taken by another owner) is
//! refused with `Error::StaleToken` and the key is unchanged, the command's own error reply is
//! `Error::Server`, a `MultiLock` guard fences with the token of one of its keys, a permit's
//! token fences too, and `fenced_call` fences with a token held elsewhere. Then: the script is
//! the Python and Node packages' script, word for word.

mod apis;
mod support;

use std::time::Duration;

use redis::Value;
use redis_lock_client::{Error, FENCED_CALL_LUA, FENCE_CHECK_LUA};
use support::{fence, unique_key, Server};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `GET key`, nil as `None`.
fn get(conn: &mut redis::Connection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(conn).unwrap()
}

/// `SET key value` on a plain connection.
fn set(conn: &mut redis::Connection, key: &str, value: &str) {
    let _: () = redis::cmd("SET").arg(key).arg(value).query(conn).unwrap();
}

/// Asserts `result` is the refusal of `token` on `lock`, with the server's text.
#[track_caller]
fn assert_stale<T: std::fmt::Debug>(result: Result<T, Error>, lock: &str, token: u64) {
    match result {
        Err(e @ Error::StaleToken { .. }) => {
            assert!(
                matches!(&e, Error::StaleToken { lock: l, token: t } if l == lock && *t == token),
                "{e:?}"
            );
            assert_eq!(
                e.to_string(),
                format!("STALE token {token} is not the live hold on {lock}")
            );
            assert!(!e.is_unavailable());
        }
        other => panic!("expected StaleToken for {token} on {lock}, got {other:?}"),
    }
}

/// Asserts `result` is the server's error reply `code` whose text starts with `detail` (Redis 7
/// appends where in the script the call failed: `script: <sha>, on @user_script:4.`).
#[track_caller]
fn assert_server_error<T: std::fmt::Debug>(result: Result<T, Error>, code: &str, detail: &str) {
    match result {
        Err(Error::Server(e)) => {
            assert_eq!(e.code(), Some(code), "{e:?}");
            let text = e.detail().unwrap_or_default();
            assert!(text.starts_with(detail), "{code} {text:?}");
        }
        other => panic!("expected {code} {detail}, got {other:?}"),
    }
}

macro_rules! shared_tests {
    () => {
        api_test! { fn a_live_token_writes_and_an_expired_one_is_refused() {
            let server = Server::start();
            let client = Client::open(&server.url()).unwrap();
            let mut conn = server.conn();
            let tag = unique_key("fenced");
            let (lock, total, count) =
                (format!("{{{tag}}}"), format!("{{{tag}}}:total"), format!("{{{tag}}}:n"));

            let old = io!(client.acquire(&lock, ms(500))).unwrap().expect("free");
            // The reply as the command gives it: a status, an integer, a bulk string, nil.
            let reply: Value = io!(old.fenced(redis::cmd("SET").arg(&total).arg(100))).unwrap();
            assert_eq!(reply, Value::Okay);
            let n: i64 = io!(old.fenced(redis::cmd("INCRBY").arg(&count).arg(5))).unwrap();
            assert_eq!(n, 5);
            let read: String = io!(old.fenced(redis::cmd("GET").arg(&total))).unwrap();
            assert_eq!(read, "100");
            let missing: Option<String> =
                io!(old.fenced(redis::cmd("GET").arg(format!("{{{tag}}}:none")))).unwrap();
            assert_eq!(missing, None);
            assert_eq!(get(&mut conn, &total).as_deref(), Some("100"));

            // Its deadline passes; another owner takes the lock.
            io!(poll("the hold to expire", ms(5_000), || fence(&mut conn, &lock).is_none()));
            let new = io!(client.acquire(&lock, ms(10_000))).unwrap().expect("free again");
            assert!(new.token() > old.token());

            // The old guard's late writes are refused, and change nothing.
            let calls = server.calls("eval");
            assert_stale(
                io!(old.fenced::<Value>(redis::cmd("SET").arg(&total).arg(1))),
                &lock,
                old.token(),
            );
            assert_stale(
                io!(old.fenced::<i64>(redis::cmd("INCRBY").arg(&count).arg(5))),
                &lock,
                old.token(),
            );
            assert_eq!(server.calls("eval"), calls + 2, "one EVAL per write");
            assert_eq!(get(&mut conn, &total).as_deref(), Some("100"));
            assert_eq!(get(&mut conn, &count).as_deref(), Some("5"));

            // The new holder writes.
            let _: () = io!(new.fenced(redis::cmd("SET").arg(&total).arg(200))).unwrap();
            assert_eq!(get(&mut conn, &total).as_deref(), Some("200"));
        } }

        api_test! { fn a_released_token_is_refused_once_another_owner_holds_the_lock() {
            let server = Server::start();
            let client = Client::open(&server.url()).unwrap();
            let mut conn = server.conn();
            let (lock, key) = (unique_key("fenced-released"), unique_key("fenced-value"));
            set(&mut conn, &key, "before");

            let first = io!(client.acquire(&lock, ms(10_000))).unwrap().unwrap();
            let token = first.token();
            assert!(io!(first.release()).unwrap());
            let second = io!(client.acquire(&lock, ms(10_000))).unwrap().unwrap();

            // The first holder's token, kept after its guard is gone: refused.
            let mut raw = io!(raw_conn(&server));
            assert_stale(
                io!(fenced_call::<Value>(&mut raw, &lock, token, redis::cmd("SET").arg(&key).arg("late"))),
                &lock,
                token,
            );
            assert_eq!(get(&mut conn, &key).as_deref(), Some("before"));

            // The live holder's token, used elsewhere: it writes.
            let reply: Option<String> = io!(fenced_call(
                &mut raw,
                &lock,
                second.token(),
                redis::cmd("SET").arg(&key).arg("after").arg("GET"),
            ))
            .unwrap();
            assert_eq!(reply.as_deref(), Some("before"));
            assert_eq!(get(&mut conn, &key).as_deref(), Some("after"));

            // A lock that is free: no token is live.
            assert!(io!(second.release()).unwrap());
            assert_stale(
                io!(fenced_call::<Value>(&mut raw, &lock, token + 1, redis::cmd("DEL").arg(&key))),
                &lock,
                token + 1,
            );
            assert_eq!(get(&mut conn, &key).as_deref(), Some("after"));
        } }

        api_test! { fn the_commands_own_error_reply_is_a_server_error() {
            let server = Server::start();
            let client = Client::open(&server.url()).unwrap();
            let mut conn = server.conn();
            let (lock, key) = (unique_key("fenced-err"), unique_key("fenced-text"));
            set(&mut conn, &key, "abc");
            let guard = io!(client.acquire(&lock, ms(10_000))).unwrap().unwrap();

            assert_server_error(
                io!(guard.fenced::<i64>(redis::cmd("INCR").arg(&key))),
                "ERR",
                "value is not an integer or out of range",
            );
            assert_server_error(
                io!(guard.fenced::<i64>(redis::cmd("LPUSH").arg(&key).arg("x"))),
                "WRONGTYPE",
                "Operation against a key holding the wrong kind of value",
            );
            assert_eq!(get(&mut conn, &key).as_deref(), Some("abc"));
            // The connection stays usable after an error reply.
            let _: () = io!(guard.fenced(redis::cmd("SET").arg(&key).arg("def"))).unwrap();
            assert_eq!(get(&mut conn, &key).as_deref(), Some("def"));

            // A lock key that is not a lock: LOCK.FENCE's own WRONGTYPE.
            let mut raw = io!(raw_conn(&server));
            assert_server_error(
                io!(fenced_call::<Value>(&mut raw, &key, 1, redis::cmd("SET").arg(&lock).arg(1))),
                "WRONGTYPE",
                "Operation against a key holding the wrong kind of value",
            );

            // A reply that is not of the type asked for: the write ran, the reply is reported.
            match io!(guard.fenced::<i64>(redis::cmd("SET").arg(&key).arg("ghi"))) {
                Err(Error::UnexpectedReply { command, reply }) => {
                    assert_eq!(command, "a fenced command");
                    assert_eq!(reply, "ok");
                }
                other => panic!("expected UnexpectedReply, got {other:?}"),
            }
            assert_eq!(get(&mut conn, &key).as_deref(), Some("ghi"));

            // A command without a key is refused before sending.
            let calls = server.calls("eval");
            match io!(guard.fenced::<Value>(&redis::cmd("PING"))) {
                Err(Error::InvalidArgument(what)) => assert_eq!(
                    what,
                    "a fenced command needs a name and a key: `redis::cmd(\"SET\").arg(key).arg(value)`"
                ),
                other => panic!("expected InvalidArgument, got {other:?}"),
            }
            assert_eq!(server.calls("eval"), calls, "sent anyway");
        } }

        api_test! { fn a_multilock_guard_fences_with_the_token_of_one_of_its_keys() {
            let server = Server::start();
            let client = Client::open(&server.url()).unwrap();
            let mut conn = server.conn();
            let tag = unique_key("fenced-multi");
            let locks = [format!("{{{tag}}}:a"), format!("{{{tag}}}:b")];
            let stock = format!("{{{tag}}}:stock");
            let guard = io!(MultiLock::new(&client, &locks).acquire(ms(10_000))).unwrap().unwrap();

            let calls = server.calls("eval");
            match io!(guard.fenced::<Value>(redis::cmd("SET").arg(&stock).arg(1))) {
                Err(Error::InvalidArgument(what)) => assert_eq!(
                    what,
                    "a MultiLock guard holds several keys, each with its own token: fence with \
                     one of them, guard.fenced_by(key, command)"
                ),
                other => panic!("expected InvalidArgument, got {other:?}"),
            }
            match io!(guard.fenced_by::<Value>(&stock, redis::cmd("SET").arg(&stock).arg(1))) {
                Err(Error::InvalidArgument(what)) => {
                    assert_eq!(what, "fenced_by needs one of the guard's keys")
                }
                other => panic!("expected InvalidArgument, got {other:?}"),
            }
            assert_eq!(server.calls("eval"), calls, "sent anyway");
            assert_eq!(get(&mut conn, &stock), None);

            let n: i64 = io!(guard.fenced_by(&locks[1], redis::cmd("INCRBY").arg(&stock).arg(7))).unwrap();
            assert_eq!(n, 7);
            // The first key's hold is gone: its token is refused, the second's still writes.
            let _: i64 = redis::cmd("DEL").arg(&locks[0]).query(&mut conn).unwrap();
            assert_stale(
                io!(guard.fenced_by::<i64>(&locks[0], redis::cmd("INCRBY").arg(&stock).arg(1))),
                &locks[0],
                guard.tokens()[0],
            );
            let n: i64 = io!(guard.fenced_by(&locks[1], redis::cmd("INCRBY").arg(&stock).arg(1))).unwrap();
            assert_eq!(n, 8);

            // A single-key guard takes its own key too, and no other.
            let single = io!(client.acquire(&unique_key("fenced-single"), ms(10_000))).unwrap().unwrap();
            let n: i64 = io!(single.fenced_by(single.key(), redis::cmd("INCR").arg(&stock))).unwrap();
            assert_eq!(n, 9);
            assert!(matches!(
                io!(single.fenced_by::<i64>(&locks[1], redis::cmd("INCR").arg(&stock))),
                Err(Error::InvalidArgument("fenced_by needs one of the guard's keys"))
            ));
        } }

        api_test! { fn a_permits_token_fences_while_it_is_held() {
            let server = Server::start();
            let client = Client::open(&server.url()).unwrap();
            let mut conn = server.conn();
            let (lock, key) = (unique_key("fenced-permit"), unique_key("fenced-permit-value"));
            let semaphore = Semaphore::new(&client, &lock, 2);
            let a = io!(semaphore.acquire(ms(10_000))).unwrap().unwrap();
            let b = io!(semaphore.acquire(ms(10_000))).unwrap().unwrap();
            let _: () = io!(a.fenced(redis::cmd("SET").arg(&key).arg("a"))).unwrap();
            let _: () = io!(b.fenced(redis::cmd("SET").arg(&key).arg("b"))).unwrap();
            let a_token = a.token();
            assert!(io!(a.release()).unwrap());
            let mut raw = io!(raw_conn(&server));
            assert_stale(
                io!(fenced_call::<Value>(&mut raw, &lock, a_token, redis::cmd("SET").arg(&key).arg("late"))),
                &lock,
                a_token,
            );
            assert_eq!(get(&mut conn, &key).as_deref(), Some("b"));
        } }
    };
}

apis::both!(
    shared_tests,
    sync: {
        use redis_lock_client::fenced_call;

        /// A connection of the test's own, for `fenced_call`.
        fn raw_conn(server: &Server) -> redis::Connection {
            server.conn()
        }
    },
    aio: {
        use redis_lock_client::aio::fenced_call;

        /// An async connection of the test's own, for `aio::fenced_call`.
        async fn raw_conn(server: &Server) -> redis::aio::MultiplexedConnection {
            redis::Client::open(server.url())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap()
        }
    }
);

/// The scripts are the Python and Node packages' scripts, character for character, so that a
/// fenced write from any client runs the same script (and the server caches one SHA).
#[test]
fn the_scripts_are_the_python_and_node_packages_scripts() {
    let tail = FENCED_CALL_LUA
        .strip_prefix(FENCE_CHECK_LUA)
        .expect("FENCED_CALL_LUA starts with the check");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = std::fs::read_to_string(root.join("python/redislock_native/fence.py")).unwrap();
    assert!(
        python.contains(&format!(
            "FENCE_CHECK_LUA = \"\"\"\\\n{FENCE_CHECK_LUA}\"\"\"\n"
        )),
        "the check differs from Python's"
    );
    assert!(
        python.contains(&format!(
            "    FENCE_CHECK_LUA\n    + \"\"\"\\\n{tail}\"\"\"\n"
        )),
        "the call differs from Python's"
    );
    let node = std::fs::read_to_string(root.join("node/lib/fence.js")).unwrap();
    assert!(
        node.contains(&format!("const FENCE_CHECK_LUA = `{FENCE_CHECK_LUA}`;")),
        "the check differs from Node's"
    );
    assert!(
        node.contains(&format!("  FENCE_CHECK_LUA +\n  `{tail}`;")),
        "the call differs from Node's"
    );
}
