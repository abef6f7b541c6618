//! The change feed against a real server: `LOCK.WATCH`, then `SSUBSCRIBE` to the channel it
//! names, and every change of the key's holders arrives, in order, one message each, a handoff
//! as one message; a key nobody watches publishes nothing; a watch ends with its connection.
//!
//! The subscriber is a raw RESP2 socket (the test client has no sharded pub/sub), so that the
//! test sees exactly the frames the server sends. Layout: `events.rs` (every event, in order),
//! `watches.rs` (channels, seq, who is watching, resynchronising); the cluster test is in
//! `tests/cluster/feed.rs`.

#[path = "../common/mod.rs"]
mod common;

mod events;
mod watches;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::*;
use redis::{Connection, Value};

fn new_key() -> String {
    unique_key("feed")
}

/// One RESP2 value as the subscriber reads it.
#[derive(Debug, Clone, PartialEq)]
enum Resp {
    Bulk(Vec<u8>),
    Int(i64),
    Simple(String),
    Error(String),
    Nil,
    Array(Vec<Resp>),
}

/// A raw connection: `LOCK.WATCH` then `SSUBSCRIBE` on the same socket.
struct Subscriber {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
    pub channel: Vec<u8>,
    /// The seq `LOCK.WATCH` answered.
    pub seq: i64,
}

impl Subscriber {
    /// Watch `key` (in database `db`) and subscribe to its channel.
    fn start(server: &Server, db: i64, key: &str) -> Subscriber {
        let stream = TcpStream::connect(server.addr()).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let reader = BufReader::new(stream.try_clone().unwrap());
        let mut sub = Subscriber {
            stream,
            reader,
            channel: vec![],
            seq: 0,
        };
        if db != 0 {
            sub.send(&[b"SELECT", db.to_string().as_bytes()]);
            assert_eq!(sub.read(), Resp::Simple("OK".into()));
        }
        sub.send(&[b"LOCK.WATCH", key.as_bytes()]);
        match sub.read() {
            Resp::Array(v) => match v.as_slice() {
                [Resp::Bulk(channel), Resp::Int(seq)] => {
                    sub.channel = channel.clone();
                    sub.seq = *seq;
                }
                other => panic!("LOCK.WATCH: {other:?}"),
            },
            other => panic!("LOCK.WATCH: {other:?}"),
        }
        let channel = sub.channel.clone();
        sub.send(&[b"SSUBSCRIBE", &channel]);
        match sub.read() {
            Resp::Array(v) => assert_eq!(v[0], Resp::Bulk(b"ssubscribe".to_vec())),
            other => panic!("SSUBSCRIBE: {other:?}"),
        }
        sub
    }

    /// Subscribe to `channel` without watching anything.
    fn listen(server: &Server, channel: &[u8]) -> Subscriber {
        let stream = TcpStream::connect(server.addr()).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let reader = BufReader::new(stream.try_clone().unwrap());
        let mut sub = Subscriber {
            stream,
            reader,
            channel: channel.to_vec(),
            seq: 0,
        };
        sub.send(&[b"SSUBSCRIBE", channel]);
        match sub.read() {
            Resp::Array(v) => assert_eq!(v[0], Resp::Bulk(b"ssubscribe".to_vec())),
            other => panic!("SSUBSCRIBE: {other:?}"),
        }
        sub
    }

    fn send(&mut self, args: &[&[u8]]) {
        let mut frame = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            frame.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            frame.extend_from_slice(a);
            frame.extend_from_slice(b"\r\n");
        }
        self.stream.write_all(&frame).unwrap();
    }

    fn read(&mut self) -> Resp {
        let mut line = Vec::new();
        self.reader
            .read_until(b'\n', &mut line)
            .expect("read a frame");
        assert!(line.ends_with(b"\r\n"), "frame {line:?}");
        let body = String::from_utf8_lossy(&line[1..line.len() - 2]).into_owned();
        match line[0] {
            b'+' => Resp::Simple(body),
            b'-' => Resp::Error(body),
            b':' => Resp::Int(body.parse().unwrap()),
            b'$' => {
                let n: i64 = body.parse().unwrap();
                if n < 0 {
                    return Resp::Nil;
                }
                let mut buf = vec![0u8; n as usize + 2];
                std::io::Read::read_exact(&mut self.reader, &mut buf).unwrap();
                buf.truncate(n as usize);
                Resp::Bulk(buf)
            }
            b'*' => {
                let n: i64 = body.parse().unwrap();
                Resp::Array((0..n).map(|_| self.read()).collect())
            }
            other => panic!("unexpected frame type {other}"),
        }
    }

    /// The next message on the channel, split: (seq, event, token, ttl, owner).
    #[track_caller]
    fn next(&mut self) -> Message {
        match self.read() {
            Resp::Array(v) => match v.as_slice() {
                [Resp::Bulk(kind), Resp::Bulk(channel), Resp::Bulk(body)]
                    if kind == b"smessage" =>
                {
                    assert_eq!(channel, &self.channel);
                    Message::parse(body)
                }
                other => panic!("not a message: {other:?}"),
            },
            other => panic!("not a message: {other:?}"),
        }
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
        self.stream.set_read_timeout(Some(wait)).unwrap();
        let mut byte = [0u8; 1];
        let got = std::io::Read::read(&mut self.reader, &mut byte);
        assert!(got.is_err(), "a message arrived: {:?}", byte);
        self.stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
    }
}

#[derive(Debug)]
struct Message {
    seq: i64,
    event: String,
    token: i64,
    ttl: i64,
    owner: Vec<u8>,
}

impl Message {
    fn parse(body: &[u8]) -> Message {
        let mut parts = body.splitn(5, |b| *b == b' ');
        let mut field = || String::from_utf8_lossy(parts.next().expect("a field")).into_owned();
        let (seq, event, token, ttl) = (field(), field(), field(), field());
        let owner = parts.next().expect("the owner field").to_vec();
        Message {
            seq: seq.parse().unwrap(),
            event,
            token: token.parse().unwrap(),
            ttl: ttl.parse().unwrap(),
            owner,
        }
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
