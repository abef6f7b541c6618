//! Fencing tokens across a promotion or a restart, with skewed clocks.
//!
//! A promoted replica (or a server started again) may have missed the newest grants, and its
//! wall clock may be behind the one that issued them. `lock.failover-token-margin-ms` (60 s by
//! default) makes it jump its token high-water mark ahead before it mints anything, so its
//! tokens exceed every token lost with the old primary. Each skew test runs with the margin
//! (the new tokens are larger) and with margin 0 (they are not: the failure the margin
//! prevents, shown so that the test can fail).
//!
//! The shifted clocks come from the project's LD_PRELOAD library (`make clockshift`, see
//! `harness/src/clock.rs`).

mod common;

use std::path::PathBuf;

use common::clock::ShiftedClock;
use common::*;
use redis::{Connection, Value};

const LONG_TTL: i64 = 100_000;
const MARGIN: i64 = 60_000;
/// Tokens per millisecond of clock (`lock::CLOCK_SHIFT` is 11).
const PER_MS: i64 = 1 << 11;

fn high_water(c: &mut Connection) -> i64 {
    info_field(c, "lock", "lock_token_high_water")
        .expect("lock_token_high_water in INFO lock")
        .parse()
        .expect("a number")
}

fn clock_dir() -> PathBuf {
    std::env::temp_dir().join("redis-lock-tests").join("clocks")
}

/// Cut `replica` off its primary without promoting it: it follows a port nobody listens on.
fn detach(replica: &Server) {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = dead.local_addr().unwrap().port();
    drop(dead);
    let mut r = replica.conn();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(port)
        .query(&mut r)
        .unwrap();
    wait_until("the replica to lose its link", Default::default(), || {
        info_field(&mut r, "replication", "master_link_status").as_deref() == Some("down")
    });
}

#[test]
fn margin_config_has_a_default_a_range_and_a_module_argument() {
    let (_server, mut c) = start();
    let name = "lock.failover-token-margin-ms";
    assert_eq!(config_get(&mut c, name), "60000");
    assert_eq!(config_set(&mut c, name, "0"), Ok(Value::Okay));
    assert_eq!(config_get(&mut c, name), "0");
    assert_eq!(config_set(&mut c, name, "86400000"), Ok(Value::Okay));
    for bad in ["-1", "86400001", "abc"] {
        assert_err_code(config_set(&mut c, name, bad), "ERR");
    }
    assert_eq!(config_get(&mut c, name), "86400000");

    let server = Server::start_with_module_args(&["failover-token-margin-ms", "1234"], &[]);
    assert_eq!(config_get(&mut server.conn(), name), "1234");
}

#[test]
fn first_token_after_a_start_is_a_margin_ahead_of_the_clock() {
    let before = unix_ms();
    let (server, mut c) = start();
    let token = must_acquire(&mut c, &unique_key("start"), "alice", LONG_TTL);
    let after = unix_ms();
    assert!(
        token > (before + MARGIN) * PER_MS && token <= (after + MARGIN + 1) * PER_MS,
        "token {token} = {} ms, wall clock {before}..={after}",
        token / PER_MS
    );
    // The jump is made once, at the start: the next token follows on.
    assert_eq!(
        must_acquire(&mut c, &unique_key("start"), "alice", LONG_TTL),
        token + 1
    );
    assert!(
        server
            .log()
            .contains("redis-lock: started; token high-water mark 0 -> "),
        "no start line in the log"
    );
}

#[test]
fn promotion_moves_tokens_a_margin_past_the_replicated_ones() {
    let primary = Server::start();
    let replica = Server::replica_of(&primary);
    let mut p = primary.conn();
    let t1 = must_acquire(&mut p, &unique_key("promote"), "alice", LONG_TTL);
    wait_for_replica_sync(&primary, &replica);
    let mut r = replica.conn();
    // The replica made its own start jump; it has seen t1 too.
    let seen = high_water(&mut r);
    assert!(seen >= t1, "replica high water {seen} < {t1}");

    promote(&replica);
    let jumped = high_water(&mut r);
    assert!(
        jumped >= seen + MARGIN * PER_MS,
        "promoted: {seen} -> {jumped}"
    );
    let t2 = must_acquire(&mut r, &unique_key("promote"), "bob", LONG_TTL);
    assert_eq!(t2, jumped + 1);
    assert!(
        replica
            .log()
            .contains("redis-lock: promoted to primary; token high-water mark"),
        "no promotion line in the log"
    );
}

#[test]
fn promotion_with_margin_0_only_follows_on() {
    let primary = Server::start_with_module_args(&["failover-token-margin-ms", "0"], &[]);
    let port = primary.port().to_string();
    let replica = Server::start_with_module_args(
        &["failover-token-margin-ms", "0"],
        &["--replicaof", "127.0.0.1", &port],
    );
    let mut p = primary.conn();
    let t1 = must_acquire(&mut p, &unique_key("promote"), "alice", LONG_TTL);
    wait_for_replica_sync(&primary, &replica);
    let mut r = replica.conn();
    assert_eq!(
        config_set(&mut r, "lock.failover-token-margin-ms", "0"),
        Ok(Value::Okay)
    );
    promote(&replica);
    let hw = high_water(&mut r);
    assert!(
        hw >= t1 && hw <= (unix_ms() + 1) * PER_MS,
        "t1 {t1}, high water {hw}: no jump expected"
    );
    let t2 = must_acquire(&mut r, &unique_key("promote"), "bob", LONG_TTL);
    assert!(
        t2 > t1 && t2 <= (unix_ms() + 1) * PER_MS,
        "t1 {t1}, t2 {t2}: no jump expected"
    );
}

