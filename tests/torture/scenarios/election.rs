//! Leader election (issue 20), with raw commands: three candidate processes (the session holder
//! processes of `sessions/holder.rs` in their campaign mode, `cand{n}`) campaign for the one key
//! `lock:0` with `LOCK.ACQUIRE lock:0 owner 0 SESSION id BLOCK ms` in `BOUND` sessions (ttl
//! 250 ms, no deadline of the hold's own: leadership lives by the session); the leader writes
//! the fenced resource with its term (the token) 1 to 6 times, resigns and campaigns again.
//! An observer thread of the test process follows the leadership with the change feed on raw
//! sockets: `LOCK.WATCH lock:0` on one connection, `SSUBSCRIBE` of its channel on another; on a
//! gap in the sequence numbers, and after every (re)connect, it reads the state again
//! (`MULTI`, `LOCK.WATCH`, `LOCK.INFO`, `EXEC`: the current seq and holder at one instant) and
//! marks that resynchronisation. Each message and each resynchronisation is an observation of
//! the history (`observer feed ...`, `observer resync ...`).
//!
//! The nemesis is `sessions.rs`'s: in turn it SIGKILLs the leader, SIGSTOPs it until the server
//! has expired its session, and cuts it off (its proxy holds every byte) until the same; each
//! loss is a fault of that candidate from the loss's earliest possible moment. In about a third
//! of the rounds it first kills one of the observer's connections (`CLIENT KILL ID`, the
//! subscription or the watch, in turn), which the observer must notice (a closed subscription;
//! a `PING` unanswered on the watch connection, whose close ends the watch and so the
//! messages) and resynchronise after: the leader's fault then often lands while it reconnects.
//!
//! The checks read the leadership history (the candidates' grants, releases, writes and the
//! faults that name them), each sound by the suite's interval reasoning:
//!
//! - `election-terms-increase`: a term granted after another one was granted has a larger
//!   token (by completion before invocation);
//! - `election-observed-terms-increase`: the terms the observer reports (messages and
//!   resynchronisations, in the order it read them) increase;
//! - `election-one-leader`: no two terms are certainly live at once, a term being certainly live
//!   from its grant's completion to the earliest moment it could have ended (its resignation's
//!   invocation, or the earliest moment of a loss of its candidate's session), or to its last
//!   accepted write if later, with the suite's 2 ms tolerance;
//! - `election-terms-observed`: every term granted is in the observer's sequence (an `acquired`
//!   or `handoff` message, or a resynchronisation that read it), or inside a gap that a
//!   resynchronisation marked (one after the term's grant was invoked, when the observer had not
//!   yet seen a token as large);
//! - `election-writes-in-term-order`: no fenced write with a term is accepted after a larger term
//!   was granted (the old leader's writes are refused);
//! - `observer-caught-up`: once the candidates are gone, the observer has read up to the key's
//!   current seq within 2 s.
//!
//! Printed with them: the terms granted and resigned, the faults by kind, how each term was
//! observed (in the feed, by a resynchronisation, inside a marked gap), the fenced writes sent
//! with a term after a larger one was granted (and refused), and the times from a leader's
//! SIGKILL to the next term's grant and to the observer's message of it.
//!
//! The common checks (`exclusive-holds`, `stale-fenced-writes`, ...) and `sessions.rs`'s own
//! (`session-ends-on-kill`, `session-expires-unattended`, `fenced-write-after-session-loss`)
//! apply too.
//!
//! `election_failover` is the same election on a primary with an asynchronous replica (the
//! forensic AOF of `failover.rs`): every 0.4-0.8 s, in place of that round's fault on the
//! observer, `failover.rs`'s [`failover`] stops the replica for 200-400 ms (it misses what the
//! leader does meanwhile), kills the primary with SIGKILL and promotes the replica. The
//! candidates' proxies lead to the dead primary, so all of them are replaced by fresh ones on
//! the new primary (`sessions.rs`); the observer waits for the new port and follows it,
//! noting the server (`port=`) in each observation. A leader may believe it leads while a newer
//! term is granted (paused, cut off, or its primary gone), and a promoted replica may hold an
//! older leadership than the dead primary's last: its checks (`election/replicated.rs`) assert
//! what fencing promises there and report, without failing, the overlaps.

