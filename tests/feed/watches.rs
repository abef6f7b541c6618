//! Channels, sequence numbers, who is watching, and how a subscriber resynchronises.

use super::*;

#[test]
fn the_channel_carries_a_tag_of_the_keys_slot_and_the_database() {
    let (server, mut c) = start();
    for (key, db) in [
        ("plain-key", 0),
        ("{user1000}.following", 0),
        ("foo{}{bar}", 3),
        ("a{b}c", 5),
    ] {
        let sub = Subscriber::start(&server, db, key);
        let channel = String::from_utf8(sub.channel.clone()).unwrap();
        let rest = channel.strip_prefix("lock.feed:{").expect(&channel);
        let (tag, rest) = rest.split_once('}').expect(&channel);
        assert_eq!(rest, format!(":{db}:{key}"), "{channel}");
        // The channel's slot is the key's slot (pub/sub routes a channel like a key).
        let key_slot = slot_of(&mut c, key);
        assert_eq!(
            slot_of(&mut c, &format!("{{{tag}}}")),
            key_slot,
            "{channel}"
        );
    }
}

/// `CLUSTER KEYSLOT` needs cluster mode; the server's rule is the same as `slots::key_slot`,
/// which the module's unit tests check against known slots. Here: the tag's own slot and the
/// key's slot computed the same way.
fn slot_of(_c: &mut Connection, key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|b| *b == b'{').and_then(|open| {
        let len = bytes[open + 1..].iter().position(|b| *b == b'}')?;
        (len > 0).then(|| &bytes[open + 1..open + 1 + len])
    });
    crc16(tagged.unwrap_or(bytes)) & 16383
}

fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for byte in data {
        crc ^= (*byte as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[test]
fn seq_is_shown_by_lock_info_while_watched_and_watch_again_reads_it() {
    let (server, mut c) = start();
    let key = new_key();
    grant(&mut c, &key, "alice", 60_000, &[]);
    assert_eq!(info_seq(&mut c, &key), None, "no seq while nobody watches");
    let mut sub = Subscriber::start(&server, 0, &key);
    assert_eq!(info_seq(&mut c, &key), Some(0));
    extend(&mut c, &key, "alice", 60_000);
    extend(&mut c, &key, "alice", 60_000);
    assert_eq!(sub.next().seq, 1);
    assert_eq!(sub.next().seq, 2);
    assert_eq!(info_seq(&mut c, &key), Some(2));
    // Watching again (any connection) answers the current seq: how a subscriber that lost
    // messages learns where the feed is.
    assert_eq!(watch(&mut c, &key).1, 2);
}

#[test]
fn an_unwatched_key_publishes_nothing_and_a_watch_ends_with_its_connection() {
    let (server, mut c) = start();
    let key = new_key();
    let t = grant(&mut c, &key, "alice", 60_000, &[]);
    // The channel's name, then no watch: a subscriber hears nothing.
    let (channel, _) = watch(&mut c, &key);
    assert_eq!(call(&mut c, "LOCK.UNWATCH", &[&key]), Ok(Value::Int(1)));
    assert_eq!(call(&mut c, "LOCK.UNWATCH", &[&key]), Ok(Value::Int(0)));
    let mut sub = Subscriber::listen(&server, &channel);
    extend(&mut c, &key, "alice", 60_000);
    sub.expect_silence(Duration::from_millis(200));
    assert_eq!(info_seq(&mut c, &key), None);
    // A watch on another connection: the feed flows (seq 1 after the one before).
    let mut watcher = server.conn();
    assert_eq!(watch(&mut watcher, &key).1, 0);
    extend(&mut c, &key, "alice", 60_000);
    sub.expect(&[("extended", "alice", t)]);
    // That connection closes: its watch ends, and nothing is published any more.
    drop(watcher);
    wait_until(
        "the watch ends with its connection",
        Duration::from_secs(5),
        || info_seq(&mut c, &key).is_none(),
    );
    extend(&mut c, &key, "alice", 60_000);
    sub.expect_silence(Duration::from_millis(200));
}

#[test]
fn a_subscriber_that_reconnects_finds_the_gap_and_resynchronises() {
    let (server, mut c) = start();
    let key = new_key();
    let mut sub = Subscriber::start(&server, 0, &key);
    let t1 = grant(&mut c, &key, "alice", 60_000, &[]);
    sub.expect(&[("acquired", "alice", t1)]);
    let seen = sub.seq;
    // A watch of our own keeps the feed going while the subscriber is away (its own watch
    // ends with its connection).
    watch(&mut c, &key);
    drop(sub);
    assert_eq!(release(&mut c, &key, "alice"), 1);
    let t2 = grant(&mut c, &key, "bob", 60_000, &[]);
    // Reconnected: the watch's seq is past what it saw (a gap), so it re-reads LOCK.INFO.
    let mut sub = Subscriber::start(&server, 0, &key);
    assert_eq!(
        sub.seq,
        seen + 2,
        "released + acquired happened while it was away"
    );
    assert_eq!(fence(&mut c, &key), Some(t2));
    assert_eq!(info_seq(&mut c, &key), Some(seen + 2));
    extend(&mut c, &key, "bob", 60_000);
    sub.expect(&[("extended", "bob", t2)]);
}

#[test]
fn lock_watch_refuses_what_it_must() {
    let (_server, mut c) = start();
    let string = new_key();
    redis::cmd("SET")
        .arg(&string)
        .arg("v")
        .query::<()>(&mut c)
        .unwrap();
    assert_err(
        call(&mut c, "LOCK.WATCH", &[&string]),
        "WRONGTYPE Operation against a key holding the wrong kind of value",
    );
    assert_err(
        call(&mut c, "LOCK.WATCH", &["a", "b"]),
        "ERR wrong number of arguments for 'lock.watch' command",
    );
    // A free key can be watched (the feed then tells who takes it).
    let (channel, seq) = watch(&mut c, &new_key());
    assert!(channel.starts_with(b"lock.feed:{"));
    assert_eq!(seq, 0);
}
