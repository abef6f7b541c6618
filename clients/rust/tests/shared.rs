//! Shared holds against a real server, sync and async from one definition: `Semaphore`
//! (`LOCK.ACQUIRE ... SHARED LIMIT n`) and `ReadWriteLock` (`SHARED` readers, an exclusive
//! writer): what the server records for each guard, limits and their errors, FIFO order of
//! blocked waiters, release on drop, and the watchdog on a shared hold.

mod apis;
mod support;

use std::time::Instant;

use redis::{Connection, Value};
use redis_lock_client::Error;
use support::{fence, ms, unique_key, Server};

/// `LOCK.INFO key`: its `mode`, `limit` and `holders` as (owner, token) in grant order.
fn info(conn: &mut Connection, key: &str) -> (String, Option<i64>, Vec<(String, u64)>) {
    let reply: Value = redis::cmd("LOCK.INFO").arg(key).query(conn).unwrap();
    let Value::Array(items) = reply else {
        panic!("LOCK.INFO {key}: {reply:?}")
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).unwrap(),
        Value::SimpleString(s) => s.clone(),
        other => panic!("not a string: {other:?}"),
    };
    let field = |name: &str| {
        let at = items.chunks(2).position(|pair| text(&pair[0]) == name);
        items[2 * at.unwrap_or_else(|| panic!("no {name} in {items:?}")) + 1].clone()
    };
    let limit = match field("limit") {
        Value::Int(n) => Some(n),
        Value::Nil => None,
        other => panic!("limit {other:?}"),
    };
    let Value::Array(holders) = field("holders") else {
        panic!("holders")
    };
    let holders = holders
        .iter()
        .map(|holder| match holder {
            // Read by name: the server's order of a holder's fields is not part of its reply's
            // meaning (a `session` flag now sorts between `owner` and `token`).
            Value::Array(h) => {
                let at = |name: &str| h.chunks(2).find(|pair| text(&pair[0]) == name);
                match (at("owner"), at("token")) {
                    (Some([_, owner]), Some([_, Value::Int(token)])) => {
                        (text(owner), *token as u64)
                    }
                    _ => panic!("holder {h:?}"),
                }
            }
            other => panic!("holder {other:?}"),
        })
        .collect();
    (text(&field("mode")), limit, holders)
}

/// The detail of an error reply, e.g. `this lock is held SHARED with LIMIT 2; ...`.
fn server_error<T: std::fmt::Debug>(result: Result<T, Error>) -> (String, String) {
    match result {
        Err(Error::Server(e)) => (
            e.code().unwrap().to_string(),
            e.detail().unwrap().to_string(),
        ),
        other => panic!("expected an error reply, got {other:?}"),
    }
}

