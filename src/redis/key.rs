//! A lock key in the keyspace: open it, read or write its [`Lock`], keep the key's Redis expiry
//! equal to the latest deadline of its holders, and replicate the effect.
//!
//! Why raw calls and not the crate's `RedisKeyWritable`: that type hides its key pointer, and we
//! need the type check, the absolute expiry (7.2+) and in-place updates that it does not offer.

use std::cell::Cell;
use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_longlong, c_void};
use std::sync::atomic::Ordering::Relaxed;

use redis_module::{raw, Context, RedisString};

use crate::error::{Error, Result};
use crate::lock::{HoldRef, IntoHold, Lock, Millis, Mode, Serial};
use crate::redis::{datatype, feed};
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

/// The mode a command opens its lock key in.
pub const READ_WRITE: raw::KeyMode = raw::KeyMode::READ.union(raw::KeyMode::WRITE);

/// An open lock key, closed on drop.
pub struct LockKey {
    ctx: *mut raw::RedisModuleCtx,
    key: *mut raw::RedisModuleKey,
    name: *mut raw::RedisModuleString,
    /// The value was created through this handle: nothing on a replica can need pruning
    /// (its copy of the key was deleted or never existed), so shared grants skip `PRUNE`.
    created: bool,
    /// The value's address as this handle last found it (null: empty), `None` until the first
    /// read. Why a cache is exact: the server's key handle keeps the value object it opened
    /// (`key->value`), and `RM_KeyType`/`RM_ModuleTypeGetValue` only read through it, so what
    /// they return changes only when this handle stores or deletes the value (both set the
    /// cache) or when our type's value is replaced in place (`RM_ModuleTypeReplaceValue`, which
    /// the module never calls). A second handle that deleted or replaced the same key would
    /// leave the server's `key->value` of this one dangling, cache or not: the cache adds no
    /// case that the uncached reads survive. Saves the three server calls of each read after
    /// the first (a cycle reads it about seven times).
    value: Cell<Option<*mut Lock>>,
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
            created: false,
            value: Cell::new(None),
        }
    }

    fn raw_value(&self) -> Result<*mut Lock> {
        if let Some(value) = self.value.get() {
            return Ok(value);
        }
        if self.key.is_null() {
            return Ok(std::ptr::null_mut());
        }
        // SAFETY: self.key is an open key; these calls only read its type and value pointer.
        let value = unsafe {
            match raw::RedisModule_KeyType.unwrap()(self.key) as isize {
                raw::REDISMODULE_KEYTYPE_EMPTY => std::ptr::null_mut(),
                raw::REDISMODULE_KEYTYPE_MODULE
                    if raw::RedisModule_ModuleTypeGetType.unwrap()(self.key)
                        == datatype::raw_type() =>
                {
                    raw::RedisModule_ModuleTypeGetValue.unwrap()(self.key).cast()
                }
                _ => return Err(Error::WrongType),
            }
        };
        self.value.set(Some(value));
        Ok(value)
    }

    /// The stored lock, with live and expired holders; `WRONGTYPE` if the key holds something
    /// else.
    pub fn lock(&self) -> Result<Option<&Lock>> {
        // SAFETY: a non-null value of our type is a Box<Lock> we handed to Redis; it stays
        // valid while the key is open and nothing else runs (single-threaded server).
        Ok(unsafe { self.raw_value()?.as_ref() })
    }

    fn lock_mut(&mut self) -> Result<Option<&mut Lock>> {
        // SAFETY: as in `lock`; `&mut self` makes this the only reference.
        Ok(unsafe { self.raw_value()?.as_mut() })
    }

    /// Store `hold` in `mode`, as `lock::decide_acquire` (or the primary) allowed: create the
    /// value, or admit the hold into it after dropping the holders that expired at or before
    /// `prune` (each counts as an expiry, `lock.expired`). The key's expiry follows.
    pub fn grant(&mut self, mode: Mode, hold: impl IntoHold, prune: Option<Millis>) -> Result<()> {
        let (ctx, name) = (self.ctx, self.name);
        match self.lock_mut()? {
            Some(lock) => {
                if let Some(before) = prune.filter(|_| feed::watching()) {
                    feed_pruned(ctx, name, lock, before);
                }
                if let Some(before) = prune {
                    forget_pruned(ctx, name, lock, before);
                }
                let expired = prune.map_or(0, |before| lock.prune(before));
                lock.admit(mode, hold);
                if expired > 0 {
                    stats::EXPIRED.add(expired as u64);
                    self.notify(c"lock.expired");
                }
            }
            None => {
                let value = Box::into_raw(Box::new(Lock::new(mode, hold)));
                // SAFETY: the key is open for writing and empty; on success Redis owns `value`
                // and frees it through our type's free callback.
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
                self.created = true;
                self.value.set(Some(value));
            }
        }
        self.sync_expiry()
    }

    /// Move `owner`'s live deadline (retry, extend) and the key's expiry with it.
    pub fn set_deadline(&mut self, owner: &[u8], deadline: Millis, now: Millis) -> Result<()> {
        let moved = self
            .lock_mut()?
            .is_some_and(|l| l.set_deadline(owner, deadline, now));
        if !moved {
            return Err(crate::error::internal("no live hold to set a deadline on"));
        }
        self.sync_expiry()
    }

    /// Take `owner`'s entry out, and the holders that expired at or before `prune`; `Some`
    /// (the removed hold's session, 0 for none) when there was one. The value stays even when
    /// it has no holders left, so that a handoff can fill it in the same command; the caller
    /// deletes the key if nobody is granted (see [`Self::delete_if_empty`]).
    pub fn remove(&mut self, owner: &[u8], prune: Option<Millis>) -> Result<Option<Serial>> {
        let (ctx, name) = (self.ctx, self.name);
        let Some(lock) = self.lock_mut()? else {
            return Ok(None);
        };
        let removed = lock.discard(owner);
        if let Some(before) = prune.filter(|_| feed::watching()) {
            feed_pruned(ctx, name, lock, before);
        }
        if let Some(session) = removed.filter(|s| *s != 0) {
            let name = redis_module::RedisString::string_as_slice(name);
            crate::redis::session::untrack(session, selected_db(ctx), name, owner);
        }
        if let Some(before) = prune {
            forget_pruned(ctx, name, lock, before);
        }
        let expired = prune.map_or(0, |before| lock.prune(before));
        if expired > 0 {
            stats::EXPIRED.add(expired as u64);
            self.notify(c"lock.expired");
        }
        Ok(removed)
    }

    /// The session `serial` ended at `at`: `owner`'s hold in it is removed (`clean`, a `CLOSE`)
    /// or lost (its deadline moves to `at`, so its lock-delay starts then), and the holders
    /// whose place was free by `at` go. `None` when the key has no such hold (it went away, or
    /// was taken over after its own deadline); else the hold's token and whether it was live
    /// at `at` (see [`Lock::end_session_hold`]). The caller deletes the key if it is empty.
    pub fn end_session_hold(
        &mut self,
        owner: &[u8],
        serial: crate::lock::Serial,
        at: Millis,
        clean: bool,
    ) -> Result<Option<(u64, bool)>> {
        let (ctx, name) = (self.ctx, self.name);
        Ok(self.lock_mut()?.and_then(|lock| {
            forget_pruned(ctx, name, lock, at);
            lock.end_session_hold(owner, serial, at, clean)
        }))
    }

    /// Delete the key if no holder is left in it (true), else move its expiry to the latest
    /// deadline left (false).
    pub fn delete_if_empty(&mut self) -> Result<bool> {
        if self.lock()?.is_none_or(Lock::is_empty) {
            self.delete();
            return Ok(true);
        }
        self.sync_expiry().map(|_| false)
    }

    /// Set the key's Redis expiry to the latest deadline of its holders.
    fn sync_expiry(&mut self) -> Result<()> {
        let Some(deadline) = self.lock()?.and_then(Lock::key_deadline) else {
            return Ok(());
        };
        // SAFETY: the key is open for writing and holds a value. SetAbsExpire (7.2+) keeps the
        // exact absolute deadline; on 7.0 we convert to relative, at least 1 ms so that an
        // expiry of 0 is never taken as "now" twice. A session hold with no deadline of its own
        // leaves the key with no expiry (`PTTL` -1): it goes when its session ends.
        let rc = unsafe {
            match raw::RedisModule_SetAbsExpire {
                _ if deadline >= crate::lock::NO_DEADLINE => raw::RedisModule_SetExpire.unwrap()(
                    self.key,
                    raw::REDISMODULE_NO_EXPIRE as c_longlong,
                ),
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
            // Our own deletion: the feed already told what ended (see `feed::deleting`).
            feed::deleting(true);
            // SAFETY: the key is open for writing; deleting an empty key is a no-op.
            unsafe { raw::RedisModule_DeleteKey.unwrap()(self.key) };
            feed::deleting(false);
            self.value.set(Some(std::ptr::null_mut()));
        }
    }

    /// The change feed: an event about one of this key's holds (nothing unless the key is
    /// watched). `deadline` for `acquired` and `extended`.
    pub fn feed(&self, kind: feed::Kind, owner: &[u8], token: u64, deadline: Option<Millis>) {
        if feed::watching() {
            let name = redis_module::RedisString::string_as_slice(self.name);
            feed::hold_event(selected_db(self.ctx), name, kind, owner, token, deadline);
        }
    }

    /// Send `owner`'s hold to replicas and the AOF as `LOCK.LOAD`: the deterministic effect of
    /// a grant, retry, extend or handoff. A shared hold also carries `PRUNE now`: the holders
    /// this server dropped as expired, which a replica drops too (never by its own clock);
    /// not on a key this handle created, which has nothing to prune.
    pub fn replicate_holder(&self, owner: &[u8], now: Millis) {
        if let Ok(Some(lock)) = self.lock() {
            if let Some(hold) = lock.entry(owner) {
                let prune = (!self.created).then_some(now);
                replicate_load(self.ctx, self.name, lock.mode(), hold, prune);
            }
        }
    }

    /// Send `LOCK.RELEASE key owner` to replicas and the AOF (where it removes `owner`'s entry
    /// whatever the clock says; see `commands::release`).
    pub fn replicate_release(&self, owner: &[u8]) {
        // SAFETY: format "sb": a RedisModuleString and a (pointer, length) buffer.
        unsafe {
            raw::RedisModule_Replicate.unwrap()(
                self.ctx,
                c"LOCK.RELEASE".as_ptr(),
                c"sb".as_ptr(),
                self.name,
                owner.as_ptr().cast::<c_char>(),
                owner.len(),
            );
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

/// `LOCK.LOAD` of a hold in a session or with a lock-delay, as a vector of strings: these
/// are off the hot path, and the combinations of options would otherwise multiply the formats.
fn load_args(name: &[u8], mode: Mode, hold: HoldRef, prune: Option<Millis>) -> Vec<Vec<u8>> {
    let n = |v: i64| v.to_string().into_bytes();
    let mut args = vec![
        name.to_vec(),
        hold.owner.to_vec(),
        n(hold.token as i64),
        n(hold.deadline),
    ];
    if let Mode::Shared { limit } = mode {
        args.push(b"SHARED".to_vec());
        if let Some(limit) = limit {
            args.extend([b"LIMIT".to_vec(), n(limit as i64)]);
        }
    }
    if let Some(prune) = prune {
        args.extend([b"PRUNE".to_vec(), n(prune)]);
    }
    if hold.session != 0 {
        args.extend([b"SESSION".to_vec(), n(hold.session as i64)]);
    }
    if hold.delay != 0 {
        args.extend([b"DELAY".to_vec(), n(hold.delay)]);
    }
    args
}

/// Call `RedisModule_Replicate` (or `EmitAOF`) with format `v`: an array of strings.
fn with_strings(args: &[Vec<u8>], f: impl FnOnce(*const *mut raw::RedisModuleString, usize)) {
    let strings: Vec<*mut raw::RedisModuleString> = args
        .iter()
        .map(|a| {
            // SAFETY: a string made from a (pointer, length) buffer, freed below.
            unsafe {
                raw::RedisModule_CreateString.unwrap()(
                    std::ptr::null_mut(),
                    a.as_ptr().cast(),
                    a.len(),
                )
            }
        })
        .collect();
    f(strings.as_ptr(), strings.len());
    for s in strings {
        // SAFETY: created above with no context; freed once.
        unsafe { raw::RedisModule_FreeString.unwrap()(std::ptr::null_mut(), s) };
    }
}

/// Send `cmd args...` to replicas and the AOF.
pub fn replicate_strings(ctx: *mut raw::RedisModuleCtx, cmd: &CStr, args: &[Vec<u8>]) {
    with_strings(args, |argv, argc| {
        // SAFETY: format "v" takes an array of RedisModuleString pointers and its length.
        unsafe {
            raw::RedisModule_Replicate.unwrap()(ctx, cmd.as_ptr(), c"v".as_ptr(), argv, argc);
        }
    });
}

/// Write `cmd args...` into a rewritten AOF.
pub fn emit_strings(aof: *mut raw::RedisModuleIO, cmd: &CStr, args: &[Vec<u8>]) {
    with_strings(args, |argv, argc| {
        // SAFETY: as in replicate_strings.
        unsafe {
            raw::RedisModule_EmitAOF.unwrap()(aof, cmd.as_ptr(), c"v".as_ptr(), argv, argc);
        }
    });
}

/// The session holds that pruning `lock` at `before` drops leave their sessions' records.
fn forget_pruned(
    ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    lock: &Lock,
    before: Millis,
) {
    let gone = lock.session_holds_freed_by(before);
    if gone.is_empty() {
        return;
    }
    let name = redis_module::RedisString::string_as_slice(name);
    let db = selected_db(ctx);
    for (serial, owner) in gone {
        crate::redis::session::untrack(serial, db, name, &owner);
    }
}

/// `expired` for each holder a prune at `before` drops (only called while a key is watched).
fn feed_pruned(
    ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    lock: &Lock,
    before: Millis,
) {
    let key = redis_module::RedisString::string_as_slice(name);
    for hold in lock.holders().filter(|h| h.frees_at() <= before) {
        feed::hold_event(
            selected_db(ctx),
            key,
            feed::Kind::Expired,
            hold.owner,
            hold.token,
            None,
        );
    }
}

fn replicate_load(
    ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    mode: Mode,
    hold: HoldRef,
    prune: Option<Millis>,
) {
    if hold.session != 0 || hold.delay != 0 {
        let name = redis_module::RedisString::string_as_slice(name);
        replicate_strings(ctx, c"LOCK.LOAD", &load_args(name, mode, hold, prune));
        return;
    }
    let (owner, owner_len) = (hold.owner.as_ptr().cast::<c_char>(), hold.owner.len());
    let (token, deadline) = (hold.token as c_longlong, hold.deadline as c_longlong);
    // SAFETY: reading a function pointer RedisModule_Init set once, before any command ran.
    let replicate = unsafe { raw::RedisModule_Replicate.unwrap() };
    // SAFETY: each format matches its arguments: s = RedisModuleString, b = (pointer, length),
    // l = long long, c = NUL-terminated C string. The exclusive form is the hot path and the
    // one every earlier release of the module wrote, so it stays as short as it was.
    unsafe {
        let (load, shared, limit_, prune_) = (
            c"LOCK.LOAD".as_ptr(),
            c"SHARED".as_ptr(),
            c"LIMIT".as_ptr(),
            c"PRUNE".as_ptr(),
        );
        let (name, o, ol, t, d) = (name, owner, owner_len, token, deadline);
        match (mode, prune.map(|p| p as c_longlong)) {
            (Mode::Exclusive, _) => replicate(ctx, load, c"sbll".as_ptr(), name, o, ol, t, d),
            (Mode::Shared { limit: None }, None) => {
                replicate(ctx, load, c"sbllc".as_ptr(), name, o, ol, t, d, shared)
            }
            (Mode::Shared { limit: None }, Some(p)) => replicate(
                ctx,
                load,
                c"sbllccl".as_ptr(),
                name,
                o,
                ol,
                t,
                d,
                shared,
                prune_,
                p,
            ),
            (Mode::Shared { limit: Some(n) }, None) => replicate(
                ctx,
                load,
                c"sbllccl".as_ptr(),
                name,
                o,
                ol,
                t,
                d,
                shared,
                limit_,
                n as c_longlong,
            ),
            (Mode::Shared { limit: Some(n) }, Some(p)) => replicate(
                ctx,
                load,
                c"sbllcclcl".as_ptr(),
                name,
                o,
                ol,
                t,
                d,
                shared,
                limit_,
                n as c_longlong,
                prune_,
                p,
            ),
        };
    }
}

/// Write a key's holders into a rewritten AOF: one `LOCK.LOAD key owner token deadline` for an
/// exclusive lock, one `... SHARED [LIMIT n]` per holder of a shared one.
pub fn emit_aof(aof: *mut raw::RedisModuleIO, name: *mut raw::RedisModuleString, lock: &Lock) {
    // SAFETY: as in replicate_load.
    let emit = unsafe { raw::RedisModule_EmitAOF.unwrap() };
    for hold in lock.holders() {
        if hold.session != 0 || hold.delay != 0 {
            let key = redis_module::RedisString::string_as_slice(name);
            emit_strings(aof, c"LOCK.LOAD", &load_args(key, lock.mode(), hold, None));
            continue;
        }
        let (owner, owner_len) = (hold.owner.as_ptr().cast::<c_char>(), hold.owner.len());
        let (token, deadline) = (hold.token as c_longlong, hold.deadline as c_longlong);
        // SAFETY: as in replicate_load; aof and name come from the rewrite callback.
        unsafe {
            let load = c"LOCK.LOAD".as_ptr();
            match lock.mode() {
                Mode::Exclusive => emit(
                    aof,
                    load,
                    c"sbll".as_ptr(),
                    name,
                    owner,
                    owner_len,
                    token,
                    deadline,
                ),
                Mode::Shared { limit: None } => emit(
                    aof,
                    load,
                    c"sbllc".as_ptr(),
                    name,
                    owner,
                    owner_len,
                    token,
                    deadline,
                    c"SHARED".as_ptr(),
                ),
                Mode::Shared { limit: Some(n) } => emit(
                    aof,
                    load,
                    c"sbllccl".as_ptr(),
                    name,
                    owner,
                    owner_len,
                    token,
                    deadline,
                    c"SHARED".as_ptr(),
                    c"LIMIT".as_ptr(),
                    n as c_longlong,
                ),
            };
        }
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
