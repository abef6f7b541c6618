//! The `redislock` data type: how a [`Lock`] is saved to and loaded from RDB, rewritten into an
//! AOF, measured and freed, plus the aux field that carries the token high-water mark.

use std::os::raw::{c_int, c_void};

use redis_module::{logging, native_types::RedisType, raw};

use crate::lock::{Hold, Lock, Mode};
use crate::redis::restore::{self, Origin};
use crate::redis::{blocking, guard, key, session};
use crate::{state, stats};
use std::sync::atomic::Ordering::Relaxed;

fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// `TYPE key` shows this name (Redis requires exactly 9 characters).
pub const TYPE_NAME: &str = "redislock";

/// Version 3: as version 2, and per holder after its deadline: the session serial (unsigned, 0
/// for none), the lock-delay (signed ms) and the session's deadline when saved (signed ms, 0
/// for none). The last is for a node that loads the key without the session (a `MIGRATE`, a
/// `RESTORE` elsewhere): there the hold becomes a plain one that ends no later than its session
/// would have without a keepalive.
/// Version 2 (up to b440dd9): mode (unsigned: 0 exclusive, 1 shared), limit (unsigned, 0 for
/// none), the number of holders (unsigned), then per holder the owner (string buffer), token
/// (unsigned) and deadline (signed ms since the epoch).
/// Version 1 (up to f67aa42): a single exclusive holder, owner, token, deadline.
/// Bump it when the layout changes and keep a `match` arm for every version ever shipped.
/// A server with an older module cannot read a newer version: upgrade replicas first.
pub const ENCODING_VERSION: i32 = 3;

pub static LOCK_TYPE: RedisType = RedisType::new(
    TYPE_NAME,
    ENCODING_VERSION,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        mem_usage: Some(mem_usage),
        digest: None,
        free: Some(free),
        aux_load: Some(aux_load),
        aux_save: Some(aux_save),
        aux_save_triggers: raw::REDISMODULE_AUX_BEFORE_RDB as c_int,
        free_effort: None,
        unlink: None,
        // No copy: `COPY` of a lock key is refused, because a copied hold would carry a token
        // that may be lower than tokens already issued for the destination key.
        copy: None,
        defrag: None,
        mem_usage2: None,
        free_effort2: None,
        unlink2: Some(unlink),
        copy2: None,
        aux_save2: None,
    },
);

/// The registered type, for type checks and `ModuleTypeSetValue`.
pub fn raw_type() -> *mut raw::RedisModuleType {
    *LOCK_TYPE.raw_type.borrow()
}

extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    guard::callback("rdb_save", (), || {
        // SAFETY: Redis passes a value of our type: a Box<Lock> we created.
        let lock = unsafe { &*value.cast::<Lock>() };
        let (mode, limit) = match lock.mode() {
            Mode::Exclusive => (0, 0),
            Mode::Shared { limit } => (1, limit.unwrap_or(0)),
        };
        raw::save_unsigned(rdb, mode);
        raw::save_unsigned(rdb, limit);
        raw::save_unsigned(rdb, lock.len() as u64);
        for hold in lock.holders() {
            raw::save_slice(rdb, hold.owner);
            raw::save_unsigned(rdb, hold.token);
            raw::save_signed(rdb, hold.deadline);
            let session_deadline = match hold.session {
                0 => 0,
                serial => session::with(|s| s.get(serial).map(|x| x.deadline))
                    .or_else(|| session::lost_at(serial))
                    .unwrap_or(0),
            };
            raw::save_unsigned(rdb, hold.session);
            raw::save_signed(rdb, hold.delay);
            raw::save_signed(rdb, session_deadline);
        }
    })
}

extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    guard::callback("rdb_load", std::ptr::null_mut(), || {
        let loaded = match encver {
            1 => load_hold(rdb).map(|hold| (Mode::Exclusive, vec![hold])),
            2 | 3 => load_v2(rdb, encver == 3),
            _ => {
                logging::log_warning(format!(
                    "redis-lock: cannot load a lock saved with encoding version {encver} \
                     (this module reads versions 1 to {ENCODING_VERSION}); upgrade the module"
                ));
                return std::ptr::null_mut();
            }
        };
        let Some((mode, mut holders)) = loaded else {
            return std::ptr::null_mut();
        };
        let origin = restore::origin(rdb);
        // Checked before anything is linked or deferred: a refused restore changes nothing.
        if origin == Origin::Client && !restore::admit(rdb, &holders) {
            return std::ptr::null_mut();
        }
        if encver == 3 {
            link_sessions(rdb, &mut holders, origin);
        }
        // Whatever happens to this key next (even if it is already expired and Redis drops
        // it), its tokens were issued: ours must stay above them.
        restore::observe(origin, rdb, &holders);
        let lock = Lock::from_holders(mode, holders);
        stats::LOCK_VALUES.fetch_add(1, Relaxed);
        Box::into_raw(Box::new(lock)).cast()
    })
}

