//! Expiry handoff: a holder never releases; how long after its deadline does a queued
//! `LOCK.ACQUIRE ... BLOCK` waiter get the lock, against a `SET NX PX` poller.

use std::fmt::Write as _;
use std::thread;
use std::time::{Duration, Instant};

use rand::Rng;
use redis::Connection;

use super::{Env, Scenario};
use crate::config::{Config, Sizes};
use crate::report::{f, num, obj, Goal, Json};
use crate::server::Server;
use crate::stats::{pct, sorted, wall_ms};

pub fn new() -> Box<dyn Scenario> {
    Box::new(ExpiryScenario { exp: None })
}

pub struct ExpiryScenario {
    exp: Option<Expiry>,
}

struct Expiry {
    ttl_ms: u64,
    /// Lock: client-observed delay from the holder's deadline to the waiter's grant reply (ms).
    lock: Vec<f64>,
    /// Lock: the same delay on the server's clock, from the waiter's token (whole ms).
    lock_server: Vec<f64>,
    /// Poller (`SET NX PX` every 10 ms): delay from the holder's deadline to its `OK` (ms).
    poll: Vec<f64>,
}

/// The clock shift of the module's tokens: a token minted at server time `t` ms is `t << shift`
/// when it is the first of that millisecond (see the README's "Fencing tokens"). The shift is
/// read off a fresh token against this machine's clock rather than assumed, so a change of the
/// token layout does not silently skew the figures; `None` when the token does not look like
/// that (then the server-clock figure is left out).
pub fn token_shift(token: i64) -> Option<u32> {
    let now = wall_ms();
    (0..=40u32).find(|&shift| ((token >> shift) as f64 - now).abs() < 5_000.0)
}

/// The server millisecond of a token, and whether the token was the first of that millisecond.
pub fn token_ms(token: i64, shift: u32) -> (i64, bool) {
    (token >> shift, token & ((1i64 << shift) - 1) == 0)
}

fn expiry(srv: &Server, ctl: &mut Connection, sizes: &Sizes) -> Expiry {
    const TTL: u64 = 200;
    eprintln!(
        "[3] expiry handoff, ttl {TTL} ms, {} handoffs per contender",
        sizes.expiry_reps
    );
    let key = "bench:expiry";
    let mut holder = srv.connect();
    let mut waiter = srv.connect();
    let mut rng = rand::thread_rng();
    let mut out = Expiry {
        ttl_ms: TTL,
        lock: Vec::new(),
        lock_server: Vec::new(),
        poll: Vec::new(),
    };
    for rep in 0..sizes.expiry_reps {
        let lock_first = rep % 2 == 0;
        for side in if lock_first {
            [true, false]
        } else {
            [false, true]
        } {
            let _: () = redis::cmd("DEL").arg(key).query(ctl).expect("DEL");
            if side {
                let token: i64 = redis::cmd("LOCK.ACQUIRE")
                    .arg(key)
                    .arg("holder")
                    .arg(TTL)
                    .query(&mut holder)
                    .expect("LOCK.ACQUIRE holder");
                // The grant's server time is in its token when it was the first of its ms;
                // otherwise ask the key's absolute expiry (equal to the deadline).
                let shift = token_shift(token);
                let deadline = match shift.map(|s| token_ms(token, s)) {
                    Some((ms, true)) => ms + TTL as i64,
                    _ => redis::cmd("PEXPIRETIME")
                        .arg(key)
                        .query(&mut holder)
                        .expect("PEXPIRETIME"),
                };
                let got: Option<i64> = redis::cmd("LOCK.ACQUIRE")
                    .arg(key)
                    .arg("waiter")
                    .arg(10_000)
                    .arg("BLOCK")
                    .arg(5_000)
                    .query(&mut waiter)
                    .expect("LOCK.ACQUIRE waiter");
                let at = wall_ms();
                let token = got.expect("the waiter timed out instead of getting the expired lock");
                out.lock.push(at - deadline as f64);
                if let Some(s) = shift {
                    out.lock_server
                        .push((token_ms(token, s).0 - deadline) as f64);
                }
                let _: i64 = redis::cmd("LOCK.RELEASE")
                    .arg(key)
                    .arg("waiter")
                    .query(&mut waiter)
                    .expect("LOCK.RELEASE");
            } else {
                let ok: Option<String> = redis::cmd("SET")
                    .arg(key)
                    .arg("holder")
                    .arg("NX")
                    .arg("PX")
                    .arg(TTL)
                    .query(&mut holder)
                    .expect("SET holder");
                assert!(ok.is_some(), "holder could not take a free key");
                let deadline: i64 = redis::cmd("PEXPIRETIME")
                    .arg(key)
                    .query(&mut holder)
                    .expect("PEXPIRETIME");
                // Start polling at a random phase of the 10 ms period.
                thread::sleep(Duration::from_micros(rng.gen_range(0..10_000)));
                let limit = Instant::now() + Duration::from_secs(5);
                loop {
                    let ok: Option<String> = redis::cmd("SET")
                        .arg(key)
                        .arg("poller")
                        .arg("NX")
                        .arg("PX")
                        .arg(10_000)
                        .query(&mut waiter)
                        .expect("SET poller");
                    if ok.is_some() {
                        out.poll.push(wall_ms() - deadline as f64);
                        break;
                    }
                    assert!(Instant::now() < limit, "poller never got the expired key");
                    thread::sleep(Duration::from_millis(10));
                }
                let _: i64 = redis::cmd("DEL").arg(key).query(ctl).expect("DEL");
            }
        }
    }
    out
}

