//! The end of a session: every hold it had counts as released, and every queue those holds
//! block is served in its FIFO order, exactly as `LOCK.RELEASE` would serve it.
//!
//! Order of effects, so that replicas and the AOF see one step: `LOCK.SESSION ENDED` goes first
//! (on a replica it ends every hold of the session at the primary's moment), then the grants the
//! freed keys make (`LOCK.LOAD`). A clean `CLOSE` removes the holds; an expiry or a disconnect
//! moves each hold's deadline to the moment of the end, so that its lock-delay (if any) keeps
//! the key occupied, and the key expires when the delay does.
//!
//! Why not in batches: the releases make no replication traffic of their own (the one `ENDED`
//! covers them), so ending 10,000 holds is 10,000 in-place updates in one step; `make bench`
//! measures how long the server stops answering for that.

use super::*;
use crate::lock::Session;

/// A bound session's connection closed (the table no longer has it): release from the
/// deferred work, never inside the server's client teardown.
pub fn session_disconnected(ctx: *mut raw::RedisModuleCtx, session: Session) {
    stats::SESSIONS_DISCONNECTED.incr();
    defer(ctx, Work::EndSession(Box::new(session)));
}

/// A bound session's connection closed and the session is detached (still in the table):
/// its shortened deadline is replicated and its holders told from the deferred work.
pub fn session_detached(ctx: *mut raw::RedisModuleCtx, serial: lock::Serial) {
    defer(ctx, Work::SessionDetached(serial));
}

/// `ATTACH` rescued detached session `serial`: its holders hear `attached` (after the
/// `detached` the deferred work had not told yet, when `untold`). In a cluster a command cannot
/// look at keys of other slots (see [`close_session`]), so there the messages come from the
/// deferred work, a moment after the reply.
pub fn session_attached(ctx: &Context, serial: lock::Serial, untold: bool) {
    if key::context_flags(ctx.ctx) & raw::REDISMODULE_CTX_FLAGS_CLUSTER != 0 {
        defer(ctx.ctx, Work::SessionAttached(serial, untold));
        return;
    }
    announce_attached(ctx.ctx, serial, untold);
}

pub(super) fn announce_attached(ctx: *mut raw::RedisModuleCtx, serial: lock::Serial, untold: bool) {
    if untold {
        announce_session(ctx, serial, crate::redis::feed::Kind::Detached);
    }
    announce_session(ctx, serial, crate::redis::feed::Kind::Attached);
}

/// One feed message (`detached` or `attached`) for each live hold of session `serial` whose
/// key is watched. `TTL`: for `detached`, the ms until the hold is lost unless a connection
/// attaches the session; for `attached`, the hold's own remaining ms (-1: none of its own).
/// Leaves the context's database as it found it.
pub fn announce_session(
    ctx: *mut raw::RedisModuleCtx,
    serial: lock::Serial,
    kind: crate::redis::feed::Kind,
) {
    if !crate::redis::feed::watching() {
        return;
    }
    let Some((holds, session_deadline)) = session::with(|s| {
        s.get(serial)
            .map(|x| (x.holds.iter().cloned().collect::<Vec<_>>(), x.deadline))
    }) else {
        return;
    };
    let db = key::selected_db(ctx);
    let now = key::now();
    for (hold_db, key_name, owner) in holds {
        if !key::select_db(ctx, hold_db) {
            continue;
        }
        let name = RedisString::create_from_slice(ctx, &key_name);
        let lock_key = LockKey::open_raw(ctx, name.inner, raw::KeyMode::READ);
        let hold = lock_key.lock().ok().flatten().and_then(|l| {
            l.live(now)
                .find(|h| h.owner == owner.as_slice() && h.session == serial)
                .map(|h| (h.token, h.deadline))
        });
        if let Some((token, deadline)) = hold {
            let until = match kind {
                crate::redis::feed::Kind::Detached => deadline.min(session_deadline),
                _ => deadline,
            };
            crate::redis::feed::hold_event(hold_db, &key_name, kind, &owner, token, Some(until));
        }
    }
    key::select_db(ctx, db);
}

/// The session expiry timer fired.
pub fn expire_sessions(ctx: *mut raw::RedisModuleCtx) {
    run(ctx, vec![Work::ExpireSessions]);
}

fn is_replica(ctx: *mut raw::RedisModuleCtx) -> bool {
    key::context_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_SLAVE != 0
}

