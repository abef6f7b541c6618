//! ACL categories for the commands, where the server can set them.
//!
//! Seen on Redis 7.0.15, 8.2.3 and Valkey 8.1/9.1: a module command is in no ACL category at
//! all unless the module puts it in one, so `ACL SETUSER app +@write` does not let `app` take a
//! lock. The API arrived in steps, so each step is looked up at load and used when present:
//!
//! | server | what we can do |
//! |---|---|
//! | Redis 7.0 | nothing (`RedisModule_SetCommandACLCategories` is 7.2+): commands stay uncategorised |
//! | Redis 7.2, Valkey | the built-in categories (`@write`, `@read`, `@fast`, `@slow`, `@blocking`) |
//! | Redis 7.4+ | also a category of our own, `@lock` (`RedisModule_AddACLCategory`) |
//!
//! None of this is needed for the module to work, so a refusal is logged and loading goes on.

use std::ffi::{CStr, CString};

use redis_module::{raw, Context};

/// The category the module adds where the server allows it (`ACL CAT lock`).
pub const OWN_CATEGORY: &str = "lock";

/// Each command with its built-in categories, mirroring its command flags.
const COMMANDS: [(&CStr, &str); 22] = [
    (c"lock.acquire", "write fast blocking"),
    (c"lock.macquire", "write slow blocking"),
    (c"lock.mrelease", "write slow"),
    (c"lock.release", "write fast"),
    (c"lock.extend", "write fast"),
    (c"lock.fence", "read fast"),
    (c"lock.info", "read fast"),
    (c"lock.load", "write slow"),
    // Each subcommand has its own ACL bit and categories; the container has none.
    (c"lock.session|open", "write slow"),
    (c"lock.session|keepalive", "write slow"),
    (c"lock.session|close", "write slow"),
    (c"lock.session|attach", "write slow"),
    (c"lock.session|info", "read slow"),
    // Administrators only: in `@admin` and `@dangerous` and never in `@lock`, so that a user
    // granted `+@lock` cannot list or end other users' sessions.
    (c"lock.session|list", "read slow admin dangerous"),
    (c"lock.session|kill", "write slow admin dangerous"),
    // As the server's own HELP subcommands: `@slow` alone.
    (c"lock.session|help", "slow"),
    (c"lock.session|restore", "write slow"),
    (c"lock.session|renew", "write slow"),
    (c"lock.session|ended", "write slow"),
    (c"lock.waiting", "read slow"),
    (c"lock.watch", "write fast"),
    (c"lock.unwatch", "write fast"),
];

/// What the server let us do, for the load log line.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The server has no API for command categories (Redis 7.0).
    Unsupported,
    /// The built-in categories only.
    BuiltIn,
    /// The built-in categories and `@lock`.
    WithOwn,
}

/// Put every command in its categories. Must run during `RedisModule_OnLoad`, after the
/// commands are created.
pub fn categorise(ctx: &Context) -> Outcome {
    // SAFETY: plain reads of function pointers filled in by RedisModule_Init.
    let (Some(get_command), Some(set_categories)) =
        (unsafe { raw::RedisModule_GetCommand }, unsafe {
            raw::RedisModule_SetCommandACLCategories
        })
    else {
        return Outcome::Unsupported;
    };
    // SAFETY: as above.
    let own = match unsafe { raw::RedisModule_AddACLCategory } {
        // SAFETY: called during module load with the load context and a NUL-terminated name.
        Some(add) => (unsafe { add(ctx.ctx, c"lock".as_ptr()) }) == raw::REDISMODULE_OK as i32,
        None => false,
    };
    for (name, builtin) in COMMANDS {
        // SAFETY: called during module load with the load context and a registered name.
        let command = unsafe { get_command(ctx.ctx, name.as_ptr()) };
        if command.is_null() {
            continue;
        }
        let wanted = if own && !builtin.contains("admin") {
            format!("{builtin} {OWN_CATEGORY}")
        } else {
            builtin.to_string()
        };
        let Ok(wanted) = CString::new(wanted) else {
            continue;
        };
        // SAFETY: `command` came from GetCommand during load; the server copies the flags.
        if unsafe { set_categories(command, wanted.as_ptr()) } != raw::REDISMODULE_OK as i32 {
            ctx.log_warning(&format!(
                "redis-lock: the server refused ACL categories '{}' for {}",
                wanted.to_string_lossy(),
                name.to_string_lossy()
            ));
        }
    }
    if own {
        Outcome::WithOwn
    } else {
        Outcome::BuiltIn
    }
}

