//! The `INFO lock` section: its fields in order, the counters after a known sequence of
//! grants, releases, handoffs, timeouts and expiries, and the gauges of blocked clients.

use super::*;

/// The `INFO lock` counters, all integers.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Counters {
    locks: i64,
    waiters: i64,
    waiting_keys: i64,
    acquired: i64,
    contended: i64,
    handed_off: i64,
    released: i64,
    extended: i64,
    expired: i64,
    timed_out: i64,
    token_high_water: i64,
    sessions: i64,
    sessions_opened: i64,
    sessions_closed: i64,
    sessions_expired: i64,
    sessions_disconnected: i64,
    session_holds_released: i64,
    keys_in_lock_delay: i64,
    sets_overtaken: i64,
}

/// One of `lock_wait_ms` / `lock_hold_ms`: `count=N,mean=F,p50=F,p90=F,p99=F,max=F`.
#[derive(Debug, Default, Clone, PartialEq)]
struct Summary {
    count: i64,
    mean: f64,
    p50: f64,
    p90: f64,
    p99: f64,
    max: f64,
}

/// The whole `INFO lock` section.
#[derive(Debug)]
struct LockInfo {
    counters: Counters,
    wait: Summary,
    hold: Summary,
}

/// The field names `INFO lock` must print, in order.
const INFO_FIELDS: [&str; 51] = [
    "lock_locks",
    "lock_waiters",
    "lock_waiting_keys",
    "lock_acquired",
    "lock_contended",
    "lock_handed_off",
    "lock_released",
    "lock_extended",
    "lock_expired",
    "lock_timed_out",
    "lock_token_high_water",
    "lock_sessions",
    "lock_sessions_opened",
    "lock_sessions_closed",
    "lock_sessions_expired",
    "lock_sessions_disconnected",
    "lock_sessions_killed",
    "lock_sessions_detached",
    "lock_sessions_reattached",
    "lock_sessions_grace_expired",
    "lock_session_holds_released",
    "lock_keys_in_lock_delay",
    "lock_sets_overtaken",
    "lock_wait_ms",
    "lock_hold_ms",
    "lock_wait_ms_count",
    "lock_wait_ms_sum",
    "lock_wait_ms_le_1",
    "lock_wait_ms_le_5",
    "lock_wait_ms_le_10",
    "lock_wait_ms_le_50",
    "lock_wait_ms_le_100",
    "lock_wait_ms_le_500",
    "lock_wait_ms_le_1000",
    "lock_wait_ms_le_5000",
    "lock_wait_ms_le_10000",
    "lock_wait_ms_le_60000",
    "lock_wait_ms_le_inf",
    "lock_hold_ms_count",
    "lock_hold_ms_sum",
    "lock_hold_ms_le_1",
    "lock_hold_ms_le_5",
    "lock_hold_ms_le_10",
    "lock_hold_ms_le_50",
    "lock_hold_ms_le_100",
    "lock_hold_ms_le_500",
    "lock_hold_ms_le_1000",
    "lock_hold_ms_le_5000",
    "lock_hold_ms_le_10000",
    "lock_hold_ms_le_60000",
    "lock_hold_ms_le_inf",
];

/// Parse `count=N,mean=F,...`, checking the keys and their order and that the statistics are
/// consistent (`p50 <= p90 <= p99 <= max`, `mean <= max`, all zero when `count` is 0).
#[track_caller]
fn parse_summary(field: &str, text: &str) -> Summary {
    let parts: Vec<(&str, &str)> = text
        .split(',')
        .map(|kv| {
            kv.split_once('=')
                .unwrap_or_else(|| panic!("{field}: {kv:?} in {text:?} is not name=value"))
        })
        .collect();
    let names: Vec<&str> = parts.iter().map(|(k, _)| *k).collect();
    assert_eq!(
        names,
        ["count", "mean", "p50", "p90", "p99", "max"],
        "{field} = {text:?}"
    );
    let float = |i: usize| -> f64 {
        parts[i]
            .1
            .parse()
            .unwrap_or_else(|e| panic!("{field}: {:?} in {text:?}: {e}", parts[i].1))
    };
    let s = Summary {
        count: parts[0]
            .1
            .parse()
            .unwrap_or_else(|e| panic!("{field}: count in {text:?}: {e}")),
        mean: float(1),
        p50: float(2),
        p90: float(3),
        p99: float(4),
        max: float(5),
    };
    assert!(s.count >= 0, "{field} = {text:?}");
    assert!(
        0.0 <= s.p50 && s.p50 <= s.p90 && s.p90 <= s.p99 && s.p99 <= s.max && s.mean <= s.max,
        "{field} = {text:?}: statistics out of order"
    );
    if s.count == 0 {
        assert_eq!(s, Summary::default(), "{field} = {text:?} with no samples");
    }
    s
}

