//! Sessions on the Redis side: the table of this server's sessions, the one timer that expires
//! them, the disconnect event that ends bound ones, and the ids they are known by.
//!
//! Ending a session (releasing its holds, serving the queues they free) is in
//! `blocking::sessions`, next to the queues it serves. Every end that is not a client's own
//! `CLOSE` (an expiry, a disconnect) goes through the deferred work, so that nothing is written
//! inside the server's client teardown or while writes are paused (see `pause`).
//!
//! Why one timer for all sessions and not one per session: a keepalive then only moves the
//! session in the deadline index ([`Sessions::renew`]), and the timer is re-armed only when the
//! earliest deadline changes, so the cost of a keepalive does not depend on how many sessions
//! or holds there are.

use std::cell::{Cell, RefCell};
use std::os::raw::{c_int, c_void};

use rand::RngCore;
use redis_module::{raw, Context};

use crate::error::{self, Result};
use crate::lock::session::{self, Serial, Session, Sessions};
use crate::lock::Millis;
use crate::redis::{blocking, guard, key, slots};
use crate::state;

thread_local! {
    static SESSIONS: RefCell<Sessions> = RefCell::new(Sessions::default());
    /// The expiry timer: (id, the deadline it is armed for).
    static TIMER: Cell<Option<(raw::RedisModuleTimerID, Millis)>> = const { Cell::new(None) };
    /// Sessions taken out of the table by a disconnect whose end (releases, lock-delay) waits
    /// in the deferred work, as when writes are paused: serial -> the moment it was lost.
    static LOST: RefCell<std::collections::HashMap<Serial, Millis>> =
        RefCell::new(Default::default());
    /// Sessions detached by a disconnect whose `RENEW` and `detached` messages wait in the
    /// deferred work.
    static DETACH_UNTOLD: RefCell<std::collections::HashSet<Serial>> =
        RefCell::new(Default::default());
    /// Keys whose lock-delay a session's end started: (db, key) -> when it ends.
    static DELAYED: RefCell<std::collections::HashMap<(i32, Vec<u8>), Millis>> =
        RefCell::new(Default::default());
}

/// The longest a module timer is armed for at once: on Redis 7.0 a timer more than about 35
/// minutes away can make the event loop spin (fixed in 7.2.2). One that fires early re-arms.
const MAX_TIMER_MS: Millis = 60_000;

pub fn with<R>(f: impl FnOnce(&mut Sessions) -> R) -> R {
    SESSIONS.with(|s| f(&mut s.borrow_mut()))
}

/// True while `serial` is a session of this server (0, no session, is always "alive").
pub fn alive(serial: Serial) -> bool {
    serial == 0 || with(|s| s.contains(serial))
}

/// Number of open sessions.
pub fn count() -> usize {
    with(|s| s.len())
}

/// When `serial`, no longer in the table, was lost and its end not yet applied. A save in
/// between (`DEBUG RELOAD`, `BGSAVE`, a replica's full sync while writes are paused) writes
/// this as the session's deadline, so a load that finds no such session caps its holds there
/// and their lock-delay still runs from the loss, instead of from the epoch.
pub fn lost_at(serial: Serial) -> Option<Millis> {
    LOST.with(|l| l.borrow().get(&serial).copied())
}

/// `serial`, already out of the table, was lost at `at` and its end waits in the deferred
/// work (a disconnect, or `LOCK.SESSION KILL` in a cluster).
pub fn mark_lost(serial: Serial, at: Millis) {
    LOST.with(|l| l.borrow_mut().insert(serial, at));
}

/// The end of a lost session was applied (or will never be, on a replica).
pub fn lost_applied(serial: Serial) {
    LOST.with(|l| l.borrow_mut().remove(&serial));
}

/// A session's end put `key` in lock-delay until `until`.
pub fn delay_started(db: i32, key: &[u8], until: Millis) {
    DELAYED.with(|d| d.borrow_mut().insert((db, key.to_vec()), until));
}

