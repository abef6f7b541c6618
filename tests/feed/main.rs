//! The change feed against a real server: `LOCK.WATCH`, then `SSUBSCRIBE` to the channel it
//! names, and every change of the key's holders arrives, in order, one message each, a handoff
//! as one message; a key nobody watches publishes nothing; a watch ends with its connection.
//!
//! The subscriber is the harness's raw RESP2 socket (`harness/src/feed.rs`: the test client has
//! no sharded pub/sub), so that the test sees exactly the frames the server sends. Layout: `events.rs` (every event, in order),
//! `watches.rs` (channels, seq, who is watching, resynchronising); the cluster test is in
//! `tests/cluster/feed.rs`.

#[path = "../common/mod.rs"]
mod common;

mod events;
mod watches;

use std::time::Duration;

use common::*;
use harness::feed::{FeedMessage, FeedSubscriber};
use redis::{Connection, Value};

fn new_key() -> String {
    unique_key("feed")
}

/// The harness's raw subscriber, keeping the seq of the last message seen.
struct Subscriber {
    raw: FeedSubscriber,
    /// The channel subscribed to.
    pub channel: Vec<u8>,
    /// The seq `LOCK.WATCH` answered, then that of the last message [`Subscriber::expect`] saw.
    pub seq: i64,
}

impl Subscriber {
    /// Watch `key` (in database `db`) and subscribe to its channel.
    fn start(server: &Server, db: i64, key: &str) -> Subscriber {
        let (raw, seq) = FeedSubscriber::watching(server.port(), db, key.as_bytes());
        let channel = raw.channel.clone();
        Subscriber { raw, channel, seq }
    }

    /// Subscribe to `channel` without watching anything.
    fn listen(server: &Server, channel: &[u8]) -> Subscriber {
        Subscriber {
            raw: FeedSubscriber::listen(server.port(), channel),
            channel: channel.to_vec(),
            seq: 0,
        }
    }

    /// The next message on the channel, split.
    #[track_caller]
    fn next(&mut self) -> FeedMessage {
        self.raw.next_message()
    }

    /// The next messages as (event, owner, token), checking that seq goes up by one from the
    /// last one seen (`self.seq`).
    #[track_caller]
    fn expect(&mut self, want: &[(&str, &str, i64)]) {
        for (event, owner, token) in want {
            let m = self.next();
            assert_eq!(
                m.seq,
                self.seq + 1,
                "seq after {} (message {m:?})",
                self.seq
            );
            self.seq = m.seq;
            assert_eq!(
                (m.event.as_str(), m.owner.as_slice(), m.token),
                (*event, owner.as_bytes(), *token),
                "message {m:?}"
            );
        }
    }

    /// Nothing more arrives within `wait`.
    #[track_caller]
    fn expect_silence(&mut self, wait: Duration) {
        self.raw.expect_silence(wait);
    }
}

/// `LOCK.ACQUIRE key owner ttl [extra...]` that must grant.
#[track_caller]
fn grant(c: &mut Connection, key: &str, owner: &str, ttl: i64, extra: &[&str]) -> i64 {
    let mut args = vec![key.to_string(), owner.to_string(), ttl.to_string()];
    args.extend(extra.iter().map(|e| e.to_string()));
    match call(c, "LOCK.ACQUIRE", &args) {
        Ok(Value::Int(t)) => t,
        other => panic!("LOCK.ACQUIRE {key} {owner}: {other:?}"),
    }
}

/// A waiter blocked on its own connection; returns its token when granted.
fn waiter(server: &Server, ctl: &mut Connection, args: &[&str]) -> std::thread::JoinHandle<i64> {
    let before = blocked_clients(ctl);
    let mut conn = server.conn();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let handle = std::thread::spawn(move || match call(&mut conn, "LOCK.ACQUIRE", &args) {
        Ok(Value::Int(t)) => t,
        other => panic!("waiter: {other:?}"),
    });
    wait_blocked(ctl, before + 1);
    handle
}

/// The `seq` field of `LOCK.INFO key`, `None` when the key is not watched (or free).
fn info_seq(c: &mut Connection, key: &str) -> Option<i64> {
    match call(c, "LOCK.INFO", &[key]).unwrap() {
        Value::Nil => None,
        Value::Array(items) => items.chunks(2).find_map(|kv| match (&kv[0], &kv[1]) {
            (Value::BulkString(k), Value::Int(n)) if k == b"seq" => Some(*n),
            _ => None,
        }),
        other => panic!("{other:?}"),
    }
}

/// `LOCK.WATCH key` on `c`: (channel, seq).
fn watch(c: &mut Connection, key: &str) -> (Vec<u8>, i64) {
    match call(c, "LOCK.WATCH", &[key]).unwrap() {
        Value::Array(v) => match v.as_slice() {
            [Value::BulkString(ch), Value::Int(seq)] => (ch.clone(), *seq),
            other => panic!("LOCK.WATCH: {other:?}"),
        },
        other => panic!("LOCK.WATCH: {other:?}"),
    }
}
