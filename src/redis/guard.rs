//! No panic may cross into the server: a Rust panic that unwinds into C aborts redis-server.
//! Every command handler and every callback the server calls goes through one of these.

use std::ffi::CStr;
use std::mem::MaybeUninit;
use std::os::raw::c_int;
use std::panic::{self, AssertUnwindSafe};

use redis_module::{logging, raw, Context, RedisError, RedisResult, RedisString, RedisValue};

/// Run a command handler; a panic becomes an `ERR` reply and a line in the server log.
pub fn command(
    ctx: &Context,
    args: Vec<RedisString>,
    handler: fn(&Context, Vec<RedisString>) -> RedisResult,
) -> RedisResult {
    let run = || {
        let result = handler(ctx, args);
        // The change feed's messages for what this command did, in order (one thread-local
        // read unless something was queued).
        crate::redis::feed::flush(ctx.ctx);
        result
    };
    match panic::catch_unwind(AssertUnwindSafe(run)) {
        Ok(result) => result,
        Err(payload) => {
            logging::log_warning(format!(
                "redis-lock: a command panicked ({}); the command was refused",
                describe(&payload)
            ));
            Err(RedisError::Str(
                "ERR internal error in redis-lock (see the server log)",
            ))
        }
    }
}

/// A hot command's arguments as the server passed them: no retained copies, no vector (see
/// [`raw_command`]). `raw[i]` and `bytes[i]` are the same argument; both live until the command
/// returns.
pub struct Args<'a> {
    pub raw: &'a [*mut raw::RedisModuleString],
    pub bytes: &'a [&'a [u8]],
}

/// A handler of the raw path.
pub type RawHandler = fn(&Context, &Args) -> RedisResult;

/// Arguments read in place up to this count (more go to a vector).
const INLINE_ARGS: usize = 16;

/// Run a command registered with [`create_command`] (the hot ones: `LOCK.ACQUIRE`,
/// `LOCK.RELEASE`): as [`command`], without the crate's wrapping, which retains and frees every
/// argument, collects them into a vector and replies through a general match (together about
/// 700 instructions of a 3,000-instruction share per acquire + release, by callgrind).
pub fn raw_command(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
    handler: RawHandler,
) -> c_int {
    let context = Context::new(ctx);
    let raw: &[*mut raw::RedisModuleString] = match argv.is_null() {
        true => &[],
        // SAFETY: the server passes argc live strings in argv, alive until the command returns.
        false => unsafe { std::slice::from_raw_parts(argv, argc.max(0) as usize) },
    };
    let mut inline = [MaybeUninit::<&[u8]>::uninit(); INLINE_ARGS];
    let spilled: Vec<&[u8]>;
    let bytes: &[&[u8]] = if raw.len() <= INLINE_ARGS {
        for (b, &s) in inline.iter_mut().zip(raw) {
            b.write(string_bytes(s));
        }
        // SAFETY: the first raw.len() elements were written just above (not zeroing the rest
        // saves a 128-byte memset per command).
        unsafe { std::slice::from_raw_parts(inline.as_ptr().cast::<&[u8]>(), raw.len()) }
    } else {
        spilled = raw.iter().map(|&s| string_bytes(s)).collect();
        &spilled
    };
    let args = Args { raw, bytes };
    let run = || {
        let result = handler(&context, &args);
        crate::redis::feed::flush(ctx);
        result
    };
    let result = panic::catch_unwind(AssertUnwindSafe(run)).unwrap_or_else(|payload| {
        logging::log_warning(format!(
            "redis-lock: a command panicked ({}); the command was refused",
            describe(&payload)
        ));
        Err(RedisError::Str(
            "ERR internal error in redis-lock (see the server log)",
        ))
    });
    // SAFETY (all three): ctx is the live context of the command being executed.
    match result {
        Ok(RedisValue::Integer(v)) => unsafe {
            raw::RedisModule_ReplyWithLongLong.unwrap()(ctx, v)
        },
        Ok(RedisValue::Null) => unsafe { raw::RedisModule_ReplyWithNull.unwrap()(ctx) },
        Ok(RedisValue::NoReply) => raw::REDISMODULE_OK as c_int,
        other => context.reply(other) as c_int,
    }
}

