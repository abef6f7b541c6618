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
    /// True from the module's load until the first token is minted: a load from RDB or AOF
    /// in this window is the start-up load (see `redis::role`).
    static STARTING: Cell<bool> = const { Cell::new(true) };
}

/// `lock.failover-token-margin-ms`: how far ahead the token high-water mark jumps when this
/// server starts, loads its data from disk at start-up, or is promoted (see `TokenMint::skip_ahead`);
/// 0 disables the jump.
pub static FAILOVER_TOKEN_MARGIN_MS: AtomicI64 = AtomicI64::new(DEFAULT_FAILOVER_TOKEN_MARGIN_MS);
pub const DEFAULT_FAILOVER_TOKEN_MARGIN_MS: i64 = 60_000;

/// `lock.max-owner-bytes`: the longest owner string accepted.
pub static MAX_OWNER_BYTES: AtomicI64 = AtomicI64::new(DEFAULT_MAX_OWNER_BYTES);
pub const DEFAULT_MAX_OWNER_BYTES: i64 = 1024;

/// `lock.max-waiters`: the longest queue of blocked acquirers per key.
pub static MAX_WAITERS: AtomicI64 = AtomicI64::new(DEFAULT_MAX_WAITERS);
pub const DEFAULT_MAX_WAITERS: i64 = 10_000;

/// `lock.max-multi-keys`: the most keys one `LOCK.MACQUIRE` or `LOCK.MRELEASE` may name.
pub static MAX_MULTI_KEYS: AtomicI64 = AtomicI64::new(DEFAULT_MAX_MULTI_KEYS);
pub const DEFAULT_MAX_MULTI_KEYS: i64 = 64;

/// `lock.max-overtakes`: how many times a blocked `LOCK.MACQUIRE` set may be passed by a later
/// set whose keys are all free (`lock::multi`, bounded overtaking); 0 is strict arrival order.
pub static MAX_OVERTAKES: AtomicI64 = AtomicI64::new(crate::lock::DEFAULT_MAX_OVERTAKES as i64);

/// `lock.max-session-ttl-ms`: the longest session ttl a client may ask for (one day by
/// default: a session is renewed by its keepalive, so its ttl is the time to notice a dead
/// holder that did not disconnect, not the length of the work).
pub static MAX_SESSION_TTL_MS: AtomicI64 = AtomicI64::new(DEFAULT_MAX_SESSION_TTL_MS);
pub const DEFAULT_MAX_SESSION_TTL_MS: i64 = 86_400_000;

/// `lock.max-sessions`: open sessions on this server at once.
pub static MAX_SESSIONS: AtomicI64 = AtomicI64::new(DEFAULT_MAX_SESSIONS);
pub const DEFAULT_MAX_SESSIONS: i64 = 100_000;

/// `lock.max-session-holds`: holds one session may have at once.
pub static MAX_SESSION_HOLDS: AtomicI64 = AtomicI64::new(DEFAULT_MAX_SESSION_HOLDS);
pub const DEFAULT_MAX_SESSION_HOLDS: i64 = 100_000;

pub fn max_session_ttl_ms() -> Millis {
    MAX_SESSION_TTL_MS.load(Ordering::Relaxed).max(1)
}

pub fn max_sessions() -> usize {
    MAX_SESSIONS.load(Ordering::Relaxed).max(0) as usize
}

pub fn max_session_holds() -> usize {
    MAX_SESSION_HOLDS.load(Ordering::Relaxed).max(1) as usize
}

pub fn max_overtakes() -> u32 {
    MAX_OVERTAKES
        .load(Ordering::Relaxed)
        .clamp(0, u32::MAX as i64) as u32
}

pub fn max_multi_keys() -> usize {
    MAX_MULTI_KEYS.load(Ordering::Relaxed).max(1) as usize
}

pub fn max_owner_bytes() -> usize {
    MAX_OWNER_BYTES.load(Ordering::Relaxed).max(1) as usize
}

pub fn max_waiters() -> usize {
    MAX_WAITERS.load(Ordering::Relaxed).max(0) as usize
}

pub fn failover_token_margin_ms() -> Millis {
    FAILOVER_TOKEN_MARGIN_MS.load(Ordering::Relaxed).max(0)
}

/// Mint a new fencing token.
pub fn next_token(now: Millis) -> u64 {
    STARTING.with(|s| s.set(false));
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

/// True until the first token of this process is minted.
pub fn starting() -> bool {
    STARTING.with(Cell::get)
}

/// Jump the high-water mark ahead by `lock.failover-token-margin-ms` (at the module's load,
/// after the start-up load from disk, on promotion). False when the jump was cut short at the
/// ceiling below 2^53.
pub fn skip_ahead(now: Millis) -> bool {
    let margin = failover_token_margin_ms();
    MINT.with(|m| {
        let mut mint = m.take();
        let whole = mint.skip_ahead(now, margin);
        m.set(mint);
        whole
    })
}
