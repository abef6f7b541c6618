//! Who is loading a lock value, and what a client's `RESTORE` may load (the rules are in
//! `lock::restore`; this file is where the server tells us who asked).
//!
//! `rdb_load` runs for every load of a lock value, and three kinds must be told apart:
//! - [`Origin::Loading`]: the start-up RDB or AOF (its `RESTORE` commands too), `DEBUG RELOAD`,
//!   a replica's full sync. They replay what this server (or its primary) decided and must
//!   always work: nothing is refused, holds rejoin their sessions (the aux data loaded the
//!   session table first), only a token the module could never mint is not followed.
//! - [`Origin::Replica`]: a `RESTORE` on a replica, which the primary checked before it sent
//!   it (or a client wrote on a writable replica). Refusing would make the replica differ from
//!   its primary, so it is applied; its tokens raise the mark only within the restore limit.
//! - [`Origin::Client`]: a `RESTORE` on a primary: a client's, or the target side of a
//!   `MIGRATE` (which sends `RESTORE-ASKING` as an ordinary client). Checked by
//!   `lock::restore::check`; a refusal makes the server answer `ERR Bad data format` (the
//!   reply is the server's own; the rule is written to the server log) and changes nothing.
//!
//! Why the server's flags and not the command's client: `rdb_load` gets no client, and the
//! context `RM_GetContextFromIO` gives has none; but `server.loading` and the role are global
//! and are what `RM_GetContextFlags` reports for any context.

use std::cell::Cell;

use redis_module::{logging, raw, RedisString};

use crate::lock::restore::{check, restore_limit};
use crate::lock::{Hold, Lock, Millis, Serial};
use crate::redis::key::{self, LockKey};
use crate::state;

/// Who asked for the load in progress (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Loading,
    Replica,
    Client,
}

thread_local! {
    /// A context of our own with a client, for the flags and for reading the key a `RESTORE`
    /// replaces. Made at the first load and kept for the module's life.
    static DETACHED: Cell<*mut raw::RedisModuleCtx> = const { Cell::new(std::ptr::null_mut()) };
}

fn detached(rdb: *mut raw::RedisModuleIO) -> *mut raw::RedisModuleCtx {
    let ctx = DETACHED.with(Cell::get);
    if !ctx.is_null() {
        return ctx;
    }
    // SAFETY: rdb is the IO handle of the load in progress; the IO context it returns carries
    // our module, which is all GetDetachedThreadSafeContext reads from it. The detached context
    // is never freed (it lives as long as the module, which cannot be unloaded: it has a type).
    let ctx = unsafe {
        let io_ctx = raw::RedisModule_GetContextFromIO.unwrap()(rdb);
        raw::RedisModule_GetDetachedThreadSafeContext.unwrap()(io_ctx)
    };
    DETACHED.with(|d| d.set(ctx));
    ctx
}

/// Who asked for the load of the value `rdb` is reading.
pub fn origin(rdb: *mut raw::RedisModuleIO) -> Origin {
    let ctx = detached(rdb);
    if ctx.is_null() {
        return Origin::Loading; // no context to ask: the safe side is never to refuse
    }
    let flags = key::context_flags(ctx);
    if flags & (raw::REDISMODULE_CTX_FLAGS_LOADING | raw::REDISMODULE_CTX_FLAGS_ASYNC_LOADING) != 0
    {
        Origin::Loading
    } else if flags & raw::REDISMODULE_CTX_FLAGS_SLAVE != 0 {
        Origin::Replica
    } else {
        Origin::Client
    }
}

/// The database and name of the key `rdb` is loading (empty when the server does not say).
pub fn key_of<'a>(rdb: *mut raw::RedisModuleIO) -> (i32, &'a [u8], *const raw::RedisModuleString) {
    // SAFETY: the IO handle Redis passed to rdb_load; both calls only read it (7.0+). The name
    // lives until the load returns.
    let (name, db) = unsafe {
        (
            raw::RedisModule_GetKeyNameFromIO.unwrap()(rdb),
            raw::RedisModule_GetDbIdFromIO.map_or(0, |f| f(rdb)),
        )
    };
    match name.is_null() {
        true => (db, &[][..], name),
        false => (db, RedisString::string_as_slice(name), name),
    }
}

