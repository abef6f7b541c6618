//! The client's default session (issue 29) against a real server: a holder *process* that took
//! its lock as the README's first example does and is killed with SIGKILL hands it on long
//! before the hold's ttl; `without_session()` keeps the ttl-only hold; one default session per
//! client (and its clones) for every lock kind, its connection named in `CLIENT LIST`; a
//! `CLIENT KILL` of its bound connection keeps every hold (re-attached within the grace); closing
//! the client, or dropping its last clone, closes the session. Sync and async from one
//! definition where both apply.
//!
//! Whether a hold was handed on by the session or by its ttl is read from the server's clock
//! (`TIME`) and the old hold's ttl (`LOCK.INFO`), never from how long the test waited.

mod apis;
mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redis::{Connection, Value};
use support::{fence, ms, send_signal, unique_key, Server};

/// A flat `name value ...` reply (RESP2) or a map (RESP3) as text names to values.
fn fields(reply: Value) -> HashMap<String, Value> {
    let pairs: Vec<(Value, Value)> = match reply {
        Value::Map(pairs) => pairs,
        Value::Array(items) => {
            let mut items = items.into_iter();
            let mut pairs = Vec::new();
            while let (Some(k), Some(v)) = (items.next(), items.next()) {
                pairs.push((k, v));
            }
            pairs
        }
        other => panic!("not a map: {other:?}"),
    };
    pairs
        .into_iter()
        .map(|(k, v)| match k {
            Value::BulkString(b) => (String::from_utf8_lossy(&b).into_owned(), v),
            Value::SimpleString(s) => (s, v),
            other => panic!("a field name: {other:?}"),
        })
        .collect()
}

fn int(v: &Value) -> i64 {
    match v {
        Value::Int(n) => *n,
        other => panic!("not an integer: {other:?}"),
    }
}

/// `LOCK.INFO key`: each live holder's fields.
fn holders(conn: &mut Connection, key: &str) -> Vec<HashMap<String, Value>> {
    let info = fields(redis::cmd("LOCK.INFO").arg(key).query(conn).unwrap());
    match info.get("holders") {
        Some(Value::Array(list)) => list.iter().cloned().map(fields).collect(),
        other => panic!("holders: {other:?}"),
    }
}

/// The session serial of `key`'s holders (each must be in a session).
fn serials_of(conn: &mut Connection, key: &str) -> Vec<i64> {
    holders(conn, key)
        .iter()
        .map(|h| int(h.get("session").expect("a hold in a session")))
        .collect()
}

/// `LOCK.SESSION LIST`: every session on the server, all pages, by serial.
fn session_list(conn: &mut Connection) -> HashMap<i64, HashMap<String, Value>> {
    let (mut cursor, mut found) = ("0".to_string(), HashMap::new());
    loop {
        let (next, page): (String, Vec<Value>) = redis::cmd("LOCK.SESSION")
            .arg("LIST")
            .arg(&cursor)
            .arg("COUNT")
            .arg(1000)
            .query(conn)
            .unwrap();
        for entry in page {
            let entry = fields(entry);
            found.insert(int(&entry["serial"]), entry);
        }
        if next == "0" {
            return found;
        }
        cursor = next;
    }
}

/// The client id the session `serial` is bound to now (`None`: detached, or no such session).
fn bound_of(conn: &mut Connection, serial: i64) -> Option<i64> {
    match session_list(conn).get(&serial).map(|e| &e["bound"]) {
        Some(Value::Int(id)) => Some(*id),
        _ => None,
    }
}

/// An `INFO lock` counter.
fn counter(server: &Server, field: &str) -> i64 {
    server
        .info_field("lock", field)
        .unwrap_or_else(|| panic!("INFO lock has no {field}"))
        .parse()
        .unwrap()
}

/// The server's clock in ms (`TIME`).
fn server_ms(conn: &mut Connection) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query(conn).unwrap();
    s * 1000 + us / 1000
}

fn client_kill(conn: &mut Connection, id: i64) -> i64 {
    redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(id)
        .query(conn)
        .unwrap()
}

// --- a holder process killed -------------------------------------------------------------

