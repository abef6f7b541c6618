//! Durable grants: what `durable=1` costs an acquire with one replica attached. One client,
//! one acquire at a time on fresh keys: `LOCK.ACQUIRE` alone against `LOCK.ACQUIRE` followed
//! by `WAIT 1 1000` on the same connection (what every client's durable option sends),
//! alternating rounds. Runs in the production setting only (AOF everysec + replica); the bare
//! server has no replica to wait for.

use std::fmt::Write as _;
use std::time::Instant;

use redis::Connection;

use super::{Env, Scenario};
use crate::config::{Config, LONG_TTL_MS};
use crate::report::{f, num, obj, Json};
use crate::stats::{pct, sorted};

/// Acquires per contender per round, and rounds.
const PER_ROUND: usize = 500;
const ROUNDS: usize = 4;

pub fn new() -> Box<dyn Scenario> {
    Box::new(Durable { runs: None })
}

pub struct Durable {
    /// Latencies in ms of the plain and the durable acquire, when the server had a replica.
    runs: Option<(Vec<f64>, Vec<f64>)>,
}

/// One acquire (and, with `wait`, its `WAIT 1 1000`), timed; then its release, not timed.
fn acquire(c: &mut Connection, key: &str, wait: bool) -> f64 {
    let started = Instant::now();
    let token: Option<i64> = redis::cmd("LOCK.ACQUIRE")
        .arg(key)
        .arg("bench")
        .arg(LONG_TTL_MS)
        .query(c)
        .expect("LOCK.ACQUIRE");
    assert!(token.is_some(), "a fresh key is granted");
    if wait {
        let acked: i64 = redis::cmd("WAIT").arg(1).arg(1000).query(c).expect("WAIT");
        assert_eq!(acked, 1, "the replica acknowledged the grant");
    }
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    let _: i64 = redis::cmd("LOCK.RELEASE")
        .arg(key)
        .arg("bench")
        .query(c)
        .expect("LOCK.RELEASE");
    ms
}

impl Scenario for Durable {
    fn run(&mut self, env: &mut Env) {
        if !env.srv.has_replica() {
            return;
        }
        eprintln!("[d] durable: LOCK.ACQUIRE vs LOCK.ACQUIRE + WAIT 1, one replica");
        let mut c = env.srv.connect();
        let per_round = if env.cfg.quick {
            PER_ROUND / 10
        } else {
            PER_ROUND
        };
        let (mut plain, mut durable) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            // The order flips every round, so neither always runs on a warmer server.
            for wait in [round % 2 == 1, round % 2 == 0] {
                for i in 0..per_round {
                    let key = format!("durable:{round}:{wait}:{i}");
                    let ms = acquire(&mut c, &key, wait);
                    if wait {
                        durable.push(ms)
                    } else {
                        plain.push(ms)
                    }
                }
            }
        }
        self.runs = Some((sorted(plain), sorted(durable)));
    }

    fn intro(&self, o: &mut String, _cfg: &Config) {
        let _ = writeln!(
            o,
            "One client, one acquire at a time on fresh keys, against the server with AOF \
             everysec and one replica: `LOCK.ACQUIRE` alone, and `LOCK.ACQUIRE` then `WAIT 1 \
             1000` on the same connection (what `durable=1` sends in every client), in \
             alternating rounds. Latency of the acquire as its caller sees it, in ms.\n"
        );
    }

    fn markdown(&self, o: &mut String) {
        let Some((plain, durable)) = &self.runs else {
            let _ = writeln!(o, "No replica in this setting: not measured.\n");
            return;
        };
        let _ = writeln!(o, "| acquire | n | p50 ms | p99 ms |\n|---|---|---|---|");
        for (name, v) in [
            ("LOCK.ACQUIRE", plain),
            ("LOCK.ACQUIRE + WAIT 1 (durable=1)", durable),
        ] {
            let _ = writeln!(
                o,
                "| {name} | {} | {} | {} |",
                v.len(),
                f(pct(v, 50.0)),
                f(pct(v, 99.0))
            );
        }
        let _ = writeln!(o);
    }

    fn json(&self) -> Json {
        match &self.runs {
            None => obj(vec![]),
            Some((plain, durable)) => obj(vec![
                ("plain_p50_ms", num(pct(plain, 50.0))),
                ("plain_p99_ms", num(pct(plain, 99.0))),
                ("durable_p50_ms", num(pct(durable, 50.0))),
                ("durable_p99_ms", num(pct(durable, 99.0))),
            ]),
        }
    }
}
