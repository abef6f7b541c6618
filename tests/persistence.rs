//! Holds and token order across deletion, DEBUG RELOAD, RDB and AOF restarts
//! (after SIGKILL), and restarts with no persistence at all.
//!
//! The rule under test: a hold that was persisted comes back with the same
//! owner, token and absolute deadline, and a key's next token is always larger
//! than every token issued for it before.

mod common;

use std::thread;
use std::time::Duration;

use common::*;
use redis::Connection;

const LONG_TTL: i64 = 100_000;

fn new_key() -> String {
    unique_key("persistence")
}

/// `alice` holds `held` (its token `token`); `bob` held `released` (token `old`) and released
/// it; then the hold aged (see [`age_the_hold`]).
struct HeldAndReleased {
    held: String,
    token: i64,
    released: String,
    old: i64,
}

fn hold_one_release_one(c: &mut Connection) -> HeldAndReleased {
    let (held, released) = (new_key(), new_key());
    let token = must_acquire(c, &held, "alice", LONG_TTL);
    let old = must_acquire(c, &released, "bob", LONG_TTL);
    assert_eq!(release(c, &released, "bob"), 1);
    age_the_hold();
    HeldAndReleased {
        held,
        token,
        released,
        old,
    }
}

impl HeldAndReleased {
    /// After `what`: alice's hold is the same (deadline included, `before` being its `PTTL`
    /// before), the next tokens are above the old ones, and bob's key is free.
    #[track_caller]
    fn assert_survived(&self, c: &mut Connection, before: i64, what: &str) {
        let Self {
            held,
            token,
            released,
            old,
        } = self;
        assert_same_hold(c, held, "alice", *token, before);
        assert_next_token_above(c, held, "alice", *token);
        assert_absent(c, released);
        let next = must_acquire(c, released, "bob", LONG_TTL);
        assert!(next > *old, "token {next} after {what} not above {old}");
    }
}

/// Kill the server with SIGKILL (closing `c` first) and start it again on the same
/// directory; a connection to the new process.
fn kill9_and_restart(server: &mut Server, c: Connection) -> Connection {
    drop(c);
    server.kill9();
    server.restart();
    server.conn()
}

/// Let a hold age before it is persisted and reloaded. If a replay re-applied
/// the ttl relative to load time instead of restoring the absolute deadline,
/// PTTL after the reload would come out about this much *higher* than before.
/// (This sleep passes time on purpose; it does not wait for the server.)
fn age_the_hold() {
    thread::sleep(Duration::from_millis(100));
}

/// Assert `key` is held by `owner` with `token` and a deadline no later than
/// `pttl_before` ms from when that was measured (allowing 2 ms of rounding),
/// and not yet passed.
#[track_caller]
fn assert_same_hold(c: &mut Connection, key: &str, owner: &str, token: i64, pttl_before: i64) {
    assert_eq!(fence(c, key), Some(token), "LOCK.FENCE {key} after reload");
    assert_eq!(key_type(c, key), "redislock");
    let left = pttl(c, key);
    assert!(
        left > 0 && left <= pttl_before + 2,
        "PTTL {key} after reload = {left}, before = {pttl_before}"
    );
    // Someone else cannot take it; the owner's retry is idempotent (same token).
    assert_eq!(acquire(c, key, "intruder", LONG_TTL), None);
    assert_eq!(
        acquire(c, key, owner, LONG_TTL),
        Some(token),
        "owner's retry after reload"
    );
}

/// Release `key` held by `owner` and check the next grant is above `token`.
#[track_caller]
fn assert_next_token_above(c: &mut Connection, key: &str, owner: &str, token: i64) {
    assert_eq!(release(c, key, owner), 1);
    assert_eq!(exists(c, key), 0);
    let next = must_acquire(c, key, "next", LONG_TTL);
    assert!(
        next > token,
        "next token {next} for {key} not above {token}"
    );
}

