//! redis-lock: distributed locks as native Redis commands.
//!
//! `LOCK.ACQUIRE`, `LOCK.RELEASE`, `LOCK.EXTEND` and `LOCK.FENCE` check ownership and the
//! deadline inside the server, mint monotonic fencing tokens, and queue blocked acquirers per
//! key so the lock is handed to the next one the moment it is free. `LOCK.MACQUIRE` and
//! `LOCK.MRELEASE` take and give back several keys in one step, all or none.
//!
//! # Layout
//! - `lock`: the state machine (holds, deadlines, tokens, waiter queues). Pure Rust; every
//!   function takes `now`, so unit tests choose the clock.
//! - `parse`: arguments to typed structs; nothing changes before parsing succeeds.
//! - `error`: the one error type; every message starts with its Redis error code.
//! - `commands`: one file per command, parse then apply. No `unsafe`.
//! - `redis`: the FFI boundary (keys, data type, blocking, panic guard). All `unsafe` is here.
//! - `state`: module-wide token mint and configuration values.
//!
//! This file only registers things with the server.

mod commands;
pub mod error;
pub mod lock;
pub mod parse;
mod redis;
mod state;
pub mod stats;

#[cfg(test)]
mod fuzz_tests;

mod module {
    use std::os::raw::c_int;

    use redis_module::{raw, redis_module, Context, InfoContext, RedisResult, RedisString, Status};

    use crate::commands::{
        acquire, extend, fence, info, load, macquire, mrelease, release, session, waiting, watch,
    };
    use crate::redis::session as sessions;
    use crate::redis::{acl, asm, blocking, config, datatype::LOCK_TYPE, docs, guard, role};

    fn init(ctx: &Context, args: &[RedisString]) -> Status {
        if !config::server_supported() {
            ctx.log_warning(
                "redis-lock needs Redis 7.0 or later (or Valkey 7.2+): this server lacks module \
                 configs or the blocking API; the module is not loaded",
            );
            return Status::Err;
        }
        if let Err(e) = config::register(ctx, args) {
            ctx.log_warning(&format!("redis-lock: {e}; the module is not loaded"));
            return Status::Err;
        }
        // Valkey 9+ also gets the atomic slot migration bit (see `asm` for what that asks).
        let options = asm::module_options(ctx, raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS as i32);
        // SAFETY: called once from RedisModule_OnLoad with the load context.
        unsafe { raw::RedisModule_SetModuleOptions.unwrap()(ctx.ctx, options) };
        // The hot commands take the raw path (guard::raw_command); the rest are the macro's.
        if !guard::create_command(ctx, c"lock.acquire", lock_acquire, c"write deny-oom fast")
            || !guard::create_command(ctx, c"lock.release", lock_release, c"write fast")
        {
            ctx.log_warning("redis-lock: could not create LOCK.ACQUIRE and LOCK.RELEASE");
            return Status::Err;
        }
        for doc in [
            &acquire::DOC,
            &release::DOC,
            &extend::DOC,
            &fence::DOC,
            &info::DOC,
            &load::DOC,
            &watch::DOC,
            &watch::UNWATCH_DOC,
        ] {
            if !docs::set(ctx, doc) {
                ctx.log_notice(&format!(
                    "redis-lock: no COMMAND DOCS for {} (needs Redis 7.0+)",
                    doc.name.to_string_lossy()
                ));
            }
        }
        // LOCK.SESSION is a container of real subcommands, each with its own key spec (see
        // commands::session for why the id is a NOT_KEY key).
        let subcommands: Vec<_> = session::SUBCOMMANDS
            .iter()
            .map(|s| {
                let key = if s.keys == docs::Keys::SessionId {
                    2
                } else {
                    0
                };
                (s.name, s.flags, key)
            })
            .collect();
        if !guard::create_container(ctx, c"lock.session", lock_session, &subcommands) {
            ctx.log_warning("redis-lock: could not create LOCK.SESSION and its subcommands");
            return Status::Err;
        }
        if !docs::set_with_keys(ctx, &session::DOC, docs::Keys::None) {
            ctx.log_notice("redis-lock: no COMMAND DOCS for lock.session (needs Redis 7.0+)");
        }
        for sub in &session::SUBCOMMANDS {
            // Without its key spec a subcommand with an id would be routed by the legacy
            // range alone (the same position) but shown as keyless in COMMAND INFO.
            if !docs::set_with_keys(ctx, &sub.doc, sub.keys) {
                ctx.log_notice(&format!(
                    "redis-lock: no COMMAND DOCS for {} (needs Redis 7.0+)",
                    sub.doc.name.to_string_lossy()
                ));
            }
        }
        if !docs::set_with_keys(ctx, &waiting::DOC, docs::Keys::None) {
            ctx.log_notice("redis-lock: no COMMAND DOCS for lock.waiting (needs Redis 7.0+)");
        }
        for doc in [&macquire::DOC, &mrelease::DOC] {
            // Without key specs the server cannot find these commands' keys (cluster routing,
            // ACL checks): refuse to load rather than run them unchecked.
            if !docs::set_with_keys(ctx, doc, docs::Keys::Counted) {
                ctx.log_warning(&format!(
                    "redis-lock: could not set the key specs of {}; the module is not loaded",
                    doc.name.to_string_lossy()
                ));
                return Status::Err;
            }
        }
        match acl::categorise(ctx) {
            acl::Outcome::Unsupported => ctx.log_notice(
                "redis-lock: commands are in no ACL category (this server cannot set them; \
                 Redis 7.2+ can)",
            ),
            acl::Outcome::BuiltIn => ctx.log_notice(
                "redis-lock: commands are in the built-in ACL categories (@write, @read, @fast, \
                 ...); no @lock category (needs Redis 7.4+)",
            ),
            acl::Outcome::WithOwn => {}
        }
        if !blocking::subscribe(ctx)
            || !role::subscribe(ctx)
            || !sessions::subscribe(ctx)
            || !asm::subscribe(ctx)
        {
            ctx.log_warning("redis-lock: could not subscribe to keyspace and server events");
            return Status::Err;
        }
        blocking::note_server(ctx);
        role::started(ctx);
        Status::Ok
    }