/// The key went away (its delay with it).
pub fn key_gone(db: i32, key: &[u8]) {
    DELAYED.with(|d| {
        if let Ok(mut d) = d.try_borrow_mut() {
            if !d.is_empty() {
                d.remove(&(db, key.to_vec()));
            }
        }
    });
}

/// Keys in a lock-delay that a session's end started (for `INFO lock`).
pub fn keys_in_delay() -> usize {
    let now = key::now();
    DELAYED.with(|d| {
        let mut d = d.borrow_mut();
        d.retain(|_, until| *until > now);
        d.len()
    })
}

/// Remember that `serial` holds `key` for `owner` (after a grant, a load or a replicated hold).
/// False when the session is unknown here.
pub fn track(serial: Serial, db: i32, key: &[u8], owner: &[u8]) -> bool {
    serial != 0 && with(|s| s.add_hold(serial, (db, key.to_vec(), owner.to_vec())))
}

/// The hold left (a release): the session stops counting it.
pub fn untrack(serial: Serial, db: i32, key: &[u8], owner: &[u8]) {
    if serial != 0 {
        with(|s| s.remove_hold(serial, &(db, key.to_vec(), owner.to_vec())));
    }
}

/// Replace the value of every `SESSION` option from argument `from` on with `(redacted)` in
/// what `MONITOR` and `SLOWLOG` (Valkey's `COMMANDLOG`) show of this command: the id is a
/// secret, and `LOCK.ACQUIRE`/`LOCK.MACQUIRE` cannot be flagged out of them as `LOCK.SESSION`
/// is. Done before parsing, so a refused command is redacted too; an argument after a key or
/// owner that happens to be spelled `SESSION` is redacted as well, which hides nothing needed.
pub fn redact_ids(ctx: &Context, args: &[&[u8]], from: usize) {
    let mut i = from.max(1);
    while i + 1 < args.len() {
        if args[i].len() == 7 && args[i].eq_ignore_ascii_case(b"SESSION") {
            // SAFETY: ctx is the live context of the executing command and i + 1 < argc; the
            // server keeps the original argument vector and changes only what it shows.
            unsafe {
                if let Some(redact) = raw::RedisModule_RedactClientCommandArgument {
                    redact(ctx.ctx, (i + 1) as c_int);
                }
            }
            i += 1;
        }
        i += 1;
    }
}

/// What a command that names `SESSION id` needs: the session's serial and lock-delay, checked
/// against the calling ACL user and the session's hold cap. `keys` (in database `db`, for
/// `owner`) are the holds the command may add: one the session already has (an idempotent
/// retry) does not count, so the cap is exact for `LOCK.MACQUIRE` and a retry at the cap gets
/// its token back. Errors change nothing.
pub fn resolve(
    ctx: &Context,
    id: &[u8],
    db: i32,
    keys: &[&[u8]],
    owner: &[u8],
) -> Result<(Serial, Millis)> {
    on_primary(ctx)?;
    let user = current_user(ctx);
    let (serial, delay, adding) = with(|s| {
        let session = s.by_id(id).ok_or_else(error::no_such_session)?;
        if session.user != user {
            return Err(error::session_of_other_user());
        }
        let adding = keys
            .iter()
            .filter(|k| !session.holds.contains(&(db, k.to_vec(), owner.to_vec())))
            .count();
        Ok((session.serial, session.lock_delay, adding))
    })?;
    let max = state::max_session_holds();
    let over = |s: &mut Sessions| s.get(serial).map_or(0, |x| x.holds.len()) + adding > max;
    if adding > 0 && with(over) {
        // Records of holds that ended without telling the session (a shared hold that
        // expired inside a key others still hold, and that nobody has touched since) are not
        // holds: drop them before refusing.
        forget_dead_holds(ctx, serial);
        if with(over) {
            return Err(error::too_many_session_holds(max));
        }
    }
    Ok((serial, delay))
}

