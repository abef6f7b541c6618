//! Redis Cluster: six `redis-server` processes (3 masters, 3 replicas), the module loaded on
//! every node, created with `redis-cli --cluster create ... --cluster-replicas 1`.
//!
//! - Locks on keys of every master are acquired, waited for, handed off and released on the
//!   owning master, and each master's replica answers `LOCK.FENCE`/`LOCK.INFO` as it does.
//! - A lock command sent to the wrong node gets the same `MOVED` (or `ASK`) as `SET`/`GET` on the
//!   same key; transactions and scripts over keys of two slots get the same `CROSSSLOT` as
//!   built-in commands (`LOCK.MACQUIRE`/`LOCK.MRELEASE` over two slots: the same as `MSET`).
//! - Waiters whose key's slot is migrated away get an error or a redirect instead of hanging,
//!   and the migrated lock keeps exactly one owner, on exactly one node.
//! - `throughput_one_master_vs_three` (ignored: a measurement, not a check) prints the aggregate
//!   acquire/release rate with every client on one master, then spread over three.
//!
//! Each test starts its own cluster; one at a time, to keep the machine light. No client-side
//! cluster support: the tests route by `CLUSTER KEYSLOT` and the topology read from
//! `CLUSTER NODES`, and look at the redirect errors themselves.

mod common;
mod nodes;

use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Barrier, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use common::{acquire, fence, fence_check, must_acquire, release};
use nodes::Node;
use redis::{Connection, RedisError, RedisResult, Value};

const MASTERS: usize = 3;
const NODES: usize = 6;

/// A ttl long enough that no hold expires during a test.
const LONG_TTL: i64 = 100_000;

/// How long the cluster may take to reach an observable state (convergence, a replica link,
/// a blocked client). A healthy run never comes near it.
const PATIENCE: Duration = Duration::from_secs(30);

/// How long a waiter whose slot moved away may take to be answered.
const PROMPT: Duration = Duration::from_secs(5);

/// Six servers per test is plenty for a 2-core machine: the tests take turns.
static ONE_CLUSTER_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    ONE_CLUSTER_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

// --- The cluster ----------------------------------------------------------------

/// One master and its replica, as `CLUSTER NODES` describes them.
struct Shard {
    /// Index of the master in [`Cluster::nodes`].
    master: usize,
    /// The master's node id (for `CLUSTER SETSLOT`).
    master_id: String,
    /// Index of its replica in [`Cluster::nodes`].
    replica: usize,
    /// The slot ranges it serves (inclusive).
    slots: Vec<(u16, u16)>,
}

/// A running cluster; dropping it stops every node.
struct Cluster {
    /// The six processes, in the order given to `redis-cli --cluster create`.
    nodes: Vec<Node>,
    /// The shards, ordered by their first slot.
    shards: Vec<Shard>,
    /// The directory holding each node's own directory.
    dir: PathBuf,
}

/// One node's line of `CLUSTER NODES`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct NodeLine {
    port: u16,
    id: String,
    master: bool,
    /// For a replica: its master's id.
    master_id: Option<String>,
    /// Stable slot ranges (the `[slot->-id]` migration markers left out).
    slots: Vec<(u16, u16)>,
    /// Flags that mean the cluster has not settled (`fail`, `fail?`, `handshake`, `noaddr`).
    unsettled: bool,
}

impl Cluster {
    /// Start six nodes, create the cluster, and wait until every node agrees on the same
    /// topology with `cluster_state:ok` and every replica's link is up.
    fn start() -> Cluster {
        let dir = nodes::test_dir("cluster");
        let nodes: Vec<Node> = (0..NODES).map(|i| nodes::cluster::node(i, &dir)).collect();
        nodes::cluster::create(&nodes, 1);
        let mut cluster = Cluster {
            nodes,
            shards: Vec::new(),
            dir,
        };

        let view = cluster.wait_converged(|_| true);
        let port_index = |port: u16| {
            cluster
                .nodes
                .iter()
                .position(|n| n.port() == port)
                .expect("a node the cluster knows but we did not start")
        };
        let mut shards: Vec<Shard> = view
            .iter()
            .filter(|n| n.master)
            .map(|m| {
                let replica = view
                    .iter()
                    .find(|r| r.master_id.as_deref() == Some(m.id.as_str()))
                    .unwrap_or_else(|| panic!("master {} has no replica: {view:?}", m.port));
                Shard {
                    master: port_index(m.port),
                    master_id: m.id.clone(),
                    replica: port_index(replica.port),
                    slots: m.slots.clone(),
                }
            })
            .collect();
        shards.sort_by_key(|s| s.slots.first().copied());
        assert_eq!(shards.len(), MASTERS, "masters in {view:?}");
        cluster.shards = shards;

        for shard in &cluster.shards {
            let mut r = cluster.nodes[shard.replica].conn();
            nodes::wait_for("a replica's link to its master", PATIENCE, || {
                (nodes::info_field(&mut r, "replication", "master_link_status").as_deref()
                    == Some("up"))
                .then_some(())
            });
        }
        cluster
    }