pub(super) fn end_expired(ctx: *mut raw::RedisModuleCtx, after_pause: bool) {
    if is_replica(ctx) {
        // A replica never ends a session by its own clock: the primary's `ENDED` does. The
        // timer is armed again on promotion.
        return;
    }
    let now = key::now();
    for ended in session::take_due(ctx, now, after_pause) {
        // A detached session ends here too: nobody attached it within its grace (or before
        // its deadline, when that came first).
        match ended.detached {
            Some(_) => stats::SESSIONS_GRACE_EXPIRED.incr(),
            None => stats::SESSIONS_EXPIRED.incr(),
        }
        end(ctx, ended, false, now);
    }
}

pub(super) fn end_lost(ctx: *mut raw::RedisModuleCtx, ended: Session) {
    session::lost_applied(ended.serial);
    if !is_replica(ctx) {
        end(ctx, ended, false, key::now());
    }
}

/// `LOCK.SESSION CLOSE`: the session `serial` ends cleanly now. `Some(n)`: it is done and
/// released `n` holds; `None`: there is no such session.
///
/// In a cluster the releases cannot be done inside the command: servers that keep one key
/// table per slot (Redis 7.4+, Valkey 8+) look every key of a command up in the slot of the
/// command's own key (here the session id's tag), so the session's keys in other slots would
/// not be found. There the client is blocked and answered from a zero-delay timer, after the
/// releases; where it cannot block (`MULTI`, scripts) the releases follow in that timer and
/// the reply counts the holds the session had on record.
pub fn close_session(ctx: &Context, serial: lock::Serial) -> Option<CloseReply> {
    let ended = session::with(|s| s.remove(serial))?;
    stats::SESSIONS_CLOSED.incr();
    if key::context_flags(ctx.ctx) & raw::REDISMODULE_CTX_FLAGS_CLUSTER != 0 {
        if may_block(ctx) {
            if let Ok((bc, _, _)) = block_client(ctx, 0) {
                defer(
                    ctx.ctx,
                    Work::CloseSession(Box::new(ended), Some(bc as usize)),
                );
                return Some(CloseReply::Later);
            }
        }
        let recorded = ended.holds.len();
        defer(ctx.ctx, Work::CloseSession(Box::new(ended), None));
        return Some(CloseReply::Now(recorded));
    }
    let db = key::selected_db(ctx.ctx);
    let released = end(ctx.ctx, ended, true, key::now());
    key::select_db(ctx.ctx, db);
    Some(CloseReply::Now(released))
}

/// `LOCK.SESSION KILL`: an administrator ends session `serial` as an expiry would (lock-delay
/// applies, holders hear `lost` on the feed, replicas get `ENDED ... LOST`). `Some(n)`: `n`
/// holds released; `None`: no such session here.
///
/// In a cluster the releases are done from the deferred work, as for a disconnect (see
/// [`close_session`] for why a command cannot do them there), and the reply is the number of
/// holds on record.
pub fn kill_session(ctx: &Context, serial: lock::Serial) -> Option<usize> {
    let ended = session::with(|s| s.remove(serial))?;
    stats::SESSIONS_KILLED.incr();
    let now = key::now();
    if key::context_flags(ctx.ctx) & raw::REDISMODULE_CTX_FLAGS_CLUSTER != 0 {
        let recorded = ended.holds.len();
        session::mark_lost(serial, now);
        defer(ctx.ctx, Work::EndSession(Box::new(ended)));
        return Some(recorded);
    }
    let db = key::selected_db(ctx.ctx);
    let released = end(ctx.ctx, ended, false, now);
    key::select_db(ctx.ctx, db);
    Some(released)
}

/// What `LOCK.SESSION CLOSE` answers: now, or from the timer that does the releases.
pub enum CloseReply {
    Now(usize),
    Later,
}

pub(super) fn end_closed(ctx: *mut raw::RedisModuleCtx, ended: Session, bc: Option<usize>) {
    let released = end(ctx, ended, true, key::now());
    if let Some(bc) = bc {
        unblock(
            bc as *mut raw::RedisModuleBlockedClient,
            Outcome::Closed(released as i64),
        );
    }
}

