//! Random command sequences mixed with the keyspace commands that pull locks out from under
//! the module (`DEL`, `RENAME`, `FLUSHDB`, expiry...): the server never crashes and what
//! `LOCK.INFO`, `FENCE` and the tokens say stays consistent after every step.

use super::*;

pub(super) const RANDOM_KEYS: &[&str] = &["rnd:0", "rnd:1", "rnd:2"];
/// Owners the main connection acquires with; blocked waiters use `w0`..`w3`, so every token a
/// main-connection acquire returns is either new or one this test has already seen.
pub(super) const MAIN_OWNERS: &[&[u8]] = &[b"o0", b"o1", b"o2", b"o\x00\xff"];
pub(super) const WAITER_OWNERS: &[&[u8]] = &[b"w0", b"w1", b"w2", b"w3"];
const TTLS: &[i64] = &[1, 1, 2, 5, 20, 100, 1_000, 60_000];

/// Prints the seed and the last commands if the test panics, so the run can be replayed.
struct SeedNote {
    seed: u64,
    recent: std::collections::VecDeque<String>,
}

impl SeedNote {
    fn record(&mut self, line: String) {
        if self.recent.len() == 40 {
            self.recent.pop_front();
        }
        self.recent.push_back(line);
    }
}

impl Drop for SeedNote {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "random_command_sequences: failed with ABUSE_SEED={0}; replay with \
                 ABUSE_SEED={0} cargo test --test abuse random_command_sequences\n\
                 last commands:\n  {1}",
                self.seed,
                Vec::from(self.recent.clone()).join("\n  ")
            );
        }
    }
}

/// A connection that may have a blocked `LOCK.ACQUIRE` in flight.
struct Side {
    conn: Connection,
    /// A command was sent and its reply not read yet.
    busy: bool,
    /// The last command sent, for failure messages.
    sent: String,
    /// The owner this connection acquires as.
    owner: &'static [u8],
}

impl Side {
    fn new(server: &Server, owner: &'static [u8]) -> Side {
        let conn = server.conn();
        conn.set_read_timeout(Some(SIDE_REPLY_TIMEOUT)).unwrap();
        Side {
            conn,
            busy: false,
            sent: String::new(),
            owner,
        }
    }
}

/// Atomically read every random key: `TYPE`, `LOCK.FENCE`, `LOCK.INFO`, errors turned into
/// strings so that one reply carries all of them.
const PROBE: &str = r#"
local out = {}
for i, k in ipairs(KEYS) do
  local t = redis.call('TYPE', k)['ok']
  local f = redis.pcall('LOCK.FENCE', k)
  if type(f) == 'table' and f['err'] then f = 'error:' .. f['err'] end
  local info = redis.pcall('LOCK.INFO', k)
  if type(info) == 'table' and info['err'] then info = 'error:' .. info['err'] end
  out[i] = {t, f, info}
end
return out
"#;

/// Check that `LOCK.FENCE` and `LOCK.INFO` agree for every random key, read atomically.
#[track_caller]
pub(super) fn check_consistent(c: &mut Connection, step: usize, what: &str) {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(PROBE).arg(RANDOM_KEYS.len());
    for k in RANDOM_KEYS {
        cmd.arg(*k);
    }
    let reply: Value = cmd
        .query(c)
        .unwrap_or_else(|e| panic!("step {step} ({what}): probe: {e}"));
    let Value::Array(keys) = reply else {
        panic!("probe: {reply:?}")
    };
    for (k, entry) in RANDOM_KEYS.iter().zip(keys) {
        let Value::Array(parts) = entry else {
            panic!("probe entry {entry:?}")
        };
        let ty = match &parts[0] {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            Value::SimpleString(s) => s.clone(),
            other => panic!("TYPE {other:?}"),
        };
        let ctx = format!("step {step} ({what}), key {k} of type {ty}: {parts:?}");
        let is_wrongtype =
            |v: &Value| matches!(v, Value::BulkString(b) if b.starts_with(b"error:WRONGTYPE"));
        match ty.as_str() {
            "redislock" => {
                let fence = match &parts[1] {
                    Value::Int(t) => Some(*t),
                    Value::Nil => None,
                    _ => panic!("{ctx}: FENCE"),
                };
                let info = parse_lock_info(&parts[2]);
                match (fence, &info) {
                    (Some(t), Some((owner, t2, ttl, waiters))) => {
                        assert_eq!(t, *t2, "{ctx}: FENCE and INFO disagree");
                        assert!(*ttl >= 0 && *waiters >= 0, "{ctx}");
                        assert!(
                            MAIN_OWNERS.contains(&owner.as_slice())
                                || WAITER_OWNERS.contains(&owner.as_slice()),
                            "{ctx}: unknown owner"
                        );
                    }
                    // The deadline may pass between the two reads.
                    (Some(_), None) | (None, None) => {}
                    (None, Some(_)) => panic!("{ctx}: FENCE nil but INFO shows a holder"),
                }
            }
            "none" => assert!(
                matches!(parts.get(1), None | Some(Value::Nil))
                    && matches!(parts.get(2), None | Some(Value::Nil)),
                "{ctx}: a missing key has a holder"
            ),
            _ => assert!(
                is_wrongtype(&parts[1]) && is_wrongtype(&parts[2]),
                "{ctx}: expected WRONGTYPE from FENCE and INFO"
            ),
        }
    }
}

