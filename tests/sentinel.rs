//! Sentinel failover: one primary and two replicas (the module loaded on each), three
//! Sentinels monitoring them (quorum 2, `down-after-milliseconds 500`, `failover-timeout 3000`).
//! Locks are taken on the primary, some acknowledged by `WAIT 1 1000`, some not; the primary
//! is killed with SIGKILL; Sentinel promotes a replica; the test reconnects through Sentinel.
//!
//! Checked: every lock whose grant `WAIT` acknowledged is on the new primary with its owner and
//! token, and its owner's retry gets the same token back; an un-`WAIT`ed lock is either there
//! as granted or gone, never someone else's; every token the new primary issues is larger than
//! every token the old one issued, including tokens of grants it never received. Printed: how
//! many un-`WAIT`ed locks survived, with the replication links up and with them just cut.
//!
//! Why `WAIT 1` is enough here with two replicas: replication is one ordered stream, so a
//! replica at a larger offset has every write a replica at a smaller offset has, and Sentinel
//! promotes the eligible replica with the largest offset it knows of (at equal
//! `replica-priority`; it polls replicas' `INFO` every second during a failover). Not a proof:
//! Sentinel's offsets can be a poll behind, and a replica can be ineligible (priority 0,
//! disconnected too long). `WAIT <number of replicas>` removes the dependence on which one is
//! promoted.
//!
//! `min_replicas_to_write_also_holds_back_expiry_handoffs` (ignored, fails today) shows a gap:
//! a primary that refuses writes for want of good replicas still grants a queued waiter when
//! the holder's deadline passes.

mod common;
mod nodes;

use std::collections::HashMap;
use std::fs;
use std::thread;
use std::time::{Duration, Instant};

use common::{acquire, fence, must_acquire, release, wait_for_replica_sync, Server};
use nodes::Node;
use redis::{Connection, Value};

const MASTER_NAME: &str = "mymaster";

/// A ttl that outlives the test.
const LONG_TTL: i64 = 100_000;

/// How long Sentinels may take to find each other, and then to fail over. Their hello
/// messages go out every 2 s; a failover whose election splits is retried after
/// 2 x failover-timeout (6 s).
const PATIENCE: Duration = Duration::from_secs(20);

/// Start a Sentinel monitoring the primary on `primary_port`.
fn start_sentinel(i: usize, dir: &std::path::Path, primary_port: u16) -> Node {
    let cfg = nodes::SentinelConfig {
        master_name: MASTER_NAME,
        primary_port,
        quorum: 2,
        down_after_ms: 500,
        failover_timeout_ms: 3000,
    };
    nodes::sentinel(i, dir, &cfg)
}

/// `SENTINEL MASTER mymaster` as field -> value.
fn sentinel_master(conn: &mut Connection) -> HashMap<String, String> {
    redis::cmd("SENTINEL")
        .arg("MASTER")
        .arg(MASTER_NAME)
        .query(conn)
        .expect("SENTINEL MASTER")
}

/// `SENTINEL GET-MASTER-ADDR-BY-NAME mymaster` -> the primary's port.
fn primary_port(conn: &mut Connection) -> Option<u16> {
    nodes::sentinel_primary_port(conn, MASTER_NAME)
}

/// `WAIT 1 1000`.
fn wait_one(conn: &mut Connection) -> i64 {
    redis::cmd("WAIT")
        .arg(1)
        .arg(1000)
        .query(conn)
        .expect("WAIT 1 1000")
}

/// `LOCK.INFO key` as (owner, token), `None` for nil.
fn holder(conn: &mut Connection, key: &str) -> Option<(String, i64)> {
    match redis::cmd("LOCK.INFO").arg(key).query(conn) {
        Ok(Value::Nil) => None,
        Ok(Value::Array(items)) => {
            let field = |name: &[u8]| {
                items
                    .chunks(2)
                    .find(|p| p[0] == Value::BulkString(name.to_vec()))
                    .map(|p| p[1].clone())
            };
            match (field(b"owner"), field(b"token")) {
                (Some(Value::BulkString(o)), Some(Value::Int(t))) => {
                    Some((String::from_utf8_lossy(&o).into_owned(), t))
                }
                _ => panic!("LOCK.INFO {key}: unexpected reply {items:?}"),
            }
        }
        other => panic!("LOCK.INFO {key}: expected an array or nil, got {other:?}"),
    }
}

