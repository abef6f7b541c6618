//! Bench-only floor module (issue 22): the platform's share of our commands, in instructions
//! (`make bench-instructions`) and in memory (`make bench`, section "Memory per held lock").
//!
//! Instructions: `FLOOR.ACQUIRE key owner ttl-ms` and `FLOOR.RELEASE key owner` make the same
//! server calls as an uncontended `LOCK.ACQUIRE` and `LOCK.RELEASE` of an exclusive lock, and
//! nothing else: open the key, check its type, store (or read and delete) a module-type value,
//! set the key's expiry, notify, replicate (`FLOOR.LOAD key owner token deadline`, the shape of
//! `LOCK.LOAD`, format `sbll`; the release verbatim) and reply with an integer. What `LOCK.*`
//! costs beyond these is ours; these are the platform's. Raw handlers, no argument wrapping.
//!
//! Memory: the value `FLOOR.ACQUIRE` stores is the smallest honest value a lock
//! can have, in one allocation: what a lock must know to answer a release, an extend and a
//! fence (the fencing token, the deadline, the owner's bytes and their length), with no
//! capacity to spare: `8 + 8 + 1 + owner` bytes, 53 for a 36-byte UUID owner, which the server's
//! allocator serves from its next size class. The key, its dict entry, its expiry and the
//! module-type wrapper around the value cost what ours cost, so `used_memory` per key of
//! `FLOOR.ACQUIRE` against `LOCK.ACQUIRE` (same keys, owners and ttl) is what our value's
//! layout costs beyond the least a module type can spend (issue 22, goal 2 on Redis 8.2). What
//! it leaves out and `LOCK.ACQUIRE`'s value keeps: the grant time (the hold-time statistic),
//! and room for owners up to 39 bytes whatever this owner's length.
//!
//! Never shipped and never loaded by the tests: it has no persistence worth the name (an
//! owner longer than 64 bytes is refused) and no queue.

use std::os::raw::{c_char, c_int, c_longlong, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering::Relaxed};

use redis_module::{alloc::RedisAlloc, raw};

#[global_allocator]
static ALLOC: RedisAlloc = RedisAlloc;

const OWNER_MAX: usize = 64;

/// The value: token, deadline, the owner's length and its bytes, packed into one allocation of
/// exactly [`HEAD`] + length bytes (see the module docs); `*mut u8` to its first byte.
struct Value;

/// Bytes before the owner: token (8), deadline (8), owner length (1).
const HEAD: usize = 17;

impl Value {
    fn layout(owner_len: usize) -> std::alloc::Layout {
        // Align 8: the server's allocator rounds every request up to its size class anyway.
        std::alloc::Layout::from_size_align(HEAD + owner_len, 8).expect("small layout")
    }

    /// A new value (the caller has checked `owner.len() <= OWNER_MAX`).
    fn alloc(owner: &[u8], token: u64, deadline: i64) -> *mut u8 {
        // SAFETY: the layout has a non-zero size; every byte is written below.
        unsafe {
            let p = std::alloc::alloc(Self::layout(owner.len()));
            if p.is_null() {
                std::alloc::handle_alloc_error(Self::layout(owner.len()));
            }
            let v = std::slice::from_raw_parts_mut(p, HEAD + owner.len());
            v[..8].copy_from_slice(&token.to_ne_bytes());
            v[8..16].copy_from_slice(&deadline.to_ne_bytes());
            v[16] = owner.len() as u8;
            v[HEAD..].copy_from_slice(owner);
            p
        }
    }

    /// The value's bytes.
    ///
    /// # Safety
    /// `p` came from [`Value::alloc`] and was not freed.
    unsafe fn bytes<'a>(p: *const u8) -> &'a [u8] {
        std::slice::from_raw_parts(p, HEAD + usize::from(*p.add(16)))
    }

    /// (owner, token, deadline).
    ///
    /// # Safety
    /// As in [`Value::bytes`].
    unsafe fn read<'a>(p: *const u8) -> (&'a [u8], u64, i64) {
        let v = Self::bytes(p);
        let word = |at: usize| <[u8; 8]>::try_from(&v[at..at + 8]).expect("8 bytes");
        (
            &v[HEAD..],
            u64::from_ne_bytes(word(0)),
            i64::from_ne_bytes(word(8)),
        )
    }

    /// # Safety
    /// As in [`Value::bytes`]; freed once.
    unsafe fn free(p: *mut u8) {
        std::alloc::dealloc(p, Self::layout(usize::from(*p.add(16))));
    }
}

static TYPE: AtomicPtr<raw::RedisModuleType> = AtomicPtr::new(null_mut());
/// Tokens as wide as the lock's (16 digits), so that the replicated numbers cost the same.
static TOKENS: AtomicU64 = AtomicU64::new(3_000_000_000_000_000);
const OK: c_int = raw::REDISMODULE_OK as c_int;

/// The bytes of a module string.
unsafe fn bytes<'a>(s: *mut raw::RedisModuleString) -> &'a [u8] {
    let mut len = 0;
    let p = raw::RedisModule_StringPtrLen.unwrap()(s, &mut len);
    std::slice::from_raw_parts(p.cast::<u8>(), len)
}