    /// Wait until every node reports `cluster_state:ok` and all six `CLUSTER NODES` views are
    /// the same settled topology for which `accept` holds; return that view.
    fn wait_converged(&self, accept: impl Fn(&[NodeLine]) -> bool) -> Vec<NodeLine> {
        let mut conns: Vec<Connection> = self.nodes.iter().map(Node::conn).collect();
        nodes::wait_for("the cluster to converge", PATIENCE, || {
            let mut views = Vec::new();
            for c in conns.iter_mut() {
                let info: String = redis::cmd("CLUSTER").arg("INFO").query(c).ok()?;
                let ok = nodes::fields(&info).any(|f| f == ("cluster_state", "ok"))
                    && nodes::fields(&info).any(|f| f == ("cluster_slots_assigned", "16384"))
                    && nodes::fields(&info).any(|f| f == ("cluster_known_nodes", "6"));
                if !ok {
                    return None;
                }
                let text: String = redis::cmd("CLUSTER").arg("NODES").query(c).ok()?;
                views.push(parse_cluster_nodes(&text));
            }
            let first = views[0].clone();
            let settled = first.iter().all(|n| !n.unsettled)
                && views.iter().all(|v| *v == first)
                && accept(&first);
            settled.then_some(first)
        })
    }

    /// A connection to shard `s`'s master.
    fn master(&self, s: usize) -> Connection {
        self.nodes[self.shards[s].master].conn()
    }

    /// Shard `s`'s master.
    fn master_node(&self, s: usize) -> &Node {
        &self.nodes[self.shards[s].master]
    }

    /// A connection to shard `s`'s replica.
    fn replica(&self, s: usize) -> Connection {
        self.nodes[self.shards[s].replica].conn()
    }

    /// The shard serving `slot`, as read at start.
    fn shard_of(&self, slot: u16) -> usize {
        self.shards
            .iter()
            .position(|s| s.slots.iter().any(|&(a, b)| (a..=b).contains(&slot)))
            .unwrap_or_else(|| panic!("no shard serves slot {slot}"))
    }

    /// `n` keys `<prefix>:<i>` served by shard `s`, each in a slot of its own.
    fn keys_on(&self, conn: &mut Connection, s: usize, n: usize, prefix: &str) -> Vec<String> {
        let mut keys = Vec::new();
        let mut slots = BTreeSet::new();
        for i in 0.. {
            let key = format!("{prefix}:{i}");
            let slot = keyslot(conn, &key);
            if self.shard_of(slot) == s && slots.insert(slot) {
                keys.push(key);
                if keys.len() == n {
                    break;
                }
            }
        }
        keys
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Each node kills its process and removes (or, on failure, keeps) its directory.
        self.nodes.clear();
        if !thread::panicking() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// Parse `CLUSTER NODES`: `<id> <ip:port@cport> <flags> <master> <ping> <pong> <epoch> <link>
/// <slot>...`, sorted by port.
fn parse_cluster_nodes(text: &str) -> Vec<NodeLine> {
    let mut lines: Vec<NodeLine> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let addr = f[1].split(['@', ',']).next().unwrap_or_default();
            let port = addr
                .rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("bad address in CLUSTER NODES line {line:?}"));
            let flags: Vec<&str> = f[2].split(',').collect();
            let slots = f[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .map(|s| {
                    let (a, b) = s.split_once('-').unwrap_or((s, s));
                    (a.parse().expect("slot"), b.parse().expect("slot"))
                })
                .collect();
            NodeLine {
                port,
                id: f[0].to_string(),
                master: flags.contains(&"master"),
                master_id: (f[3] != "-").then(|| f[3].to_string()),
                slots,
                unsettled: flags
                    .iter()
                    .any(|fl| ["fail", "fail?", "handshake", "noaddr"].contains(fl)),
            }
        })
        .collect();
    lines.sort();
    lines
}

// --- Helpers ----------------------------------------------------------------------

/// `CLUSTER KEYSLOT key`.
fn keyslot(conn: &mut Connection, key: &str) -> u16 {
    redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query(conn)
        .expect("CLUSTER KEYSLOT")
}

/// Run a command given as words and return the raw reply.
fn run(conn: &mut Connection, words: &[&str]) -> RedisResult<Value> {
    let mut cmd = redis::cmd(words[0]);
    for w in &words[1..] {
        cmd.arg(*w);
    }
    cmd.query(conn)
}

/// An error reply as the server sent it (`MOVED 3999 127.0.0.1:7001`); panics on a non-error.
#[track_caller]
fn error_text(what: &str, reply: RedisResult<Value>) -> String {
    match reply {
        Err(e) => match (e.code(), e.detail()) {
            (Some(code), Some(detail)) => format!("{code} {detail}"),
            (Some(code), None) => code.to_string(),
            _ => format!("{e}"),
        },
        Ok(v) => panic!("{what}: expected an error reply, got {v:?}"),
    }
}

/// Any reply, errors included, as text for comparisons and messages: `OK`, `QUEUED`, `42`,
/// `nil`, `[1, 2]`, `MOVED 3999 127.0.0.1:7001`.
fn reply_text(reply: RedisResult<Value>) -> String {
    match reply {
        Err(e) => match (e.code(), e.detail()) {
            (Some(code), Some(detail)) => format!("{code} {detail}"),
            (Some(code), None) => code.to_string(),
            _ => format!("{e}"),
        },
        Ok(v) => value_text(&v),
    }
}

fn value_text(v: &Value) -> String {
    match v {
        Value::Nil => "nil".to_string(),
        Value::Int(n) => n.to_string(),
        Value::Okay => "OK".to_string(),
        Value::SimpleString(s) => s.clone(),
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(value_text).collect();
            format!("[{}]", items.join(", "))
        }
        other => format!("{other:?}"),
    }
}

