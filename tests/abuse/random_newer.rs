//! Random sequences of the newer commands and options (sessions plain and `BOUND`, holds in
//! them with ttl 0, `LOCKDELAY`, `SHARED`/`LIMIT`, `LOCK.MACQUIRE`/`LOCK.MRELEASE`, blocked
//! waiters of both, `LOCK.WATCH`/`UNWATCH`) mixed with the keyspace commands that pull locks
//! out from under the module and with killed connections: every reply is one the command may
//! give, the server never crashes, and after every step `LOCK.FENCE` and `LOCK.INFO` agree,
//! an exclusive key has at most one holder and a semaphore at most its limit, and a key in
//! lock-delay has no exclusive holder. At the end, with every session ended, nothing is held
//! in a session, queued or blocked.

use super::random_sequences::{Tokens, MAIN_OWNERS, RANDOM_KEYS, WAITER_OWNERS};
use super::*;

/// Error replies a command of this test may give, by their first words. Anything else (an
/// internal error above all) fails the run.
const ALLOWED_ERRORS: &[&str] = &[
    "WRONGTYPE ",
    "ERR no such session",
    "ERR owner holds this lock",
    "ERR this lock is held SHARED",
    "ERR ttl-ms must be a positive integer",
    "ERR the session ended while the client waited",
    "ERR syntax error: a hold in a SESSION takes the session's LOCKDELAY",
];

#[track_caller]
fn allowed(reply: &RedisResult<Value>, ctx: &str) {
    if let Err(e) = reply {
        let text = format!("{} {}", e.code().unwrap_or("?"), e.detail().unwrap_or(""));
        assert!(
            ALLOWED_ERRORS.iter().any(|p| text.starts_with(p)),
            "{ctx}: unexpected error {e}"
        );
    }
}

/// `LOCK.INFO` as its field names and values (RESP2: flat pairs), nil as `None`.
fn info_fields(v: &Value) -> Option<HashMap<String, Value>> {
    let Value::Array(items) = v else {
        assert_eq!(v, &Value::Nil, "LOCK.INFO: {v:?}");
        return None;
    };
    Some(
        items
            .chunks(2)
            .map(|kv| match &kv[0] {
                Value::BulkString(k) => (String::from_utf8_lossy(k).into_owned(), kv[1].clone()),
                other => panic!("LOCK.INFO field name {other:?}"),
            })
            .collect(),
    )
}

const PROBE: &str = r#"
local out = {}
for i, k in ipairs(KEYS) do
  local info = redis.pcall('LOCK.INFO', k)
  if type(info) == 'table' and info['err'] then info = 'error:' .. info['err'] end
  local f = redis.pcall('LOCK.FENCE', k)
  if type(f) == 'table' and f['err'] then f = 'error:' .. f['err'] end
  out[i] = {info, f}
end
return out
"#;

