//! Valkey 9's atomic slot migration (`CLUSTER MIGRATESLOTS`).
//!
//! Valkey refuses `CLUSTER MIGRATESLOTS` for every slot while a loaded module has not declared
//! that it understands the migration (`VALKEYMODULE_OPTIONS_HANDLE_ATOMIC_SLOT_MIGRATION`,
//! `1 << 5`). What the migration does to a lock key, read in Valkey's
//! `src/cluster_migrateslots.c` and seen on 9.1.2:
//! - the source forks a child that writes the slots in AOF form through each type's
//!   `aof_rewrite` (for us: `LOCK.SESSION RESTORE` for each session with a hold there, then
//!   `LOCK.LOAD`), then streams the later writes of those slots, and only commands with a key
//!   in them (`LOCK.SESSION RENEW`/`ENDED` name none and do not reach the target); the target
//!   applies both on its import link, where `LOCK.LOAD` is accepted as from a replication
//!   link, with the slots hidden from ordinary clients until it takes them over;
//! - both sides get `VALKEYMODULE_EVENT_ATOMIC_SLOT_MIGRATION` (event 19 on Valkey: on Redis
//!   8.4 the same number is another event, so it is subscribed only on Valkey 9+) with the job's
//!   slot ranges: import or export started, completed, aborted; the target's replicas get the
//!   import's events and stream too;
//! - when it is over, the source deletes the moved keys (our `unlink` answers their waiters
//!   `TRYAGAIN`), and an aborted import deletes them on the target.
//!
//! What the module must do, and does here: a session lives on the node that opened it, and the
//! target never hears of it again. So the target must not take the session over: a
//! `LOCK.SESSION RESTORE` that the import brings in only notes the session's deadline, and a
//! session hold the import brings in becomes a plain hold that ends no later than that
//! deadline, as `MIGRATE` already does through `rdb_load`. On the source, while a slot is
//! exported: a session that ends cleanly sends a `LOCK.RELEASE` for each of its holds there
//! (a keyed write the stream carries), and no session takes a new hold there (it would reach
//! the target with no deadline it could be capped at). Tokens and deadlines arrive as they were
//! (`LOCK.LOAD` observes the token).

use std::cell::RefCell;
use std::collections::HashMap;
use std::os::raw::{c_char, c_int, c_void};

use redis_module::{raw, Context};

use crate::error::{self, Error, Result};
use crate::lock::session::HoldRef;
use crate::lock::{Millis, Serial};
use crate::redis::server::Server;
use crate::redis::{blocking, cluster, guard, key, slots};

/// `VALKEYMODULE_OPTIONS_HANDLE_ATOMIC_SLOT_MIGRATION` (valkeymodule.h, 9.0+).
const HANDLE_ATOMIC_SLOT_MIGRATION: c_int = 1 << 5;
/// `VALKEYMODULE_EVENT_ATOMIC_SLOT_MIGRATION` (valkeymodule.h, 9.0+).
const EVENT_ATOMIC_SLOT_MIGRATION: u64 = 19;
const IMPORT_STARTED: u64 = 0;
const EXPORT_STARTED: u64 = 1;
const IMPORT_ABORTED: u64 = 2;
const EXPORT_ABORTED: u64 = 3;
const IMPORT_COMPLETED: u64 = 4;
const EXPORT_COMPLETED: u64 = 5;

/// `ValkeyModuleSlotRange`: inclusive bounds.
#[repr(C)]
struct SlotRange {
    start: c_int,
    end: c_int,
}

/// `ValkeyModuleAtomicSlotMigrationInfoV1`.
#[repr(C)]
struct MigrationInfo {
    version: u64,
    job_name: [c_char; 41],
    slot_ranges: *const SlotRange,
    num_slot_ranges: u32,
}

/// What an import brought in of a session that lives on another node.
#[derive(Default)]
struct Foreign {
    /// The session's deadline as the import described it.
    deadline: Millis,
}

#[derive(Default)]
struct Jobs {
    /// Import jobs on this node (target, or a target's replica): job name -> slot ranges.
    importing: HashMap<Vec<u8>, Vec<(u16, u16)>>,
    /// Export jobs on this node (source): job name -> slot ranges.
    exporting: HashMap<Vec<u8>, Vec<(u16, u16)>>,
    /// Sessions of other nodes that the running imports described, by serial.
    foreign: HashMap<Serial, Foreign>,
}

