//! Uncontended throughput: `LOCK.ACQUIRE` / `LOCK.RELEASE` against `SET NX PX` / the `EVALSHA`
//! release script, single commands and full cycles, at `-P 16` and `-P 1`, with a
//! `redis-benchmark` cross-check. Runs on the headline servers, bare and in production setting.

use std::fmt::Write as _;
use std::process::{Command, Stdio};

use redis::Connection;

use super::{Env, Scenario};
use crate::config::{Config, Sizes, CONNS, DRIVER_THREADS, LONG_TTL_MS};
use crate::load::{drive, fill, key_into, owners, resp, take, Expect, Load, Run};
use crate::report::{f, num, obj, ratio, s, Goal, Json};
use crate::server::{commandstats, flushall, reset_stats, server_cpu, Server};
use crate::stats::median;

pub fn new() -> Box<dyn Scenario> {
    Box::new(Throughput { modes: Vec::new() })
}

/// The results of both pipelining modes on one server.
pub struct Throughput {
    modes: Vec<TputMode>,
}

/// One contender's samples in the throughput scenario (one per round).
#[derive(Clone, Debug, Default)]
pub struct Tput {
    pub name: String,
    /// Per round: operations done (commands, or cycles), seconds, server CPU seconds, and
    /// `INFO commandstats` usec of the top-level commands.
    pub ops: Vec<f64>,
    secs: Vec<f64>,
    cpu: Vec<f64>,
    cmd_usec: Vec<f64>,
    /// Operations refused (should be 0: every key is fresh, every release is of a held lock).
    refused: u64,
}

impl Tput {
    pub fn named(name: &str) -> Tput {
        Tput {
            name: name.into(),
            ..Tput::default()
        }
    }
    pub fn add(&mut self, ops: f64, run: &Run, cmds: &[&str]) {
        self.ops.push(ops);
        self.secs.push(run.secs);
        self.cpu.push(run.cpu);
        self.cmd_usec.push(run.usec_of(cmds));
        self.refused += run.refused;
    }
    pub fn rates(&self) -> Vec<f64> {
        self.ops
            .iter()
            .zip(&self.secs)
            .map(|(o, s)| o / s)
            .collect()
    }
    pub fn rate(&self) -> f64 {
        median(&self.rates())
    }
    /// Server CPU per operation in microseconds, over all rounds.
    pub fn cpu_us(&self) -> f64 {
        self.cpu.iter().sum::<f64>() * 1e6 / self.ops.iter().sum::<f64>()
    }
    /// Share of one core the server used while the contender ran (1.0: saturated, so the
    /// throughput is the server's; well below: the clients set the pace).
    pub fn busy(&self) -> f64 {
        self.cpu.iter().sum::<f64>() / self.secs.iter().sum::<f64>()
    }
    /// `INFO commandstats` usec per operation, over all rounds.
    pub fn cmd_us(&self) -> f64 {
        self.cmd_usec.iter().sum::<f64>() / self.ops.iter().sum::<f64>()
    }
    /// Median of the per-round throughput ratios self / other (rounds ran back to back).
    pub fn ratio(&self, other: &Tput) -> f64 {
        let r: Vec<f64> = self
            .rates()
            .iter()
            .zip(other.rates())
            .map(|(a, b)| a / b)
            .collect();
        median(&r)
    }
}

/// The throughput results of one pipelining mode.
struct TputMode {
    /// Commands in flight per connection.
    depth: usize,
    /// Single commands: acquire on fresh keys, then release of exactly those keys.
    acquire: Tput,
    set_nx: Tput,
    release: Tput,
    evalsha: Tput,
    /// Full cycles on distinct keys (one operation = acquire + release).
    cycle_lock: Tput,
    cycle_eval: Tput,
    cycle_del: Tput,
    /// redis-benchmark cross-check: LOCK.ACQUIRE and SET NX PX on random keys.
    rb_acquire: Tput,
    rb_set: Tput,
}

