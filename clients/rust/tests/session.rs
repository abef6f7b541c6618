//! Sessions against a real server, sync and async from one definition: one keepalive keeps every
//! hold of a session alive past the session's TTL, `close` releases them all with no lock delay,
//! a session ended on the server (`CLOSE` from elsewhere, `CLIENT KILL` of the bound connection)
//! is reported once to the session and to each guard, a bound holder process killed with SIGKILL
//! lets the queued waiters in at once (not a TTL later), lock delay holds a waiter back, and every
//! lock kind takes a session. Then, sync only: the loss channel, and a cluster (the session opened
//! on the node of its keys, its commands routed to it by the id's hash tag).

mod apis;
mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redis::{Connection, Value};
use redis_lock_client::{Error, LossReason};
use support::{exists, fence, ms, pttl, unique_key, Server};

/// `CLIENT KILL ID id` -> how many clients were killed.
fn client_kill(conn: &mut Connection, id: i64) -> i64 {
    redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(id)
        .query(conn)
        .unwrap()
}

/// `LOCK.SESSION sub id` on a plain connection, the raw reply.
fn session_cmd(conn: &mut Connection, sub: &str, id: &str) -> redis::RedisResult<Value> {
    redis::cmd("LOCK.SESSION").arg(sub).arg(id).query(conn)
}

