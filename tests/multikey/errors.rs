//! Bad key lists and too many keys: errors that change nothing.

use super::*;

#[test]
fn bad_key_lists_are_errors_that_change_nothing() {
    let (_server, mut c) = start();
    let ks = keys(3);
    redis::cmd("SET").arg(&ks[2]).arg("x").exec(&mut c).unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            macquire_args(
                &[ks[0].clone(), ks[1].clone(), ks[0].clone()],
                "o",
                1000,
                &[],
            ),
            "ERR duplicate key '{}'",
        ),
        (
            vec!["0".into(), ks[0].clone(), "o".into(), "1000".into()],
            "ERR numkeys must be a positive integer",
        ),
        (
            vec!["x".into(), ks[0].clone(), "o".into(), "1000".into()],
            "ERR numkeys must be a positive integer",
        ),
        (
            vec![
                "3".into(),
                ks[0].clone(),
                ks[1].clone(),
                "o".into(),
                "1000".into(),
            ],
            "ERR numkeys is larger than the number of keys given",
        ),
        (
            macquire_args(&ks, "o", 1000, &[]),
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        ),
        (
            macquire_args(&ks[..2], "o", 1000, &["SHARED"]),
            "ERR syntax error: unexpected argument 'SHARED'",
        ),
        (
            macquire_args(&ks[..2], "o", 0, &[]),
            "ERR ttl-ms must be a positive integer",
        ),
    ];
    for (args, expected) in cases {
        let expected = expected.replace("{}", &ks[0]);
        assert_err(call(&mut c, "LOCK.MACQUIRE", &args), &expected);
        assert_all_absent(&mut c, &ks[..2]);
    }
    // MRELEASE: the same checks, before anything is released.
    must_acquire(&mut c, &ks[0], "o", LONG_TTL);
    assert_err(
        call(&mut c, "LOCK.MRELEASE", &["2", &ks[0], &ks[2], "o"]),
        "WRONGTYPE Operation against a key holding the wrong kind of value",
    );
    assert_err(
        call(&mut c, "LOCK.MRELEASE", &["2", &ks[0], &ks[0], "o"]),
        &format!("ERR duplicate key '{}'", ks[0]),
    );
    assert_err(
        call(&mut c, "LOCK.MRELEASE", &["1", &ks[0], "o", "extra"]),
        "ERR syntax error: unexpected argument 'extra'",
    );
    assert!(
        fence(&mut c, &ks[0]).is_some(),
        "still held after the errors"
    );
    assert_err(
        call(&mut c, "LOCK.MACQUIRE", &["1", &ks[0], "o"]),
        "ERR wrong number of arguments for 'lock.macquire' command",
    );
}

#[test]
fn more_keys_than_max_multi_keys_is_an_error() {
    let (_server, mut c) = start();
    let ks = keys(65);
    assert_err(
        call(&mut c, "LOCK.MACQUIRE", &macquire_args(&ks, "o", 1000, &[])),
        "ERR too many keys (lock.max-multi-keys is 64)",
    );
    assert_all_absent(&mut c, &ks);
    assert_eq!(
        macquire(&mut c, &ks[..64], "o", 1000).map(|t| t.len()),
        Some(64)
    );
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("lock.max-multi-keys")
        .arg("2")
        .exec(&mut c)
        .unwrap();
    assert_err(
        call(&mut c, "LOCK.MRELEASE", &["3", &ks[0], &ks[1], &ks[2], "o"]),
        "ERR too many keys (lock.max-multi-keys is 2)",
    );
    assert_eq!(mrelease(&mut c, &ks[..2], "o"), 2);
}