fn parse_i64(b: &[u8]) -> Option<i64> {
    std::str::from_utf8(b).ok()?.parse().ok()
}

unsafe fn error(ctx: *mut raw::RedisModuleCtx, msg: &std::ffi::CStr) -> c_int {
    raw::RedisModule_ReplyWithError.unwrap()(ctx, msg.as_ptr())
}

/// The key's value if it holds ours, null if empty; Err on another type.
unsafe fn value(key: *mut raw::RedisModuleKey) -> Result<*mut u8, ()> {
    match raw::RedisModule_KeyType.unwrap()(key) as isize {
        raw::REDISMODULE_KEYTYPE_EMPTY => Ok(null_mut()),
        raw::REDISMODULE_KEYTYPE_MODULE
            if raw::RedisModule_ModuleTypeGetType.unwrap()(key) == TYPE.load(Relaxed) =>
        {
            Ok(raw::RedisModule_ModuleTypeGetValue.unwrap()(key).cast())
        }
        _ => Err(()),
    }
}

/// Store a new value in the open empty key and set its expiry at `deadline`, as `LockKey::grant`
/// does (absolute on 7.2+, relative on 7.0).
unsafe fn store(key: *mut raw::RedisModuleKey, owner: &[u8], token: u64, deadline: i64) -> bool {
    let v = Value::alloc(owner, token, deadline);
    if raw::RedisModule_ModuleTypeSetValue.unwrap()(key, TYPE.load(Relaxed), v.cast()) != OK {
        Value::free(v);
        return false;
    }
    let rc = match raw::RedisModule_SetAbsExpire {
        Some(set_abs) => set_abs(key, deadline),
        None => raw::RedisModule_SetExpire.unwrap()(
            key,
            (deadline - raw::RedisModule_Milliseconds.unwrap()()).max(1),
        ),
    };
    rc == OK
}

unsafe fn open(
    ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
) -> *mut raw::RedisModuleKey {
    let mode = (raw::KeyMode::READ | raw::KeyMode::WRITE).bits();
    raw::RedisModule_OpenKey.unwrap()(ctx, name, mode).cast()
}

/// `FLOOR.ACQUIRE key owner ttl-ms` -> token | nil
extern "C" fn acquire(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    // SAFETY: the server passes argc live strings in argv and a live context; every call
    // below follows the module API's contract, and the key is closed before returning.
    unsafe {
        if argc != 4 {
            return raw::RedisModule_WrongArity.unwrap()(ctx);
        }
        let argv = std::slice::from_raw_parts(argv, argc as usize);
        let owner = bytes(argv[2]);
        let Some(ttl) = parse_i64(bytes(argv[3])).filter(|t| *t > 0) else {
            return error(ctx, c"ERR ttl");
        };
        if owner.len() > OWNER_MAX {
            return error(ctx, c"ERR owner too long");
        }
        let now = raw::RedisModule_Milliseconds.unwrap()();
        let key = open(ctx, argv[1]);
        let rc = match value(key) {
            Err(()) => error(ctx, c"WRONGTYPE"),
            Ok(v) if !v.is_null() => raw::RedisModule_ReplyWithNull.unwrap()(ctx),
            Ok(_) => {
                let (token, deadline) = (TOKENS.fetch_add(1, Relaxed) + 1, now + ttl);
                if store(key, owner, token, deadline) {
                    raw::RedisModule_NotifyKeyspaceEvent.unwrap()(
                        ctx,
                        raw::REDISMODULE_NOTIFY_MODULE as c_int,
                        c"floor.acquired".as_ptr(),
                        argv[1],
                    );
                    raw::RedisModule_Replicate.unwrap()(
                        ctx,
                        c"FLOOR.LOAD".as_ptr(),
                        c"sbll".as_ptr(),
                        argv[1],
                        owner.as_ptr().cast::<c_char>(),
                        owner.len(),
                        token as c_longlong,
                        deadline as c_longlong,
                    );
                    raw::RedisModule_ReplyWithLongLong.unwrap()(ctx, token as c_longlong)
                } else {
                    error(ctx, c"ERR store")
                }
            }
        };
        raw::RedisModule_CloseKey.unwrap()(key);
        rc
    }
}

/// `FLOOR.RELEASE key owner` -> 1 | 0
extern "C" fn release(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    // SAFETY: as in `acquire`.
    unsafe {
        if argc != 3 {
            return raw::RedisModule_WrongArity.unwrap()(ctx);
        }
        let argv = std::slice::from_raw_parts(argv, argc as usize);
        let owner = bytes(argv[2]);
        let now = raw::RedisModule_Milliseconds.unwrap()();
        let key = open(ctx, argv[1]);
        let rc = match value(key) {
            Err(()) => error(ctx, c"WRONGTYPE"),
            Ok(v) if v.is_null() => raw::RedisModule_ReplyWithLongLong.unwrap()(ctx, 0),
            Ok(v) => {
                let (held, _, deadline) = Value::read(v);
                if held != owner || deadline <= now {
                    raw::RedisModule_ReplyWithLongLong.unwrap()(ctx, 0)
                } else {
                    raw::RedisModule_NotifyKeyspaceEvent.unwrap()(
                        ctx,
                        raw::REDISMODULE_NOTIFY_MODULE as c_int,
                        c"floor.released".as_ptr(),
                        argv[1],
                    );
                    raw::RedisModule_DeleteKey.unwrap()(key);
                    raw::RedisModule_ReplicateVerbatim.unwrap()(ctx);
                    raw::RedisModule_ReplyWithLongLong.unwrap()(ctx, 1)
                }
            }
        };
        raw::RedisModule_CloseKey.unwrap()(key);
        rc
    }
}

