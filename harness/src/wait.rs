//! Connections, `INFO` fields, and waiting on observable state (never on fixed sleeps).

use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::{Connection, RedisResult, Value};

use crate::Server;

/// Read timeout on client connections, so a command that is never answered fails the test
/// instead of hanging the suite. Blocking calls that may legitimately wait longer set their own.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A server with the module ([`Server::start`]) and a connection to it: what most tests
/// start with.
pub fn start() -> (Server, Connection) {
    let server = Server::start();
    let c = server.conn();
    (server, c)
}

/// A connection to 127.0.0.1:`port` with the default read timeout.
pub fn connect(port: u16) -> Connection {
    try_connect(port, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("cannot connect to 127.0.0.1:{port}: {e}"))
}

/// A connection to 127.0.0.1:`port`, connecting within `timeout`, with the default read timeout.
pub fn try_connect(port: u16, timeout: Duration) -> RedisResult<Connection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let conn = client.get_connection_with_timeout(timeout)?;
    conn.set_read_timeout(Some(READ_TIMEOUT))?;
    Ok(conn)
}

/// `CONFIG GET name` for one exact name: its value.
pub fn config_get(conn: &mut Connection, name: &str) -> String {
    let pair: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg(name)
        .query(conn)
        .unwrap();
    assert_eq!(pair.len(), 2, "CONFIG GET {name}: {pair:?}");
    assert_eq!(pair[0], name);
    pair[1].clone()
}

/// `CONFIG SET name value`, its reply as it came (tests assert `OK` or the error).
pub fn config_set(conn: &mut Connection, name: &str, value: &str) -> RedisResult<Value> {
    redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(conn)
}

/// The value of `field` in `INFO <section>`, if present.
pub fn info_field(conn: &mut Connection, section: &str, field: &str) -> Option<String> {
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query(conn)
        .unwrap_or_else(|e| panic!("INFO {section}: {e}"));
    let value = fields(&info).find_map(|(name, value)| (name == field).then(|| value.to_string()));
    value
}

/// An integer field of `INFO <section>`; panics if it is missing or not an integer.
pub fn info_int(conn: &mut Connection, section: &str, field: &str) -> i64 {
    let value = info_field(conn, section, field)
        .unwrap_or_else(|| panic!("INFO {section} has no field {field}"));
    value
        .parse()
        .unwrap_or_else(|e| panic!("INFO {section} {field} = {value:?}: {e}"))
}

/// `name:value` lines of an `INFO` or `CLUSTER INFO` reply.
pub fn fields(text: &str) -> impl Iterator<Item = (&str, &str)> {
    text.lines()
        .filter_map(|line| line.trim_end().split_once(':'))
}

/// `INFO clients` `blocked_clients`.
pub fn blocked_clients(ctl: &mut Connection) -> i64 {
    let field =
        info_field(ctl, "clients", "blocked_clients").expect("INFO clients has no blocked_clients");
    field
        .parse()
        .unwrap_or_else(|e| panic!("blocked_clients {field:?}: {e}"))
}

/// Wait (up to 10 s) until exactly `n` clients are blocked.
#[track_caller]
pub fn wait_blocked(ctl: &mut Connection, n: i64) {
    wait_until(
        &format!("blocked_clients == {n}"),
        Duration::from_secs(10),
        || blocked_clients(ctl) == n,
    );
}

/// Poll `cond` every few milliseconds until it is true; panic naming `what` if `timeout`
/// passes first.
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        thread::sleep(Duration::from_millis(2));
    }
}

/// Poll `cond` until it returns `Some`, or panic naming `what` once `timeout` passed.
pub fn wait_for<T>(what: &str, timeout: Duration, mut cond: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = cond() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

/// A primary with the module and `primary_args`, and a replica of it, synced
/// ([`wait_for_replica_sync`]) before anything is written.
pub fn primary_and_replica(primary_args: &[&str]) -> (Server, Server) {
    let primary = Server::start_with(primary_args);
    let replica = Server::replica_of(&primary);
    wait_for_replica_sync(&primary, &replica);
    (primary, replica)
}

/// `REPLICAOF NO ONE` on `server`, which is then a primary (`role:master`, checked).
pub fn promote(server: &Server) {
    let mut c = server.conn();
    redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query::<()>(&mut c)
        .expect("REPLICAOF NO ONE");
    assert_eq!(
        info_field(&mut c, "replication", "role").as_deref(),
        Some("master")
    );
}

/// Wait until `replica` has a live link to `primary` and has processed everything the primary
/// has sent (`slave_repl_offset` equals the primary's `master_repl_offset`), and the primary is
/// streaming commands to it.
///
/// The last part matters right after a diskless full sync: the primary holds back the command
/// stream until the replica's next `REPLCONF ACK` (sent once a second), so a write made then can
/// reach the replica up to a second late. Once the link is up this sends a `PUBLISH`
/// (propagated to replicas, no key touched) and waits for the replica to have processed it too.
pub fn wait_for_replica_sync(primary: &Server, replica: &Server) {
    let mut p = primary.conn();
    let mut r = replica.conn();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut probed = false;
    loop {
        let link = info_field(&mut r, "replication", "master_link_status");
        let replica_offset = info_field(&mut r, "replication", "slave_repl_offset");
        let primary_offset = info_field(&mut p, "replication", "master_repl_offset");
        if link.as_deref() == Some("up")
            && replica_offset.is_some()
            && replica_offset == primary_offset
        {
            if probed {
                return;
            }
            let _: i64 = redis::cmd("PUBLISH")
                .arg("redis-lock-tests:sync-probe")
                .arg("")
                .query(&mut p)
                .expect("PUBLISH sync probe");
            probed = true;
            continue;
        }
        if Instant::now() >= deadline {
            panic!(
                "timed out waiting for the replica on port {} to catch up with the primary \
                 on port {} (link {link:?}, replica offset {replica_offset:?}, primary \
                 offset {primary_offset:?}); replica log:\n{}",
                replica.port(),
                primary.port(),
                replica.log()
            );
        }
        thread::sleep(Duration::from_millis(2));
    }
}

/// Wait until no AOF rewrite is running or scheduled.
pub fn wait_no_aof_rewrite(server: &Server) {
    let mut c = server.conn();
    wait_until("AOF rewrite to finish", Duration::from_secs(10), || {
        info_field(&mut c, "persistence", "aof_rewrite_in_progress").as_deref() == Some("0")
            && info_field(&mut c, "persistence", "aof_rewrite_scheduled").as_deref() == Some("0")
    });
}

/// A key name no other test uses.
pub fn unique_key(prefix: &str) -> String {
    format!("{prefix}:{}", uuid::Uuid::new_v4())
}

/// Wall-clock milliseconds since the Unix epoch.
pub fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock before 1970")
        .as_millis() as i64
}

/// Sleep until `deadline` has passed. Only for deadlines the test itself set (a lock's ttl),
/// never to wait for the server to do something.
pub fn sleep_until(deadline: Instant) {
    let now = Instant::now();
    if deadline > now {
        thread::sleep(deadline - now);
    }
}