fn int_field(conn: &mut Connection, section: &str, field: &str) -> i64 {
    let value = nodes::info_field(conn, section, field)
        .unwrap_or_else(|| panic!("INFO {section} has no {field}"));
    value
        .parse()
        .unwrap_or_else(|e| panic!("INFO {section} {field} = {value:?}: {e}"))
}

fn blocked_clients(conn: &mut Connection) -> i64 {
    int_field(conn, "clients", "blocked_clients")
}

/// Wait until the node behind `conn` has exactly `n` blocked clients.
fn wait_blocked(conn: &mut Connection, n: i64) {
    nodes::wait_for(&format!("{n} blocked clients"), PATIENCE, || {
        (blocked_clients(conn) == n).then_some(())
    });
}

/// `WAIT 1 1000`: how many replicas acknowledged every write so far.
fn wait_one_replica(conn: &mut Connection) -> i64 {
    redis::cmd("WAIT")
        .arg(1)
        .arg(1000)
        .query(conn)
        .expect("WAIT 1 1000")
}

/// `CLUSTER COUNTKEYSINSLOT slot`: the keys this node itself holds in `slot`.
fn keys_in_slot(conn: &mut Connection, slot: u16) -> i64 {
    redis::cmd("CLUSTER")
        .arg("COUNTKEYSINSLOT")
        .arg(slot)
        .query(conn)
        .expect("CLUSTER COUNTKEYSINSLOT")
}

/// `LOCK.INFO key` as (owner, token, waiters), `None` for nil.
fn lock_info(conn: &mut Connection, key: &str) -> Option<(String, i64, i64)> {
    match redis::cmd("LOCK.INFO").arg(key).query(conn) {
        Ok(Value::Nil) => None,
        Ok(Value::Array(items)) => {
            let mut owner = None;
            let (mut token, mut waiters) = (None, None);
            for pair in items.chunks(2) {
                match (&pair[0], &pair[1]) {
                    (Value::BulkString(f), Value::BulkString(v)) if f == b"owner" => {
                        owner = Some(String::from_utf8_lossy(v).into_owned())
                    }
                    (Value::BulkString(f), Value::Int(n)) if f == b"token" => token = Some(*n),
                    (Value::BulkString(f), Value::Int(n)) if f == b"waiters" => waiters = Some(*n),
                    _ => {}
                }
            }
            match (owner, token, waiters) {
                (Some(o), Some(t), Some(w)) => Some((o, t, w)),
                _ => panic!("LOCK.INFO {key}: incomplete reply {items:?}"),
            }
        }
        other => panic!("LOCK.INFO {key}: expected an array or nil, got {other:?}"),
    }
}

/// A blocked `LOCK.ACQUIRE key owner ttl BLOCK block_ms` on its own thread and connection to
/// `port`. The receiver gets the reply and when it came. With `follow_moved`, a `MOVED` reply
/// is followed (once per hop, up to 3 hops) the way a cluster client would.
fn spawn_waiter(
    port: u16,
    key: &str,
    owner: &str,
    block_ms: i64,
    follow_moved: bool,
) -> Receiver<(RedisResult<Value>, Instant)> {
    let (tx, rx) = mpsc::channel();
    let (key, owner) = (key.to_string(), owner.to_string());
    thread::spawn(move || {
        let mut port = port;
        let mut reply;
        let mut hops = 0;
        loop {
            let mut conn = nodes::connect(port);
            conn.set_read_timeout(Some(Duration::from_millis(block_ms as u64) + PATIENCE))
                .expect("set_read_timeout");
            reply = redis::cmd("LOCK.ACQUIRE")
                .arg(&key)
                .arg(&owner)
                .arg(LONG_TTL)
                .arg("BLOCK")
                .arg(block_ms)
                .query(&mut conn);
            match &reply {
                Err(e) if follow_moved && e.code() == Some("MOVED") && hops < 3 => {
                    hops += 1;
                    port = redirect_port(e).expect("MOVED without an address");
                }
                _ => break,
            }
        }
        let _ = tx.send((reply, Instant::now()));
    });
    rx
}

/// The port of the node a `MOVED <slot> <host>:<port>` (or `ASK`) error names.
fn redirect_port(e: &RedisError) -> Option<u16> {
    let (_slot, addr) = e.detail()?.split_once(' ')?;
    addr.rsplit_once(':')?.1.parse().ok()
}

/// Send `words` to `port`, following `MOVED` like a cluster client (up to 3 hops).
fn run_routed(port: u16, words: &[&str]) -> RedisResult<Value> {
    let mut port = port;
    for _ in 0..3 {
        let reply = run(&mut nodes::connect(port), words);
        match reply {
            Err(ref e) if e.code() == Some("MOVED") => {
                port = redirect_port(e).expect("MOVED without an address")
            }
            _ => return reply,
        }
    }
    panic!("{words:?}: more than 3 MOVED hops");
}

// --- Tests ----------------------------------------------------------------------------