/// One holder: the whole of a version 1 value, and each holder of a version 2 one.
fn load_hold(rdb: *mut raw::RedisModuleIO) -> Option<Hold> {
    let owner = raw::load_string_buffer(rdb).ok()?.as_ref().to_vec();
    let token = raw::load_unsigned(rdb).ok()?;
    let deadline = raw::load_signed(rdb).ok()?;
    if owner.is_empty() || token == 0 {
        return None;
    }
    Some(Hold {
        owner: owner.into(),
        token,
        deadline,
        granted_at: 0,
        session: 0,
        delay: 0,
    })
}

/// The mode and holders of a version 2 or 3 value.
fn load_v2(rdb: *mut raw::RedisModuleIO, with_sessions: bool) -> Option<(Mode, Vec<Hold>)> {
    let mode = match (raw::load_unsigned(rdb).ok()?, raw::load_unsigned(rdb).ok()?) {
        (0, _) => Mode::Exclusive,
        (1, limit) => Mode::Shared {
            limit: (limit > 0).then_some(limit),
        },
        _ => return None,
    };
    let count = raw::load_unsigned(rdb).ok()?;
    if count == 0 || (mode == Mode::Exclusive && count != 1) {
        return None;
    }
    let holders = (0..count)
        .map(|_| {
            let mut hold = load_hold(rdb)?;
            if with_sessions {
                hold.session = raw::load_unsigned(rdb).ok()?;
                hold.delay = raw::load_signed(rdb).ok()?;
                let session_deadline = raw::load_signed(rdb).ok()?;
                // Parked here until `link_sessions`: a serial this server does not know.
                hold.granted_at = -session_deadline;
            }
            Some(hold)
        })
        .collect::<Option<Vec<_>>>()?;
    Some((mode, holders))
}

/// Attach the loaded holds to this server's sessions (the start-up load, a replica's full
/// sync, `DEBUG RELOAD`: the session table was loaded first, from the aux data). A hold that
/// a `RESTORE` or a `MIGRATE` brought in never joins a session, even one of the same serial
/// here (the dump may be old, or taken under another key: joining would give the session a
/// hold it never took), and a hold of a session this server does not have becomes a plain
/// hold too: each ends at the earliest of its own deadline and its session's.
fn link_sessions(rdb: *mut raw::RedisModuleIO, holders: &mut [Hold], origin: Origin) {
    let (db, name, _) = restore::key_of(rdb);
    let mut orphaned = false;
    for hold in holders.iter_mut() {
        let session_deadline = -hold.granted_at;
        hold.granted_at = 0;
        if hold.session == 0 {
            continue;
        }
        let joins = origin == Origin::Loading
            && !name.is_empty()
            && session::track(hold.session, db, name, &hold.owner);
        if !joins {
            let live = session::with(|s| s.get(hold.session).map(|x| x.deadline));
            restore::orphan(hold, session_deadline, live);
            orphaned = true;
        }
    }
    if orphaned && !name.is_empty() {
        blocking::orphans_loaded(db, name);
    }
}

extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    name: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    guard::callback("aof_rewrite", (), || {
        // SAFETY: as in rdb_save.
        let lock = unsafe { &*value.cast::<Lock>() };
        emit_sessions_once(aof, lock);
        key::emit_aof(aof, name, lock);
    })
}

thread_local! {
    /// Sessions already written by this AOF rewrite (it runs in a forked child, which starts
    /// with the parent's empty set).
    static EMITTED: std::cell::RefCell<std::collections::HashSet<crate::lock::Serial>> =
        Default::default();
}

