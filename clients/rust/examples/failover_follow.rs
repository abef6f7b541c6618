//! How long the Rust client takes to follow a planned `CLUSTER FAILOVER` (issue 34); the rows
//! and shape of benches/failover/follow.py (the Python client's).
//!
//! ```text
//! REDIS_SERVER=/usr/bin/redis-server REDIS_LOCK_MODULE=target/debug/libredis_lock.so \
//!     cargo run --release -p redis-lock-client --example failover_follow      (QUICK=1: 1 round)
//! ```
//!
//! On a 3-master, 3-replica cluster started by the workspace's harness (`cluster::start`, as
//! tests/cluster_failover.rs does), a `for_key` client with, as the README shows, a session
//! (ttl 3 s, `keepalive_every(200 ms)`) holding a lock, and `client.watch(key)` of a second key of
//! the same shard. Each round sends `CLUSTER FAILOVER` to the shard's replica (rounds alternate
//! between the two nodes) and measures, from the moment that command answered:
//!
//! - `promoted`: the replica's `ROLE` says master (polled every 2 ms);
//! - `keepalive`: the session's first keepalive answered by the new master: the new master's
//!   `INFO commandstats` count of `lock.session|keepalive` first above its count before the
//!   failover (polled every 2 ms; the session is the only one on the shard, checked with
//!   `LOCK.SESSION LIST`; a keepalive that met `MOVED` there counts as rejected, not as a call);
//! - `observer`: the watch's first change read from the new master. This client's observer
//!   reports a state only when it differs from the one it reported, so a raw connection takes the
//!   watched key on the new master as soon as its `ROLE` says master; the change is the first the
//!   observer reports after the failover (it must be that grant: its token).
//!
//! Then it checks that no hold was lost (the session and its guard not lost, the new master's
//! `LOCK.FENCE` of the guard's token): a lost hold ends the program with exit code 1. Prints
//! each round on stderr and the table on stdout. A measurement, not a test: `make bench-failover`.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use harness::{cluster, test_dir, Server};
use redis::{Connection, Value};
use redis_lock_client::{Change, Client, Session};

/// Redis spaces the failovers of one shard (see follow.py's VOTE_SPACING): a master votes for
/// one failover of a given master per `cluster-node-timeout` x 2, a replica that ran an election
/// waits x 4 before its next (the harness's timeout is 5 s).
const VOTE_SPACING: Duration = Duration::from_secs(21);
/// The session's keepalive period (its ttl is 3 s).
const KEEPALIVE: Duration = Duration::from_millis(200);
/// The bound on every wait: a wait that runs out ends the round with an error.
const PATIENCE: Duration = Duration::from_secs(30);
/// The polling period of `ROLE` and `INFO commandstats`.
const POLL: Duration = Duration::from_millis(2);
const TAG: &str = "{bench-failover}";

type Result<T> = std::result::Result<T, String>;

fn connect(server: &Server) -> Result<Connection> {
    redis::Client::open(server.url())
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
        .map_err(|e| format!("connect to {}: {e}", server.port()))
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        other => format!("{other:?}"),
    }
}

/// `ROLE`: "master" or "slave" and, for a replica, its master's port.
fn role(conn: &mut Connection) -> Option<(String, Option<u16>)> {
    let role: Vec<Value> = redis::cmd("ROLE").query(conn).ok()?;
    let port = match role.get(2) {
        Some(Value::Int(p)) => Some(*p as u16),
        _ => None,
    };
    Some((text(role.first()?), port))
}

fn role_of(server: &Server) -> Option<(String, Option<u16>)> {
    role(&mut connect(server).ok()?)
}

/// `cmdstat_<command>:calls` of `INFO commandstats`.
fn calls(conn: &mut Connection, command: &str) -> Result<u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .map_err(|e| format!("INFO commandstats: {e}"))?;
    let prefix = format!("cmdstat_{command}:calls=");
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0))
}

/// Wait (every `every`) until `f` answers `Some`, at most [`PATIENCE`].
fn until<T>(what: &str, every: Duration, mut f: impl FnMut() -> Option<T>) -> Result<T> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}"));
        }
        thread::sleep(every);
    }
}

