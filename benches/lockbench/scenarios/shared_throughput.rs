//! Uncontended `SHARED` acquires against exclusive ones: the same load generator, fresh keys,
//! side by side in the same rounds. Does asking for a shared (or limited) hold cost anything
//! when nobody else is there? Runs on the headline servers, bare and in production setting.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use super::throughput::Tput;
use super::{Env, Scenario};
use crate::config::{Config, Sizes, CONNS, LONG_TTL_MS};
use crate::load::{drive, key_into, owners, resp, Expect, Load};
use crate::report::{f, num, obj, ratio, s, Goal, Json};
use crate::server::flushall;

/// Commands in flight per connection: at `-P 16` the commands' own cost shows; at `-P 1` the
/// socket work (the same for every mode) hides it.
const DEPTH: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Exclusive,
    Shared,
    Limit4,
}

const MODES: [Mode; 3] = [Mode::Exclusive, Mode::Shared, Mode::Limit4];

impl Mode {
    fn args(self) -> &'static [&'static [u8]] {
        match self {
            Mode::Exclusive => &[],
            Mode::Shared => &[b"SHARED"],
            Mode::Limit4 => &[b"SHARED", b"LIMIT", b"4"],
        }
    }
    fn label(self) -> &'static str {
        match self {
            Mode::Exclusive => "LOCK.ACQUIRE",
            Mode::Shared => "LOCK.ACQUIRE ... SHARED",
            Mode::Limit4 => "LOCK.ACQUIRE ... SHARED LIMIT 4",
        }
    }
    fn id(self) -> &'static str {
        match self {
            Mode::Exclusive => "exclusive",
            Mode::Shared => "shared",
            Mode::Limit4 => "shared_limit_4",
        }
    }
}

/// One mode's samples: acquire alone, release alone, and full cycles.
struct Side {
    mode: Mode,
    acquire: Tput,
    release: Tput,
    cycle: Tput,
}

pub fn new() -> Box<dyn Scenario> {
    Box::new(SharedThroughput { sides: Vec::new() })
}

pub struct SharedThroughput {
    sides: Vec<Side>,
}

impl SharedThroughput {
    fn get(&self, m: Mode) -> Option<&Side> {
        self.sides.iter().find(|s| s.mode == m)
    }
}

impl Scenario for SharedThroughput {
    fn run(&mut self, env: &mut Env) {
        // Half the throughput section's count: three modes x three loads per round.
        let total = env.sizes.tput_p16 / 2;
        eprintln!(
            "[shared throughput] {CONNS} connections, {DEPTH} in flight each, {total} commands per run"
        );
        let owners = owners(CONNS);
        let ttl = LONG_TTL_MS.to_string();
        let per_conn = total / CONNS / 2 * 2;
        let load = Load {
            conns: CONNS,
            depth: DEPTH,
            per_conn,
        };
        let ops = (per_conn * CONNS) as f64;
        let mut sides: Vec<Side> = MODES
            .iter()
            .map(|&mode| Side {
                mode,
                acquire: Tput::named(mode.label()),
                release: Tput::named("LOCK.RELEASE"),
                cycle: Tput::named(mode.label()),
            })
            .collect();
        for round in 0..env.sizes.tput_rounds {
            let mut order: Vec<usize> = (0..MODES.len()).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for i in order {
                let side = &mut sides[i];
                let extra = side.mode.args();
                // Acquire on fresh keys, then release exactly those keys.
                flushall(env.ctl);
                let prefix = format!("s{round}{i}");
                let run = drive(env.srv, env.ctl, load, |c, n, out| {
                    let mut kb = [0u8; 64];
                    let k = key_into(&mut kb, &prefix, c, n);
                    let mut args: Vec<&[u8]> =
                        vec![b"LOCK.ACQUIRE", k, owners[c].as_bytes(), ttl.as_bytes()];
                    args.extend_from_slice(extra);
                    resp(out, &args);
                    Expect::Token
                });
                assert_eq!(
                    run.refused,
                    0,
                    "{} refused on fresh keys",
                    side.mode.label()
                );
                side.acquire.add(ops, &run, &["lock.acquire"]);
                let run = drive(env.srv, env.ctl, load, |c, n, out| {
                    let mut kb = [0u8; 64];
                    let k = key_into(&mut kb, &prefix, c, n);
                    resp(out, &[b"LOCK.RELEASE", k, owners[c].as_bytes()]);
                    Expect::One
                });
                assert_eq!(run.refused, 0, "LOCK.RELEASE refused on held keys");
                side.release.add(ops, &run, &["lock.release"]);
                // Full cycles on distinct keys, the release right behind the acquire.
                flushall(env.ctl);
                let prefix = format!("y{round}{i}");
                let run = drive(env.srv, env.ctl, load, |c, n, out| {
                    let mut kb = [0u8; 64];
                    let k = key_into(&mut kb, &prefix, c, n / 2);
                    if n % 2 == 0 {
                        let mut args: Vec<&[u8]> =
                            vec![b"LOCK.ACQUIRE", k, owners[c].as_bytes(), ttl.as_bytes()];
                        args.extend_from_slice(extra);
                        resp(out, &args);
                        Expect::Token
                    } else {
                        resp(out, &[b"LOCK.RELEASE", k, owners[c].as_bytes()]);
                        Expect::One
                    }
                });
                assert_eq!(run.refused, 0, "a cycle was refused");
                side.cycle
                    .add(ops / 2.0, &run, &["lock.acquire", "lock.release"]);
            }
        }
        flushall(env.ctl);
        self.sides = sides;
    }

