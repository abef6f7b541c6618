//! The watchdog against a real server: it keeps a lock alive while the holder lives, stops the
//! moment the guard is gone, and reports a loss at once (deleted key, paused server, paused
//! holder process).

mod support;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redis_lock_client::{Client, LossReason};
use support::{exists, fence, pttl, unique_key, wait_until, Server};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn keeps_the_lock_alive_while_held_and_stops_on_drop() {
    let server = Server::start();
    let client = Client::open(&server.url()).unwrap();
    let mut conn = server.conn();
    let key = unique_key("alive");
    let ttl = ms(200);
    let guard = client.acquire_with_watchdog(&key, ttl).unwrap().unwrap();
    let before = server.calls("lock.extend");

    // Five TTLs: without renewals the lock would have lapsed four times over.
    let end = Instant::now() + ttl * 5;
    while Instant::now() < end {
        assert_eq!(
            fence(&mut conn, &key),
            Some(guard.token()),
            "lapsed while held"
        );
        thread::sleep(ms(20));
    }
    assert!(!guard.is_lost());
    let renewals = server.calls("lock.extend") - before;
    assert!(renewals >= 8, "only {renewals} renewals in 5 ttls");

    // Dropping the guard stops the thread (joined before the release) and releases.
    drop(guard);
    assert!(!exists(&mut conn, &key), "not released on drop");
    let after_drop = server.calls("lock.extend");
    thread::sleep(ttl * 2);
    assert_eq!(
        server.calls("lock.extend"),
        after_drop,
        "renewed after drop"
    );
}

#[test]
fn stopping_the_watchdog_lets_the_lock_expire_after_its_ttl() {
    let server = Server::start();
    let client = Client::open(&server.url()).unwrap();
    let mut conn = server.conn();
    let key = unique_key("stop");
    let ttl = ms(300);
    let mut guard = client.acquire_with_watchdog(&key, ttl).unwrap().unwrap();
    thread::sleep(ttl * 2);
    assert!(guard.is_held().unwrap());
    guard.stop_watchdog();
    let stopped = Instant::now();
    assert!(pttl(&mut conn, &key) <= 300);
    wait_until("the lock to lapse", ttl * 3, || !exists(&mut conn, &key));
    let lapsed = stopped.elapsed();
    assert!(lapsed <= ttl + ms(200), "lapsed {lapsed:?} after the stop");
    assert!(!guard.is_held().unwrap());
    assert!(!guard.is_lost(), "no watchdog, no loss report");
}

#[test]
fn a_panicking_holder_stops_renewing() {
    let server = Server::start();
    let client = Client::open(&server.url()).unwrap();
    let mut conn = server.conn();
    let key = unique_key("panic");
    let (tx, rx) = mpsc::channel();
    let holder = {
        let (client, key) = (client.clone(), key.clone());
        thread::spawn(move || {
            let guard = client
                .acquire_with_watchdog(&key, ms(200))
                .unwrap()
                .unwrap();
            tx.send(guard.token()).unwrap();
            thread::sleep(ms(300));
            panic!("holder fails while holding the lock (expected by the test)");
        })
    };
    let token = rx.recv_timeout(ms(5_000)).expect("holder acquired");
    assert!(holder.join().is_err(), "the holder should have panicked");
    // The unwinding dropped the guard: watchdog stopped, lock released.
    assert_eq!(fence(&mut conn, &key), None, "token {token} still held");
    let calls = server.calls("lock.extend");
    thread::sleep(ms(400));
    assert_eq!(
        server.calls("lock.extend"),
        calls,
        "renewed after the panic"
    );
}

#[test]
fn reports_the_loss_at_once_when_the_key_is_deleted() {
    let server = Server::start();
    let client = Client::open(&server.url()).unwrap();
    let mut conn = server.conn();
    let key = unique_key("deleted");
    let ttl = ms(300);
    let guard = client.acquire_with_watchdog(&key, ttl).unwrap().unwrap();
    thread::sleep(ms(150));
    let _: i64 = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
    let deleted = Instant::now();
    let reason = guard.wait_lost(ttl * 3).expect("loss reported");
    let after = deleted.elapsed();
    println!("watchdog: loss after DEL reported in {after:?} (ttl {ttl:?})");
    assert!(matches!(reason, LossReason::NotHeld), "{reason:?}");
    assert!(after <= ttl + ms(200), "reported after {after:?}");
    assert!(guard.is_lost());
    // Reported once; the remembered reason stays.
    assert!(guard.lost().try_recv().is_err());
    assert!(guard.wait_lost(Duration::ZERO).is_some());
}

#[test]
fn reports_the_loss_when_the_server_is_paused_past_the_ttl() {
    let server = Server::start();
    let client = Client::open(&server.url()).unwrap();
    let key = unique_key("paused-server");
    let ttl = ms(300);
    let guard = client.acquire_with_watchdog(&key, ttl).unwrap().unwrap();
    thread::sleep(ms(150));

    server.signal("STOP");
    let stopped = Instant::now();
    let reason = guard.wait_lost(ttl * 3);
    let after = stopped.elapsed();
    // Keep it stopped past the ttl, so that the hold has lapsed by the time it resumes.
    support::sleep_until_elapsed(stopped, ttl + ms(100));
    server.signal("CONT");

    let reason = reason.expect("loss reported while the server was stopped");
    println!("watchdog: loss reported {after:?} after SIGSTOP of the server ({reason})");
    assert!(
        matches!(reason, LossReason::ExtendFailed(ref e) if e.is_unavailable()),
        "{reason:?}"
    );
    // Typically before the deadline: the last renewal was at most a period before the stop,
    // and a renewal may take at most a period. The margin is for a loaded machine.
    assert!(after <= ttl + ms(200), "reported {after:?} after the stop");
    assert!(!guard.is_held().unwrap(), "the lapsed hold is still live");
}

/// Not a test on its own: the holder process of [`a_paused_holder_process_is_told_it_lost_the_lock`],
/// which runs this test binary again with only this test and the holder's environment set
/// ([`support::holder_env`]). Without it it returns at once. It prints `acquired <token>`, waits
/// for the watchdog to report a loss, prints `lost <reason>` and exits.
#[test]
fn holder_child_process() {
    let Some((url, key, ttl)) = support::holder_env() else {
        return;
    };
    let client = Client::open(&url).unwrap();
    let guard = client.acquire_with_watchdog(&key, ttl).unwrap().unwrap();
    println!("acquired {}", guard.token());
    match guard.wait_lost(Duration::from_secs(30)) {
        Some(reason) => {
            println!("lost {reason:?}");
            std::process::exit(0);
        }
        None => {
            println!("never lost");
            std::process::exit(1);
        }
    }
}

#[test]
fn a_paused_holder_process_is_told_it_lost_the_lock() {
    support::paused_holder_process("holder_child_process");
}