/// The master serving `TAG`'s slot now, and its replica.
fn shard(nodes: &[Server]) -> Result<(usize, usize)> {
    let old = nodes
        .iter()
        .position(|n| {
            role_of(n).map(|r| r.0) == Some("master".into())
                && connect(n).is_ok_and(|mut c| {
                    redis::cmd("LOCK.FENCE")
                        .arg(TAG)
                        .query::<Value>(&mut c)
                        .is_ok()
                })
        })
        .ok_or("no master serves the tag")?;
    let new = nodes
        .iter()
        .position(|n| role_of(n).and_then(|r| r.1) == Some(nodes[old].port()))
        .ok_or("the tag's master has no replica")?;
    Ok((old, new))
}

/// Whether `master`'s `CLUSTER NODES` lists `replica` as its replica (a `CLUSTER FAILOVER` from
/// a node its master does not count as a replica times out).
fn knows_replica(master: &Server, replica: &Server) -> bool {
    let Ok(mut c) = connect(master) else {
        return false;
    };
    let Ok(view) = redis::cmd("CLUSTER").arg("NODES").query::<String>(&mut c) else {
        return false;
    };
    let lines: Vec<Vec<&str>> = view
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let Some(me) = lines
        .iter()
        .find(|f| f.len() > 3 && f[2].contains("myself"))
    else {
        return false;
    };
    let addr = format!("127.0.0.1:{}@", replica.port());
    lines
        .iter()
        .any(|f| f.len() > 3 && f[1].starts_with(&addr) && f[2].contains("slave") && f[3] == me[0])
}

/// One round's figures: ms from the `CLUSTER FAILOVER` reply to the promotion, the first
/// keepalive on the new master, the observer's first change.
struct Round {
    promoted: f64,
    keepalive: f64,
    observer: f64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn one_round(
    nodes: &[Server],
    last: &mut HashMap<u16, Instant>,
    changes: &mpsc::Receiver<(Instant, Change)>,
    check_held: &dyn Fn(&mut Connection) -> Result<()>,
) -> Result<Round> {
    let (old, new) = shard(nodes)?;
    let (old, new) = (&nodes[old], &nodes[new]);
    let since = [old.port(), new.port()]
        .iter()
        .filter_map(|p| last.get(p))
        .max()
        .copied();
    if let Some(since) = since {
        // Redis's own vote spacing, not a wait for state (see VOTE_SPACING).
        thread::sleep((since + VOTE_SPACING).saturating_duration_since(Instant::now()));
    }
    // A random part of a keepalive period, so that the rounds do not all fall on one phase of
    // the session's keepalive (the spacing is a whole number of periods).
    let random = std::collections::hash_map::RandomState::new().hash_one(Instant::now());
    thread::sleep(KEEPALIVE.mul_f64((random % 1000) as f64 / 1000.0));
    let mut o = connect(old)?;
    until("a replica in sync", POLL, || {
        (redis::cmd("WAIT")
            .arg(1)
            .arg(1000)
            .query::<i64>(&mut o)
            .ok()?
            == 1)
            .then_some(())
    })?;
    let mut n = connect(new)?;
    let before = calls(&mut n, "lock.session|keepalive")?;
    while changes.try_recv().is_ok() {}

    let ok: Value = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .query(&mut n)
        .map_err(|e| format!("CLUSTER FAILOVER: {e}"))?;
    let t0 = Instant::now();
    if ok != Value::Okay {
        return Err(format!("CLUSTER FAILOVER answered {ok:?}"));
    }
    last.insert(old.port(), t0);
    last.insert(new.port(), t0);

    // Poll the promotion, then take the watched key there (once), and the keepalive count.
    let (mut promoted, mut probe, mut kept) = (None, None, None);
    let probe_key = format!("{TAG}probe");
    until(
        "the promotion, the probe's grant and a keepalive on the new master",
        POLL,
        || {
            if promoted.is_none() && role(&mut n).is_some_and(|r| r.0 == "master") {
                promoted = Some(t0.elapsed());
            }
            if promoted.is_some() && probe.is_none() {
                probe = redis::cmd("LOCK.ACQUIRE")
                    .arg(&probe_key)
                    .arg("bench-probe")
                    .arg(60_000)
                    .query::<Option<u64>>(&mut n)
                    .ok()
                    .flatten();
            }
            if kept.is_none() && calls(&mut n, "lock.session|keepalive").ok()? > before {
                kept = Some(t0.elapsed());
            }
            (promoted.is_some() && probe.is_some() && kept.is_some()).then_some(())
        },
    )
    .map_err(|e| {
        format!(
            "{e} (promoted {promoted:?}, probe {probe:?}, keepalive {kept:?})\n{}",
            new.log()
        )
    })?;
    let probe = probe.unwrap();

    let (first, mut change) = changes
        .recv_timeout(PATIENCE)
        .map_err(|_| "the observer reported nothing within 30 s".to_string())?;
    let deadline = Instant::now() + PATIENCE;
    while change.leader.as_ref().map(|l| l.term) != Some(probe) {
        change = changes
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .map_err(|_| "the observer did not report the probe's grant on the new master")?
            .1;
    }
    let observer = first.duration_since(t0);

    let released: i64 = redis::cmd("LOCK.RELEASE")
        .arg(&probe_key)
        .arg("bench-probe")
        .query(&mut n)
        .map_err(|e| format!("LOCK.RELEASE: {e}"))?;
    if released != 1 {
        return Err("the probe's release answered 0".into());
    }
    until("the observer to report the probe's release", POLL, || {
        changes
            .recv_timeout(Duration::from_millis(100))
            .ok()
            .filter(|(_, c)| c.leader.is_none())
    })?;
    check_held(&mut n)?;

    until("the old master a replica", POLL, || {
        (role_of(old)?.0 == "slave").then_some(())
    })?;
    // The next round's replica must be in sync, or its CLUSTER FAILOVER times out ...
    until("its link up", POLL, || {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut connect(old).ok()?)
            .ok()?;
        info.contains("master_link_status:up").then_some(())
    })?;
    // ... and known as a replica to its new master.
    until("the new master to know its replica", POLL, || {
        knows_replica(new, old).then_some(())
    })?;
    Ok(Round {
        promoted: ms(promoted.unwrap()),
        keepalive: ms(kept.unwrap()),
        observer: ms(observer),
    })
}

