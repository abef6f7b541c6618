//! Key specs: `COMMAND GETKEYS` and `COMMAND INFO` see every key, and ACL key patterns apply to
//! each of them.

use super::*;

#[test]
fn command_getkeys_and_command_info_see_every_key() {
    let (_server, mut c) = start();
    let got: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("LOCK.MACQUIRE")
        .arg(&["3", "a", "b", "c", "me", "1000", "BLOCK", "0"])
        .query(&mut c)
        .unwrap();
    assert_eq!(got, ["a", "b", "c"]);
    let got: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("LOCK.MRELEASE")
        .arg(&["2", "a", "b", "me"])
        .query(&mut c)
        .unwrap();
    assert_eq!(got, ["a", "b"]);
    let info = format!(
        "{:?}",
        call(&mut c, "COMMAND", &["INFO", "LOCK.MACQUIRE"]).unwrap()
    );
    assert!(info.contains("movablekeys"), "COMMAND INFO: {info}");
    assert!(info.contains("keynum"), "COMMAND INFO: {info}");
}

#[test]
fn acl_key_patterns_apply_to_every_key() {
    let (server, mut c) = start();
    call(
        &mut c,
        "ACL",
        &["SETUSER", "orders", "on", ">pw", "~allowed:*", "+@all"],
    )
    .unwrap();
    let mut u = server.conn();
    call(&mut u, "AUTH", &["orders", "pw"]).unwrap();
    let (ok, other) = (["allowed:a", "allowed:b"], ["allowed:c", "forbidden:d"]);
    assert_err_code(
        call(
            &mut u,
            "LOCK.MACQUIRE",
            &["2", other[0], other[1], "o", "1000"],
        ),
        "NOPERM",
    );
    assert_absent(&mut c, other[0]);
    let got = tokens(call(
        &mut u,
        "LOCK.MACQUIRE",
        &["2", ok[0], ok[1], "o", "1000"],
    ));
    assert_eq!(got.map(|t| t.len()), Some(2));
    assert_err_code(
        call(&mut u, "LOCK.MRELEASE", &["2", ok[0], other[1], "o"]),
        "NOPERM",
    );
    assert!(fence(&mut c, ok[0]).is_some());
}
