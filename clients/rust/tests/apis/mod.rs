//! One test body for both APIs. A test file writes the tests that hold for the sync and the
//! async API once, inside a macro, and expands it in two modules:
//!
//! ```ignore
//! macro_rules! shared_tests { () => { api_test! { fn name() { ... io!(client.acquire(..)) ... } } } }
//! apis::both!(shared_tests, aio: { /* tests of the async API alone */ });
//! ```
//!
//! `both!` writes `mod sync { use super::*; sync_api!(); shared_tests!(); }` and the same
//! `mod aio` with `async_api!()`, each followed by the items given after `sync:` / `aio:`.
//! `sync_api!()` and `async_api!()` bring the API's types under the same names (`Client`,
//! `Guard`, `Redlock`, `Semaphore`, `ReadWriteLock`, `MultiLock`, `Session`, `Election`) and helpers that differ only
//! in how they wait:
//!
//! - `io!(call)`: the call itself, or `call.await`.
//! - `api_test! { fn name() { ... } }`: a `#[test]`, or a `#[tokio::test]` on a runtime with two
//!   worker threads (`api_test! { current_thread fn name() ... }`: on one thread). `api_test! {
//!   child fn name() ... }`: the body of a child process, on one thread and `#[ignore]`d, so that
//!   it is never counted as a test: its parent runs it with `--ignored --exact`.
//! - `spawn!({ ... })`: the block on a thread of its own, or in a task; `io!(join(handle))` its
//!   value.
//! - `io!(sleep(d))`; `blocking(|| ...)` for a blocking call from the test body (on the async
//!   side, `block_in_place`, so the runtime's other tasks go on).
//! - `io!(settled(what, cond))`: asserts `cond` at once on the sync side, where a drop or a
//!   panic releases before it returns; polls it for up to 2 s on the async side, where a
//!   release on drop is sent by a task.
//! - `io!(poll(what, timeout, cond))`: polls `cond` until it holds, for up to `timeout`.
//! - `io!(wait_lost(&guard, timeout))`: the watchdog's loss report within `timeout`, or `None`.
//!
//! - `setup!()`: what most tests start with, `(server, client, conn)`: a [`Server`], a `Client`
//!   of the API under test for it, and a plain connection to look at the server's state.
//!
//! Each test then appears twice in `cargo test -- --list`: `sync::name` and `aio::name`.

/// The sync API and its helpers (see the module docs).
macro_rules! sync_api {
    () => {
        #[allow(unused_imports)]
        use redis_lock_client::{
            Client, Election, Guard, MultiLock, ReadWriteLock, Redlock, Semaphore, Session,
        };

        #[allow(unused_macros)]
        macro_rules! io {
            ($e:expr) => {
                $e
            };
        }

        #[allow(unused_macros)]
        macro_rules! api_test {
                                            (fn $name:ident() $body:block) => {
                                                #[test]
                                                fn $name() $body
                                            };
                                            (current_thread fn $name:ident() $body:block) => {
                                                #[test]
                                                fn $name() $body
                                            };
                                            (child fn $name:ident() $body:block) => {
                                                #[test]
                                                #[ignore = "a child process: its parent test runs it (--ignored --exact)"]
                                                fn $name() $body
                                            };
                                        }

        #[allow(unused_macros)]
        macro_rules! spawn {
            ($body:block) => {
                std::thread::spawn(move || $body)
            };
        }

        #[allow(dead_code)]
        fn join<T>(handle: std::thread::JoinHandle<T>) -> T {
            handle.join().unwrap()
        }

        #[allow(dead_code)]
        fn sleep(d: std::time::Duration) {
            std::thread::sleep(d)
        }

        #[allow(dead_code)]
        fn blocking<T>(f: impl FnOnce() -> T) -> T {
            f()
        }

        #[allow(dead_code)]
        fn settled(what: &str, mut cond: impl FnMut() -> bool) {
            assert!(cond(), "not at once: {what}");
        }

        #[allow(dead_code)]
        fn poll(what: &str, timeout: std::time::Duration, cond: impl FnMut() -> bool) {
            crate::support::wait_until(what, timeout, cond)
        }

        #[allow(dead_code)]
        fn wait_lost(
            guard: &Guard,
            timeout: std::time::Duration,
        ) -> Option<redis_lock_client::LossReason> {
            guard.wait_lost(timeout)
        }
    };
}
pub(crate) use sync_api;

/// The async API and its helpers (see the module docs).
macro_rules! async_api {
    () => {
        #[allow(unused_imports)]
        use redis_lock_client::aio::{
            Client, Election, Guard, MultiLock, ReadWriteLock, Redlock, Semaphore, Session,
        };

        #[allow(unused_macros)]
        macro_rules! io {
            ($e:expr) => {
                $e.await
            };
        }

        #[allow(unused_macros)]
        macro_rules! api_test {
                                    (fn $name:ident() $body:block) => {
                                        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                                        async fn $name() $body
                                    };
                                    (current_thread fn $name:ident() $body:block) => {
                                        #[tokio::test(flavor = "current_thread")]
                                        async fn $name() $body
                                    };
                                    (child fn $name:ident() $body:block) => {
                                        #[tokio::test(flavor = "current_thread")]
                                        #[ignore = "a child process: its parent test runs it (--ignored --exact)"]
                                        async fn $name() $body
                                    };
                                }

        #[allow(unused_macros)]
        macro_rules! spawn {
                                    ($body:block) => {
                                        tokio::spawn(async move $body)
                                    };
                                }

        #[allow(dead_code)]
        async fn join<T>(handle: tokio::task::JoinHandle<T>) -> T {
            handle.await.unwrap()
        }

        #[allow(dead_code)]
        async fn sleep(d: std::time::Duration) {
            tokio::time::sleep(d).await
        }

        #[allow(dead_code)]
        fn blocking<T>(f: impl FnOnce() -> T) -> T {
            tokio::task::block_in_place(f)
        }

        #[allow(dead_code)]
        async fn settled(what: &str, cond: impl FnMut() -> bool) {
            crate::support::eventually(what, std::time::Duration::from_secs(2), cond).await
        }

        #[allow(dead_code)]
        async fn poll(what: &str, timeout: std::time::Duration, cond: impl FnMut() -> bool) {
            crate::support::eventually(what, timeout, cond).await
        }

        #[allow(dead_code)]
        async fn wait_lost(
            guard: &Guard,
            timeout: std::time::Duration,
        ) -> Option<redis_lock_client::LossReason> {
            tokio::time::timeout(timeout, guard.lost()).await.ok()
        }
    };
}
pub(crate) use async_api;

/// The shared tests `$tests!()` in `mod sync` and `mod aio`, each with the API's types and
/// helpers, followed by the tests of one API alone (see the module docs).
macro_rules! both {
    ($tests:ident $(, sync: { $($sync:item)* })? $(, aio: { $($aio:item)* })? $(,)?) => {
        mod sync {
            use super::*;
            crate::apis::sync_api!();
            $tests!();
            $($($sync)*)?
        }

        mod aio {
            use super::*;
            crate::apis::async_api!();
            $tests!();
            $($($aio)*)?
        }
    };
}
pub(crate) use both;

/// `(server, client, conn)` for the API in scope (see the module docs).
///
/// [`Server`]: crate::support::Server
#[allow(unused_macros)]
macro_rules! setup {
    () => {{
        let server = crate::support::Server::start();
        let client = Client::open(&server.url()).unwrap();
        let conn = server.conn();
        (server, client, conn)
    }};
}
#[allow(unused_imports)]
pub(crate) use setup;
