//! Cluster and replication awareness for grants made outside a client's command.
//!
//! A command reaches this node only if the node serves the key's slot (Redis redirects it
//! otherwise). A grant from a timer or after a keyspace event has no such check: after
//! `MIGRATE` moved a held lock to another node, the key is absent here, and granting it to a
//! local waiter would make a second owner. So before such a grant, ask the server whether this
//! node still serves the slot and is not migrating it away. This runs only in cluster mode and
//! only for keys with waiters whose lock became free without a release, so its cost (a
//! `CLUSTER NODES`) does not touch the hot path.

use redis_module::{raw, Context, RedisValue};

use crate::redis::key;

/// True outside cluster mode, or when this node serves `key`'s slot and is not migrating it.
pub fn serves_key(ctx: *mut raw::RedisModuleCtx, key_name: &[u8]) -> bool {
    if key::context_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_CLUSTER == 0 {
        return true;
    }
    let ctx = Context::new(ctx);
    let slot = match ctx.call("CLUSTER", &[b"KEYSLOT".as_slice(), key_name]) {
        Ok(RedisValue::Integer(slot)) => slot,
        _ => return false,
    };
    let Some(nodes) = nodes(ctx.ctx) else {
        return false;
    };
    serves_slot(&nodes, slot)
}

/// The text of `CLUSTER NODES`.
pub fn nodes(ctx: *mut raw::RedisModuleCtx) -> Option<String> {
    let ctx = Context::new(ctx);
    match ctx.call("CLUSTER", &["NODES"]) {
        Ok(reply) => value_text(&reply),
        Err(_) => None,
    }
}

/// False when `min-replicas-to-write` is set and fewer good replicas are connected: the server
/// refuses writes (`NOREPLICAS`), and a grant made from a timer must be refused too, since it
/// would reach no replica and a failover could hand the lock to a second owner.
pub fn replicas_allow_writes(ctx: *mut raw::RedisModuleCtx) -> bool {
    let ctx = Context::new(ctx);
    let needed = match ctx.call("CONFIG", &["GET", "min-replicas-to-write"]) {
        Ok(RedisValue::Array(reply)) => reply.get(1).and_then(value_text),
        _ => None,
    };
    let needed: i64 = needed.and_then(|v| v.parse().ok()).unwrap_or(0);
    if needed == 0 {
        return true;
    }
    let info = match ctx.call("INFO", &["replication"]) {
        Ok(reply) => value_text(&reply).unwrap_or_default(),
        Err(_) => return false,
    };
    // Present only while min-replicas-to-write and min-replicas-max-lag are both set.
    let good = info
        .lines()
        .find_map(|line| line.strip_prefix("min_slaves_good_slaves:"))
        .map(|v| v.trim().parse::<i64>().unwrap_or(0));
    good.is_none_or(|good| good >= needed)
}

fn value_text(value: &RedisValue) -> Option<String> {
    match value {
        RedisValue::SimpleString(s) | RedisValue::BulkString(s) => Some(s.clone()),
        RedisValue::StringBuffer(b) => Some(String::from_utf8_lossy(b).into_owned()),
        RedisValue::BulkRedisString(s) => Some(s.to_string_lossy()),
        _ => None,
    }
}

/// True when this node's shard (this node if it is a primary, else its primary) serves
/// `slot` according to `CLUSTER NODES`. Migrating markers do not matter here.
pub fn shard_serves_slot(cluster_nodes: &str, slot: i64) -> bool {
    let lines: Vec<Vec<&str>> = cluster_nodes
        .lines()
        .map(|l| l.split(' ').collect())
        .collect();
    let Some(me) = lines
        .iter()
        .find(|f| f.get(2).is_some_and(|flags| flags.contains("myself")))
    else {
        return false;
    };
    let primary = match me.get(3) {
        Some(&id) if id != "-" => lines.iter().find(|f| f.first() == Some(&id)),
        _ => Some(me),
    };
    primary.is_some_and(|f| f.iter().skip(8).any(|field| range_has(field, slot)))
}

fn range_has(field: &str, slot: i64) -> bool {
    if field.starts_with('[') {
        return false;
    }
    let (lo, hi) = field.split_once('-').unwrap_or((field, field));
    matches!((lo.parse::<i64>(), hi.parse::<i64>()), (Ok(lo), Ok(hi)) if (lo..=hi).contains(&slot))
}

/// Reads this node's line of `CLUSTER NODES`: its slot ranges (`0-5460`, `7000`) and migrating
/// markers (`[5461->-<target id>]`).
pub fn serves_slot(cluster_nodes: &str, slot: i64) -> bool {
    let Some(me) = cluster_nodes
        .lines()
        .find(|line| line.split(' ').nth(2).is_some_and(|f| f.contains("myself")))
    else {
        return false;
    };
    let mut owned = false;
    for field in me.split(' ').skip(8) {
        if let Some(migration) = field.strip_prefix('[') {
            if let Some((from, _)) = migration.split_once("->-") {
                if from.parse() == Ok(slot) {
                    return false;
                }
            }
            continue;
        }
        let (lo, hi) = field.split_once('-').unwrap_or((field, field));
        if let (Ok(lo), Ok(hi)) = (lo.parse::<i64>(), hi.parse::<i64>()) {
            owned |= (lo..=hi).contains(&slot);
        }
    }
    owned
}

#[cfg(test)]
mod tests {
    use super::{serves_slot, shard_serves_slot};

    const NODES: &str = "\
07c3 127.0.0.1:30004@40004 slave e7d1 0 1426238317239 4 connected
e7d1 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460 7000 [5461->-292f] [5470-<-67ed]
292f 127.0.0.1:30002@40002 master - 0 1426238316232 2 connected 5461-10922
";

    #[test]
    fn reads_ranges_single_slots_and_migrations() {
        assert!(serves_slot(NODES, 0));
        assert!(serves_slot(NODES, 5460));
        assert!(serves_slot(NODES, 7000));
        assert!(!serves_slot(NODES, 5461)); // migrating away
        assert!(!serves_slot(NODES, 6000)); // another node's
        assert!(!serves_slot(NODES, 5470)); // importing: not ours until SETSLOT NODE
        assert!(!serves_slot("garbage", 1));
    }

    #[test]
    fn a_replica_reads_its_primarys_slots() {
        assert!(shard_serves_slot(NODES, 7000));
        assert!(shard_serves_slot(NODES, 5460));
        assert!(!shard_serves_slot(NODES, 5470)); // a marker only, not a range
        assert!(!shard_serves_slot(NODES, 6000));
        let replica = NODES.replace("myself,master", "master").replace(
            "07c3 127.0.0.1:30004@40004 slave",
            "07c3 127.0.0.1:30004@40004 myself,slave",
        );
        assert!(shard_serves_slot(&replica, 7000));
        assert!(!shard_serves_slot(&replica, 6000));
        assert!(!shard_serves_slot("garbage", 1));
    }
}
