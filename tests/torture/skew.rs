//! Skewed failovers: the replica's wall clock runs `skew` behind its primary's (the project's
//! LD_PRELOAD clock shift); clients take locks and write the fenced resource; again and again
//! the replica is cut off its primary (it follows a dead port), the primary keeps granting for
//! 50-200 ms (grants no replica has), is killed -9, and the replica is promoted and serves the
//! clients, with a new replica whose clock is `skew` behind the new primary's.
//!
//! Checked: no token is granted after (in real time) a grant with a larger or equal token;
//! no token twice; no holder of a lock from the current primary, inside its ttl, has its
//! fenced write refused. With `lock.failover-token-margin-ms` 60000 all hold; with 0 the
//! promoted replica's tokens restart just above the last one it replicated, below those of
//! the lost grants, and the checks must catch it (`skew_60s_margin_0_is_caught`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::common::clock::ShiftedClock;
use crate::common::{info_field, promote, wait_until, Server};
use crate::netfault::{self, Client, ClientCfg, Fenced, Log, Row, Target};

const CLIENTS: usize = 4;

/// A replica of `primary` whose clock is `clock`, synced.
fn replica_of(primary: &Server, clock: &ShiftedClock, margin: &str) -> Server {
    let replica = Server::builder()
        .clock(clock)
        .module_args(&["failover-token-margin-ms", margin])
        .replica_of(primary.port())
        .start();
    let mut c = replica.conn();
    wait_until("the replica's sync", Duration::from_secs(20), || {
        info_field(&mut c, "replication", "master_link_status").as_deref() == Some("up")
            && info_field(&mut c, "replication", "master_sync_in_progress").as_deref() == Some("0")
    });
    replica
}

/// Cut `replica` off its primary without promoting it: it follows a port nobody listens on.
pub fn detach(replica: &Server) {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = dead.local_addr().unwrap().port();
    drop(dead);
    let mut r = replica.conn();
    redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(port)
        .query::<()>(&mut r)
        .expect("REPLICAOF a dead port");
}

/// Run the scenario; `margin` in ms. Returns its row (violations not asserted here).
pub fn skewed_failovers(name: &str, skew_ms: i64, margin: i64) -> Row {
    let secs = netfault::secs();
    let seed = netfault::seed(name);
    let mut rng = StdRng::seed_from_u64(seed);
    let margin_arg = margin.to_string();
    let dir = std::env::temp_dir().join("redis-lock-tests").join("clocks");

    let mut primary_clock = ShiftedClock::new(&dir, 0);
    let mut primary_offset = 0;
    let mut primary = Server::start_with_env(
        primary_clock.env(),
        &["failover-token-margin-ms", &margin_arg],
        &[],
    );
    let mut replica_clock = ShiftedClock::new(&dir, skew_ms);
    let mut replica = replica_of(&primary, &replica_clock, &margin_arg);

    let target = Target::new("127.0.0.1", primary.port());
    let (fenced, log) = (Arc::new(Fenced::default()), Arc::new(Log::default()));
    let stop = Arc::new(AtomicBool::new(false));
    // Many keys: every hold the promoted replica inherits lives `skew` longer on its clock
    // (deadlines are absolute), and would block a small key set.
    let cfg = ClientCfg {
        keys: 40,
        ..ClientCfg::default()
    };
    let clients = Client::spawn_many("c", CLIENTS, &cfg, &target, &fenced, &log, &stop, seed);

    let begun = Instant::now();
    let until = begun + Duration::from_secs_f64(secs);
    let mut retired = Vec::new();
    // Port -> (primary from, primary until, cut off its replica at).
    let mut terms: BTreeMap<u16, (Instant, Option<Instant>, Option<Instant>)> = BTreeMap::new();
    terms.insert(primary.port(), (begun, None, None));
    let (mut failovers, mut jumps_short) = (0, Vec::new());
    while Instant::now() + Duration::from_millis(300) < until {
        thread::sleep(Duration::from_millis(rng.gen_range(300..=600)));
        detach(&replica);
        let cut = Instant::now();
        thread::sleep(Duration::from_millis(rng.gen_range(50..=200)));
        target.set(None);
        let old_max = netfault::high_water(&mut primary.conn());
        let killed = Instant::now();
        primary.kill9();
        promote(&replica);
        let new_hw = netfault::high_water(&mut replica.conn());
        if new_hw <= old_max {
            jumps_short.push(format!(
                "promoted :{} at high water {new_hw} <= {old_max}, the old primary's",
                replica.port()
            ));
        }
        let term = terms.get_mut(&primary.port()).expect("a term");
        term.1 = Some(killed);
        term.2 = Some(cut);
        terms.insert(replica.port(), (Instant::now(), None, None));
        target.set(Some(("127.0.0.1", replica.port())));
        failovers += 1;

        retired.push(std::mem::replace(&mut primary, replica));
        primary_offset += skew_ms;
        let next_clock = ShiftedClock::new(&dir, primary_offset + skew_ms);
        primary_clock = std::mem::replace(&mut replica_clock, next_clock);
        replica = replica_of(&primary, &replica_clock, &margin_arg);
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().expect("a client thread panicked");
    }
    drop(primary_clock);

    let grants = log.grants();
    let lost = grants
        .iter()
        .filter(|g| {
            terms
                .get(&g.server)
                .and_then(|t| t.2)
                .is_some_and(|cut| g.complete > cut)
        })
        .count() as u64;
    let (back, examples) = netfault::tokens_back_in_time(&grants);
    let refused_current = log
        .writes()
        .iter()
        .filter(|w| {
            let g = &grants[w.grant];
            let (from, to, _) = terms[&g.server];
            !w.accepted
                && w.at >= from
                && to.is_none_or(|t| w.at < t)
                && w.at < g.invoke + Duration::from_millis(g.ttl as u64)
        })
        .count() as u64;
    let mut notes = vec![format!(
        "replica clock {} s behind its primary; lock.failover-token-margin-ms {margin}",
        -skew_ms / 1000
    )];
    notes.extend(examples);
    notes.extend(jumps_short.iter().take(2).cloned());
    let row = Row {
        scenario: name.to_string(),
        secs,
        faults: vec![format!(
            "{failovers} failovers (replica cut off, 50-200 ms of grants, kill -9, promotion)"
        )],
        grants_lost: Some(lost),
        checks: vec![
            ("a token not above an earlier grant's".into(), back),
            (
                "the same token to two owners".into(),
                netfault::duplicate_tokens(&grants),
            ),
            (
                "a current holder's fenced write refused".into(),
                refused_current,
            ),
            (
                "promoted with a high water not above the old primary's".into(),
                jumps_short.len() as u64,
            ),
        ],
        notes,
    };
    row.print(&log, &fenced);
    drop(retired);
    row
}
