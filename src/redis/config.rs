//! Module configuration: `lock.*` values for `CONFIG GET/SET`, `redis.conf` and `loadmodule`
//! arguments.
//!
//! Why not the crate's `configurations:` block: it unwraps `RedisModule_RegisterNumericConfig`,
//! so on a server without module configs (before 7.0) it aborts the server instead of refusing
//! to load. Registering here lets `init` check first and refuse with one clear log line.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_longlong, c_void};
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};

use redis_module::{raw, Context, RedisString};

use crate::state;

/// One numeric setting, stored in an atomic the rest of the module reads.
pub struct Numeric {
    /// Name without the `lock.` prefix, as `loadmodule` arguments spell it.
    pub name: &'static CStr,
    pub value: &'static AtomicI64,
    pub min: i64,
    pub max: i64,
}

pub static SETTINGS: [Numeric; 8] = [
    Numeric {
        name: c"max-owner-bytes",
        value: &state::MAX_OWNER_BYTES,
        min: 1,
        max: 1 << 20,
    },
    Numeric {
        name: c"max-waiters",
        value: &state::MAX_WAITERS,
        min: 0,
        max: 10_000_000,
    },
    Numeric {
        name: c"max-multi-keys",
        value: &state::MAX_MULTI_KEYS,
        min: 1,
        max: 100_000,
    },
    Numeric {
        name: c"max-overtakes",
        value: &state::MAX_OVERTAKES,
        min: 0,
        max: 1_000,
    },
    Numeric {
        name: c"max-session-ttl-ms",
        value: &state::MAX_SESSION_TTL_MS,
        min: 1,
        max: 100_000_000_000,
    },
    Numeric {
        name: c"max-sessions",
        value: &state::MAX_SESSIONS,
        min: 0,
        max: 100_000_000,
    },
    Numeric {
        name: c"max-session-holds",
        value: &state::MAX_SESSION_HOLDS,
        min: 1,
        max: 100_000_000,
    },
    Numeric {
        name: c"failover-token-margin-ms",
        value: &state::FAILOVER_TOKEN_MARGIN_MS,
        min: 0,
        max: crate::lock::MAX_MARGIN,
    },
];

/// The server has what this module needs (module configs and the blocking API came in 7.0).
pub fn server_supported() -> bool {
    // SAFETY: plain reads of function pointers that RedisModule_Init filled in (or left null).
    unsafe {
        let (numeric, load) = (
            raw::RedisModule_RegisterNumericConfig,
            raw::RedisModule_LoadConfigs,
        );
        let (block, disconnect, events) = (
            raw::RedisModule_BlockClient,
            raw::RedisModule_SetDisconnectCallback,
            raw::RedisModule_SubscribeToServerEvent,
        );
        numeric.is_some()
            && load.is_some()
            && block.is_some()
            && disconnect.is_some()
            && events.is_some()
    }
}

/// Apply `loadmodule` arguments (`name value` pairs), then register every setting and let the
/// server apply `lock.*` lines from its config file.
pub fn register(ctx: &Context, args: &[RedisString]) -> Result<(), String> {
    if !args.len().is_multiple_of(2) {
        return Err("module arguments must be name value pairs".into());
    }
    for pair in args.chunks(2) {
        let name = pair[0].to_string_lossy();
        let name = name.strip_prefix("lock.").unwrap_or(&name);
        let setting = SETTINGS
            .iter()
            .find(|s| s.name.to_bytes() == name.as_bytes())
            .ok_or_else(|| format!("unknown module argument '{name}'"))?;
        let value: i64 = pair[1]
            .to_string_lossy()
            .parse()
            .ok()
            .filter(|v| (setting.min..=setting.max).contains(v))
            .ok_or_else(|| {
                format!(
                    "module argument {name} must be an integer from {} to {}",
                    setting.min, setting.max
                )
            })?;
        setting.value.store(value, Relaxed);
    }
    for setting in &SETTINGS {
        // SAFETY: registration during module load; `setting` is a static, so the private
        // data pointer stays valid for the life of the process.
        let rc = unsafe {
            raw::RedisModule_RegisterNumericConfig.unwrap()(
                ctx.ctx,
                setting.name.as_ptr(),
                setting.value.load(Relaxed),
                raw::REDISMODULE_CONFIG_DEFAULT,
                setting.min,
                setting.max,
                Some(get),
                Some(set),
                None,
                (setting as *const Numeric).cast_mut().cast(),
            )
        };
        if rc != raw::REDISMODULE_OK as c_int {
            return Err(format!(
                "could not register lock.{}",
                setting.name.to_string_lossy()
            ));
        }
    }
    // SAFETY: called once, after every setting is registered, as the API requires.
    if unsafe { raw::RedisModule_LoadConfigs.unwrap()(ctx.ctx) } != raw::REDISMODULE_OK as c_int {
        return Err("the lock.* settings in the server configuration are invalid".into());
    }
    Ok(())
}

extern "C" fn get(_name: *const c_char, privdata: *mut c_void) -> c_longlong {
    // SAFETY: privdata is the &'static Numeric passed at registration.
    let setting = unsafe { &*privdata.cast::<Numeric>() };
    setting.value.load(Relaxed)
}

extern "C" fn set(
    _name: *const c_char,
    value: c_longlong,
    privdata: *mut c_void,
    _err: *mut *mut raw::RedisModuleString,
) -> c_int {
    // SAFETY: as in `get`. The server already checked min and max.
    let setting = unsafe { &*privdata.cast::<Numeric>() };
    setting.value.store(value, Relaxed);
    raw::REDISMODULE_OK as c_int
}