/// On every master: acquire, refuse a second owner, queue a waiter on the owning master, hand
/// off on release, release; the master's replica (`READONLY`, after `WAIT 1`) answers
/// `LOCK.FENCE` and `LOCK.INFO` as the master does, and redirects writes like `SET`.
#[test]
fn locks_on_every_master_block_hand_off_release_and_reach_the_replicas() {
    let _turn = one_at_a_time();
    let cluster = Cluster::start();
    let mut any = cluster.nodes[0].conn();
    let keys: Vec<Vec<String>> = (0..MASTERS)
        .map(|s| cluster.keys_on(&mut any, s, 2, "job"))
        .collect();
    let mut masters: Vec<Connection> = (0..MASTERS).map(|s| cluster.master(s)).collect();

    // Holders on every master.
    let mut first = Vec::new();
    for (s, shard_keys) in keys.iter().enumerate() {
        for key in shard_keys {
            let token = must_acquire(&mut masters[s], key, "holder", LONG_TTL);
            assert_eq!(acquire(&mut masters[s], key, "other", LONG_TTL), None);
            first.push((s, key.clone(), token));
        }
    }

    // One waiter per key, each on the master that owns the key.
    let waiters: Vec<_> = first
        .iter()
        .map(|(s, key, _)| {
            let port = cluster.master_node(*s).port();
            spawn_waiter(port, key, &format!("waiter-{key}"), 20_000, false)
        })
        .collect();
    for (s, m) in masters.iter_mut().enumerate() {
        wait_blocked(m, keys[s].len() as i64);
    }
    for (s, key, token) in &first {
        assert_eq!(
            lock_info(&mut masters[*s], key),
            Some(("holder".to_string(), *token, 1)),
            "LOCK.INFO {key} with one waiter"
        );
    }

    // Release: each lock goes to its waiter, with a larger token.
    for (s, key, _) in &first {
        assert_eq!(release(&mut masters[*s], key, "holder"), 1);
    }
    let mut handed = Vec::new();
    for ((s, key, old), rx) in first.into_iter().zip(waiters) {
        let (reply, _) = rx
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|_| panic!("the waiter on {key} was not answered"));
        let token = match reply {
            Ok(Value::Int(t)) => t,
            other => panic!("the waiter on {key}: expected a token, got {other:?}"),
        };
        assert!(token > old, "{key}: handoff token {token} <= {old}");
        let owner = format!("waiter-{key}");
        assert_eq!(
            lock_info(&mut masters[s], &key),
            Some((owner.clone(), token, 0))
        );
        handed.push((s, key, owner, token));
    }

    // Each replica matches its master once WAIT says it has the writes.
    for (s, m) in masters.iter_mut().enumerate() {
        assert!(wait_one_replica(m) >= 1, "WAIT 1 1000 on master {s}");
    }
    for (s, key, owner, token) in &handed {
        let master_addr = cluster.master_node(*s).addr();
        let mut r = cluster.replica(*s);
        let slot = keyslot(&mut r, key);
        // Without READONLY a replica redirects reads to its master, as for GET.
        let moved = format!("MOVED {slot} {master_addr}");
        assert_eq!(
            error_text("LOCK.FENCE", run(&mut r, &["LOCK.FENCE", key])),
            moved
        );
        assert_eq!(error_text("GET", run(&mut r, &["GET", key])), moved);
        let _: () = redis::cmd("READONLY").query(&mut r).expect("READONLY");
        assert_eq!(
            fence(&mut r, key),
            Some(*token),
            "LOCK.FENCE on the replica"
        );
        assert_eq!(fence_check(&mut r, key, *token), 1);
        assert_eq!(lock_info(&mut r, key), Some((owner.clone(), *token, 0)));
        // Writes go to the master even with READONLY, as for SET.
        assert_eq!(
            error_text(
                "LOCK.ACQUIRE on a replica",
                run(&mut r, &["LOCK.ACQUIRE", key, "x", "1000"])
            ),
            error_text("SET on a replica", run(&mut r, &["SET", key, "v"]))
        );
        assert_eq!(
            error_text(
                "LOCK.RELEASE on a replica",
                run(&mut r, &["LOCK.RELEASE", key, owner])
            ),
            moved
        );
    }

    // Release everything; the replicas follow.
    for (s, key, owner, _) in &handed {
        assert_eq!(release(&mut masters[*s], key, owner.as_str()), 1);
    }
    for (s, m) in masters.iter_mut().enumerate() {
        assert!(wait_one_replica(m) >= 1, "WAIT 1 1000 on master {s}");
        assert_eq!(int_field(m, "lock", "lock_locks"), 0);
        assert_eq!(int_field(m, "lock", "lock_waiters"), 0);
        assert_eq!(
            int_field(m, "lock", "lock_handed_off"),
            keys[s].len() as i64
        );
        let mut r = cluster.replica(s);
        assert_eq!(int_field(&mut r, "lock", "lock_locks"), 0, "replica {s}");
    }
}