/// A lock the old primary granted.
struct Granted {
    key: String,
    owner: String,
    token: i64,
    /// What `WAIT 1 1000` answered right after the grant; `None` if not asked.
    acked_by: Option<i64>,
}

#[test]
fn failover_keeps_acknowledged_locks_and_tokens_only_grow() {
    let begun = Instant::now();
    let dir = nodes::test_dir("sentinel");
    let mut primary = Server::start();
    let replicas = [Server::replica_of(&primary), Server::replica_of(&primary)];
    for r in &replicas {
        wait_for_replica_sync(&primary, r);
    }
    let old_port = primary.port();
    let sentinels: Vec<Node> = (0..3).map(|i| start_sentinel(i, &dir, old_port)).collect();
    let mut sconns: Vec<Connection> = sentinels.iter().map(Node::conn).collect();
    // Each Sentinel must know the other two (for the quorum and the election) and both
    // replicas (to pick one) before the primary dies.
    nodes::wait_for(
        "the Sentinels to find each other and both replicas",
        PATIENCE,
        || {
            sconns
                .iter_mut()
                .all(|s| {
                    let m = sentinel_master(s);
                    m.get("num-other-sentinels").map(String::as_str) == Some("2")
                        && m.get("num-slaves").map(String::as_str) == Some("2")
                        && m.get("flags").map(String::as_str) == Some("master")
                })
                .then_some(())
        },
    );
    let discovered = begun.elapsed();

    // Locks whose grant WAIT acknowledged: plain grants, and one handed off to a waiter.
    let mut p = primary.conn();
    let mut granted = Vec::new();
    for i in 0..5 {
        let (key, owner) = (format!("acked:{i}"), format!("owner-{i}"));
        let token = must_acquire(&mut p, &key, owner.as_str(), LONG_TTL);
        let acked_by = wait_one(&mut p);
        assert!(
            acked_by >= 1,
            "WAIT 1 1000 after granting {key}: {acked_by}"
        );
        granted.push(Granted {
            key,
            owner,
            token,
            acked_by: Some(acked_by),
        });
    }
    let handed = "acked:handoff";
    must_acquire(&mut p, handed, "first", LONG_TTL);
    let port = primary.port();
    let waiter = thread::spawn(move || {
        let mut c = nodes::connect(port);
        redis::cmd("LOCK.ACQUIRE")
            .arg(handed)
            .arg("second")
            .arg(LONG_TTL)
            .arg("BLOCK")
            .arg(10_000)
            .query::<i64>(&mut c)
            .expect("the waiter's grant")
    });
    nodes::wait_for("the waiter to block", PATIENCE, || {
        (nodes::info_field(&mut p, "clients", "blocked_clients").as_deref() == Some("1"))
            .then_some(())
    });
    assert_eq!(release(&mut p, handed, "first"), 1);
    let token = waiter.join().expect("waiter thread");
    let acked_by = wait_one(&mut p);
    assert!(acked_by >= 1, "WAIT 1 1000 after the handoff: {acked_by}");
    granted.push(Granted {
        key: handed.to_string(),
        owner: "second".to_string(),
        token,
        acked_by: Some(acked_by),
    });

    // Locks nobody waited for, in two batches of pipelined grants: the first while the
    // replication links are up; the second after `CLIENT KILL TYPE replica` cut them (the
    // replicas reconnect within a second), as when a primary dies with its links down. Then
    // the primary dies at once.
    let batch = |p: &mut Connection, prefix: &str| -> Vec<Granted> {
        let mut pipe = redis::pipe();
        for i in 0..25 {
            pipe.cmd("LOCK.ACQUIRE")
                .arg(format!("{prefix}:{i}"))
                .arg(format!("owner-{i}"))
                .arg(LONG_TTL);
        }
        let tokens: Vec<i64> = pipe.query(p).expect("pipelined LOCK.ACQUIRE");
        (0..25)
            .zip(tokens)
            .map(|(i, token)| Granted {
                key: format!("{prefix}:{i}"),
                owner: format!("owner-{i}"),
                token,
                acked_by: None,
            })
            .collect()
    };
    let linked = batch(&mut p, "unacked");
    let cut: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query(&mut p)
        .expect("CLIENT KILL TYPE replica");
    assert_eq!(cut, 2, "replication links cut");
    let unlinked = batch(&mut p, "unlinked");
    primary.kill9();
    let killed = Instant::now();
    let (linked_keys, unlinked_keys): (Vec<String>, Vec<String>) = (
        linked.iter().map(|g| g.key.clone()).collect(),
        unlinked.iter().map(|g| g.key.clone()).collect(),
    );
    granted.extend(linked);
    granted.extend(unlinked);
    let old_max = granted.iter().map(|g| g.token).max().unwrap();

    // Sentinel promotes a replica; a majority of Sentinels name it, and it says it is master.
    let new_port = nodes::wait_for("Sentinel to promote a replica", PATIENCE, || {
        let ports: Vec<Option<u16>> = sconns.iter_mut().map(primary_port).collect();
        let candidate = ports.iter().flatten().find(|&&p| p != old_port).copied()?;
        let agree = ports.iter().filter(|&&p| p == Some(candidate)).count();
        let role = nodes::info_field(&mut nodes::connect(candidate), "replication", "role");
        (agree >= 2 && role.as_deref() == Some("master")).then_some(candidate)
    });
    let failover = killed.elapsed();
    let mut newp = nodes::connect(new_port);

    // Acknowledged grants survive with owner and token; the owner's retry gets the same token.
    for g in granted.iter().filter(|g| g.acked_by.is_some()) {
        assert_eq!(
            holder(&mut newp, &g.key),
            Some((g.owner.clone(), g.token)),
            "{} (WAIT answered {:?}) on the new primary",
            g.key,
            g.acked_by
        );
        assert_eq!(
            acquire(&mut newp, &g.key, g.owner.as_str(), LONG_TTL),
            Some(g.token),
            "the owner's retry of {} on the new primary",
            g.key
        );
    }
    // Un-WAITed grants: each is either there as granted or absent, never held by another.
    let mut fate = HashMap::new();
    let mut other = Vec::new();
    for g in granted.iter().filter(|g| g.acked_by.is_none()) {
        let survived = match holder(&mut newp, &g.key) {
            Some((o, t)) if o == g.owner && t == g.token => true,
            None => false,
            Some(h) => {
                other.push(format!("{} held by {h:?}", g.key));
                continue;
            }
        };
        fate.insert(g.key.clone(), survived);
    }
    assert!(
        other.is_empty(),
        "un-WAITed locks held by someone else: {other:?}"
    );
    let count = |keys: &[String]| {
        let survived = keys.iter().filter(|k| fate[*k]).count();
        (survived, keys.len() - survived)
    };
    let (linked_survived, linked_lost) = count(&linked_keys);
    let (unlinked_survived, unlinked_lost) = count(&unlinked_keys);

    // Every token the new primary issues is above every token the old one issued: new keys,
    // a released-and-retaken key, and the keys of lost locks (if any).
    let mut new_tokens = Vec::new();
    for i in 0..5 {
        new_tokens.push(must_acquire(
            &mut newp,
            &format!("after:{i}"),
            "new",
            LONG_TTL,
        ));
    }
    let g = &granted[0];
    assert_eq!(release(&mut newp, &g.key, g.owner.as_str()), 1);
    new_tokens.push(must_acquire(&mut newp, &g.key, "new", LONG_TTL));
    for g in granted.iter().filter(|g| g.acked_by.is_none()) {
        if fence(&mut newp, &g.key).is_none() {
            new_tokens.push(must_acquire(&mut newp, &g.key, "new", LONG_TTL));
        }
    }
    let new_min = *new_tokens.iter().min().unwrap();
    assert!(
        new_min > old_max,
        "the new primary issued {new_min}, not above the old primary's {old_max}"
    );

    // The other replica follows the new primary.
    let other_replica = replicas
        .iter()
        .find(|r| r.port() != new_port)
        .expect("a replica that was not promoted");
    // Sentinel kills the normal clients of a replica it reconfigures: connect afresh each time.
    nodes::wait_for(
        "the other replica to follow the new primary",
        PATIENCE,
        || {
            let mut r = other_replica.conn();
            let following = nodes::info_field(&mut r, "replication", "master_port")
                == Some(new_port.to_string())
                && nodes::info_field(&mut r, "replication", "master_link_status").as_deref()
                    == Some("up");
            (following && wait_one(&mut newp) >= 1).then_some(())
        },
    );
    let mut r = other_replica.conn();
    for key in ["acked:1", "after:0", granted[0].key.as_str()] {
        assert_eq!(
            fence(&mut r, key),
            fence(&mut newp, key),
            "{key} on the replica"
        );
    }

    let acks: Vec<i64> = granted.iter().filter_map(|g| g.acked_by).collect();
    println!(
        "sentinel failover: Sentinels ready {:.1} s after start; promoted 127.0.0.1:{new_port} \
         {:.1} s after kill -9 of 127.0.0.1:{old_port}; test took {:.1} s",
        discovered.as_secs_f64(),
        failover.as_secs_f64(),
        begun.elapsed().as_secs_f64()
    );
    println!(
        "  WAITed locks: {} granted (WAIT 1 1000 answered {acks:?}), all survived with owner \
         and token",
        acks.len()
    );
    println!(
        "  un-WAITed locks, replication links up: {linked_survived} survived, {linked_lost} lost"
    );
    println!(
        "  un-WAITed locks, links just cut, then kill -9: {unlinked_survived} survived, \
         {unlinked_lost} lost (re-acquirable by anyone on the new primary)"
    );
    println!(
        "  tokens: old primary's largest {old_max}; new primary's smallest {new_min} \
         (+{:.0} ms of clock: floor and failover margin)",
        (new_min - old_max) as f64 / (1u64 << 11) as f64
    );
    drop(sentinels);
    let _ = fs::remove_dir_all(&dir);
}

