//! Module-wide state: the token mint and the configuration values.
//!
//! Why `Relaxed` atomics: every callback that touches this state runs on the server's main
//! thread (or, for `aux_save` during `BGSAVE`, on the main thread of the forked child), so no
//! ordering and no lock is needed, and a plain static is cheaper to read from a `cdylib` than a
//! thread-local (which calls `__tls_get_addr`).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use crate::lock::{Millis, TokenMint};

/// The token mint's high-water mark (see [`with_mint`]).
static HIGH_WATER: AtomicU64 = AtomicU64::new(0);
/// True from the module's load until the first token is minted: a load from RDB or AOF
/// in this window is the start-up load (see `redis::role`).
static STARTING: AtomicBool = AtomicBool::new(true);

/// Run `f` on the token mint. The mint is its high-water mark alone, kept in an atomic rather
/// than a thread-local only because a static is cheaper to read from a `cdylib` (a thread-local
/// read calls `__tls_get_addr`); one thread touches it at a time (see the module doc), so
/// `Relaxed` loads and stores are all the ordering it needs.
fn with_mint<R>(f: impl FnOnce(&mut TokenMint) -> R) -> R {
    let mut mint = TokenMint::new();
    mint.observe(HIGH_WATER.load(Ordering::Relaxed));
    let result = f(&mut mint);
    HIGH_WATER.store(mint.high_water(), Ordering::Relaxed);
    result
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
    STARTING.store(false, Ordering::Relaxed);
    with_mint(|mint| mint.next(now))
}

/// Raise the high-water mark to a token seen in a load, replication or AOF. False, and the
/// mark unchanged, for a token at or above 2^53: the module never mints one, so it can only
/// come from a forged `DUMP` (restored before restores were checked, or edited on disk), and
/// following it would leave every later grant at one saturated token (the caller logs it).
pub fn observe_token(token: u64) -> bool {
    if token >= crate::lock::EXACT_NUMBER_LIMIT {
        return false;
    }
    with_mint(|mint| mint.observe(token));
    true
}

pub fn token_high_water() -> u64 {
    HIGH_WATER.load(Ordering::Relaxed)
}

/// True until the first token of this process is minted.
pub fn starting() -> bool {
    STARTING.load(Ordering::Relaxed)
}

/// Jump the high-water mark ahead by `lock.failover-token-margin-ms` (at the module's load,
/// after the start-up load from disk, on promotion). False when the jump was cut short at the
/// ceiling below 2^53.
pub fn skip_ahead(now: Millis) -> bool {
    let margin = failover_token_margin_ms();
    with_mint(|mint| mint.skip_ahead(now, margin))
}