use std::collections::{BTreeMap, HashSet};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU16, Ordering};
use std::sync::{Arc, Mutex};

use super::failover::{failover, FAILOVER, FORENSIC_AOF};
use super::sessions::{session_faults, Holders, CUT, KILL, STOP};
use super::*;
use crate::checker::TOLERANCE;
use crate::history::{Entry, Recorder};
use crate::workload::lock_key;

/// Candidates alive at once.
const CANDIDATES: usize = 3;

const OBSERVER_CUT: &str = "CLIENT KILL of one of the observer's connections (subscription or \
                            watch)";

pub fn election_bound() -> Scenario {
    Scenario::new(
        "election_bound",
        "three candidates campaign for one key in BOUND sessions (ttl 0 holds); the leader is \
         SIGKILLed, SIGSTOPped or cut off past its session ttl; an observer follows the change \
         feed (its connections killed now and then)",
        |env| campaign(env, false),
    )
    .workload(one_key())
    .post(|h, _| election_checks(h))
}

pub fn election_failover() -> Scenario {
    Scenario::new(
        "election_failover",
        "election_bound with an asynchronous replica: every 0.4-0.8 s the replica is \
         SIGSTOPped (misses terms), the primary killed -9 and the replica promoted; the \
         candidates start again on it and the observer follows it",
        |env| campaign(env, true),
    )
    .server_args(FORENSIC_AOF)
    .with_replica()
    .workload(one_key())
    .may_lose_writes()
    .post(|h, _| failover_checks(h))
}

/// No workload threads: the candidates are the only clients of the one key.
fn one_key() -> Config {
    Config {
        workers: 0,
        keys: 1,
        ..Config::default()
    }
}

/// The candidates, the observer and the nemesis; with `failovers`, [`failover`] every 0.4-0.8 s
/// (the replica stopped 200-400 ms first) in place of that round's fault on the observer.
fn campaign(env: &mut Env, failovers: bool) {
    let key = lock_key(0);
    let stop = Arc::new(AtomicBool::new(false));
    let shared = Arc::new(ObserverState::default());
    shared.port.store(env.primary.port(), Ordering::Relaxed);
    let observer = {
        let mut o = Observer {
            port: 0,
            key: key.clone(),
            rec: env.rec.clone(),
            state: shared.clone(),
            stop: stop.clone(),
            last_seq: 0,
            top_token: 0,
        };
        thread::spawn(move || o.run())
    };
    wait_until("the observer's first LOCK.INFO", ms(5000), || {
        shared.resyncs.load(Ordering::Relaxed) > 0
    });
    let mut c = env.conn();
    let mut sub_next = true;
    let every = |env: &mut Env| Instant::now() + ms(env.rng.gen_range(400..=800));
    let mut next_failover = every(env);
    let mut between = |env: &mut Env| {
        if failovers && Instant::now() >= next_failover {
            // Port 0: the observer waits, and never reaches a server that took the dead
            // primary's port meanwhile.
            shared.port.store(0, Ordering::Relaxed);
            failover(env, (200, 400), Survival::Informational);
            shared.port.store(env.primary.port(), Ordering::Relaxed);
            c = env.conn();
            next_failover = every(env);
            return;
        }
        if !env.rng.gen_bool(1.0 / 3.0) {
            return;
        }
        let (which, id) = {
            let ids = shared.ids.lock().unwrap_or_else(|e| e.into_inner());
            if sub_next {
                ("subscription", ids.1)
            } else {
                ("watch", ids.0)
            }
        };
        let Some(id) = id else { return };
        sub_next = !sub_next;
        let invoke = env.now();
        let reply = faults::raw(&mut c, &["CLIENT", "KILL", "ID", &id.to_string()]);
        let note = format!("the observer's {which} connection (client {id}): {reply:?}");
        env.fault_at(
            OBSERVER_CUT,
            Some(Vec::new()),
            Effect::Keeps,
            false,
            invoke,
            env.now(),
            note,
        );
    };
    session_faults(
        env,
        &Holders {
            count: CANDIDATES,
            lock_delay_ms: 0,
            campaign: true,
        },
        &mut between,
    );
    // Every candidate is gone: the observer must read up to the key's last change. LOCK.WATCH
    // answers the current seq (LOCK.INFO shows none for a free key).
    let mut c = env.conn();
    let reply = faults::raw(&mut c, &["LOCK.WATCH", &key]);
    let Value::Array(items) = &reply else {
        panic!("LOCK.WATCH {key} answered {reply:?}")
    };
    let Some(Value::Int(last)) = items.get(1) else {
        panic!("LOCK.WATCH {key} answered {reply:?}")
    };
    let deadline = Instant::now() + ms(2000);
    while shared.seq.load(Ordering::Relaxed) < *last && Instant::now() < deadline {
        thread::sleep(ms(2));
    }
    let seen = shared.seq.load(Ordering::Relaxed);
    env.check(
        "observer-caught-up",
        "once the candidates are gone, the observer reads up to the key's current seq within 2 s",
        seen >= *last,
        || format!("the key's seq is {last}, the observer's {seen} after 2 s"),
    );
    stop.store(true, Ordering::Relaxed);
    observer.join().expect("the observer thread panicked");
}