/// The holder process's environment: the server's URL, the key, and how it holds.
const HOLDER_URL: &str = "REDIS_LOCK_CLIENT_TEST_DEFAULT_URL";
const HOLDER_KEY: &str = "REDIS_LOCK_CLIENT_TEST_DEFAULT_KEY";
/// `default` (the README's first example) or `ttl:<ms>` (`without_session()`, that ttl).
const HOLDER_MODE: &str = "REDIS_LOCK_CLIENT_TEST_DEFAULT_MODE";

/// The child process: takes the key as the README's first example does (`Client::open`, then
/// `client.acquire(key, 10 s)`, no session named), prints `held <token>`, and waits to be
/// killed.
#[test]
#[ignore = "a child process: its parent test runs it (--ignored --exact)"]
fn holder_child_process() {
    let Ok(url) = std::env::var(HOLDER_URL) else {
        return;
    };
    let key = std::env::var(HOLDER_KEY).unwrap();
    let client = redis_lock_client::Client::open(&url).unwrap();
    let guard = match std::env::var(HOLDER_MODE).unwrap().strip_prefix("ttl:") {
        None => client.acquire(&key, Duration::from_secs(10)),
        Some(ttl) => client
            .without_session()
            .acquire(&key, ms(ttl.parse().unwrap())),
    };
    let guard = guard.unwrap().expect("the key is free");
    println!("held {}", guard.token());
    thread::sleep(Duration::from_secs(60));
    println!("never killed");
    std::process::exit(1);
}

/// A child process, killed if the test ends first.
struct ChildProcess(Child);

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start [`holder_child_process`] holding `key` (`mode`: see [`HOLDER_MODE`]); its token.
fn spawn_holder(server: &Server, key: &str, mode: &str) -> (ChildProcess, u64) {
    let mut child = ChildProcess(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "holder_child_process",
                "--ignored",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(HOLDER_URL, server.url())
            .env(HOLDER_KEY, key)
            .env(HOLDER_MODE, mode)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let (tx, lines) = mpsc::channel();
    let stdout = child.0.stdout.take().unwrap();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = lines.recv_timeout(left).expect("the holder's `held` line");
        // The line can follow the test harness's `test holder_child_process ... `.
        if let Some((_, token)) = line.split_once("held ") {
            return (child, token.trim().parse().unwrap());
        }
    }
}

/// Kill the holder with SIGKILL while a waiter (by ttl alone) is queued: the hold's ttl left
/// and the server's clock at the kill, and at the grant; the waiter's token.
fn kill_and_wait(server: &Server, key: &str, child: ChildProcess) -> (i64, i64, i64, u64) {
    let waiter = redis_lock_client::Client::open(&server.url())
        .unwrap()
        .without_session();
    let queued = {
        let key = key.to_string();
        thread::spawn(move || {
            waiter
                .acquire_blocking(&key, ms(10_000), ms(20_000))
                .unwrap()
                .expect("granted once the holder died")
                .token()
        })
    };
    server.wait_blocked(1);
    let mut conn = server.conn();
    let left_ms = int(&holders(&mut conn, key)[0]["ttl"]);
    let killed_at = server_ms(&mut conn);
    send_signal(child.0.id(), "KILL");
    let token = queued.join().unwrap();
    let granted_at = server_ms(&mut conn);
    drop(child);
    (left_ms, killed_at, granted_at, token)
}

/// The README's first example in a process of its own (`client.acquire(key, 10 s)`, no session
/// named), killed with SIGKILL: the waiter is granted while the dead hold still had most of its
/// 10 s, by the server's clock; the session ended uncleanly after its grace.
#[test]
fn a_killed_holder_process_is_handed_on_long_before_its_ttl() {
    let server = Server::start();
    let key = unique_key("killed-default");
    let (child, token) = spawn_holder(&server, &key, "default");
    let mut conn = server.conn();
    assert_eq!(fence(&mut conn, &key), Some(token));
    assert_eq!(serials_of(&mut conn, &key).len(), 1, "in a session");
    let expired = counter(&server, "lock_sessions_grace_expired");
    let (left_ms, killed_at, granted_at, waiter) = kill_and_wait(&server, &key, child);
    assert!(waiter > token);
    let took = granted_at - killed_at;
    // The grace (500 ms) and the server's 100 ms ticks at most, far from the 10 s.
    assert!(
        left_ms - took > 5_000,
        "ttl left {left_ms} ms, took {took} ms"
    );
    assert!(took >= 400, "before the grace: {took} ms");
    assert_eq!(counter(&server, "lock_sessions_grace_expired"), expired + 1);
}