/// A lock command on the wrong node gets exactly the `MOVED` a built-in command on the same key
/// gets; a blocking one too, without blocking. `CROSSSLOT` comes only from transactions and
/// scripts over two slots, and is the same as for `SET`/`GET`.
#[test]
fn wrong_node_and_cross_slot_errors_are_those_of_built_in_commands() {
    let _turn = one_at_a_time();
    let cluster = Cluster::start();
    let mut any = cluster.nodes[0].conn();

    // MOVED, from every other master, for every lock command.
    for s in 0..MASTERS {
        let key = &cluster.keys_on(&mut any, s, 1, "moved")[0];
        let slot = keyslot(&mut any, key);
        let moved = format!("MOVED {slot} {}", cluster.master_node(s).addr());
        for other in (0..MASTERS).filter(|&o| o != s) {
            let mut c = cluster.master(other);
            let pairs: [(&[&str], &[&str]); 5] = [
                (&["LOCK.ACQUIRE", key, "a", "1000"], &["SET", key, "v"]),
                (
                    &["LOCK.ACQUIRE", key, "a", "1000", "BLOCK", "0"],
                    &["BLPOP", key, "0"],
                ),
                (&["LOCK.RELEASE", key, "a"], &["DEL", key]),
                (
                    &["LOCK.EXTEND", key, "a", "1000"],
                    &["PEXPIRE", key, "1000"],
                ),
                (&["LOCK.FENCE", key], &["GET", key]),
            ];
            for (lock_cmd, builtin) in pairs {
                let ours = error_text(lock_cmd[0], run(&mut c, lock_cmd));
                assert_eq!(ours, moved, "{lock_cmd:?} on master {other}");
                assert_eq!(error_text(builtin[0], run(&mut c, builtin)), moved);
            }
            assert_eq!(
                error_text("LOCK.INFO", run(&mut c, &["LOCK.INFO", key])),
                moved
            );
            assert_eq!(
                blocked_clients(&mut c),
                0,
                "a redirected BLOCK must not block"
            );
        }
        // The owner serves it.
        let mut m = cluster.master(s);
        must_acquire(&mut m, key, "a", 10_000);
        assert_eq!(release(&mut m, key, "a"), 1);
    }

    // Two keys of one master, in different slots.
    let [k1, k2]: [String; 2] = cluster
        .keys_on(&mut any, 0, 2, "crossslot")
        .try_into()
        .unwrap();
    let remote = &cluster.keys_on(&mut any, 1, 1, "crossslot-remote")[0];
    let mut m = cluster.master(0);
    let transaction = |c: &mut Connection, cmds: &[&[&str]]| -> Vec<String> {
        let mut out = vec![reply_text(run(c, &["MULTI"]))];
        out.extend(cmds.iter().map(|cmd| reply_text(run(c, cmd))));
        out.push(reply_text(run(c, &["EXEC"])));
        out
    };
    let crossslot = "CROSSSLOT Keys in request don't hash to the same slot";
    let locks = transaction(
        &mut m,
        &[
            &["LOCK.ACQUIRE", &k1, "a", "10000"],
            &["LOCK.ACQUIRE", &k2, "a", "10000"],
        ],
    );
    let sets = transaction(&mut m, &[&["SET", &k1, "v"], &["SET", &k2, "v"]]);
    assert_eq!(locks, sets, "MULTI over two slots: lock vs SET");
    assert_eq!(locks, ["OK", "QUEUED", "QUEUED", crossslot]);
    let mixed = transaction(
        &mut m,
        &[&["LOCK.ACQUIRE", &k1, "a", "10000"], &["SET", &k2, "v"]],
    );
    assert_eq!(mixed, ["OK", "QUEUED", "QUEUED", crossslot]);
    assert_eq!(
        fence(&mut m, &k1),
        None,
        "nothing of a CROSSSLOT EXEC applies"
    );

    // A key of another master inside MULTI: MOVED when queued, then EXECABORT, as for SET.
    let locks = transaction(
        &mut m,
        &[
            &["LOCK.ACQUIRE", &k1, "a", "10000"],
            &["LOCK.ACQUIRE", remote, "a", "10000"],
        ],
    );
    let sets = transaction(&mut m, &[&["SET", &k1, "v"], &["SET", remote, "v"]]);
    assert_eq!(locks, sets, "MULTI with a remote key: lock vs SET");
    assert_eq!(
        locks[3],
        "EXECABORT Transaction discarded because of previous errors."
    );
    assert_eq!(fence(&mut m, &k1), None);

    // One slot through a hash tag: the transaction runs.
    let (t1, t2) = ("{order:7}:a", "{order:7}:b");
    let tag_slot = keyslot(&mut any, t1);
    let mut tm = cluster.master(cluster.shard_of(tag_slot));
    let tagged = transaction(
        &mut tm,
        &[
            &["LOCK.ACQUIRE", t1, "a", "10000"],
            &["LOCK.ACQUIRE", t2, "a", "10000"],
        ],
    );
    assert!(
        tagged[3].starts_with('[') && !tagged[3].contains("nil"),
        "MULTI over one hash tag: {tagged:?}"
    );
    assert!(fence(&mut tm, t1).is_some() && fence(&mut tm, t2).is_some());

    // LOCK.MACQUIRE / LOCK.MRELEASE: the key specs (numkeys) let the server itself answer
    // CROSSSLOT for keys of two slots, as for MSET, and MOVED from a node that does not own
    // the slot; keys sharing a hash tag are taken and released together on their master.
    let multi: [&[&str]; 2] = [
        &["LOCK.MACQUIRE", "2", &k1, &k2, "a", "10000"],
        &["LOCK.MRELEASE", "2", &k1, &k2, "a"],
    ];
    for cmd in multi {
        assert_eq!(reply_text(run(&mut m, cmd)), crossslot, "{cmd:?}");
    }
    assert_eq!(
        reply_text(run(&mut m, &["MSET", &k1, "v", &k2, "v"])),
        crossslot
    );
    assert_eq!(fence(&mut m, &k1), None);
    let (o1, o2) = ("{order:8}:a", "{order:8}:b");
    let order_slot = keyslot(&mut any, o1);
    let order_shard = cluster.shard_of(order_slot);
    let mut other = cluster.master((order_shard + 1) % MASTERS);
    let moved = format!(
        "MOVED {order_slot} {}",
        cluster.master_node(order_shard).addr()
    );
    let take: &[&str] = &["LOCK.MACQUIRE", "2", o1, o2, "a", "10000"];
    assert_eq!(error_text("LOCK.MACQUIRE", run(&mut other, take)), moved);
    let mut om = cluster.master(order_shard);
    let tokens = reply_text(run(&mut om, take));
    assert!(
        tokens.starts_with('[') && !tokens.contains("nil"),
        "{tokens}"
    );
    assert!(fence(&mut om, o1).is_some() && fence(&mut om, o2).is_some());
    assert_eq!(
        reply_text(run(&mut om, &["LOCK.MRELEASE", "2", o1, o2, "a"])),
        "2"
    );
    assert_eq!(fence(&mut om, o1), None);

    // Scripts declaring keys of two slots.
    let script_over = |c: &mut Connection, command: &str| {
        let body = format!("return redis.call('{command}', KEYS[1])");
        reply_text(run(c, &["EVAL", &body, "2", &k1, &k2]))
    };
    assert_eq!(script_over(&mut m, "LOCK.FENCE"), crossslot);
    assert_eq!(script_over(&mut m, "GET"), crossslot);
    // A script touching a key it did not declare: on another master, refused as for SET; in
    // another slot of the same master, whatever the server does for SET (Redis 7.0 runs both).
    // The error names the script, so compare up to that.
    let undeclared = |c: &mut Connection, call: &str, key: &str| {
        let body = format!("return redis.call({call})");
        match run(c, &["EVAL", &body, "1", &k1, key]) {
            Ok(_) => "ran".to_string(),
            Err(e) => reply_text(Err(e))
                .split(" script:")
                .next()
                .unwrap_or_default()
                .to_string(),
        }
    };
    let lock_call = "'LOCK.ACQUIRE', ARGV[1], 'a', 1000";
    let set_call = "'SET', ARGV[1], 'v'";
    let ours = undeclared(&mut m, lock_call, remote);
    assert_eq!(
        ours,
        undeclared(&mut m, set_call, remote),
        "undeclared remote key"
    );
    assert!(ours.starts_with("ERR "), "undeclared remote key: {ours}");
    let [k3, k4]: [String; 2] = cluster
        .keys_on(&mut any, 0, 4, "crossslot")
        .split_off(2)
        .try_into()
        .unwrap();
    let ours = undeclared(&mut m, lock_call, &k3);
    let theirs = undeclared(&mut m, set_call, &k4);
    assert_eq!(ours, theirs, "undeclared key of another local slot");
    println!("a script touching an undeclared key of another slot on its node: {ours}");

    // The fenced write of the README works across keys that share a hash tag.
    let (lock_key, data_key) = ("{invoice:42}", "{invoice:42}:total");
    let mut im = cluster.master(cluster.shard_of(keyslot(&mut any, lock_key)));
    let token = must_acquire(&mut im, lock_key, "w", 10_000).to_string();
    let fenced_write = "if redis.call('LOCK.FENCE', KEYS[1], ARGV[1]) == 1 then \
                          return redis.call('SET', KEYS[2], ARGV[2]) \
                        end \
                        return redis.error_reply('STALE lock lost')";
    assert_eq!(
        reply_text(run(
            &mut im,
            &["EVAL", fenced_write, "2", lock_key, data_key, &token, "100"]
        )),
        "OK"
    );
    assert_eq!(reply_text(run(&mut im, &["GET", data_key])), "100");
}

