//! Sentinels: each runs from a config file of its own (Sentinel rewrites it), monitoring one
//! primary on 127.0.0.1.

use std::fs;
use std::path::Path;

use redis::Connection;

use crate::paths::{path_arg, sentinel_cmd};
use crate::{Ports, Server};

/// How a [`sentinel`] watches its primary.
pub struct SentinelConfig<'a> {
    /// The name Sentinel knows the primary by (`sentinel monitor <name> ...`).
    pub master_name: &'a str,
    /// The primary's port on 127.0.0.1, as the Sentinel reaches it.
    pub primary_port: u16,
    /// How many Sentinels must agree that the primary is down.
    pub quorum: usize,
    /// `sentinel down-after-milliseconds`.
    pub down_after_ms: u64,
    /// `sentinel failover-timeout`.
    pub failover_timeout_ms: u64,
}

/// `SENTINEL GET-MASTER-ADDR-BY-NAME master_name` -> the primary's port, `None` while the
/// Sentinel has none (or does not answer).
pub fn sentinel_primary_port(sentinel: &mut Connection, master_name: &str) -> Option<u16> {
    let addr: Option<(String, String)> = redis::cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(master_name)
        .query(sentinel)
        .ok()?;
    addr?.1.parse().ok()
}

/// Start Sentinel `i` in `dir/sentinel{i}`, monitoring the primary of `cfg`.
pub fn sentinel(i: usize, dir: &Path, cfg: &SentinelConfig) -> Server {
    let (program, trailing) = sentinel_cmd();
    Server::spawn(
        &format!("sentinel {i}"),
        dir.join(format!("sentinel{i}")),
        Ports::Client,
        &program,
        |port, dir| {
            // Sentinel rewrites its config file, so it must be a writable file of its own.
            let conf = dir.join("sentinel.conf");
            let name = cfg.master_name;
            let text = format!(
                "port {port}\n\
                 bind 127.0.0.1\n\
                 dir {dir}\n\
                 logfile {log}\n\
                 sentinel monitor {name} 127.0.0.1 {primary} {quorum}\n\
                 sentinel down-after-milliseconds {name} {down}\n\
                 sentinel failover-timeout {name} {failover}\n\
                 sentinel parallel-syncs {name} 1\n",
                dir = path_arg(dir),
                log = path_arg(&dir.join("logfile")),
                primary = cfg.primary_port,
                quorum = cfg.quorum,
                down = cfg.down_after_ms,
                failover = cfg.failover_timeout_ms,
            );
            fs::write(&conf, text).expect("write sentinel.conf");
            let mut args = vec![path_arg(&conf)];
            args.extend(trailing.iter().cloned());
            args
        },
    )
}
