//! The pipelined load generator: many connections over raw RESP, N commands in flight each,
//! every reply checked, with the server's CPU and `INFO commandstats` read around it.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::Barrier;
use std::thread;
use std::time::Instant;

use redis::Connection;

use crate::config::DRIVER_THREADS;
use crate::server::{commandstats, reset_stats, server_cpu, Server};

/// Append one command in RESP to `out`.
pub fn resp(out: &mut Vec<u8>, args: &[&[u8]]) {
    let _ = write!(out, "*{}\r\n", args.len());
    for a in args {
        let _ = write!(out, "${}\r\n", a.len());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// Format `prefix:conn:i` into `buf` without allocating; returns the bytes used.
pub fn key_into<'a>(buf: &'a mut [u8; 64], prefix: &str, conn: usize, i: usize) -> &'a [u8] {
    let total = buf.len();
    let mut cur = &mut buf[..];
    let _ = write!(cur, "{prefix}:{conn}:{i}");
    let used = total - cur.len();
    &buf[..used]
}

/// One owner per connection of a load: `conns` random UUIDs (36 bytes each).
pub fn owners(conns: usize) -> Vec<String> {
    (0..conns)
        .map(|_| uuid::Uuid::new_v4().to_string())
        .collect()
}

/// Append a take of `key` for `owner` with a `ttl` (ms, as text): `LOCK.ACQUIRE key owner ttl`
/// when `lock`, else the classic `SET key owner NX PX ttl`; returns what its reply must be.
pub fn take(out: &mut Vec<u8>, lock: bool, key: &[u8], owner: &[u8], ttl: &[u8]) -> Expect {
    if lock {
        resp(out, &[b"LOCK.ACQUIRE", key, owner, ttl]);
        Expect::Token
    } else {
        resp(out, &[b"SET", key, owner, b"NX", b"PX", ttl]);
        Expect::Ok
    }
}

/// Take `load.conns * load.per_conn` distinct keys `prefix:conn:i` through the load generator
/// ([`take`]: locks when `lock`, else `SET NX PX` strings), connection `c` as `owners[c]`.
pub fn fill(
    srv: &Server,
    ctl: &mut Connection,
    load: Load,
    prefix: &str,
    lock: bool,
    owners: &[String],
    ttl: &str,
) -> Run {
    drive(srv, ctl, load, |c, i, out| {
        let mut kb = [0u8; 64];
        let k = key_into(&mut kb, prefix, c, i);
        take(out, lock, k, owners[c].as_bytes(), ttl.as_bytes())
    })
}

/// What a reply must be for the command to count as done.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Expect {
    /// A positive integer (a fencing token).
    Token,
    /// The integer 1 (a release or `DEL` that removed the key).
    One,
    /// `+OK` (a `SET` that took the key).
    Ok,
}

/// A reply line, judged against what was expected: `Ok(true)` done, `Ok(false)` refused (nil or
/// 0), `Err` anything else (an error reply aborts the benchmark: it means a broken setup).
pub fn judge(line: &[u8], want: Expect) -> Result<bool, String> {
    let text = || String::from_utf8_lossy(line).into_owned();
    match (line.first(), want) {
        (Some(b'-'), _) => Err(format!("error reply {:?}", text())),
        (Some(b':'), Expect::Token | Expect::One) => {
            let n: i64 = std::str::from_utf8(&line[1..])
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("bad integer reply {:?}", text()))?;
            Ok(if want == Expect::Token { n > 0 } else { n == 1 })
        }
        (Some(b'+'), Expect::Ok) => Ok(line == b"+OK"),
        (Some(b'$'), _) if line == b"$-1" => Ok(false),
        _ => Err(format!("unexpected reply {:?} (wanted {want:?})", text())),
    }
}

/// One connection of the load generator.
struct DriverConn {
    /// Connection number (0..conns), passed to the command generator.
    id: usize,
    stream: TcpStream,
    /// The batch being sent.
    out: Vec<u8>,
    /// What each reply of the batch in flight must be.
    expects: Vec<Expect>,
    /// Reply bytes read and not yet parsed.
    inbuf: Vec<u8>,
    /// Index of the next command to generate.
    next: usize,
}