/// `FLOOR.LOAD key owner token deadline` (the replicated effect of an acquire) -> OK
extern "C" fn load(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    // SAFETY: as in `acquire`.
    unsafe {
        if argc != 5 {
            return raw::RedisModule_WrongArity.unwrap()(ctx);
        }
        let argv = std::slice::from_raw_parts(argv, argc as usize);
        let owner = bytes(argv[2]);
        let (Some(token), Some(deadline)) = (parse_i64(bytes(argv[3])), parse_i64(bytes(argv[4])))
        else {
            return error(ctx, c"ERR load");
        };
        if owner.len() > OWNER_MAX {
            return error(ctx, c"ERR owner too long");
        }
        let key = open(ctx, argv[1]);
        raw::RedisModule_DeleteKey.unwrap()(key);
        let rc = if store(key, owner, token as u64, deadline) {
            raw::RedisModule_ReplyWithSimpleString.unwrap()(ctx, c"OK".as_ptr())
        } else {
            error(ctx, c"ERR store")
        };
        raw::RedisModule_CloseKey.unwrap()(key);
        rc
    }
}

extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    // SAFETY: the server passes a value of our type.
    let (owner, token, deadline) = unsafe { Value::read(value.cast()) };
    raw::save_slice(rdb, owner);
    raw::save_unsigned(rdb, token);
    raw::save_signed(rdb, deadline);
}

extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, _encver: c_int) -> *mut c_void {
    let (Ok(owner), Ok(token), Ok(deadline)) = (
        raw::load_string_buffer(rdb),
        raw::load_unsigned(rdb),
        raw::load_signed(rdb),
    ) else {
        return null_mut();
    };
    let owner = owner.as_ref();
    Value::alloc(&owner[..owner.len().min(OWNER_MAX)], token, deadline).cast()
}

extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    // SAFETY: the server passes a value of our type; the format matches the arguments.
    unsafe {
        let (owner, token, deadline) = Value::read(value.cast());
        raw::RedisModule_EmitAOF.unwrap()(
            aof,
            c"FLOOR.LOAD".as_ptr(),
            c"sbll".as_ptr(),
            key,
            owner.as_ptr().cast::<c_char>(),
            owner.len(),
            token as c_longlong,
            deadline as c_longlong,
        );
    }
}

extern "C" fn mem_usage(value: *const c_void) -> usize {
    // SAFETY: the server passes a value of our type.
    unsafe { Value::bytes(value.cast()).len() }
}

extern "C" fn free(value: *mut c_void) {
    // SAFETY: a value of our type came from Value::new and the server frees it once.
    unsafe { Value::free(value.cast()) };
}

#[no_mangle]
#[allow(non_snake_case)]
/// # Safety
/// Called once by the server with its load context.
pub unsafe extern "C" fn RedisModule_OnLoad(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    // No allocation before this: the allocator is the server's.
    if raw::Export_RedisModule_Init(
        ctx,
        c"lockfloor".as_ptr(),
        1,
        raw::REDISMODULE_APIVER_1 as c_int,
    ) != OK
    {
        return raw::REDISMODULE_ERR as c_int;
    }
    let mut methods = raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        mem_usage: Some(mem_usage),
        digest: None,
        free: Some(free),
        aux_load: None,
        aux_save: None,
        aux_save_triggers: 0,
        free_effort: None,
        unlink: None,
        copy: None,
        defrag: None,
        mem_usage2: None,
        free_effort2: None,
        unlink2: None,
        copy2: None,
        aux_save2: None,
    };
    let t = raw::RedisModule_CreateDataType.unwrap()(ctx, c"lockfloor".as_ptr(), 0, &mut methods);
    if t.is_null() {
        return raw::REDISMODULE_ERR as c_int;
    }
    TYPE.store(t, Relaxed);
    type Cmd =
        extern "C" fn(*mut raw::RedisModuleCtx, *mut *mut raw::RedisModuleString, c_int) -> c_int;
    let commands: [(&std::ffi::CStr, Cmd, &std::ffi::CStr); 3] = [
        (c"floor.acquire", acquire, c"write deny-oom fast"),
        (c"floor.release", release, c"write fast"),
        (c"floor.load", load, c"write deny-oom fast"),
    ];
    for (name, f, flags) in commands {
        if raw::RedisModule_CreateCommand.unwrap()(
            ctx,
            name.as_ptr(),
            Some(f),
            flags.as_ptr(),
            1,
            1,
            1,
        ) != OK
        {
            return raw::REDISMODULE_ERR as c_int;
        }
    }
    OK
}
