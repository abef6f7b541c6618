//! The single-server client against a real server: guards, tokens, extend, blocking acquire,
//! contention versus failure.

mod support;

use std::thread;
use std::time::{Duration, Instant};

use redis_lock_client::{Client, Error};
use support::{exists, fence, free_port, pttl, unique_key, Server};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn guard_releases_on_drop() {
    let server = Server::start();
    let client = Client::open(&server.url()).unwrap();
    let mut conn = server.conn();
    let key = unique_key("drop");
    {
        let guard = client
            .acquire(&key, ms(10_000))
            .unwrap()
            .expect("free lock");
        assert_eq!(guard.key(), key);
        assert_eq!(fence(&mut conn, &key), Some(guard.token()));
        assert!(guard.is_held().unwrap());
    }
    assert!(!exists(&mut conn, &key), "drop did not release");

    // release() reports whether the lock was still held, and drop does not release again.
    let guard = client.acquire(&key, ms(10_000)).unwrap().unwrap();
    assert!(guard.release().unwrap());
    let guard = client.acquire(&key, ms(10_000)).unwrap().unwrap();
    let _: i64 = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
    assert!(!guard.is_held().unwrap());
    assert!(!guard.release().unwrap(), "release of a deleted lock");
}

#[test]
fn tokens_increase_and_owner_retry_returns_the_same_token() {
    let server = Server::start();
    let client = Client::open(&server.url()).unwrap();
    let key = unique_key("tokens");
    let mut last = 0;
    for _ in 0..5 {
        let guard = client.acquire(&key, ms(10_000)).unwrap().unwrap();
        assert!(guard.token() > last, "{} after {last}", guard.token());
        last = guard.token();
    }
    // Each guard has its own random owner ...
    let a = client.acquire(&key, ms(10_000)).unwrap().unwrap();
    assert!(client.acquire(&key, ms(10_000)).unwrap().is_none());
    drop(a);
    // ... unless one is chosen: then acquiring again is an idempotent retry.
    let fixed = client.clone().with_owner("worker-a");
    let first = fixed.acquire(&key, ms(10_000)).unwrap().unwrap();
    let retry = fixed.acquire(&key, ms(10_000)).unwrap().unwrap();
    assert_eq!(first.owner(), "worker-a");
    assert_eq!(first.token(), retry.token());
    assert!(first.token() > last);
}

#[test]
fn extend_moves_the_deadline_until_the_lock_is_gone() {
    let server = Server::start();
    let client = Client::open(&server.url()).unwrap();
    let mut conn = server.conn();
    let key = unique_key("extend");
    let guard = client.acquire(&key, ms(500)).unwrap().unwrap();
    assert!(pttl(&mut conn, &key) <= 500);
    assert!(guard.extend(ms(60_000)).unwrap());
    assert!(pttl(&mut conn, &key) > 50_000);
    assert_eq!(guard.ttl(), ms(60_000));
    assert_eq!(fence(&mut conn, &key), Some(guard.token()), "token changed");
    let _: i64 = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
    assert!(
        !guard.extend(ms(60_000)).unwrap(),
        "extended a deleted lock"
    );
    assert!(matches!(
        guard.extend(Duration::ZERO),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn blocking_acquire_waits_until_the_deadline_or_the_release() {
    let server = Server::start();
    let client = Client::open(&server.url()).unwrap();
    let key = unique_key("block");
    let holder = client.acquire(&key, ms(10_000)).unwrap().unwrap();

    let start = Instant::now();
    let got = client.acquire_blocking(&key, ms(1_000), ms(300)).unwrap();
    let waited = start.elapsed();
    assert!(got.is_none(), "granted while held");
    assert!(
        waited >= ms(290),
        "returned after {waited:?}, before the wait"
    );
    assert!(waited < ms(3_000), "returned after {waited:?}");

    // Released while we wait: the server hands the lock over at once, with a larger token.
    let releaser = thread::spawn(move || {
        thread::sleep(ms(100));
        holder.release().unwrap()
    });
    let start = Instant::now();
    let next = client
        .acquire_blocking(&key, ms(1_000), ms(5_000))
        .unwrap()
        .expect("handed over on release");
    assert!(releaser.join().unwrap());
    assert!(start.elapsed() < ms(3_000), "{:?}", start.elapsed());
    assert!(next.is_held().unwrap());
}

#[test]
fn contention_is_none_and_failure_is_an_error() {
    let server = Server::start();
    let client = Client::open(&server.url()).unwrap();
    let key = unique_key("contended");
    let _held = client.acquire(&key, ms(10_000)).unwrap().unwrap();
    assert!(client.acquire(&key, ms(10_000)).unwrap().is_none());

    // An error reply: the key is not a lock.
    let mut conn = server.conn();
    let plain = unique_key("plain");
    let _: () = redis::cmd("SET")
        .arg(&plain)
        .arg("x")
        .query(&mut conn)
        .unwrap();
    match client.acquire(&plain, ms(1_000)) {
        Err(Error::Server(e)) => assert_eq!(e.code(), Some("WRONGTYPE")),
        other => panic!("expected WRONGTYPE, got {other:?}"),
    }

    // Nothing listens on the port: a connection error, quickly.
    let nowhere = Client::open(&format!("redis://127.0.0.1:{}/", free_port())).unwrap();
    let start = Instant::now();
    match nowhere.acquire(&key, ms(1_000)) {
        Err(e @ Error::Connection(_)) => assert!(e.is_unavailable()),
        other => panic!("expected a connection error, got {other:?}"),
    }
    assert!(start.elapsed() < ms(3_000));
}

#[test]
fn a_stopped_server_times_out_instead_of_hanging() {
    let server = Server::start();
    let client = Client::open(&server.url())
        .unwrap()
        .with_timeouts(ms(200), ms(200));
    let key = unique_key("stopped");
    server.signal("STOP");
    let start = Instant::now();
    let result = client.acquire(&key, ms(1_000));
    let took = start.elapsed();
    server.signal("CONT");
    match result {
        Err(e) => assert!(e.is_unavailable(), "{e}"),
        Ok(g) => panic!("granted by a stopped server: {g:?}"),
    }
    assert!(took < ms(2_000), "took {took:?}");
    // The stopped server reads both the late request and the client's clean-up release when it
    // resumes, in either order: the key is free at once, or at the latest when the ttl passes.
    let mut conn = server.conn();
    support::wait_until("the abandoned grant to be released", ms(2_000), || {
        fence(&mut conn, &key).is_none()
    });
}