thread_local! {
    static JOBS: RefCell<Jobs> = RefCell::new(Jobs::default());
}

/// True on a server with atomic slot migration: Valkey 9.0 or later. Valkey reports
/// `redis_version:7.2.4` for compatibility, so the version is read from `valkey_version`.
pub fn server_has_it(ctx: &Context) -> bool {
    matches!(Server::read(ctx), Some(Server::Valkey((major, _))) if major >= 9)
}

/// The module options to declare at load: `base`, plus atomic slot migration where the server
/// has it (elsewhere the bit is not set: on other servers it is unknown or means another thing).
pub fn module_options(ctx: &Context, base: c_int) -> c_int {
    match server_has_it(ctx) {
        true => base | HANDLE_ATOMIC_SLOT_MIGRATION,
        false => base,
    }
}

/// Subscribe to the migration events where the server has them. True when subscribed, or when
/// the server has no such events.
pub fn subscribe(ctx: &Context) -> bool {
    if !server_has_it(ctx) {
        return true;
    }
    let event = raw::RedisModuleEvent {
        id: EVENT_ATOMIC_SLOT_MIGRATION,
        dataver: 1,
    };
    // SAFETY: registration during module load with a callback of the matching signature.
    unsafe {
        raw::RedisModule_SubscribeToServerEvent.unwrap()(ctx.ctx, event, Some(on_migration))
            == raw::REDISMODULE_OK as c_int
    }
}

extern "C" fn on_migration(
    ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    guard::callback("slot migration event", (), || {
        if data.is_null() {
            return;
        }
        // SAFETY: for this event the data is a ValkeyModuleAtomicSlotMigrationInfo (version 1
        // layout, the only one), valid for the duration of the callback; its slot_ranges array
        // has num_slot_ranges entries.
        let (job, ranges) = unsafe {
            let info = &*data.cast::<MigrationInfo>();
            if info.version < 1 {
                return;
            }
            let name = std::ffi::CStr::from_ptr(info.job_name.as_ptr())
                .to_bytes()
                .to_vec();
            let ranges: Vec<(u16, u16)> = match info.slot_ranges.is_null() {
                true => vec![],
                false => {
                    std::slice::from_raw_parts(info.slot_ranges, info.num_slot_ranges as usize)
                        .iter()
                        .map(|r| (r.start.clamp(0, 16383) as u16, r.end.clamp(0, 16383) as u16))
                        .collect()
                }
            };
            (name, ranges)
        };
        redis_module::logging::log_notice(format!(
            "redis-lock: atomic slot migration {} {:?} ({})",
            String::from_utf8_lossy(&job),
            ranges,
            match subevent {
                IMPORT_STARTED => "import started",
                EXPORT_STARTED => "export started",
                IMPORT_ABORTED => "import aborted",
                EXPORT_ABORTED => "export aborted",
                IMPORT_COMPLETED => "import completed",
                EXPORT_COMPLETED => "export completed",
                _ => "unknown subevent",
            }
        ));
        JOBS.with(|j| {
            let mut j = j.borrow_mut();
            match subevent {
                IMPORT_STARTED => {
                    j.importing.insert(job, ranges.clone());
                }
                EXPORT_STARTED => {
                    j.exporting.insert(job, ranges.clone());
                }
                IMPORT_ABORTED | IMPORT_COMPLETED => {
                    j.importing.remove(&job);
                    if j.importing.is_empty() {
                        j.foreign.clear();
                    }
                }
                EXPORT_ABORTED | EXPORT_COMPLETED => {
                    j.exporting.remove(&job);
                }
                _ => {}
            }
        });
        if subevent == EXPORT_STARTED {
            blocking::fail_session_waiters_in(ctx, &ranges);
        }
    })
}

/// True while an import into this node (or its primary) is running.
fn importing_any() -> bool {
    JOBS.with(|j| !j.borrow().importing.is_empty())
}

/// True while `slot` is being imported into this node (or its primary).
pub fn importing(slot: u16) -> bool {
    JOBS.with(|j| {
        j.borrow()
            .importing
            .values()
            .flatten()
            .any(|&(lo, hi)| (lo..=hi).contains(&slot))
    })
}

