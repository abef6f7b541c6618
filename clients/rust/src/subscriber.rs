//! The feed's connections and the thread that reads them, for both APIs: one [`Subscriber`] per
//! client (its clones, and the sessions opened on it, share it), started by the first watch.
//!
//! - The *watch* connection, an ordinary unpooled connection, sends `LOCK.WATCH` and
//!   `LOCK.UNWATCH` (a watch lasts as long as the connection that sent it) and the read of a
//!   resynchronisation (`LOCK.INFO` and `LOCK.WATCH` in a `MULTI`: the state and its sequence
//!   number).
//! - The *pub/sub* connection has `SSUBSCRIBE`d to the channels of the watched keys. A RESP2
//!   connection that has subscribed sends no other command, so it is a plain socket with a
//!   small RESP reader: one handle reads in the thread, a clone of it writes `SSUBSCRIBE`,
//!   `SUNSUBSCRIBE` and `PING` from whichever thread watches, without waking the reader.
//!
//! The thread delivers each key's messages to its listeners ([`Listener`]) in order, skipping
//! those older than a listener's watch, and reads the key again (a resynchronisation) once a subscription is in place, when a listener joins, after a gap in the
//! sequence numbers and when a listener asks. It also fires listeners' own deadlines. When a
//! connection is lost (an error, an end of stream, or no answer to a ping within two
//! [`PING_EVERY`]), every listener is told, and the thread reconnects, watches and subscribes
//! again, and resynchronises every key.
//!
//! A cluster node's feed (issue 34) also takes the server's unasked `sunsubscribe` (the slot
//! left the node: a failover) as a loss, and then follows the slot: it reconnects, follows
//! `MOVED` (or a demoted node's `ROLE`) to the master, and resynchronises there, telling the
//! listeners of the loss only if no master answered within [`HANDOVER_PATIENCE`].

use std::collections::HashMap;
use std::io::{self, Read};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::thread;
use std::time::{Duration, Instant};

use redis::Connection;

use crate::client::Endpoint;
use crate::command::Command;
use crate::error::Error;
use crate::feed::{self, Heard, KeyState, Listener, Message, PING_EVERY};
use crate::pubsub::{self, io_error, parse, send, shutdown, Frame, Stream};

/// Messages of a key remembered by seq, to tell a second message with the same seq.
const RECENT: usize = 64;

/// How long a cluster node's feed that lost its node (a failover) looks for the slot's master
/// before it tells its listeners the connection is lost (as Python's and Node's feeds do). The
/// guards' own deadlines still fire meanwhile.
const HANDOVER_PATIENCE: Duration = Duration::from_secs(30);

/// The feed of one server: its two connections, the watched keys and their listeners.
pub(crate) struct Subscriber {
    /// The server (a copy of the client's endpoint).
    endpoint: Endpoint,
    /// The watch connection, once open.
    control: Mutex<Option<Connection>>,
    /// The keys and the pub/sub connection's writing side.
    shared: Mutex<Shared>,
    /// Signalled after each resynchronisation (a watch waits for its first).
    synced: Condvar,
}

/// What watchers and the thread share.
#[derive(Default)]
struct Shared {
    /// The watched keys.
    keys: HashMap<String, Watched>,
    /// Channel -> key.
    channels: HashMap<Vec<u8>, String>,
    /// The pub/sub connection's writing side; `None` until connected, and while reconnecting.
    writer: Option<Stream>,
    /// The reading thread runs.
    running: bool,
    /// The id of the next listener.
    next_id: u64,
}

/// A watched key.
struct Watched {
    /// Its channel, as `LOCK.WATCH` named it.
    channel: Vec<u8>,
    /// The last sequence number received, for gaps.
    last_seq: Option<u64>,
    /// The last messages received by seq (at most [`RECENT`]): a second message with one of
    /// these seqs means one of the two was forged, and is read as a conflict.
    recent: std::collections::BTreeMap<u64, Message>,
    /// The server confirmed the subscription: its listeners can be read (before that, a read
    /// could miss a change made between it and the subscription).
    confirmed: bool,
    /// Who follows it.
    listeners: Vec<Entry>,
}

