//! Memory of shared holders: `used_memory` with 10,000 keys of 1, 8 and 64 `SHARED` holders
//! each, against one exclusive holder per key, and (for reference) the sorted set a client-side
//! semaphore keeps with the same members. Bytes per holder beyond the first, net of the owner
//! string, is what the goal bounds.

use std::fmt::Write as _;
use std::thread;
use std::time::{Duration, Instant};

use super::memory::{connected_clients, used_memory, wait_clients_gone};
use super::{Env, Scenario};
use crate::config::{Config, CONNS, LONG_TTL_MS};
use crate::load::{drive, key_into, owners, resp, Expect, Load};
use crate::report::{f, num, obj, s, Goal, Json};
use crate::server::flushall;

/// Holders per key.
const HOLDERS: [usize; 3] = [1, 8, 64];
/// The goal: bytes per extra holder beyond its owner string.
const GOAL_BYTES: f64 = 100.0;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    /// One exclusive `LOCK.ACQUIRE` per key.
    Exclusive,
    /// `h` `LOCK.ACQUIRE ... SHARED` per key.
    Shared(usize),
    /// `ZADD key deadline owner`, `h` members per key (and its `PEXPIRE`): a client-side
    /// semaphore's sorted set.
    Zset(usize),
}

impl Kind {
    fn holders(self) -> usize {
        match self {
            Kind::Exclusive => 1,
            Kind::Shared(h) | Kind::Zset(h) => h,
        }
    }
    fn label(self) -> String {
        match self {
            Kind::Exclusive => "`LOCK.ACQUIRE` (exclusive)".into(),
            Kind::Shared(_) => "`LOCK.ACQUIRE ... SHARED`".into(),
            Kind::Zset(_) => "sorted set (`ZADD deadline owner`)".into(),
        }
    }
    fn id(self) -> String {
        match self {
            Kind::Exclusive => "exclusive".into(),
            Kind::Shared(h) => format!("shared_{h}"),
            Kind::Zset(h) => format!("zset_{h}"),
        }
    }
}

struct Measured {
    kind: Kind,
    /// used_memory delta per key (bytes).
    per_key: f64,
    /// `MEMORY USAGE` of one key.
    usage: u64,
}

pub fn new() -> Box<dyn Scenario> {
    Box::new(SharedMemory {
        keys: 0,
        owner_len: 0,
        rows: Vec::new(),
    })
}

pub struct SharedMemory {
    keys: usize,
    owner_len: usize,
    rows: Vec<Measured>,
}

impl SharedMemory {
    fn per_key(&self, kind: Kind) -> Option<f64> {
        self.rows.iter().find(|r| r.kind == kind).map(|r| r.per_key)
    }
    /// Bytes each holder beyond the first adds to a shared key: (h holders - 1 holder) / (h - 1).
    fn marginal(&self, h: usize) -> Option<f64> {
        Some((self.per_key(Kind::Shared(h))? - self.per_key(Kind::Shared(1))?) / (h - 1) as f64)
    }
}