impl DriverConn {
    /// Read and judge every reply of the batch in flight; returns (done, refused).
    fn read_replies(&mut self) -> io::Result<(u64, u64)> {
        let (mut done, mut refused) = (0, 0);
        let mut idx = 0;
        let mut pos = 0;
        self.inbuf.clear();
        let mut chunk = [0u8; 16 * 1024];
        // Every reply these commands get is one line (integer, status, nil or error).
        while idx < self.expects.len() {
            while idx < self.expects.len() {
                let Some(nl) = self.inbuf[pos..].iter().position(|&b| b == b'\n') else {
                    break;
                };
                let line = &self.inbuf[pos..pos + nl];
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                match judge(line, self.expects[idx]) {
                    Ok(true) => done += 1,
                    Ok(false) => refused += 1,
                    Err(e) => return Err(io::Error::other(e)),
                }
                pos += nl + 1;
                idx += 1;
            }
            if idx == self.expects.len() {
                break;
            }
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err(io::Error::other("server closed the connection"));
            }
            self.inbuf.extend_from_slice(&chunk[..n]);
        }
        self.expects.clear();
        Ok((done, refused))
    }
}

/// A load: `conns` connections, each sending `per_conn` commands, `depth` in flight at a time.
#[derive(Clone, Copy)]
pub struct Load {
    pub conns: usize,
    pub depth: usize,
    pub per_conn: usize,
}

/// What one run of the load generator measured.
#[derive(Clone, Debug, Default)]
pub struct Run {
    /// Commands whose reply was the expected success.
    pub done: u64,
    /// Commands refused (nil or 0).
    pub refused: u64,
    /// Wall-clock seconds from the start signal to the last reply.
    pub secs: f64,
    /// Server CPU seconds over the same span.
    pub cpu: f64,
    /// `INFO commandstats` over the same span: name -> (calls, usec).
    pub cmd: HashMap<String, (u64, f64)>,
}

impl Run {
    pub fn usec_of(&self, names: &[&str]) -> f64 {
        names
            .iter()
            .map(|n| self.cmd.get(*n).map_or(0.0, |c| c.1))
            .sum()
    }
}

/// Run a load. `gen(conn, i, out)` appends command `i` of connection `conn` to `out` and says
/// what its reply must be. Connections are opened first; `CONFIG RESETSTAT` and the CPU reading
/// happen after that and before the start signal, and are read again after the last reply,
/// before the connections close, so only the commands themselves are measured.
pub fn drive<G>(srv: &Server, ctl: &mut Connection, load: Load, gen: G) -> Run
where
    G: Fn(usize, usize, &mut Vec<u8>) -> Expect + Sync,
{
    let threads = DRIVER_THREADS.min(load.conns);
    let connected = Barrier::new(threads + 1);
    let go = Barrier::new(threads + 1);
    let gen = &gen;
    thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (connected, go) = (&connected, &go);
                s.spawn(move || {
                    let mut conns: Vec<DriverConn> = (t..load.conns)
                        .step_by(threads)
                        .map(|id| DriverConn {
                            id,
                            stream: srv.raw(),
                            out: Vec::with_capacity(4096),
                            expects: Vec::with_capacity(load.depth),
                            inbuf: Vec::with_capacity(4096),
                            next: 0,
                        })
                        .collect();
                    connected.wait();
                    go.wait();
                    let (mut done, mut refused) = (0u64, 0u64);
                    // Lockstep: send a batch on every connection, then read every batch. The
                    // server always has the other thread's batches to work on meanwhile.
                    loop {
                        let mut sent = false;
                        for c in conns.iter_mut() {
                            if c.next >= load.per_conn {
                                continue;
                            }
                            c.out.clear();
                            let end = (c.next + load.depth).min(load.per_conn);
                            for i in c.next..end {
                                let e = gen(c.id, i, &mut c.out);
                                c.expects.push(e);
                            }
                            c.next = end;
                            c.stream.write_all(&c.out).expect("write to server");
                            sent = true;
                        }
                        if !sent {
                            break;
                        }
                        for c in conns.iter_mut() {
                            if !c.expects.is_empty() {
                                let (d, r) = c
                                    .read_replies()
                                    .unwrap_or_else(|e| panic!("load generator: {e}"));
                                done += d;
                                refused += r;
                            }
                        }
                    }
                    (done, refused, Instant::now(), conns)
                })
            })
            .collect();
        connected.wait();
        reset_stats(ctl);
        let cpu0 = server_cpu(ctl);
        let t0 = Instant::now();
        go.wait();
        let mut run = Run::default();
        let mut end = t0;
        let mut keep = Vec::new();
        for h in handles {
            let (d, r, t, conns) = h.join().expect("load thread panicked");
            run.done += d;
            run.refused += r;
            end = end.max(t);
            keep.push(conns);
        }
        run.secs = (end - t0).as_secs_f64();
        run.cpu = server_cpu(ctl) - cpu0;
        run.cmd = commandstats(ctl);
        drop(keep);
        run
    })
}
