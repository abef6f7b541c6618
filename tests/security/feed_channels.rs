//! The change feed under ACL users: channel patterns keep a key's feed exactly as private as
//! the key. A key's channel is `lock.feed:{TAG}:DB:KEY`, where `TAG` is 1 to 3 letters or
//! digits (never `}`), so for a key pattern `P` in database `D` the three patterns
//! `lock.feed:{?}:D:P`, `lock.feed:{??}:D:P` and `lock.feed:{???}:D:P` match the channel of
//! every key `P` matches and of no other key: the first `}` of a channel always closes its tag.
//! (`lock.feed:*:D:P` would also match a key of another namespace whose name contains
//! `}:D:` followed by something `P` matches.) Channel permissions cover `SSUBSCRIBE` and
//! `SPUBLISH` alike; publishing is kept from a reader by the command rule (`-spublish`). The
//! module publishes itself, past every ACL.

use std::time::Duration;

use harness::feed::{FeedMessage, FeedSubscriber, Resp};
use redis::{Connection, Value};

use crate::common::*;

/// A reader of the `public:*` namespace in database 0: the keys read-only, their feeds to
/// subscribe to, and no publishing.
const READER_RULES: &[&str] = &[
    "on",
    ">pw",
    "resetkeys",
    "resetchannels",
    "%R~public:*",
    "&lock.feed:{?}:0:public:*",
    "&lock.feed:{??}:0:public:*",
    "&lock.feed:{???}:0:public:*",
    "-@all",
    "+lock.watch",
    "+lock.unwatch",
    "+lock.info",
    "+ssubscribe",
    "+sunsubscribe",
    "+ping",
];

fn setuser(c: &mut Connection, name: &str, rules: &[&str]) {
    let mut args = vec!["SETUSER", name];
    args.extend_from_slice(rules);
    assert_eq!(
        call(c, "ACL", &args).unwrap(),
        Value::Okay,
        "ACL SETUSER {name}"
    );
}

/// A raw connection (for `SSUBSCRIBE`) authenticated as `user`.
fn raw_as(server: &Server, user: &str) -> FeedSubscriber {
    let mut sub = FeedSubscriber::on(server.port());
    sub.send(&[b"AUTH", user.as_bytes(), b"pw"]);
    assert_eq!(sub.read(), Resp::Simple("OK".into()), "AUTH {user}");
    sub
}

fn conn_as(server: &Server, user: &str) -> Connection {
    let url = format!("redis://{user}:pw@127.0.0.1:{}/", server.port());
    redis::Client::open(url)
        .and_then(|client| client.get_connection())
        .unwrap_or_else(|e| panic!("connect as {user}: {e}"))
}

/// The channel `LOCK.WATCH key` names, from a connection of the default user (its watch
/// stays while `c` is open).
fn channel_of(c: &mut Connection, key: &str) -> Vec<u8> {
    match call(c, "LOCK.WATCH", &[key]).unwrap() {
        Value::Array(v) => match v.as_slice() {
            [Value::BulkString(channel), Value::Int(_)] => channel.clone(),
            other => panic!("LOCK.WATCH {key}: {other:?}"),
        },
        other => panic!("LOCK.WATCH {key}: {other:?}"),
    }
}

/// The server's NOPERM for a channel: Redis 7.0's words, or those of 7.2 and later (Redis 8.2,
/// Valkey).
const CHANNEL_REFUSED: [&str; 2] = [
    "NOPERM this user has no permissions to access one of the channels used as arguments",
    "NOPERM No permissions to access a channel",
];
/// The same for a key.
const KEY_REFUSED: [&str; 2] = [
    "NOPERM this user has no permissions to access one of the keys used as arguments",
    "NOPERM No permissions to access a key",
];

#[track_caller]
fn assert_refused(reply: Resp, expected: [&str; 2]) {
    match reply {
        Resp::Error(e) if expected.contains(&e.as_str()) => {}
        other => panic!("expected one of {expected:?}, got {other:?}"),
    }
}

#[track_caller]
fn assert_key_refused(reply: redis::RedisResult<Value>) {
    match reply {
        Err(e)
            if KEY_REFUSED.iter().any(|k| {
                k.split_once(' ') == Some(("NOPERM", e.detail().unwrap_or_default()))
                    && e.code() == Some("NOPERM")
            }) => {}
        other => panic!("expected one of {KEY_REFUSED:?}, got {other:?}"),
    }
}