/// For a waiter whose turn came: true when session `serial` (0: none) may add its holds on
/// `keys` for `owner` without passing `lock.max-session-holds`. The command checked when it
/// queued, but the session may have taken other holds while it waited.
pub fn room_for<K: AsRef<[u8]>>(serial: Serial, db: i32, keys: &[K], owner: &[u8]) -> bool {
    serial == 0
        || with(|s| {
            let Some(session) = s.get(serial) else {
                return true; // an ended session is refused by its own check
            };
            let adding = keys
                .iter()
                .filter(|k| {
                    !session
                        .holds
                        .contains(&(db, k.as_ref().to_vec(), owner.to_vec()))
                })
                .count();
            adding == 0 || session.holds.len() + adding <= state::max_session_holds()
        })
}

/// Drop the records of `serial` whose hold is no longer in its key. In a cluster a command
/// may look only at keys of its own slot (see `blocking::close_session`): there the records
/// are checked from a zero-delay timer instead, so this command is still refused and a retry
/// after it finds the room.
fn forget_dead_holds(ctx: &Context, serial: Serial) {
    if key::context_flags(ctx.ctx) & raw::REDISMODULE_CTX_FLAGS_CLUSTER != 0 {
        // SAFETY: the callback matches RedisModuleTimerProc; the data is the serial itself
        // (a number, never dereferenced).
        unsafe {
            raw::RedisModule_CreateTimer.unwrap()(
                ctx.ctx,
                0,
                Some(sweep_timer),
                serial as usize as *mut c_void,
            )
        };
        return;
    }
    sweep(ctx, serial);
}

extern "C" fn sweep_timer(ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    guard::callback("session sweep timer", (), || {
        sweep(&Context::new(ctx), data as usize as Serial);
    })
}

fn sweep(ctx: &Context, serial: Serial) {
    let records: Vec<session::HoldRef> = with(|s| {
        s.get(serial)
            .map(|x| x.holds.iter().cloned().collect())
            .unwrap_or_default()
    });
    for hold in records {
        if !blocking::session_hold_exists(ctx, serial, &hold) {
            with(|s| s.remove_hold(serial, &hold));
        }
    }
}

/// Sessions and their holds are taken on the primary only. A replica never ends a session by
/// its own clock or connections (it follows the primary's `ENDED`), so one opened or extended
/// on a writable replica (`replica-read-only no`) would never end, and a hold in it would block
/// everyone for good. The primary's own stream (and AOF loading) is not a client: it passes.
pub fn on_primary(ctx: &Context) -> Result<()> {
    if key::context_flags(ctx.ctx) & raw::REDISMODULE_CTX_FLAGS_SLAVE != 0
        && !key::applying_effects(ctx.ctx)
    {
        return Err(error::session_on_replica());
    }
    Ok(())
}

/// The session `id` for a `LOCK.SESSION` subcommand: its serial, or nil-worthy `None`.
pub fn find(ctx: &Context, id: &[u8]) -> Result<Option<Serial>> {
    let user = current_user(ctx);
    with(|s| match s.by_id(id) {
        None => Ok(None),
        Some(session) if session.user != user => Err(error::session_of_other_user()),
        Some(session) => Ok(Some(session.serial)),
    })
}

fn current_user(ctx: &Context) -> Vec<u8> {
    ctx.get_current_user().as_slice().to_vec()
}

/// The calling connection's client id.
pub fn client_id(ctx: &Context) -> u64 {
    // SAFETY: ctx is the live context of the command being executed.
    unsafe { raw::RedisModule_GetClientId.unwrap()(ctx.ctx) }
}

/// True while a connection with this client id is open.
pub fn client_exists(id: u64) -> bool {
    // SAFETY: a null info pointer only asks whether the client exists.
    unsafe {
        raw::RedisModule_GetClientInfoById.unwrap()(std::ptr::null_mut(), id)
            == raw::REDISMODULE_OK as c_int
    }
}