/// One listener of a key.
struct Entry {
    /// Its id, to remove it.
    id: u64,
    /// The listener, held weakly: its owner holds it, and removes it.
    to: Weak<dyn Listener>,
    /// Messages up to this sequence number are older than its watch.
    from_seq: u64,
    /// A resynchronisation is due.
    pending: bool,
    /// It had one already (the next is a re-read).
    synced: bool,
}

/// A listener's watch of one or more keys; dropping it ends the watch.
pub(crate) struct Watching {
    /// The feed.
    subscriber: Arc<Subscriber>,
    /// The keys and the listener's id for each.
    ids: Vec<(String, u64)>,
    /// The listener, kept alive here (the subscriber holds it weakly).
    _listener: Arc<dyn Listener>,
}

#[cfg(feature = "tokio")]
impl Watching {
    /// Stop delivering to the listener now (no I/O: it hears nothing more once this returns),
    /// and return what is left to tell the server: the `LOCK.UNWATCH` of the keys it was the
    /// last listener of, a blocking call (the async API runs it on the blocking pool).
    pub(crate) fn detach(mut self) -> Unwatch {
        let ids = std::mem::take(&mut self.ids);
        let keys = ids
            .iter()
            .filter(|(key, id)| self.subscriber.detach(key, *id))
            .map(|(key, _)| key.clone())
            .collect();
        Unwatch {
            subscriber: Arc::clone(&self.subscriber),
            keys,
        }
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        let ids = std::mem::take(&mut self.ids);
        for (key, id) in ids {
            if self.subscriber.detach(&key, id) {
                self.subscriber.unwatch(&key);
            }
        }
    }
}

/// The server's side of an ended watch ([`Watching::detach`]).
#[cfg(feature = "tokio")]
pub(crate) struct Unwatch {
    /// The feed.
    subscriber: Arc<Subscriber>,
    /// The keys no one watches any more.
    keys: Vec<String>,
}

#[cfg(feature = "tokio")]
impl Unwatch {
    /// Send `LOCK.UNWATCH` for each key that is still unwatched (a blocking call).
    pub(crate) fn run(self) {
        for key in &self.keys {
            self.subscriber.unwatch(key);
        }
    }
}

impl Subscriber {
    /// The subscriber of `endpoint`'s server, in `slot` (created, not connected, on first use).
    pub(crate) fn of(
        endpoint: &Endpoint,
        slot: &std::sync::OnceLock<Arc<Subscriber>>,
    ) -> Arc<Subscriber> {
        Arc::clone(slot.get_or_init(|| {
            let own = endpoint.with_timeouts(endpoint.connect_timeout, endpoint.io_timeout);
            // A cluster node's feed follows a failover of its slots (issue 34).
            own.cluster
                .store(endpoint.is_cluster(), std::sync::atomic::Ordering::Relaxed);
            Arc::new(Subscriber {
                endpoint: own,
                control: Mutex::new(None),
                shared: Mutex::new(Shared::default()),
                synced: Condvar::new(),
            })
        }))
    }