fn throughput(
    srv: &Server,
    ctl: &mut Connection,
    sizes: &Sizes,
    cfg: &Config,
    sha: &str,
) -> Vec<TputMode> {
    let owners = owners(CONNS);
    let ttl = LONG_TTL_MS.to_string();
    let mut modes = Vec::new();
    for (depth, total) in [(16, sizes.tput_p16), (1, sizes.tput_p1)] {
        eprintln!(
            "[1] throughput, {CONNS} connections, {depth} in flight each, {total} commands per run"
        );
        let per_conn = total / CONNS;
        let load = Load {
            conns: CONNS,
            depth,
            per_conn,
        };
        let cycles_load = Load {
            per_conn: per_conn / 2 * 2,
            ..load
        };
        let mut m = TputMode {
            depth,
            acquire: Tput::named("LOCK.ACQUIRE"),
            set_nx: Tput::named("SET NX PX"),
            release: Tput::named("LOCK.RELEASE"),
            evalsha: Tput::named("EVALSHA release script"),
            cycle_lock: Tput::named("LOCK.ACQUIRE + LOCK.RELEASE"),
            cycle_eval: Tput::named("SET NX PX + EVALSHA"),
            cycle_del: Tput::named("SET NX PX + DEL (floor)"),
            rb_acquire: Tput::named("LOCK.ACQUIRE (redis-benchmark)"),
            rb_set: Tput::named("SET NX PX (redis-benchmark)"),
        };
        for round in 0..sizes.tput_rounds {
            let lock_first = round % 2 == 0;
            // Acquire on fresh keys, then release exactly those keys; same for the classic side.
            for side in if lock_first {
                [true, false]
            } else {
                [false, true]
            } {
                flushall(ctl);
                let prefix = format!("t{round}{}", if side { 'L' } else { 'C' });
                let ops = (per_conn * CONNS) as f64;
                let taken = fill(srv, ctl, load, &prefix, side, &owners, &ttl);
                let released = drive(srv, ctl, load, |c, i, out| {
                    let mut kb = [0u8; 64];
                    let k = key_into(&mut kb, &prefix, c, i);
                    let owner = owners[c].as_bytes();
                    if side {
                        resp(out, &[b"LOCK.RELEASE", k, owner]);
                    } else {
                        resp(out, &[b"EVALSHA", sha.as_bytes(), b"1", k, owner]);
                    }
                    Expect::One
                });
                if side {
                    m.acquire.add(ops, &taken, &["lock.acquire"]);
                    m.release.add(ops, &released, &["lock.release"]);
                } else {
                    m.set_nx.add(ops, &taken, &["set"]);
                    m.evalsha.add(ops, &released, &["evalsha"]);
                }
            }
            // Full cycles on distinct keys: acquire then release of the same key, back to back on
            // one connection (pipelined together when depth > 1).
            let order: [usize; 3] = if lock_first { [0, 1, 2] } else { [2, 1, 0] };
            for which in order {
                flushall(ctl);
                let prefix = format!("c{round}{which}");
                let cycles = (cycles_load.per_conn / 2 * CONNS) as f64;
                let run = drive(srv, ctl, cycles_load, |c, i, out| {
                    let mut kb = [0u8; 64];
                    let k = key_into(&mut kb, &prefix, c, i / 2);
                    let owner = owners[c].as_bytes();
                    match (which, i % 2) {
                        (_, 0) => take(out, which == 0, k, owner, ttl.as_bytes()),
                        (0, _) => {
                            resp(out, &[b"LOCK.RELEASE", k, owner]);
                            Expect::One
                        }
                        (1, _) => {
                            resp(out, &[b"EVALSHA", sha.as_bytes(), b"1", k, owner]);
                            Expect::One
                        }
                        _ => {
                            resp(out, &[b"DEL", k]);
                            Expect::One
                        }
                    }
                });
                match which {
                    0 => m
                        .cycle_lock
                        .add(cycles, &run, &["lock.acquire", "lock.release"]),
                    1 => m.cycle_eval.add(cycles, &run, &["set", "evalsha"]),
                    _ => m.cycle_del.add(cycles, &run, &["set", "del"]),
                }
            }
            // Cross-check with redis-benchmark (random keys in a 10^8 keyspace, so nearly every
            // command finds a fresh key; the few repeats are refused the same way on both sides).
            for side in if lock_first {
                [true, false]
            } else {
                [false, true]
            } {
                flushall(ctl);
                let args: Vec<String> = if side {
                    ["LOCK.ACQUIRE", "rb:__rand_int__", &owners[0], &ttl]
                        .map(String::from)
                        .to_vec()
                } else {
                    ["SET", "rb:__rand_int__", &owners[0], "NX", "PX", &ttl]
                        .map(String::from)
                        .to_vec()
                };
                if let Some((ops, run)) =
                    redis_benchmark(cfg, srv, ctl, depth, per_conn * CONNS, &args)
                {
                    if side {
                        m.rb_acquire.add(ops, &run, &["lock.acquire"]);
                    } else {
                        m.rb_set.add(ops, &run, &["set"]);
                    }
                }
            }
        }
        flushall(ctl);
        modes.push(m);
    }
    modes
}

