//! `MultiLock` against a real server, sync and async from one definition: all keys or none
//! (`LOCK.MACQUIRE`), one token per key, one `LOCK.MRELEASE`, extend and fence checks over
//! every key, a blocked set served in FIFO order with the single-key waiters of its keys,
//! release on drop, and the watchdog over several keys.

mod apis;
mod support;

use std::time::Instant;

use redis_lock_client::Error;
use support::{exists, fence, ms, pttl, unique_key, Server};

/// `n` keys with one hash tag (as a cluster would need).
fn keys(prefix: &str, n: usize) -> Vec<String> {
    let tag = unique_key(prefix);
    (1..=n).map(|i| format!("{{{tag}}}:{i}")).collect()
}

macro_rules! shared_tests {
    () => {
        api_test! { fn takes_every_key_or_none_with_a_token_each() {
            let (server, client, mut conn) = crate::apis::setup!();
            let k = keys("multi", 4);
            let guard = io!(MultiLock::new(&client, &k[..3]).acquire(ms(10_000)))
                .unwrap()
                .expect("three free keys");
            assert_eq!(guard.keys(), &k[..3]);
            let live: Vec<Option<u64>> = k[..3].iter().map(|key| fence(&mut conn, key)).collect();
            let tokens: Vec<Option<u64>> = guard.tokens().iter().map(|t| Some(*t)).collect();
            assert_eq!(live, tokens, "one token per key, in the keys' order");
            assert_eq!(guard.token(), *guard.tokens().iter().max().unwrap());
            assert_eq!(guard.key(), k[0]);
            assert!(io!(guard.is_held()).unwrap());

            // A set that overlaps on one key gets nothing, not even its free key.
            let overlap = MultiLock::new(&client, &[&k[2], &k[3]]);
            assert!(io!(overlap.acquire(ms(10_000))).unwrap().is_none());
            assert!(!exists(&mut conn, &k[3]), "a part of the set was taken");

            // extend moves every deadline; with one key lost it reports false.
            assert!(pttl(&mut conn, &k[0]) <= 10_000);
            assert!(io!(guard.extend(ms(60_000))).unwrap());
            assert!(k[..3].iter().all(|key| pttl(&mut conn, key) > 50_000));
            assert_eq!(guard.ttl(), ms(60_000));
            let _: i64 = redis::cmd("DEL").arg(&k[1]).query(&mut conn).unwrap();
            assert!(!io!(guard.is_held()).unwrap(), "a key was deleted");
            assert!(!io!(guard.extend(ms(60_000))).unwrap(), "not every key was held");
            // release is one LOCK.MRELEASE: true only if every key was still held, and it
            // releases those that were.
            assert!(!io!(guard.release()).unwrap());
            assert_eq!(server.calls("lock.mrelease"), 1);
            assert!(k.iter().all(|key| !exists(&mut conn, key)));

            // Dropped, it releases every key.
            let guard = io!(MultiLock::new(&client, &k).acquire(ms(10_000))).unwrap().unwrap();
            assert_eq!(guard.tokens().len(), 4);
            drop(guard);
            io!(settled("the keys released on drop", || k.iter().all(|key| !exists(&mut conn, key))));

            // A chosen owner acquiring again is the idempotent retry: the same tokens.
            let owned = MultiLock::new(&client.clone().with_owner("order-7"), &k[..2]);
            let first = io!(owned.acquire(ms(10_000))).unwrap().unwrap();
            let retry = io!(owned.acquire(ms(10_000))).unwrap().unwrap();
            assert_eq!(first.owner(), "order-7");
            assert_eq!(first.tokens(), retry.tokens());
        } }

        api_test! { fn bad_key_lists_are_refused() {
            let server = Server::start();
            let client = Client::open(&server.url()).unwrap();
            let none: [&str; 0] = [];
            let calls = server.calls("lock.macquire");
            assert!(matches!(
                io!(MultiLock::new(&client, &none).acquire(ms(1_000))),
                Err(Error::InvalidArgument(_))
            ));
            assert_eq!(server.calls("lock.macquire"), calls, "sent anyway");
            let key = unique_key("dup");
            match io!(MultiLock::new(&client, &[&key, &key]).acquire(ms(1_000))) {
                Err(Error::Server(e)) => {
                    assert_eq!(e.code(), Some("ERR"));
                    assert_eq!(e.detail(), Some(format!("duplicate key '{key}'").as_str()));
                }
                other => panic!("expected ERR duplicate key, got {other:?}"),
            }
        } }

        api_test! { fn a_blocked_set_is_served_in_arrival_order_with_single_key_waiters() {
            let (server, client, mut conn) = crate::apis::setup!();
            let k = keys("multi-fifo", 2);
            let clerk = io!(client.acquire(&k[1], ms(10_000))).unwrap().unwrap();
            let (tx, order) = std::sync::mpsc::channel();

            // First in line: the set {k1, k2}, waiting for k2.
            let set = {
                let (lock, tx) = (MultiLock::new(&client, &k), tx.clone());
                spawn!({
                    let guard = io!(lock.acquire_blocking(ms(10_000), ms(10_000)))
                        .unwrap()
                        .expect("the set in turn");
                    tx.send(("set", guard.tokens().to_vec())).unwrap();
                    io!(guard.release()).unwrap();
                })
            };
            blocking(|| server.wait_blocked(1));
            // Second: a single-key waiter on k1, which is free but promised to the set.
            let single = {
                let (client, key, tx) = (client.clone(), k[0].clone(), tx.clone());
                spawn!({
                    let guard = io!(client.acquire_blocking(&key, ms(10_000), ms(10_000)))
                        .unwrap()
                        .expect("k1 in turn");
                    tx.send(("single", guard.tokens().to_vec())).unwrap();
                    io!(guard.release()).unwrap();
                })
            };
            blocking(|| server.wait_blocked(2));
            // No barging either: a non-blocking acquire of the free k1 is refused.
            assert!(io!(client.acquire(&k[0], ms(10_000))).unwrap().is_none());
            assert!(!exists(&mut conn, &k[0]));

            io!(clerk.release()).unwrap();
            io!(join(set));
            io!(join(single));
            drop(tx);
            let got: Vec<(&str, Vec<u64>)> = order.iter().collect();
            assert_eq!(got.iter().map(|(who, _)| *who).collect::<Vec<_>>(), ["set", "single"]);
            assert_eq!(got[0].1.len(), 2);
            assert!(got[1].1[0] > got[0].1[0], "k1's tokens {got:?}");

            // A wait that runs out: None, and nothing taken.
            let clerk = io!(client.acquire(&k[1], ms(10_000))).unwrap().unwrap();
            let start = Instant::now();
            let lock = MultiLock::new(&client, &k);
            assert!(io!(lock.acquire_blocking(ms(10_000), ms(200))).unwrap().is_none());
            assert!(start.elapsed() >= ms(190), "{:?}", start.elapsed());
            assert!(!exists(&mut conn, &k[0]));
            drop(clerk);
        } }

        api_test! { fn the_watchdog_renews_every_key_and_stops_on_drop() {
            let (server, client, mut conn) = crate::apis::setup!();
            let k = keys("multi-watchdog", 3);
            let ttl = ms(200);
            let guard = io!(MultiLock::new(&client, &k).acquire_with_watchdog(ttl))
                .unwrap()
                .unwrap();
            assert!(guard.has_watchdog());
            let end = Instant::now() + ttl * 5;
            while Instant::now() < end {
                let live: Vec<Option<u64>> = k.iter().map(|key| fence(&mut conn, key)).collect();
                let tokens: Vec<Option<u64>> = guard.tokens().iter().map(|t| Some(*t)).collect();
                assert_eq!(live, tokens, "a key lapsed while held");
                io!(sleep(ms(20)));
            }
            assert!(!guard.is_lost());
            // A key deleted under it: the next renewal reports the loss.
            let _: i64 = redis::cmd("DEL").arg(&k[2]).query(&mut conn).unwrap();
            let reason = io!(wait_lost(&guard, ttl * 3)).expect("loss reported");
            assert!(matches!(reason, redis_lock_client::LossReason::NotHeld), "{reason:?}");
            drop(guard);
            io!(settled("the keys released on drop", || k.iter().all(|key| !exists(&mut conn, key))));
            let after_drop = server.calls("eval");
            io!(sleep(ttl * 2));
            assert_eq!(server.calls("eval"), after_drop, "renewed after drop");
        } }
    };
}

apis::both!(
    shared_tests,
    aio: {
    /// A blocked set given up by the caller leaves every queue and takes nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancelled_set_takes_nothing() {
        let (server, client, mut conn) = crate::apis::setup!();
        let k = keys("multi-cancel", 2);
        let clerk = client.acquire(&k[1], ms(10_000)).await.unwrap().unwrap();
        let lock = MultiLock::new(&client, &k);
        let waiter = lock.acquire_blocking(ms(10_000), ms(5_000));
        assert!(tokio::time::timeout(ms(100), waiter).await.is_err());
        tokio::task::block_in_place(|| server.wait_blocked(0));
        assert!(clerk.release().await.unwrap());
        assert!(
            k.iter().all(|key| fence(&mut conn, key).is_none()),
            "a key was taken"
        );
    }
    }
);
