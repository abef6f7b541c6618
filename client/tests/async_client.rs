//! The async client against a real server: guards, tokens, extend, blocking acquire beyond a
//! short response timeout, FIFO order, cancellation, contention versus failure.

mod support;

use std::time::{Duration, Instant};

use redis_lock_client::aio::Client;
use redis_lock_client::Error;
use support::{eventually, exists, fence, free_port, pttl, unique_key, Server};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[tokio::test]
async fn guard_releases_on_drop_and_release_reports_the_outcome() {
    let server = Server::start();
    let client = Client::open(&server.url()).unwrap();
    let mut conn = server.conn();
    let key = unique_key("drop");
    {
        let guard = client
            .acquire(&key, ms(10_000))
            .await
            .unwrap()
            .expect("free");
        assert_eq!(guard.key(), key);
        assert_eq!(fence(&mut conn, &key), Some(guard.token()));
        assert!(guard.is_held().await.unwrap());
    }
    // Drop sends LOCK.RELEASE before it returns, on the client's connection: the next command
    // of the same client comes after it, so the key is free for it at once.
    for _ in 0..20 {
        let guard = client.acquire(&key, ms(10_000)).await.unwrap();
        assert!(guard.is_some(), "the dropped guard's release came too late");
    }
    // Another connection sees the last release once the server has run it.
    eventually("the release on drop", ms(2_000), || {
        !exists(&mut conn, &key)
    })
    .await;

    // release() reports whether the lock was still held, and drop does not release again.
    let guard = client.acquire(&key, ms(10_000)).await.unwrap().unwrap();
    assert!(guard.release().await.unwrap());
    let guard = client.acquire(&key, ms(10_000)).await.unwrap().unwrap();
    let _: i64 = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
    assert!(!guard.is_held().await.unwrap());
    assert!(!guard.release().await.unwrap(), "release of a deleted lock");

    // A guard dropped on a plain thread, outside the runtime, is released by a task.
    let guard = client.acquire(&key, ms(10_000)).await.unwrap().unwrap();
    std::thread::spawn(move || drop(guard)).join().unwrap();
    eventually("the release from a plain thread", ms(2_000), || {
        !exists(&mut conn, &key)
    })
    .await;
}

#[tokio::test]
async fn tokens_increase_and_owner_retry_returns_the_same_token() {
    let server = Server::start();
    let client = Client::open(&server.url()).unwrap();
    let key = unique_key("tokens");
    let mut last = 0;
    for _ in 0..5 {
        let guard = client.acquire(&key, ms(10_000)).await.unwrap().unwrap();
        assert!(guard.token() > last, "{} after {last}", guard.token());
        last = guard.token();
        guard.release().await.unwrap();
    }
    let a = client.acquire(&key, ms(10_000)).await.unwrap().unwrap();
    assert!(client.acquire(&key, ms(10_000)).await.unwrap().is_none());
    drop(a);
    let fixed = client.clone().with_owner("worker-a");
    let first = fixed.acquire(&key, ms(10_000)).await.unwrap().unwrap();
    let retry = fixed.acquire(&key, ms(10_000)).await.unwrap().unwrap();
    assert_eq!(first.owner(), "worker-a");
    assert_eq!(first.token(), retry.token());
    assert!(first.token() > last);
}