/// Read and parse `INFO lock`: exactly the fields in `INFO_FIELDS`, in that order.
#[track_caller]
fn lock_stats(conn: &mut Connection) -> LockInfo {
    let text: String = redis::cmd("INFO")
        .arg("lock")
        .query(conn)
        .expect("INFO lock");
    let fields: Vec<(String, String)> = text
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l
                .split_once(':')
                .unwrap_or_else(|| panic!("INFO lock line {l:?}"));
            (k.to_string(), v.to_string())
        })
        .collect();
    let names: Vec<&str> = fields.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, INFO_FIELDS, "INFO lock fields:\n{text}");
    // By name, so that a field added later (issue 32's) moves no other.
    let value = |name: &str| -> &str {
        let name = format!("lock_{name}");
        &fields.iter().find(|(k, _)| *k == name).unwrap().1
    };
    let int = |name: &str| -> i64 {
        value(name)
            .parse()
            .unwrap_or_else(|e| panic!("lock_{name} = {:?}: {e}", value(name)))
    };
    LockInfo {
        counters: Counters {
            locks: int("locks"),
            waiters: int("waiters"),
            waiting_keys: int("waiting_keys"),
            acquired: int("acquired"),
            contended: int("contended"),
            handed_off: int("handed_off"),
            released: int("released"),
            extended: int("extended"),
            expired: int("expired"),
            timed_out: int("timed_out"),
            token_high_water: int("token_high_water"),
            sessions: int("sessions"),
            sessions_opened: int("sessions_opened"),
            sessions_closed: int("sessions_closed"),
            sessions_expired: int("sessions_expired"),
            sessions_disconnected: int("sessions_disconnected"),
            session_holds_released: int("session_holds_released"),
            keys_in_lock_delay: int("keys_in_lock_delay"),
            sets_overtaken: int("sets_overtaken"),
        },
        wait: parse_summary("lock_wait_ms", value("wait_ms")),
        hold: parse_summary("lock_hold_ms", value("hold_ms")),
    }
}

/// Assert every `INFO lock` counter equals `expected`.
#[track_caller]
fn assert_counters(conn: &mut Connection, expected: &Counters, after: &str) {
    assert_eq!(
        lock_stats(conn).counters,
        *expected,
        "INFO lock after {after}"
    );
}

/// Assert `summary` holds exactly one sample: every statistic is that sample, and it is at
/// most `bound_ms` (what the test saw pass, plus any clock resolution the caller allows).
#[track_caller]
fn assert_one_sample(what: &str, s: &Summary, bound_ms: f64) {
    assert!(
        s.mean == s.max && s.p50 == s.max && s.p90 == s.max && s.p99 == s.max,
        "one {what} sample: {s:?}"
    );
    assert!(
        s.max <= bound_ms,
        "{what} {s:?} longer than the {bound_ms} ms observed"
    );
}

/// `DEBUG SET-ACTIVE-EXPIRE 0|1`: whether Redis deletes expired keys in the background.
fn set_active_expire(c: &mut Connection, on: bool) {
    let _: () = redis::cmd("DEBUG")
        .arg("SET-ACTIVE-EXPIRE")
        .arg(i32::from(on))
        .query(c)
        .unwrap();
}

/// Milliseconds elapsed since `start`, as a float.
fn ms_since(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1000.0
}