/// `min-replicas-to-write 1`: once the primary has no good replica it refuses `LOCK.ACQUIRE`,
/// `LOCK.RELEASE` and `LOCK.EXTEND` with `NOREPLICAS`, as it refuses `SET`. A waiter queued
/// before must not be granted either when the holder's deadline passes: that grant would be a
/// write no replica has, made while the primary refuses writes, and a failover would hand the
/// lock to a second owner.
/// The module checks before a timer grant and answers the waiters `NOREPLICAS`.
#[test]
fn min_replicas_to_write_also_holds_back_expiry_handoffs() {
    let primary = Server::start_with(&[
        "--min-replicas-to-write",
        "1",
        "--min-replicas-max-lag",
        "2",
    ]);
    let mut replica = Server::replica_of(&primary);
    wait_for_replica_sync(&primary, &replica);
    let mut p = primary.conn();
    let good = |p: &mut Connection| nodes::info_field(p, "replication", "min_slaves_good_slaves");
    nodes::wait_for("a good replica", PATIENCE, || {
        (good(&mut p).as_deref() == Some("1")).then_some(())
    });

    let ttl = 6_000;
    let holder_token = must_acquire(&mut p, "k", "holder", ttl);
    let port = primary.port();
    let waiter = thread::spawn(move || {
        let mut c = nodes::connect(port);
        redis::cmd("LOCK.ACQUIRE")
            .arg("k")
            .arg("waiter")
            .arg(LONG_TTL)
            .arg("BLOCK")
            .arg(ttl + 2_000)
            .query::<Value>(&mut c)
    });
    nodes::wait_for("the waiter to block", PATIENCE, || {
        (nodes::info_field(&mut p, "clients", "blocked_clients").as_deref() == Some("1"))
            .then_some(())
    });

    replica.kill9();
    nodes::wait_for("the primary to count no good replica", PATIENCE, || {
        (good(&mut p).as_deref() == Some("0")).then_some(())
    });
    let refused = redis::cmd("LOCK.ACQUIRE")
        .arg("other")
        .arg("x")
        .arg(1000)
        .query::<Value>(&mut p);
    assert_eq!(
        refused.as_ref().err().and_then(|e| e.code()),
        Some("NOREPLICAS"),
        "LOCK.ACQUIRE without good replicas: {refused:?}"
    );
    assert_eq!(fence(&mut p, "k"), Some(holder_token));

    let answer = waiter.join().expect("waiter thread");
    assert_eq!(
        answer.as_ref().err().and_then(|e| e.code()),
        Some("NOREPLICAS"),
        "waiter's answer: {answer:?}"
    );
    assert!(
        !matches!(answer, Ok(Value::Int(_))),
        "the waiter was granted {answer:?} by the expiry handoff while the primary refused \
         writes (NOREPLICAS); LOCK.INFO k: {:?}",
        holder(&mut p, "k")
    );
}
