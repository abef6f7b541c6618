//! Server restarts: `kill -9` under each persistence setting, `DEBUG RELOAD`, `BGREWRITEAOF`.

use super::*;

pub fn kill9_aof_always() -> Scenario {
    Scenario::new(
        "kill9_aof_always",
        "redis-server is killed with -9 and restarted, AOF with appendfsync always",
        |env| {
            restarts(
                env,
                "kill -9 + restart (appendfsync always)",
                Effect::Keeps,
                Some(Survival::Acked),
            )
        },
    )
    .server_args(APPENDFSYNC_ALWAYS)
}

pub fn kill9_aof_everysec() -> Scenario {
    Scenario::new(
        "kill9_aof_everysec",
        "redis-server is killed with -9 and restarted, AOF with appendfsync everysec",
        |env| {
            restarts(
                env,
                "kill -9 + restart (appendfsync everysec)",
                Effect::MayLose,
                Some(Survival::Informational),
            )
        },
    )
    .server_args(&["--appendonly", "yes", "--appendfsync", "everysec"])
    .may_lose_writes()
}

pub fn kill9_no_persistence() -> Scenario {
    Scenario::new(
        "kill9_no_persistence",
        "redis-server is killed with -9 and restarted with no RDB and no AOF",
        |env| {
            restarts(
                env,
                "kill -9 + restart (no persistence)",
                Effect::Destroys,
                None,
            )
        },
    )
    .may_lose_writes()
}

/// Every 0.3-0.7 s: kill the server with SIGKILL and restart it on the same port and files.
/// The workload cannot reach it until the holds were read back (`survival`).
pub fn restarts(env: &mut Env, kind: &str, effect: Effect, survival: Option<Survival>) {
    while env.running() {
        env.sleep((300, 700));
        if env.running() {
            restart(env, kind, effect, survival);
        }
    }
}

/// One kill -9 and restart. Tokens issued before it are known from `INFO` and from the AOF.
/// Returns how many `LOCK.LOAD`s the AOF's base files hold (written by a rewrite).
fn restart(env: &mut Env, kind: &str, effect: Effect, survival: Option<Survival>) -> u64 {
    env.observe_high_water();
    env.target.set(None);
    let (fault, ()) = env.inject(kind, None, effect, true, |env| {
        env.primary.kill9();
        env.primary.restart();
        ((), String::new())
    });
    // Read before any client is back, so only what the killed server wrote is in there.
    let in_base = observe_aof_tokens(env, fault, "the killed server's AOF");
    if let Some(survival) = survival {
        env.snapshot(fault, survival);
    }
    env.target.set(Some(env.primary.port()));
    in_base
}

pub fn debug_reload() -> Scenario {
    Scenario::new(
        "debug_reload",
        "DEBUG RELOAD (save, flush, load the RDB) in the middle of the workload",
        reloads,
    )
}

/// Every 150-400 ms: `MULTI; DEBUG RELOAD; LOCK.INFO` of every key; `EXEC`. The reads are
/// atomic with the reload, so every acknowledged live hold must be among them (`Acked`).
pub fn reloads(env: &mut Env) {
    let mut c = env.conn();
    while env.running() {
        env.sleep((150, 400));
        let keys = env.keys();
        let mut cmds = vec![redis::cmd("DEBUG").arg("RELOAD").clone()];
        cmds.extend(keys.iter().map(|k| redis::cmd("LOCK.INFO").arg(k).clone()));
        let (replies, invoke, complete) =
            faults::transaction(&env.rec, &mut c, &cmds).expect("MULTI DEBUG RELOAD");
        let fault = env.fault_at(
            "DEBUG RELOAD",
            None,
            Effect::Keeps,
            true,
            invoke,
            complete,
            String::new(),
        );
        env.check(
            "debug-reload-ok",
            "DEBUG RELOAD answers OK",
            replies.first() == Some(&Value::Okay),
            || format!("DEBUG RELOAD answered {:?}", replies.first()),
        );
        let holds = keys
            .iter()
            .zip(&replies[1..])
            .map(|(k, v)| {
                let holders = faults::parse_holders(v).into_iter();
                (
                    k.clone(),
                    holders.map(|(owner, token, _)| (owner, token)).collect(),
                )
            })
            .collect();
        env.rec.snapshot(crate::history::Snapshot {
            fault,
            invoke,
            complete,
            holds,
            survival: Survival::Acked,
        });
    }
}

pub fn bgrewriteaof() -> Scenario {
    Scenario::new(
        "bgrewriteaof",
        "BGREWRITEAOF (plain AOF, no RDB preamble: the module rewrites holds as \
         LOCK.LOAD), with a kill -9 and restart from the rewritten AOF after every second",
        rewrites,
    )
    .server_args(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--aof-use-rdb-preamble",
        "no",
    ])
}

/// Every 100-300 ms: `BGREWRITEAOF` and wait for it to finish; after every second rewrite,
/// kill -9 and restart (the restart loads the rewritten base).
fn rewrites(env: &mut Env) {
    let mut done = 0;
    while env.running() {
        env.sleep((100, 300));
        if !env.running() {
            break;
        }
        env.inject("BGREWRITEAOF", None, Effect::Keeps, true, |env| {
            let mut c = env.conn();
            let reply: String = redis::cmd("BGREWRITEAOF")
                .query(&mut c)
                .expect("BGREWRITEAOF");
            wait_until("the AOF rewrite", Duration::from_secs(20), || {
                info_field(&mut c, "persistence", "aof_rewrite_in_progress").as_deref() == Some("0")
                    && info_field(&mut c, "persistence", "aof_rewrite_scheduled").as_deref()
                        == Some("0")
            });
            ((), reply)
        });
        done += 1;
        if done % 2 == 0 && env.running() {
            let in_base = restart(
                env,
                "kill -9 + restart from a rewritten AOF",
                Effect::Keeps,
                Some(Survival::Acked),
            );
            env.rec.count(
                "LOCK.LOAD commands in the rewritten AOF bases loaded",
                in_base as i64,
            );
        }
    }
}
