//! Keyspace commands that pull locks out from under the module: `FLUSHALL`, `SWAPDB`, `RENAME`
//! and `MOVE`, `RESTORE` of truncated and intact `DUMP`s.

use super::*;

pub fn flushall() -> Scenario {
    Scenario::new(
        "flushall",
        "FLUSHALL, FLUSHALL ASYNC and FLUSHDB in the middle of the workload",
        flushes,
    )
    .may_lose_writes()
}

/// Every 80-250 ms, one of the flushes. They drop every hold (`Destroys`): the holders'
/// fenced writes must be refused from then on, and tokens keep growing.
fn flushes(env: &mut Env) {
    let mut c = env.conn();
    while env.running() {
        env.sleep((80, 250));
        let which = env
            .choose(&["FLUSHALL", "FLUSHALL ASYNC", "FLUSHDB"])
            .unwrap();
        env.inject(which, None, Effect::Destroys, true, |_| {
            let args: Vec<&str> = which.split(' ').collect();
            let reply = faults::raw(&mut c, &args);
            ((), format!("{reply:?}"))
        });
    }
}

pub fn swapdb() -> Scenario {
    Scenario::new(
        "swapdb",
        "SWAPDB 0 1 (db 1 emptied first) in the middle of the workload",
        swaps,
    )
    .may_lose_writes()
}

/// Every 120-300 ms, atomically: empty db 1, read db 0's holds, `SWAPDB 0 1`, read db 1's.
/// The workload's keys are then empty (`Destroys`). Pass: each hold swapped away is in db 1
/// with the token it had (a swap moves holds, it grants nothing).
fn swaps(env: &mut Env) {
    let mut c = env.conn();
    while env.running() {
        env.sleep((120, 300));
        let keys = env.keys();
        let fence = |k: &String| redis::cmd("LOCK.FENCE").arg(k).clone();
        let info = |k: &String| redis::cmd("LOCK.INFO").arg(k).clone();
        let mut cmds = vec![
            redis::cmd("SELECT").arg(1).clone(),
            redis::cmd("FLUSHDB").clone(),
            redis::cmd("SELECT").arg(0).clone(),
        ];
        cmds.extend(keys.iter().map(info));
        cmds.push(redis::cmd("SWAPDB").arg(0).arg(1).clone());
        cmds.push(redis::cmd("SELECT").arg(1).clone());
        cmds.extend(keys.iter().map(fence));
        cmds.push(redis::cmd("SELECT").arg(0).clone());
        let n = keys.len();
        let db0 = |r: &[Value]| format!("db 0 tokens {:?}", &r[3..3 + n]);
        let (replies, complete) = transaction_fault(
            env,
            &mut c,
            "SWAPDB 0 1",
            None,
            Effect::Destroys,
            &cmds,
            db0,
        );
        let (before, after) = (&replies[3..3 + n], &replies[5 + n..5 + 2 * n]);
        for (k, (b, a)) in keys.iter().zip(before.iter().zip(after)) {
            env.check(
                "swapped-hold-keeps-token",
                "a hold swapped into db 1 has the token it had in db 0",
                same_hold(b, a),
                || format!("{k}: {b:?} in db 0 before SWAPDB, {a:?} in db 1 after"),
            );
            observe_info(env, complete, b, format!("LOCK.INFO {k} before SWAPDB"));
        }
    }
}

pub fn rename_and_move() -> Scenario {
    Scenario::new(
        "rename_and_move",
        "RENAME of a lock key to another name, MOVE to db 1, in the middle of the workload",
        renames_and_moves,
    )
}

/// Every 40-150 ms, atomically with reading the hold before and after: `RENAME lock:i
/// moved:n` or `MOVE lock:i 1` (then the moved key is deleted). The lock key is then empty
/// (`Destroys` for that key). Pass: the moved hold carries the token it had (it is not a new
/// grant, and its token is not above the ones already issued).
fn renames_and_moves(env: &mut Env) {
    let mut c = env.conn();
    let mut n = 0;
    while env.running() {
        env.sleep((40, 150));
        let key = env.random_key();
        n += 1;
        let fence = |k: &str| redis::cmd("LOCK.FENCE").arg(k).clone();
        let info = redis::cmd("LOCK.INFO").arg(&key).clone();
        let (kind, cmds, moved_at) = if env.rng.gen_bool(0.5) {
            let dest = format!("moved:{n}");
            let cmds = vec![
                info.clone(),
                redis::cmd("RENAME").arg(&key).arg(&dest).clone(),
                fence(&dest),
                redis::cmd("DEL").arg(&dest).clone(),
            ];
            ("RENAME of a lock key", cmds, 2)
        } else {
            let cmds = vec![
                info,
                redis::cmd("MOVE").arg(&key).arg(1).clone(),
                redis::cmd("SELECT").arg(1).clone(),
                fence(&key),
                redis::cmd("DEL").arg(&key).clone(),
                redis::cmd("SELECT").arg(0).clone(),
            ];
            ("MOVE of a lock key to db 1", cmds, 3)
        };
        let note = |r: &[Value]| format!("{key}: {:?} -> {:?}", r[0], r[1]);
        let (replies, complete) = transaction_fault(
            env,
            &mut c,
            kind,
            Some(vec![key.clone()]),
            Effect::Destroys,
            &cmds,
            note,
        );
        let moved = matches!(replies[1], Value::Okay | Value::Int(1));
        if moved {
            env.check(
                "moved-hold-keeps-token",
                "after RENAME or MOVE the hold carries the token it had (no new grant)",
                same_hold(&replies[0], &replies[moved_at]),
                || {
                    format!(
                        "{kind} {key}: token {:?} before, {:?} after",
                        replies[0], replies[moved_at]
                    )
                },
            );
        }
        observe_info(
            env,
            complete,
            &replies[0],
            format!("LOCK.INFO {key} before {kind}"),
        );
    }
}