macro_rules! shared_tests {
    () => {
        api_test! { fn the_keepalive_keeps_holds_past_the_session_ttl() {
            let (server, client, mut conn) = crate::apis::setup!();
            // A keepalive every 200 ms, each allowed 200 ms: room for a loaded machine.
            let ttl = ms(600);
            let session = io!(Session::open(&client, ttl)).unwrap();
            assert!(!session.is_bound());
            assert_eq!(session.ttl(), ttl);
            let (key, own) = (unique_key("kept"), unique_key("own-deadline"));
            let kept = io!(session.client().acquire(&key, Duration::ZERO)).unwrap().unwrap();
            // A hold with ttl 0 has no deadline of its own: no Redis TTL either.
            assert_eq!(pttl(&mut conn, &key), -1);
            // A hold with a deadline of its own ends there, session or not.
            let own_ttl = ms(200);
            let lapses = io!(session.client().acquire(&own, own_ttl)).unwrap().unwrap();
            let took = Instant::now();
            let extends = server.calls("lock.extend");

            // Four session TTLs: without keepalives the session would have expired three times.
            let end = Instant::now() + ttl * 4;
            while Instant::now() < end {
                assert_eq!(fence(&mut conn, &key), Some(kept.token()), "lapsed in a live session");
                io!(sleep(ms(20)));
            }
            assert!(took.elapsed() > own_ttl);
            assert_eq!(fence(&mut conn, &own), None, "a hold outlived its own deadline");
            assert!(!session.is_lost() && !kept.is_lost());
            assert_eq!(server.calls("lock.extend"), extends, "a session hold needs no extend");
            assert!(io!(session.keepalive()).unwrap().is_some());
            let info = io!(session.info()).unwrap().expect("the session lives");
            assert_eq!(info.holds, 1);
            assert_eq!(info.bound, None);
            assert_eq!(info.lock_delay_ms, 0);
            assert!((0..=600).contains(&info.ttl_ms), "INFO ttl {}", info.ttl_ms);
            drop(lapses);

            // Dropping the session closes it: the hold goes with it.
            drop(session);
            io!(settled("the close on drop", || !exists(&mut conn, &key)));
            assert!(!io!(kept.release()).unwrap());
        } }

        api_test! { fn close_releases_every_hold_with_no_lock_delay() {
            let (server, client, mut conn) = crate::apis::setup!();
            let session = io!(Session::builder(&client, ms(10_000))
                .lock_delay(ms(5_000))
                .open())
            .unwrap();
            let (a, b) = (unique_key("close-a"), unique_key("close-b"));
            let ga = io!(session.client().acquire(&a, Duration::ZERO)).unwrap().unwrap();
            let gb = io!(Semaphore::new(&client, &b, 1).session(&session).acquire(ms(60_000)))
                .unwrap()
                .unwrap();
            let waiter = {
                let (client, a) = (client.clone(), a.clone());
                spawn!({
                    let g = io!(client.acquire_blocking(&a, ms(10_000), ms(10_000)));
                    let g = g.unwrap().expect("granted at the close");
                    (g.token(), Instant::now())
                })
            };
            blocking(|| server.wait_blocked(1));
            assert_eq!(io!(session.close()).unwrap(), Some(2));
            // Handed to the waiter by the CLOSE itself: no lock-delay (5 s) in between.
            let stat = |name: &str| server.info_field("lock", &format!("lock_{name}"));
            assert_eq!(stat("handed_off").as_deref(), Some("1"), "not handed over by the CLOSE");
            assert_eq!(stat("keys_in_lock_delay").as_deref(), Some("0"));
            let (token, _) = io!(join(waiter));
            assert!(token > ga.token());
            assert!(!exists(&mut conn, &b));
            // A close is no loss; the guards find their holds gone.
            assert!(!ga.is_lost() && !gb.is_lost());
            assert!(!io!(gb.release()).unwrap());
            assert!(!io!(ga.is_held()).unwrap());
        } }

        api_test! { fn a_close_from_elsewhere_is_reported_to_the_session_and_its_guards() {
            let (_server, client, mut conn) = crate::apis::setup!();
            let session = io!(Session::open(&client, ms(600))).unwrap();
            let key = unique_key("elsewhere");
            let tag = unique_key("elsewhere-multi");
            let keys = [format!("{{{tag}}}:a"), format!("{{{tag}}}:b")];
            let one = io!(session.client().acquire(&key, Duration::ZERO)).unwrap().unwrap();
            let many = io!(MultiLock::new(&client, &keys).session(&session).acquire(Duration::ZERO))
                .unwrap()
                .unwrap();
            assert_eq!(session_cmd(&mut conn, "CLOSE", session.id()).unwrap(), Value::Int(3));
            // The next keepalive (every 200 ms) finds it gone: told it ended, not that it
            // could not reach the server.
            let reason = io!(session_lost(&session, PATIENCE)).expect("the loss reported");
            assert!(matches!(reason, LossReason::SessionEnded), "{reason:?}");
            for guard in [&one, &many] {
                let reason = io!(wait_lost(guard, ms(100))).expect("the guard told");
                assert!(matches!(reason, LossReason::SessionEnded), "{reason:?}");
                assert!(guard.is_lost());
            }
            assert!(matches!(session.loss_reason(), Some(LossReason::SessionEnded)));
            assert!(!exists(&mut conn, &key) && !exists(&mut conn, &keys[0]));
            // Closing it now: it was gone already.
            assert_eq!(io!(session.close()).unwrap(), None);
        } }

        api_test! { fn killing_the_bound_connection_is_the_session_lost_at_once() {
            let (server, client, mut conn) = crate::apis::setup!();
            // A keepalive every 10 s: the loss below comes from the bound connection.
            let session = io!(Session::builder(&client, ms(30_000)).bound(true).open()).unwrap();
            assert!(session.is_bound());
            let key = unique_key("bound");
            let guard = io!(session.client().acquire(&key, Duration::ZERO)).unwrap().unwrap();
            let info = io!(session.info()).unwrap().expect("the session lives");
            let bound = info.bound.expect("bound to a connection");
            let waiter = {
                let (client, key) = (client.clone(), key.clone());
                spawn!({
                    let g = io!(client.acquire_blocking(&key, ms(10_000), ms(10_000)));
                    let g = g.unwrap().expect("granted when the bound connection closed");
                    (g.token(), Instant::now())
                })
            };
            blocking(|| server.wait_blocked(1));

            assert_eq!(client_kill(&mut conn, bound), 1);
            let reason = io!(session_lost(&session, PATIENCE)).expect("the loss reported");
            let (token, _) = io!(join(waiter));
            assert!(matches!(reason, LossReason::BoundConnectionClosed(_)), "{reason:?}");
            // Ended by the disconnect, not by its ttl (30 s).
            assert_ended_by_disconnect(&server);
            assert!(token > guard.token());
            let reason = io!(wait_lost(&guard, ms(100))).expect("the guard told");
            assert!(matches!(reason, LossReason::BoundConnectionClosed(_)), "{reason:?}");
            assert_eq!(io!(session.keepalive()).unwrap(), None);
            assert_eq!(session_cmd(&mut conn, "KEEPALIVE", session.id()).unwrap(), Value::Nil);
        } }

        api_test! { fn with_a_grace_a_killed_bound_connection_is_re_attached_and_keeps_its_holds() {
            let (_server, client, mut conn) = crate::apis::setup!();
            // GRACE without BOUND is refused before anything is sent.
            assert!(matches!(
                io!(Session::builder(&client, ms(30_000)).grace(ms(500)).open()),
                Err(Error::InvalidArgument(_))
            ));
            let session = io!(Session::builder(&client, ms(30_000))
                .bound(true)
                .grace(ms(5_000))
                .open())
            .unwrap();
            let key = unique_key("grace");
            let guard = io!(session.client().acquire(&key, Duration::ZERO)).unwrap().unwrap();
            let bound = io!(session.info()).unwrap().expect("alive").bound.expect("bound");
            assert_eq!(client_kill(&mut conn, bound), 1);
            // The session's thread reconnects and attaches it within the grace.
            let end = Instant::now() + PATIENCE;
            let again = loop {
                let info = io!(session.info()).unwrap().expect("the session lives");
                if let Some(id) = info.bound.filter(|id| *id != bound) {
                    break id;
                }
                assert!(Instant::now() < end, "not re-attached: {info:?}");
                io!(sleep(ms(10)));
            };
            assert_ne!(again, bound);
            assert_eq!(fence(&mut conn, &key), Some(guard.token()));
            assert!(!session.is_lost(), "{:?}", session.loss_reason());
            assert!(io!(wait_lost(&guard, ms(100))).is_none(), "the guard was told of a loss");
            let info: String = redis::cmd("INFO").arg("lock").query(&mut conn).unwrap();
            assert!(info.contains("lock_sessions_reattached:1"), "{info}");
            assert!(info.contains("lock_sessions_grace_expired:0"), "{info}");
            assert_eq!(io!(session.close()).unwrap(), Some(1));
        } }

        api_test! { fn a_bound_sessions_connection_is_named_after_its_serial() {
            let (_server, client, mut conn) = crate::apis::setup!();
            let session = io!(Session::builder(&client, ms(30_000)).bound(true).open()).unwrap();
            let info = io!(session.info()).unwrap().expect("the session lives");
            let bound = info.bound.expect("bound to a connection");
            let page: Value = redis::cmd("LOCK.SESSION").arg("LIST").query(&mut conn).unwrap();
            let serial = format!("{page:?}")
                .split("serial")
                .nth(1)
                .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).find(|d| !d.is_empty()))
                .expect("a serial in LOCK.SESSION LIST")
                .to_string();
            let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut conn).unwrap();
            let line = list
                .lines()
                .find(|l| l.starts_with(&format!("id={bound} ")))
                .expect("the bound connection in CLIENT LIST");
            assert!(line.contains(&format!(" name=redislock-session-{serial} ")), "{line}");
            let id = session.id().to_string();
            assert!(!list.contains(&id[id.find('}').unwrap() + 1..]));
            assert_eq!(io!(session.close()).unwrap(), Some(0));
        } }

        api_test! { fn lock_delay_holds_a_waiter_back_after_an_unclean_end() {
            let (server, client, mut conn) = crate::apis::setup!();
            let delay = ms(500);
            let session = io!(Session::builder(&client, ms(30_000))
                .bound(true)
                .lock_delay(delay)
                .open())
            .unwrap();
            let key = unique_key("delayed");
            let _guard = io!(session.client().acquire(&key, Duration::ZERO)).unwrap().unwrap();
            let info = io!(session.info()).unwrap().unwrap();
            assert_eq!(info.lock_delay_ms, 500);
            let bound = info.bound.expect("bound to a connection");
            let waiter = {
                let (client, key) = (client.clone(), key.clone());
                spawn!({
                    let g = io!(client.acquire_blocking(&key, ms(10_000), ms(10_000)));
                    let _g = g.unwrap().expect("granted once the delay passed");
                    Instant::now()
                })
            };
            blocking(|| server.wait_blocked(1));
            let killed = Instant::now();
            assert_eq!(client_kill(&mut conn, bound), 1);
            // While the delay runs, the key is not free and says so.
            io!(poll("LOCK.INFO to show the delay", PATIENCE, || {
                delayed_ms(&mut conn, &key).is_some()
            }));
            let granted = io!(join(waiter));
            let after = granted.duration_since(killed);
            println!("{}: lock delay {delay:?}: waiter granted {after:?} after the kill", module_path!());
            assert!(after >= delay - ms(50), "granted {after:?} after the kill, delay {delay:?}");
            // Granted when the delay ended, after the disconnect (not at the session's ttl).
            assert_ended_by_disconnect(&server);
        } }

        api_test! { fn every_lock_kind_takes_a_session() {
            let (server, client, mut conn) = crate::apis::setup!();
            let session = io!(Session::open(&client, ms(10_000))).unwrap();
            let k = |p: &str| unique_key(&format!("kind-{p}"));
            let (one, sem, read, write, tag) = (k("one"), k("sem"), k("read"), k("write"), k("multi"));
            let multi = [format!("{{{tag}}}:a"), format!("{{{tag}}}:b")];
            let zero = Duration::ZERO;

            let mut g_one = io!(client.with_session(&session).acquire(&one, zero)).unwrap().unwrap();
            let g_sem = io!(Semaphore::new(&client, &sem, 2).session(&session).acquire(zero))
                .unwrap()
                .unwrap();
            let rw = ReadWriteLock::new(&client, &read).session(&session);
            let g_read = io!(rw.read(zero)).unwrap().unwrap();
            let g_write = io!(ReadWriteLock::new(&client, &write).session(&session).write(zero))
                .unwrap()
                .unwrap();
            let g_multi = io!(MultiLock::new(&client, &multi).session(&session).acquire(zero))
                .unwrap()
                .unwrap();
            for key in [&one, &sem, &read, &write, &multi[0], &multi[1]] {
                assert!(fence(&mut conn, key).is_some(), "{key} not held");
                assert_eq!(pttl(&mut conn, key), -1, "{key} has a deadline of its own");
            }

            // A blocking acquire in the session: granted when the plain holder releases.
            let queued = k("queued");
            assert!(support::raw_acquire(&mut conn, &queued, "plain", 60_000).is_some());
            let waiter = {
                let (in_session, queued) = (session.client(), queued.clone());
                spawn!({
                    let g = io!(in_session.acquire_blocking(&queued, Duration::ZERO, ms(10_000)));
                    g.unwrap().expect("granted at the release")
                })
            };
            blocking(|| server.wait_blocked(1));
            assert_eq!(support::release(&mut conn, &queued, "plain"), 1);
            let g_queued = io!(join(waiter));
            assert_eq!(fence(&mut conn, &queued), Some(g_queued.token()));
            assert_eq!(pttl(&mut conn, &queued), -1);

            // No watchdog for a hold with no deadline of its own; an extend gives it one, and
            // an extend to 0 takes it away again.
            assert!(matches!(g_one.start_watchdog(), Err(Error::InvalidArgument(_))));
            assert!(io!(g_one.extend(ms(5_000))).unwrap());
            let left = pttl(&mut conn, &one);
            assert!(left > 0 && left <= 5_000, "PTTL {left}");
            assert!(io!(g_one.extend(zero)).unwrap());
            assert_eq!(pttl(&mut conn, &one), -1);

            // Released one by one, the session goes on.
            assert!(io!(g_read.release()).unwrap());
            assert!(!exists(&mut conn, &read));
            let holds = io!(session.info()).unwrap().unwrap().holds;
            assert_eq!(io!(session.close()).unwrap(), Some(holds as u64));
            for key in [&one, &sem, &write, &multi[0], &multi[1], &queued] {
                assert!(!exists(&mut conn, key), "{key} outlived its session");
            }
            drop((g_sem, g_write, g_multi, g_queued));
        } }

        api_test! { fn a_session_belongs_to_its_server() {
            let (_server, client, _conn) = crate::apis::setup!();
            let other = Server::start();
            let session = io!(Session::open(&client, ms(10_000))).unwrap();
            let elsewhere = Client::open(&other.url()).unwrap().with_session(&session);
            match io!(elsewhere.acquire(&unique_key("elsewhere"), Duration::ZERO)) {
                Err(Error::Server(e)) => {
                    assert_eq!(e.code(), Some("ERR"), "{e}");
                    assert!(e.to_string().contains("no such session"), "{e}");
                }
                other => panic!("expected ERR no such session, got {other:?}"),
            }
            // A ttl of 0 needs a session; the options are checked before sending.
            assert!(matches!(io!(client.acquire("k", Duration::ZERO)), Err(Error::InvalidArgument(_))));
            let builder = Session::builder(&client, ms(300)).keepalive_every(ms(300));
            assert!(matches!(io!(builder.open()), Err(Error::InvalidArgument(_))));
        } }

        // Not a test on its own: the holder process of
        // `a_killed_bound_holder_lets_every_waiter_in_at_once`, which runs this test binary again
        // with only this test and `HOLDER_URL` set. It opens a bound session with a 30 s ttl,
        // takes two exclusive locks and the only permit of a semaphore in it, prints
        // `holding <tokens>` and waits to be killed.
        api_test! { child fn bound_holder_child_process() {
            let Ok(url) = std::env::var(HOLDER_URL) else {
                panic!("not a test on its own: the child of a_killed_bound_holder_lets_every_waiter_in_at_once");
            };
            let keys: Vec<String> = std::env::var(HOLDER_KEYS).unwrap().split(',').map(String::from).collect();
            let client = Client::open(&url).unwrap();
            let session = io!(Session::builder(&client, ms(30_000)).bound(true).open()).unwrap();
            let in_session = session.client();
            let a = io!(in_session.acquire(&keys[0], ms(30_000))).unwrap().unwrap();
            let b = io!(in_session.acquire(&keys[1], ms(30_000))).unwrap().unwrap();
            let permit = io!(Semaphore::new(&in_session, &keys[2], 1).acquire(ms(30_000)))
                .unwrap()
                .unwrap();
            println!("holding {} {} {}", a.token(), b.token(), permit.token());
            io!(sleep(Duration::from_secs(60)));
            println!("never killed");
            std::process::exit(1);
        } }

        #[test]
        fn a_killed_bound_holder_lets_every_waiter_in_at_once() {
            let module = module_path!().rsplit("::").next().unwrap();
            killed_holder(&format!("{module}::bound_holder_child_process"));
        }
    };
}