/// End `ended` at `now` on this primary: replicate the end, release its holds, serve their
/// queues, fail its waiters. Returns how many holds were released.
fn end(ctx: *mut raw::RedisModuleCtx, ended: Session, clean: bool, now: Millis) -> usize {
    session::replicate_ended(ctx, ended.serial, now, clean);
    if !ended.holds.is_empty() {
        crate::redis::restore::session_ended(ended.serial, now, clean, ended.deadline, ended.ttl);
    }
    crate::redis::asm::release_exported_holds(ctx, &ended.holds, clean, ended.lock_delay);
    fail_waiters_of(ctx, ended.serial);
    let mut released = 0;
    for (db, key_name, owner) in ended.holds {
        if !key::select_db(ctx, db) {
            continue;
        }
        let name = RedisString::create_from_slice(ctx, &key_name);
        let mut lock_key =
            LockKey::open_raw(ctx, name.inner, raw::KeyMode::READ | raw::KeyMode::WRITE);
        let Ok(Some((token, live))) = lock_key.end_session_hold(&owner, ended.serial, now, clean)
        else {
            continue;
        };
        // A hold that had expired on its own deadline is cleaned up, but released nothing:
        // not counted, no event (LOCK.SESSION INFO did not count it either).
        if live {
            released += 1;
            lock_key.notify(c"lock.released");
            let kind = if clean {
                crate::redis::feed::Kind::Released
            } else {
                crate::redis::feed::Kind::Lost
            };
            lock_key.feed(kind, &owner, token, None);
            if let Some(until) = lock_key
                .lock()
                .ok()
                .flatten()
                .and_then(|l| l.delayed_until(now))
            {
                lock_key.feed(
                    crate::redis::feed::Kind::Delayed,
                    &owner,
                    token,
                    Some(until),
                );
                session::delay_started(db, &key_name, until);
            }
        }
        if has_waiters(db, &key_name) {
            drop(lock_key);
            settle(ctx, &(db, key_name));
        } else if let Err(e) = lock_key.delete_if_empty() {
            logging::log_warning(format!("redis-lock: session end cleanup failed: {e}"));
        }
    }
    stats::SESSION_HOLDS_RELEASED.add(released as u64);
    released
}

/// Every queued waiter of `serial` gets an error now: it is never granted.
fn fail_waiters_of(ctx: *mut raw::RedisModuleCtx, serial: lock::Serial) {
    let theirs: Vec<(usize, u64)> = QUEUES.with(|q| {
        let mut found = vec![];
        for queue in q.borrow().values() {
            for w in queue.waiters.iter().filter(|w| w.session == serial) {
                found.push((w.bc as usize, w.id));
            }
        }
        found.sort_unstable();
        found.dedup();
        found
    });
    for (bc, id) in theirs {
        let bc = bc as *mut raw::RedisModuleBlockedClient;
        if let Some(waiter) = remove_waiter(ctx, bc, Some(id)) {
            retire(&waiter);
            let msg = error::session_ended_while_waiting().to_string();
            unblock(waiter.bc, Outcome::Failed(msg));
        }
    }
}

/// `LOCK.SESSION ENDED` replayed on a replica or from the AOF: end the holds at the primary's
/// moment `at`, whatever this server's clock says. Nothing is served (a replica has no queues).
pub fn apply_ended(ctx: &Context, serial: lock::Serial, at: Millis, clean: bool) {
    let Some(ended) = session::with(|s| s.remove(serial)) else {
        return;
    };
    if !ended.holds.is_empty() {
        crate::redis::restore::session_ended(serial, at, clean, ended.deadline, ended.ttl);
    }
    let db = key::selected_db(ctx.ctx);
    for (hold_db, key_name, owner) in ended.holds {
        if !key::select_db(ctx.ctx, hold_db) {
            continue;
        }
        let name = RedisString::create_from_slice(ctx.ctx, &key_name);
        let mut lock_key = LockKey::open_raw(
            ctx.ctx,
            name.inner,
            raw::KeyMode::READ | raw::KeyMode::WRITE,
        );
        if matches!(
            lock_key.end_session_hold(&owner, serial, at, clean),
            Ok(Some(_))
        ) {
            let _ = lock_key.delete_if_empty();
        }
    }
    key::select_db(ctx.ctx, db);
}

/// True when the hold `(db, key, owner)` of session `serial` is still in its key (for
/// `LOCK.SESSION INFO` and the hold cap). Leaves the context's database as it found it.
pub fn session_hold_exists(
    ctx: &Context,
    serial: lock::Serial,
    hold: &lock::session::HoldRef,
) -> bool {
    let db = key::selected_db(ctx.ctx);
    if !key::select_db(ctx.ctx, hold.0) {
        return false;
    }
    let name = RedisString::create_from_slice(ctx.ctx, &hold.1);
    let lock_key = LockKey::open_raw(ctx.ctx, name.inner, raw::KeyMode::READ);
    let now = key::now();
    let exists = lock_key.lock().ok().flatten().is_some_and(|l| {
        l.live(now)
            .any(|h| h.owner == hold.2 && h.session == serial)
    });
    drop(lock_key);
    key::select_db(ctx.ctx, db);
    exists
}
