//! Client pauses in the torture suite: `CLIENT PAUSE ms WRITE` and `... ALL` (50-500 ms) while
//! holders expire into their queues, waiters time out and the workload's clients give up. The
//! server holds every write back then, and the module must write nothing either (issue 17:
//! a handoff from a timer during a pause aborted the server). The usual checks apply (one
//! exclusive holder at a time, tokens in order, fenced writes, every call answered), plus:
//! - `server-survived`: the primary (and the replica) answer `PING` after the last pause and
//!   their logs show no assertion;
//! - `pauses-bite`: some pauses began with clients blocked in the queues, so that deadlines and
//!   timeouts did fall inside them.

use rand::Rng;
use redis::Value;

use crate::history::Effect;
use crate::run::{Env, Scenario};
use crate::scenarios::FORENSIC_AOF;
use crate::workload::Config;

/// Short ttls and many blocking acquires: most pauses see a deadline or a timeout pass.
fn workload() -> Config {
    Config {
        ttl_ms: (30, 300),
        block_share: 0.7,
        block_ms: (50, 600),
        expire_share: 0.3,
        disconnect_share: 0.05,
        multi_share: 0.15,
        ..Config::default()
    }
}

pub fn client_pause() -> Scenario {
    Scenario::new(
        "client_pause",
        "CLIENT PAUSE 50-500 ms WRITE or ALL every 100-400 ms while holds expire into their \
         queues (AOF everysec)",
        pauses,
    )
    .server_args(&["--appendonly", "yes", "--appendfsync", "everysec"])
    .workload(workload())
}

pub fn client_pause_replica() -> Scenario {
    Scenario::new(
        "client_pause_replica",
        "as client_pause, with a replica attached (and the forensic AOF)",
        pauses,
    )
    .server_args(FORENSIC_AOF)
    .with_replica()
    .workload(workload())
}

fn pauses(env: &mut Env) {
    let mut c = env.conn();
    let (mut paused, mut bitten) = (0u64, 0u64);
    while env.running() {
        env.sleep((100, 400));
        let ms = env.rng.gen_range(50..=500u64);
        let kind = env.choose(&["WRITE", "ALL"]).unwrap();
        let blocked: i64 = crate::common::info_field(&mut c, "clients", "blocked_clients")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let name = format!("CLIENT PAUSE {kind}");
        env.inject(&name, None, Effect::Keeps, true, |_| {
            let reply: Value = redis::cmd("CLIENT")
                .arg("PAUSE")
                .arg(ms)
                .arg(kind)
                .query(&mut c)
                .unwrap_or_else(|e| panic!("CLIENT PAUSE: {e}"));
            (
                (),
                format!("{ms} ms, {blocked} blocked at the start, reply={reply:?}"),
            )
        });
        paused += 1;
        bitten += u64::from(blocked > 0);
    }
    // The last pause may still run: a PING waits for it (ALL) and then answers.
    let pong: redis::RedisResult<String> = redis::cmd("PING").query(&mut c);
    let mut servers = vec![("primary", env.primary.log())];
    servers.extend(env.replica.as_ref().map(|r| ("replica", r.log())));
    let replica_up = env
        .replica
        .as_ref()
        .is_none_or(|r| redis::cmd("PING").query::<String>(&mut r.conn()).is_ok());
    let asserted: Vec<&str> = servers
        .iter()
        .filter(|(_, log)| log.contains("ASSERTION FAILED") || log.contains("crashed by signal"))
        .map(|(who, _)| *who)
        .collect();
    env.check(
        "server-survived",
        "the primary and the replica answer PING after the last pause; no assertion in their logs",
        pong.is_ok() && replica_up && asserted.is_empty(),
        || format!("PING {pong:?}, replica up {replica_up}, assertions in {asserted:?}"),
    );
    env.check(
        "pauses-bite",
        "some pauses began with clients blocked in the queues",
        bitten > 0,
        || format!("{bitten} of {paused} pauses began with blocked clients"),
    );
}