#[test]
fn channel_patterns_make_a_feed_as_private_as_its_key() {
    let server = Server::start();
    let mut admin = server.conn();
    setuser(&mut admin, "reader", READER_RULES);
    // Keys of the default user's: one public, one secret, and a secret one whose name holds
    // what a careless pattern (`lock.feed:*:0:public:*`) would take for the public namespace.
    let public = "public:orders";
    let secret = "secret:payroll";
    let tricky = "secret:}:0:public:x";
    let mut watcher = server.conn();
    let public_channel = channel_of(&mut watcher, public);
    let secret_channel = channel_of(&mut watcher, secret);
    let tricky_channel = channel_of(&mut watcher, tricky);

    // The reader subscribes to the public key's feed and gets its messages.
    let mut sub = raw_as(&server, "reader");
    sub.subscribe(&public_channel);
    let token = must_acquire(&mut admin, public, "worker-1", 60_000);
    let m = FeedMessage::parse(&sub.message());
    assert_eq!(
        (m.seq, m.event.as_str(), m.token, m.owner.as_slice()),
        (1, "acquired", token, b"worker-1".as_slice())
    );

    // It is refused the secret keys' channels, the tricky one too.
    for channel in [&secret_channel, &tricky_channel] {
        let mut other = raw_as(&server, "reader");
        other.send(&[b"SSUBSCRIBE", channel]);
        assert_refused(other.read(), CHANNEL_REFUSED);
    }
    // ... which the naive pattern would have let through: the reason for `{?}`, `{??}`, `{???}`.
    setuser(
        &mut admin,
        "naive",
        &[
            "on",
            ">pw",
            "resetchannels",
            "&lock.feed:*:0:public:*",
            "+ssubscribe",
        ],
    );
    let mut naive = raw_as(&server, "naive");
    naive.send(&[b"SSUBSCRIBE", &tricky_channel]);
    assert!(matches!(naive.read(), Resp::Array(_)), "the naive pattern");

    // The secret key itself: LOCK.WATCH and LOCK.INFO are refused as for any key it may not read.
    let mut reader = conn_as(&server, "reader");
    must_acquire(&mut admin, secret, "payroll-run", 60_000);
    for command in ["LOCK.WATCH", "LOCK.INFO"] {
        assert_key_refused(call(&mut reader, command, &[secret]));
    }
    // And the public one is watched and read as usual.
    assert!(matches!(
        call(&mut reader, "LOCK.WATCH", &[public]).unwrap(),
        Value::Array(_)
    ));

    // A reader cannot forge: SPUBLISH is not among its commands.
    let mut forger = raw_as(&server, "reader");
    forger.send(&[b"SPUBLISH", &public_channel, b"2 released 1 0 worker-1"]);
    assert_refused(
        forger.read(),
        [
            "NOPERM this user has no permissions to run the 'spublish' command",
            "NOPERM User reader has no permissions to run the 'spublish' command",
        ],
    );
    // Nothing but the server's own next message reaches the subscriber.
    assert_eq!(
        call(&mut admin, "LOCK.RELEASE", &[public, "worker-1"]).unwrap(),
        Value::Int(1)
    );
    let m = FeedMessage::parse(&sub.message());
    assert_eq!((m.seq, m.event.as_str(), m.token), (2, "released", token));
    sub.expect_silence(Duration::from_millis(50));
}

#[test]
fn a_user_with_every_channel_reads_a_secret_keys_owner() {
    // What the rules above prevent, shown the other way: `&*` (the default user's, and the
    // default for new users before Redis 7.0's `acl-pubsub-default resetchannels`) opens
    // every feed, whatever the key patterns say.
    let server = Server::start();
    let mut admin = server.conn();
    setuser(
        &mut admin,
        "wide",
        &["on", ">pw", "resetkeys", "~public:*", "&*", "+@all"],
    );
    let mut wide = conn_as(&server, "wide");
    let secret = "secret:k";
    must_acquire(&mut admin, secret, "the-owner", 60_000);
    assert_key_refused(call(&mut wide, "LOCK.INFO", &[secret]));
    let mut watcher = server.conn();
    let channel = channel_of(&mut watcher, secret);
    let mut sub = raw_as(&server, "wide");
    sub.subscribe(&channel);
    assert_eq!(
        call(&mut admin, "LOCK.RELEASE", &[secret, "the-owner"]).unwrap(),
        Value::Int(1)
    );
    let m = FeedMessage::parse(&sub.message());
    assert_eq!(
        (m.event.as_str(), m.owner.as_slice()),
        ("released", b"the-owner".as_slice())
    );
}
