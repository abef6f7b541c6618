//! Argument parsing for every command: raw byte arguments in, a typed struct or an [`Error`] out.
//! Nothing here touches the keyspace, so a command that fails to parse changes nothing.
//!
//! `args` always includes the command name at 0 and the key at 1, as Redis passes them
//! (`numkeys` and then the keys for the multi-key commands).

use crate::error::{self, Error, Result};
use crate::lock::{Millis, Mode};

mod session;
mod waiting;
pub use session::{session, Session};
pub use waiting::waiting;

/// `LOCK.ACQUIRE key owner ttl-ms [SHARED] [LIMIT n] [BLOCK timeout-ms] [SESSION id]
/// [LOCKDELAY ms]`
#[derive(Debug, PartialEq, Eq)]
pub struct Acquire<'a> {
    pub owner: &'a [u8],
    /// 0 only with `session`: the hold has no deadline of its own.
    pub ttl: Millis,
    /// Exclusive without `SHARED`; `LIMIT n` makes a shared acquire take one of `n` permits.
    pub mode: Mode,
    /// `None` without `BLOCK`; `Some(0)` waits without limit.
    pub block: Option<Millis>,
    /// The session id the hold belongs to.
    pub session: Option<&'a [u8]>,
    /// Lock-delay of a plain hold (a session hold takes its session's).
    pub lock_delay: Millis,
}

/// `LOCK.RELEASE key owner`
#[derive(Debug, PartialEq, Eq)]
pub struct Release<'a> {
    pub owner: &'a [u8],
}

/// `LOCK.EXTEND key owner ttl-ms`
#[derive(Debug, PartialEq, Eq)]
pub struct Extend<'a> {
    pub owner: &'a [u8],
    pub ttl: Millis,
}

/// `LOCK.FENCE key [token]`
#[derive(Debug, PartialEq, Eq)]
pub struct Fence {
    pub token: Option<u64>,
}

/// `LOCK.LOAD key owner token deadline-ms [SHARED [LIMIT n]] [PRUNE ms]`: the effect of a
/// grant, as replicas and the AOF see it.
#[derive(Debug, PartialEq, Eq)]
pub struct Load<'a> {
    pub owner: &'a [u8],
    pub token: u64,
    pub deadline: Millis,
    pub mode: Mode,
    /// The primary's clock when it granted: it dropped every holder that had expired by then,
    /// and a replica drops the same ones (never by its own clock, which may differ).
    pub prune: Option<Millis>,
    /// The session's serial (0: none).
    pub session: u64,
    /// The hold's lock-delay.
    pub delay: Millis,
}

/// `LOCK.MACQUIRE numkeys key [key ...] owner ttl-ms [BLOCK timeout-ms] [SESSION id]`
#[derive(Debug, PartialEq, Eq)]
pub struct MAcquire<'a> {
    /// The keys, in argument order (arguments `2..2 + keys.len()`); no duplicates.
    pub keys: Vec<&'a [u8]>,
    pub owner: &'a [u8],
    pub ttl: Millis,
    /// As for `LOCK.ACQUIRE`.
    pub block: Option<Millis>,
    pub session: Option<&'a [u8]>,
}

/// `LOCK.MRELEASE numkeys key [key ...] owner`
#[derive(Debug, PartialEq, Eq)]
pub struct MRelease<'a> {
    pub keys: Vec<&'a [u8]>,
    pub owner: &'a [u8],
}

/// The longest `BLOCK` timeout: about 3 years, far below where Redis's own `now + timeout`
/// arithmetic could overflow.
pub const MAX_BLOCK_MS: Millis = 100_000_000_000;