/// True when the calling user may also run `CLIENT KILL` (in `@admin` on every server): what
/// `LOCK.SESSION LIST` and `KILL` take as "an administrator". Checked in the command as well
/// as by the categories above, because Redis 7.0 puts module commands in no category (a user
/// given `+@all -@admin` there would otherwise pass), and because whoever may end any
/// connection with `CLIENT KILL` may already end any `BOUND` session that way.
pub fn is_admin(ctx: &Context) -> bool {
    // SAFETY: plain reads of function pointers filled in by RedisModule_Init.
    let (Some(check), Some(user_of), Some(free_user), Some(name_of)) = (
        unsafe { raw::RedisModule_ACLCheckCommandPermissions },
        unsafe { raw::RedisModule_GetModuleUserFromUserName },
        unsafe { raw::RedisModule_FreeModuleUser },
        unsafe { raw::RedisModule_GetCurrentUserName },
    ) else {
        return false;
    };
    // SAFETY: ctx is the live context of the executing command; the name string is ours and
    // freed below.
    let name = unsafe { name_of(ctx.ctx) };
    if name.is_null() {
        return false;
    }
    // SAFETY: `name` is a valid module string; a null user is handled below.
    let user = unsafe { user_of(name) };
    let args = [
        redis_module::RedisString::create(None, "CLIENT"),
        redis_module::RedisString::create(None, "KILL"),
    ];
    let mut argv: Vec<*mut raw::RedisModuleString> = args.iter().map(|a| a.inner).collect();
    let allowed = !user.is_null()
        // SAFETY: `user` came from GetModuleUserFromUserName and `argv` holds two live strings.
        && unsafe { check(user, argv.as_mut_ptr(), argv.len() as i32) }
            == raw::REDISMODULE_OK as i32;
    if !user.is_null() {
        // SAFETY: freed once, after its last use.
        unsafe { free_user(user) };
    }
    // SAFETY: the name came from GetCurrentUserName with this context; freed once.
    unsafe { raw::RedisModule_FreeString.unwrap()(ctx.ctx, name) };
    allowed
}

/// The calling user's read permission on keys, for commands that list key names the user did
/// not name (`LOCK.WAITING`): a key is shown only if the user could `LOCK.INFO` it. Looked up
/// once per command; the user is freed on drop.
pub struct KeyReader {
    user: *mut raw::RedisModuleUser,
}

impl KeyReader {
    /// The caller's permissions, or `None` when the server cannot check them (then show none).
    pub fn of_caller(ctx: &Context) -> Option<KeyReader> {
        // SAFETY: plain reads of function pointers filled in by RedisModule_Init.
        let (Some(user_of), Some(name_of), Some(_)) = (
            unsafe { raw::RedisModule_GetModuleUserFromUserName },
            unsafe { raw::RedisModule_GetCurrentUserName },
            unsafe { raw::RedisModule_ACLCheckKeyPermissions },
        ) else {
            return None;
        };
        // SAFETY: ctx is the live context of the executing command.
        let name = unsafe { name_of(ctx.ctx) };
        if name.is_null() {
            return None;
        }
        // SAFETY: `name` is a valid module string, freed right after.
        let user = unsafe { user_of(name) };
        // SAFETY: the name came from GetCurrentUserName with this context; freed once.
        unsafe { raw::RedisModule_FreeString.unwrap()(ctx.ctx, name) };
        (!user.is_null()).then_some(KeyReader { user })
    }

    /// True when the user may read `key` (`LOCK.INFO`'s access). The server takes only the
    /// operation flags here (`ACCESS`, `INSERT`, `DELETE`, `UPDATE`; `RO` is refused as an
    /// invalid flag, seen on Redis 7.0 and 8.2), and `ACCESS` is what `%R~` patterns grant.
    pub fn may_read(&self, key: &[u8]) -> bool {
        let key = redis_module::RedisString::create_from_slice(std::ptr::null_mut(), key);
        // SAFETY: `self.user` is live until drop; `key` is a live module string; the function
        // was checked present in `of_caller`.
        unsafe {
            raw::RedisModule_ACLCheckKeyPermissions.unwrap()(
                self.user,
                key.inner,
                raw::REDISMODULE_CMD_KEY_ACCESS as i32,
            ) == raw::REDISMODULE_OK as i32
        }
    }
}

impl Drop for KeyReader {
    fn drop(&mut self) {
        // SAFETY: the user came from GetModuleUserFromUserName and is freed once.
        unsafe { raw::RedisModule_FreeModuleUser.unwrap()(self.user) };
    }
}
