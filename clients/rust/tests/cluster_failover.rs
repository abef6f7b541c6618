//! The sync client follows a planned `CLUSTER FAILOVER` of its key's shard (issue 34): a
//! `Client::for_key` client whose node turned replica is pointed at the new master (by the
//! `MOVED` it gets there, or the demoted node's `ROLE`), so a session's keepalives, a watchdog's
//! renewals and a queued waiter go on there, and a bound session is re-attached there. Holds
//! kept with their tokens, no loss reported, the waiter granted without the caller sending
//! again. Every wait is on observable state. The async client (`aio::Client::for_key`) does the
//! same, in a test of its own on a cluster of its own; the feed follows too. A killed master:
//! `cluster_killed_master.rs`.

mod support;

use std::thread;
use std::time::Duration;

use redis::Value;
use redis_lock_client::{Client, Session};
use support::failover::{attached, info, master_of, role, shard_channels, PATIENCE};
use support::{cluster, eventually, ms, test_dir, wait_for};

#[test]
fn a_planned_failover_keeps_sessions_renewals_and_waiters() {
    let dir = test_dir("client-cluster-failover");
    let nodes = cluster::start(3, 1, &dir);
    let tag = "{fo-rust}";
    let seed = Client::open(&nodes[0].url()).unwrap();
    let client = seed.for_key(tag).unwrap();
    let old = nodes
        .iter()
        .find(|n| {
            role(n) == "master" && {
                let r: redis::RedisResult<Value> =
                    redis::cmd("LOCK.FENCE").arg(tag).query(&mut n.conn());
                r.is_ok()
            }
        })
        .expect("the tag's master");
    let new = nodes
        .iter()
        .find(|n| master_of(n) == Some(old.port()))
        .expect("its replica");

    let session = Session::builder(&client, ms(3_000)).open().unwrap();
    let in_session = client
        .with_session(&session)
        .acquire(&format!("{tag}s"), Duration::ZERO)
        .unwrap()
        .expect("granted");
    let bound = Session::builder(&client, ms(3_000))
        .bound(true)
        .open()
        .unwrap();
    let in_bound = client
        .with_session(&bound)
        .acquire(&format!("{tag}b"), Duration::ZERO)
        .unwrap()
        .expect("granted");
    let dog = client
        .acquire_with_watchdog(&format!("{tag}dog"), ms(3_000))
        .unwrap()
        .expect("granted");
    let holder = client
        .acquire(&format!("{tag}busy"), ms(60_000))
        .unwrap()
        .expect("granted");
    let waiter = {
        let client = client.clone();
        let key = format!("{tag}busy");
        thread::spawn(move || client.acquire_blocking(&key, ms(60_000), PATIENCE))
    };
    wait_for("the waiter queued", PATIENCE, || {
        (info(old, &format!("{tag}busy")).1 == 1).then_some(())
    });

    let keepalives = new.calls("lock.session|keepalive");
    let ok: Value = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .query(&mut new.conn())
        .unwrap();
    assert_eq!(ok, Value::Okay);
    wait_for("the replica promoted", PATIENCE, || {
        (role(new) == "master").then_some(())
    });
    wait_for("keepalives on the new master", PATIENCE, || {
        (new.calls("lock.session|keepalive") >= keepalives + 2).then_some(())
    });
    wait_for("a renewal on the new master", PATIENCE, || {
        (new.calls("lock.extend") >= 1).then_some(())
    });
    wait_for("the bound session attached on the new master", PATIENCE, || {
        attached(new, bound.id()).then_some(())
    });
    assert_eq!(info(new, in_bound.key()).0, vec![in_bound.token()]);
    assert!(!bound.is_lost() && !in_bound.is_lost());
    assert_eq!(info(new, in_session.key()).0, vec![in_session.token()]);
    assert_eq!(info(new, dog.key()).0, vec![dog.token()]);
    assert!(!session.is_lost() && !in_session.is_lost() && !dog.is_lost());

    wait_for(
        "the waiter queued again on the new master",
        PATIENCE,
        || (info(new, &format!("{tag}busy")).1 == 1).then_some(()),
    );
    assert!(holder.release().unwrap());
    let granted = waiter.join().unwrap().unwrap().expect("the waiter granted");
    assert_eq!(info(new, granted.key()).0, vec![granted.token()]);

    assert!(granted.release().unwrap());
    assert!(dog.release().unwrap());
    assert!(in_session.release().unwrap());
    assert_eq!(session.close().unwrap(), Some(0));
    assert!(in_bound.release().unwrap());
    assert_eq!(bound.close().unwrap(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_client_follows_a_planned_failover() {
    use redis_lock_client::aio;

    let dir = test_dir("client-cluster-failover-async");
    let nodes = tokio::task::spawn_blocking(move || cluster::start(3, 1, &dir))
        .await
        .unwrap();
    let tag = "{fo-rust-async}";
    let seed = aio::Client::open(&nodes[0].url()).unwrap();
    let client = seed.for_key(tag).await.unwrap();
    let old = nodes
        .iter()
        .find(|n| {
            role(n) == "master" && {
                let r: redis::RedisResult<Value> =
                    redis::cmd("LOCK.FENCE").arg(tag).query(&mut n.conn());
                r.is_ok()
            }
        })
        .expect("the tag's master");
    let new = nodes
        .iter()
        .find(|n| master_of(n) == Some(old.port()))
        .expect("its replica");

    let session = aio::Session::builder(&client, ms(3_000))
        .open()
        .await
        .unwrap();
    let in_session = client
        .with_session(&session)
        .acquire(&format!("{tag}s"), Duration::ZERO)
        .await
        .unwrap()
        .expect("granted");
    let bound = aio::Session::builder(&client, ms(3_000))
        .bound(true)
        .open()
        .await
        .unwrap();
    let in_bound = client
        .with_session(&bound)
        .acquire(&format!("{tag}b"), Duration::ZERO)
        .await
        .unwrap()
        .expect("granted");
    let dog = client
        .acquire_with_watchdog(&format!("{tag}dog"), ms(3_000))
        .await
        .unwrap()
        .expect("granted");
    let holder = client
        .acquire(&format!("{tag}busy"), ms(60_000))
        .await
        .unwrap()
        .expect("granted");
    let waiter = {
        let client = client.clone();
        let key = format!("{tag}busy");
        tokio::spawn(async move { client.acquire_blocking(&key, ms(60_000), PATIENCE).await })
    };
    let busy = format!("{tag}busy");
    eventually("the waiter queued", PATIENCE, || info(old, &busy).1 == 1).await;

    let keepalives = new.calls("lock.session|keepalive");
    let ok: Value = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .query(&mut new.conn())
        .unwrap();
    assert_eq!(ok, Value::Okay);
    eventually("the replica promoted", PATIENCE, || role(new) == "master").await;
    eventually("keepalives on the new master", PATIENCE, || {
        new.calls("lock.session|keepalive") >= keepalives + 2
    })
    .await;
    eventually("a renewal on the new master", PATIENCE, || {
        new.calls("lock.extend") >= 1
    })
    .await;
    eventually(
        "the bound session attached on the new master",
        PATIENCE,
        || attached(new, bound.id()),
    )
    .await;
    assert_eq!(info(new, in_bound.key()).0, vec![in_bound.token()]);
    assert!(!bound.is_lost() && !in_bound.is_lost());
    assert_eq!(info(new, in_session.key()).0, vec![in_session.token()]);
    assert_eq!(info(new, dog.key()).0, vec![dog.token()]);
    assert!(!session.is_lost() && !in_session.is_lost() && !dog.is_lost());

    eventually(
        "the waiter queued again on the new master",
        PATIENCE,
        || info(new, &busy).1 == 1,
    )
    .await;
    assert!(holder.release().await.unwrap());
    let granted = waiter.await.unwrap().unwrap().expect("the waiter granted");
    assert_eq!(info(new, granted.key()).0, vec![granted.token()]);

    assert!(granted.release().await.unwrap());
    assert!(dog.release().await.unwrap());
    assert!(in_session.release().await.unwrap());
    assert_eq!(session.close().await.unwrap(), Some(0));
    assert!(in_bound.release().await.unwrap());
    assert_eq!(bound.close().await.unwrap(), Some(0));
    tokio::task::spawn_blocking(move || drop(nodes))
        .await
        .unwrap();
}

/// The change feed follows a planned failover (issue 34): the old master's unasked
/// `sunsubscribe` moves the feed to the new master, where it watches, subscribes and reads each
/// key again. A watched guard is not reported lost (the new master has its token), the
/// observers stay quiet (the same state), and what happens on the new master reaches them all.
#[test]
fn the_feed_follows_a_planned_failover() {
    use redis_lock_client::{Change, Election, Leader, LossReason};

    let dir = test_dir("client-cluster-failover-feed");
    let nodes = cluster::start(3, 1, &dir);
    let tag = "{fo-feed}";
    let seed = Client::open(&nodes[0].url()).unwrap();
    let client = seed.for_key(tag).unwrap().watch_losses();
    let old = nodes
        .iter()
        .find(|n| {
            role(n) == "master" && {
                let r: redis::RedisResult<Value> =
                    redis::cmd("LOCK.FENCE").arg(tag).query(&mut n.conn());
                r.is_ok()
            }
        })
        .expect("the tag's master");
    let new = nodes
        .iter()
        .find(|n| master_of(n) == Some(old.port()))
        .expect("its replica");

    let guard = client
        .acquire(&format!("{tag}g"), ms(60_000))
        .unwrap()
        .expect("granted");
    let election = Election::new(&client, &format!("{tag}e"), ms(60_000));
    let leading = election.campaign("a").unwrap();
    let observer = election.observe().unwrap();
    let first = observer.next_timeout(PATIENCE).expect("the first state");
    let a = Leader {
        value: "a".into(),
        term: leading.term(),
    };
    assert_eq!(first.leader, Some(a));
    let watcher = client.watch(&format!("{tag}w")).unwrap();
    assert_eq!(
        watcher.next_timeout(PATIENCE).expect("the first state"),
        Change {
            leader: None,
            resync: false
        }
    );
    assert_eq!(shard_channels(old), 3);

    let ok: Value = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .query(&mut new.conn())
        .unwrap();
    assert_eq!(ok, Value::Okay);
    wait_for("the replica promoted", PATIENCE, || {
        (role(new) == "master").then_some(())
    });
    wait_for("the feed subscribed on the new master", PATIENCE, || {
        (shard_channels(new) == 3).then_some(())
    });

    // Changes made on the new master reach the observers as feed messages.
    let other = Client::open(&new.url()).unwrap().without_session();
    let taken = other
        .acquire(&format!("{tag}w"), ms(60_000))
        .unwrap()
        .expect("granted");
    let seen = watcher.next_timeout(PATIENCE).expect("the grant");
    assert_eq!(
        seen,
        Change {
            leader: Some(Leader {
                value: taken.owner().to_string(),
                term: taken.token()
            }),
            resync: false
        }
    );
    assert!(leading.resign().unwrap());
    let b = election.campaign("b").unwrap();
    assert!(b.term() > first.leader.as_ref().unwrap().term);
    let mut changes = vec![];
    while changes
        .last()
        .and_then(|c: &Change| c.leader.as_ref())
        .map(|l| l.term)
        != Some(b.term())
    {
        changes.push(observer.next_timeout(PATIENCE).expect("the next leader"));
    }
    assert_eq!(
        changes.last().unwrap().leader,
        Some(Leader {
            value: "b".into(),
            term: b.term()
        })
    );
    // "No leader", then b; or b alone, read with `resync` set when the read after a's
    // release already found b (the state moved past the message: not the failover's doing).
    assert!(
        changes.len() <= 2
            && changes[..changes.len() - 1]
                .iter()
                .all(|c| c.leader.is_none()),
        "{changes:?}"
    );
    assert!(observer.try_next().is_none());

    // The guard was not reported lost (the new master has its token)...
    assert_eq!(info(new, guard.key()).0, vec![guard.token()]);
    assert!(guard.loss_reason().is_none(), "{:?}", guard.loss_reason());
    assert!(!b.is_lost());
    // ...and a real loss on the new master reaches it.
    let deleted: i64 = redis::cmd("DEL")
        .arg(guard.key())
        .query(&mut new.conn())
        .unwrap();
    assert_eq!(deleted, 1);
    assert!(matches!(
        guard.wait_lost(PATIENCE),
        Some(LossReason::Deleted)
    ));

    assert!(taken.release().unwrap());
    assert_eq!(
        watcher.next_timeout(PATIENCE).expect("the release"),
        Change {
            leader: None,
            resync: false
        }
    );
    assert!(b.resign().unwrap());
}

/// The next change of an async observer, waiting up to [`PATIENCE`].
async fn next(
    observer: &mut redis_lock_client::aio::Observer,
) -> Option<redis_lock_client::Change> {
    tokio::time::timeout(PATIENCE, observer.next())
        .await
        .ok()
        .flatten()
}

/// The async client's feed (the same subscriber thread, reached through `aio::Client::for_key`)
/// follows a planned failover too: a watched guard is not reported lost, and a watcher sees
/// the new master's changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_feed_follows_a_planned_failover() {
    use redis_lock_client::{aio, Change, Leader, LossReason};

    let dir = test_dir("client-cluster-failover-feed-async");
    let nodes = tokio::task::spawn_blocking(move || cluster::start(3, 1, &dir))
        .await
        .unwrap();
    let tag = "{fo-feed-async}";
    let seed = aio::Client::open(&nodes[0].url()).unwrap();
    let client = seed.for_key(tag).await.unwrap().watch_losses();
    let old = nodes
        .iter()
        .find(|n| {
            role(n) == "master" && {
                let r: redis::RedisResult<Value> =
                    redis::cmd("LOCK.FENCE").arg(tag).query(&mut n.conn());
                r.is_ok()
            }
        })
        .expect("the tag's master");
    let new = nodes
        .iter()
        .find(|n| master_of(n) == Some(old.port()))
        .expect("its replica");

    let guard = client
        .acquire(&format!("{tag}g"), ms(60_000))
        .await
        .unwrap()
        .expect("granted");
    let mut watcher = client.watch(&format!("{tag}w")).await.unwrap();
    assert_eq!(
        next(&mut watcher).await,
        Some(Change {
            leader: None,
            resync: false
        })
    );
    assert_eq!(shard_channels(old), 2);

    let ok: Value = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .query(&mut new.conn())
        .unwrap();
    assert_eq!(ok, Value::Okay);
    eventually("the replica promoted", PATIENCE, || role(new) == "master").await;
    eventually("the feed subscribed on the new master", PATIENCE, || {
        shard_channels(new) == 2
    })
    .await;

    let other = Client::open(&new.url()).unwrap().without_session();
    let key = format!("{tag}w");
    let taken = tokio::task::spawn_blocking(move || other.acquire(&key, ms(60_000)))
        .await
        .unwrap()
        .unwrap()
        .expect("granted");
    assert_eq!(
        next(&mut watcher).await,
        Some(Change {
            leader: Some(Leader {
                value: taken.owner().to_string(),
                term: taken.token()
            }),
            resync: false
        })
    );
    assert_eq!(info(new, guard.key()).0, vec![guard.token()]);
    assert!(guard.loss_reason().is_none(), "{:?}", guard.loss_reason());
    let deleted: i64 = redis::cmd("DEL")
        .arg(guard.key())
        .query(&mut new.conn())
        .unwrap();
    assert_eq!(deleted, 1);
    let reason = tokio::time::timeout(PATIENCE, guard.lost()).await;
    assert!(matches!(reason, Ok(LossReason::Deleted)), "{reason:?}");

    tokio::task::spawn_blocking(move || {
        assert!(taken.release().unwrap());
        drop(nodes)
    })
    .await
    .unwrap();
}