/// The old primary grants, the replica (its clock `skew_ms` off) sees some of the grants,
/// loses its link, the primary grants more, the primary dies and the replica is promoted.
/// Returns (largest token of the old primary, first token of the new one).
fn skewed_failover(skew_ms: i64, margin: &str) -> (i64, i64) {
    let primary = Server::start_with_module_args(&["failover-token-margin-ms", margin], &[]);
    let clock = ShiftedClock::new(&clock_dir(), skew_ms);
    let replica = Server::builder()
        .clock(&clock)
        .module_args(&["failover-token-margin-ms", margin])
        .replica_of(primary.port())
        .start();
    let mut r = replica.conn();
    let replica_time: Vec<String> = redis::cmd("TIME").query(&mut r).unwrap();
    let seen_skew = replica_time[0].parse::<i64>().unwrap() * 1000 - unix_ms();
    assert!(
        (seen_skew - skew_ms).abs() < 2_000,
        "the replica's clock is {seen_skew} ms off, wanted {skew_ms}"
    );

    let mut p = primary.conn();
    for i in 0..20 {
        must_acquire(&mut p, &format!("seen:{i}"), "alice", LONG_TTL);
    }
    wait_for_replica_sync(&primary, &replica);
    detach(&replica);
    let lost: Vec<i64> = (0..200)
        .map(|i| must_acquire(&mut p, &format!("lost:{i}"), "alice", LONG_TTL))
        .collect();
    let old_max = *lost.iter().max().unwrap();
    drop(primary);

    promote(&replica);
    let first = must_acquire(&mut r, "lost:0", "bob", LONG_TTL);
    (old_max, first)
}

/// [`skewed_failover`] with a replica `skew_ms` off: the default margin (60 s) gives the new
/// primary larger tokens, margin 0 does not.
fn the_margin_alone_covers(skew_ms: i64) {
    let (old_max, first) = skewed_failover(skew_ms, "60000");
    assert!(
        first > old_max,
        "margin 60000: first {first} <= old {old_max}"
    );
    let (old_max, first) = skewed_failover(skew_ms, "0");
    assert!(
        first <= old_max,
        "margin 0: first {first} > old {old_max}: the failure did not show"
    );
}

#[test]
fn a_replica_10s_behind_issues_larger_tokens_with_the_margin_only() {
    the_margin_alone_covers(-10_000);
}

#[test]
fn a_replica_60s_behind_issues_larger_tokens_with_the_margin_only() {
    the_margin_alone_covers(-60_000);
}

/// A server with no persistence restarts with its clock 10 s behind: with the margin its
/// first token exceeds the last one before the restart; with margin 0 it does not.
///
/// The first incarnation starts with its clock `MARGIN` behind, then runs on the true clock:
/// its start jump lands at the true time, and its tokens follow its clock, as those of a
/// server up for longer than the margin do. (Right after a start jump, tokens run `MARGIN`
/// ahead of the clock, and a restart then is covered only for a clock behind by less than
/// the time since that jump: see README, "Fencing tokens".)
#[test]
fn a_restart_without_persistence_on_a_clock_10s_behind() {
    for (margin, larger) in [("60000", true), ("0", false)] {
        let clock = ShiftedClock::new(&clock_dir(), -MARGIN);
        let mut server =
            Server::start_with_env(clock.env(), &["failover-token-margin-ms", margin], &[]);
        clock.set(0);
        let mut c = server.conn();
        let last = (0..100)
            .map(|i| must_acquire(&mut c, &format!("k:{i}"), "alice", LONG_TTL))
            .max()
            .unwrap();
        assert!(
            last <= (unix_ms() + 1) * PER_MS,
            "{last} runs ahead of the clock"
        );
        server.kill9();
        clock.set(-10_000);
        server.restart();
        let mut c = server.conn();
        let first = must_acquire(&mut c, "k:0", "bob", LONG_TTL);
        assert_eq!(
            first > last,
            larger,
            "margin {margin}: last token before the restart {last}, first after {first}"
        );
    }
}

/// A restart from an RDB jumps from the loaded high-water mark (the snapshot may miss the last
/// grants); a `DEBUG RELOAD` after the first grant, which loses nothing, does not jump.
#[test]
fn a_restart_from_rdb_jumps_from_the_loaded_mark_and_debug_reload_does_not() {
    let mut server = Server::start();
    let mut c = server.conn();
    let saved = must_acquire(&mut c, "k:saved", "alice", LONG_TTL);
    let _: () = redis::cmd("SAVE").query(&mut c).unwrap();
    must_acquire(&mut c, "k:unsaved", "alice", LONG_TTL);
    server.kill9();
    server.restart();
    let mut c = server.conn();
    assert_eq!(fence(&mut c, "k:saved"), Some(saved));
    let hw = high_water(&mut c);
    assert!(
        hw >= saved + MARGIN * PER_MS,
        "high water {hw} after loading {saved}"
    );
    assert!(
        server
            .log()
            .contains("redis-lock: loaded its data; token high-water mark"),
        "no load line in the log"
    );
    // After the first grant since the start, a reload is no start-up load.
    assert_eq!(must_acquire(&mut c, "k:next", "bob", LONG_TTL), hw + 1);
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    assert_eq!(high_water(&mut c), hw + 1);
    assert_eq!(must_acquire(&mut c, "k:after", "bob", LONG_TTL), hw + 2);
}
