//! The scenarios, one file each. A scenario runs against the server it is given, keeps its
//! results, and writes its own part of BENCHMARKS.md and benches/results/results.json.
//!
//! To add one: write `scenarios/<name>.rs` with a type that implements [`Scenario`] and a
//! `pub fn new() -> Box<dyn Scenario>`, then add its [`Entry`] to [`ALL`] (and its `mod` line
//! below), and its line to benches/README.md.
//! Sections appear in BENCHMARKS.md in the order of [`ALL`].

use redis::Connection;

use crate::config::{Config, Sizes};
use crate::report::{Goal, Json};
use crate::server::Server;

pub mod contention;
pub mod durable;
pub mod expiry;
pub mod feed_latency;
pub mod memory;
pub mod module_tax;
pub mod peers;
pub mod rwlock;
pub mod scale;
pub mod semaphore;
pub mod session_crash;
pub mod session_end;
pub mod session_keepalive;
pub mod shared_memory;
pub mod shared_throughput;
pub mod throughput;
pub mod waiter_memory;

/// A scenario of `make bench` as the run plans it.
pub struct Entry {
    /// Its name in `ONLY=...` and its key in results.json.
    pub id: &'static str,
    /// Its section heading in BENCHMARKS.md.
    pub title: &'static str,
    /// The servers it runs on.
    pub servers: Servers,
    /// An uncontended scenario runs in both settings; the others on the bare server only.
    pub uncontended: bool,
    pub make: fn() -> Box<dyn Scenario>,
}

/// Every scenario of `make bench`, in report order.
pub const ALL: &[Entry] = &[
    Entry {
        id: "throughput",
        title: "Uncontended throughput",
        servers: Servers::Headline,
        uncontended: true,
        make: throughput::new,
    },
    Entry {
        id: "module_tax",
        title: "What loading the module costs other writes",
        servers: Servers::First,
        uncontended: false,
        make: module_tax::new,
    },
    Entry {
        id: "contention",
        title: "Contention on one key",
        servers: Servers::Headline,
        uncontended: false,
        make: contention::new,
    },
    Entry {
        id: "peers",
        title: "Contention against the lock libraries users pick",
        servers: Servers::Headline,
        uncontended: false,
        make: peers::new,
    },
    Entry {
        id: "expiry_handoff",
        title: "Expiry handoff",
        servers: Servers::First,
        uncontended: false,
        make: expiry::new,
    },
    Entry {
        id: "durable",
        title: "Durable grants (durable=1, one replica)",
        servers: Servers::First,
        uncontended: true,
        make: durable::new,
    },
    Entry {
        id: "memory",
        title: "Memory per held lock",
        servers: Servers::Headline,
        uncontended: false,
        make: memory::new,
    },
    Entry {
        id: "waiter_memory",
        title: "Memory per blocked waiter",
        servers: Servers::Matrix,
        uncontended: false,
        make: waiter_memory::new,
    },
    Entry {
        id: "scale",
        title: "Many expiring locks",
        servers: Servers::First,
        uncontended: false,
        make: scale::new,
    },
    Entry {
        id: "shared_throughput",
        title: "Uncontended SHARED acquire",
        servers: Servers::Headline,
        uncontended: true,
        make: shared_throughput::new,
    },
    Entry {
        id: "semaphore",
        title: "Semaphore: 16 workers, 4 permits",
        servers: Servers::First,
        uncontended: false,
        make: semaphore::new,
    },
    Entry {
        id: "rwlock",
        title: "Read/write lock: 16 readers, 2 writers",
        servers: Servers::First,
        uncontended: false,
        make: rwlock::new,
    },
    Entry {
        id: "shared_memory",
        title: "Memory per shared holder",
        servers: Servers::Headline,
        uncontended: false,
        make: shared_memory::new,
    },
    Entry {
        id: "session_crash",
        title: "Crashed holder: plain lock against a BOUND session",
        servers: Servers::First,
        uncontended: false,
        make: session_crash::new,
    },
    Entry {
        id: "session_keepalive",
        title: "Session keepalive of 1 to 10,000 holds (callgrind)",
        servers: Servers::First,
        uncontended: false,
        make: session_keepalive::new,
    },
    Entry {
        id: "session_end",
        title: "Ending a session of 10,000 holds",
        servers: Servers::First,
        uncontended: false,
        make: session_end::new,
    },
    Entry {
        id: "feed_latency",
        title: "Loss notice and leader failover through the change feed",
        servers: Servers::First,
        uncontended: false,
        make: feed_latency::new,
    },
];

/// Which servers a scenario runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Servers {
    /// The first server only (`REDIS_SERVER`, Redis 7.0 by default).
    First,
    /// The headline servers: the first and `BENCH_SERVERS` (Redis 8.2 in `make bench`).
    Headline,
    /// Every server of the matrix (also `BENCH_MATRIX`: the Valkeys).
    Matrix,
}

/// How the server under test is configured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setting {
    /// `--save "" --appendonly no`, no replica: the one setting where replicating each grant
    /// costs the module the most against `SET NX PX`.
    Bare,
    /// `appendonly yes`, `appendfsync everysec`, and one replica (with the module) attached:
    /// how production servers run.
    Production,
}

impl Setting {
    pub fn label(self) -> &'static str {
        match self {
            Setting::Bare => "bare",
            Setting::Production => "AOF everysec + replica",
        }
    }
    pub fn id(self) -> &'static str {
        match self {
            Setting::Bare => "bare",
            Setting::Production => "aof_everysec_replica",
        }
    }
}

/// What a scenario runs against.
pub struct Env<'a> {
    pub cfg: &'a Config,
    pub sizes: &'a Sizes,
    pub srv: &'a Server,
    /// A control connection to `srv` (not one the load uses).
    pub ctl: &'a mut Connection,
    /// SHA1 of the classic pattern's release script, loaded on `srv`.
    pub sha: &'a str,
}

/// One scenario on one server and setting.
pub trait Scenario {
    fn run(&mut self, env: &mut Env);
    /// What the scenario does and how it is measured: written once above its tables.
    fn intro(&self, o: &mut String, cfg: &Config);
    /// This run's tables.
    fn markdown(&self, o: &mut String);
    fn json(&self) -> Json;
    fn goals(&self) -> Vec<Goal> {
        Vec::new()
    }
    /// Extra files to write (file name, text) into the run's chart folder (`Output::dir`).
    fn files(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}
