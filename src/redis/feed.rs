//! The change feed: every change of a watched lock key's holders, published to a sharded
//! pub/sub channel of that key (`LOCK.WATCH` in `docs/commands.md`).
//!
//! Why watches, and not a message for every key: sharded pub/sub forwards every message to the
//! shard's replicas, and no module API tells whether anyone subscribed, so publishing for every
//! key would cost every lock. A connection asks with `LOCK.WATCH key`; the key is watched while
//! at least one such connection is open. A key nobody watches costs one thread-local read per
//! event ([`watching`]).
//!
//! Order and handoffs: events are queued as they happen and published in that order at the end
//! of the command or callback that made them ([`flush`], also from a zero-delay timer for events
//! that come from inside the server's own operations, such as a `DEL` unlinking a key). A hold
//! that ends and is handed to the next waiter within one step is one `handoff` message, so an
//! observer never sees "no holder" between two holders. Sequence numbers are given when a
//! message is published, one per message, so a gap means a lost message.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, HashMap};
use std::os::raw::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

use redis_module::raw;

use crate::lock::{Millis, NO_DEADLINE};
use crate::redis::{guard, key, slots};

/// What happened to a watched key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Acquired,
    /// A grant to a queued waiter (it becomes part of a `handoff` when the hold it follows
    /// ended in the same step).
    HandedTo,
    Released,
    Extended,
    Expired,
    Lost,
    /// A lost hold's lock-delay started (its end is the `expired` or `handoff` that follows).
    Delayed,
    /// The hold's session was detached: its bound connection closed, and the session has a
    /// grace for a connection to `ATTACH` it.
    Detached,
    /// A connection attached the detached session in time: the hold goes on.
    Attached,
    Deleted,
    Flushed,
    Swapped,
    Demoted,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Acquired => "acquired",
            Kind::HandedTo => "acquired",
            Kind::Released => "released",
            Kind::Extended => "extended",
            Kind::Expired => "expired",
            Kind::Lost => "lost",
            Kind::Delayed => "delayed",
            Kind::Detached => "detached",
            Kind::Attached => "attached",
            Kind::Deleted => "deleted",
            Kind::Flushed => "flushed",
            Kind::Swapped => "swapped",
            Kind::Demoted => "demoted",
        }
    }

    /// A hold ended: the first half of a handoff.
    fn ends_a_hold(self) -> bool {
        matches!(self, Kind::Released | Kind::Expired | Kind::Lost)
    }
}

struct Event {
    db: i32,
    key: Vec<u8>,
    kind: Kind,
    token: u64,
    /// Remaining ms (-1: no deadline of its own; 0: not applicable).
    ttl: Millis,
    owner: Vec<u8>,
}

#[derive(Default)]
struct Watch {
    /// The seq of the last message published for the key.
    seq: u64,
    clients: BTreeSet<u64>,
}

type KeyRef = (i32, Vec<u8>);

// The flags every command reads are atomics rather than thread-locals only because a static is
// cheaper to read from a `cdylib` (a thread-local read calls `__tls_get_addr`). Like the rest of
// the feed's state they are read and written on the server's main thread only, so `Relaxed` is
// all the ordering they need.

/// Number of watched keys: the whole cost of the feed for an unwatched key is reading it.
static WATCHED: AtomicUsize = AtomicUsize::new(0);
/// Something is queued: `flush`'s fast path reads only this.
static QUEUED: AtomicBool = AtomicBool::new(false);
/// The module itself is deleting a key (a release left it empty): its unlink is no news.
static DELETING: AtomicBool = AtomicBool::new(false);

thread_local! {
    static WATCHES: RefCell<HashMap<KeyRef, Watch>> = RefCell::new(HashMap::new());
    static BY_CLIENT: RefCell<HashMap<u64, BTreeSet<KeyRef>>> = RefCell::new(HashMap::new());
    static PENDING: RefCell<Vec<Event>> = const { RefCell::new(Vec::new()) };
    static FLUSH_ARMED: Cell<bool> = const { Cell::new(false) };
    static DETACHED: Cell<*mut raw::RedisModuleCtx> = const { Cell::new(std::ptr::null_mut()) };
}

/// Around the module's own `DeleteKey` (see [`DELETING`]).
pub fn deleting(on: bool) {
    DELETING.store(on, Relaxed);
}