/// Migrate the slot of a held lock with two waiters (`CLUSTER SETSLOT ... IMPORTING/MIGRATING`,
/// `MIGRATE`, `CLUSTER SETSLOT ... NODE`): the waiters on the old node are answered promptly
/// with an error or a redirect, never granted there; afterwards exactly one node has the key,
/// with the original holder and token, and a waiter that follows the redirect gets the lock
/// from the new node.
#[test]
fn waiters_of_a_migrated_slot_get_an_error_and_the_lock_keeps_one_owner() {
    let _turn = one_at_a_time();
    let cluster = Cluster::start();
    let mut any = cluster.nodes[0].conn();
    let (src, dst, third) = (0, 1, 2);
    let key = &cluster.keys_on(&mut any, src, 1, "migrating")[0];
    let slot = keyslot(&mut any, key);
    let (slot_arg, key_str) = (slot.to_string(), key.as_str());
    let src_node = cluster.master_node(src);
    let dst_node = cluster.master_node(dst);
    let (src_id, dst_id) = (
        &cluster.shards[src].master_id,
        &cluster.shards[dst].master_id,
    );
    let mut a = cluster.master(src);
    let mut b = cluster.master(dst);

    let token = must_acquire(&mut a, key, "holder", LONG_TTL);
    // Queued in a known order: w2 starts once w1 is blocked.
    let waiters: Vec<_> = ["w1", "w2"]
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let rx = spawn_waiter(src_node.port(), key, w, 20_000, false);
            wait_blocked(&mut a, i as i64 + 1);
            rx
        })
        .collect();
    assert_eq!(lock_info(&mut a, key), Some(("holder".into(), token, 2)));

    // Open the migration. While the key is still on the source, the source serves it.
    let ok = |reply: RedisResult<Value>, what: &str| {
        assert_eq!(reply_text(reply), "OK", "{what}");
    };
    ok(
        run(
            &mut b,
            &["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", src_id],
        ),
        "SETSLOT IMPORTING on the target",
    );
    ok(
        run(
            &mut a,
            &["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", dst_id],
        ),
        "SETSLOT MIGRATING on the source",
    );
    assert_eq!(acquire(&mut a, key, "other", LONG_TTL), None);

    // Move the key.
    let migrated_at = Instant::now();
    ok(
        run(
            &mut a,
            &[
                "MIGRATE",
                "127.0.0.1",
                &dst_node.port().to_string(),
                key_str,
                "0",
                "5000",
            ],
        ),
        "MIGRATE",
    );

    // The waiters: an error or a redirect, promptly; never a token from the old node.
    // (refused with an error or a redirect, what happened)
    let outcomes: Vec<(bool, String)> = waiters
        .into_iter()
        .zip(["w1", "w2"])
        .map(|(rx, w)| match rx.recv_timeout(PROMPT) {
            Ok((reply, at)) => {
                let after = at.duration_since(migrated_at).as_millis();
                let refused = matches!(&reply, Err(e)
                    if matches!(e.code(), Some("TRYAGAIN" | "MOVED" | "ASK")));
                let what = match reply {
                    Ok(Value::Int(t)) => {
                        format!("was GRANTED token {t} on the old node {}", src_node.addr())
                    }
                    Ok(Value::Nil) => "got nil (its BLOCK timeout)".to_string(),
                    other => format!("got {}", reply_text(other)),
                };
                (refused, format!("{w} {what}, {after} ms after the MIGRATE"))
            }
            Err(RecvTimeoutError::Timeout) => (
                false,
                format!("{w} was still blocked {PROMPT:?} after the MIGRATE"),
            ),
            Err(RecvTimeoutError::Disconnected) => (false, format!("{w}: its thread died")),
        })
        .collect();
    let outcomes_text: Vec<&str> = outcomes.iter().map(|(_, o)| o.as_str()).collect();
    if !outcomes.iter().all(|(refused, _)| *refused) {
        let (src_keys, dst_keys) = (keys_in_slot(&mut a, slot), keys_in_slot(&mut b, slot));
        let src_info = reply_text(run(&mut a, &["LOCK.INFO", key]));
        let _: RedisResult<Value> = run(&mut b, &["ASKING"]);
        let dst_info = reply_text(run(&mut b, &["LOCK.INFO", key]));
        panic!(
            "waiters of a migrated slot:\n  {}\nsource {} now holds {src_keys} key(s) in slot \
             {slot}, LOCK.INFO there: {src_info}; target {} holds {dst_keys}, LOCK.INFO there \
             (ASKING): {dst_info}",
            outcomes_text.join("\n  "),
            src_node.addr(),
            dst_node.addr(),
        );
    }
    println!("waiters after the MIGRATE: {outcomes_text:?}");
    assert_eq!(blocked_clients(&mut a), 0);
    assert_eq!(int_field(&mut a, "lock", "lock_waiters"), 0);

    // Mid-migration, the source answers ASK for the absent key, as for SET; the target serves
    // it after ASKING and redirects without.
    let ask = format!("ASK {slot} {}", dst_node.addr());
    assert_eq!(
        error_text(
            "LOCK.ACQUIRE",
            run(&mut a, &["LOCK.ACQUIRE", key, "x", "1000"])
        ),
        ask
    );
    assert_eq!(error_text("SET", run(&mut a, &["SET", key, "v"])), ask);
    assert_eq!(
        error_text("LOCK.FENCE", run(&mut b, &["LOCK.FENCE", key])),
        format!("MOVED {slot} {}", src_node.addr())
    );
    ok(run(&mut b, &["ASKING"]), "ASKING");
    assert_eq!(lock_info(&mut b, key), Some(("holder".into(), token, 0)));

    // Close the migration: target, source, and the third master.
    let node_cmd = ["CLUSTER", "SETSLOT", &slot_arg, "NODE", dst_id];
    ok(run(&mut b, &node_cmd), "SETSLOT NODE on the target");
    ok(run(&mut a, &node_cmd), "SETSLOT NODE on the source");
    ok(
        run(&mut cluster.master(third), &node_cmd),
        "SETSLOT NODE on the third master",
    );
    let dst_port = dst_node.port();
    cluster.wait_converged(|view| {
        view.iter()
            .any(|n| n.port == dst_port && n.slots.iter().any(|&(x, y)| (x..=y).contains(&slot)))
    });

    // Exactly one master holds the key, the target, with the original holder and token; each
    // replica has what its master has.
    for s in 0..MASTERS {
        let mut m = cluster.master(s);
        assert!(wait_one_replica(&mut m) >= 1, "WAIT 1 1000 on master {s}");
        let expected = i64::from(s == dst);
        assert_eq!(
            keys_in_slot(&mut m, slot),
            expected,
            "keys in slot {slot} on master {s}"
        );
        // WAIT counts a replica's acknowledgement, but one that the cluster's start had sent
        // into a full sync may still be loading it (seen once on Valkey 8.1): wait for it.
        let mut r = cluster.replica(s);
        common::wait_until(
            &format!("{expected} key(s) in slot {slot} on replica {s}"),
            std::time::Duration::from_secs(10),
            || {
                let n: redis::RedisResult<i64> = redis::cmd("CLUSTER")
                    .arg("COUNTKEYSINSLOT")
                    .arg(slot)
                    .query(&mut r);
                n == Ok(expected)
            },
        );
    }
    assert_eq!(lock_info(&mut b, key), Some(("holder".into(), token, 0)));
    assert_eq!(fence_check(&mut b, key, token), 1);
    let moved = format!("MOVED {slot} {}", dst_node.addr());
    assert_eq!(
        error_text(
            "LOCK.ACQUIRE",
            run(&mut a, &["LOCK.ACQUIRE", key, "x", "1000"])
        ),
        moved
    );
    assert_eq!(error_text("SET", run(&mut a, &["SET", key, "v"])), moved);

    // A waiter that retries from the old node follows MOVED, waits on the new one, and gets
    // the lock when the holder (also redirected) releases it.
    let retry = spawn_waiter(src_node.port(), key, "w1", 20_000, true);
    wait_blocked(&mut b, 1);
    assert_eq!(
        reply_text(run_routed(
            src_node.port(),
            &["LOCK.RELEASE", key, "holder"]
        )),
        "1"
    );
    let (reply, _) = retry.recv_timeout(PATIENCE).expect("the retried waiter");
    let next = match reply {
        Ok(Value::Int(t)) => t,
        other => panic!("the retried waiter: expected a token, got {other:?}"),
    };
    assert!(next > token, "token after the migration {next} <= {token}");
    assert_eq!(lock_info(&mut b, key), Some(("w1".into(), next, 0)));
    assert_eq!(release(&mut b, key, "w1"), 1);
}

