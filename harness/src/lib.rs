//! The one place that starts the servers redis-lock is tested and measured against: the module's
//! integration tests (`tests/common`, `tests/nodes`), the Rust client's tests
//! (`clients/rust/tests/support`), the benchmarks (`benches/`), and, through the `harness` program,
//! the Python tests (`clients/python/tests/conftest.py`).
//!
//! Each [`Server`] runs on a port the OS chose, bound to 127.0.0.1 only, in a directory of its
//! own under `<tmp>/redis-lock-tests/` (config `dir`, the `logfile`, RDB and AOF files all live
//! there), and counts as ready once it answers `PING` with its own `process_id` (not another
//! test's server that won the port), within a deadline. Dropping it kills the process and
//! removes the directory, unless the test is panicking: then the directory is kept and its path
//! and the log tail are printed. Tests wait on observable state ([`wait_until`],
//! [`wait_for_replica_sync`]), never on fixed sleeps.
//!
//! # Layout
//! - `server.rs`: [`Server`] (spawn, readiness, restart, kill on drop) and [`ServerBuilder`]
//!   (the module server: binary, module arguments, extra arguments, environment, replica).
//! - `sentinel.rs`, `cluster.rs`: Sentinels and cluster nodes.
//! - `clock.rs`: a shifted wall clock for one server (the LD_PRELOAD library).
//! - `valgrind.rs`: every server under valgrind memcheck (`REDIS_LOCK_VALGRIND`).
//! - `netns.rs`: a private network namespace for tests that filter packets.
//! - `feed.rs`: a raw RESP2 subscriber to the change feed (`LOCK.WATCH`, `SSUBSCRIBE`).
//! - `wait.rs`: connections, `INFO` fields, waiting on state.
//! - `lock.rs`: the lock commands with exact reply checks, and assertions on error replies.
//! - `paths.rs`: where the binaries, the module and the directories come from.
//! - `bin/harness.rs`: the `harness` program, which starts a server through this crate for
//!   tests in other languages (see the crate's README.md).
//!
//! # Environment
//! - `REDIS_SERVER`: the server binary (default `/usr/bin/redis-server` if it exists, else
//!   `redis-server` on `PATH`); any server of the matrix.
//! - `REDIS_LOCK_MODULE`: the module (default `<workspace>/target/debug/libredis_lock.so`).
//! - `REDIS_CLI`: `redis-cli`, for `--cluster create`.
//! - `REDIS_SENTINEL`: the Sentinel binary (default `redis-sentinel` if on `PATH`, else
//!   `$REDIS_SERVER --sentinel`).
//! - `CLOCKSHIFT_LIB`: the clock-shift library (default
//!   `<workspace>/target/clockshift/libclockshift.so`, built by `make clockshift`).
//! - `REDIS_LOCK_VALGRIND`: a directory: run every server under valgrind, logs there.
//! - `REDIS_LOCK_GRACEFUL_STOP`: stop servers with SIGTERM rather than SIGKILL.

pub mod clock;
pub mod cluster;
pub mod dump;
pub mod feed;
mod lock;
pub mod netns;
mod paths;
mod sentinel;
mod server;
pub mod valgrind;
mod wait;

pub use lock::*;
pub use paths::*;
pub use sentinel::{sentinel, sentinel_primary_port, SentinelConfig};
pub use server::{
    free_port, free_port_with_bus, send_signal, Node, Ports, Server, ServerBuilder,
    BUS_PORT_OFFSET, READY_TIMEOUT,
};
pub use wait::*;
