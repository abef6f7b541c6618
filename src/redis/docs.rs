//! Command metadata for `COMMAND DOCS` and `COMMAND INFO`: summary, complexity, arity, key
//! specs and arguments, so `redis-cli` shows hints and tools can discover the commands.
//!
//! `RedisModule_SetCommandInfo` exists since Redis 7.0. The server reads the argument and key
//! spec arrays using the sizes we declare in the version struct, so describing our own layout
//! (from the crate's bindings) is safe on servers whose structs are smaller or larger.

use std::ffi::CStr;
use std::os::raw::c_int;

use redis_module::{raw, Context};

/// One argument as `COMMAND DOCS` shows it.
pub struct Arg {
    pub name: &'static CStr,
    pub kind: raw::RedisModuleCommandArgType,
    /// The literal keyword before the value (`BLOCK`), if any.
    pub token: Option<&'static CStr>,
    pub optional: bool,
}

/// One command's documentation.
pub struct Doc {
    pub name: &'static CStr,
    pub summary: &'static CStr,
    pub complexity: &'static CStr,
    /// Redis arity: positive is exact, negative is a minimum (both count the command name).
    pub arity: c_int,
    /// `REDISMODULE_CMD_KEY_*` flags of the key at position 1.
    pub key_flags: u32,
    pub args: &'static [Arg],
}

pub const STRING: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING;
pub const INTEGER: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER;
pub const KEY: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY;
/// A keyword with no value (`SHARED`).
pub const PURE_TOKEN: raw::RedisModuleCommandArgType =
    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN;

impl Arg {
    /// A required argument.
    pub const fn required(name: &'static CStr, kind: raw::RedisModuleCommandArgType) -> Arg {
        Arg {
            name,
            kind,
            token: None,
            optional: false,
        }
    }
}

/// The arguments most commands share.
pub const KEY_ARG: Arg = Arg::required(c"key", KEY);
pub const OWNER_ARG: Arg = Arg::required(c"owner", STRING);
pub const TTL_ARG: Arg = Arg::required(c"ttl-ms", INTEGER);
pub const SHARED_ARG: Arg = Arg {
    name: c"shared",
    kind: PURE_TOKEN,
    token: Some(c"SHARED"),
    optional: true,
};
pub const SESSION_ARG: Arg = Arg {
    name: c"session-id",
    kind: STRING,
    token: Some(c"SESSION"),
    optional: true,
};
pub const LIMIT_ARG: Arg = Arg {
    name: c"limit",
    kind: INTEGER,
    token: Some(c"LIMIT"),
    optional: true,
};
/// The key count of a multi-key command; the `key` argument after it repeats.
pub const NUMKEYS_ARG: Arg = Arg::required(c"numkeys", INTEGER);

/// Where a command's keys are.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Keys {
    /// Exactly one key, at argument 1.
    One,
    /// `numkeys key [key ...]` from argument 1, as `LMPOP` and `ZUNIONSTORE` have them: the
    /// server reads the count, so `COMMAND GETKEYS`, ACL key checks and cluster routing
    /// (`CROSSSLOT`) see every key.
    Counted,
    /// A `LOCK.SESSION` subcommand's session id, at argument 2. Flagged `NOT_KEY` (see
    /// `commands::session`): the server routes the command by it in a cluster (the legacy key
    /// range it derives from this one spec), while ACL key checks and `COMMAND GETKEYS` skip it.
    SessionId,
    /// No keys at all (`LOCK.SESSION OPEN` and the internal subcommands).
    None,
}

/// The version we publish the module's commands under (`since` in `COMMAND DOCS`).
const SINCE: &CStr = c"0.1.0";

/// Attach `doc` to its registered command. Returns false when the server lacks the API
/// (older than 7.0) or refuses the description; the command works either way.
pub fn set(ctx: &Context, doc: &Doc) -> bool {
    set_with_keys(ctx, doc, Keys::One)
}

