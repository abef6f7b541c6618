//! Failover: the primary killed and its replica promoted, with and without `WAIT`.

use super::*;
use crate::common::promote;

/// The kind of [`failover`]'s fault.
pub const FAILOVER: &str = "kill -9 of the primary, promotion of the stopped replica";

/// Primaries and replicas keep an AOF (`appendfsync no`: written before each reply, which is
/// all a SIGKILL needs) only so that every token a killed primary issued can be read back.
pub const FORENSIC_AOF: &[&str] = &["--appendonly", "yes", "--appendfsync", "no"];

pub fn failover_async() -> Scenario {
    Scenario::new(
        "failover_async",
        "the replica is SIGSTOPped (misses grants), the primary killed -9, the replica \
         continued and promoted",
        |env| failovers(env, (200, 400), Survival::Informational),
    )
    .server_args(FORENSIC_AOF)
    .with_replica()
    .may_lose_writes()
}

pub fn failover_wait() -> Scenario {
    waited_failovers(
        "failover_wait",
        "as failover_async, with WAIT 1 1000 after every grant and longer ttls: waited \
         locks must survive promotion",
        |env| failovers(env, (50, 150), Survival::WaitAcked),
        false,
    )
}

pub fn failover_durable() -> Scenario {
    waited_failovers(
        "failover_durable",
        "as failover_wait, as the clients' durable=1 does it (WAIT 1 100, the replica stopped \
         50-300 ms): a grant WAIT did not see acknowledged is released at once and never used; \
         every acknowledged hold must survive promotion",
        |env| failovers(env, (50, 300), Survival::WaitAcked),
        true,
    )
}

/// Failovers with `WAIT 1` after every grant (and, `durable`, the unacknowledged grants given
/// back): longer ttls on 6 keys, the forensic AOF, a replica.
fn waited_failovers(
    name: &'static str,
    what: &'static str,
    nemesis: fn(&mut Env),
    durable: bool,
) -> Scenario {
    Scenario::new(name, what, nemesis)
        .server_args(FORENSIC_AOF)
        .with_replica()
        .workload(Config {
            keys: 6,
            ttl_ms: (300, 2000),
            expire_share: 0.3,
            wait_replicas: true,
            durable,
            ..Config::default()
        })
        .may_lose_writes()
}

/// Every 0.4-0.8 s, a [`failover`].
pub fn failovers(env: &mut Env, stop_ms: (u64, u64), survival: Survival) {
    while env.running() {
        env.sleep((400, 800));
        if !env.running() {
            break;
        }
        failover(env, stop_ms, survival);
    }
}

/// Stop the replica for `stop_ms`, kill -9 the primary, continue the replica, `REPLICAOF NO
/// ONE`, read its holds (before the workload can reach it), point the workload at it and give
/// it a new replica. Tokens the dead primary issued are known from its AOF.
pub fn failover(env: &mut Env, stop_ms: (u64, u64), survival: Survival) {
    let replica = env.replica.take().expect("a replica");
    let pid = faults::server_pid(&replica);
    env.inject("SIGSTOP of the replica", None, Effect::Keeps, true, |env| {
        faults::signal(pid, "STOP");
        let pause = env.rng.gen_range(stop_ms.0..=stop_ms.1);
        thread::sleep(ms(pause));
        (
            (),
            format!("pid {pid} for {pause} ms, then the primary is killed"),
        )
    });
    env.observe_high_water();
    env.target.set(None);
    let (fault, ()) = env.inject(FAILOVER, None, Effect::MayLose, true, |env| {
        env.primary.kill9();
        faults::signal(pid, "CONT");
        promote(&replica);
        let mut r = replica.conn();
        wait_until(
            "the promoted replica's role",
            Duration::from_secs(10),
            || info_field(&mut r, "replication", "role").as_deref() == Some("master"),
        );
        ((), format!("new primary on port {}", replica.port()))
    });
    observe_aof_tokens(env, fault, "the dead primary's AOF");
    let dead = std::mem::replace(&mut env.primary, replica);
    env.retired.push(dead);
    env.snapshot(fault, survival);
    env.target.set(Some(env.primary.port()));
    env.replica = Some(env.start_replica());
}
