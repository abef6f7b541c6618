//! Module-wide state: the token mint and the configuration values.
//!
//! Why thread-locals: every callback that touches this state runs on the server's main thread
//! (or, for `aux_save` during `BGSAVE`, on the main thread of the forked child), so a `Cell` is
//! enough and a lock would only add cost to every grant.

use std::cell::Cell;
use std::sync::atomic::{AtomicI64, Ordering};

use crate::lock::{Millis, TokenMint};

thread_local! {
    static MINT: Cell<TokenMint> = const { Cell::new(TokenMint::new()) };
}

/// `lock.max-owner-bytes`: the longest owner string accepted.
pub static MAX_OWNER_BYTES: AtomicI64 = AtomicI64::new(DEFAULT_MAX_OWNER_BYTES);
pub const DEFAULT_MAX_OWNER_BYTES: i64 = 1024;

/// `lock.max-waiters`: the longest queue of blocked acquirers per key.
pub static MAX_WAITERS: AtomicI64 = AtomicI64::new(DEFAULT_MAX_WAITERS);
pub const DEFAULT_MAX_WAITERS: i64 = 10_000;

/// `lock.max-multi-keys`: the most keys one `LOCK.MACQUIRE` or `LOCK.MRELEASE` may name.
pub static MAX_MULTI_KEYS: AtomicI64 = AtomicI64::new(DEFAULT_MAX_MULTI_KEYS);
pub const DEFAULT_MAX_MULTI_KEYS: i64 = 64;

pub fn max_multi_keys() -> usize {
    MAX_MULTI_KEYS.load(Ordering::Relaxed).max(1) as usize
}

pub fn max_owner_bytes() -> usize {
    MAX_OWNER_BYTES.load(Ordering::Relaxed).max(1) as usize
}

pub fn max_waiters() -> usize {
    MAX_WAITERS.load(Ordering::Relaxed).max(0) as usize
}

/// Mint a new fencing token.
pub fn next_token(now: Millis) -> u64 {
    MINT.with(|m| {
        let mut mint = m.take();
        let token = mint.next(now);
        m.set(mint);
        token
    })
}

/// Raise the high-water mark to a token seen in a load, replication or AOF.
pub fn observe_token(token: u64) {
    MINT.with(|m| {
        let mut mint = m.take();
        mint.observe(token);
        m.set(mint);
    })
}

pub fn token_high_water() -> u64 {
    MINT.with(|m| {
        let mint = m.take();
        let hw = mint.high_water();
        m.set(mint);
        hw
    })
}