/// Read every random key in one script and check what must hold whatever happened before.
/// `LOCK.INFO` first, then `LOCK.FENCE`: the module's clock goes on inside a script (a hold
/// may expire between the two), so the later `FENCE` may only have lost holders.
#[track_caller]
fn check(c: &mut Connection, tokens: &Tokens, ctx: &str) {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(PROBE).arg(RANDOM_KEYS.len()).arg(RANDOM_KEYS);
    let Value::Array(keys) = cmd.query(c).unwrap_or_else(|e| panic!("{ctx}: probe: {e}")) else {
        panic!("{ctx}: probe reply")
    };
    for (k, entry) in RANDOM_KEYS.iter().zip(keys) {
        let Value::Array(parts) = entry else {
            panic!("{ctx}: probe entry {entry:?}")
        };
        let what = format!("{ctx}, key {k}: {parts:?}");
        let (info, fence) = match (&parts[0], &parts[1]) {
            (Value::BulkString(e), _) => {
                assert!(e.starts_with(b"error:WRONGTYPE"), "{what}");
                continue;
            }
            (i, Value::Int(t)) => (info_fields(i), Some(*t)),
            (i, Value::Nil) => (info_fields(i), None),
            _ => panic!("{what}"),
        };
        let Some(info) = info else {
            assert_eq!(
                fence, None,
                "{what}: INFO says free, FENCE (later) has a token"
            );
            continue;
        };
        let holders: Vec<(Vec<u8>, i64)> = match &info["holders"] {
            Value::Array(hs) => hs
                .iter()
                .map(|h| {
                    let f = info_fields(h).expect("holder");
                    match (&f["owner"], &f["token"]) {
                        (Value::BulkString(o), Value::Int(t)) => (o.clone(), *t),
                        other => panic!("{what}: holder {other:?}"),
                    }
                })
                .collect(),
            other => panic!("{what}: holders {other:?}"),
        };
        let max = holders.iter().map(|h| h.1).max();
        if let Some(t) = fence {
            assert!(
                holders.iter().any(|h| h.1 == t),
                "{what}: FENCE's token is no holder's in LOCK.INFO"
            );
        }
        assert_eq!(info["token"], Value::Int(max.unwrap_or(0)), "{what}");
        for (owner, t) in &holders {
            match tokens.seen.get(t) {
                Some(o) => assert_eq!(o, owner, "{what}: token {t} granted to another owner"),
                // A blocked waiter's grant is recorded when its reply is read.
                None => assert!(
                    WAITER_OWNERS.contains(&owner.as_slice()),
                    "{what}: holder's token {t} was never granted to it"
                ),
            }
        }
        let mode = match &info["mode"] {
            Value::BulkString(m) => String::from_utf8_lossy(m).into_owned(),
            Value::SimpleString(m) => m.clone(),
            other => panic!("{what}: mode {other:?}"),
        };
        match (mode.as_str(), &info["limit"]) {
            ("exclusive", Value::Nil) => {
                assert!(holders.len() <= 1, "{what}: two exclusive holders");
                // Lock-delay: nobody holds what a lost hold had until it ends.
                if info.contains_key("delayed") {
                    assert!(holders.is_empty(), "{what}: granted during a lock-delay");
                }
            }
            ("shared", Value::Nil) => {}
            ("shared", Value::Int(n)) => {
                assert!(holders.len() as i64 <= *n, "{what}: over the limit")
            }
            other => panic!("{what}: mode {other:?}"),
        }
    }
}

/// A connection for blocked commands, or for `BOUND` sessions.
struct Side {
    conn: Connection,
    busy: Option<String>,
    owner: &'static [u8],
}

impl Side {
    fn new(server: &Server, owner: &'static [u8]) -> Side {
        let conn = server.conn();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        Side {
            conn,
            busy: None,
            owner,
        }
    }

    /// The reply of its blocked command, if one is out: a token, tokens, nil or an allowed
    /// error.
    fn collect(&mut self, tokens: &mut Tokens, ctx: &str) {
        let Some(sent) = self.busy.take() else {
            return;
        };
        let reply = self.conn.recv_response().and_then(Value::extract_error);
        let ctx = format!("{ctx}: `{sent}`");
        match &reply {
            Ok(Value::Int(t)) => tokens.record(*t, self.owner, &ctx),
            Ok(Value::Array(ts)) => ts.iter().for_each(|t| match t {
                Value::Int(t) => tokens.record(*t, self.owner, &ctx),
                other => panic!("{ctx}: {other:?}"),
            }),
            Ok(Value::Nil) => {}
            Err(e) if e.is_timeout() => panic!("{ctx}: no reply within 5 s"),
            _ => allowed(&reply, &ctx),
        }
    }
}

fn id_of(reply: RedisResult<Value>, ctx: &str) -> String {
    match reply {
        Ok(Value::BulkString(id)) => String::from_utf8(id).unwrap(),
        other => panic!("{ctx}: OPEN answered {other:?}"),
    }
}