/// `LOCK.SESSION OPEN`: a new session, bound to the caller when `bound`. Returns its id.
pub fn open(
    ctx: &Context,
    ttl: Millis,
    bound: bool,
    grace: Millis,
    lock_delay: Millis,
) -> Result<Vec<u8>> {
    let max = state::max_sessions();
    if count() >= max {
        return Err(error::too_many_sessions(max));
    }
    // The tag first: the first one of a process computes the tag table, which takes a moment
    // that must not come out of the session's ttl.
    let tag = new_session_tag(ctx);
    let now = key::now();
    let deadline = crate::lock::deadline_after(now, ttl).ok_or_else(error::ttl_too_large)?;
    let mut rng = rand::rngs::OsRng;
    let (id, serial) = loop {
        let secret = (u128::from(rng.next_u64()) << 64) | u128::from(rng.next_u64());
        let id = session::make_id(&tag, secret);
        let serial = rng.next_u64() >> 11; // below 2^53: exact in every client's numbers
        if !with(|s| s.taken(serial, &id)) {
            break (id, serial);
        }
    };
    let session = Session {
        id: id.clone(),
        serial,
        ttl,
        deadline,
        lock_delay,
        bound,
        client: bound.then(|| client_id(ctx)),
        grace,
        detached: None,
        user: current_user(ctx),
        holds: Default::default(),
    };
    replicate_restore(ctx.ctx, &session);
    with(|s| s.insert(session));
    crate::stats::SESSIONS_OPENED.incr();
    arm_timer(ctx.ctx);
    Ok(id)
}

/// `LOCK.SESSION KEEPALIVE`: the remaining ms, or `None` for no such session.
pub fn keepalive(ctx: &Context, serial: Serial, ttl: Option<Millis>) -> Result<Millis> {
    let now = key::now();
    let ttl = ttl.unwrap_or_else(|| with(|s| s.get(serial).map_or(0, |x| x.ttl)));
    let deadline = crate::lock::deadline_after(now, ttl).ok_or_else(error::ttl_too_large)?;
    // A detached session's deadline stays at or before its grace's end (see `Sessions::renew`):
    // what is replicated, and answered, is the deadline it got.
    let (deadline, detached) = with(|s| {
        s.renew(serial, ttl, deadline);
        s.get(serial)
            .map_or((deadline, false), |x| (x.deadline, x.detached.is_some()))
    });
    replicate_renew(ctx.ctx, serial, ttl, deadline);
    arm_timer(ctx.ctx);
    Ok(if detached {
        (deadline - now).max(0)
    } else {
        ttl
    })
}

/// `LOCK.SESSION ATTACH` by the connection `client`: bind the session there; a detached one
/// is rescued (renewed for its ttl, replicated as a `RENEW`, holders told `attached`).
pub fn attach(ctx: &Context, serial: Serial, client: u64) {
    let now = key::now();
    // A detach whose news is still in the deferred work is told first, so that the feed
    // never says `attached` before `detached`.
    let untold = DETACH_UNTOLD.with(|d| d.borrow_mut().remove(&serial));
    let Some(deadline) = with(|s| s.attach(serial, client, now)) else {
        return;
    };
    crate::stats::SESSIONS_REATTACHED.incr();
    let ttl = with(|s| s.get(serial).map_or(0, |x| x.ttl));
    replicate_renew(ctx.ctx, serial, ttl, deadline);
    arm_timer(ctx.ctx);
    blocking::session_attached(ctx, serial, untold);
}

/// The deferred work after a detach (writes allowed, primary): replicas and the AOF learn the
/// shortened deadline, watchers of the session's keys hear `detached`. Nothing when an
/// `ATTACH` came first (it told both) or the session is gone.
pub fn detach_told(ctx: *mut raw::RedisModuleCtx, serial: Serial) {
    if !DETACH_UNTOLD.with(|d| d.borrow_mut().remove(&serial)) {
        return;
    }
    let Some((ttl, deadline)) = with(|s| {
        s.get(serial)
            .filter(|x| x.detached.is_some())
            .map(|x| (x.ttl, x.deadline))
    }) else {
        return;
    };
    replicate_renew(ctx, serial, ttl, deadline);
    blocking::announce_session(ctx, serial, crate::redis::feed::Kind::Detached);
}

