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

/// What a reference parse gives: the parse it must return, or every error the arguments
/// deserve (the parser may report any one of them: the order of its checks is not pinned).
pub(super) type RefParse<T> = Result<T, Vec<Error>>;

/// The options after the fixed arguments, as the documented grammar reads them: names
/// case-insensitive, each at most once, scanned left to right (an option with a value takes
/// the next argument, whatever it is). `allowed` names the options of the command at hand.
#[derive(Debug, Default)]
pub(super) struct RefOptions<'a> {
    pub shared: bool,
    pub limit: Option<u64>,
    pub block: Option<Millis>,
    pub session: Option<&'a [u8]>,
    pub lock_delay: Option<Millis>,
    pub bound: bool,
    pub grace: Option<Millis>,
}

/// Scan `args` for the options in `allowed`. Stops at the first bad option; its errors (a
/// repeated option that also lacks a valid value deserves both) are pushed onto `errors`.
/// Returns the options seen and whether the scan reached the end.
pub(super) fn ref_options<'a>(
    args: &'a [Vec<u8>],
    allowed: &[&str],
    errors: &mut Vec<Error>,
) -> (RefOptions<'a>, bool) {
    let mut o = RefOptions::default();
    let mut i = 0;
    while i < args.len() {
        let name = allowed
            .iter()
            .copied()
            .find(|n| args[i].eq_ignore_ascii_case(n.as_bytes()));
        let value = args.get(i + 1).map(Vec::as_slice);
        let before = errors.len();
        let repeated = |seen: bool, errors: &mut Vec<Error>, n: &str| {
            if seen {
                errors.push(error::option_repeated(n));
            }
        };
        let width = match name {
            None => {
                errors.push(error::unexpected_argument(&args[i]));
                1
            }
            Some(n @ ("SHARED" | "BOUND")) => {
                let seen = if n == "SHARED" { o.shared } else { o.bound };
                repeated(seen, errors, n);
                if n == "SHARED" {
                    o.shared = true;
                } else {
                    o.bound = true;
                }
                1
            }
            Some("LIMIT") => {
                repeated(o.limit.is_some(), errors, "LIMIT");
                match value {
                    None => errors.push(error::option_needs_value("LIMIT", "a number of permits")),
                    Some(v) => match ref_integer(v) {
                        Some(n) if n > 0 => o.limit = Some(n as u64),
                        _ => errors.push(error::limit_invalid()),
                    },
                }
                2
            }
            Some("BLOCK") => {
                repeated(o.block.is_some(), errors, "BLOCK");
                match value {
                    None => errors.push(error::option_needs_value(
                        "BLOCK",
                        "a timeout in milliseconds",
                    )),
                    Some(v) => match ref_block(v) {
                        Ok(t) => o.block = Some(t),
                        Err(e) => errors.push(e),
                    },
                }
                2
            }
            Some("SESSION") => {
                repeated(o.session.is_some(), errors, "SESSION");
                match value {
                    // An id is never empty.
                    None | Some([]) => {
                        errors.push(error::option_needs_value("SESSION", "a session id"))
                    }
                    Some(v) => o.session = Some(v),
                }
                2
            }
            Some("LOCKDELAY") => {
                repeated(o.lock_delay.is_some(), errors, "LOCKDELAY");
                match value {
                    None => errors.push(error::option_needs_value("LOCKDELAY", "milliseconds")),
                    Some(v) => match ref_integer(v) {
                        Some(d) if (0..=60_000).contains(&d) => o.lock_delay = Some(d),
                        _ => errors.push(error::lock_delay_invalid()),
                    },
                }
                2
            }
            Some("GRACE") => {
                repeated(o.grace.is_some(), errors, "GRACE");
                match value {
                    None => errors.push(error::option_needs_value("GRACE", "milliseconds")),
                    Some(v) => match ref_integer(v) {
                        Some(g) if (0..=60_000).contains(&g) => o.grace = Some(g),
                        _ => errors.push(error::grace_invalid()),
                    },
                }
                2
            }
            Some(other) => unreachable!("no reference for option {other}"),
        };
        if errors.len() > before {
            return (o, false);
        }
        i += width;
    }
    (o, true)
}

/// A ttl that may be 0 (judged later: only with `SESSION`).
fn ref_ttl_or_zero(arg: &[u8], errors: &mut Vec<Error>) -> Option<Millis> {
    match ref_integer(arg) {
        Some(0) => Some(0),
        _ => ref_ttl(arg).map_err(|e| errors.push(e)).ok(),
    }
}