/// A lock key left the keyspace by another way than the module's own release (`DEL`, `UNLINK`,
/// `RENAME` away, `RESTORE ... REPLACE`, `MOVE`, eviction, or Redis expiring it): `expired`
/// for each of its holders when none of them still held it (Redis expired the key), else one
/// `deleted`.
pub fn key_unlinked(db: i32, key: &[u8], lock: &crate::lock::Lock) {
    if !watching() || DELETING.load(Relaxed) {
        return;
    }
    let now = key::now();
    if lock.occupying(now).next().is_none() {
        for hold in lock.holders() {
            hold_event(db, key, Kind::Expired, hold.owner, hold.token, None);
        }
    } else {
        key_event(db, key, Kind::Deleted);
    }
}

/// True when some key is watched (check before building an event).
#[inline]
pub fn watching() -> bool {
    WATCHED.load(Relaxed) > 0
}

fn watched(db: i32, key: &[u8]) -> bool {
    watching() && WATCHES.with(|w| w.borrow().contains_key(&(db, key.to_vec())))
}

/// The channel of a key: `lock.feed:{tag}:db:key`, where `tag` hashes to the key's own slot
/// (whatever braces the key has), so the channel lives on the key's shard.
pub fn channel(db: i32, key: &[u8]) -> Vec<u8> {
    let tag = slots::slot_tag(slots::key_slot(key));
    let mut name = format!("lock.feed:{{{tag}}}:{db}:").into_bytes();
    name.extend_from_slice(key);
    name
}

/// `LOCK.WATCH`: `client` watches the key; returns its channel and current seq.
pub fn watch(client: u64, db: i32, key: &[u8]) -> (Vec<u8>, u64) {
    let kr = (db, key.to_vec());
    let seq = WATCHES.with(|w| {
        let mut w = w.borrow_mut();
        let watch = w.entry(kr.clone()).or_insert_with(|| {
            WATCHED.fetch_add(1, Relaxed);
            Watch::default()
        });
        watch.clients.insert(client);
        watch.seq
    });
    BY_CLIENT.with(|c| c.borrow_mut().entry(client).or_default().insert(kr));
    (channel(db, key), seq)
}

/// `LOCK.UNWATCH`: false if `client` was not watching the key.
pub fn unwatch(client: u64, db: i32, key: &[u8]) -> bool {
    let kr = (db, key.to_vec());
    let was = BY_CLIENT.with(|c| {
        let mut c = c.borrow_mut();
        let Some(keys) = c.get_mut(&client) else {
            return false;
        };
        let was = keys.remove(&kr);
        if keys.is_empty() {
            c.remove(&client);
        }
        was
    });
    if was {
        drop_watcher(client, &kr);
    }
    was
}

fn drop_watcher(client: u64, kr: &KeyRef) {
    WATCHES.with(|w| {
        let mut w = w.borrow_mut();
        if let Some(watch) = w.get_mut(kr) {
            watch.clients.remove(&client);
            if watch.clients.is_empty() {
                w.remove(kr);
                WATCHED.fetch_sub(1, Relaxed);
            }
        }
    });
}

/// A connection closed: its watches end.
pub fn client_gone(client: u64) {
    if !watching() {
        return;
    }
    let keys = BY_CLIENT.with(|c| c.borrow_mut().remove(&client));
    for kr in keys.into_iter().flatten() {
        drop_watcher(client, &kr);
    }
}

/// The seq of a watched key (for `LOCK.INFO`), `None` when nobody watches it.
pub fn seq(db: i32, key: &[u8]) -> Option<u64> {
    if !watching() {
        return None;
    }
    WATCHES.with(|w| w.borrow().get(&(db, key.to_vec())).map(|x| x.seq))
}

/// Queue an event about one hold of a watched key (nothing when the key is not watched).
/// `deadline` is the hold's (for `acquired` and `extended`).
pub fn hold_event(
    db: i32,
    key: &[u8],
    kind: Kind,
    owner: &[u8],
    token: u64,
    deadline: Option<Millis>,
) {
    if !watched(db, key) {
        return;
    }
    let ttl = match deadline {
        Some(d) if d >= NO_DEADLINE => -1,
        Some(d) => (d - key::now()).max(0),
        None => 0,
    };
    push(Event {
        db,
        key: key.to_vec(),
        kind,
        token,
        ttl,
        owner: owner.to_vec(),
    });
}

/// Queue an event about a whole key (deleted, flushed, ...).
pub fn key_event(db: i32, key: &[u8], kind: Kind) {
    if !watched(db, key) {
        return;
    }
    push(Event {
        db,
        key: key.to_vec(),
        kind,
        token: 0,
        ttl: 0,
        owner: vec![],
    });
}