/// Arm (or move) the expiry timer for the earliest session deadline. On a replica it is armed
/// too, but ends nothing: a replica never ends a session by its own clock.
pub fn arm_timer(ctx: *mut raw::RedisModuleCtx) {
    let Some(next) = with(|s| s.next_deadline()) else {
        return;
    };
    if let Some((id, at)) = TIMER.get() {
        if at <= next {
            // Fires no later than needed; an early firing re-arms.
            return;
        }
        let mut data: *mut c_void = std::ptr::null_mut();
        // SAFETY: a timer we created with no data; stopping one that fired already fails.
        unsafe { raw::RedisModule_StopTimer.unwrap()(ctx, id, &mut data) };
    }
    let delay = (next - key::now()).clamp(0, MAX_TIMER_MS);
    // SAFETY: the callback matches RedisModuleTimerProc and takes no data.
    let id = unsafe {
        raw::RedisModule_CreateTimer.unwrap()(ctx, delay, Some(expiry_timer), std::ptr::null_mut())
    };
    TIMER.set(Some((id, next)));
}

extern "C" fn expiry_timer(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    guard::callback("session expiry timer", (), || {
        TIMER.set(None);
        blocking::expire_sessions(ctx);
    })
}

/// Called by the deferred work (writes allowed, primary): the sessions whose deadline passed.
/// `after_pause`: the expiry came due while writes were paused, when no keepalive could be
/// applied, so every session due now gets its ttl again from the pause's end instead.
pub fn take_due(ctx: *mut raw::RedisModuleCtx, now: Millis, after_pause: bool) -> Vec<Session> {
    let due = with(|s| s.due(now));
    let mut ended = vec![];
    for serial in due {
        if after_pause {
            if let Some(deadline) = with(|s| s.detach_again(serial, now)) {
                let ttl = with(|s| s.get(serial).map_or(0, |x| x.ttl));
                replicate_renew(ctx, serial, ttl, deadline);
                continue;
            }
            let ttl = with(|s| s.get(serial).map_or(0, |x| x.ttl));
            let deadline = crate::lock::deadline_after(now, ttl).unwrap_or(now);
            with(|s| s.renew(serial, ttl, deadline));
            replicate_renew(ctx, serial, ttl, deadline);
        } else if let Some(session) = with(|s| s.remove(serial)) {
            ended.push(session);
        }
    }
    arm_timer(ctx);
    ended
}

/// `REDISMODULE_EVENT_CLIENT_CHANGE`: a connection closed. The server calls this from inside
/// its client teardown (for `CLIENT KILL`, inside another client's command), so the sessions
/// bound to it are only taken out of the table here (no command can use them from now on) and
/// their holds are released from the deferred work.
extern "C" fn on_client_change(
    ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    guard::callback("client change event", (), || {
        if subevent == raw::REDISMODULE_SUBEVENT_CLIENT_CHANGE_DISCONNECTED
            && !data.is_null()
            && crate::redis::feed::watching()
        {
            // SAFETY: as below.
            crate::redis::feed::client_gone(unsafe {
                (*data.cast::<raw::RedisModuleClientInfo>()).id
            });
        }
        if subevent != raw::REDISMODULE_SUBEVENT_CLIENT_CHANGE_DISCONNECTED
            || data.is_null()
            || !with(|s| s.any_bound())
            || key::context_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_SLAVE != 0
        {
            return;
        }
        // SAFETY: for this event the data is a RedisModuleClientInfo (version 1 or later),
        // valid for the duration of the callback.
        let client = unsafe { (*data.cast::<raw::RedisModuleClientInfo>()).id };
        let now = key::now();
        // A session with a grace is detached: it stays in the table, unbound, with its
        // deadline brought in to the grace's end; the rest end now.
        let (gone, detached): (Vec<Session>, Vec<Serial>) = with(|s| {
            let mut gone = vec![];
            let mut detached = vec![];
            for serial in s.unbind_client(client) {
                if s.detach(serial, now).is_some() {
                    detached.push(serial);
                } else if let Some(session) = s.remove(serial) {
                    gone.push(session);
                }
            }
            (gone, detached)
        });
        if !detached.is_empty() {
            arm_timer(ctx);
        }
        for serial in detached {
            crate::stats::SESSIONS_DETACHED.incr();
            DETACH_UNTOLD.with(|d| d.borrow_mut().insert(serial));
            blocking::session_detached(ctx, serial);
        }
        for session in gone {
            mark_lost(session.serial, now);
            blocking::session_disconnected(ctx, session);
        }
    })
}

