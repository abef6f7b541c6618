//! Durable grants (`Client::durable`): an acquire succeeds only once the replicas asked for
//! acknowledged the grant (`WAIT` on the acquire's own connection); too few within the timeout
//! give `Error::NotDurable` and leave no grant behind. Sync and async from one definition.

mod apis;
mod support;

use std::time::Instant;

use redis_lock_client::Error;
use support::{fence, ms, unique_key, wait_for_replica_sync, Server};

/// A primary and its replica, in sync.
fn pair() -> (Server, Server) {
    let primary = Server::start();
    let replica = Server::replica_of(&primary);
    wait_for_replica_sync(&primary, &replica);
    (primary, replica)
}

fn signal(server: &Server, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &server.pid().to_string()])
        .status()
        .expect("kill");
    assert!(ok.success(), "kill {sig}");
}

macro_rules! durable_tests {
    () => {
        api_test! { fn a_durable_grant_is_on_the_replica_when_acquire_returns() {
            let (primary, replica) = pair();
            let client = Client::open(&primary.url()).unwrap().durable(1, ms(2_000));
            let mut on_replica = replica.conn();
            let key = unique_key("durable");
            let guard = io!(client.acquire(&key, ms(10_000))).unwrap().expect("granted");
            assert_eq!(fence(&mut on_replica, &key), Some(guard.token()));
            // Busy is still Ok(None), not an error.
            assert!(io!(client.acquire(&key, ms(10_000))).unwrap().is_none());
            // A blocked waiter's grant, made by the release, is acknowledged too.
            let waiter_client = client.clone();
            let waiter_key = key.clone();
            let waiter = spawn!({
                io!(waiter_client.acquire_blocking(&waiter_key, ms(10_000), ms(10_000)))
            });
            let mut conn = primary.conn();
            blocking(|| support::wait_blocked(&mut conn, 1));
            let first = guard.token();
            io!(guard.release()).unwrap();
            let granted = io!(join(waiter)).unwrap().expect("the waiter is granted");
            assert!(granted.token() > first);
            assert_eq!(fence(&mut on_replica, &key), Some(granted.token()));
            // Several keys at once too.
            let keys = [format!("{{{key}}}:a"), format!("{{{key}}}:b")];
            let multi = MultiLock::new(&client, &keys);
            let all = io!(multi.acquire(ms(10_000))).unwrap().expect("every key");
            for (k, t) in keys.iter().zip(all.tokens()) {
                assert_eq!(fence(&mut on_replica, k), Some(*t));
            }
        }}

        api_test! { fn too_few_acknowledgements_release_the_grant_and_say_so() {
            let (primary, replica) = pair();
            // By ttl alone: the retry below is another client's, which in a default session
            // would be refused as the owner's hold in another session.
            let client = Client::open(&primary.url()).unwrap().durable(1, ms(300)).without_session();
            let mut conn = primary.conn();
            let key = unique_key("not-durable");
            signal(&replica, "-STOP");
            let started = Instant::now();
            let outcome = io!(client.acquire(&key, ms(10_000)));
            let waited = started.elapsed();
            let left = fence(&mut conn, &key);
            let wanted_owner = io!(client.clone().with_owner("mine").acquire(&key, ms(10_000)));
            signal(&replica, "-CONT");
            match outcome {
                Err(Error::NotDurable { acknowledged: 0, wanted: 1, released: true }) => {}
                other => panic!("expected NotDurable (released), got {other:?}"),
            }
            assert!(waited >= ms(300), "WAIT waited its timeout ({waited:?})");
            assert_eq!(left, None, "no grant left behind");
            // A chosen owner's hold may be one it had before: left alone, and said so.
            match wanted_owner {
                Err(Error::NotDurable { released: false, .. }) => {}
                other => panic!("expected NotDurable (not released), got {other:?}"),
            }
            assert!(fence(&mut conn, &key).is_some(), "the chosen owner's hold stays");
            let plain = Client::open(&primary.url()).unwrap().without_session().with_owner("mine");
            assert!(io!(plain.acquire(&key, ms(10_000))).unwrap().is_some(), "retry of the same owner");
        }}
    };
}

apis::both!(durable_tests);

#[test]
fn not_durable_names_the_shortfall_and_what_happened_to_the_grant() {
    let released = Error::NotDurable {
        acknowledged: 0,
        wanted: 2,
        released: true,
    };
    assert_eq!(
        released.to_string(),
        "granted, but 0 of 2 replica(s) acknowledged the grant; the grant was released"
    );
    let kept = Error::NotDurable {
        acknowledged: 1,
        wanted: 2,
        released: false,
    };
    assert!(kept
        .to_string()
        .ends_with("the lock may stay held until its TTL"));
}
