//! The feed's pub/sub connection as a plain socket (TCP or Unix) with a small RESP2 reader,
//! for `subscriber.rs`: a RESP2 connection that has subscribed receives pushes and sends only
//! (un)subscribe and `PING`, so one handle reads in the subscriber's thread while a clone
//! writes from whichever thread watches, with no lock between them. A read that times out
//! loses nothing: bytes are kept until a whole frame has arrived.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use redis::ConnectionAddr;

use crate::client::Endpoint;
use crate::error::Error;

/// A new pub/sub connection to `endpoint` (authenticated if the URL has credentials): the
/// reading and the writing handle.
pub(crate) fn connect(endpoint: &Endpoint) -> Result<(Stream, Stream), Error> {
    let redis = endpoint.redis();
    let info = redis.get_connection_info();
    let timeout = endpoint.connect_timeout;
    let mut stream = match &info.addr {
        ConnectionAddr::Tcp(host, port) => {
            let addr = (host.as_str(), *port)
                .to_socket_addrs()
                .map_err(io_error)?
                .next()
                .ok_or_else(|| io_error(io::Error::other("no address for the host")))?;
            let tcp = TcpStream::connect_timeout(&addr, timeout).map_err(io_error)?;
            let _ = tcp.set_nodelay(true);
            Stream::Tcp(tcp)
        }
        ConnectionAddr::Unix(path) => Stream::Unix(UnixStream::connect(path).map_err(io_error)?),
        ConnectionAddr::TcpTls { .. } => {
            return Err(Error::InvalidArgument(
                "the change feed needs a plain TCP or Unix connection (not TLS)",
            ))
        }
    };
    stream.set_timeouts(Some(timeout)).map_err(io_error)?;
    if let Some(password) = &info.redis.password {
        let mut auth: Vec<&[u8]> = vec![b"AUTH"];
        if let Some(user) = &info.redis.username {
            auth.push(user.as_bytes());
        }
        auth.push(password.as_bytes());
        stream.write_all(&encode(&auth)).map_err(io_error)?;
        let mut buf = Vec::new();
        match read_frame(&mut stream, &mut buf).map_err(io_error)? {
            Frame::Simple(_) => {}
            Frame::Error(e) => {
                return Err(Error::Server(redis::RedisError::from((
                    redis::ErrorKind::AuthenticationFailed,
                    "AUTH on the feed connection",
                    e,
                ))))
            }
            other => {
                return Err(Error::UnexpectedReply {
                    command: "AUTH",
                    reply: format!("{other:?}"),
                })
            }
        }
    }
    let writer = stream.try_clone().map_err(io_error)?;
    writer
        .set_write_timeout(Some(endpoint.io_timeout))
        .map_err(io_error)?;
    Ok((stream, writer))
}

/// An I/O error of a feed connection.
pub(crate) fn io_error(e: io::Error) -> Error {
    Error::Connection(redis::RedisError::from(e))
}

/// A pub/sub connection: TCP or a Unix socket.
pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    pub(crate) fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    pub(crate) fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s) => s.set_read_timeout(t),
        }
    }

    pub(crate) fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(t),
            Stream::Unix(s) => s.set_write_timeout(t),
        }
    }

    fn set_timeouts(&self, t: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(t)?;
        self.set_write_timeout(t)
    }

    fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            Stream::Unix(s) => s.flush(),
        }
    }
}

/// Write a command on the pub/sub connection, if it is connected; a failure closes it (the
/// reader then sees the loss and reconnects).
pub(crate) fn send(writer: &mut Option<Stream>, args: &[&[u8]]) {
    if let Some(w) = writer.as_mut() {
        if w.write_all(&encode(args)).is_err() {
            shutdown(writer);
        }
    }
}

/// Close the pub/sub connection: the reader sees it end and reconnects.
pub(crate) fn shutdown(writer: &mut Option<Stream>) {
    if let Some(w) = writer.take() {
        w.shutdown();
    }
}

/// A command as RESP: an array of bulk strings.
fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// A RESP2 reply (what a subscribed connection receives). Only arrays of bulk strings are read
/// for what they hold; the other kinds are shown in errors (`Debug`).
#[derive(Debug)]
#[allow(dead_code)]
pub(crate) enum Frame {
    Simple(Vec<u8>),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<Frame>),
}

/// Read one frame from a blocking stream (for the `AUTH` reply).
fn read_frame(stream: &mut Stream, buf: &mut Vec<u8>) -> io::Result<Frame> {
    loop {
        if let Some((frame, used)) = parse(buf)? {
            buf.drain(..used);
            return Ok(frame);
        }
        let mut chunk = [0u8; 1024];
        match stream.read(&mut chunk)? {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// The first complete frame of `buf` and how many bytes it took; `None` if incomplete.
pub(crate) fn parse(buf: &[u8]) -> io::Result<Option<(Frame, usize)>> {
    let bad = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "malformed reply on the feed connection",
        )
    };
    let Some(end) = buf.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    let (kind, line) = (buf.first().copied().ok_or_else(bad)?, &buf[1..end]);
    let next = end + 2;
    let number = || -> io::Result<i64> {
        std::str::from_utf8(line)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(bad)
    };
    Ok(match kind {
        b'+' => Some((Frame::Simple(line.to_vec()), next)),
        b'-' => Some((
            Frame::Error(String::from_utf8_lossy(line).into_owned()),
            next,
        )),
        b':' => Some((Frame::Int(number()?), next)),
        b'$' => {
            let n = number()?;
            if n < 0 {
                return Ok(Some((Frame::Nil, next)));
            }
            let n = n as usize;
            if buf.len() < next + n + 2 {
                return Ok(None);
            }
            if &buf[next + n..next + n + 2] != b"\r\n" {
                return Err(bad()); // longer than its length
            }
            Some((Frame::Bulk(buf[next..next + n].to_vec()), next + n + 2))
        }
        b'*' | b'>' => {
            let n = number()?;
            let mut items = Vec::new();
            let mut at = next;
            for _ in 0..n.max(0) {
                match parse(&buf[at..])? {
                    Some((item, used)) => {
                        items.push(item);
                        at += used;
                    }
                    None => return Ok(None),
                }
            }
            Some((Frame::Array(items), at))
        }
        _ => return Err(bad()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_parse_whole_or_not_at_all() {
        let msg = b"*3\r\n$8\r\nsmessage\r\n$3\r\nch1\r\n$11\r\n1 acquired \r\n";
        let (frame, used) = parse(msg).unwrap().unwrap();
        assert_eq!(used, msg.len());
        let Frame::Array(items) = frame else { panic!() };
        assert!(matches!(&items[2], Frame::Bulk(b) if b == b"1 acquired "));
        for cut in 0..msg.len() {
            assert!(parse(&msg[..cut]).unwrap().is_none(), "cut at {cut}");
        }
        assert!(matches!(
            parse(b"+PONG\r\n").unwrap(),
            Some((Frame::Simple(_), 7))
        ));
        assert!(matches!(
            parse(b":3\r\n").unwrap(),
            Some((Frame::Int(3), 4))
        ));
        assert!(parse(b"?x\r\n").is_err());
        assert_eq!(encode(&[b"PING"]), b"*1\r\n$4\r\nPING\r\n");
        let bad = b"$3\r\nabcd\r\n";
        assert!(parse(bad).is_err(), "a bulk string longer than its length");
    }
}