pub fn acquire<'a>(args: &[&'a [u8]], max_owner: usize) -> Result<Acquire<'a>> {
    if args.len() < 4 {
        return Err(Error::WrongArity);
    }
    let owner = owner(args[2], max_owner)?;
    let ttl = ttl_or_zero(args[3])?;
    let mut block = None;
    let mut shared = false;
    let mut limit = None;
    let mut session = None;
    let mut lock_delay = None;
    let mut rest = args[4..].iter();
    while let Some(opt) = rest.next() {
        if opt.eq_ignore_ascii_case(b"SESSION") {
            session = Some(session_option(session, rest.next())?);
        } else if opt.eq_ignore_ascii_case(b"LOCKDELAY") {
            if lock_delay.is_some() {
                return Err(error::option_repeated("LOCKDELAY"));
            }
            let value = rest
                .next()
                .ok_or_else(|| error::option_needs_value("LOCKDELAY", "milliseconds"))?;
            lock_delay = Some(lock_delay_value(value)?);
        } else if opt.eq_ignore_ascii_case(b"BLOCK") {
            if block.is_some() {
                return Err(error::option_repeated("BLOCK"));
            }
            let value = rest
                .next()
                .ok_or_else(|| error::option_needs_value("BLOCK", "a timeout in milliseconds"))?;
            block = Some(block_timeout(value)?);
        } else if opt.eq_ignore_ascii_case(b"SHARED") {
            if shared {
                return Err(error::option_repeated("SHARED"));
            }
            shared = true;
        } else if opt.eq_ignore_ascii_case(b"LIMIT") {
            if limit.is_some() {
                return Err(error::option_repeated("LIMIT"));
            }
            let value = rest
                .next()
                .ok_or_else(|| error::option_needs_value("LIMIT", "a number of permits"))?;
            limit = Some(positive(value).ok_or_else(error::limit_invalid)?);
        } else {
            return Err(error::unexpected_argument(opt));
        }
    }
    let mode = match (shared, limit) {
        (false, Some(_)) => return Err(error::limit_needs_shared()),
        (false, None) => Mode::Exclusive,
        (true, limit) => Mode::Shared { limit },
    };
    if ttl == 0 && session.is_none() {
        return Err(error::zero_ttl_needs_session());
    }
    if session.is_some() && lock_delay.is_some() {
        return Err(error::lock_delay_with_session());
    }
    Ok(Acquire {
        owner,
        ttl,
        mode,
        block,
        session,
        lock_delay: lock_delay.unwrap_or(0),
    })
}

/// `SESSION id`, given at most once.
fn session_option<'a>(seen: Option<&'a [u8]>, value: Option<&&'a [u8]>) -> Result<&'a [u8]> {
    if seen.is_some() {
        return Err(error::option_repeated("SESSION"));
    }
    value
        .copied()
        .filter(|v| !v.is_empty())
        .ok_or_else(|| error::option_needs_value("SESSION", "a session id"))
}

pub(crate) fn lock_delay_value(arg: &[u8]) -> Result<Millis> {
    integer(arg)
        .filter(|d| (0..=crate::lock::session::MAX_LOCK_DELAY).contains(d))
        .ok_or_else(error::lock_delay_invalid)
}

pub fn macquire<'a>(args: &[&'a [u8]], max_owner: usize, max_keys: usize) -> Result<MAcquire<'a>> {
    let (keys, rest) = numkeys_and_keys(args, 2, max_keys)?;
    let owner = owner(rest[0], max_owner)?;
    let ttl = ttl_or_zero(rest[1])?;
    let mut block = None;
    let mut session = None;
    let mut options = rest[2..].iter();
    while let Some(opt) = options.next() {
        if opt.eq_ignore_ascii_case(b"SESSION") {
            session = Some(session_option(session, options.next())?);
        } else if opt.eq_ignore_ascii_case(b"BLOCK") {
            if block.is_some() {
                return Err(error::option_repeated("BLOCK"));
            }
            let value = options
                .next()
                .ok_or_else(|| error::option_needs_value("BLOCK", "a timeout in milliseconds"))?;
            block = Some(block_timeout(value)?);
        } else {
            return Err(error::unexpected_argument(opt));
        }
    }
    if ttl == 0 && session.is_none() {
        return Err(error::zero_ttl_needs_session());
    }
    Ok(MAcquire {
        keys,
        owner,
        ttl,
        block,
        session,
    })
}

pub fn mrelease<'a>(args: &[&'a [u8]], max_owner: usize, max_keys: usize) -> Result<MRelease<'a>> {
    let (keys, rest) = numkeys_and_keys(args, 1, max_keys)?;
    if let Some(extra) = rest.get(1) {
        return Err(error::unexpected_argument(extra));
    }
    Ok(MRelease {
        keys,
        owner: owner(rest[0], max_owner)?,
    })
}

