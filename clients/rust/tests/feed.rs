//! The guard's loss signal fed by the server's change feed, sync and async from one definition:
//! every loss the server causes is reported at once with its reason (released elsewhere,
//! expired, session ended, deleted, flushed, swapped, demoted, taken by another owner), so is
//! the client's own deadline passing with no renewal, a loss between the grant and the watch,
//! and a lost feed connection; a hold renewed by its watchdog through many periods reports
//! nothing; every lock kind (permit, reader, several keys) watches; the guards of one client
//! share one watch and one pub/sub connection; a key turned into another type ends its own hold
//! only. Then, sync only: a cluster (the feed on the node of each key).

mod apis;
mod support;

use std::time::{Duration, Instant};

use redis::Connection;
use redis_lock_client::LossReason;
use support::{fence, ms, unique_key, Server};

/// How long a loss the server reported may take to reach the guard here (a loaded machine
/// running debug builds); the figure each test prints is the one to look at.
const PROMPTLY: Duration = Duration::from_secs(2);

/// Run `cmd` on `conn`, expecting an integer or OK.
fn run(conn: &mut Connection, cmd: &mut redis::Cmd) {
    let _: redis::Value = cmd.query(conn).unwrap();
}

/// The `CLIENT LIST` lines.
fn clients(conn: &mut Connection) -> Vec<String> {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(conn).unwrap();
    list.lines().map(str::to_string).collect()
}

/// The ids of the connections whose `CLIENT LIST` line has `field=value` with a value not 0.
fn ids_with(conn: &mut Connection, field: &str) -> Vec<i64> {
    clients(conn)
        .iter()
        .filter(|line| {
            line.split(' ').any(|kv| {
                kv.split_once('=')
                    .is_some_and(|(k, v)| k == field && v != "0")
            })
        })
        .map(|line| {
            let id = line.split(' ').find_map(|kv| kv.strip_prefix("id="));
            id.unwrap().parse().unwrap()
        })
        .collect()
}

/// The ids of the connections whose last command was `cmd`.
fn ids_by_last_command(conn: &mut Connection, cmd: &str) -> Vec<i64> {
    clients(conn)
        .iter()
        .filter(|line| line.split(' ').any(|kv| kv == format!("cmd={cmd}")))
        .map(|line| {
            let id = line.split(' ').find_map(|kv| kv.strip_prefix("id="));
            id.unwrap().parse().unwrap()
        })
        .collect()
}