/// A rewrite without the RDB preamble has no aux data: each session is written just before
/// the first key that has one of its holds, so the AOF recreates it before the hold.
fn emit_sessions_once(aof: *mut raw::RedisModuleIO, lock: &Lock) {
    for hold in lock.holders().filter(|h| h.session != 0) {
        if !EMITTED.with(|e| e.borrow_mut().insert(hold.session)) {
            continue;
        }
        if let Some(args) = session::with(|s| s.get(hold.session).map(session::restore_args)) {
            key::emit_strings(aof, c"LOCK.SESSION", &args);
        }
    }
}

extern "C" fn mem_usage(value: *const c_void) -> usize {
    guard::callback("mem_usage", 0, || {
        // SAFETY: as in rdb_save.
        let lock = unsafe { &*value.cast::<Lock>() };
        // The typical lock is the box alone (see `Lock`): 64 bytes, one allocation.
        std::mem::size_of::<Lock>() + lock.heap_bytes()
    })
}

extern "C" fn free(value: *mut c_void) {
    // No guard: nothing here can panic. This may run on the lazy-free thread, so it touches
    // only atomics and the system clock, never the main thread's module state.
    if !value.is_null() {
        // SAFETY: Redis hands back a value we created with Box::into_raw, exactly once.
        let lock = unsafe { Box::from_raw(value.cast::<Lock>()) };
        stats::LOCK_VALUES.fetch_sub(1, Relaxed);
        if lock.is_empty() {
            return; // a release's delete: nothing left to count, no clock to read
        }
        let now = wall_clock_ms();
        let expired = lock.holders().filter(|h| !h.is_live(now)).count();
        stats::EXPIRED.add(expired as u64);
    }
}

/// A lock key leaves the keyspace: `DEL`, `UNLINK`, expiry, eviction, `RENAME`/`MOVE`/`MIGRATE`
/// away, or an overwrite by `SET`/`RESTORE REPLACE`. Redis calls this only for keys of our type,
/// so watching lock keys costs other writes nothing (a keyspace-event subscription would run a
/// callback on every write of the server). Waiters are looked at again after the command.
extern "C" fn unlink(ctx: *mut raw::RedisModuleKeyOptCtx, value: *const c_void) {
    guard::callback("unlink", (), || {
        // SAFETY: ctx is the option context Redis passes to unlink2; the key name lives for
        // the duration of the call.
        let (db, name) = unsafe {
            (
                raw::RedisModule_GetDbIdFromOptCtx.unwrap()(ctx),
                raw::RedisModule_GetKeyNameFromOptCtx.unwrap()(ctx),
            )
        };
        if !name.is_null() {
            let name = redis_module::RedisString::string_as_slice(name.cast_mut());
            // SAFETY: the value is a Box<Lock> we handed to Redis; nothing else runs while it
            // is unlinked (main thread), and it is either freed next or moved to another key.
            let lock = unsafe { &mut *(value as *mut Lock) };
            crate::redis::feed::key_unlinked(db, name, lock);
            detach_sessions(lock, db, name);
            session::key_gone(db, name);
            blocking::key_unlinked(db, name);
        }
    })
}

/// The key is leaving its name (deleted, expired, renamed, moved): its session holds stop
/// being the session's, because the session's record names this key. Where the value lives on
/// (`RENAME`, `MOVE`) each such hold becomes a plain one that ends no later than its session's
/// deadline now, so a hold with no deadline of its own never lives forever. A replica does the
/// same from the same replicated deadline, so both sides agree.
fn detach_sessions(lock: &mut Lock, db: i32, name: &[u8]) {
    lock.update_session_holds(|hold| {
        let session_deadline = session::with(|s| s.get(hold.session).map(|x| x.deadline));
        session::untrack(hold.session, db, name, &hold.owner);
        hold.deadline = hold.deadline.min(session_deadline.unwrap_or(hold.deadline));
        hold.session = 0;
    });
}

/// Aux data version 3: as version 2, and per session after its ACL user its `GRACE` (signed
/// ms). Version 2: the token high-water mark (unsigned), the number of sessions (unsigned),
/// and per session its id (string buffer), serial (unsigned), ttl, deadline and lock-delay
/// (signed ms), bound (unsigned 0/1) and ACL user (string buffer). Version 1: the token
/// high-water mark alone.
const AUX_VERSION: u64 = 3;