#[test]
fn tokens_keep_increasing_after_release_expiry_del_unlink_and_flushall() {
    let (_server, mut c) = start();
    let key = new_key();
    let mut last = 0;
    let mut next = |c: &mut Connection, step: &str, ttl: i64| {
        let t = must_acquire(c, &key, "owner", ttl);
        assert!(t > last, "token {t} after {step} not above {last}");
        last = t;
    };

    next(&mut c, "first grant", LONG_TTL);
    assert_eq!(release(&mut c, &key, "owner"), 1);
    next(&mut c, "release", 30);

    // Expiry: let the 30 ms hold lapse, then take it again.
    let expiry = std::time::Instant::now() + Duration::from_millis(35);
    sleep_until(expiry);
    assert_eq!(fence(&mut c, &key), None);
    next(&mut c, "expiry", LONG_TTL);

    redis::cmd("DEL").arg(&key).query::<i64>(&mut c).unwrap();
    assert_eq!(exists(&mut c, &key), 0);
    next(&mut c, "DEL", LONG_TTL);

    redis::cmd("UNLINK").arg(&key).query::<i64>(&mut c).unwrap();
    assert_eq!(exists(&mut c, &key), 0);
    next(&mut c, "UNLINK", LONG_TTL);

    redis::cmd("FLUSHALL").query::<()>(&mut c).unwrap();
    assert_eq!(exists(&mut c, &key), 0);
    next(&mut c, "FLUSHALL", LONG_TTL);

    redis::cmd("FLUSHALL")
        .arg("ASYNC")
        .query::<()>(&mut c)
        .unwrap();
    next(&mut c, "FLUSHALL ASYNC", LONG_TTL);
}

#[test]
fn tokens_keep_increasing_when_the_key_is_deleted_in_a_tight_loop() {
    // Many grants per millisecond: the order must not depend on the clock
    // having moved between a DEL and the next grant.
    let (_server, mut c) = start();
    let key = new_key();
    let mut last = 0;
    for i in 0..300 {
        let t = must_acquire(&mut c, &key, "owner", LONG_TTL);
        assert!(t > last, "grant {i}: token {t} not above {last}");
        last = t;
        redis::cmd("DEL").arg(&key).query::<i64>(&mut c).unwrap();
    }
}

#[test]
fn debug_reload_keeps_holds_and_token_order() {
    let (_server, mut c) = start();
    let keys = hold_one_release_one(&mut c);
    let before = pttl(&mut c, &keys.held);

    redis::cmd("DEBUG")
        .arg("RELOAD")
        .query::<()>(&mut c)
        .unwrap();

    keys.assert_survived(&mut c, before, "DEBUG RELOAD");
}

#[test]
fn rdb_restart_after_kill9_keeps_holds() {
    let mut server = Server::start_with(&["--save", "900", "1"]);
    let mut c = server.conn();
    let keys = hold_one_release_one(&mut c);
    redis::cmd("SAVE").query::<()>(&mut c).unwrap();
    let before = pttl(&mut c, &keys.held);
    let mut c = kill9_and_restart(&mut server, c);

    keys.assert_survived(&mut c, before, "restart");
}

/// The current base file of a multi-part AOF (Redis 7), from its manifest
/// (`file <name> seq <n> type b`).
fn aof_base_file(server: &Server) -> std::path::PathBuf {
    let dir = server.dir().join("appendonlydir");
    let manifest = std::fs::read_to_string(dir.join("appendonly.aof.manifest"))
        .unwrap_or_else(|e| panic!("no AOF manifest in {}: {e}", dir.display()));
    let name = manifest
        .lines()
        .find(|line| line.ends_with("type b"))
        .and_then(|line| line.split_whitespace().nth(1))
        .unwrap_or_else(|| panic!("no base file in the AOF manifest:\n{manifest}"));
    dir.join(name)
}