/// `LOCK.ACQUIRE key owner ttl-ms [SHARED] [LIMIT n] [BLOCK timeout-ms] [SESSION id]
/// [LOCKDELAY ms]`. Arity comes first (nothing else can be judged without the arguments); the
/// owner, the ttl and the first bad option are independent; the rules between options (LIMIT
/// only with SHARED, ttl 0 only with SESSION, no LOCKDELAY with SESSION) are judged when
/// every option could be read.
pub(super) fn ref_acquire(args: &[Vec<u8>], max: usize) -> RefParse<parse::Acquire<'_>> {
    if args.len() < 4 {
        return Err(vec![Error::WrongArity]);
    }
    let mut errors = Vec::new();
    if let Err(e) = ref_owner(&args[2], max) {
        errors.push(e);
    }
    let ttl = ref_ttl_or_zero(&args[3], &mut errors);
    let allowed = ["SHARED", "LIMIT", "BLOCK", "SESSION", "LOCKDELAY"];
    let (o, complete) = ref_options(&args[4..], &allowed, &mut errors);
    if ttl == Some(0) && o.session.is_none() {
        // Without a SESSION (or none read before a bad option), 0 is not a positive ttl.
        errors.push(error::ttl_not_positive());
    }
    if complete {
        if o.limit.is_some() && !o.shared {
            errors.push(error::limit_needs_shared());
        }
        if o.session.is_some() && o.lock_delay.is_some() {
            errors.push(error::lock_delay_with_session());
        }
    }
    match ttl {
        Some(ttl) if errors.is_empty() => Ok(parse::Acquire {
            owner: &args[2],
            ttl,
            mode: match o.shared {
                true => Mode::Shared { limit: o.limit },
                false => Mode::Exclusive,
            },
            block: o.block,
            session: o.session,
            lock_delay: o.lock_delay.unwrap_or(0),
        }),
        _ => Err(errors),
    }
}

/// `numkeys key [key ...]` at argument 1, then at least `after` arguments: the keys and the
/// index of the first argument after them. `numkeys` must be a positive integer (a positive
/// one beyond `i64` is "too many"), at most `max_keys`, with that many keys and `after` more
/// arguments after them, and no key twice (any key given twice may be named).
pub(super) fn ref_numkeys(
    args: &[Vec<u8>],
    after: usize,
    max_keys: usize,
) -> RefParse<(Vec<&[u8]>, usize)> {
    if args.len() < 3 + after {
        return Err(vec![Error::WrongArity]);
    }
    let n: u128 = match ref_integer(&args[1]) {
        Some(n) if n > 0 => n as u128,
        _ if ref_positive_overflow(&args[1]) => u128::MAX,
        _ => return Err(vec![error::numkeys_invalid()]),
    };
    let mut errors = Vec::new();
    if n > max_keys as u128 {
        errors.push(error::too_many_keys(max_keys));
    }
    if n.saturating_add(2 + after as u128) > args.len() as u128 {
        errors.push(error::numkeys_too_large());
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let keys: Vec<&[u8]> = args[2..2 + n as usize].iter().map(Vec::as_slice).collect();
    let twice: Vec<Error> = keys
        .iter()
        .enumerate()
        .filter(|(i, k)| keys[..*i].contains(k))
        .map(|(_, k)| error::duplicate_key(k))
        .collect();
    if !twice.is_empty() {
        return Err(twice);
    }
    Ok((keys, 2 + n as usize))
}

/// `LOCK.MACQUIRE numkeys key [key ...] owner ttl-ms [BLOCK timeout-ms] [SESSION id]`: the
/// keys first (where the owner is depends on them), then as `LOCK.ACQUIRE` without SHARED,
/// LIMIT and LOCKDELAY.
pub(super) fn ref_macquire(
    args: &[Vec<u8>],
    max: usize,
    max_keys: usize,
) -> RefParse<parse::MAcquire<'_>> {
    let (keys, at) = ref_numkeys(args, 2, max_keys)?;
    let mut errors = Vec::new();
    if let Err(e) = ref_owner(&args[at], max) {
        errors.push(e);
    }
    let ttl = ref_ttl_or_zero(&args[at + 1], &mut errors);
    let (o, _) = ref_options(&args[at + 2..], &["BLOCK", "SESSION"], &mut errors);
    if ttl == Some(0) && o.session.is_none() {
        errors.push(error::ttl_not_positive());
    }
    match ttl {
        Some(ttl) if errors.is_empty() => Ok(parse::MAcquire {
            keys,
            owner: &args[at],
            ttl,
            block: o.block,
            session: o.session,
        }),
        _ => Err(errors),
    }
}

/// `LOCK.MRELEASE numkeys key [key ...] owner`: nothing after the owner.
pub(super) fn ref_mrelease(
    args: &[Vec<u8>],
    max: usize,
    max_keys: usize,
) -> RefParse<parse::MRelease<'_>> {
    let (keys, at) = ref_numkeys(args, 1, max_keys)?;
    let mut errors = Vec::new();
    if let Err(e) = ref_owner(&args[at], max) {
        errors.push(e);
    }
    if let Some(extra) = args.get(at + 1) {
        errors.push(error::unexpected_argument(extra));
    }
    match errors.is_empty() {
        true => Ok(parse::MRelease {
            keys,
            owner: &args[at],
        }),
        false => Err(errors),
    }
}