/// `numkeys key [key ...]` at argument 1, followed by at least `after` more arguments: the
/// keys (checked for duplicates) and the arguments after them.
#[allow(clippy::type_complexity)]
fn numkeys_and_keys<'a, 'b>(
    args: &'b [&'a [u8]],
    after: usize,
    max_keys: usize,
) -> Result<(Vec<&'a [u8]>, &'b [&'a [u8]])> {
    if args.len() < 3 + after {
        return Err(Error::WrongArity);
    }
    let n = match integer(args[1]) {
        Some(n) if n > 0 => n as u64,
        None if is_decimal(args[1]) && args[1][0] != b'-' => u64::MAX,
        _ => return Err(error::numkeys_invalid()),
    };
    if n > max_keys as u64 {
        return Err(error::too_many_keys(max_keys));
    }
    let n = n as usize;
    if 2 + n + after > args.len() {
        return Err(error::numkeys_too_large());
    }
    let keys = args[2..2 + n].to_vec();
    if let Some(dup) = crate::lock::first_duplicate(&keys) {
        return Err(error::duplicate_key(dup));
    }
    Ok((keys, &args[2 + n..]))
}

pub fn release<'a>(args: &[&'a [u8]], max_owner: usize) -> Result<Release<'a>> {
    if args.len() != 3 {
        return Err(Error::WrongArity);
    }
    Ok(Release {
        owner: owner(args[2], max_owner)?,
    })
}

pub fn extend<'a>(args: &[&'a [u8]], max_owner: usize) -> Result<Extend<'a>> {
    if args.len() != 4 {
        return Err(Error::WrongArity);
    }
    Ok(Extend {
        owner: owner(args[2], max_owner)?,
        ttl: ttl_or_zero(args[3])?,
    })
}

pub fn fence(args: &[&[u8]]) -> Result<Fence> {
    match args.len() {
        2 => Ok(Fence { token: None }),
        3 => Ok(Fence {
            token: Some(positive(args[2]).ok_or_else(error::token_invalid)?),
        }),
        _ => Err(Error::WrongArity),
    }
}

/// No owner length cap here: the primary already enforced its own, and a replica or an AOF
/// must accept whatever the primary granted.
pub fn load<'a>(args: &[&'a [u8]]) -> Result<Load<'a>> {
    if args.len() < 5 {
        return Err(Error::WrongArity);
    }
    let owner = args[2];
    if owner.is_empty() {
        return Err(error::owner_empty());
    }
    let token = positive(args[3]).ok_or_else(error::token_invalid)?;
    let deadline = integer(args[4])
        .filter(|d| *d >= 0)
        .ok_or_else(error::deadline_invalid)?;
    let mut mode = Mode::Exclusive;
    let mut prune = None;
    let (mut session, mut delay) = (0, 0);
    let mut rest = args[5..].iter();
    while let Some(opt) = rest.next() {
        let mut value = || rest.next().copied().and_then(integer).filter(|v| *v >= 0);
        if opt.eq_ignore_ascii_case(b"SHARED") {
            mode = Mode::Shared { limit: None };
        } else if opt.eq_ignore_ascii_case(b"LIMIT") && mode.is_shared() {
            let limit = value()
                .filter(|n| *n > 0)
                .ok_or_else(error::limit_invalid)?;
            mode = Mode::Shared {
                limit: Some(limit as u64),
            };
        } else if opt.eq_ignore_ascii_case(b"PRUNE") {
            prune = Some(value().ok_or_else(error::deadline_invalid)?);
        } else if opt.eq_ignore_ascii_case(b"SESSION") {
            session = value().ok_or_else(error::token_invalid)? as u64;
        } else if opt.eq_ignore_ascii_case(b"DELAY") {
            delay = value().ok_or_else(error::lock_delay_invalid)?;
        } else {
            return Err(error::unexpected_argument(opt));
        }
    }
    Ok(Load {
        owner,
        token,
        deadline,
        mode,
        prune,
        session,
        delay,
    })
}