macro_rules! shared_tests {
    () => {
        api_test! { fn a_semaphore_grants_limit_holders_and_refuses_another_limit() {
            let (server, client, mut conn) = crate::apis::setup!();
            let key = unique_key("semaphore");
            let semaphore = Semaphore::new(&client, &key, 2);
            let a = io!(semaphore.acquire(ms(10_000))).unwrap().expect("first permit");
            let b = io!(semaphore.acquire(ms(10_000))).unwrap().expect("second permit");
            assert!(b.token() > a.token(), "{} then {}", a.token(), b.token());
            assert_ne!(a.owner(), b.owner(), "one random owner per guard");
            // The server holds the key SHARED LIMIT 2 with exactly these two holders.
            let holders = vec![
                (a.owner().to_string(), a.token()),
                (b.owner().to_string(), b.token()),
            ];
            assert_eq!(info(&mut conn, &key), ("shared".to_string(), Some(2), holders));
            assert_eq!(fence(&mut conn, &key), Some(b.token()), "the largest live token");
            assert!(io!(a.is_held()).unwrap() && io!(b.is_held()).unwrap());
            // Both permits taken: a third holder is refused, not an error.
            assert!(io!(semaphore.acquire(ms(10_000))).unwrap().is_none());
            // Another limit on the same key is the server's error, and changes nothing.
            let (code, detail) = server_error(io!(Semaphore::new(&client, &key, 3).acquire(ms(1_000))));
            assert_eq!(code, "ERR");
            assert_eq!(detail, "this lock is held SHARED with LIMIT 2; acquire it with SHARED LIMIT 2");
            // So is an exclusive acquire by an owner that holds a permit (no upgrade).
            let owned = client.clone().with_owner("worker-a");
            let permit = io!(Semaphore::new(&owned, &key, 2).acquire(ms(1_000)));
            assert!(permit.unwrap().is_none(), "both permits are taken");
            drop(a);
            io!(settled("the permit released on drop", || info(&mut conn, &key).2.len() == 1));
            let permit = io!(Semaphore::new(&owned, &key, 2).acquire(ms(10_000))).unwrap().unwrap();
            assert_eq!(permit.owner(), "worker-a");
            let (code, detail) = server_error(io!(owned.acquire(&key, ms(1_000))));
            assert_eq!(code, "ERR");
            assert_eq!(detail, "owner holds this lock SHARED; release it before acquiring it exclusively");
            // The same owner again is the idempotent retry: the same token.
            let retry = io!(Semaphore::new(&owned, &key, 2).acquire(ms(10_000))).unwrap().unwrap();
            assert_eq!(retry.token(), permit.token());
            // A zero limit is refused before anything is sent.
            let calls = server.calls("lock.acquire");
            assert!(matches!(
                io!(Semaphore::new(&client, &key, 0).acquire(ms(1_000))),
                Err(Error::InvalidArgument(_))
            ));
            assert_eq!(server.calls("lock.acquire"), calls);
        } }

        api_test! { fn semaphore_waiters_are_served_in_arrival_order() {
            let server = Server::start();
            let client = Client::open(&server.url()).unwrap();
            let key = unique_key("semaphore-fifo");
            let semaphore = Semaphore::new(&client, &key, 2);
            let a = io!(semaphore.acquire(ms(10_000))).unwrap().unwrap();
            let _b = io!(semaphore.acquire(ms(10_000))).unwrap().unwrap();
            let (tx, order) = std::sync::mpsc::channel();
            let mut waiters = Vec::new();
            for i in 0..3u64 {
                let (semaphore, tx) = (semaphore.clone(), tx.clone());
                waiters.push(spawn!({
                    let guard = io!(semaphore.acquire_blocking(ms(10_000), ms(10_000)))
                        .unwrap()
                        .expect("a permit in turn");
                    tx.send((i, guard.token())).unwrap();
                    io!(guard.release()).unwrap();
                }));
                // The next waiter is sent only once this one is in the queue.
                blocking(|| server.wait_blocked(i + 1));
            }
            // One permit frees up: the waiters pass through it one after the other.
            io!(a.release()).unwrap();
            for waiter in waiters {
                io!(join(waiter));
            }
            drop(tx);
            let got: Vec<(u64, u64)> = order.iter().collect();
            let arrival: Vec<u64> = got.iter().map(|(i, _)| *i).collect();
            assert_eq!(arrival, vec![0, 1, 2], "not first come, first served");
            assert!(got.windows(2).all(|w| w[0].1 < w[1].1), "tokens {got:?}");
            // With a wait shorter than the holders' ttl: None once the wait runs out.
            let _c = io!(semaphore.acquire_blocking(ms(10_000), ms(1)))
                .unwrap()
                .expect("the second permit is free again");
            let start = Instant::now();
            let full = io!(semaphore.acquire_blocking(ms(1_000), ms(200))).unwrap();
            assert!(full.is_none(), "a third permit");
            assert!(start.elapsed() >= ms(190), "{:?}", start.elapsed());
        } }

        api_test! { fn a_read_write_lock_shares_reads_and_queues_the_writer_ahead_of_later_readers() {
            let (server, client, mut conn) = crate::apis::setup!();
            let key = unique_key("rwlock");
            let rw = ReadWriteLock::new(&client, &key);
            let r1 = io!(rw.read(ms(10_000))).unwrap().expect("a reader");
            let r2 = io!(rw.read(ms(10_000))).unwrap().expect("readers together");
            let (mode, limit, holders) = info(&mut conn, &key);
            assert_eq!((mode.as_str(), limit, holders.len()), ("shared", None, 2));
            assert!(io!(rw.write(ms(10_000))).unwrap().is_none(), "a writer among readers");

            // A writer waits; a reader that comes after it waits behind it (no barging).
            let writer = {
                let rw = rw.clone();
                spawn!({
                    let guard = io!(rw.write_blocking(ms(10_000), ms(10_000)))
                        .unwrap()
                        .expect("the writer in turn");
                    let token = guard.token();
                    (guard, token)
                })
            };
            blocking(|| server.wait_blocked(1));
            assert!(io!(rw.read(ms(10_000))).unwrap().is_none(), "a reader overtook the writer");
            drop(r1);
            io!(settled("the first reader's release", || info(&mut conn, &key).2.len() == 1));
            assert_eq!(server.blocked_clients(), 1, "the writer is still waiting");
            let r2_token = r2.token();
            assert!(io!(r2.release()).unwrap());
            let (write, token) = io!(join(writer));
            assert!(token > r2_token);
            assert_eq!(info(&mut conn, &key).0, "exclusive");
            assert_eq!(fence(&mut conn, &key), Some(token));
            assert!(io!(rw.read(ms(10_000))).unwrap().is_none(), "a reader beside the writer");
            assert!(io!(write.release()).unwrap());

            // A chosen owner `x` reads as `x:read` and writes as `x:write`.
            let owned = ReadWriteLock::new(&client.clone().with_owner("x"), &key);
            let read = io!(owned.read(ms(10_000))).unwrap().unwrap();
            assert_eq!(read.owner(), "x:read");
            assert!(io!(owned.write(ms(10_000))).unwrap().is_none());
            drop(read);
            io!(settled("the reader's release", || fence(&mut conn, &key).is_none()));
            let write = io!(owned.write(ms(10_000))).unwrap().unwrap();
            assert_eq!(write.owner(), "x:write");
        } }

        api_test! { fn the_watchdog_renews_a_shared_hold_and_stops_on_drop() {
            let (server, client, mut conn) = crate::apis::setup!();
            let key = unique_key("semaphore-watchdog");
            // A ttl a loaded machine's scheduler cannot outrun (a 200 ms one lapsed on CI's
            // Valkey 8.1 run with every suite side by side); renewed every third of it.
            let ttl = ms(1500);
            let semaphore = Semaphore::new(&client, &key, 3);
            let guard = io!(semaphore.acquire_with_watchdog(ttl)).unwrap().unwrap();
            let other = io!(semaphore.acquire(ms(10_000))).unwrap().unwrap();
            assert!(guard.has_watchdog());
            // Four renewals take longer than the ttl: the permit lives on only by them.
            let before = server.calls("lock.extend");
            io!(poll("four renewals", ms(20_000), || server.calls("lock.extend") >= before + 4));
            let live: i64 = redis::cmd("LOCK.FENCE")
                .arg(&key)
                .arg(guard.token())
                .query(&mut conn)
                .unwrap();
            assert_eq!(live, 1, "the renewed permit lapsed");
            assert!(!guard.is_lost());
            let token = guard.token();
            drop(guard);
            io!(settled("the permit released on drop", || {
                info(&mut conn, &key).2 == vec![(other.owner().to_string(), other.token())]
            }));
            let after_drop = server.calls("lock.extend");
            io!(sleep(ttl * 2));
            assert_eq!(server.calls("lock.extend"), after_drop, "renewed after drop");
            assert!(token < other.token());
        } }
    };
}

apis::both!(
    shared_tests,
    aio: {
    /// A semaphore wait given up by the caller leaves the queue and takes no permit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancelled_semaphore_wait_takes_no_permit() {
        let (server, client, mut conn) = crate::apis::setup!();
        let key = unique_key("semaphore-cancel");
        let semaphore = Semaphore::new(&client, &key, 1);
        let holder = semaphore.acquire(ms(10_000)).await.unwrap().unwrap();
        let waiter = semaphore.acquire_blocking(ms(10_000), ms(5_000));
        assert!(tokio::time::timeout(ms(100), waiter).await.is_err());
        tokio::task::block_in_place(|| server.wait_blocked(0));
        assert!(holder.release().await.unwrap());
        assert_eq!(
            fence(&mut conn, &key),
            None,
            "the abandoned waiter got the permit"
        );
    }
    }
);