// --- The observer --------------------------------------------------------------------------

/// What the observer shares with the nemesis.
#[derive(Default)]
struct ObserverState {
    /// The primary's port (0 during a failover).
    port: AtomicU16,
    /// Client ids of its (watch, subscription) connections.
    ids: Mutex<(Option<i64>, Option<i64>)>,
    /// The last seq it has read (feed or resynchronisation), in its current numbering.
    seq: AtomicI64,
    resyncs: AtomicI64,
}

struct Observer {
    /// The port of the server it follows now.
    port: u16,
    key: String,
    rec: Arc<Recorder>,
    state: Arc<ObserverState>,
    stop: Arc<AtomicBool>,
    last_seq: i64,
    /// The largest token it has seen (a message or a resynchronisation).
    top_token: i64,
}

impl Observer {
    fn run(&mut self) {
        let mut first = true;
        while !self.stop.load(Ordering::Relaxed) {
            let reason = if first { "start" } else { "reconnect" };
            first = false;
            if let Err(e) = self.follow(reason) {
                self.rec
                    .count(&format!("observer reconnects ({})", e.kind()), 1);
                thread::sleep(ms(5));
            }
        }
    }

    /// Connect, watch, subscribe, resynchronise, then read the feed until an error or the end.
    fn follow(&mut self, reason: &str) -> io::Result<()> {
        self.port = self.state.port.load(Ordering::Relaxed);
        if self.port == 0 {
            return Err(io::Error::new(io::ErrorKind::NotFound, "a failover"));
        }
        let mut watch = Raw::connect(self.port)?;
        let mut sub = Raw::connect(self.port)?;
        let ids = (watch.client_id()?, sub.client_id()?);
        *self.state.ids.lock().unwrap_or_else(|e| e.into_inner()) = (Some(ids.0), Some(ids.1));
        let reply = watch.call(&["LOCK.WATCH", &self.key])?;
        let channel = match &reply {
            Resp::Array(Some(items)) => match items.first() {
                Some(Resp::Bulk(Some(ch))) => String::from_utf8_lossy(ch).into_owned(),
                _ => panic!("LOCK.WATCH {} answered {reply:?}", self.key),
            },
            _ => panic!("LOCK.WATCH {} answered {reply:?}", self.key),
        };
        let reply = sub.call(&["SSUBSCRIBE", &channel])?;
        assert!(
            matches!(&reply, Resp::Array(Some(items)) if items.len() == 3),
            "SSUBSCRIBE {channel} answered {reply:?}"
        );
        self.resync(&mut watch, reason)?;
        let mut last_ping = Instant::now();
        while !self.stop.load(Ordering::Relaxed) {
            match sub.read(ms(20))? {
                Some(msg) => self.message(&mut watch, &channel, msg)?,
                None if last_ping.elapsed() >= ms(20) => {
                    // A killed watch connection ends the watch, and then nothing is published:
                    // only asking tells.
                    let pong = watch.call(&["PING"])?;
                    if pong != Resp::Simple("PONG".into()) {
                        return Err(io::Error::other(format!("PING answered {pong:?}")));
                    }
                    last_ping = Instant::now();
                }
                None => {}
            }
        }
        Ok(())
    }

