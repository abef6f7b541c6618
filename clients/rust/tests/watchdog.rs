//! The watchdog against a real server, sync (a thread) and async (a task) from one definition:
//! it keeps a lock alive while the holder lives, stops the moment the guard is gone (drop,
//! release, stop, a panicking holder), and reports a loss at once (deleted key, paused server,
//! paused holder process) without ever extending a hold that is no longer its own. Then what
//! each API has alone: the sync loss channel, the async `loss_watch` and a starved runtime.

mod apis;
mod support;

use std::thread;
use std::time::{Duration, Instant};

use redis_lock_client::LossReason;
use support::{exists, fence, ms, pttl, unique_key, Server};

/// How long to wait for something the test has caused: a deadline for a loaded machine, not
/// a measure of how fast it happens.
const PATIENCE: Duration = Duration::from_secs(10);

macro_rules! shared_tests {
    () => {
        api_test! { fn keeps_the_lock_alive_while_held_and_stops_on_drop() {
            let (server, client, mut conn) = crate::apis::setup!();
            let key = unique_key("alive");
            let ttl = ms(200);
            let guard = io!(client.acquire_with_watchdog(&key, ttl)).unwrap().unwrap();
            assert!(guard.has_watchdog());
            let before = server.calls("lock.extend");

            // Five TTLs: without renewals the lock would have lapsed four times over.
            let end = Instant::now() + ttl * 5;
            while Instant::now() < end {
                assert_eq!(fence(&mut conn, &key), Some(guard.token()), "lapsed while held");
                io!(sleep(ms(20)));
            }
            assert!(!guard.is_lost());
            let renewals = server.calls("lock.extend") - before;
            assert!(renewals >= 8, "only {renewals} renewals in 5 ttls");

            // Dropping the guard stops the watchdog (sync: the thread is joined before the
            // release; async: the task is aborted) and releases; no renewal follows.
            drop(guard);
            io!(settled("the release on drop", || !exists(&mut conn, &key)));
            let after_drop = server.calls("lock.extend");
            io!(sleep(ttl * 2));
            assert_eq!(server.calls("lock.extend"), after_drop, "renewed after drop");
        } }

        api_test! { fn release_and_stop_end_the_watchdog_and_the_lock_lapses_after_a_stop() {
            let (server, client, mut conn) = crate::apis::setup!();
            let key = unique_key("stop");
            let ttl = ms(300);
            let mut guard = io!(client.acquire_with_watchdog(&key, ttl)).unwrap().unwrap();
            io!(sleep(ttl * 2));
            assert!(io!(guard.is_held()).unwrap());
            io!(guard.stop_watchdog());
            assert!(!guard.has_watchdog());
            let calls = server.calls("lock.extend");
            assert!(pttl(&mut conn, &key) <= 300);
            io!(poll("the lock to lapse", PATIENCE, || !exists(&mut conn, &key)));
            // It lapsed at the deadline it had at the stop: nothing renewed it since.
            assert_eq!(server.calls("lock.extend"), calls, "renewed after the stop");
            assert!(!io!(guard.is_held()).unwrap());
            assert!(!guard.is_lost(), "no watchdog, no loss report");

            // release() stops the watchdog first: after it returns, no renewal reaches the
            // server.
            let guard = io!(client.acquire_with_watchdog(&key, ttl)).unwrap().unwrap();
            io!(sleep(ttl));
            assert!(io!(guard.release()).unwrap());
            let calls = server.calls("lock.extend");
            io!(sleep(ttl));
            assert_eq!(server.calls("lock.extend"), calls, "renewed after release");
        } }

        api_test! { fn a_panicking_holder_stops_renewing() {
            let (server, client, mut conn) = crate::apis::setup!();
            let key = unique_key("panic");
            let (tx, rx) = std::sync::mpsc::channel();
            let holder = {
                let (client, key) = (client.clone(), key.clone());
                spawn!({
                    let guard = io!(client.acquire_with_watchdog(&key, ms(200))).unwrap().unwrap();
                    tx.send(guard.token()).unwrap();
                    io!(sleep(ms(300)));
                    panic!("holder fails while holding the lock (expected by the test)");
                })
            };
            let token = blocking(|| rx.recv_timeout(ms(5_000))).expect("holder acquired");
            let panicked = io!(holder_result(holder)).expect_err("the holder should have panicked");
            assert_eq!(
                panicked.as_deref(),
                Some("holder fails while holding the lock (expected by the test)")
            );
            // The unwinding dropped the guard: watchdog stopped, lock released.
            io!(settled(&format!("token {token} to be released"), || {
                fence(&mut conn, &key).is_none()
            }));
            let calls = server.calls("lock.extend");
            io!(sleep(ms(400)));
            assert_eq!(server.calls("lock.extend"), calls, "renewed after the panic");
        } }

        api_test! { fn reports_the_loss_at_once_when_the_key_is_deleted() {
            let (server, client, mut conn) = crate::apis::setup!();
            let key = unique_key("deleted");
            let ttl = ms(300);
            let guard = io!(client.acquire_with_watchdog(&key, ttl)).unwrap().unwrap();
            io!(sleep(ms(150)));
            let calls = server.calls("lock.extend");
            let _: i64 = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
            let reason = io!(wait_lost(&guard, PATIENCE)).expect("loss reported");
            assert!(matches!(reason, LossReason::NotHeld), "{reason:?}");
            // Told by the first renewal after the DEL (one more may have been on its way when
            // the key went), not after some further ones.
            let renewals = server.calls("lock.extend") - calls;
            assert!((1..=2).contains(&renewals), "{renewals} renewals before the report");
            assert!(guard.is_lost());
            assert!(matches!(guard.loss_reason(), Some(LossReason::NotHeld)));
            // Reported once, and remembered: waiting again returns at once (it is there
            // without waiting at all).
            let calls = server.calls("lock.extend");
            assert!(matches!(io!(wait_lost(&guard, Duration::ZERO)), Some(LossReason::NotHeld)));
            io!(sleep(ttl));
            assert_eq!(server.calls("lock.extend"), calls, "renewed after the loss");
        } }

        api_test! { fn reports_the_loss_when_the_server_is_paused_past_the_ttl() {
            let server = Server::start();
            let client = Client::open(&server.url()).unwrap();
            let key = unique_key("paused-server");
            let ttl = ms(300);
            let guard = io!(client.acquire_with_watchdog(&key, ttl)).unwrap().unwrap();
            io!(sleep(ms(150)));

            server.signal("STOP");
            let stopped = Instant::now();
            let reason = io!(wait_lost(&guard, PATIENCE));
            let after = stopped.elapsed();
            // Keep it stopped past the ttl, so that the hold has lapsed by the time it resumes.
            io!(sleep((ttl + ms(100)).saturating_sub(stopped.elapsed())));
            server.signal("CONT");

            let reason = reason.expect("loss reported while the server was stopped");
            println!(
                "{}: loss reported {after:?} after SIGSTOP of the server ({reason})",
                module_path!()
            );
            assert!(
                matches!(reason, LossReason::ExtendFailed(ref e) if e.is_unavailable()),
                "{reason:?}"
            );
            // How soon (typically before the deadline) is a timing goal, for `make bench`; here
            // it is what was reported, while the server could not answer.
            assert!(!io!(guard.is_held()).unwrap(), "the lapsed hold is still live");
        } }

        // Not a test on its own: the holder process of `a_paused_holder_process_is_told_it_lost_
        // the_lock`, which runs this test binary again with only this test and the holder's
        // environment set (`support::holder_env`); without it it fails. It prints
        // `acquired <token>`, waits for the watchdog to report a loss, prints `lost <reason>`
        // and exits. The async holder runs on a current-thread runtime.
        api_test! { child fn holder_child_process() {
            let Some((url, key, ttl)) = support::holder_env() else {
                panic!("not a test on its own: the child of a_paused_holder_process_is_told_it_lost_the_lock");
            };
            let client = Client::open(&url).unwrap();
            let guard = io!(client.acquire_with_watchdog(&key, ttl)).unwrap().unwrap();
            println!("acquired {}", guard.token());
            match io!(wait_lost(&guard, Duration::from_secs(30))) {
                Some(reason) => {
                    println!("lost {reason:?}");
                    std::process::exit(0);
                }
                None => {
                    println!("never lost");
                    std::process::exit(1);
                }
            }
        } }

        #[test]
        fn a_paused_holder_process_is_told_it_lost_the_lock() {
            let module = module_path!().rsplit("::").next().unwrap();
            support::paused_holder_process(&format!("{module}::holder_child_process"));
        }
    };
}