/// Subscribe to disconnects (for `BOUND` sessions).
pub fn subscribe(ctx: &Context) -> bool {
    let change = raw::RedisModuleEvent {
        id: raw::REDISMODULE_EVENT_CLIENT_CHANGE,
        dataver: 1,
    };
    // SAFETY: registration during module load with a callback of the matching signature.
    unsafe {
        raw::RedisModule_SubscribeToServerEvent.unwrap()(ctx.ctx, change, Some(on_client_change))
            == raw::REDISMODULE_OK as c_int
    }
}

/// A hash tag for a new session's id: one of a slot this node serves, so that a cluster client
/// routes `LOCK.SESSION ... id` here by the id alone. Outside a cluster any slot's tag will do.
fn new_session_tag(ctx: &Context) -> String {
    let mut rng = rand::rngs::OsRng;
    let random_slot = |rng: &mut rand::rngs::OsRng| (rng.next_u32() % 16384) as u16;
    if key::context_flags(ctx.ctx) & raw::REDISMODULE_CTX_FLAGS_CLUSTER == 0 {
        return slots::slot_tag(random_slot(&mut rng));
    }
    let nodes = crate::redis::cluster::nodes(ctx.ctx).unwrap_or_default();
    for _ in 0..64 {
        let slot = random_slot(&mut rng);
        if crate::redis::cluster::serves_slot(&nodes, slot as i64) {
            return slots::slot_tag(slot);
        }
    }
    (0..16384u16)
        .find(|slot| crate::redis::cluster::serves_slot(&nodes, *slot as i64))
        .map_or_else(|| slots::slot_tag(random_slot(&mut rng)), slots::slot_tag)
}

/// `LOCK.SESSION RESTORE id serial ttl deadline lock-delay bound user [grace]`: the session as it is,
/// for replicas and the AOF (the open, a promotion's state, an AOF rewrite).
fn replicate_restore(ctx: *mut raw::RedisModuleCtx, s: &Session) {
    let args = restore_args(s);
    replicate(ctx, &args);
}

/// The grace goes last, and only when there is one: a replica with a module from before
/// `GRACE` reads every session that does not use it.
pub fn restore_args(s: &Session) -> Vec<Vec<u8>> {
    let mut args = vec![
        b"RESTORE".to_vec(),
        s.id.clone(),
        s.serial.to_string().into_bytes(),
        s.ttl.to_string().into_bytes(),
        s.deadline.to_string().into_bytes(),
        s.lock_delay.to_string().into_bytes(),
        (s.bound as u8).to_string().into_bytes(),
        s.user.clone(),
    ];
    if s.grace > 0 {
        args.push(s.grace.to_string().into_bytes());
    }
    args
}

pub fn replicate_renew(
    ctx: *mut raw::RedisModuleCtx,
    serial: Serial,
    ttl: Millis,
    deadline: Millis,
) {
    replicate(
        ctx,
        &[
            b"RENEW".to_vec(),
            serial.to_string().into_bytes(),
            ttl.to_string().into_bytes(),
            deadline.to_string().into_bytes(),
        ],
    );
}

/// `LOCK.SESSION ENDED serial at CLOSED|LOST`: the end of a session and of all its holds, as
/// one command, so that a replica never holds half of it.
pub fn replicate_ended(ctx: *mut raw::RedisModuleCtx, serial: Serial, at: Millis, clean: bool) {
    let how: &[u8] = if clean { b"CLOSED" } else { b"LOST" };
    replicate(
        ctx,
        &[
            b"ENDED".to_vec(),
            serial.to_string().into_bytes(),
            at.to_string().into_bytes(),
            how.to_vec(),
        ],
    );
}

/// Send `LOCK.SESSION <args>` to replicas and the AOF.
fn replicate(ctx: *mut raw::RedisModuleCtx, args: &[Vec<u8>]) {
    key::replicate_strings(ctx, c"LOCK.SESSION", args);
}