/// As [`set`], for a command whose keys are laid out as `keys` says.
pub fn set_with_keys(ctx: &Context, doc: &Doc, keys: Keys) -> bool {
    // SAFETY: plain reads of function pointers filled in by RedisModule_Init.
    let (Some(get_command), Some(set_info)) = (unsafe { raw::RedisModule_GetCommand }, unsafe {
        raw::RedisModule_SetCommandInfo
    }) else {
        return false;
    };
    // SAFETY: called during module load with the load context and a registered name.
    let command = unsafe { get_command(ctx.ctx, doc.name.as_ptr()) };
    if command.is_null() {
        return false;
    }
    // Arrays end with a zeroed entry; Redis copies what it keeps, and the rest lives until
    // this function returns.
    let args = raw_args(doc.args, keys);
    let mut key_specs = [key_spec(doc.key_flags, keys), zeroed_key_spec()];
    if keys == Keys::None {
        key_specs[0] = zeroed_key_spec();
    }
    let version = raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
    };
    let info = raw::RedisModuleCommandInfo {
        version: &version,
        summary: doc.summary.as_ptr(),
        complexity: doc.complexity.as_ptr(),
        since: SINCE.as_ptr(),
        history: std::ptr::null_mut(),
        tips: std::ptr::null(),
        arity: doc.arity,
        key_specs: key_specs.as_mut_ptr(),
        args: args.as_ptr().cast_mut(),
    };
    // SAFETY: every pointer in `info` points into data that outlives this call.
    unsafe { set_info(command, &info) == raw::REDISMODULE_OK as c_int }
}

fn raw_args(args: &[Arg], keys: Keys) -> Vec<raw::RedisModuleCommandArg> {
    let mut array: Vec<raw::RedisModuleCommandArg> = args
        .iter()
        .map(|a| raw::RedisModuleCommandArg {
            name: a.name.as_ptr(),
            type_: a.kind,
            key_spec_index: if a.kind == KEY { 0 } else { -1 },
            token: a.token.map_or(std::ptr::null(), CStr::as_ptr),
            summary: std::ptr::null(),
            since: std::ptr::null(),
            flags: match (a.optional, a.kind == KEY && keys == Keys::Counted) {
                (true, _) => raw::REDISMODULE_CMD_ARG_OPTIONAL as c_int,
                (false, true) => raw::REDISMODULE_CMD_ARG_MULTIPLE as c_int,
                (false, false) => 0,
            },
            deprecated_since: std::ptr::null(),
            subargs: std::ptr::null_mut(),
            display_text: std::ptr::null(),
        })
        .collect();
    // SAFETY: the C API ends argument arrays with an all-zero entry.
    array.push(unsafe { std::mem::zeroed() });
    array
}

/// The search starts at argument 1: the key itself, or the key count (then the keys follow it,
/// one every argument).
fn key_spec(flags: u32, keys: Keys) -> raw::RedisModuleCommandKeySpec {
    let mut spec = raw::RedisModuleCommandKeySpec {
        notes: std::ptr::null(),
        flags: flags as u64,
        begin_search_type: raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX,
        bs: raw::RedisModuleCommandKeySpec__bindgen_ty_1 {
            index: raw::RedisModuleCommandKeySpec__bindgen_ty_1__bindgen_ty_1 { pos: 1 },
        },
        find_keys_type: raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE,
        fk: raw::RedisModuleCommandKeySpec__bindgen_ty_2 {
            range: raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_1 {
                lastkey: 0,
                keystep: 1,
                limit: 0,
            },
        },
    };
    if keys == Keys::SessionId {
        spec.bs = raw::RedisModuleCommandKeySpec__bindgen_ty_1 {
            index: raw::RedisModuleCommandKeySpec__bindgen_ty_1__bindgen_ty_1 { pos: 2 },
        };
    }
    if keys == Keys::Counted {
        spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_KEYNUM;
        spec.fk = raw::RedisModuleCommandKeySpec__bindgen_ty_2 {
            keynum: raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_2 {
                keynumidx: 0,
                firstkey: 1,
                keystep: 1,
            },
        };
    }
    spec
}

fn zeroed_key_spec() -> raw::RedisModuleCommandKeySpec {
    // SAFETY: the C API ends key spec arrays with an all-zero entry.
    unsafe { std::mem::zeroed() }
}
