//! The `lock.*` configs: their defaults, the values they refuse, and module arguments at load.

use super::*;

#[test]
fn configs_have_defaults_and_reject_out_of_range_values() {
    let (_server, mut c) = start();
    let all: BTreeMap<String, String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("lock.*")
        .query(&mut c)
        .unwrap();
    let expected: BTreeMap<String, String> = [
        ("lock.max-multi-keys", "64"),
        ("lock.max-overtakes", "8"),
        ("lock.max-owner-bytes", "1024"),
        ("lock.max-waiters", "10000"),
        ("lock.failover-token-margin-ms", "60000"),
        ("lock.max-session-ttl-ms", "86400000"),
        ("lock.max-sessions", "100000"),
        ("lock.max-session-holds", "100000"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(all, expected, "CONFIG GET lock.*");

    assert_eq!(config_set(&mut c, "lock.max-waiters", "5"), Ok(Value::Okay));
    assert_eq!(config_get(&mut c, "lock.max-waiters"), "5");

    for (name, bad) in [
        ("lock.max-owner-bytes", "0"),
        ("lock.max-owner-bytes", "-1"),
        ("lock.max-owner-bytes", "abc"),
        ("lock.max-waiters", "-1"),
        ("lock.max-waiters", "abc"),
        ("lock.max-multi-keys", "0"),
        ("lock.max-overtakes", "-1"),
        ("lock.max-overtakes", "1001"),
        ("lock.max-session-ttl-ms", "0"),
        ("lock.max-sessions", "-1"),
        ("lock.max-session-holds", "0"),
    ] {
        let before = config_get(&mut c, name);
        assert_err_code(config_set(&mut c, name, bad), "ERR");
        assert_eq!(
            config_get(&mut c, name),
            before,
            "{name} after CONFIG SET {bad}"
        );
    }
    assert_eq!(config_get(&mut c, "lock.max-owner-bytes"), "1024");
    assert_eq!(config_get(&mut c, "lock.max-waiters"), "5");

    // A new value takes effect at once.
    assert_eq!(
        config_set(&mut c, "lock.max-owner-bytes", "4"),
        Ok(Value::Okay)
    );
    let key = unique_key("config");
    assert_err(
        call(&mut c, "LOCK.ACQUIRE", &[key.as_str(), "abcde", "1000"]),
        "ERR owner is longer than lock.max-owner-bytes (4)",
    );
    must_acquire(&mut c, &key, "abcd", 1_000);
}

#[test]
fn configs_accept_module_arguments_at_load() {
    let server =
        Server::start_with_module_args(&["max-owner-bytes", "16", "max-waiters", "3"], &[]);
    let mut c = server.conn();
    assert_eq!(config_get(&mut c, "lock.max-owner-bytes"), "16");
    assert_eq!(config_get(&mut c, "lock.max-waiters"), "3");

    let key = unique_key("config");
    assert_err(
        call(
            &mut c,
            "LOCK.ACQUIRE",
            &[key.as_str(), &"o".repeat(17), "1000"],
        ),
        "ERR owner is longer than lock.max-owner-bytes (16)",
    );
    must_acquire(&mut c, &key, "o".repeat(16), LONG_TTL);

    // Three waiters fit, the fourth is refused at once.
    let _waiters: Vec<TcpStream> = (1..=3)
        .map(|i| raw_waiter(&server, &mut c, &key, &format!("w{i}")))
        .collect();
    assert_err(
        block_cmd(&key, "w4", 1_000, 0).query::<Value>(&mut c),
        "ERR too many waiters on this key (lock.max-waiters is 3)",
    );
    assert_eq!(blocked_clients(&mut c), 3);
}