/// May a client's `RESTORE` load `holders` into the key `rdb` names? Logs the rule and
/// returns false when not.
pub fn admit(rdb: *mut raw::RedisModuleIO, holders: &[Hold]) -> bool {
    let (db, name, _) = key_of(rdb);
    let now = key::now();
    let high_water = state::token_high_water();
    let ctx = detached(rdb);
    // The key still has its old value while its replacement loads (`RESTORE ... REPLACE`
    // deletes the old one only after the load succeeded), so the rules can see both.
    let readable = !name.is_empty() && !ctx.is_null() && key::select_db(ctx, db);
    // A copy of the name: the server's is a stack object during a load, which `RM_OpenKey`
    // would retain (7.0 aborts: "You tried to retain an object allocated in the stack").
    let name_copy = readable.then(|| RedisString::create_from_slice(ctx, name));
    let current = name_copy
        .as_ref()
        .map(|n| LockKey::open_raw(ctx, n.inner, raw::KeyMode::READ));
    let current_lock: Option<&Lock> = current.as_ref().and_then(|k| k.lock().ok().flatten());
    match check(holders, current_lock, now, high_water) {
        Ok(()) => true,
        Err(refusal) => {
            logging::log_warning(format!(
                "redis-lock: RESTORE of key '{}' (db {db}) refused: {refusal}",
                String::from_utf8_lossy(name)
            ));
            false
        }
    }
}

/// Raise the token mint to the loaded tokens, as far as `origin` may move it.
pub fn observe(origin: Origin, rdb: *mut raw::RedisModuleIO, holders: &[Hold]) {
    let limit = match origin {
        Origin::Replica => restore_limit(key::now(), state::token_high_water()),
        Origin::Loading | Origin::Client => u64::MAX,
    };
    for hold in holders {
        if hold.token <= limit && state::observe_token(hold.token) {
            continue;
        }
        let (db, name, _) = key_of(rdb);
        logging::log_warning(format!(
            "redis-lock: key '{}' (db {db}) was loaded with token {} which this module could \
             not have minted now (above {}); the token mint does not follow it",
            String::from_utf8_lossy(name),
            hold.token,
            limit.min(crate::lock::EXACT_NUMBER_LIMIT - 1)
        ));
    }
}

/// Sessions that ended on this server, kept for as long as a `DUMP` taken while they were
/// alive could still carry a hold that has not reached its session's deadline: a restore of
/// such a hold must not bring back what the session's end released.
///
/// Why a record and not the dump alone: the dump carries the session's deadline when it was
/// taken, which says nothing of a `CLOSE` or a lost connection after it. Why only sessions that
/// had holds when they ended: those holds are what the end released; a hold released before
/// its session ended comes back from an older dump as a plain lock's would (see RELIABILITY.md).
/// Why bounded: one entry per such session, until `until` (the session's deadline, or
/// `now + ttl`, whichever is later); at most [`MAX_ENDED`] of them, the soonest to lapse
/// dropped first.
#[derive(Default)]
struct Ended {
    by_serial: std::collections::HashMap<Serial, EndedSession>,
    by_until: std::collections::BTreeSet<(Millis, Serial)>,
}

#[derive(Clone, Copy)]
struct EndedSession {
    /// When it ended (the primary's moment on a replica).
    at: Millis,
    /// `CLOSE` (no lock-delay follows) rather than an expiry or a lost connection.
    clean: bool,
    /// Until when the record is kept.
    until: Millis,
}

/// The most ended sessions remembered: about 100 bytes of `used_memory` each (20,000 took
/// 1.9 MB more than as many sessions with no holds, on 7.0.15; RELIABILITY.md says how). More
/// sessions with holds ending within their ttl than this only shorten how long a record lasts:
/// a restore then falls back to the dumped session deadline.
pub const MAX_ENDED: usize = 20_000;

thread_local! {
    static ENDED: std::cell::RefCell<Ended> = Default::default();
}