/// Not a check: prints LOCK.ACQUIRE + LOCK.RELEASE cycles per second with every client thread
/// on one master, then with the same threads spread over the three masters, and what each
/// master's process spent in CPU for them.
///
/// `REDIS_LOCK_MODULE=$PWD/target/release/libredis_lock.so cargo test --release --test cluster
///  -- --ignored --nocapture throughput` (threads and seconds: `LOCK_BENCH_THREADS`,
/// `LOCK_BENCH_SECS`).
#[test]
#[ignore = "a measurement, not a check; run with --ignored --nocapture"]
fn throughput_one_master_vs_three() {
    let _turn = one_at_a_time();
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let threads = env("LOCK_BENCH_THREADS", 6) as usize;
    let secs = env("LOCK_BENCH_SECS", 3);
    let cores = thread::available_parallelism().map_or(0, |n| n.get());
    let cluster = Cluster::start();
    let mut any = cluster.nodes[0].conn();
    let keys: Vec<Vec<String>> = (0..MASTERS)
        .map(|s| cluster.keys_on(&mut any, s, threads, "bench"))
        .collect();

    println!(
        "\ncluster throughput: LOCK.ACQUIRE + LOCK.RELEASE cycles (2 commands each, one in \
         flight per connection), {threads} client threads, {secs} s per run"
    );
    println!(
        "machine: {cores} cores, shared by the client threads and all 6 servers (3 masters, \
         3 replicas); module {}",
        nodes::module_path()
    );
    for used in [1, MASTERS] {
        // Thread i drives shard i % used, on a key of its own.
        let plan: Vec<(usize, String)> = (0..threads)
            .map(|i| (i % used, keys[i % used][i].clone()))
            .collect();
        let cpu_before: Vec<f64> = cluster.nodes.iter().map(server_cpu).collect();
        let barrier = Barrier::new(threads);
        let started = Instant::now();
        let counts: Vec<u64> = thread::scope(|scope| {
            let handles: Vec<_> = plan
                .iter()
                .map(|(s, key)| {
                    let barrier = &barrier;
                    let port = cluster.master_node(*s).port();
                    scope.spawn(move || {
                        let mut c = nodes::connect(port);
                        let owner = format!("bench-{key}");
                        barrier.wait();
                        let end = Instant::now() + Duration::from_secs(secs);
                        let mut n = 0u64;
                        while Instant::now() < end {
                            must_acquire(&mut c, key, owner.as_str(), 10_000);
                            assert_eq!(release(&mut c, key, owner.as_str()), 1);
                            n += 1;
                        }
                        n
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let wall = started.elapsed().as_secs_f64();
        let cpu: Vec<f64> = cluster
            .nodes
            .iter()
            .zip(&cpu_before)
            .map(|(n, before)| server_cpu(n) - before)
            .collect();

        println!("\n{used} master(s) in use:");
        println!("  master  port   threads   cycles/s    cmds/s  master CPU  cmds per master CPU-s  replica CPU");
        let mut total = 0u64;
        for s in 0..used {
            let cycles: u64 = plan
                .iter()
                .zip(&counts)
                .filter(|((ps, _), _)| *ps == s)
                .map(|(_, n)| n)
                .sum();
            total += cycles;
            let shard = &cluster.shards[s];
            let (mcpu, rcpu) = (cpu[shard.master], cpu[shard.replica]);
            let cmds = 2.0 * cycles as f64;
            println!(
                "  {s:>6}  {:>5}  {:>7}  {:>9.0}  {:>8.0}  {:>9.0}%  {:>20.0}  {:>10.0}%",
                cluster.nodes[shard.master].port(),
                plan.iter().filter(|(ps, _)| *ps == s).count(),
                cycles as f64 / wall,
                cmds / wall,
                100.0 * mcpu / wall,
                cmds / mcpu,
                100.0 * rcpu / wall,
            );
        }
        let all_cpu: f64 = cpu.iter().sum();
        println!(
            "  total: {:.0} cycles/s = {:.0} cmds/s; {:.0} cmds/s per core of this {cores}-core \
             machine; all 6 servers used {:.2} cores",
            total as f64 / wall,
            2.0 * total as f64 / wall,
            2.0 * total as f64 / wall / cores.max(1) as f64,
            all_cpu / wall
        );
    }
}

/// `used_cpu_sys + used_cpu_user` of a node, in seconds.
fn server_cpu(node: &Node) -> f64 {
    let mut c = node.conn();
    ["used_cpu_sys", "used_cpu_user"]
        .iter()
        .map(|f| {
            nodes::info_field(&mut c, "cpu", f)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("INFO cpu {f}"))
        })
        .sum()
}