#[tokio::test]
async fn extend_moves_the_deadline_until_the_lock_is_gone() {
    let server = Server::start();
    let client = Client::open(&server.url()).unwrap();
    let mut conn = server.conn();
    let key = unique_key("extend");
    let guard = client.acquire(&key, ms(500)).await.unwrap().unwrap();
    assert!(pttl(&mut conn, &key) <= 500);
    assert!(guard.extend(ms(60_000)).await.unwrap());
    assert!(pttl(&mut conn, &key) > 50_000);
    assert_eq!(guard.ttl(), ms(60_000));
    assert_eq!(fence(&mut conn, &key), Some(guard.token()), "token changed");
    let _: i64 = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
    assert!(
        !guard.extend(ms(60_000)).await.unwrap(),
        "extended a deleted lock"
    );
    assert!(matches!(
        guard.extend(Duration::ZERO).await,
        Err(Error::InvalidArgument(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_acquire_outlasts_a_short_response_timeout() {
    let server = Server::start();
    // Every reply must come within 100 ms, except a blocking acquire's.
    let client = Client::open(&server.url())
        .unwrap()
        .with_timeouts(ms(1_000), ms(100));
    let key = unique_key("block");
    let holder = client.acquire(&key, ms(10_000)).await.unwrap().unwrap();

    // Still held when the wait (4x the response timeout) runs out: None, not a timeout error.
    let start = Instant::now();
    let got = client
        .acquire_blocking(&key, ms(1_000), ms(400))
        .await
        .unwrap();
    assert!(got.is_none(), "granted while held");
    assert!(
        start.elapsed() >= ms(390),
        "returned after {:?}",
        start.elapsed()
    );

    // Released after 6x the response timeout: the one waiting command gets the lock.
    let start = Instant::now();
    let releaser = tokio::spawn(async move {
        tokio::time::sleep(ms(600)).await;
        holder.release().await.unwrap()
    });
    let next = client
        .acquire_blocking(&key, ms(1_000), ms(5_000))
        .await
        .unwrap()
        .expect("handed over on release");
    let waited = start.elapsed();
    assert!(releaser.await.unwrap());
    assert!(
        waited >= ms(590),
        "granted after {waited:?}, before the release"
    );
    assert!(next.is_held().await.unwrap());
    // One command per wait: no slicing, no retries.
    assert_eq!(server.calls("lock.acquire"), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_served_in_arrival_order() {
    let server = Server::start();
    let client = Client::open(&server.url()).unwrap();
    let key = unique_key("fifo");
    let holder = client.acquire(&key, ms(10_000)).await.unwrap().unwrap();
    let (tx, mut order) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for i in 0..4u64 {
        let (client, key, tx) = (client.clone(), key.clone(), tx.clone());
        waiters.push(tokio::spawn(async move {
            let guard = client
                .acquire_blocking(&key, ms(10_000), ms(10_000))
                .await
                .unwrap()
                .expect("granted in turn");
            tx.send((i, guard.token())).unwrap();
            guard.release().await.unwrap();
        }));
        // The next waiter is sent only once this one is in the queue.
        tokio::task::block_in_place(|| server.wait_blocked(i + 1));
    }
    holder.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap();
    }
    drop(tx);
    let mut got = Vec::new();
    while let Some(item) = order.recv().await {
        got.push(item);
    }
    let arrival: Vec<u64> = got.iter().map(|(i, _)| *i).collect();
    assert_eq!(arrival, vec![0, 1, 2, 3], "not first come, first served");
    assert!(got.windows(2).all(|w| w[0].1 < w[1].1), "tokens {got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_acquire_leaves_no_grant_behind() {
    let server = Server::start();
    let client = Client::open(&server.url()).unwrap();
    let mut conn = server.conn();
    let key = unique_key("cancel");
    let holder = client.acquire(&key, ms(10_000)).await.unwrap().unwrap();

    // The caller gives up after 100 ms; its waiter stays in the queue on the server ...
    let waiter = client.acquire_blocking(&key, ms(30_000), ms(5_000));
    assert!(tokio::time::timeout(ms(100), waiter).await.is_err());
    tokio::task::block_in_place(|| server.wait_blocked(1));
    // ... and is granted the lock when the holder releases: the grant no one awaits is
    // released at once, long before its 30 s ttl.
    holder.release().await.unwrap();
    eventually("the abandoned grant to be released", ms(2_000), || {
        fence(&mut conn, &key).is_none()
    })
    .await;
    assert_eq!(server.calls("lock.release"), 2);
    assert!(client.acquire(&key, ms(1_000)).await.unwrap().is_some());
}

#[tokio::test]
async fn contention_is_none_and_failure_is_an_error() {
    let server = Server::start();
    let client = Client::open(&server.url()).unwrap();
    let key = unique_key("contended");
    let _held = client.acquire(&key, ms(10_000)).await.unwrap().unwrap();
    assert!(client.acquire(&key, ms(10_000)).await.unwrap().is_none());

    let mut conn = server.conn();
    let plain = unique_key("plain");
    let _: () = redis::cmd("SET")
        .arg(&plain)
        .arg("x")
        .query(&mut conn)
        .unwrap();
    match client.acquire(&plain, ms(1_000)).await {
        Err(Error::Server(e)) => assert_eq!(e.code(), Some("WRONGTYPE")),
        other => panic!("expected WRONGTYPE, got {other:?}"),
    }

    let nowhere = Client::open(&format!("redis://127.0.0.1:{}/", free_port())).unwrap();
    match nowhere.acquire(&key, ms(1_000)).await {
        Err(e @ Error::Connection(_)) => assert!(e.is_unavailable()),
        other => panic!("expected a connection error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_stopped_server_times_out_instead_of_hanging() {
    let server = Server::start();
    let client = Client::open(&server.url())
        .unwrap()
        .with_timeouts(ms(200), ms(200));
    let key = unique_key("stopped");
    // One command first, so the shared connection is open: the timeout is then the reply's.
    assert!(client
        .acquire(&unique_key("warm"), ms(1_000))
        .await
        .unwrap()
        .is_some());
    server.signal("STOP");
    let start = Instant::now();
    let result = client.acquire(&key, ms(1_000)).await;
    let took = start.elapsed();
    // A new connection's handshake is bounded too.
    let fresh = Client::open(&server.url())
        .unwrap()
        .with_timeouts(ms(200), ms(200));
    let start = Instant::now();
    let handshake = fresh.acquire(&key, ms(1_000)).await;
    let handshake_took = start.elapsed();
    server.signal("CONT");
    match result {
        Err(e) => assert!(e.is_unavailable(), "{e}"),
        Ok(g) => panic!("granted by a stopped server: {g:?}"),
    }
    assert!(took < ms(2_000), "took {took:?}");
    match handshake {
        Err(e) => assert!(e.is_unavailable(), "{e}"),
        Ok(g) => panic!("granted by a stopped server: {g:?}"),
    }
    assert!(handshake_took < ms(2_000), "took {handshake_took:?}");
    let mut conn = server.conn();
    eventually("the abandoned grant to be released", ms(2_000), || {
        fence(&mut conn, &key).is_none()
    })
    .await;
}

/// `examples/async_lock.rs`, which the README shows, compiled into this test.
#[allow(dead_code)]
mod example {
    include!("../examples/async_lock.rs");
}

#[tokio::test]
async fn the_readme_example_runs() {
    let server = Server::start();
    example::run(&server.url()).await.unwrap();
    let mut conn = server.conn();
    assert!(!exists(&mut conn, "job:nightly") && !exists(&mut conn, "report"));
}