/// AOF with `appendfsync always`: holds written before a rewrite (into the
/// rewritten base, as RDB preamble or as commands) and after it (into the
/// incremental file) survive SIGKILL.
fn aof_restart_keeps_holds(rdb_preamble: &str) {
    let mut server = Server::start_aof_always(rdb_preamble);
    let mut c = server.conn();
    let (in_base, extended, released_later, in_incr) = (new_key(), new_key(), new_key(), new_key());

    // Before the rewrite: these end up in the base file.
    let t_base = must_acquire(&mut c, &in_base, "alice", LONG_TTL);
    let t_ext = must_acquire(&mut c, &extended, "erin", 10_000);
    let t_rel = must_acquire(&mut c, &released_later, "bob", LONG_TTL);

    wait_no_aof_rewrite(&server);
    let rewrites_before: i64 = server
        .info_field("persistence", "aof_rewrites")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    redis::cmd("BGREWRITEAOF").query::<String>(&mut c).unwrap();
    wait_no_aof_rewrite(&server);
    assert_eq!(
        server
            .info_field("persistence", "aof_last_bgrewrite_status")
            .as_deref(),
        Some("ok"),
        "log:\n{}",
        server.log()
    );
    let rewrites_after: i64 = server
        .info_field("persistence", "aof_rewrites")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(rewrites_after > rewrites_before, "BGREWRITEAOF did not run");
    // The base file is in the format under test: RDB, or commands (which the
    // module writes with its AOF rewrite callback).
    let base = aof_base_file(&server);
    let head = std::fs::read(&base).unwrap_or_else(|e| panic!("{}: {e}", base.display()));
    // Valkey 9 writes RDB files that start with "VALKEY" instead of "REDIS".
    let expected_magic: &[&[u8]] = if rdb_preamble == "yes" {
        &[b"REDIS", b"VALKEY"]
    } else {
        &[b"*"]
    };
    assert!(
        expected_magic.iter().any(|m| head.starts_with(m)),
        "AOF base {} does not start with any of {:?}",
        base.display(),
        expected_magic
            .iter()
            .map(|m| String::from_utf8_lossy(m))
            .collect::<Vec<_>>()
    );

    // After the rewrite: these go to the incremental file only.
    let t_incr = must_acquire(&mut c, &in_incr, "carol", LONG_TTL);
    assert_eq!(extend(&mut c, &extended, "erin", 2 * LONG_TTL), 1);
    assert_eq!(release(&mut c, &released_later, "bob"), 1);

    age_the_hold();
    let before_base = pttl(&mut c, &in_base);
    let before_ext = pttl(&mut c, &extended);
    let before_incr = pttl(&mut c, &in_incr);
    let mut c = kill9_and_restart(&mut server, c);

    assert_same_hold(&mut c, &in_base, "alice", t_base, before_base);
    assert_same_hold(&mut c, &in_incr, "carol", t_incr, before_incr);
    // The extend after the rewrite was replayed: the deadline is the extended one.
    let left = pttl(&mut c, &extended);
    assert!(
        left > LONG_TTL,
        "PTTL {left} of the extended hold: the EXTEND was lost"
    );
    assert_same_hold(&mut c, &extended, "erin", t_ext, before_ext);
    // The release after the rewrite was replayed too.
    assert_absent(&mut c, &released_later);

    assert_next_token_above(&mut c, &in_base, "alice", t_base);
    assert_next_token_above(&mut c, &in_incr, "carol", t_incr);
    let next = must_acquire(&mut c, &released_later, "bob", LONG_TTL);
    assert!(next > t_rel, "token {next} after restart not above {t_rel}");
}

#[test]
fn aof_restart_after_kill9_keeps_holds_with_rdb_preamble() {
    aof_restart_keeps_holds("yes");
}

#[test]
fn aof_restart_after_kill9_keeps_holds_without_rdb_preamble() {
    aof_restart_keeps_holds("no");
}

#[test]
fn restart_without_persistence_still_issues_larger_tokens() {
    let mut server = Server::start();
    let mut c = server.conn();
    let key = new_key();

    let mut max = 0;
    for i in 0..100 {
        let owner = format!("owner-{i}");
        max = max.max(must_acquire(&mut c, &key, &owner, LONG_TTL));
        assert_eq!(release(&mut c, &key, &owner), 1);
    }
    max = max.max(must_acquire(&mut c, &key, "last", LONG_TTL));
    let mut c = kill9_and_restart(&mut server, c);

    assert_absent(&mut c, &key);
    let next = must_acquire(&mut c, &key, "after-restart", LONG_TTL);
    assert!(
        next > max,
        "token {next} after a restart without persistence not above {max}"
    );
}
