//! Many expiring locks: N locks with a short ttl, and the longest `PING` while they expire
//! (a stall of the server), against plain `SET NX PX` strings; again at `hz 100`.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use redis::Connection;

use super::{Env, Scenario};
use crate::config::{Config, Sizes, CONNS};
use crate::load::{fill, owners, Load};
use crate::report::{f, num, obj, s, Goal, Json};
use crate::server::{config_get, config_set, flushall, Server};
use crate::stats::{pct, sorted};

pub fn new() -> Box<dyn Scenario> {
    Box::new(ScaleScenario { scale: Vec::new() })
}

pub struct ScaleScenario {
    scale: Vec<Scale>,
}

#[derive(Clone, Debug)]
struct Scale {
    what: String,
    /// The server's `hz` during the run (its active expiry runs `hz` times a second).
    hz: u64,
    locks: u64,
    ttl_ms: u64,
    take_secs: f64,
    /// Seconds from the last lock taken to `DBSIZE` 0.
    drain_secs: f64,
    /// PING latencies (ms) while the locks were being taken, and afterwards until all were gone.
    ping_load: Vec<f64>,
    ping_expiry: Vec<f64>,
    /// Keys left when the time limit hit (0 when all expired).
    left: u64,
}

/// Scale run with the server's `hz` set to `hz` for its duration (then restored), if given.
fn scale_at_hz(
    srv: &Server,
    ctl: &mut Connection,
    sizes: &Sizes,
    lock: bool,
    hz: Option<u64>,
) -> Scale {
    let old = config_get(ctl, "hz");
    if let Some(hz) = hz {
        config_set(ctl, "hz", &hz.to_string());
    }
    let mut r = scale(srv, ctl, sizes, lock);
    config_set(ctl, "hz", &old);
    r.hz = hz.unwrap_or_else(|| old.parse().unwrap_or(0));
    if hz.is_some() {
        r.what.push_str(&format!(" at hz {}", r.hz));
    }
    r
}

fn scale(srv: &Server, ctl: &mut Connection, sizes: &Sizes, lock: bool) -> Scale {
    let n = sizes.scale_locks;
    let what = if lock { "LOCK.ACQUIRE" } else { "SET NX PX" };
    eprintln!(
        "[5] scale: {n} x {what} with ttl {} ms, PING latency until all expire",
        sizes.scale_ttl_ms
    );
    flushall(ctl);
    let owners = owners(CONNS);
    let ttl = sizes.scale_ttl_ms.to_string();
    let load = Load {
        conns: CONNS,
        depth: 16,
        per_conn: n / CONNS,
    };
    let stop = AtomicBool::new(false);
    let t0 = Instant::now();
    let (run, samples, load_end, done, left) = thread::scope(|s| {
        let stop = &stop;
        let sampler = s.spawn(move || {
            // Back-to-back PINGs on a raw socket: a stall of the event loop shows up as one
            // slow PING at most one round trip after the stall begins.
            let mut sock = srv.raw();
            let mut samples: Vec<(f64, f64)> = Vec::with_capacity(1 << 20);
            let mut buf = [0u8; 7];
            while !stop.load(Ordering::Relaxed) {
                let sent = Instant::now();
                sock.write_all(b"*1\r\n$4\r\nPING\r\n").expect("PING");
                sock.read_exact(&mut buf).expect("PONG");
                let back = Instant::now();
                samples.push((
                    (sent - t0).as_secs_f64(),
                    (back - sent).as_secs_f64() * 1000.0,
                ));
            }
            samples
        });
        let run = fill(srv, ctl, load, "scale", lock, &owners, &ttl);
        let load_end = (Instant::now() - t0).as_secs_f64();
        let limit = Instant::now() + Duration::from_secs(300);
        let left = loop {
            let keys: u64 = redis::cmd("DBSIZE").query(ctl).expect("DBSIZE");
            if keys == 0 || Instant::now() > limit {
                break keys;
            }
            thread::sleep(Duration::from_millis(10));
        };
        let done = (Instant::now() - t0).as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        let samples = sampler.join().expect("sampler panicked");
        (run, samples, load_end, done, left)
    });
    let mut ping_load = Vec::new();
    let mut ping_expiry = Vec::new();
    for (at, lat) in samples {
        if at < load_end {
            ping_load.push(lat);
        } else if at < done {
            ping_expiry.push(lat);
        }
    }
    Scale {
        what: what.into(),
        hz: 0,
        locks: run.done,
        ttl_ms: sizes.scale_ttl_ms,
        take_secs: run.secs,
        drain_secs: done - load_end,
        ping_load: sorted(ping_load),
        ping_expiry: sorted(ping_expiry),
        left,
    }
}