pub fn restore_truncated_dump() -> Scenario {
    Scenario::new(
        "restore_truncated_dump",
        "RESTORE ... REPLACE of truncated DUMPs over live locks (bad and valid checksums), \
         RESTORE of an intact DUMP under another name",
        restores,
    )
}

/// Every 40-120 ms, on a random held key:
/// 1. `RESTORE key 0 <prefix of its DUMP> REPLACE` (the checksum fails), and
/// 2. the same with the value cut short (by more than 10 bytes) but a valid checksum, so the
///    module's own loader meets the short data;
///
/// each between `LOCK.INFO key` and `LOCK.FENCE key` in one transaction. Pass: refused with an
/// error, the hold unchanged, the server still answers.
/// 3. `RESTORE restored:n 0 <the DUMP>`: pass: it carries the dumped token (or is already
///    expired), no new grant.
fn restores(env: &mut Env) {
    let mut c = env.conn();
    let mut n = 0;
    while env.running() {
        env.sleep((40, 120));
        let key = env.random_key();
        n += 1;
        let fence = || redis::cmd("LOCK.FENCE").arg(&key).clone();
        let info = || redis::cmd("LOCK.INFO").arg(&key).clone();
        let dump = redis::cmd("DUMP").arg(&key).clone();
        let (replies, _, complete) =
            faults::transaction(&env.rec, &mut c, &[fence(), dump]).expect("MULTI DUMP");
        let (token, Value::BulkString(payload)) = (replies[0].clone(), replies[1].clone()) else {
            continue; // free: nothing to dump
        };
        if let Value::Int(t) = token {
            env.rec
                .observe(complete, t, format!("LOCK.FENCE {key} before DUMP"));
        }
        assert!(
            harness::dump::checksum_matches(&payload),
            "crc64 here disagrees with the server's DUMP checksum: fix harness::dump::crc64"
        );
        // The value is followed by the 10-byte footer, and the server's parser reads on into
        // it: a value missing 10 bytes or fewer can be completed by the footer's own bytes
        // into a different but valid lock (a cut in the deadline's last byte yields a deadline
        // ending in the RDB version byte 0x0a, then its 0x00 reads as the end marker). The
        // server is right to accept that, so the cut leaves more than 10 bytes missing.
        let value_len = payload.len() - 10;
        let bad_checksum = payload[..env.rng.gen_range(1..payload.len())].to_vec();
        let short_value = faults::truncated_dump(&payload, env.rng.gen_range(1..value_len - 10));
        for (kind, bytes) in [
            ("RESTORE of a truncated DUMP (bad checksum)", bad_checksum),
            ("RESTORE of a truncated DUMP (valid checksum)", short_value),
        ] {
            let restore = redis::cmd("RESTORE")
                .arg(&key)
                .arg(0)
                .arg(&bytes)
                .arg("REPLACE")
                .clone();
            let cmds = [info(), restore, fence()];
            let note = |r: &[Value]| format!("{} of {} bytes: {:?}", key, bytes.len(), r[1]);
            let (r, _) = transaction_fault(
                env,
                &mut c,
                kind,
                Some(vec![key.clone()]),
                Effect::Keeps,
                &cmds,
                note,
            );
            env.check(
                "truncated-restore-refused",
                "RESTORE of a truncated DUMP answers an error and leaves the hold as it was",
                matches!(r[1], Value::ServerError(_)) && same_hold(&r[0], &r[2]),
                || {
                    format!(
                        "{kind} {key}: {:?}, hold {:?} before, token {:?} after",
                        r[1], r[0], r[2]
                    )
                },
            );
            let pong: Result<String, _> = redis::cmd("PING").query(&mut c);
            env.check(
                "server-survives-restore",
                "the server still answers PING after RESTORE of a truncated DUMP",
                pong.as_deref() == Ok("PONG"),
                || format!("PING after {kind}: {pong:?}"),
            );
        }
        let dest = format!("restored:{n}");
        let cmds = [
            redis::cmd("RESTORE")
                .arg(&dest)
                .arg(0)
                .arg(&payload)
                .clone(),
            redis::cmd("LOCK.FENCE").arg(&dest).clone(),
            redis::cmd("DEL").arg(&dest).clone(),
        ];
        let note = |r: &[Value]| format!("{dest}: {:?}, {:?}", r[0], r[1]);
        let kind = "RESTORE of an intact DUMP under another name";
        let (r, _) = transaction_fault(
            env,
            &mut c,
            kind,
            Some(Vec::new()),
            Effect::Keeps,
            &cmds,
            note,
        );
        env.check(
            "restored-hold-keeps-token",
            "RESTORE of a lock's DUMP carries the dumped token (or is already expired): no grant",
            r[0] == Value::Okay && (r[1] == token || r[1] == Value::Nil),
            || {
                format!(
                    "{dest} from {key} (token {token:?}): {:?}, {:?}",
                    r[0], r[1]
                )
            },
        );
    }
}