impl Scenario for ExpiryScenario {
    fn run(&mut self, env: &mut Env) {
        self.exp = Some(expiry(env.srv, env.ctl, env.sizes));
    }
    fn intro(&self, o: &mut String, _cfg: &Config) {
        let Some(e) = &self.exp else { return };
        let _ = writeln!(
            o,
            "A holder takes the key with a {} ms ttl and never releases it; a waiter is already \
             queued with `LOCK.ACQUIRE key waiter 10000 BLOCK 5000`. The delay runs from the \
             holder's deadline on the server's clock (the grant's server millisecond, read from \
             its fencing token, + ttl; `PEXPIRETIME` when the token was not the first of its \
             millisecond) to the moment the waiter's client has the reply (the same machine's \
             clock), so it includes the reply's trip. The server-side figure is the waiter's \
             token's millisecond minus the deadline (whole ms). Against it: a poller that sends \
             `SET key poller NX PX 10000` every 10 ms (starting at a random phase) on a key the \
             holder took with `SET NX PX {}`; its delay runs from the `PEXPIRETIME` deadline to \
             its `OK`. {} handoffs each, alternating.\n",
            e.ttl_ms,
            e.ttl_ms,
            e.lock.len()
        );
    }
    fn markdown(&self, o: &mut String) {
        let Some(e) = &self.exp else { return };
        let lock = sorted(e.lock.clone());
        let server = sorted(e.lock_server.clone());
        let poll = sorted(e.poll.clone());
        let _ = writeln!(
            o,
            "| waiter | p50 ms | p99 ms | max ms |\n|---|---|---|---|"
        );
        for (name, v) in [
            ("`LOCK.ACQUIRE ... BLOCK` (client-observed)", &lock),
            ("`LOCK.ACQUIRE ... BLOCK` (server clock, whole ms)", &server),
            ("`SET NX PX` every 10 ms", &poll),
        ] {
            let _ = writeln!(
                o,
                "| {name} | {} | {} | {} |",
                f(pct(v, 50.0)),
                f(pct(v, 99.0)),
                f(pct(v, 100.0))
            );
        }
        o.push('\n');
    }
    fn goals(&self) -> Vec<Goal> {
        let Some(e) = &self.exp else {
            return Vec::new();
        };
        let p99 = pct(&sorted(e.lock.clone()), 99.0);
        let server = if e.lock_server.is_empty() {
            String::new()
        } else {
            format!(
                "; on the server's clock p99 {} ms",
                f(pct(&sorted(e.lock_server.clone()), 99.0))
            )
        };
        vec![Goal {
            goal: "expiry handoff, client-observed: an already queued waiter's grant p99 < 5 ms after the deadline".into(),
            measured: format!("p99 {} ms over {} handoffs{server}", f(p99), e.lock.len()),
            met: p99 < 5.0,
        }]
    }
    fn json(&self) -> Json {
        let Some(e) = &self.exp else {
            return Json::Arr(Vec::new());
        };
        let dist = |v: &[f64]| {
            let v = sorted(v.to_vec());
            obj(vec![
                ("p50", num(pct(&v, 50.0))),
                ("p99", num(pct(&v, 99.0))),
                ("max", num(pct(&v, 100.0))),
                ("samples", Json::Arr(v.iter().copied().map(num).collect())),
            ])
        };
        obj(vec![
            ("ttl_ms", num(e.ttl_ms as f64)),
            ("lock_block_client_ms", dist(&e.lock)),
            ("lock_block_server_ms", dist(&e.lock_server)),
            ("poll_10ms_ms", dist(&e.poll)),
        ])
    }
}