    /// One message of the subscription.
    fn message(&mut self, watch: &mut Raw, channel: &str, msg: Resp) -> io::Result<()> {
        let Resp::Array(Some(items)) = &msg else {
            panic!("the subscription delivered {msg:?}");
        };
        let (Some(Resp::Bulk(Some(kind))), Some(Resp::Bulk(Some(ch))), Some(Resp::Bulk(Some(p)))) =
            (items.first(), items.get(1), items.get(2))
        else {
            panic!("the subscription delivered {msg:?}");
        };
        assert_eq!(
            (kind.as_slice(), ch.as_slice()),
            (&b"smessage"[..], channel.as_bytes()),
            "{msg:?}"
        );
        let at = self.rec.clock.now();
        let text = String::from_utf8_lossy(p).into_owned();
        let f: Vec<&str> = text.splitn(5, ' ').collect();
        let (Some(seq), Some(event), Some(token), Some(owner)) = (
            f.first().and_then(|s| s.parse::<i64>().ok()),
            f.get(1),
            f.get(2).and_then(|s| s.parse::<i64>().ok()),
            f.get(4),
        ) else {
            panic!("a feed message that does not parse: {text:?}");
        };
        self.rec
            .count(&format!("observer: feed '{event}' messages"), 1);
        self.rec.observe(
            at,
            token,
            format!(
                "observer feed seq={seq} {event} owner={owner} port={}",
                self.port
            ),
        );
        self.top_token = self.top_token.max(token);
        if seq > self.last_seq + 1 {
            self.rec.count("observer: gaps in the feed's seq", 1);
            let reason = format!("gap: seq {} after {}", seq, self.last_seq);
            self.resync(watch, &reason)?;
        }
        self.last_seq = self.last_seq.max(seq);
        self.state.seq.store(self.last_seq, Ordering::Relaxed);
        Ok(())
    }

    /// Read the current seq and holder at one instant, and record them as a resynchronisation
    /// marked with the largest token seen before it.
    fn resync(&mut self, watch: &mut Raw, reason: &str) -> io::Result<()> {
        for cmd in [
            &["MULTI"][..],
            &["LOCK.WATCH", &self.key],
            &["LOCK.INFO", &self.key],
        ] {
            watch.send(cmd)?;
        }
        watch.send(&["EXEC"])?;
        let mut replies = Vec::new();
        for _ in 0..4 {
            replies.push(watch.read(ms(2000))?.ok_or_else(timed_out)?);
        }
        let at = self.rec.clock.now();
        let Some(Resp::Array(Some(exec))) = replies.last() else {
            panic!("MULTI LOCK.WATCH LOCK.INFO EXEC answered {replies:?}");
        };
        let seq = match exec.first() {
            Some(Resp::Array(Some(w))) => match w.get(1) {
                Some(Resp::Int(seq)) => *seq,
                _ => panic!("LOCK.WATCH in MULTI answered {exec:?}"),
            },
            _ => panic!("LOCK.WATCH in MULTI answered {exec:?}"),
        };
        let holder = match exec.get(1) {
            Some(Resp::Bulk(None)) | Some(Resp::Array(None)) => None,
            Some(Resp::Array(Some(info))) => Some(info_holder(info)),
            other => panic!("LOCK.INFO in MULTI answered {other:?}"),
        };
        let (token, owner) = holder.clone().unwrap_or((0, String::new()));
        self.rec.observe(
            at,
            token,
            format!(
                "observer resync seq={seq} after_token={} holder={} owner={owner} port={} \
                 ({reason})",
                self.top_token,
                holder.map_or("none".to_string(), |h| h.0.to_string()),
                self.port
            ),
        );
        let what = reason.split(':').next().unwrap_or(reason);
        self.rec
            .count(&format!("observer: resynchronisations ({what})"), 1);
        self.top_token = self.top_token.max(token);
        self.last_seq = seq;
        self.state.seq.store(seq, Ordering::Relaxed);
        self.state.resyncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// The exclusive holder's (token, owner) of a `LOCK.INFO` reply's field/value pairs.
fn info_holder(info: &[Resp]) -> (i64, String) {
    let field = |name: &str| {
        info.chunks(2)
            .find(|kv| kv[0] == Resp::Bulk(Some(name.as_bytes().to_vec())))
            .map(|kv| kv[1].clone())
    };
    match (field("token"), field("owner")) {
        (Some(Resp::Int(t)), Some(Resp::Bulk(Some(o)))) => {
            (t, String::from_utf8_lossy(&o).into_owned())
        }
        _ => panic!("LOCK.INFO answered {info:?}"),
    }
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "no reply within 2 s")
}

// --- RESP2 on a raw socket ------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq)]
enum Resp {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Resp>>),
}