macro_rules! shared_tests {
    () => {
        /// `(server, client watching losses, conn)`.
        #[allow(unused_macros)]
        macro_rules! watching {
            () => {{
                let (server, client, conn) = crate::apis::setup!();
                (server, client.watch_losses(), conn)
            }};
        }

        /// The loss arrives within [`PROMPTLY`] and is what `$pattern` says; prints how long
        /// it took from `$since`.
        macro_rules! assert_lost {
            ($guard:expr, $since:expr, $pattern:pat) => {{
                let reason = io!(wait_lost(&$guard, PROMPTLY));
                let took = $since.elapsed();
                println!("loss {reason:?} reported {took:?} after the change");
                assert!(matches!(reason, Some($pattern)), "got {reason:?}");
                assert!($guard.is_lost());
                took
            }};
        }

        api_test! { fn a_hold_renewed_by_its_watchdog_reports_nothing() {
            let (_server, client, mut conn) = watching!();
            let key = unique_key("renewed");
            // 1 s, not 300 ms: a renewal every 100 ms missed its window under make
            // test-servers' load (CI run 37, Redis 8.2) and the hold expired.
            let ttl = ms(1000);
            let mut guard = io!(client.acquire(&key, ttl)).unwrap().unwrap();
            assert!(guard.is_watching());
            guard.start_watchdog().unwrap();
            // Ten periods of the watchdog (ttl / 3), three and a third TTLs.
            assert!(io!(wait_lost(&guard, ttl * 10 / 3)).is_none(), "{:?}", guard.loss_reason());
            assert!(!guard.is_lost());
            assert_eq!(fence(&mut conn, &key), Some(guard.token()));
            assert!(io!(guard.release()).unwrap());
        }}

        api_test! { fn extends_by_hand_keep_it_quiet_too() {
            let (_server, client, _conn) = watching!();
            let key = unique_key("extended");
            // 600 ms: an extend every 200 ms stays in time on a loaded machine (300 ms did not).
            let ttl = ms(600);
            let guard = io!(client.acquire(&key, ttl)).unwrap().unwrap();
            for _ in 0..8 {
                io!(sleep(ttl / 3));
                assert!(io!(guard.extend(ttl)).unwrap());
            }
            assert!(guard.loss_reason().is_none(), "{:?}", guard.loss_reason());
        }}

        api_test! { fn a_deleted_key_is_reported_at_once() {
            let (_server, client, mut conn) = watching!();
            let key = unique_key("deleted");
            let mut guard = io!(client.acquire(&key, Duration::from_secs(9))).unwrap().unwrap();
            guard.start_watchdog().unwrap();
            let since = Instant::now();
            run(&mut conn, redis::cmd("DEL").arg(&key));
            assert_lost!(guard, since, LossReason::Deleted);
            assert!(!io!(guard.release()).unwrap());
        }}

        api_test! { fn a_flush_is_reported() {
            let (_server, client, mut conn) = watching!();
            let guard = io!(client.acquire(&unique_key("flushed"), ms(9000))).unwrap().unwrap();
            let since = Instant::now();
            run(&mut conn, &mut redis::cmd("FLUSHALL"));
            assert_lost!(guard, since, LossReason::Flushed);
        }}

        api_test! { fn a_swapdb_is_reported() {
            let (_server, client, mut conn) = watching!();
            let guard = io!(client.acquire(&unique_key("swapped"), ms(9000))).unwrap().unwrap();
            let since = Instant::now();
            run(&mut conn, redis::cmd("SWAPDB").arg(0).arg(1));
            assert_lost!(guard, since, LossReason::Swapped);
        }}

        api_test! { fn a_demotion_is_reported() {
            let (server, client, mut conn) = watching!();
            let primary = Server::start();
            let guard = io!(client.acquire(&unique_key("demoted"), ms(9000))).unwrap().unwrap();
            let since = Instant::now();
            run(&mut conn, redis::cmd("REPLICAOF").arg("127.0.0.1").arg(primary.port()));
            assert_lost!(guard, since, LossReason::Demoted);
            drop(server);
        }}

        api_test! { fn a_release_elsewhere_is_reported() {
            let (_server, client, mut conn) = watching!();
            let key = unique_key("released");
            let guard = io!(client.acquire(&key, ms(9000))).unwrap().unwrap();
            let since = Instant::now();
            assert_eq!(support::release(&mut conn, &key, guard.owner()), 1);
            assert_lost!(guard, since, LossReason::Released);
        }}

        api_test! { fn the_servers_expiry_is_reported_before_the_local_deadline() {
            let (_server, client, mut conn) = watching!();
            let key = unique_key("expired");
            // The client counts 9 s; the server's deadline is moved to 100 ms from now.
            let guard = io!(client.acquire(&key, ms(9000))).unwrap().unwrap();
            assert_eq!(support::extend(&mut conn, &key, guard.owner(), 100), 1);
            let since = Instant::now();
            assert_lost!(guard, since, LossReason::Expired);
        }}

        api_test! { fn a_grant_to_another_owner_is_reported() {
            let (server, client, mut conn) = watching!();
            let key = unique_key("taken");
            let guard = io!(client.acquire(&key, ms(9000))).unwrap().unwrap();
            let waiter_url = server.url();
            let waiter_key = key.clone();
            let waiter = std::thread::spawn(move || {
                let mut conn = redis::Client::open(waiter_url).unwrap().get_connection().unwrap();
                support::call(&mut conn, "LOCK.ACQUIRE", &[waiter_key.as_str(), "next", "9000", "BLOCK", "5000"])
                    .unwrap()
            });
            server.wait_blocked(1);
            assert_eq!(support::extend(&mut conn, &key, guard.owner(), 50), 1);
            let since = Instant::now();
            let reason = io!(wait_lost(&guard, PROMPTLY));
            println!("loss {reason:?} reported {:?} after the change", since.elapsed());
            let token = match reason {
                Some(LossReason::Taken { owner, token }) => {
                    assert_eq!(owner, "next");
                    token
                }
                other => panic!("got {other:?}"),
            };
            assert!(token > guard.token());
            assert_eq!(waiter.join().unwrap(), redis::Value::Int(token as i64));
        }}

        api_test! { fn the_local_deadline_fires_without_a_renewal() {
            let (_server, client, _conn) = watching!();
            let key = unique_key("local-deadline");
            let ttl = ms(300);
            let before = Instant::now();
            let guard = io!(client.acquire(&key, ttl)).unwrap().unwrap();
            let reason = io!(wait_lost(&guard, ttl + PROMPTLY));
            let took = before.elapsed();
            println!("loss {reason:?} {took:?} after the acquire (ttl {ttl:?})");
            assert!(matches!(reason, Some(LossReason::Expired)), "got {reason:?}");
            assert!(took >= ttl, "before the deadline: {took:?}");
        }}

        api_test! { fn a_loss_before_the_watch_is_reported_by_the_first_read() {
            let (_server, client, mut conn) = crate::apis::setup!();
            let key = unique_key("before-watch");
            let mut guard = io!(client.acquire(&key, ms(9000))).unwrap().unwrap();
            run(&mut conn, redis::cmd("DEL").arg(&key));
            assert!(!guard.is_watching());
            io!(guard.watch()).unwrap();
            let since = Instant::now();
            assert_lost!(guard, since, LossReason::NotHeld);
        }}

        api_test! { fn a_lost_feed_connection_is_reported() {
            let (_server, client, mut conn) = watching!();
            let guard = io!(client.acquire(&unique_key("feed-conn"), ms(9000))).unwrap().unwrap();
            let subscribed = ids_with(&mut conn, "ssub");
            assert_eq!(subscribed.len(), 1, "one pub/sub connection: {:?}", clients(&mut conn));
            let since = Instant::now();
            run(&mut conn, redis::cmd("CLIENT").arg("KILL").arg("ID").arg(subscribed[0]));
            assert_lost!(guard, since, LossReason::FeedDisconnected(_));
        }}

        api_test! { fn a_lost_watch_connection_is_reported() {
            let (_server, client, mut conn) = watching!();
            let key = unique_key("watch-conn");
            let guard = io!(client.acquire(&key, ms(9000))).unwrap().unwrap();
            // The watch connection's last command: the first read once the subscription is in
            // place, `LOCK.INFO` and `LOCK.WATCH` in a `MULTI`.
            support::wait_until("the first read", PROMPTLY, || {
                ids_by_last_command(&mut conn, "exec").len() == 1
            });
            let watcher = ids_by_last_command(&mut conn, "exec")[0];
            let since = Instant::now();
            run(&mut conn, redis::cmd("CLIENT").arg("KILL").arg("ID").arg(watcher));
            // Noticed at the next ping (every second), within two.
            let reason = io!(wait_lost(&guard, ms(3000) + PROMPTLY));
            println!("loss {reason:?} reported {:?} after the kill", since.elapsed());
            assert!(matches!(reason, Some(LossReason::FeedDisconnected(_))), "got {reason:?}");
        }}

        api_test! { fn a_session_that_ends_is_reported() {
            let (_server, client, mut conn) = watching!();
            let session = io!(Session::builder(&client, ms(9000)).bound(true).open()).unwrap();
            let key = unique_key("session-lost");
            let guard = io!(session.client().acquire(&key, Duration::ZERO)).unwrap().unwrap();
            assert!(guard.is_watching());
            let info = io!(session.info()).unwrap().unwrap();
            let since = Instant::now();
            run(&mut conn, redis::cmd("CLIENT").arg("KILL").arg("ID").arg(info.bound.unwrap()));
            // The feed's `lost` and the session's own connection race: either tells first.
            assert_lost!(
                guard,
                since,
                LossReason::SessionEnded | LossReason::BoundConnectionClosed(_)
            );
        }}

        api_test! { fn a_key_overwritten_by_another_type_ends_its_hold_only() {
            let (_server, client, mut conn) = watching!();
            let (a, b) = (unique_key("overwritten"), unique_key("bystander"));
            let guard_a = io!(client.acquire(&a, ms(9000))).unwrap().unwrap();
            let guard_b = io!(client.acquire(&b, ms(9000))).unwrap().unwrap();
            let since = Instant::now();
            run(&mut conn, redis::cmd("SET").arg(&a).arg("not a lock"));
            assert_lost!(guard_a, since, LossReason::Deleted);
            // The feed goes on for the other key: no disconnection, and its next loss arrives.
            assert!(io!(wait_lost(&guard_b, ms(200))).is_none());
            let since = Instant::now();
            run(&mut conn, redis::cmd("DEL").arg(&b));
            assert_lost!(guard_b, since, LossReason::Deleted);
        }}

        api_test! { fn the_feed_authenticates_as_the_url_says() {
            let (server, _client, mut conn) = crate::apis::setup!();
            // Connections made from now on must authenticate (this one already is).
            run(&mut conn, redis::cmd("CONFIG").arg("SET").arg("requirepass").arg("feed-secret"));
            let without = Client::open(&server.url()).unwrap().watch_losses();
            // The feed's connection is refused by the server (NOAUTH), not lost.
            let refused = io!(without.acquire(&unique_key("refused"), ms(9000)));
            assert!(
                matches!(&refused, Err(redis_lock_client::Error::Server(e)) if e.code() == Some("NOAUTH")),
                "{refused:?}"
            );
            let url = format!("redis://:feed-secret@127.0.0.1:{}/", server.port());
            let client = Client::open(&url).unwrap().watch_losses();
            let key = unique_key("authenticated");
            let guard = io!(client.acquire(&key, ms(9000))).unwrap().unwrap();
            assert!(guard.is_watching());
            let since = Instant::now();
            run(&mut conn, redis::cmd("DEL").arg(&key));
            assert_lost!(guard, since, LossReason::Deleted);
        }}

        api_test! { fn every_lock_kind_watches() {
            let (server, client, mut conn) = watching!();
            let other = Client::open(&server.url()).unwrap();
            let (sem, rw, a, b) = (
                unique_key("sem"),
                unique_key("rw"),
                "{multi}:a".to_string(),
                "{multi}:b".to_string(),
            );
            let permit = io!(Semaphore::new(&client, &sem, 3).acquire(ms(9000))).unwrap().unwrap();
            let reader = io!(ReadWriteLock::new(&client, &rw).read(ms(9000))).unwrap().unwrap();
            let both = io!(MultiLock::new(&client, &[&a, &b]).acquire(ms(9000))).unwrap().unwrap();
            assert!(permit.is_watching() && reader.is_watching() && both.is_watching());
            // One watch connection and one pub/sub connection for the client's three guards.
            assert_eq!(ids_with(&mut conn, "ssub").len(), 1);

            // Others joining a shared key, and leaving it, take nothing from a permit or a reader.
            let second = io!(Semaphore::new(&other, &sem, 3).acquire(ms(9000))).unwrap().unwrap();
            let reader2 = io!(ReadWriteLock::new(&other, &rw).read(ms(9000))).unwrap().unwrap();
            assert!(io!(second.release()).unwrap());
            assert!(io!(reader2.release()).unwrap());
            assert!(io!(wait_lost(&permit, ms(300))).is_none());
            assert!(reader.loss_reason().is_none());

            let since = Instant::now();
            run(&mut conn, redis::cmd("DEL").arg(&sem).arg(&rw).arg(&b));
            assert_lost!(permit, since, LossReason::Deleted);
            assert_lost!(reader, since, LossReason::Deleted);
            assert_lost!(both, since, LossReason::Deleted);
        }}
    };
}