impl Scenario for ScaleScenario {
    fn run(&mut self, env: &mut Env) {
        for (lock, hz) in [(true, None), (false, None), (true, Some(100))] {
            self.scale
                .push(scale_at_hz(env.srv, env.ctl, env.sizes, lock, hz));
        }
    }
    fn intro(&self, o: &mut String, _cfg: &Config) {
        let _ = writeln!(
            o,
            "Take N locks on distinct keys with a short ttl through the load generator ({CONNS} \
             connections, 16 in flight), while another connection sends `PING` back to back and \
             times each one; keep sampling until `DBSIZE` is 0. The longest `PING` is the longest \
             time the server did not answer (a stall). The `SET NX PX` row is the same with string \
             keys, for Redis's own expiry as a reference. While the locks are being taken the \
             `PING`s queue behind the load's pipelines (and share the CPU with the load \
             generator), so only the expiry phase tells about stalls.\n"
        );
    }
    fn markdown(&self, o: &mut String) {
        let _ = writeln!(
            o,
            "| locks | hz | ttl ms | taken in s | locks/s | all gone after the last was taken, s | PING p99 / max while taking, ms | PING p50 / p99 / max while expiring, ms | PINGs > 10 ms while expiring |\n|---|---|---|---|---|---|---|---|---|"
        );
        for sc in &self.scale {
            let slow = sc.ping_expiry.iter().filter(|x| **x > 10.0).count();
            let _ = writeln!(
                o,
                "| {} x `{}` | {} | {} | {} | {} | {}{} | {} / {} | {} / {} / {} | {} of {} |",
                f(sc.locks as f64),
                sc.what.split(" at hz").next().unwrap_or(""),
                sc.hz,
                sc.ttl_ms,
                f(sc.take_secs),
                f(sc.locks as f64 / sc.take_secs),
                f(sc.drain_secs),
                if sc.left > 0 {
                    format!(" ({} keys left at the time limit)", sc.left)
                } else {
                    String::new()
                },
                f(pct(&sc.ping_load, 99.0)),
                f(pct(&sc.ping_load, 100.0)),
                f(pct(&sc.ping_expiry, 50.0)),
                f(pct(&sc.ping_expiry, 99.0)),
                f(pct(&sc.ping_expiry, 100.0)),
                slow,
                sc.ping_expiry.len()
            );
        }
        o.push('\n');
        let row = |what: &str| self.scale.iter().find(|s| s.what == what);
        if let (Some(lock), Some(string)) = (row("LOCK.ACQUIRE"), row("SET NX PX")) {
            let _ = writeln!(
                o,
                "At the default `hz` ({}), Redis's active expiry runs up to 25% of each 1/hz tick \
                 (25 ms at hz 10) when many keys are due: the longest `PING` was {} ms for the \
                 locks and {} ms for plain strings{}.\n",
                lock.hz,
                f(pct(&lock.ping_expiry, 100.0)),
                f(pct(&string.ping_expiry, 100.0)),
                self.scale
                    .iter()
                    .find(|s| s.what.starts_with("LOCK.ACQUIRE at hz"))
                    .map_or(String::new(), |h| format!(
                        "; with `CONFIG SET hz {}` it was {} ms for the locks",
                        h.hz,
                        f(pct(&h.ping_expiry, 100.0))
                    ))
            );
        }
    }
    fn goals(&self) -> Vec<Goal> {
        let Some(sc) = self.scale.iter().find(|s| s.what == "LOCK.ACQUIRE") else {
            return Vec::new();
        };
        let stall = sc.ping_expiry.last().copied().unwrap_or(f64::NAN);
        vec![Goal {
            goal: format!(
                "{} expiring locks never stall the server > 10 ms",
                f(sc.locks as f64)
            ),
            measured: format!("longest PING while they expired: {} ms", f(stall)),
            met: stall <= 10.0 && sc.left == 0,
        }]
    }
    fn json(&self) -> Json {
        let scale: Vec<Json> = self
            .scale
            .iter()
            .map(|sc| {
                obj(vec![
                    ("command", s(&sc.what)),
                    ("hz", num(sc.hz as f64)),
                    ("locks", num(sc.locks as f64)),
                    ("ttl_ms", num(sc.ttl_ms as f64)),
                    ("take_seconds", num(sc.take_secs)),
                    ("locks_per_s", num(sc.locks as f64 / sc.take_secs)),
                    ("seconds_until_all_gone_after_taking", num(sc.drain_secs)),
                    ("keys_left_at_limit", num(sc.left as f64)),
                    (
                        "ping_ms_while_taking",
                        obj(vec![
                            ("count", num(sc.ping_load.len() as f64)),
                            ("p50", num(pct(&sc.ping_load, 50.0))),
                            ("p99", num(pct(&sc.ping_load, 99.0))),
                            ("max", num(pct(&sc.ping_load, 100.0))),
                        ]),
                    ),
                    (
                        "ping_ms_while_expiring",
                        obj(vec![
                            ("count", num(sc.ping_expiry.len() as f64)),
                            ("p50", num(pct(&sc.ping_expiry, 50.0))),
                            ("p99", num(pct(&sc.ping_expiry, 99.0))),
                            ("max", num(pct(&sc.ping_expiry, 100.0))),
                            (
                                "over_10ms",
                                num(sc.ping_expiry.iter().filter(|x| **x > 10.0).count() as f64),
                            ),
                        ]),
                    ),
                ])
            })
            .collect();
        Json::Arr(scale)
    }
}