fn owner(arg: &[u8], max: usize) -> Result<&[u8]> {
    if arg.is_empty() {
        Err(error::owner_empty())
    } else if arg.len() > max {
        Err(error::owner_too_long(max))
    } else {
        Ok(arg)
    }
}

/// A ttl that may be 0 (a session hold with no deadline of its own); the caller checks that a
/// session was named.
fn ttl_or_zero(arg: &[u8]) -> Result<Millis> {
    match integer(arg) {
        Some(t) if t >= 0 => Ok(t),
        _ => ttl(arg),
    }
}

/// `LOCK.EXTEND`'s ttl: 0 is accepted here, and the command allows it on session holds only.
pub fn extend_ttl(arg: &[u8]) -> Result<Millis> {
    ttl_or_zero(arg)
}

pub(crate) fn ttl(arg: &[u8]) -> Result<Millis> {
    match integer(arg) {
        Some(t) if t > 0 => Ok(t),
        // Beyond i64 is still a well-formed positive number: call it too large, not malformed.
        None if is_decimal(arg) && arg[0] != b'-' => Err(error::ttl_too_large()),
        _ => Err(error::ttl_not_positive()),
    }
}

fn block_timeout(arg: &[u8]) -> Result<Millis> {
    match integer(arg) {
        Some(t) if (0..=MAX_BLOCK_MS).contains(&t) => Ok(t),
        Some(t) if t > MAX_BLOCK_MS => Err(error::timeout_too_large()),
        None if is_decimal(arg) && arg[0] != b'-' => Err(error::timeout_too_large()),
        _ => Err(error::timeout_invalid()),
    }
}

pub(crate) fn positive(arg: &[u8]) -> Option<u64> {
    integer(arg).filter(|t| *t > 0).map(|t| t as u64)
}

/// A strict decimal integer, as Redis parses them: optional `-`, digits only, no spaces or `+`.
/// A decimal `-?[0-9]+` within i64, else None (one pass: it is on every acquire's path).
pub(crate) fn integer(arg: &[u8]) -> Option<i64> {
    let (negative, digits) = match arg.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, arg),
    };
    if digits.is_empty() {
        return None;
    }
    let mut n: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        let d = i64::from(d - b'0');
        n = n.checked_mul(10)?;
        n = if negative {
            n.checked_sub(d)?
        } else {
            n.checked_add(d)?
        };
    }
    Some(n)
}