/// A replicated `LOCK.SESSION RESTORE`: true when it is the description of a session of another
/// node that an import brought in (then its deadline is noted and the session is not created
/// here). On a primary, every replicated command during an import is the import's. On a
/// replica, a session of its own shard has an id tagged with one of the shard's slots
/// (`session::open` picks one); an import's is tagged with a slot of the source.
pub fn note_foreign_session(
    ctx: *mut raw::RedisModuleCtx,
    id: &[u8],
    serial: Serial,
    deadline: Millis,
) -> bool {
    let flags = key::context_flags(ctx);
    if !importing_any() || flags & raw::REDISMODULE_CTX_FLAGS_LOADING != 0 {
        return false;
    }
    // A primary applies replicated commands only from an import's link: no need to look.
    if flags & raw::REDISMODULE_CTX_FLAGS_SLAVE != 0 && !foreign_id(ctx, id) {
        return false;
    }
    JOBS.with(|j| j.borrow_mut().foreign.insert(serial, Foreign { deadline }));
    true
}

/// On a replica, whose stream mixes its primary's own sessions with what an import brings in:
/// true when `id` is tagged with a slot that this replica's primary does not serve.
fn foreign_id(ctx: *mut raw::RedisModuleCtx, id: &[u8]) -> bool {
    let slot = slots::key_slot(id);
    let Some(nodes) = cluster::nodes(ctx) else {
        return false;
    };
    !cluster::shard_serves_slot(&nodes, slot as i64)
}

/// The deadline a session hold of `serial` on `key` keeps when an import brings it to a node
/// without the session: `None` when the hold is not an import's (not an importing slot).
/// Otherwise the session's deadline as the import described it, or `fallback` when it did not.
pub fn imported_hold_cap(key_name: &[u8], serial: Serial, fallback: Millis) -> Option<Millis> {
    if serial == 0 || !importing(slots::key_slot(key_name)) {
        return None;
    }
    Some(JOBS.with(|j| {
        j.borrow()
            .foreign
            .get(&serial)
            .map_or(fallback, |f| f.deadline)
    }))
}

/// True while `slot` is being exported from this node.
fn exporting(slot: u16) -> bool {
    JOBS.with(|j| {
        j.borrow()
            .exporting
            .values()
            .flatten()
            .any(|&(lo, hi)| (lo..=hi).contains(&slot))
    })
}

/// A session ended on this primary (`clean`: closed, not lost). Its end reaches replicas as one
/// keyless `LOCK.SESSION ENDED`, which an export does not carry to the target: for each of its
/// holds in a slot being exported, also send `LOCK.RELEASE key owner`, a write of that slot, so
/// that the target (which has the hold as a plain one) drops it too. Sent right after the
/// `ENDED` and before any handoff, so that on this node's replicas it finds nothing to remove.
/// Not for a session lost with a lock-delay: there the target's copy ends at the session's
/// deadline, no sooner than the delay would (a release would skip the delay).
pub fn release_exported_holds(
    ctx: *mut raw::RedisModuleCtx,
    holds: &std::collections::HashSet<HoldRef>,
    clean: bool,
    lock_delay: Millis,
) {
    if !clean && lock_delay > 0 {
        return;
    }
    if JOBS.with(|j| j.borrow().exporting.is_empty()) {
        return;
    }
    let db = key::selected_db(ctx);
    for (hold_db, name, owner) in holds {
        if exporting(slots::key_slot(name)) && key::select_db(ctx, *hold_db) {
            key::replicate_strings(ctx, c"LOCK.RELEASE", &[name.clone(), owner.clone()]);
        }
    }
    key::select_db(ctx, db);
}

/// `ACQUIRE` or `MACQUIRE` with `SESSION` on `keys`: refused while a key's slot is being
/// exported (see `blocking::exports` for why). Nothing has changed when this refuses.
pub fn refuse_session_hold<'a>(keys: impl IntoIterator<Item = &'a [u8]>) -> Result<()> {
    if JOBS.with(|j| j.borrow().exporting.is_empty()) {
        return Ok(());
    }
    match keys.into_iter().any(|k| exporting(slots::key_slot(k))) {
        true => Err(Error::Reply(error::slot_exporting().to_string())),
        false => Ok(()),
    }
}