apis::both!(
    shared_tests,
    sync: {
    fn session_lost(session: &Session, timeout: Duration) -> Option<LossReason> {
        session.wait_lost(timeout)
    }

    /// The sync session's loss channel: one message, then nothing; the reason stays.
    #[test]
    fn the_loss_is_sent_once_on_the_channel() {
        let (_server, client, mut conn) = crate::apis::setup!();
        let session = Session::open(&client, ms(600)).unwrap();
        assert!(session.lost().try_recv().is_err(), "a message before any loss");
        assert_eq!(session_cmd(&mut conn, "CLOSE", session.id()).unwrap(), Value::Int(0));
        let reason = session.lost().recv_timeout(ms(2_000)).expect("loss sent");
        assert!(matches!(reason, LossReason::SessionEnded), "{reason:?}");
        thread::sleep(ms(600)); // three more keepalive periods: nothing more is sent
        assert!(session.lost().try_recv().is_err(), "sent twice");
        assert!(session.wait_lost(Duration::ZERO).is_some());
    }

    /// `examples/session.rs`, which the README shows, compiled into this test.
    #[allow(dead_code)]
    mod example {
        include!("../examples/session.rs");
    }

    #[test]
    fn the_readme_example_runs() {
        let server = Server::start();
        example::run(&server.url()).unwrap();
        let mut conn = server.conn();
        for key in ["{order:7}:items", "{order:7}:payment", "payments-api"] {
            assert!(!exists(&mut conn, key), "{key} outlived the session");
        }
    }

    /// A cluster of three masters: the session opened on the node that serves its keys
    /// (`Client::for_key`), its id's hash tag served by that node, its commands sent to another
    /// node redirected there (the id is their key), and a bound session's end there lets a
    /// waiter in at once.
    #[test]
    fn on_a_cluster_the_session_lives_on_the_node_of_its_keys() {
        let dir = support::test_dir("session-cluster");
        let nodes = support::cluster::start(3, 0, &dir);
        let seed = Client::open(&nodes[0].url()).unwrap();
        let mut seed_conn = nodes[0].conn();
        // A key that node 0 does not serve.
        let key = (0..)
            .map(|i| format!("session-cluster-{i}"))
            .find(|k| {
                let r: redis::RedisResult<Value> = redis::cmd("LOCK.FENCE").arg(k).query(&mut seed_conn);
                matches!(&r, Err(e) if e.code() == Some("MOVED"))
            })
            .unwrap();
        let node = seed.for_key(&key).unwrap();
        let session = Session::builder(&node, ms(30_000)).bound(true).open().unwrap();
        let guard = node.with_session(&session).acquire(&key, Duration::ZERO).unwrap().unwrap();

        let token_on = |n: &Server| -> Option<u64> {
            redis::cmd("LOCK.FENCE").arg(&key).query(&mut n.conn()).ok()
        };
        let owner = nodes
            .iter()
            .position(|n| token_on(n) == Some(guard.token()))
            .expect("the key's node holds it");
        assert_ne!(owner, 0);
        // The id's slot is the owner's: any other node redirects its session commands there.
        let other = (owner + 1) % nodes.len();
        match session_cmd(&mut nodes[other].conn(), "KEEPALIVE", session.id()) {
            Err(e) => {
                assert_eq!(e.code(), Some("MOVED"), "{e}");
                let (addr, _) = e.redirect_node().unwrap();
                assert_eq!(addr, nodes[owner].addr());
            }
            Ok(v) => panic!("KEEPALIVE on another node answered {v:?}"),
        }
        assert!(matches!(session_cmd(&mut nodes[owner].conn(), "KEEPALIVE", session.id()), Ok(Value::Int(_))));

        let waiter = {
            let (node, key) = (node.clone(), key.clone());
            thread::spawn(move || {
                let g = node.acquire_blocking(&key, ms(10_000), ms(10_000)).unwrap();
                (g.expect("granted").token(), Instant::now())
            })
        };
        nodes[owner].wait_blocked(1);
        let bound = session.info().unwrap().unwrap().bound.unwrap();
        let mut owner_conn = nodes[owner].conn();
        assert_eq!(client_kill(&mut owner_conn, bound), 1);
        let (token, _) = waiter.join().unwrap();
        assert!(token > guard.token());
        assert_ended_by_disconnect(&nodes[owner]);
        // A cluster node's client re-attaches a bound session whose connection closed (it may
        // be a failover) before it reports: the server answers that the session ended.
        assert!(matches!(session.wait_lost(PATIENCE), Some(LossReason::SessionEnded)));
    }
    },
    aio: {
    async fn session_lost(session: &Session, timeout: Duration) -> Option<LossReason> {
        tokio::time::timeout(timeout, session.lost()).await.ok()
    }

    /// The async `Client::for_key`: a session on the node of its key, a hold there, and its
    /// `CLOSE` (routed by the session's own client) releasing it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_a_cluster_the_session_opens_on_the_node_of_its_key() {
        let dir = support::test_dir("session-cluster-aio");
        let nodes = blocking(|| support::cluster::start(3, 0, &dir));
        let seed = Client::open(&nodes[0].url()).unwrap();
        let mut seed_conn = nodes[0].conn();
        let mut served_elsewhere = |k: &String| {
            let r: redis::RedisResult<Value> = redis::cmd("LOCK.FENCE").arg(k).query(&mut seed_conn);
            matches!(&r, Err(e) if e.code() == Some("MOVED"))
        };
        let key = (0..).map(|i| format!("session-cluster-{i}")).find(&mut served_elsewhere).unwrap();
        let seed_key = (0..).map(|i| format!("session-seed-{i}")).find(|k| !served_elsewhere(k)).unwrap();
        let node = seed.for_key(&key).await.unwrap();
        let session = Session::open(&node, ms(10_000)).await.unwrap();
        let guard = node.with_session(&session).acquire(&key, Duration::ZERO).await.unwrap().unwrap();
        assert!(guard.is_held().await.unwrap());
        // The seed itself does not know the session.
        match seed.with_session(&session).acquire(&seed_key, Duration::ZERO).await {
            Err(Error::Server(e)) => assert!(e.to_string().contains("no such session"), "{e}"),
            other => panic!("expected ERR no such session, got {other:?}"),
        }
        // The hold's key is (almost surely) in another slot than the id's tag: the server must
        // find it all the same. Seen failing on Redis 8.2.3, Valkey 8.1.8 and 9.1.2 clusters
        // (INFO counted 0 holds, CLOSE answered 0 and the hold stayed, PTTL -1); passes on
        // 7.0.15. A guess at why: those servers keep a key table per slot.
        assert_eq!(session.info().await.unwrap().unwrap().holds, 1);
        let closed = session.close().await;
        assert_eq!(closed.unwrap(), Some(1), "CLOSE released no hold of another slot");
        assert!(!guard.is_held().await.unwrap());
    }

    /// `loss_watch()`: other tasks are told of the session's loss too.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_loss_watch_tells_other_tasks() {
        let (_server, client, mut conn) = crate::apis::setup!();
        let session = Session::open(&client, ms(600)).await.unwrap();
        let mut watch = session.loss_watch();
        let worker = tokio::spawn(async move {
            watch.wait_for(Option::is_some).await.unwrap().clone().unwrap()
        });
        assert_eq!(session_cmd(&mut conn, "CLOSE", session.id()).unwrap(), Value::Int(0));
        let reason = tokio::time::timeout(ms(2_000), worker).await.expect("told");
        assert!(matches!(reason.unwrap(), LossReason::SessionEnded));
    }
    }
);

