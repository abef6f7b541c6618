//! Argument parsing for every command: raw byte arguments in, a typed struct or an [`Error`] out.
//! Nothing here touches the keyspace, so a command that fails to parse changes nothing.
//!
//! `args` always includes the command name at 0 and the key at 1, as Redis passes them.

use crate::error::{self, Error, Result};
use crate::lock::Millis;

/// `LOCK.ACQUIRE key owner ttl-ms [BLOCK timeout-ms]`
#[derive(Debug, PartialEq, Eq)]
pub struct Acquire<'a> {
    pub owner: &'a [u8],
    pub ttl: Millis,
    /// `None` without `BLOCK`; `Some(0)` waits without limit.
    pub block: Option<Millis>,
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

/// `LOCK.LOAD key owner token deadline-ms`: the effect of a grant, as replicas and the AOF see it.
#[derive(Debug, PartialEq, Eq)]
pub struct Load<'a> {
    pub owner: &'a [u8],
    pub token: u64,
    pub deadline: Millis,
}

/// The longest `BLOCK` timeout: about 3 years, far below where Redis's own `now + timeout`
/// arithmetic could overflow.
pub const MAX_BLOCK_MS: Millis = 100_000_000_000;

pub fn acquire<'a>(args: &[&'a [u8]], max_owner: usize) -> Result<Acquire<'a>> {
    if args.len() < 4 {
        return Err(Error::WrongArity);
    }
    let owner = owner(args[2], max_owner)?;
    let ttl = ttl(args[3])?;
    let mut block = None;
    let mut rest = args[4..].iter();
    while let Some(opt) = rest.next() {
        if opt.eq_ignore_ascii_case(b"BLOCK") {
            if block.is_some() {
                return Err(error::option_repeated("BLOCK"));
            }
            let value = rest
                .next()
                .ok_or_else(|| error::option_needs_value("BLOCK", "a timeout in milliseconds"))?;
            block = Some(block_timeout(value)?);
        } else {
            return Err(error::unexpected_argument(opt));
        }
    }
    Ok(Acquire { owner, ttl, block })
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
        ttl: ttl(args[3])?,
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
    if args.len() != 5 {
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
    Ok(Load {
        owner,
        token,
        deadline,
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

fn ttl(arg: &[u8]) -> Result<Millis> {
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

fn positive(arg: &[u8]) -> Option<u64> {
    integer(arg).filter(|t| *t > 0).map(|t| t as u64)
}

/// A strict decimal integer, as Redis parses them: optional `-`, digits only, no spaces or `+`.
fn integer(arg: &[u8]) -> Option<i64> {
    if !is_decimal(arg) {
        return None;
    }
    std::str::from_utf8(arg).ok()?.parse().ok()
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
    fn acquire_parses_plain_and_block() {
        with(&["LOCK.ACQUIRE", "k", "me", "1000"], |args| {
            assert_eq!(
                acquire(args, 1024).unwrap(),
                Acquire {
                    owner: b"me",
                    ttl: 1000,
                    block: None
                }
            )
        });
        with(&["LOCK.ACQUIRE", "k", "me", "1000", "block", "0"], |args| {
            assert_eq!(acquire(args, 1024).unwrap().block, Some(0))
        });
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
        with(&["E", "k", "me", "0"], |a| {
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
                    deadline: 100
                }
            )
        });
        with(&["L", "k", "me", "9", "-1"], |a| assert!(load(a).is_err()));
    }

    #[test]
    fn binary_owners_are_kept_as_bytes() {
        let args: Vec<&[u8]> = vec![b"A", b"k", b"\x00\xff", b"10"];
        assert_eq!(acquire(&args, 8).unwrap().owner, b"\x00\xff");
    }
}