/// Tokens seen so far and whom they were granted to. A token only ever belongs to one owner.
/// A token from a main-connection acquire is a retry (seen before, same owner) or a new grant
/// (above every token seen). A waiter's token may arrive after later grants were seen, so it
/// is only checked for its owner.
#[derive(Default)]
pub(super) struct Tokens {
    pub(super) seen: HashMap<i64, Vec<u8>>,
    pub(super) max: i64,
}

impl Tokens {
    pub(super) fn granted(&mut self, t: i64, owner: &[u8], ctx: &str) {
        assert!(
            t > self.max || self.seen.contains_key(&t),
            "{ctx}: token {t} is neither new (max so far {}) nor a retry",
            self.max
        );
        self.record(t, owner, ctx);
    }

    pub(super) fn record(&mut self, t: i64, owner: &[u8], ctx: &str) {
        assert!(t > 0, "{ctx}: token {t}");
        let first = self.seen.entry(t).or_insert_with(|| owner.to_vec());
        assert_eq!(
            first.escape_ascii().to_string(),
            owner.escape_ascii().to_string(),
            "{ctx}: token {t} granted to two owners"
        );
        self.max = self.max.max(t);
    }
}

#[track_caller]
fn expect_int_nil_or_wrongtype(reply: &RedisResult<Value>, ctx: &str) {
    match reply {
        Ok(Value::Int(_)) | Ok(Value::Nil) => {}
        Err(e) if e.code() == Some("WRONGTYPE") => {}
        other => panic!("{ctx}: unexpected reply {other:?}"),
    }
}

#[track_caller]
fn expect_bool_or_wrongtype(reply: &RedisResult<Value>, ctx: &str) {
    match reply {
        Ok(Value::Int(0 | 1)) => {}
        Err(e) if e.code() == Some("WRONGTYPE") => {}
        other => panic!("{ctx}: unexpected reply {other:?}"),
    }
}

/// How long a side connection waits for its blocked acquire to answer. Its `BLOCK` timeout
/// is at most 50 ms (Redis 7.0 may notice it up to one `serverCron` tick, 100 ms, late), so
/// anything near this is a waiter that will never be answered.
const SIDE_REPLY_TIMEOUT: Duration = Duration::from_secs(2);

/// Collect the reply of a side connection's blocked acquire: a token, nil (timeout), or
/// `WRONGTYPE` (the key was overwritten while it waited). A waiter that is never answered is
/// recorded in `hangs` (with the server's view of it) and its connection replaced, so that
/// the run goes on and reports every such case at the end.
fn collect(
    server: &Server,
    side: &mut Side,
    tokens: &mut Tokens,
    hangs: &mut Vec<String>,
    ctx: &str,
) {
    if !side.busy {
        return;
    }
    side.busy = false;
    match side.conn.recv_response().and_then(Value::extract_error) {
        Ok(Value::Int(t)) => tokens.record(t, side.owner, ctx),
        Ok(Value::Nil) => {}
        Err(e) if e.code() == Some("WRONGTYPE") => {}
        Err(e) if e.is_timeout() => {
            hangs.push(format!(
                "{ctx}: `{}` got no reply within {SIDE_REPLY_TIMEOUT:?}\n{}",
                side.sent,
                diagnose(server)
            ));
            *side = Side::new(server, side.owner);
        }
        other => panic!(
            "{ctx}: blocked acquire answered {other:?}\n{}",
            diagnose(server)
        ),
    }
}

