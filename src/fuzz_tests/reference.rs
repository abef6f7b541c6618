//! Reference parsers for the parser properties, written from the documented rules
//! (docs/commands.md), not from the code.

use super::*;

/// The reference integer: optional `-`, then one or more ASCII digits, nothing else, in range
/// of `i64`. Accumulated in `i128` so that it does not share code with the parser.
pub(super) fn ref_integer(arg: &[u8]) -> Option<i64> {
    let digits = ref_decimal_digits(arg)?;
    let negative = arg[0] == b'-';
    let mut value: i128 = 0;
    for d in digits {
        value = value * 10 + i128::from(d - b'0');
        if value > i128::from(i64::MAX) + 1 {
            return None;
        }
    }
    i64::try_from(if negative { -value } else { value }).ok()
}

/// The digits of a well-formed decimal (optional `-`, at least one ASCII digit), any length.
pub(super) fn ref_decimal_digits(arg: &[u8]) -> Option<&[u8]> {
    let digits = match arg.first() {
        Some(b'-') => &arg[1..],
        _ => arg,
    };
    (!digits.is_empty() && digits.iter().all(u8::is_ascii_digit)).then_some(digits)
}

/// A positive decimal too large for `i64`.
pub(super) fn ref_positive_overflow(arg: &[u8]) -> bool {
    ref_decimal_digits(arg).is_some() && arg[0] != b'-' && ref_integer(arg).is_none()
}

pub(super) fn ref_owner(arg: &[u8], max: usize) -> Result<(), Error> {
    if arg.is_empty() {
        Err(error::owner_empty())
    } else if arg.len() > max {
        Err(error::owner_too_long(max))
    } else {
        Ok(())
    }
}

/// `ttl-ms`: a positive integer; a positive number beyond `i64` is "too large" (it is a
/// positive integer whose deadline overflows), anything else is "must be a positive integer".
pub(super) fn ref_ttl(arg: &[u8]) -> Result<Millis, Error> {
    match ref_integer(arg) {
        Some(t) if t > 0 => Ok(t),
        _ if ref_positive_overflow(arg) => Err(error::ttl_too_large()),
        _ => Err(error::ttl_not_positive()),
    }
}

/// `LOCK.EXTEND`'s ttl: as [`ref_ttl`], and 0 (which the command allows on session holds).
pub(super) fn ref_extend_ttl(arg: &[u8]) -> Result<Millis, Error> {
    match ref_integer(arg) {
        Some(0) => Ok(0),
        _ => ref_ttl(arg),
    }
}

/// `BLOCK timeout-ms`: 0..=MAX_BLOCK_MS; larger positive numbers (even beyond `i64`) are "too
/// large"; negative and malformed ones are "must be a non-negative integer".
pub(super) fn ref_block(arg: &[u8]) -> Result<Millis, Error> {
    match ref_integer(arg) {
        Some(t) if (0..=MAX_BLOCK_MS).contains(&t) => Ok(t),
        Some(t) if t > MAX_BLOCK_MS => Err(error::timeout_too_large()),
        _ if ref_positive_overflow(arg) => Err(error::timeout_too_large()),
        _ => Err(error::timeout_invalid()),
    }
}

pub(super) fn ref_token(arg: &[u8]) -> Result<u64, Error> {
    match ref_integer(arg) {
        Some(t) if t > 0 => Ok(t as u64),
        _ => Err(error::token_invalid()),
    }
}

/// Every error `LOCK.ACQUIRE` may answer for `args`, or the parse it must return.
/// Arity comes first (nothing else can be judged without the arguments); then the owner, the
/// ttl and the first bad option are independent, and the parser may report any one of them.
/// Options are scanned left to right: `BLOCK` takes the next argument as its value.
pub(super) type RefAcquire<'a> = Result<(&'a [u8], Millis, Option<Millis>), Vec<Error>>;

pub(super) fn ref_acquire(args: &[Vec<u8>], max: usize) -> RefAcquire<'_> {
    if args.len() < 4 {
        return Err(vec![Error::WrongArity]);
    }
    let mut errors = Vec::new();
    if let Err(e) = ref_owner(&args[2], max) {
        errors.push(e);
    }
    let ttl = ref_ttl(&args[3]).map_err(|e| errors.push(e)).ok();
    let mut block = None;
    let mut i = 4;
    while i < args.len() {
        if !args[i].eq_ignore_ascii_case(b"BLOCK") {
            errors.push(error::unexpected_argument(&args[i]));
            break;
        }
        if block.is_some() {
            errors.push(error::option_repeated("BLOCK"));
            break;
        }
        let Some(value) = args.get(i + 1) else {
            errors.push(error::option_needs_value(
                "BLOCK",
                "a timeout in milliseconds",
            ));
            break;
        };
        match ref_block(value) {
            Ok(t) => block = Some(t),
            Err(e) => {
                errors.push(e);
                break;
            }
        }
        i += 2;
    }
    match ttl {
        Some(ttl) if errors.is_empty() => Ok((&args[2], ttl, block)),
        _ => Err(errors),
    }
}

/// An error the parser returned must be one the reference allows, and must look like a Redis
/// error: the server's arity error, or text that starts with `ERR `.
#[track_caller]
pub(super) fn assert_allowed(got: &Error, allowed: &[Error], args: &[Vec<u8>]) {
    assert!(
        allowed.contains(got),
        "args {:?}: parser said {got:?}, reference allows {allowed:?}",
        show(args)
    );
    assert!(
        *got == Error::WrongArity || got.to_string().starts_with("ERR "),
        "args {:?}: error {got} does not start with ERR",
        show(args)
    );
}
