//! The sync client follows a planned `CLUSTER FAILOVER` of its key's shard (issue 34): a
//! `Client::for_key` client whose node turned replica is pointed at the new master (by the
//! `MOVED` it gets there, or the demoted node's `ROLE`), so a session's keepalives, a watchdog's
//! renewals and a queued waiter go on there, and a bound session is re-attached there. Holds kept with their tokens, no loss reported, the
//! waiter granted without the caller sending again. Every wait is on observable state.
//! The async client (`aio::Client::for_key`) does the same, in a test of its own on a cluster of
//! its own. After a killed master (SIGKILL, then `CLUSTER FAILOVER FORCE` on its replica) the
//! default session and the feed follow, and so do, with no session to move the client, a plain
//! command, an unbound session's keepalives and a queued waiter (both APIs).

mod support;

use std::thread;
use std::time::Duration;

use redis::Value;
use redis_lock_client::{Client, Session};
use support::{cluster, eventually, ms, sleep_until_elapsed, test_dir, wait_for, Server};

const PATIENCE: Duration = Duration::from_secs(30);

fn role(server: &Server) -> String {
    let role: Vec<Value> = redis::cmd("ROLE").query(&mut server.conn()).expect("ROLE");
    match &role[0] {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        other => format!("{other:?}"),
    }
}

/// The port of the master `server` (a replica) follows.
fn master_of(server: &Server) -> Option<u16> {
    let role: Vec<Value> = redis::cmd("ROLE").query(&mut server.conn()).ok()?;
    match role.as_slice() {
        [Value::BulkString(kind), _, Value::Int(port), ..] if kind == b"slave" => {
            Some(*port as u16)
        }
        _ => None,
    }
}

/// `LOCK.INFO key` on one node: the holders' tokens and the number of waiters.
fn info(server: &Server, key: &str) -> (Vec<u64>, i64) {
    let reply: Value = redis::cmd("LOCK.INFO")
        .arg(key)
        .query(&mut server.conn())
        .unwrap();
    let pairs = |v: &Value| -> Vec<(String, Value)> {
        let items = match v {
            Value::Array(items) => items.clone(),
            Value::Map(pairs) => pairs
                .iter()
                .flat_map(|(k, v)| [k.clone(), v.clone()])
                .collect(),
            _ => vec![],
        };
        items
            .chunks(2)
            .map(|p| match &p[0] {
                Value::BulkString(k) => (String::from_utf8_lossy(k).into_owned(), p[1].clone()),
                other => (format!("{other:?}"), p[1].clone()),
            })
            .collect()
    };
    if reply == Value::Nil {
        return (vec![], 0);
    }
    let fields = pairs(&reply);
    let mut tokens = vec![];
    let mut waiters = 0;
    for (k, v) in &fields {
        match (k.as_str(), v) {
            ("waiters", Value::Int(n)) => waiters = *n,
            ("holders", Value::Array(holders)) => {
                for h in holders {
                    for (hk, hv) in pairs(h) {
                        if let ("token", Value::Int(t)) = (hk.as_str(), hv) {
                            tokens.push(t as u64);
                        }
                    }
                }
            }
            _ => {}
        }
    }
    (tokens, waiters)
}

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
    wait_for(
        "the bound session attached on the new master",
        PATIENCE,
        || {
            let reply: Value = redis::cmd("LOCK.SESSION")
                .arg("INFO")
                .arg(bound.id())
                .query(&mut new.conn())
                .unwrap();
            let attached = match reply {
                Value::Array(items) => items
                    .chunks(2)
                    .any(|p| p[0] == Value::BulkString(b"bound".to_vec()) && p[1] != Value::Nil),
                Value::Map(pairs) => pairs
                    .iter()
                    .any(|(k, v)| *k == Value::BulkString(b"bound".to_vec()) && *v != Value::Nil),
                _ => false,
            };
            attached.then_some(())
        },
    );
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