fn run(nodes: &[Server], rounds: usize) -> Result<Vec<Round>> {
    let seed = Client::open(&nodes[0].url()).map_err(|e| e.to_string())?;
    let client = seed.for_key(TAG).map_err(|e| e.to_string())?;
    let session = Session::builder(&client, Duration::from_secs(3))
        .keepalive_every(KEEPALIVE)
        .open()
        .map_err(|e| format!("session: {e}"))?;
    let guard = session
        .client()
        .acquire(&format!("{TAG}held"), Duration::ZERO)
        .map_err(|e| format!("acquire: {e}"))?
        .ok_or("the held key is taken")?;

    let (tx, changes) = mpsc::channel();
    let watcher = client.clone();
    let (ready_tx, ready) = mpsc::channel();
    thread::spawn(move || match watcher.watch(&format!("{TAG}probe")) {
        Ok(observer) => {
            let _ = ready_tx.send(Ok(()));
            for change in observer {
                if tx.send((Instant::now(), change)).is_err() {
                    break;
                }
            }
        }
        Err(e) => {
            let _ = ready_tx.send(Err(format!("watch: {e}")));
        }
    });
    ready
        .recv_timeout(PATIENCE)
        .map_err(|_| "watch: no answer within 30 s".to_string())??;
    // Its first change is the state when it started: no holder.
    let (_, start) = changes
        .recv_timeout(PATIENCE)
        .map_err(|_| "the watch reported no first state".to_string())?;
    if start.leader.is_some() {
        return Err(format!("the probe key is held at the start: {start:?}"));
    }

    let (old, _) = shard(nodes)?;
    let sessions: Value = redis::cmd("LOCK.SESSION")
        .arg("LIST")
        .query(&mut connect(&nodes[old])?)
        .map_err(|e| format!("LOCK.SESSION LIST: {e}"))?;
    let count = match &sessions {
        Value::Array(v) if v.len() == 2 => match &v[1] {
            Value::Array(s) => s.len(),
            _ => usize::MAX,
        },
        _ => usize::MAX,
    };
    if count != 1 {
        return Err(format!(
            "the shard has {count} sessions, not the session alone: {sessions:?}"
        ));
    }

    let check_held = |n: &mut Connection| -> Result<()> {
        let fenced: Value = redis::cmd("LOCK.FENCE")
            .arg(guard.key())
            .arg(guard.token())
            .query(n)
            .map_err(|e| format!("LOCK.FENCE on the new master: {e}"))?;
        if !matches!(fenced, Value::Int(1) | Value::Okay) {
            return Err(format!(
                "HOLD LOST: the new master's LOCK.FENCE of the hold answered {fenced:?}"
            ));
        }
        if session.is_lost() || guard.is_lost() {
            return Err(format!(
                "HOLD LOST: the client reports {:?} / {:?}",
                session.loss_reason(),
                guard.loss_reason()
            ));
        }
        Ok(())
    };
    let mut out = vec![];
    {
        let mut last = HashMap::new();
        for i in 1..=rounds {
            let r = one_round(nodes, &mut last, &changes, &check_held)?;
            eprintln!(
                "round {i}: {:.0} / {:.0} / {:.0} ms",
                r.promoted, r.keepalive, r.observer
            );
            out.push(r);
        }
    }
    drop(guard);
    let _ = session.close();
    Ok(out)
}