/// A connection that speaks RESP2 by hand: commands out, whole replies in.
struct Raw {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Raw {
    fn connect(port: u16) -> io::Result<Raw> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_nodelay(true)?;
        Ok(Raw {
            stream,
            buf: Vec::new(),
        })
    }

    fn send(&mut self, args: &[&str]) -> io::Result<()> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend(format!("${}\r\n", a.len()).into_bytes());
            out.extend(a.as_bytes());
            out.extend(b"\r\n");
        }
        self.stream.write_all(&out)
    }

    /// The next whole reply, or `None` if none came within `patience`.
    fn read(&mut self, patience: Duration) -> io::Result<Option<Resp>> {
        let deadline = Instant::now() + patience;
        loop {
            if let Some((v, n)) = parse(&self.buf, 0) {
                self.buf.drain(..n);
                return Ok(Some(v));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            self.stream.set_read_timeout(Some(left))?;
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn call(&mut self, args: &[&str]) -> io::Result<Resp> {
        self.send(args)?;
        self.read(ms(2000))?.ok_or_else(timed_out)
    }

    fn client_id(&mut self) -> io::Result<i64> {
        match self.call(&["CLIENT", "ID"])? {
            Resp::Int(id) => Ok(id),
            other => panic!("CLIENT ID answered {other:?}"),
        }
    }
}

/// The reply starting at `at` in `buf` and where it ends, or `None` if `buf` holds only part.
fn parse(buf: &[u8], at: usize) -> Option<(Resp, usize)> {
    let end = at + buf.get(at..)?.windows(2).position(|w| w == b"\r\n")?;
    let line = String::from_utf8_lossy(&buf[at + 1..end]).into_owned();
    let next = end + 2;
    let number = || {
        line.parse::<i64>()
            .unwrap_or_else(|_| panic!("RESP: not a number: {line:?}"))
    };
    match buf[at] {
        b'+' => Some((Resp::Simple(line), next)),
        b'-' => Some((Resp::Error(line), next)),
        b':' => Some((Resp::Int(number()), next)),
        b'$' if number() < 0 => Some((Resp::Bulk(None), next)),
        b'$' => {
            let n = number() as usize;
            let body = buf.get(next..next + n)?.to_vec();
            let crlf = buf.get(next + n..next + n + 2)?;
            assert_eq!(crlf, b"\r\n", "RESP: a bulk string longer than its length");
            Some((Resp::Bulk(Some(body)), next + n + 2))
        }
        b'*' if number() < 0 => Some((Resp::Array(None), next)),
        b'*' => {
            let mut items = Vec::new();
            let mut pos = next;
            for _ in 0..number() {
                let (item, after) = parse(buf, pos)?;
                items.push(item);
                pos = after;
            }
            Some((Resp::Array(Some(items)), pos))
        }
        other => panic!("RESP: unexpected type byte {other:?} in {buf:?}"),
    }
}

mod checks;
mod replicated;
use checks::election_checks;
use replicated::failover_checks;
