//! The client's tests start their servers through the workspace's harness crate (`harness/`);
//! this module re-exports it, and adds what only these tests use: Redlock's five masters, the
//! paused holder process, an async poll, and replies as the client's types (`u64` tokens; these
//! shadow the harness's `i64` ones).

// Each test crate uses a different subset.
#![allow(dead_code)]

pub mod failover;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redis::Connection;

pub use harness::*;

/// `n` milliseconds.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Five servers, as independent Redlock masters.
pub fn five_servers() -> Vec<Server> {
    (0..5).map(|_| Server::start()).collect()
}

/// The servers' URLs, in order.
pub fn urls(servers: &[Server]) -> Vec<String> {
    servers.iter().map(Server::url).collect()
}

/// Which servers hold `key` right now.
pub fn holders(servers: &[Server], key: &str) -> Vec<bool> {
    servers
        .iter()
        .map(|s| fence(&mut s.conn(), key).is_some())
        .collect()
}

/// Environment for a holder child process ([`holder_env`]): the server URL, the key, the ttl.
const HOLDER_URL: &str = "REDIS_LOCK_CLIENT_TEST_HOLDER_URL";
const HOLDER_KEY: &str = "REDIS_LOCK_CLIENT_TEST_HOLDER_KEY";
const HOLDER_TTL_MS: &str = "REDIS_LOCK_CLIENT_TEST_HOLDER_TTL_MS";

/// In a holder child process started by [`paused_holder_process`]: the server URL, the key and
/// the ttl to hold it with. `None` in an ordinary test run.
pub fn holder_env() -> Option<(String, String, Duration)> {
    let url = std::env::var(HOLDER_URL).ok()?;
    let key = std::env::var(HOLDER_KEY).expect("holder key");
    let ttl_ms = std::env::var(HOLDER_TTL_MS).expect("holder ttl");
    Some((
        url,
        key,
        Duration::from_millis(ttl_ms.parse().expect("ttl in ms")),
    ))
}

/// A child process, killed if the test ends first (also when it is stopped).
struct ChildProcess(Child);

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The parent side of "a paused holder process is told it lost the lock", for the sync and the
/// async watchdog alike: runs this test binary's test `holder_test` as a child process that
/// takes a lock with a watchdog (see [`holder_env`]), checks the lock stays alive, stops the
/// child with SIGSTOP until a waiter (the sync client) gets the lock after the ttl, resumes it,
/// and checks that the child prints `lost NotHeld` at once and that its late renewal did not
/// take the lock back.
pub fn paused_holder_process(holder_test: &str) {
    let server = Server::start();
    let client = redis_lock_client::Client::open(&server.url()).unwrap();
    let key = unique_key("paused-holder");
    let ttl = Duration::from_millis(300);
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
            .env(HOLDER_KEY, &key)
            .env(HOLDER_TTL_MS, ttl.as_millis().to_string())
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
    // The child's lines can follow the test harness's `test holder_child_process ... ` on the
    // same line: look for the marker anywhere and return what follows it.
    let expect_line = |marker: &str, timeout: Duration| -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some((_, rest)) = line.split_once(marker) {
                        return rest.to_string();
                    }
                }
                Err(e) => panic!("no `{marker}` line from the holder: {e}"),
            }
        }
    };

    let token: u64 = expect_line("acquired ", Duration::from_secs(10))
        .trim()
        .parse()
        .unwrap();
    // The child's watchdog keeps it alive past several ttls.
    thread::sleep(ttl * 2);
    assert_eq!(fence(&mut server.conn(), &key), Some(token));

    // Pause the holder: its renewals stop, its hold lapses, and a waiter gets the lock.
    send_signal(child.0.id(), "STOP");
    let stopped = Instant::now();
    let other = client
        .acquire_blocking(&key, Duration::from_secs(10), ttl * 4)
        .unwrap()
        .expect("granted once the paused holder's ttl passed");
    println!(
        "paused holder: another client got the lock {:?} after SIGSTOP (ttl {ttl:?})",
        stopped.elapsed()
    );
    assert!(other.token() > token);

    // Resume it: its next renewal finds the lock taken and it is told at once.
    send_signal(child.0.id(), "CONT");
    let resumed = Instant::now();
    let lost = expect_line("lost ", Duration::from_secs(5));
    println!(
        "paused holder: reported `lost {lost}` {:?} after SIGCONT",
        resumed.elapsed()
    );
    // Usually the resumed renewal gets 0 from LOCK.EXTEND (NotHeld). When SIGCONT lands while
    // the renewal is inside a socket call, that call fails with EINTR first and the loss is
    // reported as a failed renewal: the holder is told at once either way.
    let lost = lost.trim();
    assert!(
        lost == "NotHeld" || lost.starts_with("ExtendFailed(Connection(Interrupted"),
        "unexpected loss report: {lost}"
    );
    wait_until("the holder to exit", Duration::from_secs(5), || {
        matches!(child.0.try_wait(), Ok(Some(_)))
    });
    assert!(child.0.wait().unwrap().success());
    // Its late renewal did not take the lock back.
    assert!(other.is_held().unwrap());
}

/// [`wait_until`] for async tests: polls with `tokio::time::sleep`, so that the runtime's other
/// tasks (a guard's release, a connection's driver) run meanwhile even on one thread.
pub async fn eventually(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// `LOCK.FENCE key` -> the live hold's token, or `None`.
pub fn fence(conn: &mut Connection, key: &str) -> Option<u64> {
    harness::fence(conn, key).map(|t| t as u64)
}

/// `EXISTS key` is 1.
pub fn exists(conn: &mut Connection, key: &str) -> bool {
    harness::exists(conn, key) == 1
}

/// `LOCK.ACQUIRE key owner ttl` on a plain connection -> token or `None`.
pub fn raw_acquire(conn: &mut Connection, key: &str, owner: &str, ttl_ms: u64) -> Option<u64> {
    harness::acquire(conn, key, owner, ttl_ms as i64).map(|t| t as u64)
}

/// Sleep until `elapsed` has passed since `since`. Only for durations the test itself chose (a
/// pause past a ttl), never to wait for the server to do something.
pub fn sleep_until_elapsed(since: std::time::Instant, elapsed: Duration) {
    let left = elapsed.saturating_sub(since.elapsed());
    thread::sleep(left);
}
