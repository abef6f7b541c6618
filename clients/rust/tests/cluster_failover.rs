//! A planned `CLUSTER FAILOVER` of a `for_key` client's shard (issue 34), sync and async from
//! one definition (`tests/apis`), each test on a cluster of its own. A client whose node turned
//! replica is pointed at the new master (by the `MOVED` it gets there, or the demoted node's
//! `ROLE`), so a session's keepalives, a watchdog's renewals and a queued waiter go on there,
//! and a bound session is re-attached there: holds kept with their tokens, no loss reported,
//! the waiter granted without the caller sending again. The change feed (one for both APIs)
//! follows too. Every wait is on observable state. A killed master: `cluster_killed_master.rs`.

mod apis;
mod support;

use std::time::Duration;

use redis::Value;
use redis_lock_client::{Change, Leader, LossReason};
use support::failover::{attached, info, role, shard_channels, shard_of, PATIENCE};
use support::{cluster, ms, test_dir, wait_until, Server};

/// `CLUSTER FAILOVER` on `new` (a replica), and wait until it is a master.
fn fail_over(new: &Server) {
    let ok: Value = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .query(&mut new.conn())
        .unwrap();
    assert_eq!(ok, Value::Okay);
    wait_until("the replica promoted", PATIENCE, || role(new) == "master");
}

/// What an observer reports when no one holds the key.
fn no_leader() -> Change {
    Change {
        leader: None,
        resync: false,
    }
}

