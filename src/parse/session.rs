//! `LOCK.SESSION subcommand ...`: the user's forms and the internal ones (replication, AOF).

use super::{integer, lock_delay_value, positive, ttl};
use crate::error::{self, Error, Result};
use crate::lock::Millis;

/// `LOCK.SESSION subcommand ...`
#[derive(Debug, PartialEq, Eq)]
pub enum Session<'a> {
    Open {
        ttl: Millis,
        bound: bool,
        /// `BOUND GRACE ms` (0 when not given).
        grace: Millis,
        lock_delay: Millis,
    },
    KeepAlive {
        id: &'a [u8],
        ttl: Option<Millis>,
    },
    Close {
        id: &'a [u8],
    },
    Attach {
        id: &'a [u8],
    },
    Info {
        id: &'a [u8],
    },
    /// Administrators: a page of every session on this node, from `cursor` (0: the start).
    List {
        cursor: u64,
        count: usize,
    },
    /// Administrators: end the session `serial` as an expiry would.
    Kill {
        serial: u64,
    },
    /// What each subcommand does (the server's own unknown-subcommand error points here).
    Help,
    /// Internal (replication and AOF): a session as the primary has it.
    Restore {
        id: &'a [u8],
        serial: u64,
        ttl: Millis,
        deadline: Millis,
        lock_delay: Millis,
        bound: bool,
        user: &'a [u8],
        /// Absent (0) in what modules before `GRACE` wrote.
        grace: Millis,
    },
    /// Internal: a keepalive's effect.
    Renew {
        serial: u64,
        ttl: Millis,
        deadline: Millis,
    },
    /// Internal: the session ended at `at` (primary's clock), cleanly or not.
    Ended {
        serial: u64,
        at: Millis,
        clean: bool,
    },
}

/// `LOCK.SESSION ...`. The internal forms (`RESTORE`, `RENEW`, `ENDED`) parse here too; the
/// command refuses them from ordinary clients.
pub fn session<'a>(args: &[&'a [u8]]) -> Result<Session<'a>> {
    let Some(sub) = args.get(1) else {
        return Err(Error::WrongArity);
    };
    let is = |name: &[u8]| sub.eq_ignore_ascii_case(name);
    let rest = &args[2..];
    let id = || match rest {
        [id] => Ok(*id),
        _ => Err(Error::WrongArity),
    };
    if is(b"OPEN") {
        let Some((ttl_arg, options)) = rest.split_first() else {
            return Err(Error::WrongArity);
        };
        let ttl = ttl(ttl_arg)?;
        let (mut bound, mut grace, mut lock_delay) = (false, None, None);
        let mut options = options.iter();
        while let Some(opt) = options.next() {
            if opt.eq_ignore_ascii_case(b"BOUND") {
                if bound {
                    return Err(error::option_repeated("BOUND"));
                }
                bound = true;
            } else if opt.eq_ignore_ascii_case(b"LOCKDELAY") {
                if lock_delay.is_some() {
                    return Err(error::option_repeated("LOCKDELAY"));
                }
                let value = options
                    .next()
                    .ok_or_else(|| error::option_needs_value("LOCKDELAY", "milliseconds"))?;
                lock_delay = Some(lock_delay_value(value)?);
            } else if opt.eq_ignore_ascii_case(b"GRACE") {
                if grace.is_some() {
                    return Err(error::option_repeated("GRACE"));
                }
                let value = options
                    .next()
                    .ok_or_else(|| error::option_needs_value("GRACE", "milliseconds"))?;
                grace = Some(grace_value(value)?);
            } else {
                return Err(error::unexpected_argument(opt));
            }
        }
        // Judged once every option is read: `GRACE` may come before `BOUND`.
        if grace.is_some() && !bound {
            return Err(error::grace_needs_bound());
        }
        let grace = grace.unwrap_or(0);
        if grace > ttl {
            return Err(error::grace_over_ttl());
        }
        Ok(Session::Open {
            ttl,
            bound,
            grace,
            lock_delay: lock_delay.unwrap_or(0),
        })
    } else if is(b"KEEPALIVE") {
        match rest {
            [id] => Ok(Session::KeepAlive { id, ttl: None }),
            [id, t] => Ok(Session::KeepAlive {
                id,
                ttl: Some(ttl(t)?),
            }),
            _ => Err(Error::WrongArity),
        }
    } else if is(b"CLOSE") {
        Ok(Session::Close { id: id()? })
    } else if is(b"ATTACH") {
        Ok(Session::Attach { id: id()? })
    } else if is(b"INFO") {
        Ok(Session::Info { id: id()? })
    } else if is(b"LIST") {
        list(rest)
    } else if is(b"KILL") {
        let [serial] = rest else {
            return Err(Error::WrongArity);
        };
        Ok(Session::Kill {
            serial: positive(serial).ok_or_else(error::serial_invalid)?,
        })
    } else if is(b"HELP") {
        match rest {
            [] => Ok(Session::Help),
            _ => Err(Error::WrongArity),
        }
    } else if is(b"RESTORE") {
        // The grace is last and optional: a stream or file from before `GRACE` has none.
        let (fields, grace) = match rest {
            [fields @ .., grace] if fields.len() == 7 => (fields, Some(grace)),
            fields => (fields, None),
        };
        let [id, serial, ttl, deadline, lock_delay, bound, user] = fields else {
            return Err(Error::WrongArity);
        };
        let number = |a: &[u8]| {
            integer(a)
                .filter(|v| *v >= 0)
                .ok_or_else(error::deadline_invalid)
        };
        Ok(Session::Restore {
            id,
            serial: positive(serial).ok_or_else(error::token_invalid)?,
            ttl: number(ttl)?,
            deadline: number(deadline)?,
            lock_delay: number(lock_delay)?,
            bound: number(bound)? != 0,
            user,
            grace: grace.map_or(Ok(0), |g| number(g))?,
        })
    } else if is(b"RENEW") {
        let [serial, ttl, deadline] = rest else {
            return Err(Error::WrongArity);
        };
        let number = |a: &[u8]| {
            integer(a)
                .filter(|v| *v >= 0)
                .ok_or_else(error::deadline_invalid)
        };
        Ok(Session::Renew {
            serial: positive(serial).ok_or_else(error::token_invalid)?,
            ttl: number(ttl)?,
            deadline: number(deadline)?,
        })
    } else if is(b"ENDED") {
        let [serial, at, how] = rest else {
            return Err(Error::WrongArity);
        };
        Ok(Session::Ended {
            serial: positive(serial).ok_or_else(error::token_invalid)?,
            at: integer(at)
                .filter(|v| *v >= 0)
                .ok_or_else(error::deadline_invalid)?,
            clean: how.eq_ignore_ascii_case(b"CLOSED"),
        })
    } else {
        Err(error::session_subcommand(sub))
    }
}

