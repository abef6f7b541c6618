//! Redis Cluster nodes (each needs a free cluster-bus port at `port + 10000`) with the module
//! loaded, and `redis-cli --cluster create` over them.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::paths::{cli_bin, module_path, path_arg, server_bin};
use crate::wait::{fields, info_field, wait_for};
use crate::{Ports, Server};

/// How long a new cluster may take to agree on its topology (about a second when healthy).
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Start cluster node `i` (not yet part of a cluster) in `dir/node{i}`: `cluster-enabled`,
/// the module loaded, no persistence.
pub fn node(i: usize, dir: &Path) -> Server {
    let module = module_path();
    let server = server_bin();
    Server::spawn(
        &format!("cluster node {i}"),
        dir.join(format!("node{i}")),
        Ports::ClientAndBus,
        &server,
        |port, dir| {
            let port = port.to_string();
            let dir_arg = path_arg(dir);
            let log = path_arg(&dir.join("logfile"));
            [
                "--port",
                &port,
                "--bind",
                "127.0.0.1",
                "--dir",
                &dir_arg,
                "--logfile",
                &log,
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                // Nodes ping each other at least every half timeout; 5 s (not the default
                // 15 s) lets roles spread in about a second, while a node stalled by a busy
                // machine is still far from being failed.
                "--cluster-node-timeout",
                "5000",
                "--save",
                "",
                "--appendonly",
                "no",
                "--repl-diskless-sync-delay",
                "0",
                // DEBUG is off by default since 7.0; the atomic slot migration test holds a
                // migration open with DEBUG SLOTMIGRATION PREVENT-PAUSE (Valkey 9).
                "--enable-debug-command",
                "yes",
                "--loadmodule",
                &module,
            ]
            .iter()
            .map(|s| s.to_string())
            .collect()
        },
    )
}

/// `redis-cli --cluster create <nodes> --cluster-replicas <replicas> --cluster-yes`; panics
/// with its output if it fails.
pub fn create(nodes: &[Server], replicas: usize) {
    let out = Command::new(cli_bin())
        .args(["--cluster", "create"])
        .args(nodes.iter().map(Server::addr))
        .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", cli_bin()));
    assert!(
        out.status.success(),
        "redis-cli --cluster create failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A cluster of `masters` masters with `replicas` replicas each, in `dir`: the nodes started,
/// the cluster created, and every node reporting `cluster_state:ok` with all slots assigned,
/// seeing every replica as one and no node failing or still joining, every replica's link up.
pub fn start(masters: usize, replicas: usize, dir: &Path) -> Vec<Server> {
    let total = masters * (1 + replicas);
    let nodes: Vec<Server> = (0..total).map(|i| node(i, dir)).collect();
    create(&nodes, replicas);
    for n in &nodes {
        let mut c = n.conn();
        wait_for("the cluster to settle", PATIENCE, || {
            let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut c).ok()?;
            let view: String = redis::cmd("CLUSTER").arg("NODES").query(&mut c).ok()?;
            let flags: Vec<&str> = view
                .lines()
                .filter_map(|l| l.split_whitespace().nth(2))
                .collect();
            let ok = fields(&info).any(|f| f == ("cluster_state", "ok"))
                && fields(&info).any(|f| f == ("cluster_slots_assigned", "16384"))
                && flags.len() == total
                && flags.iter().filter(|f| f.contains("slave")).count() == masters * replicas
                && !flags.iter().any(|f| {
                    ["fail", "handshake", "noaddr"]
                        .iter()
                        .any(|bad| f.contains(bad))
                });
            let linked = info_field(&mut c, "replication", "role").as_deref() == Some("master")
                || info_field(&mut c, "replication", "master_link_status").as_deref() == Some("up");
            (ok && linked).then_some(())
        });
    }
    nodes
}
