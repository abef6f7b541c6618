//! Memory pressure: `maxmemory` below used memory with `noeviction`, and with `allkeys-lru`.

use super::*;

const OOM_WINDOW: &str = "maxmemory below used memory (noeviction)";

pub fn maxmemory_noeviction() -> Scenario {
    Scenario::new(
        "maxmemory_noeviction",
        "maxmemory set below used memory with noeviction, for 100-250 ms at a time",
        oom_windows,
    )
    .server_args(&["--maxmemory-policy", "noeviction"])
    .post(oom_refuses_grants_not_releases)
}

/// `CONFIG SET maxmemory limit` (0: no limit).
fn set_maxmemory(c: &mut redis::Connection, limit: i64) {
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(limit)
        .query::<()>(c)
        .expect("CONFIG SET maxmemory")
}

/// Every 150-350 ms: `CONFIG SET maxmemory` to half the used memory for 100-250 ms, then back
/// to 0. The fault's interval is the window in which the limit certainly applied.
fn oom_windows(env: &mut Env) {
    let mut c = env.conn();
    while env.running() {
        env.sleep((150, 350));
        let used: i64 = info_field(&mut c, "memory", "used_memory")
            .and_then(|u| u.parse().ok())
            .expect("used_memory");
        set_maxmemory(&mut c, used / 2);
        let invoke = env.now();
        env.sleep((100, 250));
        let complete = env.now();
        set_maxmemory(&mut c, 0);
        env.fault_at(
            OOM_WINDOW,
            None,
            Effect::Keeps,
            true,
            invoke,
            complete,
            format!("maxmemory {} (used {used})", used / 2),
        );
    }
}

/// Pass: inside a window, every `LOCK.ACQUIRE` answers the `OOM` error (none is granted), and
/// every `LOCK.RELEASE` answers 1 or 0 (never an error: releasing frees memory). At least one
/// `OOM` was seen (else the scenario tested nothing).
fn oom_refuses_grants_not_releases(h: &History, _v: &Verdict) -> Vec<Check> {
    let mut acquire = Check::new(
        "oom-refuses-acquire",
        "under maxmemory with noeviction, LOCK.ACQUIRE answers OOM (and at least one did)",
    );
    let mut release = Check::new(
        "oom-allows-release",
        "under maxmemory with noeviction, LOCK.RELEASE still answers 1 or 0",
    );
    let mut ooms = 0;
    for f in h.faults.iter().filter(|f| f.kind == OOM_WINDOW) {
        for e in h
            .entries
            .iter()
            .filter(|e| e.invoke > f.invoke && e.complete < f.complete)
        {
            match e.op {
                Op::Acquire { .. } => {
                    acquire.checked += 1;
                    if e.reply.starts_with("OOM") {
                        ooms += 1;
                    } else {
                        acquire.violations.push(format!("{f}\n      {e}"));
                    }
                }
                Op::Release => {
                    release.checked += 1;
                    if e.outcome == Outcome::Fail && e.reply != "0" {
                        release.violations.push(format!("{f}\n      {e}"));
                    }
                }
                _ => {}
            }
        }
    }
    if ooms == 0 {
        acquire
            .violations
            .push("no LOCK.ACQUIRE answered OOM: the windows never bit".to_string());
    }
    vec![acquire, release]
}

pub fn maxmemory_allkeys_lru() -> Scenario {
    Scenario::new(
        "maxmemory_allkeys_lru",
        "maxmemory 1 byte with allkeys-lru for an instant: every key, locks included, \
         is evicted",
        evictions,
    )
    .server_args(&["--maxmemory-policy", "allkeys-lru"])
    .may_lose_writes()
}

/// Every 150-350 ms: take a probe lock, set `maxmemory 1`, write once (the server evicts every
/// key it can), check the probe is gone, lift the limit, take the probe lock again. Pass: the
/// evicted lock's next token is larger.
fn evictions(env: &mut Env) {
    let mut c = env.conn();
    let mut n = 0;
    while env.running() {
        env.sleep((150, 350));
        n += 1;
        let probe = format!("probe:{n}");
        let acquire = |c: &mut redis::Connection, owner: &str| -> Option<i64> {
            redis::cmd("LOCK.ACQUIRE")
                .arg(&probe)
                .arg(owner)
                .arg(60_000)
                .query(c)
                .ok()
        };
        let Some(first) = acquire(&mut c, "probe-a") else {
            continue;
        };
        env.rec
            .observe(env.now(), first, format!("probe lock {probe}"));
        let (_, evicted) = env.inject(
            "maxmemory 1 byte (allkeys-lru): every key evicted",
            None,
            Effect::MayLose,
            true,
            |_| {
                set_maxmemory(&mut c, 1);
                let write: Value = redis::cmd("SET")
                    .arg(format!("filler:{n}"))
                    .arg("x")
                    .query(&mut c)
                    .unwrap_or(Value::Nil);
                let gone: i64 = redis::cmd("EXISTS")
                    .arg(&probe)
                    .query(&mut c)
                    .expect("EXISTS");
                set_maxmemory(&mut c, 0);
                (
                    gone == 0,
                    format!("SET answered {write:?}; probe evicted: {}", gone == 0),
                )
            },
        );
        if evicted {
            env.rec.count("lock keys evicted (probes)", 1);
            let next = acquire(&mut c, "probe-b");
            env.check(
                "evicted-lock-next-token-larger",
                "after a lock key is evicted, its next grant has a larger token",
                next.is_some_and(|t| t > first),
                || format!("{probe}: token {first} before eviction, {next:?} after"),
            );
        }
        let _: i64 = redis::cmd("DEL")
            .arg(&probe)
            .query(&mut c)
            .expect("DEL probe");
    }
    let evicted = info_field(&mut c, "stats", "evicted_keys")
        .and_then(|e| e.parse().ok())
        .unwrap_or(0);
    env.rec.count("keys evicted (INFO stats)", evicted);
}