fn is_decimal(arg: &[u8]) -> bool {
    let digits = arg.strip_prefix(b"-").unwrap_or(arg);
    !digits.is_empty() && digits.iter().all(u8::is_ascii_digit)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(args: &[&str]) -> Vec<Vec<u8>> {
        args.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    fn with<T>(args: &[&str], f: impl FnOnce(&[&[u8]]) -> T) -> T {
        let owned = a(args);
        let refs: Vec<&[u8]> = owned.iter().map(|v| v.as_slice()).collect();
        f(&refs)
    }

    fn msg(e: Error) -> String {
        e.to_string()
    }

    #[test]
    fn macquire_parses_keys_owner_ttl_and_block() {
        with(&["LOCK.MACQUIRE", "2", "a", "b", "me", "1000"], |args| {
            assert_eq!(
                macquire(args, 1024, 64).unwrap(),
                MAcquire {
                    keys: vec![b"a", b"b"],
                    owner: b"me",
                    ttl: 1000,
                    block: None,
                    session: None,
                }
            )
        });
        with(
            &["LOCK.MACQUIRE", "1", "a", "me", "1000", "block", "5"],
            |args| assert_eq!(macquire(args, 1024, 64).unwrap().block, Some(5)),
        );
        with(&["LOCK.MRELEASE", "2", "a", "b", "me"], |args| {
            assert_eq!(
                mrelease(args, 1024, 64).unwrap(),
                MRelease {
                    keys: vec![b"a", b"b"],
                    owner: b"me"
                }
            )
        });
    }

    #[test]
    fn macquire_and_mrelease_refuse_bad_key_lists() {
        let cases: &[(&[&str], &str)] = &[
            (
                &["LOCK.MACQUIRE", "0", "a", "me", "1000"],
                "ERR numkeys must be a positive integer",
            ),
            (
                &["LOCK.MACQUIRE", "-1", "a", "me", "1000"],
                "ERR numkeys must be a positive integer",
            ),
            (
                &["LOCK.MACQUIRE", "x", "a", "me", "1000"],
                "ERR numkeys must be a positive integer",
            ),
            (
                &["LOCK.MACQUIRE", "2", "a", "me", "1000"],
                "ERR numkeys is larger than the number of keys given",
            ),
            (
                &["LOCK.MACQUIRE", "99999999999999999999", "a", "me", "1000"],
                "ERR too many keys (lock.max-multi-keys is 3)",
            ),
            (
                &["LOCK.MACQUIRE", "4", "a", "b", "c", "d", "me", "1000"],
                "ERR too many keys (lock.max-multi-keys is 3)",
            ),
            (
                &["LOCK.MACQUIRE", "3", "a", "b", "a", "me", "1000"],
                "ERR duplicate key 'a'",
            ),
            (
                &["LOCK.MACQUIRE", "1", "a", "me", "1000", "SHARED"],
                "ERR syntax error: unexpected argument 'SHARED'",
            ),
            (
                &["LOCK.MACQUIRE", "1", "a", "me", "0"],
                "ERR ttl-ms must be a positive integer",
            ),
            (
                &["LOCK.MRELEASE", "2", "a", "me"],
                "ERR numkeys is larger than the number of keys given",
            ),
            (
                &["LOCK.MRELEASE", "1", "a", "me", "extra"],
                "ERR syntax error: unexpected argument 'extra'",
            ),
            (
                &["LOCK.MRELEASE", "2", "a", "a", "me"],
                "ERR duplicate key 'a'",
            ),
        ];
        for (args, expected) in cases {
            let got = with(args, |a| match a[0] {
                b"LOCK.MACQUIRE" => macquire(a, 1024, 3).map(|_| ()),
                _ => mrelease(a, 1024, 3).map(|_| ()),
            });
            assert_eq!(got.map_err(msg), Err(expected.to_string()), "{args:?}");
        }
        with(&["LOCK.MACQUIRE", "1", "a", "me"], |a| {
            assert_eq!(macquire(a, 1024, 3), Err(Error::WrongArity))
        });
    }

    #[test]
    fn acquire_parses_plain_and_block() {
        with(&["LOCK.ACQUIRE", "k", "me", "1000"], |args| {
            assert_eq!(
                acquire(args, 1024).unwrap(),
                Acquire {
                    owner: b"me",
                    ttl: 1000,
                    mode: Mode::Exclusive,
                    block: None,
                    session: None,
                    lock_delay: 0,
                }
            )
        });
        with(&["LOCK.ACQUIRE", "k", "me", "1000", "block", "0"], |args| {
            assert_eq!(acquire(args, 1024).unwrap().block, Some(0))
        });
    }

    #[test]
    fn acquire_parses_shared_and_limit_in_any_order() {
        let shared = |limit| Mode::Shared { limit };
        let cases: &[(&[&str], Mode, Option<Millis>)] = &[
            (&["SHARED"], shared(None), None),
            (&["shared", "limit", "4"], shared(Some(4)), None),
            (&["LIMIT", "4", "SHARED"], shared(Some(4)), None),
            (
                &["BLOCK", "5", "LIMIT", "1", "SHARED"],
                shared(Some(1)),
                Some(5),
            ),
            (&["SHARED", "BLOCK", "0"], shared(None), Some(0)),
        ];
        for (opts, mode, block) in cases {
            let mut args = vec!["A", "k", "me", "10"];
            args.extend_from_slice(opts);
            let got = with(&args, |a| acquire(a, 8).map(|c| (c.mode, c.block)));
            assert_eq!(got, Ok((*mode, *block)), "options {opts:?}");
        }
    }

    #[test]
    fn acquire_errors_name_the_problem() {
        let cases: &[(&[&str], &str)] = &[
            (&["A", "k", "me"], "ERR wrong number of arguments"),
            (&["A", "k", "", "10"], "ERR owner must not be empty"),
            (
                &["A", "k", "123456789", "10"],
                "ERR owner is longer than lock.max-owner-bytes (8)",
            ),
            (
                &["A", "k", "me", "0"],
                "ERR ttl-ms must be a positive integer",
            ),
            (
                &["A", "k", "me", "-5"],
                "ERR ttl-ms must be a positive integer",
            ),
            (
                &["A", "k", "me", "1.5"],
                "ERR ttl-ms must be a positive integer",
            ),
            (
                &["A", "k", "me", "+5"],
                "ERR ttl-ms must be a positive integer",
            ),
            (
                &["A", "k", "me", " 5"],
                "ERR ttl-ms must be a positive integer",
            ),
            (
                &["A", "k", "me", ""],
                "ERR ttl-ms must be a positive integer",
            ),
            (
                &["A", "k", "me", "99999999999999999999"],
                "ERR ttl-ms is too large",
            ),
            (
                &["A", "k", "me", "10", "FOO"],
                "ERR syntax error: unexpected argument 'FOO'",
            ),
            (
                &["A", "k", "me", "10", "BLOCK"],
                "ERR syntax error: BLOCK needs a timeout in milliseconds",
            ),
            (
                &["A", "k", "me", "10", "BLOCK", "-1"],
                "ERR BLOCK timeout-ms must be a non-negative integer",
            ),
            (
                &["A", "k", "me", "10", "BLOCK", "x"],
                "ERR BLOCK timeout-ms must be a non-negative integer",
            ),
            (
                &["A", "k", "me", "10", "BLOCK", "1e3"],
                "ERR BLOCK timeout-ms must be a non-negative integer",
            ),
            (
                &["A", "k", "me", "10", "BLOCK", "999999999999999999"],
                "ERR BLOCK timeout-ms is too large",
            ),
            (
                &["A", "k", "me", "10", "BLOCK", "1", "BLOCK", "2"],
                "ERR syntax error: BLOCK given more than once",
            ),
            (
                &["A", "k", "me", "10", "SHARED", "SHARED"],
                "ERR syntax error: SHARED given more than once",
            ),
            (
                &["A", "k", "me", "10", "SHARED", "LIMIT", "2", "LIMIT", "2"],
                "ERR syntax error: LIMIT given more than once",
            ),
            (
                &["A", "k", "me", "10", "LIMIT", "2"],
                "ERR syntax error: LIMIT needs SHARED (a semaphore is a shared lock with n permits)",
            ),
            (
                &["A", "k", "me", "10", "SHARED", "LIMIT"],
                "ERR syntax error: LIMIT needs a number of permits",
            ),
            (
                &["A", "k", "me", "10", "SHARED", "LIMIT", "0"],
                "ERR LIMIT must be a positive integer",
            ),
            (
                &["A", "k", "me", "10", "SHARED", "LIMIT", "-3"],
                "ERR LIMIT must be a positive integer",
            ),
            (
                &["A", "k", "me", "10", "SHARED", "LIMIT", "two"],
                "ERR LIMIT must be a positive integer",
            ),
        ];
        for (args, want) in cases {
            let got = with(args, |a| acquire(a, 8).map(|_| ()).map_err(msg));
            assert_eq!(got, Err(want.to_string()), "args {args:?}");
        }
    }

    #[test]
    fn release_extend_fence_load() {
        with(&["R", "k", "me"], |a| {
            assert_eq!(release(a, 8).unwrap().owner, b"me")
        });
        with(&["R", "k"], |a| {
            assert_eq!(release(a, 8), Err(Error::WrongArity))
        });
        with(&["E", "k", "me", "5"], |a| {
            assert_eq!(extend(a, 8).unwrap().ttl, 5)
        });
        // 0 parses: the command allows it on a session hold only (see commands::extend).
        with(&["E", "k", "me", "0"], |a| {
            assert_eq!(extend(a, 8).unwrap().ttl, 0)
        });
        with(&["E", "k", "me", "-1"], |a| {
            assert_eq!(
                extend(a, 8).map_err(msg),
                Err("ERR ttl-ms must be a positive integer".into())
            )
        });
        with(&["F", "k"], |a| assert_eq!(fence(a).unwrap().token, None));
        with(&["F", "k", "42"], |a| {
            assert_eq!(fence(a).unwrap().token, Some(42))
        });
        for bad in ["0", "-1", "x", ""] {
            with(&["F", "k", bad], |a| {
                assert_eq!(
                    fence(a).map_err(msg),
                    Err("ERR token must be a positive integer".into())
                )
            });
        }
        with(&["F", "k", "1", "2"], |a| {
            assert_eq!(fence(a), Err(Error::WrongArity))
        });
        with(&["L", "k", "me", "9", "100"], |a| {
            assert_eq!(
                load(a).unwrap(),
                Load {
                    owner: b"me",
                    token: 9,
                    deadline: 100,
                    mode: Mode::Exclusive,
                    prune: None,
                    session: 0,
                    delay: 0,
                }
            )
        });
        with(
            &["L", "k", "me", "9", "100", "SESSION", "77", "DELAY", "500"],
            |a| {
                let l = load(a).unwrap();
                assert_eq!((l.session, l.delay), (77, 500));
            },
        );
        with(
            &[
                "L", "k", "me", "9", "100", "SHARED", "LIMIT", "3", "PRUNE", "50",
            ],
            |a| {
                let l = load(a).unwrap();
                assert_eq!(
                    (l.mode, l.prune),
                    (Mode::Shared { limit: Some(3) }, Some(50))
                );
            },
        );
        with(&["L", "k", "me", "9", "-1"], |a| assert!(load(a).is_err()));
        with(&["L", "k", "me", "9", "1", "LIMIT", "3"], |a| {
            assert!(load(a).is_err())
        });
        with(&["L", "k", "me", "9", "1", "PRUNE"], |a| {
            assert!(load(a).is_err())
        });
    }

    #[test]
    fn binary_owners_are_kept_as_bytes() {
        let args: Vec<&[u8]> = vec![b"A", b"k", b"\x00\xff", b"10"];
        assert_eq!(acquire(&args, 8).unwrap().owner, b"\x00\xff");
    }

    #[test]
    fn acquire_session_and_lock_delay() {
        with(&["A", "k", "me", "0", "SESSION", "{a}x"], |a| {
            let cmd = acquire(a, 1024).unwrap();
            assert_eq!(
                (cmd.ttl, cmd.session, cmd.lock_delay),
                (0, Some(&b"{a}x"[..]), 0)
            );
        });
        with(&["A", "k", "me", "10", "LOCKDELAY", "60000"], |a| {
            assert_eq!(acquire(a, 1024).unwrap().lock_delay, 60_000)
        });
        let bad = [
            (&["A", "k", "me", "0"][..], "ERR ttl-ms must be a positive integer"),
            (&["A", "k", "me", "10", "LOCKDELAY", "60001"], "ERR LOCKDELAY must be an integer from 0 to 60000"),
            (&["A", "k", "me", "10", "LOCKDELAY", "-1"], "ERR LOCKDELAY must be an integer from 0 to 60000"),
            (&["A", "k", "me", "10", "LOCKDELAY"], "ERR syntax error: LOCKDELAY needs milliseconds"),
            (&["A", "k", "me", "10", "SESSION"], "ERR syntax error: SESSION needs a session id"),
            (&["A", "k", "me", "10", "SESSION", "a", "SESSION", "b"], "ERR syntax error: SESSION given more than once"),
            (&["A", "k", "me", "10", "SESSION", "a", "LOCKDELAY", "5"], "ERR syntax error: a hold in a SESSION takes the session's LOCKDELAY; give it to LOCK.SESSION OPEN"),
        ];
        for (args, want) in bad {
            with(args, |a| {
                assert_eq!(acquire(a, 1024).unwrap_err().reply_text(), want, "{args:?}")
            });
        }
        with(&["M", "1", "k", "me", "0"], |a| {
            assert!(macquire(a, 1024, 64).is_err())
        });
        with(&["M", "1", "k", "me", "0", "SESSION", "s"], |a| {
            assert_eq!(macquire(a, 1024, 64).unwrap().session, Some(&b"s"[..]))
        });
        with(&["E", "k", "me", "0"], |a| {
            assert_eq!(extend(a, 1024).unwrap().ttl, 0)
        });
    }
}
