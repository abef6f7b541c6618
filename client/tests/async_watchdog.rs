//! The async watchdog against a real server: a task that keeps the lock alive while the guard
//! lives, stops with it, and reports a loss at once (deleted key, paused server, a holder whose
//! runtime was starved past the ttl) without ever extending a hold that is no longer its own.

mod support;

use std::thread;
use std::time::{Duration, Instant};

use redis_lock_client::aio::Client;
use redis_lock_client::LossReason;
use support::{eventually, exists, fence, pttl, unique_key, Server};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keeps_the_lock_alive_while_held_and_stops_on_drop() {
    let server = Server::start();
    let client = Client::open(&server.url()).unwrap();
    let mut conn = server.conn();
    let key = unique_key("alive");
    let ttl = ms(200);
    let guard = client
        .acquire_with_watchdog(&key, ttl)
        .await
        .unwrap()
        .unwrap();
    assert!(guard.has_watchdog());
    let before = server.calls("lock.extend");

    // Five TTLs: without renewals the lock would have lapsed four times over.
    let end = Instant::now() + ttl * 5;
    while Instant::now() < end {
        assert_eq!(
            fence(&mut conn, &key),
            Some(guard.token()),
            "lapsed while held"
        );
        tokio::time::sleep(ms(20)).await;
    }
    assert!(!guard.is_lost());
    let renewals = server.calls("lock.extend") - before;
    assert!(renewals >= 8, "only {renewals} renewals in 5 ttls");

    // Dropping the guard aborts the task and releases; no renewal follows.
    drop(guard);
    eventually("the release on drop", ms(2_000), || {
        !exists(&mut conn, &key)
    })
    .await;
    let after_drop = server.calls("lock.extend");
    tokio::time::sleep(ttl * 2).await;
    assert_eq!(
        server.calls("lock.extend"),
        after_drop,
        "renewed after drop"
    );
}

#[tokio::test]
async fn release_and_stop_wait_for_the_task_to_end() {
    let server = Server::start();
    let client = Client::open(&server.url()).unwrap();
    let mut conn = server.conn();
    let key = unique_key("stop");
    let ttl = ms(300);
    let mut guard = client
        .acquire_with_watchdog(&key, ttl)
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(ttl * 2).await;
    assert!(guard.is_held().await.unwrap());
    guard.stop_watchdog().await;
    assert!(!guard.has_watchdog());
    let stopped = Instant::now();
    assert!(pttl(&mut conn, &key) <= 300);
    eventually("the lock to lapse", ttl * 3, || !exists(&mut conn, &key)).await;
    assert!(
        stopped.elapsed() <= ttl + ms(200),
        "lapsed {:?} after the stop",
        stopped.elapsed()
    );
    assert!(!guard.is_held().await.unwrap());
    assert!(!guard.is_lost(), "no watchdog, no loss report");

    // release() stops the task first: after it returns, no renewal reaches the server.
    let guard = client
        .acquire_with_watchdog(&key, ttl)
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(ttl).await;
    assert!(guard.release().await.unwrap());
    let calls = server.calls("lock.extend");
    tokio::time::sleep(ttl).await;
    assert_eq!(server.calls("lock.extend"), calls, "renewed after release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_holder_task_stops_renewing() {
    let server = Server::start();
    let client = Client::open(&server.url()).unwrap();
    let mut conn = server.conn();
    let key = unique_key("panic");
    let (tx, rx) = tokio::sync::oneshot::channel();
    let holder = {
        let (client, key) = (client.clone(), key.clone());
        tokio::spawn(async move {
            let guard = client
                .acquire_with_watchdog(&key, ms(200))
                .await
                .unwrap()
                .unwrap();
            tx.send(guard.token()).unwrap();
            tokio::time::sleep(ms(300)).await;
            panic!("holder fails while holding the lock (expected by the test)");
        })
    };
    let token = rx.await.expect("holder acquired");
    assert!(holder.await.is_err(), "the holder should have panicked");
    // The unwinding dropped the guard: watchdog aborted, lock released.
    eventually(&format!("token {token} to be released"), ms(2_000), || {
        fence(&mut conn, &key).is_none()
    })
    .await;
    let calls = server.calls("lock.extend");
    tokio::time::sleep(ms(400)).await;
    assert_eq!(
        server.calls("lock.extend"),
        calls,
        "renewed after the panic"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_the_loss_at_once_when_the_key_is_deleted() {
    let server = Server::start();
    let client = Client::open(&server.url()).unwrap();
    let mut conn = server.conn();
    let key = unique_key("deleted");
    let ttl = ms(300);
    let guard = client
        .acquire_with_watchdog(&key, ttl)
        .await
        .unwrap()
        .unwrap();
    // A worker task that must stop when the lock is lost.
    let mut watch = guard.loss_watch();
    let worker = tokio::spawn(async move {
        watch
            .wait_for(Option::is_some)
            .await
            .unwrap()
            .clone()
            .unwrap()
    });
    tokio::time::sleep(ms(150)).await;
    let _: i64 = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
    let deleted = Instant::now();
    let reason = tokio::time::timeout(ttl * 3, guard.lost())
        .await
        .expect("loss reported");
    let after = deleted.elapsed();
    println!("async watchdog: loss after DEL reported in {after:?} (ttl {ttl:?})");
    assert!(matches!(reason, LossReason::NotHeld), "{reason:?}");
    assert!(after <= ttl + ms(200), "reported after {after:?}");
    assert!(guard.is_lost());
    assert!(matches!(guard.loss_reason(), Some(LossReason::NotHeld)));
    assert!(matches!(worker.await.unwrap(), LossReason::NotHeld));
    // Reported once, and remembered: lost() returns at once now.
    let calls = server.calls("lock.extend");
    assert!(matches!(guard.lost().await, LossReason::NotHeld));
    tokio::time::sleep(ttl).await;
    assert_eq!(server.calls("lock.extend"), calls, "renewed after the loss");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_the_loss_when_the_server_is_paused_past_the_ttl() {
    let server = Server::start();
    let client = Client::open(&server.url()).unwrap();
    let key = unique_key("paused-server");
    let ttl = ms(300);
    let guard = client
        .acquire_with_watchdog(&key, ttl)
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(ms(150)).await;

    server.signal("STOP");
    let stopped = Instant::now();
    let reason = tokio::time::timeout(ttl * 3, guard.lost()).await;
    let after = stopped.elapsed();
    // Keep it stopped past the ttl, so that the hold has lapsed by the time it resumes.
    tokio::time::sleep((ttl + ms(100)).saturating_sub(stopped.elapsed())).await;
    server.signal("CONT");

    let reason = reason.expect("loss reported while the server was stopped");
    println!("async watchdog: loss reported {after:?} after SIGSTOP of the server ({reason})");
    assert!(
        matches!(reason, LossReason::ExtendFailed(ref e) if e.is_unavailable()),
        "{reason:?}"
    );
    assert!(after <= ttl + ms(200), "reported {after:?} after the stop");
    assert!(
        !guard.is_held().await.unwrap(),
        "the lapsed hold is still live"
    );
}

/// The holder's runtime has one thread, and the holder blocks it (a CPU-bound step, a blocking
/// call) past the ttl: the watchdog task cannot run, the hold lapses and a waiter gets the lock.
/// When the runtime runs again, the watchdog's renewal is refused (it extends nothing) and the
/// loss is reported at once.
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