#[test]
fn info_section_counts_a_known_sequence_exactly() {
    let (server, mut c) = start();
    let mut want = Counters::default();
    let start = lock_stats(&mut c);
    // The start jump (lock.failover-token-margin-ms) sets the high-water mark before any grant.
    assert!(start.counters.token_high_water > 0, "no start jump");
    want.token_high_water = start.counters.token_high_water;
    assert_eq!(start.counters, want, "fresh server");
    assert_eq!((start.wait.count, start.hold.count), (0, 0));

    // Three grants on distinct keys.
    let keys: Vec<String> = (1..=3).map(|i| unique_key(&format!("stats{i}"))).collect();
    let before_k3 = Instant::now();
    let tokens: Vec<i64> = keys
        .iter()
        .map(|k| must_acquire(&mut c, k, "a", LONG_TTL))
        .collect();
    want.acquired = 3;
    want.locks = 3;
    want.token_high_water = *tokens.iter().max().unwrap();
    assert_counters(&mut c, &want, "3 grants");

    // A retry by the holder returns the same token: no new grant.
    assert_eq!(must_acquire(&mut c, &keys[0], "a", LONG_TTL), tokens[0]);
    assert_counters(&mut c, &want, "an idempotent retry");

    // A contended, non-blocking acquire.
    assert_eq!(acquire(&mut c, &keys[0], "b", LONG_TTL), None);
    want.contended = 1;
    assert_counters(&mut c, &want, "a contended acquire");

    // One release; a release by a non-owner changes nothing.
    assert_eq!(release(&mut c, &keys[2], "b"), 0);
    assert_eq!(release(&mut c, &keys[2], "a"), 1);
    let k3_bound = ms_since(before_k3);
    want.released = 1;
    want.locks = 2;
    assert_counters(&mut c, &want, "a release");
    let stats = lock_stats(&mut c);
    assert_eq!((stats.wait.count, stats.hold.count), (0, 1));
    // One sample: every statistic is that sample, at most the time the test saw pass. Hold
    // times come from the server's millisecond clock (grant and release each truncated to the
    // millisecond), so a sub-millisecond hold can read as 1 ms.
    assert_one_sample("hold", &stats.hold, k3_bound + 1.0);

    // One extend; an extend by a non-owner changes nothing.
    assert_eq!(extend(&mut c, &keys[1], "b", LONG_TTL), 0);
    assert_eq!(extend(&mut c, &keys[1], "a", LONG_TTL), 1);
    want.extended = 1;
    assert_counters(&mut c, &want, "an extend");

    // A blocked waiter (contended too), handed the lock on release.
    let queued = Instant::now();
    let waiter = start_waiter(&server, &mut c, &keys[0], "w", LONG_TTL, 0);
    want.contended = 2;
    want.waiters = 1;
    want.waiting_keys = 1;
    assert_counters(&mut c, &want, "a waiter blocked");
    assert_eq!(release(&mut c, &keys[0], "a"), 1);
    let w_token = granted(waiter);
    let wait_bound = ms_since(queued);
    assert!(w_token > want.token_high_water);
    want.waiters = 0;
    want.waiting_keys = 0;
    want.released = 2;
    want.handed_off = 1;
    want.acquired = 4;
    want.token_high_water = w_token;
    assert_counters(&mut c, &want, "a handoff");
    let stats = lock_stats(&mut c);
    assert_eq!((stats.wait.count, stats.hold.count), (1, 2));
    assert_one_sample("wait", &stats.wait, wait_bound);

    // A waiter whose BLOCK timeout passes first. It runs on this connection: polling
    // `blocked_clients` could miss a 50 ms wait on a loaded machine, and the reply is enough.
    let reply = block_cmd(&keys[1], "t", LONG_TTL, 50).query::<Value>(&mut c);
    assert_eq!(reply, Ok(Value::Nil), "timed-out waiter");
    want.contended = 3;
    want.timed_out = 1;
    assert_counters(&mut c, &want, "a waiter timed out");

    // A hold left to expire; Redis deletes the key. Active expiry is off until the counters
    // were read, so a slow machine cannot expire it before the test looks.
    set_active_expire(&mut c, false);
    let short = unique_key("stats-expire");
    let e_token = must_acquire(&mut c, &short, "e", 50);
    want.acquired = 5;
    want.locks = 3;
    want.token_high_water = e_token;
    assert_counters(&mut c, &want, "a short grant");
    set_active_expire(&mut c, true);
    wait_until("the short lock's key to expire", PATIENCE, || {
        exists(&mut c, &short) == 0
    });
    want.expired = 1;
    want.locks = 2;
    assert_counters(&mut c, &want, "an expiry");

    // The histograms only count releases and grants to waiters.
    let stats = lock_stats(&mut c);
    assert_eq!((stats.wait.count, stats.hold.count), (1, 2), "{stats:?}");
}

