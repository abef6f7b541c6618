//! What a `RESTORE` may load: the rules that keep fencing tokens out of a client's hands.
//!
//! A `DUMP` payload is bytes a client can edit (the checksum is not a signature), and the
//! target side of a `MIGRATE` is an ordinary `RESTORE`. Two things must never follow from one:
//! - **the server's mint exhausted**: every loaded token raises the server-wide high-water mark
//!   (a restored key's next grant must exceed it), so a token near 2^64 would make every later
//!   grant on every key saturate at the same value. Restored tokens are bounded by
//!   [`restore_limit`];
//! - **a key's tokens moving backwards**: `RESTORE ... REPLACE` of an older dump over a newer
//!   lock would hand out a token lower than one already issued for that key (the reason `COPY`
//!   is refused). Restored holds are checked against the key's current value by [`check`].
//!
//! The loads that must always work (start-up RDB/AOF, a replica's full sync, `DEBUG RELOAD`,
//! the replication stream) are not checked here: they replay what this server or its primary
//! decided. There only the mint's own bound applies (`TokenMint::observe` ignores tokens at or
//! above 2^53).

use super::{Hold, Lock, Millis, TokenMint, EXACT_NUMBER_LIMIT, RAISE_CEILING};

/// How far ahead of this server's clock a restored token may be: 7 days of clock, in tokens
/// (`7 * 86_400_000 << CLOCK_SHIFT`, about 1.2e12).
///
/// Why 7 days: a `MIGRATE` carries tokens the source minted, which are at most
/// `max(floor(source clock), source high-water mark)`. The source's clock differs from ours by
/// the skew between nodes (seconds at worst under NTP); its mark runs ahead of its clock only
/// through `TokenMint::skip_ahead` jumps at start-up and promotion, each of at most
/// `lock.failover-token-margin-ms` (60 s by default, one day at most), and jumps further apart
/// than the margin do not add up. So 7 days covers a node that was restarted or promoted a
/// few times in a row with the largest margin, or thousands of times with the default one,
/// plus any skew NTP lets through.
///
/// Why it costs nothing to keep: the limit is measured from the clock, not from the mark a
/// restore can raise, so restoring again and again cannot ratchet the mark: it stays at most
/// 7 days of clock ahead, which the clock catches up with, and the room below 2^53 (the year
/// 2109 at 2^11 tokens per ms) shrinks by 7 days, not by the number of restores.
pub const RESTORE_AHEAD_MS: Millis = 7 * 86_400_000;

/// The largest token a `RESTORE` may carry at `now`, with the mint at `high_water`: up to
/// [`RESTORE_AHEAD_MS`] of clock ahead (never past [`RAISE_CEILING`], where the mint's own
/// jumps stop), or up to the mark itself (a token at or below it moves nothing), and never
/// 2^53 or above (no client number type holds it exactly, and the module never mints it).
pub fn restore_limit(now: Millis, high_water: u64) -> u64 {
    let by_clock = TokenMint::floor(now.saturating_add(RESTORE_AHEAD_MS)).min(RAISE_CEILING);
    by_clock.max(high_water).min(EXACT_NUMBER_LIMIT - 1)
}

/// Why a restore is refused. `Display` is the server log line's rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A token above [`restore_limit`].
    TokenOutOfRange { token: u64, limit: u64 },
    /// A hold that is not in the key's current value has a token at or below the current
    /// value's highest.
    TokenBackwards { token: u64, current: u64 },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::TokenOutOfRange { token, limit } => write!(
                f,
                "token {token} is above the largest a restore may carry now ({limit}: \
                 7 days of clock ahead of this server, or its high-water mark)"
            ),
            Refusal::TokenBackwards { token, current } => write!(
                f,
                "token {token} is not above the key's current token {current} \
                 (a restore may not move a key's tokens backwards)"
            ),
        }
    }
}