/// `without_session()`: the killed holder's hold lives out its ttl, by the server's clock.
#[test]
fn without_session_a_killed_holder_keeps_the_lock_for_its_ttl() {
    let server = Server::start();
    let key = unique_key("killed-ttl");
    let (child, token) = spawn_holder(&server, &key, "ttl:1500");
    let mut conn = server.conn();
    let holder = holders(&mut conn, &key).remove(0);
    assert!(!holder.contains_key("session"), "{holder:?}");
    assert_eq!(counter(&server, "lock_sessions"), 0);
    let (left_ms, killed_at, granted_at, waiter) = kill_and_wait(&server, &key, child);
    assert!(waiter > token);
    // Granted at the hold's deadline, not before (TIME is read after the grant, 1 ms units).
    assert!(
        granted_at - killed_at >= left_ms - 1,
        "ttl left {left_ms} ms, granted after {} ms",
        granted_at - killed_at
    );
}

macro_rules! shared_tests {
    () => {
        // Every lock kind made without a session joins one default session per client, shared
        // by its clones, each hold keeping its own ttl; the session is bound, has the 500 ms
        // grace, and its connection is named after its serial. `close()` ends it: every hold
        // released at once.
        api_test! { fn one_default_session_per_client_for_every_lock_kind() {
            let (server, client, mut conn) = crate::apis::setup!();
            let ttl = ms(30_000);
            let k: Vec<String> = (0..7).map(|i| unique_key(&format!("kind{i}"))).collect();
            let exclusive = io!(client.acquire(&k[0], ttl)).unwrap().unwrap();
            let clone = client.clone();
            let of_clone = io!(clone.acquire_blocking(&k[1], ttl, ms(1_000))).unwrap().unwrap();
            let rw = ReadWriteLock::new(&client, &k[2]);
            let read = io!(rw.read(ttl)).unwrap().unwrap();
            let write = io!(ReadWriteLock::new(&client, &k[3]).write(ttl)).unwrap().unwrap();
            let permit = io!(Semaphore::new(&client, &k[4], 2).acquire(ttl)).unwrap().unwrap();
            let multi = io!(MultiLock::new(&client, &["{m}a", "{m}b"]).acquire(ttl))
                .unwrap()
                .unwrap();
            let leader = io!(Election::new(&client, &k[5], ttl).campaign_for("me", ms(1_000)))
                .unwrap()
                .unwrap();
            let mut serial = Vec::new();
            for key in [&k[0], &k[1], &k[2], &k[3], &k[4], &"{m}a".to_string(), &k[5]] {
                serial.extend(serials_of(&mut conn, key));
                let ttl_ms = int(&holders(&mut conn, key)[0]["ttl"]);
                assert!(ttl_ms > 20_000 && ttl_ms <= 30_000, "{key}: its own ttl, {ttl_ms}");
            }
            serial.dedup();
            assert_eq!(serial.len(), 1, "one session: {serial:?}");
            assert_eq!(counter(&server, "lock_sessions"), 1);
            let entry = session_list(&mut conn).remove(&serial[0]).unwrap();
            assert_eq!(int(&entry["grace"]), 500);
            assert_eq!(entry["detached"], Value::Nil);
            let bound = int(&entry["bound"]);
            let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut conn).unwrap();
            let line = list.lines().find(|l| l.starts_with(&format!("id={bound} "))).unwrap();
            assert!(line.contains(&format!(" name=redislock-session-{} ", serial[0])), "{line}");

            // An opted-out client of the same pool holds by ttl alone.
            let alone = io!(client.without_session().acquire(&k[6], ttl)).unwrap().unwrap();
            assert!(!holders(&mut conn, &k[6])[0].contains_key("session"));

            io!(client.close());
            assert_eq!(counter(&server, "lock_sessions"), 0);
            for key in [&k[0], &k[1], &k[2], &k[3], &k[4], &k[5]] {
                assert_eq!(fence(&mut conn, key), None, "{key} outlived the closed session");
            }
            assert_eq!(fence(&mut conn, &k[6]), Some(alone.token()));
            // The guards were released with the session: their own release finds nothing.
            assert!(!io!(exclusive.release()).unwrap());
            drop((of_clone, read, write, permit, multi, leader));
            // The next acquire opens a new default session.
            let again = io!(client.acquire(&k[0], ttl)).unwrap().unwrap();
            let new = serials_of(&mut conn, &k[0]);
            assert_ne!(new, serial[..1].to_vec());
            drop(again);
        } }

        // The last clone of a client (a guard holds one) dropped: its default session closed.
        api_test! { fn dropping_the_last_clone_closes_the_default_session() {
            let (server, client, mut conn) = crate::apis::setup!();
            let key = unique_key("dropped");
            let guard = io!(client.clone().acquire(&key, ms(30_000))).unwrap().unwrap();
            drop(client);
            assert_eq!(counter(&server, "lock_sessions"), 1, "the guard keeps it");
            drop(guard);
            io!(poll("the session closed", ms(3_000), || counter(&server, "lock_sessions") == 0));
            assert_eq!(fence(&mut conn, &key), None);
        } }

        // `CLIENT KILL` of the default session's bound connection (the process lives): the
        // session is re-attached on a new connection within the grace, every hold keeps its
        // token, and no guard reports a loss.
        api_test! { fn a_killed_bound_connection_keeps_every_hold() {
            let (server, client, mut conn) = crate::apis::setup!();
            let keys: Vec<String> = (0..3).map(|i| unique_key(&format!("blip{i}"))).collect();
            let a = io!(client.acquire(&keys[0], ms(30_000))).unwrap().unwrap();
            let b = io!(client.acquire(&keys[1], ms(30_000))).unwrap().unwrap();
            let permit = io!(Semaphore::new(&client, &keys[2], 1).acquire(ms(30_000)))
                .unwrap()
                .unwrap();
            let serial = serials_of(&mut conn, &keys[0])[0];
            let old = bound_of(&mut conn, serial).expect("bound");
            let reattached = counter(&server, "lock_sessions_reattached");
            assert_eq!(client_kill(&mut conn, old), 1);
            io!(poll("re-attached", ms(2_000), || {
                bound_of(&mut conn, serial).is_some_and(|id| id != old)
            }));
            // Past the grace: the session lives on, bound, with every hold.
            io!(sleep(ms(700)));
            let entry = session_list(&mut conn).remove(&serial).expect("the session lives");
            assert_ne!(entry["bound"], Value::Nil);
            assert_eq!(entry["detached"], Value::Nil);
            assert_eq!(int(&entry["holds"]), 3);
            assert_eq!(counter(&server, "lock_sessions_reattached"), reattached + 1);
            for (key, guard) in keys.iter().zip([&a, &b, &permit]) {
                let held: i64 = redis::cmd("LOCK.FENCE")
                    .arg(key)
                    .arg(guard.token())
                    .query(&mut conn)
                    .unwrap();
                assert_eq!(held, 1, "{key}");
                assert!(!guard.is_lost(), "{key}: {:?}", guard.loss_reason());
            }
            assert_eq!(serials_of(&mut conn, &keys[1]), vec![serial]);
        } }

        // The session ended while its connection was still up (an administrator's `LOCK.SESSION
        // KILL`), then that connection is killed: the re-`ATTACH` is answered nil, every guard
        // reports the loss, and the next acquire opens a new default session.
        api_test! { fn a_reattach_answered_nil_reports_the_loss_to_every_guard() {
            let (server, client, mut conn) = crate::apis::setup!();
            let (a, b) = (unique_key("gone-a"), unique_key("gone-b"));
            let ga = io!(client.acquire(&a, ms(30_000))).unwrap().unwrap();
            let gb = io!(Semaphore::new(&client, &b, 1).acquire(ms(30_000))).unwrap().unwrap();
            let serial = serials_of(&mut conn, &a)[0];
            let bound = bound_of(&mut conn, serial).expect("bound");
            let killed: Option<i64> = redis::cmd("LOCK.SESSION")
                .arg("KILL")
                .arg(serial)
                .query(&mut conn)
                .unwrap();
            assert_eq!(killed, Some(2));
            assert_eq!(client_kill(&mut conn, bound), 1);
            for guard in [&ga, &gb] {
                let reason = io!(wait_lost(guard, ms(5_000))).expect("the loss reported");
                assert!(matches!(reason, redis_lock_client::LossReason::SessionEnded), "{reason:?}");
            }
            let again = io!(client.acquire(&a, ms(30_000))).unwrap().expect("free again");
            assert_ne!(serials_of(&mut conn, &a), vec![serial]);
            assert_eq!(counter(&server, "lock_sessions"), 1);
            drop(again);
        } }

        // An acquire whose default session ended on the server (`LOCK.SESSION KILL`, as an
        // expiry would end it) before the client saw it: `ERR no such session`, then the
        // acquire is made again in a new default session, and succeeds.
        api_test! { fn an_acquire_in_an_ended_default_session_retries_in_a_new_one() {
            let (server, client, mut conn) = crate::apis::setup!();
            let (first, second) = (unique_key("ended"), unique_key("again"));
            let old = io!(client.acquire(&first, ms(30_000))).unwrap().unwrap();
            let serial = serials_of(&mut conn, &first)[0];
            let killed: Option<i64> = redis::cmd("LOCK.SESSION")
                .arg("KILL")
                .arg(serial)
                .query(&mut conn)
                .unwrap();
            assert_eq!(killed, Some(1));
            let opened = counter(&server, "lock_sessions_opened");
            let calls = server.calls("lock.acquire");
            let new = io!(client.acquire(&second, ms(30_000))).unwrap().expect("granted");
            // Refused in the ended session, then granted in the new one.
            assert_eq!(server.calls("lock.acquire"), calls + 2);
            let now = serials_of(&mut conn, &second);
            assert_eq!(now.len(), 1);
            assert_ne!(now[0], serial);
            assert_eq!(counter(&server, "lock_sessions_opened"), opened + 1);
            assert_eq!(counter(&server, "lock_sessions"), 1);
            assert_eq!(fence(&mut conn, &first), None, "ended with its session");
            io!(poll("the old guard told", ms(5_000), || old.is_lost()));
            drop(new);
        } }
    };
}

