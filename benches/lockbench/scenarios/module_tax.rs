//! What loading the module costs other writes: the same `SET NX PX` and `INCR` load on the
//! module's server and on a second `redis-server` without the module, alternating.

use std::fmt::Write as _;

use redis::Connection;

use super::throughput::Tput;
use super::{Env, Scenario};
use crate::config::{Config, Sizes, CONNS, LONG_TTL_MS};
use crate::load::{drive, key_into, owners, resp, take, Expect, Load};
use crate::report::{f, obj, ratio, Json};
use crate::server::{flushall, Server};

pub fn new() -> Box<dyn Scenario> {
    Box::new(ModuleTax { tax: None })
}

pub struct ModuleTax {
    tax: Option<Tax>,
}

/// What loading the module costs commands that have nothing to do with locks: the same
/// `SET NX PX` and `INCR` load on our server and on a second `redis-server` without the module,
/// alternating, plus `LOCK.ACQUIRE` in the same rounds.
struct Tax {
    /// `LOCK.ACQUIRE` on fresh keys (module server).
    acquire: Tput,
    /// `SET NX PX` on fresh keys, on the module server and on the plain server.
    set_module: Tput,
    set_plain: Tput,
    /// `INCR` of one counter per connection, on the module server and on the plain server.
    incr_module: Tput,
    incr_plain: Tput,
}

fn module_tax(cfg: &Config, srv: &Server, ctl: &mut Connection, sizes: &Sizes) -> Option<Tax> {
    if cfg.existing_port.is_some() {
        return None;
    }
    let plain = match Server::spawn(&cfg.server_bin, None, &[]) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("    cannot start a server without the module ({e}); skipped");
            return None;
        }
    };
    let mut pctl = plain.connect();
    eprintln!("[1] module tax: the same writes on a server without the module");
    let owners = owners(CONNS);
    let ttl = LONG_TTL_MS.to_string();
    let load = Load {
        conns: CONNS,
        depth: 16,
        per_conn: sizes.tput_p16 / CONNS,
    };
    let ops = (load.per_conn * CONNS) as f64;
    let mut tax = Tax {
        acquire: Tput::named("LOCK.ACQUIRE (module loaded)"),
        set_module: Tput::named("SET NX PX (module loaded)"),
        set_plain: Tput::named("SET NX PX (no module)"),
        incr_module: Tput::named("INCR (module loaded)"),
        incr_plain: Tput::named("INCR (no module)"),
    };
    for round in 0..sizes.tput_rounds {
        let mut order = [0, 1, 2, 3, 4];
        if round % 2 == 1 {
            order.reverse();
        }
        for which in order {
            let (server, con) = if which == 2 || which == 4 {
                (&plain, &mut pctl)
            } else {
                (srv, &mut *ctl)
            };
            flushall(con);
            let prefix = format!("x{round}");
            let run = drive(server, con, load, |c, i, out| {
                let mut kb = [0u8; 64];
                let k = key_into(&mut kb, &prefix, c, i);
                let owner = owners[c].as_bytes();
                match which {
                    0..=2 => take(out, which == 0, k, owner, ttl.as_bytes()),
                    _ => {
                        let k = key_into(&mut kb, "counter", c, 0);
                        resp(out, &[b"INCR", k]);
                        Expect::Token
                    }
                }
            });
            match which {
                0 => tax.acquire.add(ops, &run, &["lock.acquire"]),
                1 => tax.set_module.add(ops, &run, &["set"]),
                2 => tax.set_plain.add(ops, &run, &["set"]),
                3 => tax.incr_module.add(ops, &run, &["incr"]),
                _ => tax.incr_plain.add(ops, &run, &["incr"]),
            }
        }
    }
    flushall(ctl);
    Some(tax)
}

impl Scenario for ModuleTax {
    fn run(&mut self, env: &mut Env) {
        self.tax = module_tax(env.cfg, env.srv, env.ctl, env.sizes);
    }
    fn intro(&self, o: &mut String, _cfg: &Config) {
        let _ = writeln!(
            o,
            "The throughput tables run the classic pattern on the server that has the module \
             loaded. The module watches lock keys through its data \
             type's unlink callback and subscribes to no keyspace events, so writes to other \
             keys should cost what they cost without it. To check, the same `-P 16` load \
             runs on a second `redis-server` without the module, started by the benchmark \
             the same way, alternating with the module's server in each round.\n"
        );
    }
    fn markdown(&self, o: &mut String) {
        let Some(tax) = &self.tax else {
            let _ = writeln!(o, "Not measured (no server of our own to compare with).\n");
            return;
        };
        let _ = writeln!(
            o,
            "| command | ops/s | server CPU us/op | commandstats usec/op |\n|---|---|---|---|"
        );
        for t in [
            &tax.acquire,
            &tax.set_module,
            &tax.set_plain,
            &tax.incr_module,
            &tax.incr_plain,
        ] {
            let _ = writeln!(
                o,
                "| `{}` | {} | {} | {} |",
                t.name,
                f(t.rate()),
                f(t.cpu_us()),
                f(t.cmd_us())
            );
        }
        let _ = writeln!(
            o,
            "\nLoading the module adds {} us of commandstats time to each `SET NX PX` ({} -> {}) \
             and {} us to each `INCR` ({} -> {}). `LOCK.ACQUIRE` against `SET NX PX` on the \
             server without the module: {} throughput, {} the server CPU per operation.\n",
            f(tax.set_module.cmd_us() - tax.set_plain.cmd_us()),
            f(tax.set_plain.cmd_us()),
            f(tax.set_module.cmd_us()),
            f(tax.incr_module.cmd_us() - tax.incr_plain.cmd_us()),
            f(tax.incr_plain.cmd_us()),
            f(tax.incr_module.cmd_us()),
            ratio(tax.acquire.ratio(&tax.set_plain)),
            ratio(tax.acquire.cpu_us() / tax.set_plain.cpu_us())
        );
    }
    fn json(&self) -> Json {
        match &self.tax {
            None => Json::Arr(Vec::new()),
            Some(t) => obj(vec![
                ("acquire_module", t.acquire.json()),
                ("set_nx_px_module", t.set_module.json()),
                ("set_nx_px_no_module", t.set_plain.json()),
                ("incr_module", t.incr_module.json()),
                ("incr_no_module", t.incr_plain.json()),
            ]),
        }
    }
}