/// What the server says about its clients and the random keys, for a failure message.
fn diagnose(server: &Server) -> String {
    let mut c = server.conn();
    let mut out = String::new();
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut c)
        .unwrap_or_default();
    out.push_str(&format!("CLIENT LIST at {}:\n{clients}", unix_ms()));
    let info: String = redis::cmd("INFO")
        .arg("lock")
        .query(&mut c)
        .unwrap_or_default();
    out.push_str(&info);
    for db in [0, 1] {
        let _: RedisResult<()> = redis::cmd("SELECT").arg(db).query(&mut c);
        for k in RANDOM_KEYS {
            let ty = key_type(&mut c, k);
            let ttl = pttl(&mut c, k);
            let info = call(&mut c, "LOCK.INFO", &[*k]);
            out.push_str(&format!(
                "\ndb{db} {k}: TYPE {ty} PTTL {ttl} LOCK.INFO {info:?}"
            ));
        }
    }
    out
}

#[test]
fn random_command_sequences_never_crash_and_stay_consistent() {
    let seed: u64 = std::env::var("ABUSE_SEED")
        .ok()
        .map(|s| s.parse().expect("ABUSE_SEED is not a u64"))
        .unwrap_or_else(rand::random);
    let ops = env_usize("ABUSE_OPS", 5000);
    let mut note = SeedNote {
        seed,
        recent: Default::default(),
    };
    eprintln!("random_command_sequences: ABUSE_SEED={seed} ABUSE_OPS={ops}");
    let mut rng = StdRng::seed_from_u64(seed);

    let (server, mut c) = start();
    let pid = info_field(&mut c, "server", "process_id").unwrap();
    let mut sides: Vec<Side> = WAITER_OWNERS
        .iter()
        .map(|owner| Side::new(&server, owner))
        .collect();
    let mut hangs: Vec<String> = Vec::new();
    let mut tokens = Tokens::default();
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();

    for step in 0..ops {
        let key = RANDOM_KEYS[rng.gen_range(0..RANDOM_KEYS.len())];
        let other = RANDOM_KEYS[rng.gen_range(0..RANDOM_KEYS.len())];
        let owner = MAIN_OWNERS[rng.gen_range(0..MAIN_OWNERS.len())];
        let any_owner = if rng.gen_bool(0.5) {
            owner
        } else {
            WAITER_OWNERS[rng.gen_range(0..WAITER_OWNERS.len())]
        };
        let ttl = TTLS[rng.gen_range(0..TTLS.len())];
        let roll = rng.gen_range(0..1000);
        let what: &str;
        let ctx = |what: &str| format!("step {step}: {what} {key}");
        match roll {
            0..=279 => {
                what = "LOCK.ACQUIRE";
                let reply = call(
                    &mut c,
                    what,
                    &[key.as_bytes(), owner, ttl.to_string().as_bytes()],
                );
                expect_int_nil_or_wrongtype(&reply, &ctx(what));
                if let Ok(Value::Int(t)) = reply {
                    tokens.granted(t, owner, &ctx(what));
                }
            }
            280..=399 => {
                what = "LOCK.RELEASE";
                let reply = call(&mut c, what, &[key.as_bytes(), any_owner]);
                expect_bool_or_wrongtype(&reply, &ctx(what));
            }
            400..=479 => {
                what = "LOCK.EXTEND";
                let reply = call(
                    &mut c,
                    what,
                    &[key.as_bytes(), any_owner, ttl.to_string().as_bytes()],
                );
                expect_bool_or_wrongtype(&reply, &ctx(what));
            }
            480..=529 => {
                what = "LOCK.FENCE";
                if rng.gen_bool(0.5) || tokens.seen.is_empty() {
                    let r = call(&mut c, what, &[key]);
                    expect_int_nil_or_wrongtype(&r, &ctx(what));
                } else {
                    let i = rng.gen_range(0..tokens.seen.len());
                    let t = *tokens.seen.keys().nth(i).unwrap();
                    let r = call(&mut c, what, &[key.to_string(), t.to_string()]);
                    expect_bool_or_wrongtype(&r, &ctx(what));
                }
            }
            530..=559 => {
                what = "LOCK.INFO";
                match call(&mut c, what, &[key]) {
                    Ok(v) => {
                        parse_lock_info(&v);
                    }
                    Err(e) if e.code() == Some("WRONGTYPE") => {}
                    Err(e) => panic!("{}: {e}", ctx(what)),
                }
            }
            560..=669 => {
                // A blocked acquire on a side connection, with a small timeout.
                what = "LOCK.ACQUIRE BLOCK";
                let i = rng.gen_range(0..sides.len());
                note.record(format!("{step}: collect side {i} (busy {})", sides[i].busy));
                collect(
                    &server,
                    &mut sides[i],
                    &mut tokens,
                    &mut hangs,
                    &ctx("collect"),
                );
                let timeout = rng.gen_range(1..=50).to_string();
                let ttl = rng.gen_range(1..=200).to_string();
                let mut cmd = redis::cmd("LOCK.ACQUIRE");
                cmd.arg(key)
                    .arg(WAITER_OWNERS[i])
                    .arg(&ttl)
                    .arg("BLOCK")
                    .arg(&timeout);
                sides[i]
                    .conn
                    .send_packed_command(&cmd.get_packed_command())
                    .expect("send blocked acquire");
                sides[i].busy = true;
                sides[i].sent = format!(
                    "LOCK.ACQUIRE {key} {} {ttl} BLOCK {timeout}",
                    String::from_utf8_lossy(WAITER_OWNERS[i])
                );
                note.record(format!("{step} @{}: side {i} {}", unix_ms(), sides[i].sent));
            }
            670..=709 => {
                what = "collect";
                let i = rng.gen_range(0..sides.len());
                note.record(format!("{step}: collect side {i} (busy {})", sides[i].busy));
                collect(&server, &mut sides[i], &mut tokens, &mut hangs, &ctx(what));
            }
            710..=719 => {
                // A waiter that goes away while blocked.
                what = "disconnect waiter";
                let i = rng.gen_range(0..sides.len());
                sides[i] = Side::new(&server, WAITER_OWNERS[i]);
            }
            720..=759 => {
                what = if rng.gen_bool(0.5) { "DEL" } else { "UNLINK" };
                let _: i64 = redis::cmd(what).arg(key).query(&mut c).unwrap();
            }
            760..=784 => {
                what = if rng.gen_bool(0.7) {
                    "RENAME"
                } else {
                    "RENAMENX"
                };
                match call(&mut c, what, &[key, other]) {
                    Ok(_) => {}
                    Err(e) if e.detail() == Some("no such key") => {}
                    Err(e) => panic!("{}: {e}", ctx(what)),
                }
            }
            785..=804 => {
                what = "SET";
                let mut cmd = redis::cmd(what);
                cmd.arg(key).arg("plain");
                if rng.gen_bool(0.5) {
                    cmd.arg("PX").arg(ttl);
                }
                let _: Value = cmd.query(&mut c).unwrap();
            }
            805..=814 => {
                what = "LPUSH/HSET";
                let _: Value = if rng.gen_bool(0.5) {
                    call(&mut c, "LPUSH", &[key, "x"])
                } else {
                    call(&mut c, "HSET", &[key, "f", "v"])
                }
                .or_else(|e| {
                    assert_eq!(e.code(), Some("WRONGTYPE"), "{}: {e}", ctx(what));
                    Ok::<Value, redis::RedisError>(Value::Nil)
                })
                .unwrap();
            }
            815..=854 => {
                what = match rng.gen_range(0..4) {
                    0 => "PEXPIRE",
                    1 => "EXPIRE",
                    2 => "PERSIST",
                    _ => "PEXPIRE",
                };
                let reply = match what {
                    "PEXPIRE" => call(
                        &mut c,
                        what,
                        &[key.to_string(), rng.gen_range(0..50).to_string()],
                    ),
                    "EXPIRE" => call(&mut c, what, &[key, "1"]),
                    _ => call(&mut c, what, &[key]),
                };
                expect_bool_or_wrongtype(&reply, &ctx(what));
            }
            855..=869 => {
                what = "COPY/MOVE";
                let reply = if rng.gen_bool(0.5) {
                    call(&mut c, "COPY", &[key, other, "REPLACE"])
                } else {
                    call(&mut c, "MOVE", &[key, "1"])
                };
                match reply {
                    Ok(Value::Int(_)) => {}
                    // COPY of a lock is refused on purpose.
                    Err(e) if e.code() == Some("ERR") => {}
                    other => panic!("{}: {other:?}", ctx(what)),
                }
            }
            870..=899 => {
                // Inside MULTI and Lua a BLOCK never blocks.
                what = "MULTI/EVAL BLOCK";
                let ttl = ttl.to_string();
                let args = [key.as_bytes(), owner, ttl.as_bytes(), b"BLOCK", b"0"];
                let in_lua = rng.gen_bool(0.5);
                let reply: RedisResult<Value> = if in_lua {
                    let mut cmd = redis::cmd("EVAL");
                    cmd.arg(
                        "return redis.call('LOCK.ACQUIRE', KEYS[1], ARGV[1], ARGV[2], 'BLOCK', '0')",
                    )
                    .arg(1);
                    for a in args.iter().take(3) {
                        cmd.arg(*a);
                    }
                    cmd.query(&mut c)
                } else {
                    let mut pipe = redis::pipe();
                    pipe.atomic().cmd("LOCK.ACQUIRE");
                    for a in args {
                        pipe.arg(a);
                    }
                    pipe.query::<Vec<Value>>(&mut c).map(|mut v| v.remove(0))
                };
                match reply {
                    // Lua numbers are doubles: a token (about 2^61) comes out of a script
                    // rounded to a multiple of 256. Read the exact one outside Lua.
                    Ok(Value::Int(rounded)) if in_lua => {
                        if let Some((holder, t, _, _)) = lock_info(&mut c, key) {
                            if holder == owner {
                                assert!(
                                    (t - rounded).abs() <= 256,
                                    "{}: Lua returned {rounded}, the hold has {t}",
                                    ctx(what)
                                );
                                tokens.record(t, owner, &ctx(what));
                            }
                        }
                    }
                    Ok(Value::Int(t)) => tokens.granted(t, owner, &ctx(what)),
                    Ok(Value::Nil) => {}
                    Err(e)
                        if e.code() == Some("WRONGTYPE") || e.to_string().contains("WRONGTYPE") => {
                    }
                    other => panic!("{}: {other:?}", ctx(what)),
                }
            }
            900..=929 => {
                // Garbage arguments: always an ERR, never an internal error.
                what = "bad input";
                let cmd = [
                    "LOCK.ACQUIRE",
                    "LOCK.RELEASE",
                    "LOCK.EXTEND",
                    "LOCK.FENCE",
                    "LOCK.INFO",
                ][rng.gen_range(0..5)];
                let junk: Vec<Vec<u8>> = (0..rng.gen_range(0..6))
                    .map(|_| {
                        [
                            &b""[..],
                            b"-1",
                            b"0",
                            b"x",
                            b"BLOCK",
                            b"block",
                            b"99999999999999999999",
                            b"\x00\xff",
                            b"FOO",
                        ][rng.gen_range(0..9)]
                        .to_vec()
                    })
                    .collect();
                let mut all = vec![key.as_bytes().to_vec()];
                all.extend(junk);
                match call(&mut c, cmd, &all) {
                    Err(e) => assert!(
                        matches!(e.code(), Some("ERR" | "WRONGTYPE"))
                            && !e.to_string().contains("internal"),
                        "{}: {cmd} {all:?}: {e}",
                        ctx(what)
                    ),
                    // Some junk is valid (e.g. `LOCK.FENCE key` or `LOCK.RELEASE key x`).
                    Ok(v) => {
                        if let (Value::Int(t), "LOCK.ACQUIRE") = (&v, cmd) {
                            tokens.granted(*t, &all[1], &ctx(what));
                        }
                    }
                }
            }
            930..=959 => {
                what = "SWAPDB";
                let _: () = redis::cmd("SWAPDB").arg(0).arg(1).query(&mut c).unwrap();
            }
            960..=974 => {
                what = if rng.gen_bool(0.5) {
                    "FLUSHDB"
                } else {
                    "FLUSHALL"
                };
                let _: () = redis::cmd(what).query(&mut c).unwrap();
            }
            975..=989 => {
                what = "DEBUG RELOAD";
                let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
            }
            _ => {
                what = "sleep 2ms";
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        *counts.entry(what).or_default() += 1;
        note.record(format!(
            "{step} @{}: {what} key={key} other={other} owner={} any_owner={} ttl={ttl}",
            unix_ms(),
            owner.escape_ascii(),
            any_owner.escape_ascii()
        ));
        check_consistent(&mut c, step, what);
        if step % 500 == 0 {
            assert_alive(&server, &pid);
        }
    }

    for (i, side) in sides.iter_mut().enumerate() {
        collect(
            &server,
            side,
            &mut tokens,
            &mut hangs,
            &format!("final collect {i}"),
        );
    }
    assert!(
        hangs.is_empty(),
        "{} blocked LOCK.ACQUIRE never answered; the first:\n{}",
        hangs.len(),
        hangs[0]
    );
    wait_until("no blocked clients", PATIENCE, || {
        lock_stat(&mut c, "waiters") == 0 && info_int(&mut c, "clients", "blocked_clients") == 0
    });
    assert_eq!(lock_stat(&mut c, "waiting_keys"), 0);
    let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    wait_until("lock_locks == 0 after FLUSHALL", PATIENCE, || {
        lock_stat(&mut c, "locks") == 0
    });
    assert_alive(&server, &pid);
    assert_clean_log(&server);
    eprintln!(
        "random_command_sequences: {ops} commands, {} distinct tokens, mix {counts:?}",
        tokens.seen.len()
    );
}