macro_rules! shared_tests {
    () => {
        // Holds in an unbound and a bound session and under a watchdog, and a queued waiter:
        // the keepalives, the renewal, the bound session and the waiter go on on the new
        // master, every hold keeps its token, no loss is reported.
        api_test! { fn a_planned_failover_keeps_sessions_renewals_and_waiters() {
            let dir = test_dir("client-cluster-failover");
            let nodes = blocking(|| cluster::start(3, 1, &dir));
            let tag = "{fo-rust}";
            let seed = Client::open(&nodes[0].url()).unwrap();
            let client = io!(seed.for_key(tag)).unwrap();
            let (old, new, _) = shard_of(&nodes, tag);
            let (old, new) = (&nodes[old], &nodes[new]);

            let session = io!(Session::builder(&client, ms(3_000)).open()).unwrap();
            let in_session = io!(client.with_session(&session).acquire(&format!("{tag}s"), Duration::ZERO))
                .unwrap()
                .expect("granted");
            let bound = io!(Session::builder(&client, ms(3_000)).bound(true).open()).unwrap();
            let in_bound = io!(client.with_session(&bound).acquire(&format!("{tag}b"), Duration::ZERO))
                .unwrap()
                .expect("granted");
            let dog = io!(client.acquire_with_watchdog(&format!("{tag}dog"), ms(3_000)))
                .unwrap()
                .expect("granted");
            let busy = format!("{tag}busy");
            let holder = io!(client.acquire(&busy, ms(60_000))).unwrap().expect("granted");
            let waiter = {
                let (client, key) = (client.clone(), busy.clone());
                spawn!({ io!(client.acquire_blocking(&key, ms(60_000), PATIENCE)) })
            };
            io!(poll("the waiter queued", PATIENCE, || info(old, &busy).1 == 1));

            let keepalives = new.calls("lock.session|keepalive");
            blocking(|| fail_over(new));
            io!(poll("keepalives on the new master", PATIENCE, || {
                new.calls("lock.session|keepalive") >= keepalives + 2
            }));
            io!(poll("a renewal on the new master", PATIENCE, || new.calls("lock.extend") >= 1));
            io!(poll("the bound session attached on the new master", PATIENCE, || {
                attached(new, bound.id())
            }));
            assert_eq!(info(new, in_bound.key()).0, vec![in_bound.token()]);
            assert!(!bound.is_lost() && !in_bound.is_lost());
            assert_eq!(info(new, in_session.key()).0, vec![in_session.token()]);
            assert_eq!(info(new, dog.key()).0, vec![dog.token()]);
            assert!(!session.is_lost() && !in_session.is_lost() && !dog.is_lost());

            io!(poll("the waiter queued again on the new master", PATIENCE, || {
                info(new, &busy).1 == 1
            }));
            assert!(io!(holder.release()).unwrap());
            let granted = io!(join(waiter)).unwrap().expect("the waiter granted");
            assert_eq!(info(new, granted.key()).0, vec![granted.token()]);

            assert!(io!(granted.release()).unwrap());
            assert!(io!(dog.release()).unwrap());
            assert!(io!(in_session.release()).unwrap());
            assert_eq!(io!(session.close()).unwrap(), Some(0));
            assert!(io!(in_bound.release()).unwrap());
            assert_eq!(io!(bound.close()).unwrap(), Some(0));
            blocking(move || drop(nodes));
        } }

        // The change feed follows a planned failover: the old master's unasked `sunsubscribe`
        // moves the feed to the new master, where it watches, subscribes and reads each key
        // again. A watched guard is not reported lost (the new master has its token), the
        // observers stay quiet (the same state), and what happens on the new master reaches
        // them all.
        api_test! { fn the_feed_follows_a_planned_failover() {
            let dir = test_dir("client-cluster-failover-feed");
            let nodes = blocking(|| cluster::start(3, 1, &dir));
            let tag = "{fo-feed}";
            let seed = Client::open(&nodes[0].url()).unwrap();
            let client = io!(seed.for_key(tag)).unwrap().watch_losses();
            let (old, new, _) = shard_of(&nodes, tag);
            let (old, new) = (&nodes[old], &nodes[new]);

            let guard = io!(client.acquire(&format!("{tag}g"), ms(60_000)))
                .unwrap()
                .expect("granted");
            let election = Election::new(&client, &format!("{tag}e"), ms(60_000));
            let leading = io!(election.campaign("a")).unwrap();
            let mut observer = io!(election.observe()).unwrap();
            let first = io!(next(&mut observer)).expect("the first state");
            let a = Leader { value: "a".into(), term: leading.term() };
            assert_eq!(first.leader, Some(a));
            let mut watcher = io!(client.watch(&format!("{tag}w"))).unwrap();
            assert_eq!(io!(next(&mut watcher)).expect("the first state"), no_leader());
            assert_eq!(shard_channels(old), 3);

            blocking(|| fail_over(new));
            io!(poll("the feed subscribed on the new master", PATIENCE, || {
                shard_channels(new) == 3
            }));

            // Changes made on the new master reach the observers as feed messages. (A sync
            // client: blocking calls.)
            let other = redis_lock_client::Client::open(&new.url()).unwrap().without_session();
            let key = format!("{tag}w");
            let taken = blocking(|| other.acquire(&key, ms(60_000))).unwrap().expect("granted");
            let seen = io!(next(&mut watcher)).expect("the grant");
            let owner = Leader { value: taken.owner().to_string(), term: taken.token() };
            assert_eq!(seen, Change { leader: Some(owner), resync: false });
            assert!(io!(leading.resign()).unwrap());
            let b = io!(election.campaign("b")).unwrap();
            assert!(b.term() > first.leader.as_ref().unwrap().term);
            let mut changes = vec![];
            while changes.last().and_then(|c: &Change| c.leader.as_ref()).map(|l| l.term)
                != Some(b.term())
            {
                changes.push(io!(next(&mut observer)).expect("the next leader"));
            }
            let leader_b = Leader { value: "b".into(), term: b.term() };
            assert_eq!(changes.last().unwrap().leader, Some(leader_b));
            // "No leader", then b; or b alone, read with `resync` set when the read after a's
            // release already found b (the state moved past the message: not the failover's
            // doing).
            assert!(
                changes.len() <= 2
                    && changes[..changes.len() - 1].iter().all(|c| c.leader.is_none()),
                "{changes:?}"
            );
            assert!(observer.try_next().is_none());

            // The guard was not reported lost (the new master has its token)...
            assert_eq!(info(new, guard.key()).0, vec![guard.token()]);
            assert!(guard.loss_reason().is_none(), "{:?}", guard.loss_reason());
            assert!(!b.is_lost());
            // ...and a real loss on the new master reaches it.
            let deleted: i64 = redis::cmd("DEL").arg(guard.key()).query(&mut new.conn()).unwrap();
            assert_eq!(deleted, 1);
            let reason = io!(wait_lost(&guard, PATIENCE));
            assert!(matches!(reason, Some(LossReason::Deleted)), "{reason:?}");

            assert!(blocking(move || taken.release()).unwrap());
            assert_eq!(io!(next(&mut watcher)).expect("the release"), no_leader());
            assert!(io!(b.resign()).unwrap());
            blocking(move || drop(nodes));
        } }
    };
}

apis::both!(
    shared_tests,
    sync: {
        /// The observer's next change, waiting up to [`PATIENCE`].
        fn next(observer: &mut redis_lock_client::Observer) -> Option<Change> {
            observer.next_timeout(PATIENCE)
        }
    },
    aio: {
        /// The observer's next change, waiting up to [`PATIENCE`].
        async fn next(observer: &mut redis_lock_client::aio::Observer) -> Option<Change> {
            tokio::time::timeout(PATIENCE, observer.next()).await.ok().flatten()
        }
    },
);
