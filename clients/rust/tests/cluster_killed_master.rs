//! A killed master (issue 34): SIGKILL, then `CLUSTER FAILOVER FORCE` on its replica, sync and
//! async from one definition (`tests/apis`), each test on a cluster of its own. The default
//! session and the feed follow it, and so do, with no session to move the client, a plain
//! command, an unbound session's keepalives and a queued waiter. A planned failover:
//! `cluster_failover.rs`.

mod apis;
mod support;

use std::time::{Duration, Instant};

use redis::Value;
use redis_lock_client::{Error, LossReason};
use support::failover::{info, role, shard_channels, shard_of, PATIENCE};
use support::{cluster, ms, test_dir, wait_until, Server};

/// The session ttl of `a_killed_master_is_followed_by_commands_sessions_and_waiters`: longer
/// than a forced promotion takes on a loaded machine (a session whose deadline passed before
/// its replica was promoted is gone there), short enough to wait past it.
const KILL_SESSION_TTL: Duration = Duration::from_secs(6);

/// `kill -9` of `nodes[old]`, then `CLUSTER FAILOVER FORCE` on its replica `nodes[new]`, and
/// wait until it is a master.
fn kill_and_promote(nodes: &mut [Server], old: usize, new: usize) {
    nodes[old].kill9();
    let ok: Value = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .arg("FORCE")
        .query(&mut nodes[new].conn())
        .unwrap();
    assert_eq!(ok, Value::Okay);
    let new = &nodes[new];
    wait_until("the replica promoted", PATIENCE, || role(new) == "master");
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

macro_rules! shared_tests {
    () => {
        // A `for_key` client's durable grant is on the new master with its token; the default
        // session's thread, finding the node gone, asks the seed's `CLUSTER SLOTS` for the
        // slot's master and re-attaches there; the feed moves there too; no loss is reported,
        // and the client's next command goes to the new master.
        api_test! { fn a_killed_master_is_followed_by_the_default_session_and_the_feed() {
            let dir = test_dir("client-cluster-kill");
            let mut nodes = blocking(|| cluster::start(3, 1, &dir));
            let tag = "{kill-rust}";
            let (old, new, seed) = shard_of(&nodes, tag);
            let client = io!(Client::open(&nodes[seed].url()).unwrap().for_key(tag))
                .unwrap()
                .durable(1, ms(5_000))
                .watch_losses();
            let guard = io!(client.acquire(&format!("{tag}k"), ms(60_000)))
                .unwrap()
                .expect("granted");
            assert_eq!(info(&nodes[old], guard.key()).0, vec![guard.token()]);
            assert_eq!(shard_channels(&nodes[old]), 1);

            let attaches = nodes[new].calls("lock.session|attach");
            blocking(|| kill_and_promote(&mut nodes, old, new));
            let new = &nodes[new];
            io!(poll("the default session re-attached on the new master", PATIENCE, || {
                new.calls("lock.session|attach") > attaches
            }));
            io!(poll("the feed subscribed on the new master", PATIENCE, || {
                shard_channels(new) == 1
            }));
            assert_eq!(info(new, guard.key()).0, vec![guard.token()]);
            assert!(guard.loss_reason().is_none(), "{:?}", guard.loss_reason());
            // A real loss on the new master reaches the guard through the feed.
            let deleted: i64 = redis::cmd("DEL").arg(guard.key()).query(&mut new.conn()).unwrap();
            assert_eq!(deleted, 1);
            let reason = io!(wait_lost(&guard, PATIENCE));
            assert!(matches!(reason, Some(LossReason::Deleted)), "{reason:?}");
            // The client points at the new master now, which has no replica (its master was
            // killed): a durable grant there is made, not acknowledged, and released again.
            let again = io!(client.acquire(&format!("{tag}k2"), ms(60_000)));
            assert!(
                matches!(
                    again,
                    Err(Error::NotDurable { acknowledged: 0, wanted: 1, released: true })
                ),
                "{again:?}"
            );
            assert_eq!(info(new, &format!("{tag}k2")), (vec![], 0));
            drop(guard);
            blocking(move || drop(nodes));
        } }

        // What has no bound session to follow the killed master, each on a `for_key` client of
        // its own without the default session (whose thread would move the client). A plain
        // command (the release of a durable hold) asks the seed's `CLUSTER SLOTS` for the
        // slot's master and runs there with the same token; an unbound session's keepalives
        // find the promoted replica, and the session lives past its ttl after the kill with no
        // loss reported; a waiter queued on the killed master queues again on the new one by
        // itself, and is granted there once the holder releases, with a larger token. None of
        // them is sent again by the caller.
        api_test! { fn a_killed_master_is_followed_by_commands_sessions_and_waiters() {
            let dir = test_dir("client-cluster-kill-plain");
            let mut nodes = blocking(|| cluster::start(3, 1, &dir));
            let tag = "{kill-plain}";
            let (old, new, seed) = shard_of(&nodes, tag);
            let seed = nodes[seed].url();
            macro_rules! for_key {
                () => {
                    io!(Client::open(&seed).unwrap().for_key(tag)).unwrap().without_session()
                };
            }
            // Durable grants: on the replica before the kill.
            let holding = for_key!().durable(1, ms(5_000));
            let in_sessions = for_key!().durable(1, ms(5_000));
            let waiting = for_key!();

            let key = format!("{tag}k");
            let hold = io!(holding.acquire(&key, ms(60_000))).unwrap().expect("granted");
            let session = io!(Session::builder(&in_sessions, KILL_SESSION_TTL)
                .keepalive_every(ms(1_000))
                .open())
            .unwrap();
            let in_session = io!(in_sessions
                .with_session(&session)
                .acquire(&format!("{tag}s"), Duration::ZERO))
            .unwrap()
            .expect("granted");
            let waiter = {
                let key = key.clone();
                spawn!({ io!(waiting.acquire_blocking(&key, ms(60_000), PATIENCE)) })
            };
            io!(poll("the waiter queued", PATIENCE, || info(&nodes[old], &key).1 == 1));
            assert_eq!(info(&nodes[old], &key).0, vec![hold.token()]);

            let killed = Instant::now();
            blocking(|| kill_and_promote(&mut nodes, old, new));
            let new = &nodes[new];
            io!(poll("keepalives on the new master", PATIENCE, || {
                new.calls("lock.session|keepalive") >= 2
            }));
            io!(poll("the waiter queued again on the new master", PATIENCE, || {
                info(new, &key).1 == 1
            }));
            let token = hold.token();
            assert_eq!(info(new, &key).0, vec![token]);
            // The holder's client still points at the killed master: the release finds the new
            // one.
            assert!(io!(hold.release()).unwrap());
            let granted = io!(join(waiter)).unwrap().expect("the waiter granted");
            assert!(granted.token() > token, "{} <= {token}", granted.token());
            assert_eq!(info(new, &key).0, vec![granted.token()]);

            // Past the session's ttl since the kill: only keepalives on the new master kept it.
            io!(sleep((KILL_SESSION_TTL + ms(1_000)).saturating_sub(killed.elapsed())));
            assert!(session.loss_reason().is_none(), "{:?}", session.loss_reason());
            assert!(!in_session.is_lost());
            let ttl = session_ttl(new, session.id()).expect("the session on the new master");
            assert!(ttl > 0, "{ttl}");
            assert_eq!(info(new, in_session.key()).0, vec![in_session.token()]);

            assert!(io!(granted.release()).unwrap());
            assert!(io!(in_session.release()).unwrap());
            assert_eq!(io!(session.close()).unwrap(), Some(0));
            blocking(move || drop(nodes));
        } }
    };
}

apis::both!(shared_tests);