/// A non-negative integer, as the internal forms take their numbers.
fn ref_non_negative(arg: &[u8], errors: &mut Vec<Error>) -> Millis {
    match ref_integer(arg) {
        Some(v) if v >= 0 => v,
        _ => {
            errors.push(error::deadline_invalid());
            0
        }
    }
}

fn ref_serial(arg: &[u8], errors: &mut Vec<Error>) -> u64 {
    ref_token(arg).map_err(|e| errors.push(e)).unwrap_or(0)
}

/// `LOCK.SESSION subcommand ...`: the user's forms (`OPEN ttl-ms [BOUND [GRACE ms]] [LOCKDELAY
/// ms]`, options in any order, GRACE only with BOUND and never longer than the ttl,
/// `KEEPALIVE id [ttl-ms]`, `CLOSE id`, `ATTACH id`, `INFO id`) and the internal ones that
/// replicas and the AOF replay (`RESTORE id serial ttl deadline lock-delay bound user`, `RENEW
/// serial ttl deadline`, `ENDED serial at CLOSED|LOST`). Subcommands are case-insensitive; an
/// id is any bytes (the session table judges it).
pub(super) fn ref_session(args: &[Vec<u8>]) -> RefParse<parse::Session<'_>> {
    let Some(sub) = args.get(1) else {
        return Err(vec![Error::WrongArity]);
    };
    let rest: Vec<&[u8]> = args[2..].iter().map(Vec::as_slice).collect();
    let is = |name: &str| sub.eq_ignore_ascii_case(name.as_bytes());
    let arity = || Err(vec![Error::WrongArity]);
    let mut errors = Vec::new();
    let parsed = if is("OPEN") {
        let Some(ttl_arg) = rest.first() else {
            return arity();
        };
        let ttl = ref_ttl(ttl_arg).map_err(|e| errors.push(e)).unwrap_or(0);
        let (o, complete) = ref_options(&args[3..], &["BOUND", "GRACE", "LOCKDELAY"], &mut errors);
        if complete && o.grace.is_some() && !o.bound {
            errors.push(error::grace_needs_bound());
        }
        if complete && errors.is_empty() && o.grace.is_some_and(|g| g > ttl) {
            errors.push(error::grace_over_ttl());
        }
        parse::Session::Open {
            ttl,
            bound: o.bound,
            grace: o.grace.unwrap_or(0),
            lock_delay: o.lock_delay.unwrap_or(0),
        }
    } else if is("KEEPALIVE") {
        match rest[..] {
            [id] => parse::Session::KeepAlive { id, ttl: None },
            [id, t] => parse::Session::KeepAlive {
                id,
                ttl: ref_ttl(t).map_err(|e| errors.push(e)).ok(),
            },
            _ => return arity(),
        }
    } else if is("CLOSE") || is("ATTACH") || is("INFO") {
        let [id] = rest[..] else {
            return arity();
        };
        match () {
            _ if is("CLOSE") => parse::Session::Close { id },
            _ if is("ATTACH") => parse::Session::Attach { id },
            _ => parse::Session::Info { id },
        }
    } else if is("RESTORE") {
        // A grace last, or none (what modules before GRACE wrote).
        let (id, serial, ttl, deadline, lock_delay, bound, user, grace) = match rest[..] {
            [id, serial, ttl, deadline, lock_delay, bound, user] => {
                (id, serial, ttl, deadline, lock_delay, bound, user, None)
            }
            [id, serial, ttl, deadline, lock_delay, bound, user, grace] => (
                id,
                serial,
                ttl,
                deadline,
                lock_delay,
                bound,
                user,
                Some(grace),
            ),
            _ => return arity(),
        };
        parse::Session::Restore {
            id,
            serial: ref_serial(serial, &mut errors),
            ttl: ref_non_negative(ttl, &mut errors),
            deadline: ref_non_negative(deadline, &mut errors),
            lock_delay: ref_non_negative(lock_delay, &mut errors),
            bound: ref_non_negative(bound, &mut errors) != 0,
            user,
            grace: grace.map_or(0, |g| ref_non_negative(g, &mut errors)),
        }
    } else if is("RENEW") {
        let [serial, ttl, deadline] = rest[..] else {
            return arity();
        };
        parse::Session::Renew {
            serial: ref_serial(serial, &mut errors),
            ttl: ref_non_negative(ttl, &mut errors),
            deadline: ref_non_negative(deadline, &mut errors),
        }
    } else if is("ENDED") {
        let [serial, at, how] = rest[..] else {
            return arity();
        };
        parse::Session::Ended {
            serial: ref_serial(serial, &mut errors),
            at: ref_non_negative(at, &mut errors),
            // Anything but CLOSED is an unclean end (the primary writes CLOSED or LOST).
            clean: how.eq_ignore_ascii_case(b"CLOSED"),
        }
    } else {
        return Err(vec![error::session_subcommand(sub)]);
    };
    match errors.is_empty() {
        true => Ok(parsed),
        false => Err(errors),
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