/// Run `redis-benchmark -c 50 -P depth -r 10^8 --csv <args>`; returns (commands, measurements),
/// with the wall time taken from its own requests-per-second figure.
fn redis_benchmark(
    cfg: &Config,
    srv: &Server,
    ctl: &mut Connection,
    depth: usize,
    n: usize,
    args: &[String],
) -> Option<(f64, Run)> {
    reset_stats(ctl);
    let cpu0 = server_cpu(ctl);
    let out = Command::new(&cfg.benchmark_bin)
        .args(["-h", "127.0.0.1", "-p", &srv.port.to_string()])
        .args([
            "-c",
            &CONNS.to_string(),
            "-n",
            &n.to_string(),
            "-P",
            &depth.to_string(),
        ])
        .args(["-r", "100000000", "--csv"])
        .args(args)
        .stderr(Stdio::null())
        .output();
    let out = match out {
        Ok(o) if o.status.success() => o,
        other => {
            eprintln!("    redis-benchmark unavailable or failed ({other:?}); cross-check skipped");
            return None;
        }
    };
    let cpu = server_cpu(ctl) - cpu0;
    let cmd = commandstats(ctl);
    let text = String::from_utf8_lossy(&out.stdout);
    let rps: f64 = text
        .lines()
        .nth(1)?
        .split("\",\"")
        .nth(1)?
        .trim_matches('"')
        .parse()
        .ok()?;
    let calls = cmd
        .get(if args[0] == "SET" {
            "set"
        } else {
            "lock.acquire"
        })
        .map_or(0, |c| c.0);
    let ops = calls as f64;
    let run = Run {
        done: calls,
        refused: 0,
        secs: ops / rps,
        cpu,
        cmd,
    };
    Some((ops, run))
}

impl Tput {
    pub fn json(&self) -> Json {
        obj(vec![
            ("name", s(&self.name)),
            ("ops_per_s_median", num(self.rate())),
            (
                "ops_per_s_rounds",
                Json::Arr(self.rates().into_iter().map(num).collect()),
            ),
            ("server_cpu_us_per_op", num(self.cpu_us())),
            ("commandstats_usec_per_op", num(self.cmd_us())),
            ("refused", num(self.refused as f64)),
        ])
    }
}

impl Scenario for Throughput {
    fn run(&mut self, env: &mut Env) {
        self.modes = throughput(env.srv, env.ctl, env.sizes, env.cfg, env.sha);
    }

    fn goals(&self) -> Vec<Goal> {
        let mut g = Vec::new();
        for m in &self.modes {
            let d = m.depth;
            let r = m.acquire.ratio(&m.set_nx);
            g.push(Goal::ratio(
                format!("-P {d}: LOCK.ACQUIRE >= 0.9x SET NX PX throughput"),
                r,
                (m.acquire.rate(), m.set_nx.rate()),
                "ops/s",
                r >= 0.9,
            ));
            let r = m.release.ratio(&m.evalsha);
            g.push(Goal::ratio(
                format!("-P {d}: LOCK.RELEASE >= 1.3x EVALSHA throughput"),
                r,
                (m.release.rate(), m.evalsha.rate()),
                "ops/s",
                r >= 1.3,
            ));
            let (lock, eval, del) = (
                m.cycle_lock.cpu_us(),
                m.cycle_eval.cpu_us(),
                m.cycle_del.cpu_us(),
            );
            g.push(Goal::ratio(
                format!("-P {d}: full cycle >= 2x cheaper in server CPU than SET NX PX + EVALSHA"),
                eval / lock,
                (lock, eval),
                "us/cycle",
                eval / lock >= 2.0,
            ));
            g.push(Goal::ratio(
                format!("-P {d}: full cycle within 25% of the SET NX PX + DEL floor (server CPU)"),
                lock / del,
                (lock, del),
                "us/cycle",
                lock / del <= 1.25,
            ));
        }
        g
    }

    fn intro(&self, o: &mut String, cfg: &Config) {
        let cfg_rounds = |cfg: &Config| Sizes::new(cfg.quick).tput_rounds;
        let _ = writeln!(
            o,
            "{CONNS} connections driven by the benchmark's own load generator ({DRIVER_THREADS} \
             threads, raw RESP, every reply checked), 16 commands in flight per connection \
             (`-P 16`) or one. Fairness: every `LOCK.ACQUIRE` and every `SET NX PX` goes to a \
             fresh key (`t<round><side>:<conn>:<i>`, same length on both sides) with the same \
             36-byte owner and a {} s ttl, so each one succeeds and does the full work of a grant; \
             then `LOCK.RELEASE` and the `EVALSHA` release script are run on exactly the keys just \
             taken, so each one finds its owner and deletes. Cycles take and release distinct keys, \
             the release right behind the acquire on the same connection. `FLUSHALL` and \
             `CONFIG RESETSTAT` before each run; {} rounds, the order of the sides flipping each \
             round. ops/s is the median over rounds and the ratio the median of the per-round \
             ratios; server CPU is the `INFO cpu` (user + sys) delta over all rounds divided by the \
             operations, and `usec/op` the `INFO commandstats` time of the top-level commands \
             (for `EVALSHA` it includes the script's `GET` and `DEL`).\n",
            LONG_TTL_MS / 1000,
            cfg_rounds(cfg)
        );
        let _ = writeln!(
            o,
            "*Server busy* is the server's CPU time over the wall time (100%: one core saturated, \
             so the throughput is the server's own). At `-P 1` most of the server's CPU goes to \
             reading and writing the sockets once per command, the same for every command, so the \
             throughput ratios shrink toward 1 and CPU per operation also depends on how many \
             clients each event-loop turn finds ready; `commandstats usec/op` is the command's own \
             cost there.\n"
        );
    }