apis::both!(shared_tests);

/// A cluster of three masters: the clients `for_key` makes share one default session per node
/// (two keys of one node: one session there), a key of another node has its own there, and
/// closing the seed client closes every node's.
#[test]
fn on_a_cluster_one_default_session_per_node() {
    let dir = support::test_dir("default-cluster");
    let nodes = support::cluster::start(3, 0, &dir);
    let seed = redis_lock_client::Client::open(&nodes[0].url()).unwrap();
    // The index of the node that serves `key` (the one that does not answer MOVED).
    let node_of = |key: &str| -> usize {
        nodes
            .iter()
            .position(|n| {
                let r: redis::RedisResult<Value> =
                    redis::cmd("LOCK.FENCE").arg(key).query(&mut n.conn());
                r.is_ok()
            })
            .unwrap()
    };
    let keys: Vec<(String, usize)> = (0..40)
        .map(|i| format!("default-cluster-{i}"))
        .map(|k| {
            let n = node_of(&k);
            (k, n)
        })
        .collect();
    let (a, node_a) = keys.iter().find(|(_, n)| *n != 0).unwrap().clone();
    let (b, _) = keys
        .iter()
        .find(|(k, n)| *n == node_a && *k != a)
        .unwrap()
        .clone();
    let (c, node_c) = keys.iter().find(|(_, n)| *n != node_a).unwrap().clone();
    let ga = seed
        .for_key(&a)
        .unwrap()
        .acquire(&a, ms(30_000))
        .unwrap()
        .unwrap();
    let gb = seed
        .for_key(&b)
        .unwrap()
        .acquire(&b, ms(30_000))
        .unwrap()
        .unwrap();
    let gc = seed
        .for_key(&c)
        .unwrap()
        .acquire(&c, ms(30_000))
        .unwrap()
        .unwrap();
    let sessions = |n: usize| counter(&nodes[n], "lock_sessions");
    assert_eq!(sessions(node_a), 1, "one session for both keys of the node");
    assert_eq!(sessions(node_c), 1);
    let mut conn_a = nodes[node_a].conn();
    assert_eq!(serials_of(&mut conn_a, &a), serials_of(&mut conn_a, &b));
    let mut conn_c = nodes[node_c].conn();
    assert_eq!(serials_of(&mut conn_c, &c).len(), 1);

    seed.close();
    assert_eq!(sessions(node_a), 0);
    assert_eq!(sessions(node_c), 0);
    assert_eq!(fence(&mut conn_a, &a), None);
    assert_eq!(fence(&mut conn_c, &c), None);
    drop((ga, gb, gc));
}
