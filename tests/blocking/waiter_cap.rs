//! `lock.max-waiters`: set with `CONFIG SET` or as a module argument, it caps the queue.

use super::*;

/// With `lock.max-waiters` 2: two waiters queue, a third is refused at once and
/// never queued.
fn cap_of_two_is_enforced(server: &Server) {
    let mut c = server.conn();
    assert_eq!(config_get(&mut c, "lock.max-waiters"), "2");
    let key = new_key();
    let holder_token = must_acquire(&mut c, &key, "holder", LONG_TTL);
    let first = Waiter::start(server, &mut c, &key, "first", WAITER_TTL, "0");
    let second = Waiter::start(server, &mut c, &key, "second", WAITER_TTL, "0");

    let mut third = server.conn();
    assert_err(
        call(
            &mut third,
            "LOCK.ACQUIRE",
            &block_args(&key, "third", WAITER_TTL, "0"),
        ),
        "ERR too many waiters on this key (lock.max-waiters is 2)",
    );
    assert_eq!(blocked_clients(&mut c), 2);
    assert_held(&mut c, &key, holder_token, LONG_TTL);

    // Another key has a queue of its own.
    let other = new_key();
    must_acquire(&mut c, &other, "holder", LONG_TTL);
    let elsewhere = Waiter::start(server, &mut c, &other, "third", WAITER_TTL, "0");

    assert_eq!(release(&mut c, &key, "holder"), 1);
    let t1 = first.token();
    assert_eq!(release(&mut c, &key, "first"), 1);
    let t2 = second.token();
    assert!(holder_token < t1 && t1 < t2);
    assert_eq!(release(&mut c, &key, "third"), 0);
    release_last(&mut c, &key, "second");

    assert_eq!(release(&mut c, &other, "holder"), 1);
    elsewhere.token();
}

#[test]
fn waiter_cap_set_with_config_set() {
    let (server, mut c) = start();
    assert_eq!(config_get(&mut c, "lock.max-waiters"), "10000");
    ok(
        call(&mut c, "CONFIG", &["SET", "lock.max-waiters", "2"]),
        "CONFIG SET",
    );
    cap_of_two_is_enforced(&server);
}

#[test]
fn waiter_cap_set_as_module_argument() {
    let server = Server::start_with_module_args(&["max-waiters", "2"], &[]);
    cap_of_two_is_enforced(&server);
}
