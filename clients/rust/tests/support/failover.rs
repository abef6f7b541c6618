//! What the cluster failover tests (`cluster_failover.rs`, planned; `cluster_killed_master.rs`)
//! read off the nodes: roles, a tag's shard, `LOCK.INFO` and `LOCK.SESSION INFO`, shard
//! channels.

use std::time::Duration;

use redis::Value;

use super::Server;

pub const PATIENCE: Duration = Duration::from_secs(30);

pub fn role(server: &Server) -> String {
    let role: Vec<Value> = redis::cmd("ROLE").query(&mut server.conn()).expect("ROLE");
    match &role[0] {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        other => format!("{other:?}"),
    }
}

/// The port of the master `server` (a replica) follows.
pub fn master_of(server: &Server) -> Option<u16> {
    let role: Vec<Value> = redis::cmd("ROLE").query(&mut server.conn()).ok()?;
    match role.as_slice() {
        [Value::BulkString(kind), _, Value::Int(port), ..] if kind == b"slave" => {
            Some(*port as u16)
        }
        _ => None,
    }
}

/// The nodes of `tag`'s shard in a cluster of masters with one replica each, as indices into
/// `nodes`: its master, that master's replica, and another master (a seed that outlives a kill
/// of the first).
pub fn shard_of(nodes: &[Server], tag: &str) -> (usize, usize, usize) {
    let old = nodes
        .iter()
        .position(|n| {
            role(n) == "master" && {
                let r: redis::RedisResult<Value> =
                    redis::cmd("LOCK.FENCE").arg(tag).query(&mut n.conn());
                r.is_ok()
            }
        })
        .expect("the tag's master");
    let new = nodes
        .iter()
        .position(|n| master_of(n) == Some(nodes[old].port()))
        .expect("its replica");
    let seed = nodes
        .iter()
        .position(|n| role(n) == "master" && n.port() != nodes[old].port())
        .expect("another master");
    (old, new, seed)
}

/// `LOCK.INFO key` on one node: the holders' tokens and the number of waiters.
pub fn info(server: &Server, key: &str) -> (Vec<u64>, i64) {
    let reply: Value = redis::cmd("LOCK.INFO")
        .arg(key)
        .query(&mut server.conn())
        .unwrap();
    let pairs = |v: &Value| -> Vec<(String, Value)> {
        let items = match v {
            Value::Array(items) => items.clone(),
            Value::Map(pairs) => pairs
                .iter()
                .flat_map(|(k, v)| [k.clone(), v.clone()])
                .collect(),
            _ => vec![],
        };
        items
            .chunks(2)
            .map(|p| match &p[0] {
                Value::BulkString(k) => (String::from_utf8_lossy(k).into_owned(), p[1].clone()),
                other => (format!("{other:?}"), p[1].clone()),
            })
            .collect()
    };
    if reply == Value::Nil {
        return (vec![], 0);
    }
    let fields = pairs(&reply);
    let mut tokens = vec![];
    let mut waiters = 0;
    for (k, v) in &fields {
        match (k.as_str(), v) {
            ("waiters", Value::Int(n)) => waiters = *n,
            ("holders", Value::Array(holders)) => {
                for h in holders {
                    for (hk, hv) in pairs(h) {
                        if let ("token", Value::Int(t)) = (hk.as_str(), hv) {
                            tokens.push(t as u64);
                        }
                    }
                }
            }
            _ => {}
        }
    }
    (tokens, waiters)
}

/// Whether `LOCK.SESSION INFO id` on `server` shows the session bound to a connection there.
pub fn attached(server: &Server, id: &str) -> bool {
    let reply: Value = redis::cmd("LOCK.SESSION")
        .arg("INFO")
        .arg(id)
        .query(&mut server.conn())
        .unwrap();
    match reply {
        Value::Array(items) => items
            .chunks(2)
            .any(|p| p[0] == Value::BulkString(b"bound".to_vec()) && p[1] != Value::Nil),
        Value::Map(pairs) => pairs
            .iter()
            .any(|(k, v)| *k == Value::BulkString(b"bound".to_vec()) && *v != Value::Nil),
        _ => false,
    }
}

/// The shard channels `server` has subscribers on (`PUBSUB SHARDCHANNELS`).
pub fn shard_channels(server: &Server) -> usize {
    let channels: Vec<Value> = redis::cmd("PUBSUB")
        .arg("SHARDCHANNELS")
        .query(&mut server.conn())
        .unwrap();
    channels.len()
}
