//! A killed master (issue 34): SIGKILL, then `CLUSTER FAILOVER FORCE` on its replica. The
//! default session and the feed follow it, and so do, with no session to move the client, a
//! plain command, an unbound session's keepalives and a queued waiter (sync and async). A
//! planned failover: `cluster_failover.rs`.

mod support;

use std::thread;
use std::time::Duration;

use redis::Value;
use redis_lock_client::{Client, Session};
use support::failover::{info, master_of, role, shard_channels, PATIENCE};
use support::{cluster, eventually, ms, sleep_until_elapsed, test_dir, wait_for, Server};

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