    fn markdown(&self, o: &mut String) {
        for mode in &self.modes {
            let _ = writeln!(o, "#### -P {}\n", mode.depth);
            let _ = writeln!(
                o,
                "| command | ops/s | ratio | server busy | server CPU us/op | commandstats usec/op | refused |\n|---|---|---|---|---|---|---|"
            );
            for (a, b) in [
                (&mode.acquire, &mode.set_nx),
                (&mode.release, &mode.evalsha),
            ] {
                for (t, r) in [(a, a.ratio(b)), (b, 1.0)] {
                    let _ = writeln!(
                        o,
                        "| `{}` | {} | {} | {:.0}% | {} | {} | {} |",
                        t.name,
                        f(t.rate()),
                        ratio(r),
                        t.busy() * 100.0,
                        f(t.cpu_us()),
                        f(t.cmd_us()),
                        t.refused
                    );
                }
            }
            let _ = writeln!(o);
            let _ = writeln!(
                o,
                "| full cycle (distinct keys) | cycles/s | throughput ratio to lock | server busy | server CPU us/cycle | CPU ratio to lock | commandstats usec/cycle |\n|---|---|---|---|---|---|---|"
            );
            for t in [&mode.cycle_lock, &mode.cycle_eval, &mode.cycle_del] {
                let _ = writeln!(
                    o,
                    "| `{}` | {} | {} | {:.0}% | {} | {} | {} |",
                    t.name,
                    f(t.rate()),
                    ratio(t.ratio(&mode.cycle_lock)),
                    t.busy() * 100.0,
                    f(t.cpu_us()),
                    ratio(t.cpu_us() / mode.cycle_lock.cpu_us()),
                    f(t.cmd_us())
                );
            }
            let _ = writeln!(o);
            if !mode.rb_acquire.ops.is_empty() && !mode.rb_set.ops.is_empty() {
                let _ = writeln!(
                    o,
                    "Cross-check with `redis-benchmark -c {CONNS} -P {} -r 100000000` on random keys \
                     (`rb:__rand_int__`): `LOCK.ACQUIRE` {} ops/s ({} us CPU/op), `SET NX PX` {} \
                     ops/s ({} us CPU/op), ratio {}.\n",
                    mode.depth,
                    f(mode.rb_acquire.rate()),
                    f(mode.rb_acquire.cpu_us()),
                    f(mode.rb_set.rate()),
                    f(mode.rb_set.cpu_us()),
                    ratio(mode.rb_acquire.ratio(&mode.rb_set))
                );
            }
        }
    }

    fn json(&self) -> Json {
        let modes: Vec<Json> = self
            .modes
            .iter()
            .map(|md| {
                obj(vec![
                    ("pipeline", num(md.depth as f64)),
                    ("acquire", md.acquire.json()),
                    ("set_nx_px", md.set_nx.json()),
                    ("acquire_ratio", num(md.acquire.ratio(&md.set_nx))),
                    ("release", md.release.json()),
                    ("evalsha_release", md.evalsha.json()),
                    ("release_ratio", num(md.release.ratio(&md.evalsha))),
                    ("cycle_lock", md.cycle_lock.json()),
                    ("cycle_set_evalsha", md.cycle_eval.json()),
                    ("cycle_set_del", md.cycle_del.json()),
                    (
                        "cycle_cpu_ratio_evalsha_to_lock",
                        num(md.cycle_eval.cpu_us() / md.cycle_lock.cpu_us()),
                    ),
                    (
                        "cycle_cpu_ratio_lock_to_floor",
                        num(md.cycle_lock.cpu_us() / md.cycle_del.cpu_us()),
                    ),
                    ("redis_benchmark_acquire", md.rb_acquire.json()),
                    ("redis_benchmark_set_nx_px", md.rb_set.json()),
                ])
            })
            .collect();
        Json::Arr(modes)
    }
}