#[test]
fn random_sequences_of_the_newer_commands_stay_consistent() {
    let seed: u64 = std::env::var("ABUSE_SEED")
        .ok()
        .map(|s| s.parse().expect("ABUSE_SEED is not a u64"))
        .unwrap_or_else(rand::random);
    let ops = env_usize("ABUSE_OPS", 3000);
    eprintln!("random_newer: ABUSE_SEED={seed} ABUSE_OPS={ops}");
    let mut rng = StdRng::seed_from_u64(seed);
    let (server, mut c) = start();
    let pid = info_field(&mut c, "server", "process_id").unwrap();
    let mut sides: Vec<Side> = WAITER_OWNERS
        .iter()
        .map(|o| Side::new(&server, o))
        .collect();
    let mut bound = Side::new(&server, b"b0");
    let mut bound_ids: Vec<String> = Vec::new();
    let mut ids: Vec<String> = Vec::new();
    let mut tokens = Tokens::default();
    let mut recent: std::collections::VecDeque<String> = Default::default();
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();

    for step in 0..ops {
        let key = RANDOM_KEYS[rng.gen_range(0..RANDOM_KEYS.len())];
        let owner = MAIN_OWNERS[rng.gen_range(0..MAIN_OWNERS.len())];
        let ttl = [1, 5, 20, 100, 1_000, 60_000][rng.gen_range(0..6)].to_string();
        let id = match ids.len() {
            0 => "{x}00000000000000000000000000000000".to_string(),
            n => ids[rng.gen_range(0..n)].clone(),
        };
        let mut keys: Vec<&str> = RANDOM_KEYS.to_vec();
        for i in (1..keys.len()).rev() {
            keys.swap(i, rng.gen_range(0..=i));
        }
        keys.truncate(rng.gen_range(1..=RANDOM_KEYS.len()));
        let n = keys.len().to_string();
        let roll = rng.gen_range(0..1000);
        let mut args: Vec<Vec<u8>> = Vec::new();
        let mut arg = |a: &[u8]| args.push(a.to_vec());
        let what: &str = match roll {
            0..=149 => {
                for a in [key.as_bytes(), owner, ttl.as_bytes()] {
                    arg(a);
                }
                if rng.gen_bool(0.4) {
                    arg(b"SHARED");
                    if rng.gen_bool(0.5) {
                        arg(b"LIMIT");
                        arg(b"2");
                    }
                }
                if rng.gen_bool(0.3) {
                    arg(b"LOCKDELAY");
                    arg(rng.gen_range(0..80).to_string().as_bytes());
                }
                "LOCK.ACQUIRE"
            }
            150..=249 => {
                let t = if rng.gen_bool(0.5) { "0" } else { ttl.as_str() };
                for a in [
                    key.as_bytes(),
                    owner,
                    t.as_bytes(),
                    b"SESSION",
                    id.as_bytes(),
                ] {
                    arg(a);
                }
                if rng.gen_bool(0.3) {
                    arg(b"SHARED");
                }
                "LOCK.ACQUIRE"
            }
            250..=329 => {
                arg(key.as_bytes());
                arg(owner);
                "LOCK.RELEASE"
            }
            330..=369 => {
                for a in [key.as_bytes(), owner, ttl.as_bytes()] {
                    arg(a);
                }
                "LOCK.EXTEND"
            }
            370..=439 => {
                arg(n.as_bytes());
                keys.iter().for_each(|k| arg(k.as_bytes()));
                arg(owner);
                if rng.gen_bool(0.3) {
                    arg(b"0");
                    arg(b"SESSION");
                    arg(id.as_bytes());
                } else {
                    arg(ttl.as_bytes());
                }
                "LOCK.MACQUIRE"
            }
            440..=479 => {
                arg(n.as_bytes());
                keys.iter().for_each(|k| arg(k.as_bytes()));
                arg(owner);
                "LOCK.MRELEASE"
            }
            480..=549 => {
                // A blocked ACQUIRE or MACQUIRE on a side connection.
                let i = rng.gen_range(0..sides.len());
                sides[i].collect(&mut tokens, &format!("step {step}: collect"));
                let timeout = rng.gen_range(1..=50).to_string();
                let waiter = sides[i].owner;
                let mut cmd = if rng.gen_bool(0.5) {
                    let mut cmd = redis::cmd("LOCK.ACQUIRE");
                    cmd.arg(key).arg(waiter).arg(rng.gen_range(1..=200));
                    if rng.gen_bool(0.3) {
                        cmd.arg("SHARED");
                    }
                    cmd
                } else {
                    let mut cmd = redis::cmd("LOCK.MACQUIRE");
                    cmd.arg(&n)
                        .arg(&keys)
                        .arg(waiter)
                        .arg(rng.gen_range(1..=200));
                    cmd
                };
                cmd.arg("BLOCK").arg(&timeout);
                sides[i]
                    .conn
                    .send_packed_command(&cmd.get_packed_command())
                    .unwrap();
                sides[i].busy =
                    Some(String::from_utf8_lossy(&cmd.get_packed_command()).replace("\r\n", " "));
                "blocked"
            }
            550..=599 if ids.len() < 4 => {
                let ttl = rng.gen_range(50..2_000).to_string();
                let mut cmd = vec!["OPEN", ttl.as_str()];
                let delay = rng.gen_range(0..80).to_string();
                if rng.gen_bool(0.5) {
                    cmd.extend(["LOCKDELAY", delay.as_str()]);
                }
                ids.push(id_of(call(&mut c, "LOCK.SESSION", &cmd), "OPEN"));
                "LOCK.SESSION OPEN"
            }
            600..=689 => {
                let sub = ["KEEPALIVE", "CLOSE", "INFO"][rng.gen_range(0..3)];
                let reply = call(&mut c, "LOCK.SESSION", &[sub, id.as_str()]);
                match (sub, &reply) {
                    (_, Ok(Value::Nil)) | ("KEEPALIVE" | "CLOSE", Ok(Value::Int(_))) => {}
                    ("INFO", Ok(Value::Array(_))) => {}
                    other => panic!("step {step}: LOCK.SESSION {sub}: {other:?}"),
                }
                if sub == "CLOSE" || reply == Ok(Value::Nil) {
                    ids.retain(|i| *i != id);
                }
                "LOCK.SESSION"
            }
            690..=739 => {
                // A BOUND session on its own connection: open one, hold in it, or kill the
                // connection (the session ends with it).
                match rng.gen_range(0..3) {
                    0 => {
                        let opened = call(
                            &mut bound.conn,
                            "LOCK.SESSION",
                            &["OPEN", "60000", "BOUND", "LOCKDELAY", "30"],
                        );
                        bound_ids.push(id_of(opened, "OPEN BOUND"));
                    }
                    1 if !bound_ids.is_empty() => {
                        let b = &bound_ids[rng.gen_range(0..bound_ids.len())];
                        let reply = call(
                            &mut bound.conn,
                            "LOCK.ACQUIRE",
                            &[key, "b0", "0", "SESSION", b],
                        );
                        allowed(&reply, &format!("step {step}: bound hold"));
                        if let Ok(Value::Int(t)) = reply {
                            tokens.granted(t, b"b0", &format!("step {step}: bound hold"));
                        }
                    }
                    _ => {
                        let cid: i64 = redis::cmd("CLIENT")
                            .arg("ID")
                            .query(&mut bound.conn)
                            .unwrap();
                        let killed = call(&mut c, "CLIENT", &["KILL", "ID", &cid.to_string()]);
                        assert_eq!(killed, Ok(Value::Int(1)), "step {step}");
                        bound = Side::new(&server, b"b0");
                        bound_ids.clear();
                    }
                }
                "BOUND session"
            }
            740..=769 => {
                let cmd = if rng.gen_bool(0.5) {
                    "LOCK.WATCH"
                } else {
                    "LOCK.UNWATCH"
                };
                let reply = call(&mut c, cmd, &[key]);
                match &reply {
                    Ok(Value::Array(v)) if cmd == "LOCK.WATCH" && v.len() == 2 => {}
                    Ok(Value::Int(0 | 1)) if cmd == "LOCK.UNWATCH" => {}
                    Err(e) if e.code() == Some("WRONGTYPE") && cmd == "LOCK.WATCH" => {}
                    other => panic!("step {step}: {cmd}: {other:?}"),
                }
                "watch"
            }
            770..=809 => {
                let _: i64 = redis::cmd("DEL").arg(key).query(&mut c).unwrap();
                "DEL"
            }
            810..=829 => {
                let r = call(&mut c, "RENAME", &[key, keys[0]]);
                assert!(r.is_ok() || r.as_ref().unwrap_err().detail() == Some("no such key"));
                "RENAME"
            }
            830..=849 => {
                let _: Value = redis::cmd("SET")
                    .arg(key)
                    .arg("plain")
                    .arg("PX")
                    .arg(50)
                    .query(&mut c)
                    .unwrap();
                "SET"
            }
            850..=869 => {
                let _: () = redis::cmd("SWAPDB").arg(0).arg(1).query(&mut c).unwrap();
                "SWAPDB"
            }
            870..=879 => {
                let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
                "FLUSHALL"
            }
            880..=899 => {
                let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
                "DEBUG RELOAD"
            }
            _ => {
                std::thread::sleep(Duration::from_millis(rng.gen_range(1..20)));
                "sleep"
            }
        };
        let ctx = format!("step {step} (seed {seed}): {what} {}", show(&args));
        if what.starts_with("LOCK.") && !args.is_empty() {
            let reply = call(&mut c, what, &args);
            allowed(&reply, &ctx);
            match (&reply, what) {
                (Ok(Value::Int(t)), "LOCK.ACQUIRE") => tokens.granted(*t, owner, &ctx),
                (Ok(Value::Array(ts)), "LOCK.MACQUIRE") => {
                    assert_eq!(ts.len(), keys.len(), "{ctx}");
                    for t in ts {
                        let Value::Int(t) = t else {
                            panic!("{ctx}: {t:?}")
                        };
                        tokens.granted(*t, owner, &ctx);
                    }
                }
                (Ok(Value::Int(_) | Value::Nil), _) | (Err(_), _) => {}
                other => panic!("{ctx}: {other:?}"),
            }
        }
        if recent.len() == 30 {
            recent.pop_front();
        }
        recent.push_back(ctx.clone());
        *counts.entry(what).or_default() += 1;
        let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            check(&mut c, &tokens, &ctx)
        }));
        if let Err(e) = checked {
            eprintln!("last steps:\n  {}", Vec::from(recent.clone()).join("\n  "));
            std::panic::resume_unwind(e);
        }
    }

    // Every session ends: closed, or its bound connection closed.
    for side in &mut sides {
        side.collect(&mut tokens, "final collect");
    }
    for id in &ids {
        let r = call(&mut c, "LOCK.SESSION", &["CLOSE", id.as_str()]);
        assert!(
            matches!(r, Ok(Value::Int(_) | Value::Nil)),
            "CLOSE {id}: {r:?}"
        );
    }
    drop(bound);
    wait_until("every session to end, nobody to wait", PATIENCE, || {
        lock_stat(&mut c, "sessions") == 0
            && lock_stat(&mut c, "waiters") == 0
            && info_int(&mut c, "clients", "blocked_clients") == 0
    });
    for db in [0, 1] {
        let _: () = redis::cmd("SELECT").arg(db).query(&mut c).unwrap();
        for k in RANDOM_KEYS {
            if let Ok(v) = call(&mut c, "LOCK.INFO", &[*k]) {
                let text = format!("{v:?}");
                assert!(
                    !text.contains("session"),
                    "db {db} {k}: a hold of an ended session: {text}"
                );
            }
        }
    }
    let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    wait_until("lock_locks == 0", PATIENCE, || {
        lock_stat(&mut c, "locks") == 0
    });
    assert_alive(&server, &pid);
    assert_clean_log(&server);
    eprintln!(
        "random_newer: {ops} steps, {} tokens, mix {counts:?}",
        tokens.seen.len()
    );
}

fn show(args: &[Vec<u8>]) -> String {
    args.iter()
        .map(|a| a.escape_ascii().to_string())
        .collect::<Vec<_>>()
        .join(" ")
}
