//! A raw RESP2 subscriber to the change feed, written once for the feed's tests
//! (`tests/feed`, `tests/cluster/feed.rs`) and the benchmark (`feed_latency`): the test client
//! (redis-rs 0.27) has no sharded pub/sub, and a raw socket shows exactly the frames the server
//! sends.
//!
//! [`FeedSubscriber::on`] connects; [`FeedSubscriber::watch`] sends `LOCK.WATCH key` on the same
//! socket and [`FeedSubscriber::subscribe`] `SSUBSCRIBE channel`; [`FeedSubscriber::message`]
//! reads the next `smessage` ([`FeedSubscriber::message_within`]: waiting at most so long;
//! [`FeedSubscriber::next_message`]: split by [`FeedMessage::parse`], `seq event token ttl
//! owner`).

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::READ_TIMEOUT;

/// One RESP2 value as the subscriber reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resp {
    Bulk(Vec<u8>),
    Int(i64),
    Simple(String),
    Error(String),
    Nil,
    Array(Vec<Resp>),
}

/// A raw connection to one server, for `LOCK.WATCH` and `SSUBSCRIBE` and the messages after.
pub struct FeedSubscriber {
    /// The socket, for writing and for its read timeout.
    stream: TcpStream,
    /// The same socket, read through a buffer.
    reader: BufReader<TcpStream>,
    /// The channel subscribed to last (empty before [`FeedSubscriber::subscribe`]).
    pub channel: Vec<u8>,
}

/// One message of a key's channel: `seq event token ttl owner` (the owner may hold spaces).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeedMessage {
    pub seq: i64,
    pub event: String,
    pub token: i64,
    pub ttl: i64,
    pub owner: Vec<u8>,
}

impl FeedMessage {
    /// Split a message body; panics on a body that is not a feed message.
    #[track_caller]
    pub fn parse(body: &[u8]) -> FeedMessage {
        let mut parts = body.splitn(5, |b| *b == b' ');
        let mut field = || {
            let part = parts.next().unwrap_or_else(|| panic!("message {body:?}"));
            String::from_utf8_lossy(part).into_owned()
        };
        let (seq, event, token, ttl) = (field(), field(), field(), field());
        let owner = parts
            .next()
            .unwrap_or_else(|| panic!("no owner field in {body:?}"))
            .to_vec();
        let int = |s: &str| -> i64 { s.parse().unwrap_or_else(|_| panic!("message {body:?}")) };
        FeedMessage {
            seq: int(&seq),
            token: int(&token),
            ttl: int(&ttl),
            event,
            owner,
        }
    }
}

impl FeedSubscriber {
    /// Connect to 127.0.0.1:`port`; reads wait at most [`READ_TIMEOUT`] (then panic).
    pub fn on(port: u16) -> FeedSubscriber {
        let stream = TcpStream::connect(("127.0.0.1", port))
            .unwrap_or_else(|e| panic!("connect to 127.0.0.1:{port}: {e}"));
        stream.set_nodelay(true).unwrap();
        stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        let reader = BufReader::new(stream.try_clone().unwrap());
        FeedSubscriber {
            stream,
            reader,
            channel: Vec::new(),
        }
    }

    /// Connect to `port` and subscribe to `channel` (nothing watched).
    pub fn listen(port: u16, channel: &[u8]) -> FeedSubscriber {
        let mut sub = FeedSubscriber::on(port);
        sub.subscribe(channel);
        sub
    }

    /// Connect to `port`, `LOCK.WATCH key` (in database `db`) and subscribe to the channel it
    /// names: the subscriber and the seq `LOCK.WATCH` answered.
    pub fn watching(port: u16, db: i64, key: &[u8]) -> (FeedSubscriber, i64) {
        let mut sub = FeedSubscriber::on(port);
        if db != 0 {
            sub.send(&[b"SELECT", db.to_string().as_bytes()]);
            assert_eq!(sub.read(), Resp::Simple("OK".into()), "SELECT {db}");
        }
        let (channel, seq) = sub.watch(key);
        sub.subscribe(&channel);
        (sub, seq)
    }

