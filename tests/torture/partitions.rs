//! A partition under Sentinel: a primary, two replicas and three Sentinels (quorum 2,
//! `down-after-milliseconds 1000`), all in a private network namespace. Clients on the
//! majority side follow Sentinel; one client stays with the primary. The primary is cut off
//! (iptables drops every packet to or from 127.0.0.1:port, so replicas and Sentinels see
//! silence; the minority client reaches it through 127.0.0.2, which the rule spares) until
//! Sentinel promotes a replica; both sides stay busy; the partition heals, and Sentinel turns
//! the old primary into a replica of the new one.
//!
//! Every client also takes a "record" lock now and then (its own key, 120 s ttl, never
//! released): at the end each acknowledged record grant is looked up on the final primary, and
//! those missing were lost. Run with and without `min-replicas-to-write 1`
//! (`min-replicas-max-lag 2`).
//!
//! Violations: a fenced write accepted out of token order (the resource refuses it by
//! construction, so a current holder would be refused instead: counted), the same token to
//! two owners. Reported, not violations: grants the deposed primary made while the new one
//! served (a split brain, which is what `min-replicas-to-write` limits), and lost grants.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redis::Connection;

use crate::common::{wait_until, Server};
use crate::netfault::{self, isolate, Client, ClientCfg, Fenced, Grant, Log, Row, Target};
use crate::nodes::{self, Node, SentinelConfig};

const MASTER: &str = "netfault";
const PATIENCE: Duration = Duration::from_secs(30);
/// Majority-side clients.
const MAJORITY: usize = 3;

fn sentinel_primary(s: &mut Connection) -> Option<u16> {
    nodes::sentinel_primary_port(s, MASTER)
}

fn sentinel_field(s: &mut Connection, field: &str) -> Option<String> {
    let m: BTreeMap<String, String> = redis::cmd("SENTINEL")
        .arg("MASTER")
        .arg(MASTER)
        .query(s)
        .ok()?;
    m.get(field).cloned()
}

/// Run the scenario in a private network namespace (root only).
pub fn partition(name: &'static str, min_replicas: bool) -> Row {
    netfault::in_private_netns(name, move || run(name, min_replicas))
}

