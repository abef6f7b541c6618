//! ACL: users whose key patterns allow no lock key, or only reads of them, probe every lock command.

use super::*;

pub fn acl() -> Scenario {
    Scenario::new(
        "acl",
        "users limited to ~other:* and to %R~lock:* probe the lock keys while they are used",
        acl_probes,
    )
}

/// Every 20-80 ms, on a random key (and its live owner and token, read as the admin):
/// - as `other` (`~other:*`): pass: every lock command answers `NOPERM`;
/// - as `reader` (`%R~lock:*`): pass: `LOCK.FENCE` (with and without a token) and `LOCK.INFO`
///   answer, the writes answer `NOPERM`.
fn acl_probes(env: &mut Env) {
    let mut admin = env.conn();
    for rule in [
        ["SETUSER", "other", "on", ">pw", "~other:*", "+@all"],
        ["SETUSER", "reader", "on", ">pw", "%R~lock:*", "+@all"],
    ] {
        redis::cmd("ACL")
            .arg(&rule)
            .query::<()>(&mut admin)
            .expect("ACL SETUSER");
    }
    let mut other = faults::conn_as(&env.primary, "other", "pw");
    let mut reader = faults::conn_as(&env.primary, "reader", "pw");
    while env.running() {
        env.sleep((20, 80));
        let key = env.random_key();
        let (owner, token) = match faults::lock_info(&mut admin, &key) {
            Some((owner, token, _)) => (owner, token),
            None => ("nobody".to_string(), 1),
        };
        let token = token.to_string();
        let acquire = ["LOCK.ACQUIRE", &key, "intruder", "1000"];
        let acquire_block = ["LOCK.ACQUIRE", &key, "intruder", "1000", "BLOCK", "10"];
        let release = ["LOCK.RELEASE", &key, &owner];
        let extend = ["LOCK.EXTEND", &key, &owner, "100000"];
        let fence = ["LOCK.FENCE", &key];
        let fence_token = ["LOCK.FENCE", &key, &token];
        let info = ["LOCK.INFO", &key];
        let writes: [&[&str]; 4] = [&acquire, &acquire_block, &release, &extend];
        let reads: [&[&str]; 3] = [&fence, &fence_token, &info];
        env.inject(
            "ACL probe as a ~other:* user",
            None,
            Effect::Keeps,
            false,
            |env| {
                for cmd in writes.iter().chain(reads.iter()) {
                    let r = faults::raw(&mut other, cmd);
                    env.check(
                    "acl-denies-foreign-user",
                    "a user limited to ~other:* gets NOPERM for every lock command on a lock key",
                    is_error(Some(&r), "NOPERM"),
                    || format!("{cmd:?} as other: {r:?}"),
                );
                }
                ((), key.clone())
            },
        );
        env.inject(
            "ACL probe as a %R~lock:* user",
            None,
            Effect::Keeps,
            false,
            |env| {
                for cmd in writes {
                    let r = faults::raw(&mut reader, cmd);
                    env.check(
                        "acl-read-only-no-writes",
                        "a %R~lock:* user gets NOPERM for LOCK.ACQUIRE, RELEASE and EXTEND",
                        is_error(Some(&r), "NOPERM"),
                        || format!("{cmd:?} as reader: {r:?}"),
                    );
                }
                for cmd in reads {
                    let r = faults::raw(&mut reader, cmd);
                    env.check(
                        "acl-read-only-fence",
                        "a %R~lock:* user can run LOCK.FENCE (and LOCK.INFO)",
                        !matches!(r, Value::ServerError(_)),
                        || format!("{cmd:?} as reader: {r:?}"),
                    );
                    if let (Some(t), true) =
                        (int(Some(&r)), cmd.len() == 2 && cmd[0] == "LOCK.FENCE")
                    {
                        env.rec
                            .observe(env.now(), t, format!("LOCK.FENCE {} as reader", cmd[1]));
                    }
                }
                ((), key.clone())
            },
        );
    }
}