/// The bytes of a string the server passed us, valid while it lives.
fn string_bytes<'a>(s: *mut raw::RedisModuleString) -> &'a [u8] {
    let mut len = 0;
    // SAFETY: s is a live string of the current command; StringPtrLen returns its buffer and
    // length, which stay valid (unchanged) until the command returns.
    unsafe {
        let p = raw::RedisModule_StringPtrLen.unwrap()(s, &mut len);
        std::slice::from_raw_parts(p.cast::<u8>(), len)
    }
}

/// Register a command of the raw path: `f` is an `extern "C"` function that calls
/// [`raw_command`]. Key positions 1, 1, 1.
pub fn create_command(
    ctx: &Context,
    name: &CStr,
    f: extern "C" fn(*mut raw::RedisModuleCtx, *mut *mut raw::RedisModuleString, c_int) -> c_int,
    flags: &CStr,
) -> bool {
    // SAFETY: called from the module's load with its context; name and flags are C strings
    // the server copies.
    unsafe {
        raw::RedisModule_CreateCommand.unwrap()(
            ctx.ctx,
            name.as_ptr(),
            Some(f),
            flags.as_ptr(),
            1,
            1,
            1,
        ) == raw::REDISMODULE_OK as c_int
    }
}

/// A command function as the server calls it.
pub type CommandFn =
    extern "C" fn(*mut raw::RedisModuleCtx, *mut *mut raw::RedisModuleString, c_int) -> c_int;

/// Register `name` as a container of subcommands (no handler of its own, no keys), then each
/// of `subcommands`: (name, flags, key position: 0 for none). Each subcommand has its own
/// flags, key positions, ACL bit and `COMMAND DOCS` entry; the server answers an unknown one.
pub fn create_container(
    ctx: &Context,
    name: &CStr,
    f: CommandFn,
    subcommands: &[(&CStr, &CStr, c_int)],
) -> bool {
    // SAFETY: called from the module's load with its context; the strings are C strings the
    // server copies; a null handler makes the command a container (Redis 7.0+, Valkey).
    let created = unsafe {
        raw::RedisModule_CreateCommand.unwrap()(ctx.ctx, name.as_ptr(), None, c"".as_ptr(), 0, 0, 0)
            == raw::REDISMODULE_OK as c_int
    };
    // SAFETY: plain reads of function pointers filled in by RedisModule_Init.
    let (Some(get_command), Some(create_sub)) = (unsafe { raw::RedisModule_GetCommand }, unsafe {
        raw::RedisModule_CreateSubcommand
    }) else {
        return false;
    };
    // SAFETY: during load, a name registered just above.
    let parent = unsafe { get_command(ctx.ctx, name.as_ptr()) };
    if !created || parent.is_null() {
        return false;
    }
    subcommands.iter().all(|(sub, flags, key)| {
        // SAFETY: `parent` is our container, from GetCommand during load; the strings are
        // copied by the server.
        unsafe {
            create_sub(
                parent,
                sub.as_ptr(),
                Some(f),
                flags.as_ptr(),
                *key,
                *key,
                (*key > 0) as c_int,
            ) == raw::REDISMODULE_OK as c_int
        }
    })
}

/// Run a callback; a panic is logged and `fallback` returned.
pub fn callback<T>(what: &str, fallback: T, body: impl FnOnce() -> T) -> T {
    match panic::catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(payload) => {
            logging::log_warning(format!(
                "redis-lock: the {what} callback panicked ({})",
                describe(&payload)
            ));
            fallback
        }
    }
}

fn describe(payload: &Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_string())
}