extern "C" fn aux_save(rdb: *mut raw::RedisModuleIO, when: c_int) {
    guard::callback("aux_save", (), || {
        if when == raw::REDISMODULE_AUX_BEFORE_RDB as c_int {
            // Version 2 while no session has a grace: a replica or a downgrade with a module
            // from before `GRACE` still reads it.
            let version = match session::with(|t| t.iter().any(|s| s.grace > 0)) {
                true => AUX_VERSION,
                false => 2,
            };
            raw::save_unsigned(rdb, version);
            raw::save_unsigned(rdb, state::token_high_water());
            session::with(|table| {
                raw::save_unsigned(rdb, table.len() as u64);
                for s in table.iter() {
                    raw::save_slice(rdb, &s.id);
                    raw::save_unsigned(rdb, s.serial);
                    raw::save_signed(rdb, s.ttl);
                    raw::save_signed(rdb, s.deadline);
                    raw::save_signed(rdb, s.lock_delay);
                    raw::save_unsigned(rdb, s.bound as u64);
                    raw::save_slice(rdb, &s.user);
                    if version >= 3 {
                        raw::save_signed(rdb, s.grace);
                    }
                }
            });
        }
    })
}

/// The sessions of aux data version 2 (no grace: 0) or 3 (`with_grace`). They replace this
/// server's table; a session that was here already keeps its connection binding and whether
/// it is detached (`DEBUG RELOAD`, where clients stay connected).
fn load_sessions(rdb: *mut raw::RedisModuleIO, with_grace: bool) -> Option<()> {
    let count = raw::load_unsigned(rdb).ok()?;
    let mut loaded = Vec::with_capacity(count.min(1 << 20) as usize);
    for _ in 0..count {
        let id = raw::load_string_buffer(rdb).ok()?.as_ref().to_vec();
        let serial = raw::load_unsigned(rdb).ok()?;
        let ttl = raw::load_signed(rdb).ok()?;
        let deadline = raw::load_signed(rdb).ok()?;
        let lock_delay = raw::load_signed(rdb).ok()?;
        let bound = raw::load_unsigned(rdb).ok()? != 0;
        let user = raw::load_string_buffer(rdb).ok()?.as_ref().to_vec();
        let grace = match with_grace {
            true => raw::load_signed(rdb).ok()?,
            false => 0,
        };
        loaded.push(crate::lock::Session {
            id,
            serial,
            ttl,
            deadline,
            lock_delay,
            bound,
            client: None,
            grace,
            detached: None,
            user,
            holds: Default::default(),
        });
    }
    session::with(|table| {
        let mut fresh = crate::lock::Sessions::default();
        for mut s in loaded {
            if let Some(old) = table.get(s.serial).filter(|old| old.id == s.id) {
                s.client = old.client;
                s.detached = old.detached;
            }
            fresh.insert(s);
        }
        *table = fresh;
    });
    Some(())
}

extern "C" fn aux_load(rdb: *mut raw::RedisModuleIO, encver: c_int, when: c_int) -> c_int {
    guard::callback("aux_load", raw::REDISMODULE_ERR as c_int, || {
        // The aux layout is the same in every encoding version so far.
        if when != raw::REDISMODULE_AUX_BEFORE_RDB as c_int
            || !(1..=ENCODING_VERSION).contains(&encver)
        {
            return raw::REDISMODULE_ERR as c_int;
        }
        match (raw::load_unsigned(rdb), raw::load_unsigned(rdb)) {
            (Ok(1), Ok(high_water)) => {
                observe_high_water(high_water);
                raw::REDISMODULE_OK as c_int
            }
            (Ok(version @ (2 | 3)), Ok(high_water)) => {
                observe_high_water(high_water);
                match load_sessions(rdb, version == 3) {
                    Some(()) => raw::REDISMODULE_OK as c_int,
                    None => raw::REDISMODULE_ERR as c_int,
                }
            }
            _ => raw::REDISMODULE_ERR as c_int,
        }
    })
}

/// The saved high-water mark: followed unless the module could never have reached it (a mark
/// raised by a forged `RESTORE` before restores were checked heals at the next load).
fn observe_high_water(high_water: u64) {
    if !state::observe_token(high_water) {
        logging::log_warning(format!(
            "redis-lock: the saved token high-water mark {high_water} is at or above 2^53, which \
             this module never mints; not followed (tokens go on from the clock and the loaded keys)"
        ));
    }
}