apis::both!(
    shared_tests,
    sync: {
        /// A cluster of three masters: on the node of each key (`Client::for_key`), a guard's
        /// feed reports its key deleted, for a key with a hash tag, one without, and one with
        /// braces that are not a tag; an election observed there sees its leader and "no
        /// leader".
        #[test]
        fn on_a_cluster_the_feed_follows_the_node_of_the_key() {
            let dir = support::test_dir("feed-cluster");
            let nodes = support::cluster::start(3, 0, &dir);
            let seed = Client::open(&nodes[0].url()).unwrap().watch_losses();
            // Keys node 0 does not serve: their client is another node's.
            let elsewhere = |key: &String| {
                let r: redis::RedisResult<redis::Value> =
                    redis::cmd("LOCK.FENCE").arg(key).query(&mut nodes[0].conn());
                matches!(&r, Err(e) if e.code() == Some("MOVED"))
            };
            let pick = |form: fn(u32) -> String| (0..).map(form).find(elsewhere).unwrap();
            let keys = [
                pick(|i| format!("{{feed-cluster-{i}}}:a")),
                pick(|i| format!("feed-cluster-b-{i}")),
                pick(|i| format!("feed{{}}cluster{{c-{i}")),
            ];
            for key in &keys {
                let key = key.as_str();
                let node = seed.for_key(key).unwrap();
                let guard = node.acquire(key, ms(9000)).unwrap().unwrap();
                assert!(guard.is_watching());
                let owner = nodes
                    .iter()
                    .find(|n| {
                        let token: redis::RedisResult<Option<u64>> =
                            redis::cmd("LOCK.FENCE").arg(key).query(&mut n.conn());
                        token.ok().flatten() == Some(guard.token())
                    })
                    .expect("the key's node holds it");
                let since = Instant::now();
                run(&mut owner.conn(), redis::cmd("DEL").arg(key));
                let reason = guard.wait_lost(PROMPTLY);
                println!("cluster: {key}: {reason:?} {:?} after DEL", since.elapsed());
                assert!(matches!(reason, Some(LossReason::Deleted)), "{key}: {reason:?}");
            }

            let name = &pick(|i| format!("feed-cluster-leader-{i}"));
            let node = seed.for_key(name).unwrap();
            let election = Election::new(&node, name, ms(3000));
            let observer = election.observe().unwrap();
            let next = || observer.next_timeout(PROMPTLY).expect("a change");
            assert_eq!(next().leader, None);
            let leadership = election.campaign("a").unwrap();
            assert_eq!(next().leader.map(|l| l.term), Some(leadership.term()));
            assert!(leadership.resign().unwrap());
            assert_eq!(next().leader, None);
        }
    },
);
