//! A lock key in the keyspace: open it, read or write its [`Hold`], keep the key's Redis expiry
//! equal to the hold's deadline, and replicate the effect.
//!
//! Why raw calls and not the crate's `RedisKeyWritable`: that type hides its key pointer, and we
//! need the type check, the absolute expiry (7.2+) and in-place updates that it does not offer.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_longlong, c_void};
use std::sync::atomic::Ordering::Relaxed;

use redis_module::{raw, Context, RedisString};

use crate::error::{Error, Result};
use crate::lock::{Hold, Millis};
use crate::redis::datatype;
use crate::stats;

/// The current wall-clock time as Redis reads it, in milliseconds since the epoch.
pub fn now() -> Millis {
    // SAFETY: RedisModule_Milliseconds is set by RedisModule_Init and takes no arguments.
    unsafe { raw::RedisModule_Milliseconds.unwrap()() }
}

/// The same wall clock in microseconds (Redis's `mstime()` is `gettimeofday` in milliseconds).
pub fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// Flags of the context a command or callback runs in (`REDISMODULE_CTX_FLAGS_*`).
pub fn context_flags(ctx: *mut raw::RedisModuleCtx) -> u32 {
    // SAFETY: ctx is the live context the server passed to the current callback.
    unsafe { raw::RedisModule_GetContextFlags.unwrap()(ctx) as u32 }
}

/// True when the command replays an effect the primary already decided: it came over the
/// replication link or from the AOF being loaded.
pub fn applying_effects(ctx: *mut raw::RedisModuleCtx) -> bool {
    context_flags(ctx)
        & (raw::REDISMODULE_CTX_FLAGS_REPLICATED | raw::REDISMODULE_CTX_FLAGS_LOADING)
        != 0
}

/// Propagate the current command as it was called.
pub fn replicate_verbatim(ctx: *mut raw::RedisModuleCtx) {
    // SAFETY: ctx is the live context of the command being executed.
    unsafe { raw::RedisModule_ReplicateVerbatim.unwrap()(ctx) };
}

/// An open lock key, closed on drop.
pub struct LockKey {
    ctx: *mut raw::RedisModuleCtx,
    key: *mut raw::RedisModuleKey,
    name: *mut raw::RedisModuleString,
}

impl LockKey {
    /// Open `name` for writing in the context's selected database.
    pub fn open(ctx: &Context, name: &RedisString) -> LockKey {
        Self::open_raw(
            ctx.ctx,
            name.inner,
            raw::KeyMode::READ | raw::KeyMode::WRITE,
        )
    }

    /// Open `name` read-only (for `LOCK.FENCE`, which must work on replicas and under ACL
    /// read-only key permissions).
    pub fn open_read(ctx: &Context, name: &RedisString) -> LockKey {
        Self::open_raw(ctx.ctx, name.inner, raw::KeyMode::READ)
    }

    pub fn open_raw(
        ctx: *mut raw::RedisModuleCtx,
        name: *mut raw::RedisModuleString,
        mode: raw::KeyMode,
    ) -> LockKey {
        // SAFETY: ctx and name are live for the duration of the callback we are in; the key is
        // closed in Drop before the callback returns.
        let key = unsafe { raw::RedisModule_OpenKey.unwrap()(ctx, name, mode.bits()) };
        LockKey {
            ctx,
            key: key.cast(),
            name,
        }
    }

    fn raw_value(&self) -> Result<*mut Hold> {
        if self.key.is_null() {
            return Ok(std::ptr::null_mut());
        }
        // SAFETY: self.key is an open key; these calls only read its type and value pointer.
        unsafe {
            match raw::RedisModule_KeyType.unwrap()(self.key) as isize {
                raw::REDISMODULE_KEYTYPE_EMPTY => Ok(std::ptr::null_mut()),
                raw::REDISMODULE_KEYTYPE_MODULE
                    if raw::RedisModule_ModuleTypeGetType.unwrap()(self.key)
                        == datatype::raw_type() =>
                {
                    Ok(raw::RedisModule_ModuleTypeGetValue.unwrap()(self.key).cast())
                }
                _ => Err(Error::WrongType),
            }
        }
    }

    /// The stored hold, live or not; `WRONGTYPE` if the key holds something else.
    pub fn hold(&self) -> Result<Option<&Hold>> {
        // SAFETY: a non-null value of our type is a Box<Hold> we handed to Redis; it stays
        // valid while the key is open and nothing else runs (single-threaded server).
        Ok(unsafe { self.raw_value()?.as_ref() })
    }

    /// Store `hold` (replacing any previous one) and set the key's expiry to its deadline.
    /// Replacing a hold whose deadline passed before Redis removed the key counts as its
    /// expiry (`lock.expired`).
    pub fn put(&mut self, hold: Hold, now: Millis) -> Result<()> {
        let deadline = hold.deadline;
        let current = self.raw_value()?;
        // SAFETY: a non-null current is our live Hold (see `hold`).
        if unsafe { current.as_ref() }.is_some_and(|h| !h.is_live(now)) {
            stats::EXPIRED.incr();
            self.notify(c"lock.expired");
        }
        if current.is_null() {
            let value = Box::into_raw(Box::new(hold));
            // SAFETY: the key is open for writing and empty; on success Redis owns `value` and
            // frees it through our type's free callback.
            let rc = unsafe {
                raw::RedisModule_ModuleTypeSetValue.unwrap()(
                    self.key,
                    datatype::raw_type(),
                    value.cast::<c_void>(),
                )
            };
            if rc != raw::REDISMODULE_OK as c_int {
                // SAFETY: Redis did not take ownership, so the box is still ours.
                drop(unsafe { Box::from_raw(value) });
                return Err(crate::error::internal("could not store the lock value"));
            }
            stats::LOCK_VALUES.fetch_add(1, Relaxed);
        } else {
            // SAFETY: current points at our live Hold; no other reference to it exists now.
            unsafe { *current = hold };
        }
        self.set_deadline(deadline)
    }

