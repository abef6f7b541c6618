//! No panic may cross into the server: a Rust panic that unwinds into C aborts redis-server.
//! Every command handler and every callback the server calls goes through one of these.

use std::panic::{self, AssertUnwindSafe};

use redis_module::{logging, Context, RedisError, RedisResult, RedisString};

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
