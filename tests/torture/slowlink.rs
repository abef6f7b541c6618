//! A slow link: every byte between the clients and the server goes through a proxy that
//! delays it 50 ms plus up to 20 ms of jitter (in order), and every 1-3 s freezes all traffic
//! for 400-900 ms. (A userspace proxy because this kernel has no `netem` qdisc.) Raw clients
//! block as waiters and extend their holds; holders using the Rust client's watchdog
//! (`acquire_with_watchdog`, ttl 600 ms, renewed every 200 ms) keep their lock for 0.3-2 s and
//! write the fenced resource every 50 ms while the watchdog reports no loss.
//!
//! Checked: nothing hangs (every call is answered within its wait plus 2 s plus the longest
//! freeze, and every client stops within 10 s of being told to); after each watchdog holder's
//! write, a direct connection (no proxy) asks `LOCK.FENCE key token`: if the hold is gone
//! while the watchdog still reports no loss, the watchdog let its holder act on a lost lock.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis_lock_client::{Client as LockClient, LossReason};

use crate::common::Server;
use crate::netfault::{self, Client, ClientCfg, Fenced, Log, Row, SlowLink, Target};

const RAW_CLIENTS: usize = 4;
const WATCHDOG_HOLDERS: usize = 3;
const TTL: Duration = Duration::from_millis(600);

#[derive(Default)]
struct Watch {
    holds: AtomicU64,
    writes: AtomicU64,
    loss_not_held: AtomicU64,
    loss_extend_failed: AtomicU64,
    /// The server no longer had the hold while the watchdog reported nothing.
    unreported: AtomicU64,
    errors: AtomicU64,
}

pub fn slow_link(name: &str) -> Row {
    let secs = netfault::secs();
    let seed = netfault::seed(name);
    let mut rng = StdRng::seed_from_u64(seed);
    let server = Server::start();
    let link = SlowLink::start(
        server.port(),
        Duration::from_millis(50),
        Duration::from_millis(20),
    );

    let target = Target::new("127.0.0.1", link.port);
    let (fenced, log) = (Arc::new(Fenced::default()), Arc::new(Log::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let cfg = ClientCfg {
        prefix: "raw:",
        keys: 2,
        ttl_ms: (300, 1000),
        block_ms: Some((200, 1500)),
        hold_ms: (0, 100),
        extend_share: 0.5,
        reply_slack: netfault::SLACK + Duration::from_millis(900),
        ..ClientCfg::default()
    };
    let mut threads = Client::spawn_many(
        "raw",
        RAW_CLIENTS,
        &cfg,
        &target,
        &fenced,
        &log,
        &stop,
        seed,
    );
    let watch = Arc::new(Watch::default());
    for i in 0..WATCHDOG_HOLDERS {
        let (stop, watch, fenced) = (stop.clone(), watch.clone(), fenced.clone());
        let (proxy, direct) = (link.port, server.port());
        let seed = seed + 100 + i as u64;
        threads.push(thread::spawn(move || {
            watchdog_holder(i, proxy, direct, seed, &stop, &watch, &fenced)
        }));
    }

    let until = Instant::now() + Duration::from_secs_f64(secs);
    let mut freezes = 0;
    while Instant::now() + Duration::from_millis(500) < until {
        thread::sleep(
            Duration::from_millis(rng.gen_range(1000..=3000)).min(until - Instant::now()),
        );
        link.freeze(Duration::from_millis(rng.gen_range(400..=900)));
        freezes += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let stopping = Instant::now();
    let mut hung = 0;
    for t in threads {
        t.join().expect("a client thread panicked");
    }
    if stopping.elapsed() > Duration::from_secs(10) {
        hung += 1;
    }
    let grants = log.grants();
    let w = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let row = Row {
        scenario: name.to_string(),
        secs,
        faults: vec![format!(
            "50 ms + 0-20 ms jitter each way on every connection; {freezes} freezes of \
             400-900 ms"
        )],
        grants_lost: None,
        checks: vec![
            ("a call never answered".into(), w(&log.unanswered)),
            ("clients not stopped within 10 s".into(), hung),
            (
                "a watchdog holder acted on a lock the server no longer had".into(),
                w(&watch.unreported),
            ),
            (
                "the same token to two owners".into(),
                netfault::duplicate_tokens(&grants),
            ),
        ],
        notes: vec![
            format!(
                "watchdog holders: {} holds, {} fenced writes, losses reported: {} NotHeld, \
                 {} ExtendFailed; {} acquire errors",
                w(&watch.holds),
                w(&watch.writes),
                w(&watch.loss_not_held),
                w(&watch.loss_extend_failed),
                w(&watch.errors)
            ),
            format!(
                "stopping took {:.1} s after the workload ended",
                stopping.elapsed().as_secs_f64()
            ),
        ],
    };
    row.print(&log, &fenced);
    drop(link);
    row
}

fn watchdog_holder(
    i: usize,
    proxy: u16,
    direct: u16,
    seed: u64,
    stop: &AtomicBool,
    watch: &Watch,
    fenced: &Fenced,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let client = LockClient::open(&format!("redis://127.0.0.1:{proxy}/"))
        .expect("client")
        .with_timeouts(Duration::from_millis(500), Duration::from_millis(500))
        // The watchdog over ttl-only holds, as this scenario checks it (no default session).
        .without_session();
    let mut check = netfault::connect("127.0.0.1", direct, Duration::from_secs(1))
        .expect("a direct connection to the server");
    let key = format!("wd:{}", i % 2);
    while !stop.load(Ordering::Relaxed) {
        let guard = match client.acquire_with_watchdog(&key, TTL) {
            Ok(Some(g)) => g,
            Ok(None) => {
                thread::sleep(Duration::from_millis(20));
                continue;
            }
            Err(_) => {
                watch.errors.fetch_add(1, Ordering::Relaxed);
                thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        watch.holds.fetch_add(1, Ordering::Relaxed);
        let token = guard.token() as i64;
        let hold_until = Instant::now() + Duration::from_millis(rng.gen_range(300..=2000));
        while Instant::now() < hold_until && !stop.load(Ordering::Relaxed) {
            if guard.is_lost() {
                break;
            }
            fenced.write(&key, token);
            watch.writes.fetch_add(1, Ordering::Relaxed);
            let live: i64 = redis::cmd("LOCK.FENCE")
                .arg(&key)
                .arg(token)
                .query(&mut check)
                .expect("LOCK.FENCE on the direct connection");
            if live == 0 && !guard.is_lost() {
                watch.unreported.fetch_add(1, Ordering::Relaxed);
                break;
            }
            thread::sleep(Duration::from_millis(50));
        }
        match guard.loss_reason() {
            Some(LossReason::NotHeld) => watch.loss_not_held.fetch_add(1, Ordering::Relaxed),
            Some(LossReason::ExtendFailed(_)) => {
                watch.loss_extend_failed.fetch_add(1, Ordering::Relaxed)
            }
            // No session and no change-feed watch here: the other reasons cannot happen.
            Some(_) | None => 0,
        };
        let _ = guard.release();
    }
}