    /// Move the key's Redis expiry (and the stored deadline) to `deadline`.
    pub fn set_deadline(&mut self, deadline: Millis) -> Result<()> {
        let current = self.raw_value()?;
        if current.is_null() {
            return Err(crate::error::internal("no lock value to set a deadline on"));
        }
        // SAFETY: as in `put`.
        unsafe { (*current).deadline = deadline };
        // SAFETY: the key is open for writing and holds a value. SetAbsExpire (7.2+) keeps the
        // exact absolute deadline; on 7.0 we convert to relative, at least 1 ms so that an
        // expiry of 0 is never taken as "now" twice.
        let rc = unsafe {
            match raw::RedisModule_SetAbsExpire {
                Some(set_abs) => set_abs(self.key, deadline),
                None => raw::RedisModule_SetExpire.unwrap()(self.key, (deadline - now()).max(1)),
            }
        };
        if rc != raw::REDISMODULE_OK as c_int {
            return Err(crate::error::internal("could not set the key expiry"));
        }
        Ok(())
    }

    /// Delete the key (a released lock leaves nothing behind).
    pub fn delete(&mut self) {
        if !self.key.is_null() {
            // SAFETY: the key is open for writing; deleting an empty key is a no-op.
            unsafe { raw::RedisModule_DeleteKey.unwrap()(self.key) };
        }
    }

    /// Send the stored hold to replicas and the AOF as `LOCK.LOAD key owner token deadline`:
    /// the deterministic effect of a grant, retry, extend or handoff.
    pub fn replicate_hold(&self) {
        if let Ok(Some(hold)) = self.hold() {
            replicate_load(self.ctx, self.name, hold);
        }
    }

    /// Publish a keyspace event of class `d` (module events), e.g. `lock.acquired`, delivered
    /// when `notify-keyspace-events` enables it.
    pub fn notify(&self, event: &CStr) {
        // SAFETY: ctx and name are live; the event name is a static C string.
        unsafe {
            raw::RedisModule_NotifyKeyspaceEvent.unwrap()(
                self.ctx,
                raw::REDISMODULE_NOTIFY_MODULE as c_int,
                event.as_ptr(),
                self.name,
            )
        };
    }

    /// Send `DEL key` to replicas and the AOF.
    pub fn replicate_delete(&self) {
        // SAFETY: ctx and name are live; format "s" takes one RedisModuleString.
        unsafe {
            raw::RedisModule_Replicate.unwrap()(
                self.ctx,
                c"DEL".as_ptr(),
                c"s".as_ptr(),
                self.name,
            );
        }
    }
}

impl Drop for LockKey {
    fn drop(&mut self) {
        if !self.key.is_null() {
            // SAFETY: the key was opened by us and is closed exactly once.
            unsafe { raw::RedisModule_CloseKey.unwrap()(self.key) };
        }
    }
}

fn replicate_load(ctx: *mut raw::RedisModuleCtx, name: *mut raw::RedisModuleString, hold: &Hold) {
    // SAFETY: format "sbll": a RedisModuleString, a (pointer, length) buffer, two long longs.
    unsafe {
        raw::RedisModule_Replicate.unwrap()(
            ctx,
            c"LOCK.LOAD".as_ptr(),
            c"sbll".as_ptr(),
            name,
            hold.owner.as_ptr().cast::<c_char>(),
            hold.owner.len(),
            hold.token as c_longlong,
            hold.deadline as c_longlong,
        );
    }
}

/// Write `LOCK.LOAD key owner token deadline` into a rewritten AOF.
pub fn emit_aof(aof: *mut raw::RedisModuleIO, name: *mut raw::RedisModuleString, hold: &Hold) {
    // SAFETY: same format as replicate_load; aof and name come from the rewrite callback.
    unsafe {
        raw::RedisModule_EmitAOF.unwrap()(
            aof,
            c"LOCK.LOAD".as_ptr(),
            c"sbll".as_ptr(),
            name,
            hold.owner.as_ptr().cast::<c_char>(),
            hold.owner.len(),
            hold.token as c_longlong,
            hold.deadline as c_longlong,
        );
    }
}

/// Select database `db` on a context that has no client of its own (timers).
pub fn select_db(ctx: *mut raw::RedisModuleCtx, db: i32) -> bool {
    // SAFETY: ctx is the live context of the current callback.
    unsafe { raw::RedisModule_SelectDb.unwrap()(ctx, db) == raw::REDISMODULE_OK as c_int }
}

/// The database selected in `ctx`.
pub fn selected_db(ctx: *mut raw::RedisModuleCtx) -> i32 {
    // SAFETY: ctx is the live context of the current callback.
    unsafe { raw::RedisModule_GetSelectedDb.unwrap()(ctx) }
}