/// `GRACE ms`: 0 to [`MAX_GRACE`](crate::lock::session::MAX_GRACE).
fn grace_value(arg: &[u8]) -> Result<Millis> {
    integer(arg)
        .filter(|g| (0..=crate::lock::session::MAX_GRACE).contains(g))
        .ok_or_else(error::grace_invalid)
}

/// `COUNT` of `LOCK.SESSION LIST` when none is given (as `SCAN`'s).
pub const DEFAULT_LIST_COUNT: usize = 10;
/// The largest `COUNT`: a page is O(COUNT) (each entry is O(1)), so the server answers
/// other clients between pages however many sessions there are.
pub const MAX_LIST_COUNT: usize = 1000;

/// `LIST [cursor] [COUNT n]`: the cursor is a serial (0 or absent: from the start).
fn list<'a>(rest: &[&'a [u8]]) -> Result<Session<'a>> {
    let mut rest = rest;
    let mut cursor = 0;
    if let Some((first, after)) = rest.split_first() {
        if !first.eq_ignore_ascii_case(b"COUNT") {
            cursor = integer(first)
                .filter(|c| *c >= 0)
                .ok_or_else(error::cursor_invalid)? as u64;
            rest = after;
        }
    }
    let count = match rest {
        [] => DEFAULT_LIST_COUNT,
        [opt, n] if opt.eq_ignore_ascii_case(b"COUNT") => positive(n)
            .filter(|n| *n as usize <= MAX_LIST_COUNT)
            .ok_or_else(|| error::list_count_invalid(MAX_LIST_COUNT))?
            as usize,
        [opt] if opt.eq_ignore_ascii_case(b"COUNT") => {
            return Err(error::option_needs_value("COUNT", "a number"))
        }
        [other, ..] => return Err(error::unexpected_argument(other)),
    };
    Ok(Session::List { cursor, count })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with<T>(args: &[&str], f: impl FnOnce(&[&[u8]]) -> T) -> T {
        let refs: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
        f(&refs)
    }

    #[test]
    fn session_subcommands() {
        with(&["S", "open", "1000", "BOUND", "LOCKDELAY", "250"], |a| {
            assert_eq!(
                session(a).unwrap(),
                Session::Open {
                    ttl: 1000,
                    bound: true,
                    grace: 0,
                    lock_delay: 250
                }
            )
        });
        // Options in any order; GRACE may come before BOUND.
        with(
            &[
                "S",
                "OPEN",
                "1000",
                "grace",
                "300",
                "LOCKDELAY",
                "5",
                "bound",
            ],
            |a| {
                assert_eq!(
                    session(a).unwrap(),
                    Session::Open {
                        ttl: 1000,
                        bound: true,
                        grace: 300,
                        lock_delay: 5
                    }
                )
            },
        );
        with(&["S", "OPEN", "60000", "BOUND", "GRACE", "60000"], |a| {
            assert!(matches!(
                session(a).unwrap(),
                Session::Open { grace: 60000, .. }
            ))
        });
        with(&["S", "OPEN", "10", "BOUND", "GRACE", "0"], |a| {
            assert!(matches!(
                session(a).unwrap(),
                Session::Open { grace: 0, .. }
            ))
        });
        with(&["S", "KEEPALIVE", "id", "500"], |a| {
            assert_eq!(
                session(a).unwrap(),
                Session::KeepAlive {
                    id: b"id",
                    ttl: Some(500)
                }
            )
        });
        with(&["S", "close", "id"], |a| {
            assert_eq!(session(a).unwrap(), Session::Close { id: b"id" })
        });
        with(&["S", "ENDED", "5", "100", "LOST"], |a| {
            assert_eq!(
                session(a).unwrap(),
                Session::Ended {
                    serial: 5,
                    at: 100,
                    clean: false
                }
            )
        });
        with(&["S", "list"], |a| {
            assert_eq!(
                session(a).unwrap(),
                Session::List {
                    cursor: 0,
                    count: 10
                }
            )
        });
        with(&["S", "LIST", "77", "count", "3"], |a| {
            assert_eq!(
                session(a).unwrap(),
                Session::List {
                    cursor: 77,
                    count: 3
                }
            )
        });
        with(&["S", "LIST", "COUNT", "1000"], |a| {
            assert_eq!(
                session(a).unwrap(),
                Session::List {
                    cursor: 0,
                    count: 1000
                }
            )
        });
        with(&["S", "KILL", "12"], |a| {
            assert_eq!(session(a).unwrap(), Session::Kill { serial: 12 })
        });
        let bad: [(&[&str], &str); 21] = [
            (
                &["S", "OPEN", "1000", "GRACE", "100"],
                "ERR syntax error: GRACE needs BOUND (only a bound session outlives its \
                 connection)",
            ),
            (
                &["S", "OPEN", "1000", "BOUND", "GRACE", "-1"],
                "ERR GRACE must be an integer from 0 to 60000",
            ),
            (
                &["S", "OPEN", "100000", "BOUND", "GRACE", "60001"],
                "ERR GRACE must be an integer from 0 to 60000",
            ),
            (
                &["S", "OPEN", "1000", "BOUND", "GRACE", "1001"],
                "ERR GRACE must not be longer than the session's ttl-ms",
            ),
            (
                &["S", "OPEN", "1000", "BOUND", "GRACE", "1s"],
                "ERR GRACE must be an integer from 0 to 60000",
            ),
            (
                &["S", "OPEN", "1000", "BOUND", "GRACE"],
                "ERR syntax error: GRACE needs milliseconds",
            ),
            (
                &["S", "OPEN", "1000", "BOUND", "GRACE", "1", "GRACE", "1"],
                "ERR syntax error: GRACE given more than once",
            ),
            (&["S"], "ERR wrong number of arguments"),
            (&["S", "OPEN"], "ERR wrong number of arguments"),
            (&["S", "OPEN", "0"], "ERR ttl-ms must be a positive integer"),
            (
                &["S", "OPEN", "10", "BOUND", "BOUND"],
                "ERR syntax error: BOUND given more than once",
            ),
            (
                &["S", "OPEN", "10", "LOCKDELAY", "70000"],
                "ERR LOCKDELAY must be an integer from 0 to 60000",
            ),
            (&["S", "INFO"], "ERR wrong number of arguments"),
            (
                &["S", "NOPE", "x"],
                "ERR unknown LOCK.SESSION subcommand 'NOPE' (OPEN, KEEPALIVE, CLOSE, ATTACH, \
                 INFO, LIST, KILL)",
            ),
            (
                &["S", "LIST", "-1"],
                "ERR cursor must be an integer from 0 (a serial LIST returned)",
            ),
            (
                &["S", "LIST", "0", "COUNT", "0"],
                "ERR COUNT must be an integer from 1 to 1000",
            ),
            (
                &["S", "LIST", "COUNT", "1001"],
                "ERR COUNT must be an integer from 1 to 1000",
            ),
            (
                &["S", "LIST", "0", "COUNT"],
                "ERR syntax error: COUNT needs a number",
            ),
            (
                &["S", "LIST", "0", "MATCH", "x"],
                "ERR syntax error: unexpected argument 'MATCH'",
            ),
            (&["S", "KILL"], "ERR wrong number of arguments"),
            (
                &["S", "KILL", "abc"],
                "ERR serial must be a positive integer (as LOCK.SESSION LIST shows it)",
            ),
        ];
        for (args, want) in bad {
            with(args, |a| {
                assert_eq!(session(a).unwrap_err().reply_text(), want, "{args:?}")
            });
        }
    }
}