    /// Watch `keys` for `listener` until the returned [`Watching`] is dropped. A blocking call:
    /// it connects if needed, sends `LOCK.WATCH` for each key, and returns once the thread has
    /// read each key's state with the subscription in place (given to the listener's `resync`):
    /// from then on every change of the keys reaches the listener, or a disconnection does.
    /// The wait is bounded by the I/O timeout.
    pub(crate) fn watch(
        self: &Arc<Self>,
        keys: &[String],
        listener: Arc<dyn Listener>,
    ) -> Result<Watching, Error> {
        let mut watching = Watching {
            subscriber: Arc::clone(self),
            ids: Vec::with_capacity(keys.len()),
            _listener: Arc::clone(&listener),
        };
        let mut control = lock(&self.control);
        self.start(&mut control)?;
        for key in keys {
            let mut reply = self.on_control(&mut control, &feed::watch(key));
            for _ in 0..crate::client::MAX_FOLLOWS {
                match &reply {
                    // The node gave up the slot (a failover the thread has not seen yet):
                    // point the feed at the slot's master, close the pub/sub connection so
                    // that the thread moves every key there, and watch there.
                    Err(e) if self.endpoint.follow_blocking(e) => {
                        *control = None;
                        shutdown(&mut lock(&self.shared).writer);
                        reply = self.on_control(&mut control, &feed::watch(key));
                    }
                    _ => break,
                }
            }
            let (channel, seq) = match reply {
                Ok(reply) => reply,
                Err(e) => {
                    drop(control);
                    return Err(e); // `watching` unwatches the keys done so far
                }
            };
            let mut shared = lock(&self.shared);
            let id = shared.next_id;
            shared.next_id += 1;
            let entry = Entry {
                id,
                to: Arc::downgrade(&listener),
                from_seq: seq,
                pending: true,
                synced: false,
            };
            let shared = &mut *shared;
            match shared.keys.get_mut(key) {
                Some(watched) => {
                    watched.listeners.push(entry);
                    // Wake the thread (the pong) to resynchronise the new listener.
                    send(&mut shared.writer, &[b"PING"]);
                }
                None => {
                    shared.channels.insert(channel.clone(), key.clone());
                    send(&mut shared.writer, &[b"SSUBSCRIBE", &channel]);
                    let watched = Watched {
                        channel,
                        last_seq: Some(seq),
                        recent: Default::default(),
                        confirmed: false,
                        listeners: vec![entry],
                    };
                    shared.keys.insert(key.clone(), watched);
                }
            }
            watching.ids.push((key.clone(), id));
        }
        drop(control);
        let deadline = Instant::now() + self.endpoint.io_timeout;
        let mut shared = lock(&self.shared);
        loop {
            let synced = watching.ids.iter().all(|(key, id)| {
                shared
                    .keys
                    .get(key)
                    .is_none_or(|w| w.listeners.iter().any(|e| e.id == *id && e.synced))
            });
            if synced {
                return Ok(watching);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                drop(shared);
                return Err(io_error(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the feed's first read of the watched keys did not come in time",
                )));
            }
            shared = self
                .synced
                .wait_timeout(shared, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Remove listener `id` of `key`; the last one unsubscribes the key: true if the server's
    /// watch is to be ended too ([`Subscriber::unwatch`]).
    fn detach(&self, key: &str, id: u64) -> bool {
        let mut shared = lock(&self.shared);
        let shared = &mut *shared;
        let Some(watched) = shared.keys.get_mut(key) else {
            return false;
        };
        watched.listeners.retain(|e| e.id != id);
        if !watched.listeners.is_empty() {
            return false;
        }
        let watched = shared.keys.remove(key).expect("found above");
        shared.channels.remove(&watched.channel);
        send(&mut shared.writer, &[b"SUNSUBSCRIBE", &watched.channel]);
        true
    }

    /// `LOCK.UNWATCH key`, unless someone watches the key again by now (a watch sends
    /// `LOCK.WATCH` holding the watch connection, as this does).
    fn unwatch(&self, key: &str) {
        let mut control = lock(&self.control);
        if lock(&self.shared).keys.contains_key(key) {
            return;
        }
        // Without a watch connection there is nothing to end: the server ended its watches as
        // it closed (and the thread's reconnect watches only the keys still watched). A broken
        // one is closed, and the pub/sub connection with it (`on_control`).
        if control.is_some() {
            let _ = self.on_control(&mut control, &feed::unwatch(key));
        }
    }

    /// Connect both connections and start the thread, unless it runs.
    fn start(self: &Arc<Self>, control: &mut Option<Connection>) -> Result<(), Error> {
        if lock(&self.shared).running {
            return Ok(());
        }
        let (reader, writer) = pubsub::connect(&self.endpoint)?;
        *control = Some(self.connect_control()?);
        let mut shared = lock(&self.shared);
        shared.writer = Some(writer);
        shared.running = true;
        drop(shared);
        let weak = Arc::downgrade(self);
        let spawned = thread::Builder::new()
            .name("redis-lock-feed".to_string())
            .spawn(move || run(weak, reader));
        if let Err(e) = spawned {
            lock(&self.shared).running = false;
            return Err(Error::Spawn(e));
        }
        Ok(())
    }

    /// Run `command` on the watch connection (opened if there is none); a connection that fails
    /// is closed, and the pub/sub connection with it, so that the thread reconnects both.
    fn on_control<T: 'static>(
        &self,
        control: &mut Option<Connection>,
        command: &Command<T>,
    ) -> Result<T, Error> {
        self.on_control_with(control, |conn| command.run(conn))
    }

    /// [`Subscriber::on_control`] for requests that are not one command.
    fn on_control_with<T>(
        &self,
        control: &mut Option<Connection>,
        run: impl FnOnce(&mut Connection) -> Result<T, Error>,
    ) -> Result<T, Error> {
        if control.is_none() {
            *control = Some(self.connect_control()?);
        }
        let conn = control.as_mut().expect("opened above");
        let result = run(conn);
        if !crate::command::in_step(&result) {
            *control = None;
            shutdown(&mut lock(&self.shared).writer);
        }
        result
    }

    fn connect_control(&self) -> Result<Connection, Error> {
        let conn = self.endpoint.connect(self.endpoint.connect_timeout)?;
        conn.set_read_timeout(Some(self.endpoint.io_timeout))
            .and_then(|()| conn.set_write_timeout(Some(self.endpoint.io_timeout)))
            .map_err(Error::from_redis)?;
        Ok(conn)
    }

    /// A frame from the pub/sub connection: true if it is a `sunsubscribe` of a channel that is
    /// still watched, which the server sends unasked when the channel's slot leaves this node
    /// (a planned `CLUSTER FAILOVER`, a slot migration): the feed must follow the slot.
    fn frame(&self, frame: Frame) -> bool {
        let Frame::Array(items) = frame else {
            return false; // PONG, +OK
        };
        let mut items = items.into_iter();
        let (Some(Frame::Bulk(kind)), Some(Frame::Bulk(channel))) = (items.next(), items.next())
        else {
            return false;
        };
        match kind.as_slice() {
            b"smessage" => {
                if let Some(Frame::Bulk(payload)) = items.next() {
                    if let Some(message) = Message::parse(&payload) {
                        self.message(&channel, &message);
                    }
                }
            }
            b"ssubscribe" => {
                let mut shared = lock(&self.shared);
                let key = shared.channels.get(&channel).cloned();
                if let Some(watched) = key.and_then(|k| shared.keys.get_mut(&k)) {
                    watched.confirmed = true;
                    watched.listeners.iter_mut().for_each(|e| e.pending = true);
                }
            }
            // An asked one: `detach` forgot the channel before sending `SUNSUBSCRIBE`.
            b"sunsubscribe" => return lock(&self.shared).channels.contains_key(&channel),
            _ => {}
        }
        false
    }

    /// Deliver `message` of `channel` to its key's listeners that have not seen it.
    fn message(&self, channel: &[u8], message: &Message) {
        let mut shared = lock(&self.shared);
        let Some(key) = shared.channels.get(channel).cloned() else {
            return;
        };
        let watched = shared
            .keys
            .get_mut(&key)
            .expect("a channel's key is watched");
        match watched.last_seq {
            Some(last) if message.seq <= last => {
                match watched.recent.get(&message.seq) {
                    // Two messages with one seq: one of them was not the server's. Every
                    // listener hears it (so it keeps what it claims) and reads the state.
                    Some(seen) if seen != message => {
                        watched.listeners.iter_mut().for_each(|e| e.pending = true);
                    }
                    _ => return, // already seen, or reflected by an INFO
                }
            }
            Some(last) if message.seq > last + 1 => {
                // Messages were lost (or a forged one skipped ahead): read the key again once
                // this one is delivered.
                watched.listeners.iter_mut().for_each(|e| e.pending = true);
            }
            _ => {}
        }
        if watched.last_seq.is_none_or(|last| message.seq > last) {
            watched.last_seq = Some(message.seq);
            watched.recent.insert(message.seq, message.clone());
            while watched.recent.len() > RECENT {
                watched.recent.pop_first();
            }
        }
        let to: Vec<(u64, Arc<dyn Listener>)> = watched
            .listeners
            .iter()
            .filter(|e| message.seq > e.from_seq)
            .filter_map(|e| e.to.upgrade().map(|l| (e.id, l)))
            .collect();
        drop(shared);
        for (id, listener) in to {
            if listener.message(&key, message) == Heard::Resync {
                let mut shared = lock(&self.shared);
                if let Some(e) = shared
                    .keys
                    .get_mut(&key)
                    .and_then(|w| w.listeners.iter_mut().find(|e| e.id == id))
                {
                    e.pending = true;
                }
            }
        }
    }

    /// Read every key with a pending resynchronisation again, and tell its listeners.
    fn resync_pending(&self) -> Result<(), Error> {
        loop {
            let key = {
                let shared = lock(&self.shared);
                shared
                    .keys
                    .iter()
                    .find(|(_, w)| w.confirmed && w.listeners.iter().any(|e| e.pending))
                    .map(|(k, _)| k.clone())
            };
            let Some(key) = key else {
                return Ok(());
            };
            let mut control = lock(&self.control);
            let state = match self.on_control_with(&mut control, |conn| read_key(conn, &key)) {
                Ok(state) => state,
                // `WRONGTYPE`: the key is no lock any more, so no one holds it. Not `MOVED` and
                // the like: the key is on another node now (a failover), to be followed.
                Err(e @ Error::Server(_)) if !self.endpoint.slot_left(&e) => KeyState::default(),
                Err(e) => return Err(e),
            };
            let mut shared = lock(&self.shared);
            let Some(watched) = shared.keys.get_mut(&key) else {
                continue;
            };
            // `last_seq` stays: it counts the messages received, which the key's other
            // listeners may still be owed; only those read again skip what the state shows.
            // Unless it is past the server's own: those messages were not the server's (a
            // forged seq far ahead), and the server's own with those seqs are still to come.
            if let Some(seq) = state.seq {
                if watched.last_seq.is_some_and(|last| last > seq) {
                    watched.last_seq = Some(seq);
                    watched.recent.retain(|s, _| *s <= seq);
                }
            }
            let mut to = Vec::new();
            for e in watched.listeners.iter_mut().filter(|e| e.pending) {
                e.pending = false;
                if let Some(seq) = state.seq {
                    e.from_seq = e.from_seq.max(seq);
                }
                if let Some(l) = e.to.upgrade() {
                    to.push((l, e.synced));
                }
                e.synced = true;
            }
            drop(shared);
            drop(control);
            for (listener, again) in to {
                listener.resync(&key, &state, again);
            }
            self.synced.notify_all();
        }
    }

    /// Every listener, once.
    fn listeners(&self) -> Vec<Arc<dyn Listener>> {
        let shared = lock(&self.shared);
        let mut all: Vec<Arc<dyn Listener>> = Vec::new();
        for e in shared.keys.values().flat_map(|w| &w.listeners) {
            if let Some(l) = e.to.upgrade() {
                if !all.iter().any(|a| Arc::ptr_eq(a, &l)) {
                    all.push(l);
                }
            }
        }
        all
    }

    /// Fire the deadlines that have passed; the next one to come.
    fn deadlines(&self) -> Option<Instant> {
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        for listener in self.listeners() {
            match listener.deadline() {
                Some(at) if at <= now => listener.deadline_passed(),
                Some(at) => next = Some(next.map_or(at, |n| n.min(at))),
                None => {}
            }
        }
        next
    }

    /// The connections were lost: forget them.
    fn lost(&self) {
        *lock(&self.control) = None;
        lock(&self.shared).writer = None;
    }

    /// Tell every listener that the feed's connection was lost.
    fn tell_lost(&self, error: Error) {
        let error = Arc::new(error);
        for listener in self.listeners() {
            listener.disconnected(&error);
        }
    }

    /// Connect again, watch and subscribe every key again; the confirmations resynchronise.
    fn reconnect(&self) -> Result<Stream, Error> {
        let (reader, writer) = pubsub::connect(&self.endpoint)?;
        let mut control = lock(&self.control);
        *control = Some(self.connect_control()?);
        let keys: Vec<String> = lock(&self.shared).keys.keys().cloned().collect();
        let mut watched = Vec::new();
        for key in keys {
            match self.on_control(&mut control, &feed::watch(&key)) {
                Ok((channel, seq)) => watched.push((key, channel, seq)),
                // Not a lock any more (`WRONGTYPE`): its listeners read it as free. (`MOVED`
                // and the like are the caller's to follow.)
                Err(e @ Error::Server(_)) if !self.endpoint.slot_left(&e) => {
                    if let Some(w) = lock(&self.shared).keys.get_mut(&key) {
                        w.confirmed = true; // no subscription to wait for
                        w.listeners.iter_mut().for_each(|e| e.pending = true);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        let mut shared = lock(&self.shared);
        let shared = &mut *shared;
        shared.channels.clear();
        let mut writer = Some(writer);
        for (key, channel, seq) in watched {
            let Some(w) = shared.keys.get_mut(&key) else {
                continue; // unwatched meanwhile
            };
            // A new connection: after a failover the sequence starts again (it may be lower).
            w.channel = channel.clone();
            w.last_seq = Some(seq);
            w.recent.clear();
            w.confirmed = false;
            for e in &mut w.listeners {
                e.from_seq = seq;
            }
            send(&mut writer, &[b"SSUBSCRIBE", &channel]);
            shared.channels.insert(channel, key);
        }
        shared.writer = writer;
        Ok(reader)
    }

    /// Ping both connections (the pub/sub one answers on the reading side).
    fn ping(&self) -> Result<(), Error> {
        send(&mut lock(&self.shared).writer, &[b"PING"]);
        let mut control = lock(&self.control);
        let ping = Command::new(redis::cmd("PING"), |_| Ok(()));
        self.on_control(&mut control, &ping)
    }
}

/// The key's state and its sequence number at that state, in one step (`MULTI`: `LOCK.INFO`,
/// then `LOCK.WATCH` again, which answers the current sequence number: `LOCK.INFO` of a free
/// key is nil, with no `seq`).
fn read_key(conn: &mut Connection, key: &str) -> Result<KeyState, Error> {
    let (info, watch) = (feed::info(key), feed::watch(key));
    let replies: Vec<redis::Value> = redis::pipe()
        .atomic()
        .add_command(info.cmd.clone())
        .add_command(watch.cmd.clone())
        .query(conn)
        .map_err(Error::from_redis)?;
    let [state, watched] = <[redis::Value; 2]>::try_from(replies)
        .map_err(|v| crate::command::unexpected("MULTI", redis::Value::Array(v)))?;
    let mut state = info.read(Ok(state))?;
    state.seq = Some(watch.read(Ok(watched))?.1);
    Ok(state)
}

/// The thread: read frames, deliver them, resynchronise, fire deadlines, ping when idle;
/// reconnect after a loss. It ends once the subscriber is gone.
fn run(subscriber: Weak<Subscriber>, mut reader: Stream) {
    let mut buf = Vec::new();
    let mut heard = Instant::now();
    let mut pinged: Option<Instant> = None;
    loop {
        let Some(sub) = subscriber.upgrade() else {
            return;
        };
        let mut failure = sub.resync_pending().err();
        let next = sub.deadlines();
        drop(sub);
        if failure.is_none() {
            let now = Instant::now();
            let mut wait = PING_EVERY;
            if let Some(next) = next {
                wait = wait.min(next.saturating_duration_since(now));
            }
            let _ = reader.set_read_timeout(Some(wait.max(Duration::from_millis(1))));
            let mut chunk = [0u8; 16 * 1024];
            match reader.read(&mut chunk) {
                Ok(0) => failure = Some(io_error(io::ErrorKind::UnexpectedEof.into())),
                Ok(n) => {
                    buf.extend_from_slice(&chunk[..n]);
                    heard = Instant::now();
                    pinged = None;
                    let Some(sub) = subscriber.upgrade() else {
                        return;
                    };
                    loop {
                        match parse(&buf) {
                            Ok(Some((frame, used))) => {
                                buf.drain(..used);
                                if sub.frame(frame) {
                                    failure = Some(io_error(io::Error::other(
                                        "sunsubscribe: a watched key's slot left this node",
                                    )));
                                    break;
                                }
                            }
                            Ok(None) => break,
                            Err(e) => {
                                failure = Some(io_error(e));
                                break;
                            }
                        }
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    match pinged {
                        Some(at) if at.elapsed() >= PING_EVERY * 2 => {
                            failure = Some(io_error(io::Error::new(
                                io::ErrorKind::TimedOut,
                                "the feed connection did not answer a ping",
                            )))
                        }
                        None if heard.elapsed() >= PING_EVERY => {
                            let Some(sub) = subscriber.upgrade() else {
                                return;
                            };
                            pinged = Some(Instant::now());
                            failure = sub.ping().err();
                        }
                        _ => {}
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => failure = Some(io_error(e)),
            }
        }
        let Some(error) = failure else {
            continue;
        };
        let Some(sub) = subscriber.upgrade() else {
            return;
        };
        sub.lost();
        // A cluster node's feed follows the slot's master (issue 34): the listeners hear of
        // the loss only if no master is found in time; once subscribed there, every key is
        // read again (a guard is lost only if the new master lacks its token). Elsewhere the
        // listeners hear of it now.
        let follow = sub.endpoint.is_cluster();
        let mut error = Some(error);
        if !follow {
            sub.tell_lost(error.take().expect("set above"));
        }
        drop(sub);
        buf.clear();
        let give_up = Instant::now() + HANDOVER_PATIENCE;
        let mut backoff = Duration::from_millis(20);
        reader = loop {
            let Some(sub) = subscriber.upgrade() else {
                return;
            };
            match sub.reconnect() {
                Ok(reader) => break reader,
                // `MOVED`, or `READONLY` and the like from a demoted node: go to the master.
                // A lost node: the master the other nodes name for the slot.
                Err(e)
                    if follow
                        && (sub.endpoint.follow_blocking(&e)
                            || sub.endpoint.follow_gone_blocking(&e)) =>
                {
                    backoff = Duration::from_millis(20);
                }
                Err(e) => {
                    if error.is_some() {
                        error = Some(e);
                    }
                }
            }
            if error.is_some() && Instant::now() >= give_up {
                sub.tell_lost(error.take().expect("checked"));
            }
            sub.deadlines();
            drop(sub);
            thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_secs(1));
        };
        heard = Instant::now();
        pinged = None;
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests;