apis::both!(
    shared_tests,
    sync: {
    /// The holder's end: `Err` with its panic message, if it panicked with one.
    fn holder_result(holder: thread::JoinHandle<()>) -> Result<(), Option<String>> {
        holder
            .join()
            .map_err(|p| p.downcast_ref::<&str>().map(|s| s.to_string()))
    }

    /// The sync guard's loss channel: one message, then nothing; the remembered reason stays.
    #[test]
    fn the_loss_is_sent_once_on_the_channel() {
        let (_server, client, mut conn) = crate::apis::setup!();
        let key = unique_key("channel");
        let guard = client
            .acquire_with_watchdog(&key, ms(300))
            .unwrap()
            .unwrap();
        assert!(
            guard.lost().try_recv().is_err(),
            "a message before any loss"
        );
        let _: i64 = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
        let reason = guard.lost().recv_timeout(ms(900)).expect("loss sent");
        assert!(matches!(reason, LossReason::NotHeld), "{reason:?}");
        assert!(guard.lost().try_recv().is_err(), "sent twice");
        assert!(guard.wait_lost(Duration::ZERO).is_some());
    }
    },
    aio: {
    /// The holder's end: `Err` with its panic message, if it panicked with one.
    async fn holder_result(holder: tokio::task::JoinHandle<()>) -> Result<(), Option<String>> {
        holder.await.map_err(|e| {
            e.try_into_panic()
                .ok()
                .and_then(|p| p.downcast_ref::<&str>().map(|s| s.to_string()))
        })
    }

    /// `loss_watch()`: a worker task that must stop when the lock is lost is told too.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_loss_watch_tells_other_tasks() {
        let (_server, client, mut conn) = crate::apis::setup!();
        let key = unique_key("watch");
        let guard = client
            .acquire_with_watchdog(&key, ms(300))
            .await
            .unwrap()
            .unwrap();
        let mut watch = guard.loss_watch();
        let worker = tokio::spawn(async move {
            watch
                .wait_for(Option::is_some)
                .await
                .unwrap()
                .clone()
                .unwrap()
        });
        let _: i64 = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
        let reason = tokio::time::timeout(ms(900), worker).await.expect("told");
        assert!(matches!(reason.unwrap(), LossReason::NotHeld));
        assert!(matches!(guard.lost().await, LossReason::NotHeld));
    }

    /// The holder's runtime has one thread, and the holder blocks it (a CPU-bound step, a
    /// blocking call) past the ttl: the watchdog task cannot run, the hold lapses and a waiter
    /// gets the lock. When the runtime runs again, the watchdog's renewal is refused (it extends
    /// nothing) and the loss is reported at once.
    #[test]
    fn a_starved_holder_is_told_it_lost_the_lock() {
        let server = Server::start();
        let key = unique_key("starved");
        let ttl = ms(300);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let client = Client::open(&server.url()).unwrap();
            let guard = client
                .acquire_with_watchdog(&key, ttl)
                .await
                .unwrap()
                .unwrap();
            // Renewed past several ttls while the runtime runs.
            tokio::time::sleep(ttl * 2).await;
            assert_eq!(fence(&mut server.conn(), &key), Some(guard.token()));

            // A competitor on a thread of its own (the sync client) waits in the queue.
            let competitor = {
                let (url, key) = (server.url(), key.clone());
                thread::spawn(move || {
                    let client = redis_lock_client::Client::open(&url).unwrap();
                    let guard = client.acquire_blocking(&key, Duration::from_secs(10), ttl * 4);
                    guard
                        .unwrap()
                        .expect("granted once the starved holder's ttl passed")
                })
            };
            server.wait_blocked(1);
            // Starve the runtime: nothing else runs on its only thread.
            let starved = Instant::now();
            thread::sleep(ttl * 2);
            let other = competitor.join().unwrap();
            println!(
                "async watchdog: a competitor got the lock while the holder was starved ({:?})",
                starved.elapsed()
            );
            assert!(other.token() > guard.token());

            let resumed = Instant::now();
            let reason = tokio::time::timeout(ttl * 3, guard.lost())
                .await
                .expect("loss reported after the starvation");
            println!(
                "async watchdog: starved holder told `{reason:?}` {:?} after it ran again",
                resumed.elapsed()
            );
            assert!(matches!(reason, LossReason::NotHeld), "{reason:?}");
            // Its late renewal did not take the lock back, nor does its release.
            assert!(other.is_held().unwrap());
            assert!(!guard.release().await.unwrap());
            assert!(other.is_held().unwrap());
        });
    }
    }
);
