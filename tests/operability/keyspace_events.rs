//! Keyspace events of class `d`: one per lock lifecycle step when enabled, none by default.

use super::*;

/// The pattern every test subscribes to, and a marker channel it matches, published by the
/// test after the commands so the subscriber knows it has seen everything before it.
const LOCK_EVENTS: &str = "__keyevent@0__:lock.*";
const MARKER: &str = "__keyevent@0__:lock.test-marker";

/// Subscribe to `LOCK_EVENTS`, run `commands` on `c`, publish the marker, and return every
/// `(channel, key)` event the subscriber received before the marker, in order.
fn lock_events(
    server: &Server,
    c: &mut Connection,
    commands: impl FnOnce(&mut Connection),
) -> Vec<(String, String)> {
    let mut sub = server.conn();
    let mut pubsub = sub.as_pubsub();
    pubsub.set_read_timeout(Some(PATIENCE)).unwrap();
    pubsub.psubscribe(LOCK_EVENTS).unwrap();

    commands(c);
    let _: i64 = redis::cmd("PUBLISH")
        .arg(MARKER)
        .arg("end")
        .query(c)
        .unwrap();

    let mut got = Vec::new();
    loop {
        let msg = pubsub.get_message().expect("keyspace event");
        let channel = msg.get_channel_name().to_string();
        let payload: String = msg.get_payload().unwrap();
        if channel == MARKER {
            assert_eq!(payload, "end", "the marker's payload");
            return got;
        }
        got.push((channel, payload));
    }
}

#[test]
fn keyspace_events_follow_the_lock_lifecycle() {
    let (server, mut c) = start();
    assert_eq!(
        config_set(&mut c, "notify-keyspace-events", "KEd"),
        Ok(Value::Okay)
    );
    let key = unique_key("events");
    let got = lock_events(&server, &mut c, |c| {
        must_acquire(c, &key, "a", LONG_TTL);
        assert_eq!(extend(c, &key, "a", LONG_TTL), 1);
        let waiter = start_waiter(&server, c, &key, "b", LONG_TTL, 0);
        assert_eq!(release(c, &key, "a"), 1);
        granted(waiter);
        assert_eq!(release(c, &key, "b"), 1);
    });
    let want: Vec<(String, String)> = [
        "lock.acquired",
        "lock.extended",
        "lock.released",
        "lock.acquired",
        "lock.released",
    ]
    .iter()
    .map(|e| (format!("__keyevent@0__:{e}"), key.clone()))
    .collect();
    assert_eq!(got, want);
}

#[test]
fn keyspace_events_are_off_by_default() {
    let (server, mut c) = start();
    assert_eq!(config_get(&mut c, "notify-keyspace-events"), "");
    let key = unique_key("events");
    let got = lock_events(&server, &mut c, |c| {
        must_acquire(c, &key, "a", LONG_TTL);
        assert_eq!(extend(c, &key, "a", LONG_TTL), 1);
        assert_eq!(release(c, &key, "a"), 1);
    });
    assert_eq!(
        got,
        [],
        "the first message after the commands must be the marker"
    );
}