fn run(name: &str, min_replicas: bool) -> Row {
    let secs = netfault::secs();
    let seed = netfault::seed(name);
    let mut args = vec!["--repl-timeout", "60"];
    if min_replicas {
        args.extend([
            "--min-replicas-to-write",
            "1",
            "--min-replicas-max-lag",
            "2",
        ]);
    }
    let mut primary_args = args.clone();
    primary_args.extend(["--bind", "127.0.0.1 127.0.0.2"]);
    let primary = Server::start_with(&primary_args);
    let old = primary.port();
    let replica_args = |port: String| {
        let mut a: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        a.extend(["--replicaof".into(), "127.0.0.1".into(), port]);
        a
    };
    let replicas: Vec<Server> = (0..2)
        .map(|_| {
            let a = replica_args(old.to_string());
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            Server::start_with(&a)
        })
        .collect();
    for r in &replicas {
        crate::common::wait_for_replica_sync(&primary, r);
    }
    let dir = nodes::test_dir("partition");
    let cfg = SentinelConfig {
        master_name: MASTER,
        primary_port: old,
        quorum: 2,
        down_after_ms: 1000,
        failover_timeout_ms: 3000,
    };
    let sentinels: Vec<Node> = (0..3).map(|i| nodes::sentinel(i, &dir, &cfg)).collect();
    let mut sconns: Vec<Connection> = sentinels.iter().map(Node::conn).collect();
    nodes::wait_for("the Sentinels to find each other", PATIENCE, || {
        sconns
            .iter_mut()
            .all(|s| {
                sentinel_field(s, "num-other-sentinels").as_deref() == Some("2")
                    && sentinel_field(s, "num-slaves").as_deref() == Some("2")
            })
            .then_some(())
    });

    // Clients: the majority follows Sentinel, the minority client stays on 127.0.0.2.
    let (fenced, log) = (Arc::new(Fenced::default()), Arc::new(Log::default()));
    let records = Arc::new(Log::default());
    let stop = Arc::new(AtomicBool::new(false));
    let majority = Target::new("127.0.0.1", old);
    let minority = Target::new("127.0.0.2", old);
    let hot = ClientCfg {
        keys: 4,
        ttl_ms: (200, 800),
        block_ms: Some((100, 800)),
        ..ClientCfg::default()
    };
    let record = ClientCfg {
        prefix: "rec:",
        keys: 1_000_000,
        ttl_ms: (120_000, 120_000),
        block_ms: None,
        hold_ms: (20, 60),
        extend_share: 0.0,
        expire_share: 1.0,
        ..ClientCfg::default()
    };
    let mut threads = Vec::new();
    for i in 0..=MAJORITY {
        let (side, target) = if i < MAJORITY {
            ("maj", &majority)
        } else {
            ("min", &minority)
        };
        for (kind, cfg, l) in [("hot", &hot, &log), ("rec", &record, &records)] {
            threads.push(Client::spawn(
                format!("{side}{i}-{kind}"),
                cfg.clone(),
                target.clone(),
                fenced.clone(),
                l.clone(),
                stop.clone(),
                seed + 2 * i as u64 + u64::from(kind == "rec"),
            ));
        }
    }
    // Port -> when it became the primary Sentinel names.
    let terms = Arc::new(Mutex::new(vec![(old, Instant::now())]));
    let follower = {
        let (stop, majority, terms) = (stop.clone(), majority.clone(), terms.clone());
        let mut s = sentinels[0].conn();
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Some(p) = sentinel_primary(&mut s) {
                    let mut t = terms.lock().unwrap();
                    if t.last().map(|x| x.0) != Some(p) {
                        t.push((p, Instant::now()));
                        majority.set(Some(("127.0.0.1", p)));
                    }
                }
                thread::sleep(Duration::from_millis(20));
            }
        })
    };

    let phase = Duration::from_secs_f64(secs / 2.0);
    thread::sleep(phase);
    let cut = Instant::now();
    isolate(old, true);
    let new = nodes::wait_for("Sentinel to promote a replica", PATIENCE, || {
        let t = terms.lock().unwrap();
        t.last().map(|x| x.0).filter(|p| *p != old)
    });
    let promoted_after = cut.elapsed();
    thread::sleep(phase);
    isolate(old, false);
    let healed = Instant::now();
    // Sentinel turns the returning primary into a replica after its next INFO poll (up to
    // 10 s): waited for in the long run only, to keep the short one short.
    let wait_rejoin = secs >= 10.0;
    // A fresh connection each time: the old primary drops its clients when Sentinel makes it
    // a replica, and answers LOADING during the full sync.
    wait_until("the old primary to follow the new one", PATIENCE, || {
        if !wait_rejoin {
            return true;
        }
        let Ok(mut o) = netfault::connect("127.0.0.1", old, Duration::from_millis(300)) else {
            return false;
        };
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut o)
            .unwrap_or_default();
        let field =
            |name: &str| nodes::fields(&info).find_map(|(n, v)| (n == name).then(|| v.to_string()));
        field("master_port") == Some(new.to_string())
            && field("master_link_status").as_deref() == Some("up")
    });
    let rejoined_after = healed.elapsed();
    thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("a client thread panicked");
    }
    follower.join().expect("the Sentinel follower panicked");

    // Record grants lost: acknowledged, ttl not over, yet not on the final primary.
    let final_port = sentinel_primary(&mut sconns[0]).expect("a primary");
    let mut f = nodes::connect(final_port);
    let recs = records.grants();
    let lost: Vec<&Grant> = recs
        .iter()
        .filter(|g| {
            let token: Option<i64> = redis::cmd("LOCK.FENCE")
                .arg(&g.key)
                .query(&mut f)
                .expect("LOCK.FENCE");
            token != Some(g.token)
        })
        .collect();
    let lost_minority = lost.iter().filter(|g| g.server == old).count();

    let terms = terms.lock().unwrap().clone();
    let current = |at: Instant| {
        terms
            .iter()
            .rev()
            .find(|(_, from)| *from <= at)
            .map(|(p, _)| *p)
    };
    let grants = log.grants();
    let deposed: Vec<&Grant> = grants
        .iter()
        .filter(|g| g.server == old && g.complete > terms[1].1)
        .collect();
    let new_min = grants
        .iter()
        .filter(|g| g.server == new)
        .map(|g| g.token)
        .min();
    let deposed_max = deposed.iter().map(|g| g.token).max();
    let refused_current = log
        .writes()
        .iter()
        .filter(|w| {
            let g = &grants[w.grant];
            !w.accepted
                && current(w.at) == Some(g.server)
                && w.at < g.invoke + Duration::from_millis(g.ttl as u64)
        })
        .count() as u64;
    let minority_errors = log.errors.load(Ordering::Relaxed);
    let row = Row {
        scenario: name.to_string(),
        secs: secs + promoted_after.as_secs_f64() + rejoined_after.as_secs_f64(),
        faults: vec![format!(
            "1 partition of the primary and one client: Sentinel promoted :{new} {:.1} s after \
             the cut; healed {:.1} s later; the old primary rejoined as a replica {} ",
            promoted_after.as_secs_f64(),
            phase.as_secs_f64(),
            if wait_rejoin {
                format!("{:.1} s after", rejoined_after.as_secs_f64())
            } else {
                "(not waited for in the short run)".to_string()
            }
        )],
        grants_lost: Some(lost.len() as u64),
        checks: vec![
            (
                "a current holder's fenced write refused".into(),
                refused_current,
            ),
            (
                "the same token to two owners".into(),
                netfault::duplicate_tokens(&grants) + netfault::duplicate_tokens(&recs),
            ),
        ],
        notes: vec![
            format!(
                "min-replicas-to-write {}",
                if min_replicas { "1 (max lag 2 s)" } else { "0" }
            ),
            format!(
                "{} record grants, {} lost ({lost_minority} of them from the cut-off primary)",
                recs.len(),
                lost.len()
            ),
            format!(
                "the cut-off primary granted {} hot locks after the promotion (split brain); \
                 their largest token {deposed_max:?}, the new primary's smallest {new_min:?}",
                deposed.len()
            ),
            format!("{minority_errors} error replies on the hot keys (NOREPLICAS among them)"),
        ],
    };
    row.print(&log, &fenced);
    drop(sentinels);
    let _ = std::fs::remove_dir_all(&dir);
    drop(replicas);
    row
}