/// `| name | median | min | max |` of one column.
fn line(name: &str, mut values: Vec<f64>) -> String {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    let median = if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    };
    format!(
        "| {name} | {median:.0} | {:.0} | {:.0} |",
        values[0],
        values[n - 1]
    )
}

fn main() {
    let rounds = if std::env::var("QUICK").as_deref() == Ok("1") {
        1
    } else {
        4
    };
    let nodes = cluster::start(3, 1, &test_dir("bench-failover-rust"));
    let result = run(&nodes, rounds);
    drop(nodes);
    let rows = match result {
        Ok(rows) => rows,
        Err(e) => {
            eprintln!("failover_follow: {e}");
            std::process::exit(1);
        }
    };
    let server = std::process::Command::new(
        std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into()),
    )
    .arg("--version")
    .output()
    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    .unwrap_or_default();
    let server = server
        .split_whitespace()
        .nth(2)
        .unwrap_or("?")
        .trim_start_matches("v=")
        .to_string();
    let build = std::env::var("REDIS_LOCK_MODULE")
        .ok()
        .and_then(|m| {
            std::path::Path::new(&m)
                .parent()?
                .file_name()
                .map(|s| s.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "debug".into());
    let cores = thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "Rust client following a planned `CLUSTER FAILOVER` ({} round{}, Redis {server}, 3 masters + \
         3 replicas on one {cores}-core machine, module {build} build, session ttl 3 s, keepalive \
         every 0.2 s, each failover at a random point of that period; ms from the command's reply; no hold lost in any round). Keepalive: the new \
         master's `INFO commandstats` count of `lock.session|keepalive` first above its count \
         before the failover, polled every 2 ms. Observer: `client.watch(key)`'s first change \
         after the failover, the key taken on the new master by a raw `LOCK.ACQUIRE` as soon as \
         its `ROLE` said master (this client reports only a state that differs from the last).",
        rows.len(),
        if rows.len() == 1 { "" } else { "s" }
    );
    println!();
    println!("| from `CLUSTER FAILOVER` answered to | median ms | min | max |");
    println!("|---|---|---|---|");
    println!(
        "{}",
        line(
            "the replica's `ROLE` is master",
            rows.iter().map(|r| r.promoted).collect()
        )
    );
    println!(
        "{}",
        line(
            "the session's first keepalive answered by the new master",
            rows.iter().map(|r| r.keepalive).collect()
        )
    );
    println!(
        "{}",
        line(
            "the observer's first change read from the new master",
            rows.iter().map(|r| r.observer).collect()
        )
    );
}
