//! The cluster under test: six nodes started, joined with `redis-cli --cluster create`, and
//! their topology (which master owns which slots, which replica follows it) read back from
//! `CLUSTER NODES`.

use super::*;

/// One master and its replica, as `CLUSTER NODES` describes them.
pub struct Shard {
    /// Index of the master in [`Cluster::nodes`].
    pub master: usize,
    /// The master's node id (for `CLUSTER SETSLOT`).
    pub master_id: String,
    /// Index of its replica in [`Cluster::nodes`].
    pub replica: usize,
    /// The slot ranges it serves (inclusive).
    pub slots: Vec<(u16, u16)>,
}

/// A running cluster; dropping it stops every node.
pub struct Cluster {
    /// The six processes, in the order given to `redis-cli --cluster create`.
    pub nodes: Vec<Node>,
    /// The shards, ordered by their first slot.
    pub shards: Vec<Shard>,
    /// The directory holding each node's own directory.
    pub dir: PathBuf,
}

/// One node's line of `CLUSTER NODES`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct NodeLine {
    pub port: u16,
    pub id: String,
    pub master: bool,
    /// For a replica: its master's id.
    pub master_id: Option<String>,
    /// Stable slot ranges (the `[slot->-id]` migration markers left out).
    pub slots: Vec<(u16, u16)>,
    /// Flags that mean the cluster has not settled (`fail`, `fail?`, `handshake`, `noaddr`).
    pub unsettled: bool,
}

impl Cluster {
    /// Start six nodes, create the cluster, and wait until every node agrees on the same
    /// topology with `cluster_state:ok` and every replica's link is up.
    pub fn start() -> Cluster {
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
    pub fn wait_converged(&self, accept: impl Fn(&[NodeLine]) -> bool) -> Vec<NodeLine> {
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
    pub fn master(&self, s: usize) -> Connection {
        self.nodes[self.shards[s].master].conn()
    }

    /// Shard `s`'s master.
    pub fn master_node(&self, s: usize) -> &Node {
        &self.nodes[self.shards[s].master]
    }

    /// A connection to shard `s`'s replica.
    pub fn replica(&self, s: usize) -> Connection {
        self.nodes[self.shards[s].replica].conn()
    }

    /// The shard serving `slot`, as read at start.
    pub fn shard_of(&self, slot: u16) -> usize {
        self.shards
            .iter()
            .position(|s| s.slots.iter().any(|&(a, b)| (a..=b).contains(&slot)))
            .unwrap_or_else(|| panic!("no shard serves slot {slot}"))
    }

    /// `n` keys `<prefix>:<i>` served by shard `s`, each in a slot of its own.
    pub fn keys_on(&self, conn: &mut Connection, s: usize, n: usize, prefix: &str) -> Vec<String> {
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
