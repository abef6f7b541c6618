//! `BLOCK` argument errors: refused with their exact error, and nothing changes.

use super::*;

#[test]
fn block_argument_errors_are_rejected_and_change_nothing() {
    let (_server, mut c) = start();
    let (held, free) = (new_key(), new_key());
    let holder_token = must_acquire(&mut c, &held, "holder", LONG_TTL);

    let invalid = "ERR BLOCK timeout-ms must be a non-negative integer";
    let cases: &[(&[&str], &str)] = &[
        (&["BLOCK", "-1"], invalid),
        (&["BLOCK", "-1000"], invalid),
        (&["BLOCK", "x"], invalid),
        (&["BLOCK", "1.5"], invalid),
        (&["BLOCK", ""], invalid),
        (
            &["BLOCK"],
            "ERR syntax error: BLOCK needs a timeout in milliseconds",
        ),
        (
            &["block"],
            "ERR syntax error: BLOCK needs a timeout in milliseconds",
        ),
        (
            &["BLOCK", "1", "BLOCK", "2"],
            "ERR syntax error: BLOCK given more than once",
        ),
        (
            &["BLOCK", "0", "block", "0"],
            "ERR syntax error: BLOCK given more than once",
        ),
    ];
    for key in [&held, &free] {
        for (opts, want) in cases {
            let mut args = vec![key.as_str(), "other", "1000"];
            args.extend_from_slice(opts);
            assert_err(call(&mut c, "LOCK.ACQUIRE", &args), want);
        }
    }

    assert_eq!(blocked_clients(&mut c), 0);
    assert_held(&mut c, &held, holder_token, LONG_TTL);
    assert_absent(&mut c, &free);
    release_last(&mut c, &held, "holder");
}