    /// `LOCK.WATCH key`: (channel, seq); panics on any other reply.
    #[track_caller]
    pub fn watch(&mut self, key: &[u8]) -> (Vec<u8>, i64) {
        self.send(&[b"LOCK.WATCH", key]);
        match self.read() {
            Resp::Array(v) => match v.as_slice() {
                [Resp::Bulk(channel), Resp::Int(seq)] => (channel.clone(), *seq),
                other => panic!("LOCK.WATCH: {other:?}"),
            },
            other => panic!("LOCK.WATCH: {other:?}"),
        }
    }

    /// `SSUBSCRIBE channel`, checking the confirmation; later messages come from this channel.
    #[track_caller]
    pub fn subscribe(&mut self, channel: &[u8]) {
        self.send(&[b"SSUBSCRIBE", channel]);
        match self.read() {
            Resp::Array(v) if v.first() == Some(&Resp::Bulk(b"ssubscribe".to_vec())) => {}
            other => panic!(
                "SSUBSCRIBE {:?}: {other:?}",
                String::from_utf8_lossy(channel)
            ),
        }
        self.channel = channel.to_vec();
    }

    /// Send one command.
    pub fn send(&mut self, args: &[&[u8]]) {
        let mut frame = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            frame.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            frame.extend_from_slice(a);
            frame.extend_from_slice(b"\r\n");
        }
        self.stream
            .write_all(&frame)
            .expect("write to the subscriber");
    }

    /// Read one value, waiting at most [`READ_TIMEOUT`] for it.
    #[track_caller]
    pub fn read(&mut self) -> Resp {
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
                self.reader
                    .read_exact(&mut buf)
                    .expect("read a bulk string");
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

    /// Read one value if its first byte arrives within `wait`, else `None` (nothing read: a
    /// frame is read whole once it began, within [`READ_TIMEOUT`]).
    #[track_caller]
    pub fn read_within(&mut self, wait: Duration) -> Option<Resp> {
        if self.reader.buffer().is_empty() {
            // A zero timeout would mean "none" to the socket.
            self.stream
                .set_read_timeout(Some(wait.max(Duration::from_micros(1))))
                .unwrap();
            let filled = self.reader.fill_buf().map(|b| b.len());
            self.stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
            match filled {
                Ok(0) => panic!("the server closed the subscriber's connection"),
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return None
                }
                Err(e) => panic!("read from the subscriber: {e}"),
            }
        }
        Some(self.read())
    }

    /// The next message's body on the subscribed channel.
    #[track_caller]
    pub fn message(&mut self) -> Vec<u8> {
        let frame = self.read();
        self.body_of(frame)
    }

    /// The next message's body if it begins to arrive within `wait`.
    #[track_caller]
    pub fn message_within(&mut self, wait: Duration) -> Option<Vec<u8>> {
        self.read_within(wait).map(|frame| self.body_of(frame))
    }

    /// The next message, parsed.
    #[track_caller]
    pub fn next_message(&mut self) -> FeedMessage {
        FeedMessage::parse(&self.message())
    }

    /// Nothing at all arrives within `wait`.
    #[track_caller]
    pub fn expect_silence(&mut self, wait: Duration) {
        if let Some(frame) = self.read_within(wait) {
            panic!("a frame arrived: {frame:?}");
        }
    }

    #[track_caller]
    fn body_of(&self, frame: Resp) -> Vec<u8> {
        match frame {
            Resp::Array(v) => match <[Resp; 3]>::try_from(v) {
                Ok([Resp::Bulk(kind), Resp::Bulk(channel), Resp::Bulk(body)])
                    if kind == b"smessage" =>
                {
                    assert_eq!(
                        channel,
                        self.channel,
                        "a message of {:?}",
                        String::from_utf8_lossy(&channel)
                    );
                    body
                }
                other => panic!("not a message: {other:?}"),
            },
            other => panic!("not a message: {other:?}"),
        }
    }
}