/// Whether `LOCK.SESSION INFO id` on `server` shows the session bound to a connection there.
fn attached(server: &Server, id: &str) -> bool {
    let reply: Value = redis::cmd("LOCK.SESSION")
        .arg("INFO")
        .arg(id)
        .query(&mut server.conn())
        .unwrap();
    match reply {
        Value::Array(items) => items
            .chunks(2)
            .any(|p| p[0] == Value::BulkString(b"bound".to_vec()) && p[1] != Value::Nil),
        Value::Map(pairs) => pairs
            .iter()
            .any(|(k, v)| *k == Value::BulkString(b"bound".to_vec()) && *v != Value::Nil),
        _ => false,
    }
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

/// The shard channels `server` has subscribers on (`PUBSUB SHARDCHANNELS`).
fn shard_channels(server: &Server) -> usize {
    let channels: Vec<Value> = redis::cmd("PUBSUB")
        .arg("SHARDCHANNELS")
        .query(&mut server.conn())
        .unwrap();
    channels.len()
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

/// A killed master (issue 34): SIGKILL, then `CLUSTER FAILOVER FORCE` on its replica. A
/// `for_key` client's durable grant is on the new master with its token; the default session's
/// thread, finding the node gone, asks the seed's `CLUSTER SLOTS` for the slot's master and
/// re-attaches there; the feed moves there too; no loss is reported, and the client's next
/// command (the release) goes to the new master.
#[test]
fn a_killed_master_is_followed_by_the_default_session_and_the_feed() {
    use redis_lock_client::LossReason;

    let dir = test_dir("client-cluster-kill");
    let mut nodes = cluster::start(3, 1, &dir);
    let tag = "{kill-rust}";
    let old = nodes
        .iter()
        .position(|n| {
            role(n) == "master" && {
                let r: redis::RedisResult<Value> =
                    redis::cmd("LOCK.FENCE").arg(tag).query(&mut n.conn());
                r.is_ok()
            }
        })
        .expect("the tag's master");
    let new = nodes
        .iter()
        .position(|n| master_of(n) == Some(nodes[old].port()))
        .expect("its replica");
    // The seed is another master: it outlives the kill.
    let seed = nodes
        .iter()
        .position(|n| role(n) == "master" && n.port() != nodes[old].port())
        .expect("another master");
    let client = Client::open(&nodes[seed].url())
        .unwrap()
        .for_key(tag)
        .unwrap()
        .durable(1, ms(5_000))
        .watch_losses();
    let guard = client
        .acquire(&format!("{tag}k"), ms(60_000))
        .unwrap()
        .expect("granted");
    assert_eq!(info(&nodes[old], guard.key()).0, vec![guard.token()]);
    assert_eq!(shard_channels(&nodes[old]), 1);

    let attaches = nodes[new].calls("lock.session|attach");
    nodes[old].kill9();
    let ok: Value = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .arg("FORCE")
        .query(&mut nodes[new].conn())
        .unwrap();
    assert_eq!(ok, Value::Okay);
    let new = &nodes[new];
    wait_for("the replica promoted", PATIENCE, || {
        (role(new) == "master").then_some(())
    });
    wait_for(
        "the default session re-attached on the new master",
        PATIENCE,
        || (new.calls("lock.session|attach") > attaches).then_some(()),
    );
    wait_for("the feed subscribed on the new master", PATIENCE, || {
        (shard_channels(new) == 1).then_some(())
    });
    assert_eq!(info(new, guard.key()).0, vec![guard.token()]);
    assert!(guard.loss_reason().is_none(), "{:?}", guard.loss_reason());
    // A real loss on the new master reaches the guard through the feed.
    let deleted: i64 = redis::cmd("DEL")
        .arg(guard.key())
        .query(&mut new.conn())
        .unwrap();
    assert_eq!(deleted, 1);
    assert!(matches!(
        guard.wait_lost(PATIENCE),
        Some(LossReason::Deleted)
    ));
    // The client points at the new master now, which has no replica (its master was
    // killed): a durable grant there is made, not acknowledged, and released again.
    let again = client.acquire(&format!("{tag}k2"), ms(60_000));
    assert!(
        matches!(
            again,
            Err(redis_lock_client::Error::NotDurable {
                acknowledged: 0,
                wanted: 1,
                released: true
            })
        ),
        "{again:?}"
    );
    assert_eq!(info(new, &format!("{tag}k2")), (vec![], 0));
}

/// The async client through a killed master: its default session's thread and the feed (both
/// shared with the sync client) follow the slot to the promoted replica; the durable grant is
/// kept with its token and no loss is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_client_follows_a_killed_master() {
    use redis_lock_client::{aio, LossReason};

    let dir = test_dir("client-cluster-kill-async");
    let mut nodes = tokio::task::spawn_blocking(move || cluster::start(3, 1, &dir))
        .await
        .unwrap();
    let tag = "{kill-rust-async}";
    let old = nodes
        .iter()
        .position(|n| {
            role(n) == "master" && {
                let r: redis::RedisResult<Value> =
                    redis::cmd("LOCK.FENCE").arg(tag).query(&mut n.conn());
                r.is_ok()
            }
        })
        .expect("the tag's master");
    let new = nodes
        .iter()
        .position(|n| master_of(n) == Some(nodes[old].port()))
        .expect("its replica");
    let seed = nodes
        .iter()
        .position(|n| role(n) == "master" && n.port() != nodes[old].port())
        .expect("another master");
    let client = aio::Client::open(&nodes[seed].url())
        .unwrap()
        .for_key(tag)
        .await
        .unwrap()
        .durable(1, ms(5_000))
        .watch_losses();
    let guard = client
        .acquire(&format!("{tag}k"), ms(60_000))
        .await
        .unwrap()
        .expect("granted");
    assert_eq!(info(&nodes[old], guard.key()).0, vec![guard.token()]);
    assert_eq!(shard_channels(&nodes[old]), 1);

    let attaches = nodes[new].calls("lock.session|attach");
    nodes[old].kill9();
    let ok: Value = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .arg("FORCE")
        .query(&mut nodes[new].conn())
        .unwrap();
    assert_eq!(ok, Value::Okay);
    let promoted = &nodes[new];
    eventually("the replica promoted", PATIENCE, || {
        role(promoted) == "master"
    })
    .await;
    eventually(
        "the default session re-attached on the new master",
        PATIENCE,
        || promoted.calls("lock.session|attach") > attaches,
    )
    .await;
    eventually("the feed subscribed on the new master", PATIENCE, || {
        shard_channels(promoted) == 1
    })
    .await;
    assert_eq!(info(promoted, guard.key()).0, vec![guard.token()]);
    assert!(guard.loss_reason().is_none(), "{:?}", guard.loss_reason());
    let deleted: i64 = redis::cmd("DEL")
        .arg(guard.key())
        .query(&mut promoted.conn())
        .unwrap();
    assert_eq!(deleted, 1);
    let reason = tokio::time::timeout(PATIENCE, guard.lost()).await;
    assert!(matches!(reason, Ok(LossReason::Deleted)), "{reason:?}");
    drop(guard);
    tokio::task::spawn_blocking(move || drop(nodes))
        .await
        .unwrap();
}

/// The session ttl of the killed-master tests below: longer than a forced promotion takes on a
/// loaded machine (a session whose deadline passed before its replica was promoted is gone
/// there), short enough to wait past it.
const KILL_SESSION_TTL: Duration = Duration::from_secs(6);

/// The nodes of `tag`'s shard in a cluster of masters with one replica each: its master (to
/// kill), that master's replica, and another master (the seed: it outlives the kill).
fn shard_of(nodes: &[Server], tag: &str) -> (usize, usize, usize) {
    let old = nodes
        .iter()
        .position(|n| {
            role(n) == "master" && {
                let r: redis::RedisResult<Value> =
                    redis::cmd("LOCK.FENCE").arg(tag).query(&mut n.conn());
                r.is_ok()
            }
        })
        .expect("the tag's master");
    let new = nodes
        .iter()
        .position(|n| master_of(n) == Some(nodes[old].port()))
        .expect("its replica");
    let seed = nodes
        .iter()
        .position(|n| role(n) == "master" && n.port() != nodes[old].port())
        .expect("another master");
    (old, new, seed)
}

/// `kill -9` of `nodes[old]`, then `CLUSTER FAILOVER FORCE` on its replica `nodes[new]` (as in
/// the tests above), and wait until it is a master.
fn kill_and_promote(nodes: &mut [Server], old: usize, new: usize) {
    nodes[old].kill9();
    let ok: Value = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .arg("FORCE")
        .query(&mut nodes[new].conn())
        .unwrap();
    assert_eq!(ok, Value::Okay);
    let new = &nodes[new];
    wait_for("the replica promoted", PATIENCE, || {
        (role(new) == "master").then_some(())
    });
}

/// `LOCK.SESSION INFO id` on `server`: its `ttl` field, or `None` if it has no such session.
fn session_ttl(server: &Server, id: &str) -> Option<i64> {
    let reply: Value = redis::cmd("LOCK.SESSION")
        .arg("INFO")
        .arg(id)
        .query(&mut server.conn())
        .unwrap();
    let pairs: Vec<(Value, Value)> = match reply {
        Value::Nil => return None,
        Value::Array(items) => items
            .chunks(2)
            .map(|p| (p[0].clone(), p[1].clone()))
            .collect(),
        Value::Map(pairs) => pairs,
        other => panic!("LOCK.SESSION INFO answered {other:?}"),
    };
    pairs.into_iter().find_map(|(k, v)| match (k, v) {
        (Value::BulkString(k), Value::Int(ttl)) if k == b"ttl" => Some(ttl),
        _ => None,
    })
}

/// A killed master followed by what has no bound session to follow it (issue 34): each on a
/// `for_key` client of its own, without the default session (whose thread would move the
/// client). A plain command (the release of a durable hold) asks the seed's `CLUSTER SLOTS`
/// for the slot's master and runs there with the same token; an unbound session's keepalives
/// find the promoted replica, and the session lives past its ttl after the kill with no loss
/// reported; a waiter queued on the killed master queues again on the new one by itself, and
/// is granted there once the holder releases, with a larger token.
#[test]
fn a_killed_master_is_followed_by_commands_sessions_and_waiters() {
    let dir = test_dir("client-cluster-kill-plain");
    let mut nodes = cluster::start(3, 1, &dir);
    let tag = "{kill-plain}";
    let (old, new, seed) = shard_of(&nodes, tag);
    let for_key = || {
        Client::open(&nodes[seed].url())
            .unwrap()
            .for_key(tag)
            .unwrap()
            .without_session()
    };
    // Durable grants: on the replica before the kill.
    let holding = for_key().durable(1, ms(5_000));
    let in_sessions = for_key().durable(1, ms(5_000));
    let waiting = for_key();

    let key = format!("{tag}k");
    let hold = holding.acquire(&key, ms(60_000)).unwrap().expect("granted");
    let session = Session::builder(&in_sessions, KILL_SESSION_TTL)
        .keepalive_every(ms(1_000))
        .open()
        .unwrap();
    let in_session = in_sessions
        .with_session(&session)
        .acquire(&format!("{tag}s"), Duration::ZERO)
        .unwrap()
        .expect("granted");
    let waiter = {
        let key = key.clone();
        thread::spawn(move || waiting.acquire_blocking(&key, ms(60_000), PATIENCE))
    };
    wait_for("the waiter queued", PATIENCE, || {
        (info(&nodes[old], &key).1 == 1).then_some(())
    });
    assert_eq!(info(&nodes[old], &key).0, vec![hold.token()]);

    let killed = std::time::Instant::now();
    kill_and_promote(&mut nodes, old, new);
    let new = &nodes[new];
    wait_for("keepalives on the new master", PATIENCE, || {
        (new.calls("lock.session|keepalive") >= 2).then_some(())
    });
    wait_for(
        "the waiter queued again on the new master",
        PATIENCE,
        || (info(new, &key).1 == 1).then_some(()),
    );
    let token = hold.token();
    assert_eq!(info(new, &key).0, vec![token]);
    // The holder's client still points at the killed master: the release finds the new one.
    assert!(hold.release().unwrap());
    let granted = waiter.join().unwrap().unwrap().expect("the waiter granted");
    assert!(granted.token() > token, "{} <= {token}", granted.token());
    assert_eq!(info(new, &key).0, vec![granted.token()]);

    // Past the session's ttl since the kill: only keepalives on the new master kept it.
    sleep_until_elapsed(killed, KILL_SESSION_TTL + ms(1_000));
    assert!(
        session.loss_reason().is_none(),
        "{:?}",
        session.loss_reason()
    );
    assert!(!in_session.is_lost());
    let ttl = session_ttl(new, session.id()).expect("the session on the new master");
    assert!(ttl > 0, "{ttl}");
    assert_eq!(info(new, in_session.key()).0, vec![in_session.token()]);

    assert!(granted.release().unwrap());
    assert!(in_session.release().unwrap());
    assert_eq!(session.close().unwrap(), Some(0));
}

/// The async client through a killed master, as the sync test above: a durable hold released
/// on the new master with its token, an unbound session kept by keepalives there, and a waiter
/// granted there with a larger token, none of them sent again by the caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_client_follows_a_killed_master_with_commands_sessions_and_waiters() {
    use redis_lock_client::aio;

    let dir = test_dir("client-cluster-kill-plain-async");
    let nodes = tokio::task::spawn_blocking(move || cluster::start(3, 1, &dir))
        .await
        .unwrap();
    let tag = "{kill-plain-async}";
    let (old, new, seed) = shard_of(&nodes, tag);
    let seed_url = nodes[seed].url();
    let for_key = || async {
        aio::Client::open(&seed_url)
            .unwrap()
            .for_key(tag)
            .await
            .unwrap()
            .without_session()
    };
    let holding = for_key().await.durable(1, ms(5_000));
    let in_sessions = for_key().await.durable(1, ms(5_000));
    let waiting = for_key().await;

    let key = format!("{tag}k");
    let hold = holding
        .acquire(&key, ms(60_000))
        .await
        .unwrap()
        .expect("granted");
    let session = aio::Session::builder(&in_sessions, KILL_SESSION_TTL)
        .keepalive_every(ms(1_000))
        .open()
        .await
        .unwrap();
    let in_session = in_sessions
        .with_session(&session)
        .acquire(&format!("{tag}s"), Duration::ZERO)
        .await
        .unwrap()
        .expect("granted");
    let waiter = {
        let key = key.clone();
        tokio::spawn(async move { waiting.acquire_blocking(&key, ms(60_000), PATIENCE).await })
    };
    eventually("the waiter queued", PATIENCE, || {
        info(&nodes[old], &key).1 == 1
    })
    .await;
    assert_eq!(info(&nodes[old], &key).0, vec![hold.token()]);

    let killed = std::time::Instant::now();
    let nodes = tokio::task::spawn_blocking(move || {
        let mut nodes = nodes;
        kill_and_promote(&mut nodes, old, new);
        nodes
    })
    .await
    .unwrap();
    let promoted = &nodes[new];
    eventually("keepalives on the new master", PATIENCE, || {
        promoted.calls("lock.session|keepalive") >= 2
    })
    .await;
    eventually(
        "the waiter queued again on the new master",
        PATIENCE,
        || info(promoted, &key).1 == 1,
    )
    .await;
    let token = hold.token();
    assert_eq!(info(promoted, &key).0, vec![token]);
    assert!(hold.release().await.unwrap());
    let granted = waiter.await.unwrap().unwrap().expect("the waiter granted");
    assert!(granted.token() > token, "{} <= {token}", granted.token());
    assert_eq!(info(promoted, &key).0, vec![granted.token()]);

    let past = (killed + KILL_SESSION_TTL + ms(1_000)).into();
    tokio::time::sleep_until(past).await;
    assert!(
        session.loss_reason().is_none(),
        "{:?}",
        session.loss_reason()
    );
    assert!(!in_session.is_lost());
    let ttl = session_ttl(promoted, session.id()).expect("the session on the new master");
    assert!(ttl > 0, "{ttl}");
    assert_eq!(info(promoted, in_session.key()).0, vec![in_session.token()]);

    assert!(granted.release().await.unwrap());
    assert!(in_session.release().await.unwrap());
    assert_eq!(session.close().await.unwrap(), Some(0));
    tokio::task::spawn_blocking(move || drop(nodes))
        .await
        .unwrap();
}