/// A session of this server with holds ended at `at` (`clean`: by `CLOSE`). Called where
/// sessions end on a primary and where a replica applies the primary's `ENDED`.
pub fn session_ended(serial: Serial, at: Millis, clean: bool, deadline: Millis, ttl: Millis) {
    let until = deadline.max(at.saturating_add(ttl));
    ENDED.with(|e| {
        let mut e = e.borrow_mut();
        while let Some(&(lapse, old)) = e.by_until.first() {
            if lapse >= at && e.by_serial.len() < MAX_ENDED {
                break;
            }
            e.by_until.remove(&(lapse, old));
            e.by_serial.remove(&old);
        }
        if let Some(prev) = e
            .by_serial
            .insert(serial, EndedSession { at, clean, until })
        {
            e.by_until.remove(&(prev.until, serial));
        }
        e.by_until.insert((until, serial));
    });
}

/// A session hold that a `RESTORE` (or `MIGRATE`) brought in never joins a session; it ends
/// at the earliest of its own deadline, its session's deadline when it was dumped, the
/// session's deadline here if this server has that session, and the moment the session ended
/// here if it did (with no lock-delay after a `CLOSE`, as the `CLOSE` released it).
pub fn orphan(hold: &mut Hold, dumped_session_deadline: Millis, live: Option<Millis>) {
    let ended = ENDED.with(|e| e.borrow().by_serial.get(&hold.session).copied());
    let mut deadline = hold
        .deadline
        .min(dumped_session_deadline)
        .min(live.unwrap_or(Millis::MAX));
    if let Some(ended) = ended.filter(|_| live.is_none()) {
        deadline = deadline.min(ended.at);
        if ended.clean {
            hold.delay = 0;
        }
    }
    hold.deadline = deadline;
    hold.session = 0;
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Millis = 1_800_000_000_000;

    fn session_hold(serial: Serial, delay: Millis) -> Hold {
        Hold {
            owner: b"me".to_vec().into(),
            token: 7,
            deadline: crate::lock::NO_DEADLINE,
            granted_at: 0,
            session: serial,
            delay,
        }
    }

    #[test]
    fn a_hold_of_a_session_that_ended_here_ends_with_it() {
        session_ended(11, T0, true, T0 + 60_000, 60_000);
        session_ended(12, T0, false, T0 + 60_000, 60_000);
        let dumped = T0 + 30_000;
        let mut closed = session_hold(11, 500);
        orphan(&mut closed, dumped, None);
        assert_eq!((closed.deadline, closed.delay, closed.session), (T0, 0, 0));
        let mut lost = session_hold(12, 500);
        orphan(&mut lost, dumped, None);
        assert_eq!((lost.deadline, lost.delay), (T0, 500));
        // Unknown here (another node's): the dumped deadline; alive here: the earlier of both.
        let mut foreign = session_hold(13, 500);
        orphan(&mut foreign, dumped, None);
        assert_eq!((foreign.deadline, foreign.delay), (dumped, 500));
        let mut alive = session_hold(14, 0);
        orphan(&mut alive, dumped, Some(T0 + 10_000));
        assert_eq!(alive.deadline, T0 + 10_000);
    }

    #[test]
    fn the_record_of_ended_sessions_is_bounded() {
        for serial in 1..=(MAX_ENDED as u64 + 10) {
            session_ended(1_000 + serial, T0, true, T0 + serial as Millis, 0);
        }
        ENDED.with(|e| {
            let e = e.borrow();
            assert_eq!(e.by_serial.len(), MAX_ENDED);
            assert_eq!(e.by_until.len(), MAX_ENDED);
            // The soonest to lapse went first.
            assert!(!e.by_serial.contains_key(&1_001));
            assert!(e.by_serial.contains_key(&(1_000 + MAX_ENDED as u64 + 10)));
        });
        // Records whose time is over go at the next end.
        session_ended(5, T0 + 86_400_000, true, T0 + 86_400_000, 0);
        ENDED.with(|e| assert_eq!(e.borrow().by_serial.len(), 1));
    }
}
