//! The servers a run measures: our own `redis-server` children, started by the workspace's
//! harness crate (bare, or with AOF and a replica), or an existing one (`REDIS_URL`); and the
//! `INFO` helpers.

use std::collections::HashMap;
use std::net::TcpStream;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use redis::Connection;

use crate::config::Config;

/// A server a scenario runs on: our own child process, or an existing one (`REDIS_URL`).
pub struct Server {
    /// TCP port on 127.0.0.1.
    pub port: u16,
    /// Our server, started by the harness crate (killed and its directory removed on drop);
    /// `None` for an existing server.
    own: Option<harness::Server>,
    /// The replica attached to it (the production setting), stopped first on drop.
    replica: Option<harness::Server>,
}

impl Server {
    /// The `REDIS_URL` server when there is one, else `bin` started bare with the module.
    pub fn start(cfg: &Config, bin: &str) -> Result<Server, String> {
        if let Some(port) = cfg.existing_port {
            let server = Server {
                port,
                own: None,
                replica: None,
            };
            let mut con = server
                .try_connect()
                .map_err(|e| format!("cannot connect to REDIS_URL 127.0.0.1:{port}: {e}"))?;
            let modules: String = redis::cmd("MODULE")
                .arg("LIST")
                .query::<redis::Value>(&mut con)
                .map(|v| format!("{v:?}"))
                .map_err(|e| format!("MODULE LIST failed: {e}"))?;
            if !modules.contains("lock") {
                return Err("the REDIS_URL server has no `lock` module loaded".into());
            }
            let keys: u64 = redis::cmd("DBSIZE")
                .query(&mut con)
                .map_err(|e| e.to_string())?;
            if keys != 0 {
                return Err(format!(
                    "the REDIS_URL server holds {keys} keys; the benchmark flushes it, so give it \
                     an empty server"
                ));
            }
            return Ok(server);
        }
        Server::spawn(bin, Some(&cfg.module), &[])
    }

    /// `bin` with the module, `appendonly yes` + `appendfsync everysec`, and a replica (also
    /// with the module) attached and in sync: the production setting.
    pub fn production(cfg: &Config, bin: &str) -> Result<Server, String> {
        let aof = ["--appendonly", "yes", "--appendfsync", "everysec"];
        let mut primary = Server::spawn(bin, Some(&cfg.module), &aof)?;
        let own = primary.own.as_ref().expect("our own server");
        let replica = builder(bin, Some(&cfg.module))
            .replica_of(primary.port)
            .try_start()?;
        harness::wait_for_replica_sync(own, &replica);
        primary.replica = Some(replica);
        Ok(primary)
    }

    /// `redis-server --version`'s name and version, e.g. `Redis 8.2.3` or `Valkey 8.1.8`.
    pub fn name(con: &mut Connection) -> String {
        let m = info(con, "server");
        match m.get("valkey_version") {
            Some(v) => format!("Valkey {v}"),
            None => format!(
                "Redis {}",
                m.get("redis_version").map_or("?", |v| v.as_str())
            ),
        }
    }

    /// Start our own `bin` on a port the OS chose, with `module` loaded (or none: the
    /// reference server that measures what loading the module costs other commands).
    pub fn spawn(bin: &str, module: Option<&Path>, extra: &[&str]) -> Result<Server, String> {
        let own = builder(bin, module).args(extra).try_start()?;
        Ok(Server {
            port: own.port(),
            own: Some(own),
            replica: None,
        })
    }

    pub fn try_connect(&self) -> redis::RedisResult<Connection> {
        let con = harness::try_connect(self.port, Duration::from_secs(5))?;
        // Long enough for FLUSHALL of a million keys and for blocked acquires.
        con.set_read_timeout(Some(Duration::from_secs(120)))?;
        Ok(con)
    }

    /// True in the production setting: a replica is attached.
    pub fn has_replica(&self) -> bool {
        self.replica.is_some()
    }

    pub fn connect(&self) -> Connection {
        self.try_connect()
            .unwrap_or_else(|e| panic!("cannot connect to 127.0.0.1:{}: {e}", self.port))
    }

    pub fn raw(&self) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.port))
            .unwrap_or_else(|e| panic!("cannot connect to 127.0.0.1:{}: {e}", self.port));
        s.set_nodelay(true).expect("set_nodelay");
        s.set_read_timeout(Some(Duration::from_secs(120)))
            .expect("set_read_timeout");
        s
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // The replica first, so that the primary's end does not make it retry the link.
        self.replica.take();
    }
}

/// The harness's server of `bin`, with `module` (the benchmark's own, release build) or none.
fn builder(bin: &str, module: Option<&Path>) -> harness::ServerBuilder {
    let b = harness::Server::builder().bin(bin).name("lockbench");
    match module {
        Some(module) => b.module(module),
        None => b.without_module(),
    }
}

// ---------------------------------------------------------------------------------------------
// INFO helpers
// ---------------------------------------------------------------------------------------------

pub fn info(con: &mut Connection, section: &str) -> HashMap<String, String> {
    let text: String = redis::cmd("INFO")
        .arg(section)
        .query(con)
        .expect("INFO failed");
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

pub fn info_u64(con: &mut Connection, section: &str, field: &str) -> u64 {
    info(con, section)
        .get(field)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("INFO {section} has no numeric {field}"))
}

/// Server CPU (user + system, all threads) in seconds since it started.
pub fn server_cpu(con: &mut Connection) -> f64 {
    let m = info(con, "cpu");
    let get = |k: &str| m.get(k).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    get("used_cpu_sys") + get("used_cpu_user")
}

/// `INFO commandstats`: command name -> (calls, usec).
pub fn commandstats(con: &mut Connection) -> HashMap<String, (u64, f64)> {
    let mut out = HashMap::new();
    for (k, v) in info(con, "commandstats") {
        let Some(name) = k.strip_prefix("cmdstat_") else {
            continue;
        };
        let mut calls = 0;
        let mut usec = 0.0;
        for kv in v.split(',') {
            match kv.split_once('=') {
                Some(("calls", n)) => calls = n.parse().unwrap_or(0),
                Some(("usec", n)) => usec = n.parse().unwrap_or(0.0),
                _ => {}
            }
        }
        out.insert(name.to_string(), (calls, usec));
    }
    out
}

pub fn flushall(con: &mut Connection) {
    let _: () = redis::cmd("FLUSHALL")
        .arg("SYNC")
        .query(con)
        .expect("FLUSHALL");
}

pub fn reset_stats(con: &mut Connection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(con)
        .expect("CONFIG RESETSTAT");
}

/// Poll `INFO <section> <field>` until `ok` holds (bounded by `limit`).
pub fn wait_info(
    con: &mut Connection,
    section: &str,
    field: &str,
    limit: Duration,
    ok: impl Fn(u64) -> bool,
) -> u64 {
    let deadline = Instant::now() + limit;
    loop {
        let v = info_u64(con, section, field);
        if ok(v) || Instant::now() > deadline {
            return v;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

pub fn config_get(con: &mut Connection, name: &str) -> String {
    let v: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg(name)
        .query(con)
        .expect("CONFIG GET");
    v.get(1).cloned().unwrap_or_default()
}

pub fn config_set(con: &mut Connection, name: &str, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(con)
        .expect("CONFIG SET");
}
