//! Memory per blocked waiter, on every server of the matrix: `LOCK.ACQUIRE ... BLOCK 0`
//! against `BLPOP key 0`, each above an idle connection that has sent one command.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use redis::Connection;

use super::memory::{connected_clients, used_memory, wait_clients_gone};
use super::{Env, Scenario};
use crate::config::{Config, LONG_TTL_MS};
use crate::load::resp;
use crate::report::{f, num, obj, Json};
use crate::server::{wait_info, Server};

pub fn new() -> Box<dyn Scenario> {
    Box::new(WaiterMemory {
        waiters: 0,
        lock_waiter_bytes: f64::NAN,
        blpop_waiter_bytes: f64::NAN,
    })
}

pub struct WaiterMemory {
    /// Blocked waiters, and used_memory per waiter above an idle connection that has sent a
    /// command.
    waiters: usize,
    lock_waiter_bytes: f64,
    blpop_waiter_bytes: f64,
}

fn waiters(srv: &Server, ctl: &mut Connection, n: usize) -> [f64; 2] {
    eprintln!("[4] memory: {n} waiters");
    let clients0 = connected_clients(ctl);
    // Waiters: `waiters` connections each send PING (so each has a query buffer, as a blocked
    // client does), then a blocking command; the used_memory difference is the waiting state.
    // Both readings are taken within a second, before the server trims idle query buffers (2 s).
    let mut per_waiter = [0.0; 2];
    for (slot, lock) in [(0, true), (1, false)] {
        let _: () = redis::cmd("DEL").arg("mem:wait").query(ctl).expect("DEL");
        if lock {
            let _: i64 = redis::cmd("LOCK.ACQUIRE")
                .arg("mem:wait")
                .arg("holder")
                .arg(LONG_TTL_MS)
                .query(ctl)
                .expect("LOCK.ACQUIRE holder");
        }
        let mut socks: Vec<TcpStream> = (0..n).map(|_| srv.raw()).collect();
        for s in socks.iter_mut() {
            s.write_all(b"*1\r\n$4\r\nPING\r\n").expect("PING");
        }
        for s in socks.iter_mut() {
            let mut buf = [0u8; 7];
            s.read_exact(&mut buf).expect("PONG");
        }
        let before = used_memory(ctl);
        for s in socks.iter_mut() {
            let mut out = Vec::new();
            let owner = format!("{}", uuid::Uuid::new_v4());
            if lock {
                resp(
                    &mut out,
                    &[
                        b"LOCK.ACQUIRE",
                        b"mem:wait",
                        owner.as_bytes(),
                        b"10000",
                        b"BLOCK",
                        b"0",
                    ],
                );
            } else {
                resp(&mut out, &[b"BLPOP", b"mem:wait", b"0"]);
            }
            s.write_all(&out).expect("blocking command");
        }
        let blocked = wait_info(
            ctl,
            "clients",
            "blocked_clients",
            Duration::from_secs(10),
            |v| v >= n as u64,
        );
        assert_eq!(blocked, n as u64, "not every waiter blocked");
        let after = used_memory(ctl);
        per_waiter[slot] = (after - before) / n as f64;
        drop(socks);
        wait_clients_gone(ctl, clients0, 10);
        let _: () = redis::cmd("DEL").arg("mem:wait").query(ctl).expect("DEL");
    }
    per_waiter
}

impl Scenario for WaiterMemory {
    fn run(&mut self, env: &mut Env) {
        self.waiters = env.sizes.waiters;
        [self.lock_waiter_bytes, self.blpop_waiter_bytes] = waiters(env.srv, env.ctl, self.waiters);
    }
    fn intro(&self, o: &mut String, _cfg: &Config) {
        let mm = self;
        let _ = writeln!(
            o,
            "Waiters: {} connections, each first sends `PING` (so that it has a query buffer, as a \
             blocked client does), then `used_memory` is read; then each sends a blocking command \
             on one key, and once `blocked_clients` shows all of them `used_memory` is read again \
             (both within about a second, before the server trims idle query buffers).\n",
            mm.waiters
        );
    }
    fn markdown(&self, o: &mut String) {
        let mm = self;
        let _ = writeln!(o, "| waiter | bytes per waiter |\n|---|---|");
        let _ = writeln!(
            o,
            "| `LOCK.ACQUIRE key owner 10000 BLOCK 0` (36-byte owner) | {} |",
            f(mm.lock_waiter_bytes)
        );
        let _ = writeln!(
            o,
            "| `BLPOP key 0` (reference) | {} |\n",
            f(mm.blpop_waiter_bytes)
        );
        let _ = writeln!(
            o,
            "Most of a blocked `LOCK.ACQUIRE`'s size is Redis's, not the module's queue entry: \
             `RedisModule_BlockClient` gives every blocked client a reply client of its own \
             (`createClient(NULL)`, with a 16 KB reply buffer), which `BLPOP` does not need. \
             At `lock.max-waiters` (10000 per key by default) that is about {} MB for one full \
             queue.\n",
            f(mm.lock_waiter_bytes * 10_000.0 / 1e6)
        );
    }
    fn json(&self) -> Json {
        obj(vec![
            ("waiters", num(self.waiters as f64)),
            ("lock_waiter_bytes", num(self.lock_waiter_bytes)),
            ("blpop_waiter_bytes", num(self.blpop_waiter_bytes)),
        ])
    }
}