/// `LOCK.INFO key`'s `delayed` field: the ms of lock delay left, if any.
fn delayed_ms(conn: &mut Connection, key: &str) -> Option<i64> {
    let reply: Value = redis::cmd("LOCK.INFO").arg(key).query(conn).unwrap();
    let fields = match reply {
        Value::Array(items) => items,
        Value::Nil => return None,
        other => panic!("LOCK.INFO {key}: {other:?}"),
    };
    fields.chunks(2).find_map(|pair| match pair {
        [Value::BulkString(name), Value::Int(ms)] if name == b"delayed" && *ms > 0 => Some(*ms),
        _ => None,
    })
}

/// The holder process's environment: the server's URL and the keys (two locks, a semaphore).
const HOLDER_URL: &str = "REDIS_LOCK_CLIENT_TEST_SESSION_URL";
const HOLDER_KEYS: &str = "REDIS_LOCK_CLIENT_TEST_SESSION_KEYS";

/// A child process, killed if the test ends first.
struct ChildProcess(Child);

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Run `holder_test` (this binary's `bound_holder_child_process`) as a child holding two locks
/// and a semaphore's only permit in a bound session with a 30 s ttl; queue a waiter on each;
/// SIGKILL the child; every waiter is granted at once, far below the ttl.
fn killed_holder(holder_test: &str) {
    let server = Server::start();
    let client = redis_lock_client::Client::open(&server.url()).unwrap();
    let keys: Vec<String> = ["killed-a", "killed-b", "killed-sem"]
        .iter()
        .map(|p| unique_key(p))
        .collect();
    let mut child = ChildProcess(
        Command::new(std::env::current_exe().unwrap())
            .args([
                holder_test,
                "--ignored",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(HOLDER_URL, server.url())
            .env(HOLDER_KEYS, keys.join(","))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let (tx, lines) = mpsc::channel();
    let stdout = child.0.stdout.take().unwrap();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let tokens: Vec<u64> = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = lines
            .recv_timeout(left)
            .expect("the holder's `holding` line");
        if let Some((_, rest)) = line.split_once("holding ") {
            break rest
                .split_whitespace()
                .map(|t| t.parse().unwrap())
                .collect();
        }
    };
    assert_eq!(tokens.len(), 3);
    let mut conn = server.conn();
    for (key, token) in keys.iter().zip(&tokens) {
        assert_eq!(fence(&mut conn, key), Some(*token), "{key}");
    }

    // A waiter on each; the semaphore's waiter needs the child's permit (limit 1).
    let waiters: Vec<_> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| {
            let (client, key) = (client.clone(), key.clone());
            thread::spawn(move || {
                let g = match i {
                    2 => redis_lock_client::Semaphore::new(&client, &key, 1)
                        .acquire_blocking(ms(10_000), ms(20_000)),
                    _ => client.acquire_blocking(&key, ms(10_000), ms(20_000)),
                };
                let g = g.unwrap().expect("granted once the holder died");
                (g.token(), Instant::now())
            })
        })
        .collect();
    server.wait_blocked(3);
    // A second waiter on the first key, behind the first: served after it, in queue order.
    let second = {
        let (client, key) = (client.clone(), keys[0].clone());
        thread::spawn(move || {
            let g = client.acquire_blocking(&key, ms(10_000), ms(20_000));
            (
                g.unwrap().expect("granted after the first waiter").token(),
                Instant::now(),
            )
        })
    };
    server.wait_blocked(4);
    support::send_signal(child.0.id(), "KILL");
    let mut grants = Vec::new();
    for ((waiter, token), key) in waiters.into_iter().zip(&tokens).zip(&keys) {
        let (granted, at) = waiter.join().unwrap();
        assert!(granted > *token, "{key}");
        grants.push((granted, at));
    }
    // Granted because the holder's connection closed, not at its session's ttl (30 s).
    assert_ended_by_disconnect(&server);
    // The first waiter's guard was dropped as its thread ended: the second has it now.
    let (token, at) = second.join().unwrap();
    assert!(
        token > grants[0].0 && at >= grants[0].1,
        "served out of order"
    );
    let _ = child.0.wait();
}

/// How long to wait for something the test caused: a deadline for a loaded machine, not a
/// measure of how fast it happens.
const PATIENCE: Duration = Duration::from_secs(10);

/// The one session of `server` ended because its bound connection closed, not by its ttl.
#[track_caller]
fn assert_ended_by_disconnect(server: &support::Server) {
    let stat = |name: &str| server.info_field("lock", &format!("lock_sessions_{name}"));
    assert_eq!(stat("disconnected").as_deref(), Some("1"));
    assert_eq!(stat("expired").as_deref(), Some("0"));
}