#[test]
fn info_section_counts_an_expiry_replaced_by_a_new_grant_once() {
    let (_server, mut c) = start();
    let key = unique_key("stats");
    let mut want = Counters::default();
    // Active expiry off: nothing deletes the key in the background, so the next command on it
    // finds the expired hold (Redis may delete it lazily, or the module replaces it).
    set_active_expire(&mut c, false);
    let first = must_acquire(&mut c, &key, "e1", 30);
    want.acquired = 1;
    want.locks = 1;
    want.token_high_water = first;
    assert_counters(&mut c, &want, "a short grant");

    wait_until("LOCK.FENCE to see the hold expired", PATIENCE, || {
        fence(&mut c, &key).is_none()
    });
    let second = must_acquire(&mut c, &key, "e2", LONG_TTL);
    assert!(second > first);
    want.acquired = 2;
    want.expired = 1;
    want.token_high_water = second;
    assert_counters(&mut c, &want, "a grant over an expired hold");

    assert_eq!(release(&mut c, &key, "e2"), 1);
    want.released = 1;
    want.locks = 0;
    assert_counters(&mut c, &want, "releasing the new hold");
}

#[test]
fn info_section_counts_an_expiry_handed_to_a_waiter() {
    let (server, mut c) = start();
    let key = unique_key("stats");
    let mut want = Counters::default();
    // Long enough for the waiter to be seen blocked before the deadline on a loaded machine.
    let first = must_acquire(&mut c, &key, "e1", 250);
    let waiter = start_waiter(&server, &mut c, &key, "e2", LONG_TTL, 0);
    let second = granted(waiter);
    assert!(second > first);
    want.acquired = 2;
    want.contended = 1;
    want.handed_off = 1;
    want.expired = 1;
    want.locks = 1;
    want.token_high_water = second;
    assert_counters(&mut c, &want, "an expired hold handed to a waiter");
    let stats = lock_stats(&mut c);
    assert_eq!((stats.wait.count, stats.hold.count), (1, 0), "{stats:?}");
}

#[test]
fn info_section_gauges_follow_blocked_clients() {
    let (server, mut c) = start();
    let (k1, k2) = (unique_key("gauge1"), unique_key("gauge2"));
    must_acquire(&mut c, &k1, "a", LONG_TTL);
    must_acquire(&mut c, &k2, "a", LONG_TTL);
    let gauges = |c: &mut Connection| {
        let s = lock_stats(c).counters;
        (s.waiters, s.waiting_keys)
    };
    assert_eq!(gauges(&mut c), (0, 0));

    let w1 = start_waiter(&server, &mut c, &k1, "w1", LONG_TTL, 0);
    assert_eq!(gauges(&mut c), (1, 1));
    let w2 = start_waiter(&server, &mut c, &k1, "w2", LONG_TTL, 0);
    assert_eq!(gauges(&mut c), (2, 1));
    let w3 = start_waiter(&server, &mut c, &k2, "w3", LONG_TTL, 0);
    assert_eq!(gauges(&mut c), (3, 2));

    assert_eq!(release(&mut c, &k2, "a"), 1);
    granted(w3);
    assert_eq!(gauges(&mut c), (2, 1), "after the handoff on {k2}");
    assert_eq!(release(&mut c, &k1, "a"), 1);
    granted(w1);
    assert_eq!(gauges(&mut c), (1, 1), "after the first handoff on {k1}");
    assert_eq!(release(&mut c, &k1, "w1"), 1);
    granted(w2);
    assert_eq!(gauges(&mut c), (0, 0), "after the last handoff");
    assert_eq!(blocked_clients(&mut c), 0);
}