/// May `restored` replace `current` (the key's value now, `None` when the key is absent or
/// holds another type) at `now`, with the mint at `high_water`?
///
/// A hold of `restored` that `current` already has (same owner, same token: a dump of this
/// very value) changes nothing and is allowed. Any other hold is a grant the key has not seen:
/// its token must be above every token of `current`, live or expired (an expired holder's
/// token was issued too). Why refuse rather than raise the token to the next one: the dump's
/// holder knows its token from its grant and fences with it; a rewritten token would be one no
/// client was ever given.
pub fn check(
    restored: &[Hold],
    current: Option<&Lock>,
    now: Millis,
    high_water: u64,
) -> Result<(), Refusal> {
    let limit = restore_limit(now, high_water);
    if let Some(token) = restored.iter().map(|h| h.token).find(|t| *t > limit) {
        return Err(Refusal::TokenOutOfRange { token, limit });
    }
    let Some(current) = current else {
        return Ok(());
    };
    let Some(highest) = current.holders().map(|h| h.token).max() else {
        return Ok(());
    };
    let known = |owner: &[u8], token: u64| current.entry(owner).is_some_and(|h| h.token == token);
    match restored
        .iter()
        .find(|h| h.token <= highest && !known(&h.owner, h.token))
    {
        Some(h) => Err(Refusal::TokenBackwards {
            token: h.token,
            current: highest,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::{Mode, CLOCK_SHIFT};

    const T0: Millis = 1_800_000_000_000;

    fn hold(owner: &str, token: u64) -> Hold {
        Hold {
            owner: owner.as_bytes().into(),
            token,
            deadline: T0 + 10_000,
            granted_at: 0,
            session: 0,
            delay: 0,
        }
    }

    fn exclusive(owner: &str, token: u64) -> Vec<Hold> {
        vec![hold(owner, token)]
    }

    fn shared(holds: &[(&str, u64)]) -> Vec<Hold> {
        holds.iter().map(|(o, t)| hold(o, *t)).collect()
    }

    fn value(holders: Vec<Hold>) -> Lock {
        let mode = match holders.len() {
            1 => Mode::Exclusive,
            _ => Mode::Shared { limit: None },
        };
        Lock::from_holders(mode, holders)
    }

    #[test]
    fn the_limit_is_seven_days_of_clock_or_the_mark() {
        let ahead = TokenMint::floor(T0 + RESTORE_AHEAD_MS);
        assert_eq!(restore_limit(T0, 0), ahead);
        assert_eq!(restore_limit(T0, ahead + 5), ahead + 5);
        assert_eq!(restore_limit(T0, u64::MAX), EXACT_NUMBER_LIMIT - 1);
        assert_eq!(restore_limit(Millis::MAX, 0), RAISE_CEILING);
        assert_eq!(
            RESTORE_AHEAD_MS as u64 * (1 << CLOCK_SHIFT),
            1_238_630_400_000
        );
    }

    #[test]
    fn tokens_just_inside_and_just_outside_the_limit() {
        let limit = restore_limit(T0, 0);
        assert_eq!(check(&exclusive("a", limit), None, T0, 0), Ok(()));
        assert_eq!(
            check(&exclusive("a", limit + 1), None, T0, 0),
            Err(Refusal::TokenOutOfRange {
                token: limit + 1,
                limit
            })
        );
        assert!(check(&exclusive("a", u64::MAX), None, T0, u64::MAX).is_err());
    }

    #[test]
    fn restores_cannot_ratchet_the_mark() {
        // Each restore raises the mark to its token; the next one's limit does not move.
        let mut mint = TokenMint::new();
        for _ in 0..1000 {
            let limit = restore_limit(T0, mint.high_water());
            assert_eq!(
                check(&exclusive("a", limit), None, T0, mint.high_water()),
                Ok(())
            );
            mint.observe(limit);
        }
        assert_eq!(mint.high_water(), TokenMint::floor(T0 + RESTORE_AHEAD_MS));
    }

    #[test]
    fn a_key_never_goes_backwards() {
        let now = value(exclusive("new", 200));
        let older = exclusive("old", 100);
        assert_eq!(
            check(&older, Some(&now), T0, 200),
            Err(Refusal::TokenBackwards {
                token: 100,
                current: 200
            })
        );
        // The same grant again (a dump of this very value) and a newer one are fine.
        assert_eq!(check(&exclusive("new", 200), Some(&now), T0, 200), Ok(()));
        assert_eq!(check(&exclusive("x", 201), Some(&now), T0, 201), Ok(()));
        // Another owner with the same token is a second grant of it.
        assert!(check(&exclusive("x", 200), Some(&now), T0, 200).is_err());
        assert_eq!(check(&older, None, T0, 200), Ok(()));
    }

    #[test]
    fn shared_holders_are_checked_one_by_one() {
        let now = value(shared(&[("a", 100), ("b", 105)]));
        assert_eq!(
            check(
                &shared(&[("a", 100), ("b", 105), ("c", 110)]),
                Some(&now),
                T0,
                110
            ),
            Ok(())
        );
        assert!(check(&shared(&[("a", 100)]), Some(&now), T0, 110).is_ok());
        assert_eq!(
            check(&shared(&[("a", 100), ("c", 103)]), Some(&now), T0, 110),
            Err(Refusal::TokenBackwards {
                token: 103,
                current: 105
            })
        );
    }
}