/// `used_memory` once it stops moving: what earlier scenarios left to free in the background
/// (Redis 7.0 trims its pool of blocked-client contexts 50 per cron tick) would otherwise be
/// counted against the first kind measured. Two readings 500 ms apart within 4 KiB, or 20 s.
fn settled_memory(con: &mut redis::Connection) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = used_memory(con);
    loop {
        thread::sleep(Duration::from_millis(500));
        let now = used_memory(con);
        if (now - last).abs() < 4096.0 || Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

impl Scenario for SharedMemory {
    fn run(&mut self, env: &mut Env) {
        let keys = if env.cfg.quick { 2_000 } else { 10_000 } / CONNS * CONNS;
        eprintln!("[shared memory] {keys} keys x {HOLDERS:?} holders");
        let owners = owners(HOLDERS[HOLDERS.len() - 1]);
        let ttl = LONG_TTL_MS.to_string();
        let clients0 = connected_clients(env.ctl);
        let mut kinds = vec![Kind::Exclusive];
        kinds.extend(HOLDERS.iter().map(|&h| Kind::Shared(h)));
        kinds.extend(HOLDERS.iter().filter(|&&h| h > 1).map(|&h| Kind::Zset(h)));
        for kind in kinds {
            let h = kind.holders();
            let prefix = format!("sm:{}", kind.id());
            flushall(env.ctl);
            let before = settled_memory(env.ctl);
            let load = Load {
                conns: CONNS,
                depth: 16,
                per_conn: keys / CONNS * h,
            };
            // Command n of connection c: holder n % h of key n / h, so a key's holders come in a
            // row on one connection and every key ends with exactly h distinct owners.
            let run = drive(env.srv, env.ctl, load, |c, n, out| {
                let mut kb = [0u8; 64];
                let k = key_into(&mut kb, &prefix, c, n / h);
                let owner = owners[n % h].as_bytes();
                match kind {
                    Kind::Exclusive => {
                        resp(out, &[b"LOCK.ACQUIRE", k, owner, ttl.as_bytes()]);
                        Expect::Token
                    }
                    Kind::Shared(_) => {
                        resp(out, &[b"LOCK.ACQUIRE", k, owner, ttl.as_bytes(), b"SHARED"]);
                        Expect::Token
                    }
                    Kind::Zset(_) => {
                        // The score is a deadline in ms, as a client-side semaphore writes it.
                        resp(out, &[b"ZADD", k, b"1767225600000", owner]);
                        Expect::One
                    }
                }
            });
            assert_eq!(
                run.refused, 0,
                "shared memory load: some commands were refused"
            );
            if let Kind::Zset(_) = kind {
                // The expiry a client-side semaphore sets on its key.
                let run = drive(
                    env.srv,
                    env.ctl,
                    Load {
                        per_conn: keys / CONNS,
                        ..load
                    },
                    |c, n, out| {
                        let mut kb = [0u8; 64];
                        let k = key_into(&mut kb, &prefix, c, n);
                        resp(out, &[b"PEXPIRE", k, ttl.as_bytes()]);
                        Expect::One
                    },
                );
                assert_eq!(run.refused, 0, "PEXPIRE refused");
            }
            wait_clients_gone(env.ctl, clients0, 5);
            let after = used_memory(env.ctl);
            let usage: u64 = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(format!("{prefix}:0:0"))
                .query(env.ctl)
                .expect("MEMORY USAGE");
            self.rows.push(Measured {
                kind,
                per_key: (after - before) / keys as f64,
                usage,
            });
        }
        flushall(env.ctl);
        self.keys = keys;
        self.owner_len = owners[0].len();
    }

    fn intro(&self, o: &mut String, _cfg: &Config) {
        let _ = writeln!(
            o,
            "`INFO memory` `used_memory` before and after filling {} keys with `h` holders each \
             ({}-byte owners, distinct within a key, {} s ttl), divided by the keys; `MEMORY \
             USAGE` of one key beside it. *Per holder* divides a key's bytes by its holders; \
             *each extra holder* is (bytes of a key with `h` holders - bytes with 1) / (h - 1), \
             which leaves out the key itself (its name, dict entry and expiry). The sorted set is \
             for reference: a client-side semaphore's `ZADD key deadline owner` with the same \
             owners, and its `PEXPIRE` (sets this small are stored as a listpack).\n",
            f(self.keys as f64),
            self.owner_len,
            LONG_TTL_MS / 1000
        );
    }

    fn markdown(&self, o: &mut String) {
        let _ = writeln!(
            o,
            "| kind | holders per key | bytes per key (used_memory) | per holder | each extra holder | MEMORY USAGE of one key |\n|---|---|---|---|---|---|"
        );
        for r in &self.rows {
            let h = r.kind.holders();
            let extra = match r.kind {
                Kind::Shared(h) if h > 1 => self.marginal(h).map_or("-".into(), f),
                Kind::Zset(h) => self
                    .per_key(Kind::Zset(h))
                    .zip(self.per_key(Kind::Zset(HOLDERS[1])))
                    .filter(|_| h > HOLDERS[1])
                    .map_or("-".into(), |(a, b)| f((a - b) / (h - HOLDERS[1]) as f64)),
                _ => "-".into(),
            };
            let _ = writeln!(
                o,
                "| {} | {h} | {} | {} | {extra} | {} |",
                r.kind.label(),
                f(r.per_key),
                f(r.per_key / h as f64),
                r.usage
            );
        }
        let _ = writeln!(
            o,
            "\nEach extra holder net of its {}-byte owner string: {}. (The sorted set's extra \
             member is measured from 8 to 64 members.)\n",
            self.owner_len,
            HOLDERS
                .iter()
                .filter(|&&h| h > 1)
                .filter_map(|&h| self
                    .marginal(h)
                    .map(|m| format!("{} bytes at {h} holders", f(m - self.owner_len as f64))))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }

    fn goals(&self) -> Vec<Goal> {
        let h = HOLDERS[HOLDERS.len() - 1];
        let Some(m) = self.marginal(h) else {
            return Vec::new();
        };
        let net = m - self.owner_len as f64;
        vec![Goal {
            goal: format!(
                "a shared holder costs <= {GOAL_BYTES:.0} bytes plus its owner string ({h} holders \
                 per key)"
            ),
            measured: format!(
                "{} bytes per extra holder, {} net of the {}-byte owner",
                f(m),
                f(net),
                self.owner_len
            ),
            met: net <= GOAL_BYTES,
        }]
    }

    fn json(&self) -> Json {
        obj(vec![
            ("keys", num(self.keys as f64)),
            ("owner_bytes", num(self.owner_len as f64)),
            (
                "rows",
                Json::Arr(
                    self.rows
                        .iter()
                        .map(|r| {
                            obj(vec![
                                ("kind", s(r.kind.id())),
                                ("holders_per_key", num(r.kind.holders() as f64)),
                                ("bytes_per_key", num(r.per_key)),
                                ("bytes_per_holder", num(r.per_key / r.kind.holders() as f64)),
                                ("memory_usage_one_key", num(r.usage as f64)),
                            ])
                        })
                        .collect(),
                ),
            ),
            (
                "bytes_per_extra_holder",
                Json::Obj(
                    HOLDERS
                        .iter()
                        .filter(|&&h| h > 1)
                        .map(|&h| {
                            (
                                format!("shared_{h}"),
                                num(self.marginal(h).unwrap_or(f64::NAN)),
                            )
                        })
                        .collect(),
                ),
            ),
        ])
    }
}
