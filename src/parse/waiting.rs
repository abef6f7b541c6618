//! `LOCK.WAITING [COUNT n]`.

use super::positive;
use crate::error::{self, Result};

/// `COUNT` when none is given.
pub const DEFAULT_WAITING_COUNT: usize = 10;
/// The largest `COUNT` (the reply is built in one step; see `blocking::contended`).
pub const MAX_WAITING_COUNT: usize = 1000;

/// `LOCK.WAITING [COUNT n]` -> how many keys to show.
pub fn waiting(args: &[&[u8]]) -> Result<usize> {
    match &args[1..] {
        [] => Ok(DEFAULT_WAITING_COUNT),
        [opt, n] if opt.eq_ignore_ascii_case(b"COUNT") => positive(n)
            .filter(|n| *n as usize <= MAX_WAITING_COUNT)
            .map(|n| n as usize)
            .ok_or_else(|| error::list_count_invalid(MAX_WAITING_COUNT)),
        [opt] if opt.eq_ignore_ascii_case(b"COUNT") => {
            Err(error::option_needs_value("COUNT", "a number"))
        }
        [other, ..] => Err(error::unexpected_argument(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn waiting_takes_an_optional_count() {
        let parse = |args: &[&str]| {
            let refs: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
            waiting(&refs).map_err(|e: Error| e.reply_text())
        };
        assert_eq!(parse(&["W"]), Ok(10));
        assert_eq!(parse(&["W", "count", "1000"]), Ok(1000));
        let count = Err("ERR COUNT must be an integer from 1 to 1000".to_string());
        assert_eq!(parse(&["W", "COUNT", "0"]), count);
        assert_eq!(parse(&["W", "COUNT", "1001"]), count);
        assert_eq!(
            parse(&["W", "COUNT"]),
            Err("ERR syntax error: COUNT needs a number".into())
        );
        assert_eq!(
            parse(&["W", "key"]),
            Err("ERR syntax error: unexpected argument 'key'".into())
        );
    }
}