    extern "C" fn lock_acquire(
        ctx: *mut raw::RedisModuleCtx,
        argv: *mut *mut raw::RedisModuleString,
        argc: c_int,
    ) -> c_int {
        guard::raw_command(ctx, argv, argc, acquire::run)
    }
    extern "C" fn lock_release(
        ctx: *mut raw::RedisModuleCtx,
        argv: *mut *mut raw::RedisModuleString,
        argc: c_int,
    ) -> c_int {
        guard::raw_command(ctx, argv, argc, release::run)
    }
    fn lock_extend(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
        guard::command(ctx, args, extend::run)
    }
    fn lock_fence(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
        guard::command(ctx, args, fence::run)
    }
    fn lock_info(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
        guard::command(ctx, args, info::run)
    }
    #[linkme::distributed_slice(redis_module::server_events::INFO_COMMAND_HANDLER_LIST)]
    fn info_lock(ctx: &InfoContext, _for_crash_report: bool) -> RedisResult<()> {
        guard::callback("INFO", (), || {
            info::info_section(ctx);
        });
        Ok(())
    }
    fn lock_load(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
        guard::command(ctx, args, load::run)
    }
    fn lock_macquire(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
        guard::command(ctx, args, macquire::run)
    }
    fn lock_mrelease(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
        guard::command(ctx, args, mrelease::run)
    }
    extern "C" fn lock_session(
        ctx: *mut raw::RedisModuleCtx,
        argv: *mut *mut raw::RedisModuleString,
        argc: c_int,
    ) -> c_int {
        let context = Context::new(ctx);
        let args = redis_module::decode_args(ctx, argv, argc);
        let reply = guard::command(&context, args, session::run);
        context.reply(reply) as c_int
    }
    fn lock_waiting(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
        guard::command(ctx, args, waiting::run)
    }
    fn lock_watch(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
        guard::command(ctx, args, watch::run)
    }
    fn lock_unwatch(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
        guard::command(ctx, args, watch::run_unwatch)
    }

    // Unit tests run outside Redis, where the Redis allocator does not exist.
    #[cfg(not(test))]
    type Allocator = redis_module::alloc::RedisAlloc;
    #[cfg(test)]
    type Allocator = std::alloc::System;
    #[cfg(not(test))]
    const ALLOCATOR: Allocator = redis_module::alloc::RedisAlloc;
    #[cfg(test)]
    const ALLOCATOR: Allocator = std::alloc::System;

    // ACL categories are left empty here: the macro's mandatory categories need Redis 7.2
    // and the module must load on 7.0. `acl::categorise` sets them at load where it can.
    redis_module! {
        name: "lock",
        version: 1,
        allocator: (Allocator, ALLOCATOR),
        data_types: [LOCK_TYPE],
        init: init,
        commands: [
            // lock.acquire and lock.release are created in `init` (the raw path).
            ["lock.extend", lock_extend, "write fast", 1, 1, 1, ""],
            ["lock.fence", lock_fence, "readonly fast", 1, 1, 1, ""],
            ["lock.info", lock_info, "readonly fast", 1, 1, 1, ""],
            ["lock.load", lock_load, "write", 1, 1, 1, ""],
            // Key positions 0, 0, 0: the keys follow numkeys. The key specs set in `init`
            // (docs::Keys::Counted) and the getkeys-api callback tell the server where.
            ["lock.macquire", lock_macquire, "write deny-oom getkeys-api", 0, 0, 0, ""],
            ["lock.mrelease", lock_mrelease, "write getkeys-api", 0, 0, 0, ""],
            // lock.session (a container of subcommands) is created in `init`.
            // Keyless: it lists the keys with waiters the caller may read (commands::waiting).
            ["lock.waiting", lock_waiting, "readonly", 0, 0, 0, ""],
            ["lock.watch", lock_watch, "write fast", 1, 1, 1, ""],
            ["lock.unwatch", lock_unwatch, "write fast", 1, 1, 1, ""],
        ],
    }
}