/// A flush or `SWAPDB` of `db` (every database for `None`), or a demotion: one message for
/// each watched key there.
pub fn database_event(db: Option<i32>, kind: Kind) {
    if !watching() {
        return;
    }
    let keys: Vec<KeyRef> = WATCHES.with(|w| {
        w.borrow()
            .keys()
            .filter(|(d, _)| db.is_none_or(|db| db == *d))
            .cloned()
            .collect()
    });
    for (d, k) in keys {
        if watched(d, &k) {
            queue(Event {
                db: d,
                key: k,
                kind,
                token: 0,
                ttl: 0,
                owner: vec![],
            });
        }
    }
}

/// A replica (a demoted primary keeps its watches) applies its primary's changes: the feed is
/// the primary's to publish, so nothing is queued here but the demotion itself.
fn push(event: Event) {
    let ctx = DETACHED.with(Cell::get);
    if !ctx.is_null() && key::context_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_SLAVE != 0 {
        return;
    }
    queue(event);
}

fn queue(event: Event) {
    PENDING.with(|p| p.borrow_mut().push(event));
    QUEUED.store(true, Relaxed);
    // Published at the end of the command or callback that queued it (`flush`), or, for events
    // from inside the server's own operations, from this timer.
    if !FLUSH_ARMED.with(|a| a.replace(true)) {
        let ctx = DETACHED.with(Cell::get);
        if !ctx.is_null() {
            // SAFETY: the callback matches RedisModuleTimerProc and takes no data.
            unsafe {
                raw::RedisModule_CreateTimer.unwrap()(
                    ctx,
                    0,
                    Some(flush_timer),
                    std::ptr::null_mut(),
                )
            };
        }
    }
}

extern "C" fn flush_timer(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    guard::callback("feed flush", (), || {
        FLUSH_ARMED.with(|a| a.set(false));
        flush(ctx);
    })
}

/// Publish every queued event, in order, a handoff as one message.
#[inline]
pub fn flush(ctx: *mut raw::RedisModuleCtx) {
    if QUEUED.load(Relaxed) {
        QUEUED.store(false, Relaxed);
        publish_queued(ctx);
    }
}

fn publish_queued(ctx: *mut raw::RedisModuleCtx) {
    let events = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
    let mut i = 0;
    while i < events.len() {
        let e = &events[i];
        // An end of a hold followed, on the same key in the same step, by a grant to a
        // waiter: one `handoff` with the new holder.
        let next = events.get(i + 1);
        let handoff = e.kind.ends_a_hold()
            && next.is_some_and(|n| n.kind == Kind::HandedTo && n.db == e.db && n.key == e.key);
        if handoff {
            publish(ctx, &events[i + 1], "handoff");
            i += 2;
        } else {
            publish(ctx, e, e.kind.name());
            i += 1;
        }
    }
}

fn publish(ctx: *mut raw::RedisModuleCtx, e: &Event, name: &str) {
    let Some(seq) = WATCHES.with(|w| {
        let mut w = w.borrow_mut();
        let watch = w.get_mut(&(e.db, e.key.clone()))?;
        watch.seq += 1;
        Some(watch.seq)
    }) else {
        return; // unwatched meanwhile
    };
    let mut message = format!("{seq} {name} {} {} ", e.token, e.ttl).into_bytes();
    message.extend_from_slice(&e.owner);
    let channel = channel(e.db, &e.key);
    // SAFETY: strings made from (pointer, length) buffers and freed below; ctx is the live
    // context of the command or callback we are in. Sharded pub/sub (7.0+): the channel lives
    // on the key's shard; where the server lacks it, plain pub/sub.
    unsafe {
        let create = raw::RedisModule_CreateString.unwrap();
        let c = create(ctx, channel.as_ptr().cast(), channel.len());
        let m = create(ctx, message.as_ptr().cast(), message.len());
        match raw::RedisModule_PublishMessageShard {
            Some(shard) => shard(ctx, c, m),
            None => raw::RedisModule_PublishMessage.unwrap()(ctx, c, m),
        };
        raw::RedisModule_FreeString.unwrap()(ctx, c);
        raw::RedisModule_FreeString.unwrap()(ctx, m);
    }
}

/// Keep the module's own detached context for the flush timer (set once at load).
pub fn init(detached: *mut raw::RedisModuleCtx) {
    DETACHED.with(|d| d.set(detached));
}
