//! A forged change feed: messages `SPUBLISH`ed on a lock's channel by an ACL user with only
//! `&* +spublish` fool neither a leader nor an observer, sync and async. The leader is not told
//! of a loss and the observer keeps reporting the real leader, because a message that claims a
//! change is confirmed with `LOCK.INFO` first; a real handoff still arrives, confirmed by one
//! state read.

mod apis;
mod support;

use std::time::{Duration, Instant};

use redis::Connection;
use redis_lock_client::{Change, Leader, LossReason};
use support::{ms, unique_key};

/// How long a change may take to be observed here (a loaded machine, debug builds).
const PROMPTLY: Duration = Duration::from_secs(2);

/// `INFO commandstats` calls of `command` (0 if never called).
fn calls(conn: &mut Connection, command: &str) -> u64 {
    let text: String = redis::cmd("INFO").arg("commandstats").query(conn).unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

/// The key's channel and seq, from a watch that ends at once (the feeds' own watches stay).
fn channel_and_seq(conn: &mut Connection, key: &str) -> (Vec<u8>, u64) {
    let (channel, _): (Vec<u8>, u64) = redis::cmd("LOCK.WATCH").arg(key).query(conn).unwrap();
    let info: Vec<redis::Value> = redis::cmd("LOCK.INFO").arg(key).query(conn).unwrap();
    let seq = info
        .chunks(2)
        .find(|p| p[0] == redis::Value::BulkString(b"seq".to_vec()))
        .map(|p| match p[1] {
            redis::Value::Int(n) => n as u64,
            ref other => panic!("seq {other:?}"),
        })
        .expect("LOCK.INFO shows seq while the key is watched");
    let unwatched: i64 = redis::cmd("LOCK.UNWATCH").arg(key).query(conn).unwrap();
    assert_eq!(unwatched, 1);
    (channel, seq)
}

/// `PUBSUB SHARDNUMSUB channel`: how many connections subscribed to it.
fn subscribers(conn: &mut Connection, channel: &[u8]) -> i64 {
    let reply: Vec<redis::Value> = redis::cmd("PUBSUB")
        .arg("SHARDNUMSUB")
        .arg(channel)
        .query(conn)
        .unwrap();
    match reply.as_slice() {
        [_, redis::Value::Int(n)] => *n,
        other => panic!("PUBSUB SHARDNUMSUB: {other:?}"),
    }
}

/// A connection of a user who may publish on every channel and do nothing else.
fn forger(server: &support::Server, admin: &mut Connection) -> Connection {
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "forger",
            "on",
            ">pw",
            "resetkeys",
            "resetchannels",
            "&*",
            "-@all",
            "+spublish",
        ])
        .query(admin)
        .unwrap();
    redis::Client::open(format!("redis://forger:pw@127.0.0.1:{}/", server.port()))
        .unwrap()
        .get_connection()
        .unwrap()
}

macro_rules! shared_tests {
    () => {
        api_test! { fn forged_messages_depose_nobody_and_a_real_handoff_still_arrives() {
            let (server, client, mut conn) = crate::apis::setup!();
            let mut forger = crate::forger(&server, &mut conn);
            let name = unique_key("forged");
            // The observer and the leader on clients of their own: one feed each.
            let election = Election::new(&client, &name, ms(60_000));
            let mut observer = io!(election.observe()).unwrap();
            assert_eq!(io!(next_change(&mut observer)), Change { leader: None, resync: false });
            let candidates = Client::open(&server.url()).unwrap();
            let candidates = Election::new(&candidates, &name, ms(60_000));
            let a = io!(candidates.campaign("a")).unwrap();
            let term = a.term();
            let leader_a = Some(Leader { value: "a".into(), term });
            assert_eq!(io!(next_change(&mut observer)), Change { leader: leader_a.clone(), resync: false });
            // Both feeds subscribed to the key's channel.
            let (channel, _) = crate::channel_and_seq(&mut conn, &name);
            io!(poll("both feeds subscribed", PROMPTLY, || crate::subscribers(&mut server.conn(), &channel) == 2));
            let (_, seq) = crate::channel_and_seq(&mut conn, &name);
            let reads = crate::calls(&mut conn, "lock.info");

            // Each but the third claims a change, which makes each feed read the state once.
            // One at a time: a feed that finds several messages at once reads once for all.
            let forged = [
                (format!("{} handoff {} 500 mallory", seq + 1, term + 1000), 1), // a new leader
                (format!("{} released {term} 0 a", seq + 1), 1), // the leader's own release
                (format!("{} extended {term} 500 a", seq + 1), 0), // claims nothing, takes seq + 1 ...
                (format!("{} expired {term} 0 a", seq + 1), 1), // ... so a second seq + 1 is a conflict
                (format!("{} deleted 0 0 ", seq + 100), 1), // far ahead: read as a gap
                (format!("{} demoted 0 0 ", seq + 1), 1), // the server answers as a primary
            ];
            let mut reported = Vec::new();
            let mut expected = reads;
            for (message, claims) in &forged {
                let receivers: i64 = redis::cmd("SPUBLISH").arg(&channel).arg(message).query(&mut forger).unwrap();
                assert_eq!(receivers, 2);
                expected += 2 * claims;
                // Until both feeds have read the state for the claim (or, as before these were
                // confirmed, believed it).
                io!(poll("the feeds to read the state for a forged claim", PROMPTLY * 5, || {
                    reported.extend(observer_try_next(&mut observer));
                    crate::calls(&mut conn, "lock.info") >= expected || a.is_lost() || !reported.is_empty()
                }));
            }
            assert_eq!(reported, [], "the observer reported a change");
            assert!(!a.is_lost(), "the leader was told of a loss: {:?}", io!(wait_lost(a.guard(), ms(0))));
            assert_eq!(io!(election.leader()).unwrap(), leader_a);

            // A real handoff: b waits, the server releases a's hold.
            let next = candidates.clone();
            let waiting = spawn!({ io!(next.campaign("b")).unwrap() });
            server.wait_blocked(1);
            let released = Instant::now();
            assert_eq!(support::release(&mut conn, &name, "a"), 1);
            let b = io!(join(waiting));
            assert_eq!(
                io!(next_change(&mut observer)),
                Change { leader: Some(Leader { value: "b".into(), term: b.term() }), resync: false }
            );
            match io!(wait_lost(a.guard(), PROMPTLY)) {
                Some(LossReason::Taken { owner, token }) => assert_eq!((owner.as_str(), token), ("b", b.term())),
                other => panic!("a's loss: {other:?}"),
            }
            // How soon is `make bench`'s loss notice row; here, that it is the real loss.
            eprintln!("loss reported {:?} after the release", released.elapsed());
            assert!(io!(b.resign()).unwrap());
            assert_eq!(io!(next_change(&mut observer)).leader, None);
        }}
    };
}

apis::both!(
    shared_tests,
    sync: {
        fn next_change(observer: &mut redis_lock_client::Observer) -> Change {
            observer.next_timeout(PROMPTLY).expect("a change within PROMPTLY")
        }

        fn observer_try_next(observer: &mut redis_lock_client::Observer) -> Option<Change> {
            observer.try_next()
        }
    },
    aio: {
        async fn next_change(observer: &mut redis_lock_client::aio::Observer) -> Change {
            tokio::time::timeout(PROMPTLY, observer.next())
                .await
                .expect("a change within PROMPTLY")
                .expect("the observer ended")
        }

        fn observer_try_next(observer: &mut redis_lock_client::aio::Observer) -> Option<Change> {
            observer.try_next()
        }
    }
);
