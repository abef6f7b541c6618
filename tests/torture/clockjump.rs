//! A primary whose wall clock jumps 30 s forward and 30 s back (3 s in the short run) (the project's LD_PRELOAD clock
//! shift, rewritten while the server runs) while clients hold locks, extend them and queue as
//! `BLOCK` waiters.
//!
//! Checked: no token is granted after (in real time) a grant with a larger or equal token, so
//! none repeats or goes back on the running server; no token twice; every waiter is answered
//! (a token or nil) and no call goes unanswered. Expected, and reported: a jump forward ends
//! every hold early (deadlines are wall-clock times, as Redis keeps expiries), a jump back
//! makes holds that are not released last up to 30 s longer; waits on the server follow its
//! wall clock too, so a jump back can lengthen a `BLOCK` wait by as much.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::common::clock::ShiftedClock;
use crate::common::Server;
use crate::netfault::{self, Client, ClientCfg, Fenced, Log, Row, Target};

const CLIENTS: usize = 6;

/// The jump: 30 s, or 3 s in the short run (`TORTURE_SECS` below 10), where a jump back would
/// otherwise stretch a waiter's `BLOCK` by 30 s and the run with it.
fn jump_ms(secs: f64) -> i64 {
    if secs >= 10.0 {
        30_000
    } else {
        3_000
    }
}

pub fn clock_jumps(name: &str) -> Row {
    let secs = netfault::secs();
    let seed = netfault::seed(name);
    let mut rng = StdRng::seed_from_u64(seed);
    let jump = jump_ms(secs);
    let dir = std::env::temp_dir().join("redis-lock-tests").join("clocks");
    let clock = ShiftedClock::new(&dir, 0);
    let server = Server::start_with_env(clock.env(), &[], &[]);

    let target = Target::new("127.0.0.1", server.port());
    let (fenced, log) = (Arc::new(Fenced::default()), Arc::new(Log::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let cfg = ClientCfg {
        keys: 4,
        ttl_ms: (100, 500),
        block_ms: Some((100, 1000)),
        // Most holds are released: a jump back would keep a walked-away hold 30 s longer.
        expire_share: 0.02,
        // A jump back may lengthen a wait by the jump: wait that long before calling a reply
        // lost.
        reply_slack: Duration::from_millis(jump as u64 + 5_000),
        ..ClientCfg::default()
    };
    let clients = Client::spawn_many("c", CLIENTS, &cfg, &target, &fenced, &log, &stop, seed);

    let until = Instant::now() + Duration::from_secs_f64(secs);
    let mut jumps = Vec::new();
    // Forward, back to true, back, to true again: the server sees +30 s, -30 s, -30 s, +30 s.
    let offsets = [jump, 0, -jump, 0];
    let mut i = 0;
    while Instant::now() + Duration::from_millis(200) < until {
        thread::sleep(Duration::from_millis(rng.gen_range(200..=600)));
        let offset = offsets[i % offsets.len()];
        clock.set(offset);
        jumps.push(offset);
        i += 1;
    }
    clock.set(0);
    stop.store(true, Ordering::Relaxed);
    let joined = Instant::now();
    for c in clients {
        c.join().expect("a client thread panicked");
    }
    let join_secs = joined.elapsed().as_secs_f64();

    let grants = log.grants();
    let (back, examples) = netfault::tokens_back_in_time(&grants);
    let unanswered = log.unanswered.load(Ordering::Relaxed);
    let mut notes = vec![format!(
        "clients stopped within {join_secs:.1} s of being told to (waits follow the server's clock)"
    )];
    notes.extend(examples);
    let forward = jumps.windows(2).filter(|w| w[1] > w[0]).count() + usize::from(!jumps.is_empty());
    let row = Row {
        scenario: name.to_string(),
        secs,
        faults: vec![format!(
            "{} clock jumps of {} s on the server ({} forward, {} back)",
            jumps.len(),
            jump / 1000,
            forward,
            jumps.len() - forward
        )],
        grants_lost: None,
        checks: vec![
            ("a token not above an earlier grant's".into(), back),
            (
                "the same token to two owners".into(),
                netfault::duplicate_tokens(&grants),
            ),
            ("a call never answered".into(), unanswered),
        ],
        notes,
    };
    row.print(&log, &fenced);
    drop(server);
    row
}