    fn intro(&self, o: &mut String, cfg: &Config) {
        let sizes = Sizes::new(cfg.quick);
        let _ = writeln!(
            o,
            "The load generator of the throughput section ({CONNS} connections, {DEPTH} commands \
             in flight each, every reply checked and none refused), {} commands per run, each \
             acquire on a fresh key with a {} s ttl so \
             that each one is a real grant: exclusive, `SHARED`, and `SHARED LIMIT 4`. Then \
             `LOCK.RELEASE` of exactly those keys, and full cycles (acquire and release of \
             distinct keys, pipelined together). {} rounds, the modes' order reversed every other \
             round; ops/s is the median over rounds and the ratio the median of the per-round \
             ratios to the exclusive acquire in the same round.\n",
            f((sizes.tput_p16 / 2) as f64),
            LONG_TTL_MS / 1000,
            sizes.tput_rounds
        );
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/results/instructions_shared.md");
        let _ = writeln!(
            o,
            "CPU time on this machine swings by 30% from run to run, so the same comparison in \
             server instructions (callgrind, which repeats to within 1%) is run apart: `python3 \
             benches/instructions/instructions_shared.py` (about 15 minutes) writes \
             benches/results/instructions_shared.md, \
             shown here as last written:\n"
        );
        match fs::read_to_string(&path) {
            Ok(text) => o.push_str(&text),
            Err(_) => o.push_str("Not measured yet.\n"),
        }
        o.push('\n');
    }
    fn markdown(&self, o: &mut String) {
        let Some(ex) = self.get(Mode::Exclusive) else {
            return;
        };
        let _ = writeln!(
            o,
            "| -P {DEPTH} | ops/s | ratio to exclusive | server busy | server CPU us/op | commandstats usec/op |\n|---|---|---|---|---|---|"
        );
        let row = |o: &mut String, what: &str, t: &Tput, base: &Tput| {
            let _ = writeln!(
                o,
                "| {what} | {} | {} | {:.0}% | {} | {} |",
                f(t.rate()),
                ratio(t.ratio(base)),
                t.busy() * 100.0,
                f(t.cpu_us()),
                f(t.cmd_us())
            );
        };
        for sd in &self.sides {
            row(
                o,
                &format!("`{}`", sd.mode.label()),
                &sd.acquire,
                &ex.acquire,
            );
        }
        for sd in &self.sides {
            row(
                o,
                &format!("`LOCK.RELEASE` of a `{}` hold", sd.mode.label()),
                &sd.release,
                &ex.release,
            );
        }
        for sd in &self.sides {
            row(
                o,
                &format!("cycle: `{}` + `LOCK.RELEASE`", sd.mode.label()),
                &sd.cycle,
                &ex.cycle,
            );
        }
        let _ = writeln!(o);
    }

    fn goals(&self) -> Vec<Goal> {
        let (Some(ex), Some(sh)) = (self.get(Mode::Exclusive), self.get(Mode::Shared)) else {
            return Vec::new();
        };
        let mut g = Vec::new();
        for (what, a, b) in [
            ("acquire", &sh.acquire, &ex.acquire),
            ("acquire + release cycle", &sh.cycle, &ex.cycle),
        ] {
            let r = a.ratio(b);
            g.push(Goal::ratio(
                format!("-P {DEPTH}: uncontended SHARED {what} >= 0.9x the exclusive one"),
                r,
                (a.rate(), b.rate()),
                "ops/s",
                r >= 0.9,
            ));
        }
        g
    }

    fn json(&self) -> Json {
        Json::Arr(
            self.sides
                .iter()
                .map(|sd| {
                    let ex = self.get(Mode::Exclusive).unwrap_or(sd);
                    obj(vec![
                        ("mode", s(sd.mode.id())),
                        ("pipeline", num(DEPTH as f64)),
                        ("acquire", sd.acquire.json()),
                        ("release", sd.release.json()),
                        ("cycle", sd.cycle.json()),
                        ("acquire_ratio", num(sd.acquire.ratio(&ex.acquire))),
                        ("cycle_ratio", num(sd.cycle.ratio(&ex.cycle))),
                    ])
                })
                .collect(),
        )
    }
}
