//! Blocking acquire: a FIFO queue of blocked clients per key, and the handoff of the lock to the
//! head of the queue inside the server.
//!
//! Why a module-run queue on the raw blocking API, and not `BlockClientOnKeys`: on Redis 7.0 the
//! latter does not wake waiters when the key is deleted or expires, and it wakes every waiter to
//! race for the key; here exactly one waiter is granted, in arrival order, with no round trip.
//!
//! Lifecycle of a waiter (`bc` is its `RedisModuleBlockedClient`):
//! - queued by [`block`], with a timeout and a disconnect callback;
//! - then exactly one of: granted by [`serve`] (removed from the queue, `UnblockClient` with the
//!   token), timed out (timeout callback: removed, nil reply), or gone (disconnect callback, also
//!   for `CLIENT KILL`, `CLIENT UNBLOCK ... ERROR` and demotion to replica: removed).
//!   Each path removes the waiter from the queue first, so `UnblockClient` runs once per waiter.
//! - A grant whose client vanished before the reply was written is revoked (see `free_outcome`),
//!   so a waiter that disconnects is never left holding a lock it never heard of.
//!
//! A `LOCK.MACQUIRE ... BLOCK` waiter has one entry in the queue of each of its keys (same
//! `bc` and `id`, and the whole key set); see `multi` for how such a set is granted.
//!
//! Work triggered from inside the server's own operations (a lock key unlinked by `DEL`, `RENAME`,
//! expiry; a flush or `SWAPDB`) is never
//! done inside the notification: it is queued and run from a zero-delay timer. While the server
//! holds writes back (`CLIENT PAUSE`, `FAILOVER`), that work and the deadline timers' handoffs
//! are held until the pause ends (see `pause` for every path this covers).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::os::raw::{c_int, c_void};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use redis_module::{logging, raw, Context, RedisString};

use crate::error::{self, Result};
use crate::lock::{self, Acquire, Conflict, Hold, Millis, Mode, WaitQueue};
use crate::redis::key::{self, LockKey};
use crate::redis::{cluster, guard, pause, session};
use crate::{state, stats};
use std::time::Instant;

mod callbacks;
mod deadlines;
mod deferred;
mod events;
mod exports;
mod multi;
mod queue_key;
mod sessions;
mod timeouts;
mod views;

pub use callbacks::note_server;
use callbacks::{disconnect_callback, free_outcome, reply_callback, timeout_callback};
use deadlines::{arm_deadline_timer, stop_timer, MAX_TIMER_MS};
use deferred::{defer, run};
pub use events::{key_unlinked, orphans_loaded, subscribe};
pub use exports::fail_session_waiters_in;
pub use multi::block_set;
use queue_key::{KeyRef, KeyView};
pub use sessions::{
    announce_session, apply_ended, close_session, expire_sessions, kill_session, session_attached,
    session_detached, session_disconnected, session_hold_exists, CloseReply,
};
pub use views::{contended, queue_view, Queued};

/// A lock key: database number and key name.
type QueueKey = (i32, Vec<u8>);

struct Waiter {
    bc: *mut raw::RedisModuleBlockedClient,
    /// Unique per blocked call: a handle's address can be reused once Redis frees it.
    id: u64,
    /// When its `BLOCK` timeout ends the wait (none for `BLOCK 0`): its key in `timeouts`.
    timeout: Option<Instant>,
    owner: Vec<u8>,
    mode: Mode,
    ttl: Millis,
    /// The session the grant will belong to (0: none), and the hold's lock-delay.
    session: lock::Serial,
    delay: Millis,
    /// When it queued, for the wait-time statistic and `LOCK.INFO`.
    queued: Instant,
    /// The blocked connection's client id (for `LOCK.INFO`, to find it in `CLIENT LIST`).
    client: u64,
    /// For a `LOCK.MACQUIRE` waiter: all of its keys (in the database of this queue), in
    /// argument order. Every one of their queues has an entry with this `id`, each carrying
    /// the same `timeout`; the entry that is taken out first is the one retired.
    set: Option<Rc<multi::Set>>,
}

/// What a blocking acquire asks for.
pub struct Wants<'a> {
    pub owner: &'a [u8],
    pub mode: Mode,
    pub ttl: Millis,
    pub session: lock::Serial,
    pub delay: Millis,
}

#[derive(Default)]
struct Queue {
    waiters: WaitQueue<Waiter>,
    /// The timer armed at the current holder's deadline: (timer id, fires at).
    timer: Option<(raw::RedisModuleTimerID, Millis)>,
}

/// What a waiter is told when it is unblocked by us (its blocked-client private data).
enum Outcome {
    Granted {
        token: u64,
        db: i32,
        key: Vec<u8>,
        /// Set by the reply callback; a grant never delivered is revoked when freed.
        delivered: bool,
    },
    /// A `LOCK.MACQUIRE` waiter got every key: one token per key, in key order.
    GrantedSet {
        tokens: Vec<u64>,
        db: i32,
        keys: Vec<Vec<u8>>,
        /// As for `Granted`.
        delivered: bool,
    },
    Failed(String),
    /// A `LOCK.SESSION CLOSE` done from a timer: the number of holds it released.
    Closed(i64),
    /// The `BLOCK` timeout passed: the reply is nil.
    TimedOut,
}

/// Deferred work, run from a zero-delay timer.
enum Work {
    /// Re-examine a key with waiters: grant if free, re-arm the deadline timer if held.
    Settle(QueueKey),
    /// A grant that was never delivered: free the lock again if that hold is still there.
    Revoke(QueueKey, u64),
    /// A loaded key's expiry must follow its holders (see `orphans_loaded`).
    SyncExpiry(QueueKey),
    /// A bound session's connection closed: release its holds (lock-delay applies).
    EndSession(Box<lock::Session>),
    /// A bound session with a grace was detached: replicate its shortened deadline and tell
    /// its holders (see `session::detach_told`).
    SessionDetached(lock::Serial),
    /// In a cluster, `ATTACH` rescued a detached session: tell its holders (`detached` first
    /// when that was not told yet), see `sessions::session_attached`.
    SessionAttached(lock::Serial, bool),
    /// `LOCK.SESSION CLOSE` in a cluster: release the holds, then answer the blocked client
    /// (if it could block) with how many there were (see `sessions::close_session`).
    CloseSession(Box<lock::Session>, Option<usize>),
    /// The session expiry timer fired: end the sessions whose deadline passed.
    ExpireSessions,
    /// As `ExpireSessions`, but it came due while writes were paused (see
    /// `session::take_due`).
    ExpireSessionsAfterPause,
}

/// Number of keys with a queue: lets unlink callbacks and the fast paths return at once when
/// zero. An atomic rather than a thread-local only because a static is cheaper to read from a
/// `cdylib` (a thread-local read calls `__tls_get_addr`); like the rest of this state it is read
/// and written on the server's main thread only, so `Relaxed` is all the ordering it needs.
static QUEUED_KEYS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static QUEUES: RefCell<HashMap<QueueKey, Queue>> = RefCell::new(HashMap::new());
    /// Which queue each blocked client is in (keyed by its handle's address).
    static CLIENTS: RefCell<HashMap<usize, QueueKey, BuildHasherDefault<AddressHasher>>> =
        RefCell::new(HashMap::default());
    static PENDING: RefCell<Vec<Work>> = const { RefCell::new(Vec::new()) };
    static PENDING_ARMED: Cell<bool> = const { Cell::new(false) };
    static NEXT_WAITER_ID: Cell<u64> = const { Cell::new(0) };
    /// A context of our own for creating timers where Redis gives us none (unlink callbacks).
    static DETACHED: Cell<*mut raw::RedisModuleCtx> = const { Cell::new(std::ptr::null_mut()) };
}

/// The hash of a blocked client's address for `CLIENTS`: one multiply, its high bits folded into
/// the low ones (handles are aligned). Addresses are the server's, not chosen by a client, so
/// SipHash's defence against chosen keys buys nothing there (two lookups per handoff).
#[derive(Default)]
struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = n as u64;
    }
    fn finish(&self) -> u64 {
        let h = self.0.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^ (h >> 32)
    }
}

/// True when `key` has queued waiters.
pub fn has_waiters(db: i32, key: &[u8]) -> bool {
    QUEUED_KEYS.load(Relaxed) > 0
        && QUEUES.with(|q| q.borrow().contains_key(&(db, key) as &dyn KeyView))
}

/// Queue length of `key` (0 without a queue).
pub fn waiters(db: i32, key: &[u8]) -> usize {
    QUEUES.with(|q| {
        q.borrow()
            .get(&(db, key) as &dyn KeyView)
            .map_or(0, |q| q.waiters.len())
    })
}

/// A shared waiter queued on `key` whose limit differs from `mode`'s: the key's limit is
/// fixed by whoever is queued first, so a caller asking for another would only fail later.
pub fn queued_conflict(db: i32, key: &[u8], mode: Mode) -> Option<Conflict> {
    if !mode.is_shared() || QUEUED_KEYS.load(Relaxed) == 0 {
        return None;
    }
    QUEUES.with(|q| {
        let queues = q.borrow();
        let other = queues
            .get(&(db, key) as &dyn KeyView)?
            .waiters
            .iter()
            .find(|w| w.mode.is_shared() && w.mode != mode)?;
        Some(Conflict::Limit {
            limit: other.mode.limit(),
        })
    })
}

/// Blocked clients across every key.
pub fn total_waiters() -> usize {
    CLIENTS.with(|c| c.borrow().len())
}

/// Keys with at least one blocked client.
pub fn waiting_keys() -> usize {
    QUEUED_KEYS.load(Relaxed)
}

/// True when the command runs where it must not block: `MULTI`, Lua, functions.
pub fn may_block(ctx: &Context) -> bool {
    let flags = key::context_flags(ctx.ctx);
    flags
        & (raw::REDISMODULE_CTX_FLAGS_DENY_BLOCKING
            | raw::REDISMODULE_CTX_FLAGS_MULTI
            | raw::REDISMODULE_CTX_FLAGS_LUA)
        == 0
}

/// Block the calling client in `key`'s queue until it is granted what it `wants`, times out
/// (`timeout` ms; 0 waits forever) or goes away. `next_expiry` is when a live holder's
/// deadline next passes.
// The push hands a refused waiter back whole (`QueueFull(waiter)`), which is what makes the
// `Err` large; it never happens (the cap is checked first) and is not on a hot path.
#[allow(clippy::result_large_err)]
pub fn block(
    ctx: &Context,
    key: &[u8],
    wants: Wants,
    timeout: Millis,
    next_expiry: Millis,
) -> Result<()> {
    let db = key::selected_db(ctx.ctx);
    let qk: QueueKey = (db, key.to_vec());
    let cap = state::max_waiters();
    if waiters(db, key) >= cap {
        return Err(error::too_many_waiters(cap));
    }
    let (bc, id, timeout) = block_client(ctx, timeout)?;
    let waiter = Waiter {
        bc,
        id,
        timeout,
        owner: wants.owner.to_vec(),
        mode: wants.mode,
        ttl: wants.ttl,
        session: wants.session,
        delay: wants.delay,
        queued: Instant::now(),
        client: session::client_id(ctx),
        set: None,
    };
    // One lookup for the push and for whether the queue's timer already fires by
    // `next_expiry` (under contention it does: the holder's deadline only moves later).
    let pushed = QUEUES.with(|q| {
        let mut queues = q.borrow_mut();
        if let Some(queue) = queues.get_mut(&qk) {
            let armed = queue.timer.is_some_and(|(_, at)| at <= next_expiry);
            return queue.waiters.push(waiter, cap).map(|()| armed);
        }
        let mut queue = Queue::default();
        queue.waiters.push(waiter, cap)?;
        queues.insert(qk.clone(), queue);
        QUEUED_KEYS.fetch_add(1, Relaxed);
        Ok(false)
    });
    let armed = match pushed {
        Ok(armed) => armed,
        Err(lock::QueueFull(waiter)) => {
            // Checked above and nothing runs in between; keep the invariant anyway.
            retire(&waiter);
            unblock(
                bc,
                Outcome::Failed("ERR too many waiters on this key".into()),
            );
            return Ok(());
        }
    };
    if !armed {
        arm_deadline_timer(ctx.ctx, (qk.0, &qk.1), next_expiry);
    }
    CLIENTS.with(|c| c.borrow_mut().insert(bc as usize, qk));
    Ok(())
}

/// Block the calling client (no entry in any queue yet): its handle, a new waiter id, and
/// when its wait ends after `timeout` ms (none for 0; see `timeouts`).
fn block_client(
    ctx: &Context,
    timeout: Millis,
) -> Result<(*mut raw::RedisModuleBlockedClient, u64, Option<Instant>)> {
    // Why Redis gets no timeout (0) and the module's timer ends the wait instead: on Redis 7.0 a
    // client whose timeout Redis processes after we unblocked it with a grant (same event-loop
    // turn) gets no reply at all. With one path for every unblock, that race cannot happen.
    // The timeout callback stays registered so that CLIENT UNBLOCK works.
    // SAFETY: ctx is the calling client's context; the callbacks match the signatures Redis
    // expects and never unwind (each runs under guard::callback).
    let bc = unsafe {
        raw::RedisModule_BlockClient.unwrap()(
            ctx.ctx,
            Some(reply_callback),
            Some(timeout_callback),
            Some(free_outcome),
            0,
        )
    };
    if bc.is_null() {
        return Err(error::internal("could not block the client"));
    }
    // SAFETY: bc was just returned by BlockClient and is live until we unblock it.
    unsafe { raw::RedisModule_SetDisconnectCallback.unwrap()(bc, Some(disconnect_callback)) };
    let id = NEXT_WAITER_ID.with(|n| {
        n.set(n.get() + 1);
        n.get()
    });
    let timeout = (timeout > 0).then(|| timeouts::start(ctx.ctx, bc, id, timeout));
    Ok((bc, id, timeout))
}

/// Admit the waiters at the head of `key`'s queue that the lock in `lock_key` can take now: in
/// queue order, every compatible one (readers behind a writer all go in one step, a semaphore
/// fills its free permits), stopping at the first that must wait, so nobody is overtaken. A
/// waiter whose request conflicts with the holders (mode or limit) is failed and the scan goes
/// on. Returns how many were granted; with waiters left, the timer is set for the next expiry.
pub fn serve(
    ctx: *mut raw::RedisModuleCtx,
    lock_key: &mut LockKey,
    key: &[u8],
    now: Millis,
) -> Result<usize> {
    serve_looked(ctx, lock_key, key, now, |_| {})
}

/// As [`serve`], first calling `looked` with whether `key` has a queue (what [`has_waiters`]
/// says), before anything is granted or replicated: a caller that needs to know gets it from
/// serve's own first lookup instead of one of its own (`LOCK.RELEASE`).
pub fn serve_looked(
    ctx: *mut raw::RedisModuleCtx,
    lock_key: &mut LockKey,
    key: &[u8],
    now: Millis,
    looked: impl FnOnce(bool),
) -> Result<usize> {
    if QUEUED_KEYS.load(Relaxed) == 0 {
        looked(false);
        return Ok(0);
    }
    let mut looked = Some(looked);
    // Borrowed: the name is copied only into a grant's outcome (and a new timer's data).
    let qk: KeyRef = (key::selected_db(ctx), key);
    let mut granted = 0;
    // Whether the queue's timer is known to fire by the next expiry when the scan stops.
    let mut armed = false;
    loop {
        let lock = lock_key.lock();
        // One look at the queue per round (each costs a hash of the key): the head, taken out
        // in the same look unless it must wait or is a multi-key waiter.
        let mut queued = false;
        let head = QUEUES.with(|q| {
            let mut queues = q.borrow_mut();
            let Some(queue) = queues.get_mut(&qk as &dyn KeyView) else {
                return Head::Empty;
            };
            queued = true;
            let Some(head) = queue.waiters.iter().next() else {
                return Head::Empty;
            };
            if head.set.is_some() {
                return Head::Set;
            }
            let taken = if !session::alive(head.session) {
                Taken::SessionEnded
            } else if !session::room_for(head.session, qk.0, &[qk.1], &head.owner) {
                Taken::SessionFull
            } else {
                let lock = match lock {
                    Ok(lock) => lock,
                    Err(e) => return Head::Error(e),
                };
                match lock::decide_acquire(lock, &head.owner, head.mode, head.session, now, false) {
                    Ok(Acquire::Busy) => {
                        let armed = lock
                            .and_then(|l| l.next_expiry(now))
                            .is_none_or(|at| queue.timer.is_some_and(|(_, fires)| fires <= at));
                        return Head::Busy { armed };
                    }
                    Ok(Acquire::Retry { token }) => Taken::Grant(Some(token)),
                    Ok(_) => Taken::Grant(None),
                    Err(conflict) => Taken::Conflict(conflict),
                }
            };
            match queue.waiters.pop_front() {
                Some(waiter) => Head::Taken(waiter, queue.waiters.is_empty(), taken),
                None => Head::Empty,
            }
        });
        if let Some(looked) = looked.take() {
            looked(queued);
        }
        let (waiter, taken) = match head {
            Head::Empty => {
                armed = true;
                break;
            }
            Head::Busy { armed: known } => {
                armed = known;
                break;
            }
            Head::Error(e) => return Err(e),
            Head::Set => {
                // A multi-key waiter at the head: the whole set, or this key waits for it.
                match multi::serve_set(ctx, lock_key, &(qk.0, qk.1.to_vec()), now)? {
                    multi::SetStep::Granted => granted += 1,
                    multi::SetStep::Failed => {}
                    multi::SetStep::Wait => break,
                }
                continue;
            }
            Head::Taken(waiter, emptied, taken) => {
                taken_out(ctx, qk, &waiter, emptied);
                (waiter, taken)
            }
        };
        let token = match taken {
            Taken::SessionEnded => {
                // Its session ended while it waited: it is never granted.
                let msg = error::session_ended_while_waiting().to_string();
                unblock(waiter.bc, Outcome::Failed(msg));
                continue;
            }
            Taken::Conflict(conflict) => {
                let msg = error::conflict(conflict).reply_text();
                unblock(waiter.bc, Outcome::Failed(msg));
                continue;
            }
            Taken::SessionFull => {
                let msg = error::too_many_session_holds(state::max_session_holds()).reply_text();
                unblock(waiter.bc, Outcome::Failed(msg));
                continue;
            }
            Taken::Grant(token) => token,
        };
        // The ttl was checked against the clock when the waiter queued; a long wait cannot push
        // it past the cap by more than the wait itself, so clamp instead of failing the grant.
        let deadline = hold_deadline(now, waiter.ttl, waiter.session);
        let applied = match token {
            // The same owner already holds it (another connection of the same holder).
            Some(token) => lock_key
                .set_deadline(&waiter.owner, deadline, now)
                .map(|_| token),
            None => {
                let token = state::next_token(now);
                let hold = Hold {
                    owner: waiter.owner.as_slice().into(),
                    token,
                    deadline,
                    granted_at: now,
                    session: waiter.session,
                    delay: waiter.delay,
                };
                session::track(waiter.session, qk.0, qk.1, &waiter.owner);
                lock_key.grant(waiter.mode, hold, Some(now)).map(|_| token)
            }
        };
        let token = match applied {
            Ok(token) => token,
            Err(e) => {
                unblock(
                    waiter.bc,
                    Outcome::Failed("ERR could not grant the lock".into()),
                );
                return Err(e);
            }
        };
        lock_key.replicate_holder(&waiter.owner, now);
        lock_key.notify(c"lock.acquired");
        lock_key.feed(
            crate::redis::feed::Kind::HandedTo,
            &waiter.owner,
            token,
            Some(deadline),
        );
        stats::ACQUIRED.incr();
        stats::HANDED_OFF.incr();
        stats::WAIT_US.record(waiter.queued.elapsed().as_micros() as u64);
        unblock(
            waiter.bc,
            Outcome::Granted {
                token,
                db: qk.0,
                key: qk.1.to_vec(),
                delivered: false,
            },
        );
        granted += 1;
    }
    if !armed {
        if let Some(at) = lock_key.lock()?.and_then(|l| l.next_expiry(now)) {
            arm_deadline_timer(ctx, qk, at);
        }
    }
    Ok(granted)
}

/// What one look at the head of a queue found (see `serve`).
enum Head {
    /// No waiter.
    Empty,
    /// A multi-key waiter: `multi::serve_set` decides.
    Set,
    /// The head must wait; `armed`: the queue's timer already fires by the next expiry.
    Busy { armed: bool },
    /// The key is not a lock.
    Error(error::Error),
    /// The head, taken out of the queue (`true`: which is now empty), and what it gets.
    Taken(Waiter, bool, Taken),
}

/// What the head taken out of its queue by `serve` gets.
enum Taken {
    /// An error: its session ended while it waited.
    SessionEnded,
    /// An error: it asks for what the holders' mode or limit refuses.
    Conflict(Conflict),
    /// An error: its session took other holds while it waited and has no room for this one.
    SessionFull,
    /// The lock; `Some(token)`: its owner holds it already, with that token.
    Grant(Option<u64>),
}

/// The deadline of a hold granted at `now` for `ttl` ms: with a session, 0 means none of its
/// own. Clamped at the cap rather than failing a grant (see `serve`).
pub fn hold_deadline(now: Millis, ttl: Millis, session: lock::Serial) -> Millis {
    if ttl == 0 && session != 0 {
        return lock::NO_DEADLINE;
    }
    lock::deadline_after(now, ttl).unwrap_or(lock::MAX_DEADLINE)
}

/// After a holder's deadline moved (retry or extend), make sure the timer fires when the next
/// live holder expires.
pub fn deadline_changed(
    ctx: *mut raw::RedisModuleCtx,
    lock_key: &LockKey,
    key: &[u8],
    now: Millis,
) {
    if QUEUED_KEYS.load(Relaxed) > 0 {
        if let Some(at) = lock_key
            .lock()
            .ok()
            .flatten()
            .and_then(|l| l.next_expiry(now))
        {
            arm_deadline_timer(ctx, (key::selected_db(ctx), key), at);
        }
    }
}

fn pop_front(ctx: *mut raw::RedisModuleCtx, qk: &QueueKey) -> Option<Waiter> {
    let (waiter, emptied) = QUEUES.with(|q| {
        let mut queues = q.borrow_mut();
        let queue = queues.get_mut(qk)?;
        let waiter = queue.waiters.pop_front()?;
        Some((waiter, queue.waiters.is_empty()))
    })?;
    taken_out(ctx, (qk.0, &qk.1), &waiter, emptied);
    Some(waiter)
}

/// The rest of taking `waiter` off the front of `qk`'s queue (`emptied`: none is left there).
fn taken_out(ctx: *mut raw::RedisModuleCtx, qk: KeyRef, waiter: &Waiter, emptied: bool) {
    CLIENTS.with(|c| c.borrow_mut().remove(&(waiter.bc as usize)));
    if emptied {
        drop_queue_if_empty(ctx, qk);
    }
    multi::leave_other_queues(ctx, qk, waiter);
    retire(waiter);
}

/// Take a blocked client out of whichever queue holds it (`id` narrows it to one blocked
/// call); `None` if it is in none (already granted or failed). The caller retires it (the
/// timeout timer took its entry out of `timeouts` already).
fn remove_waiter(
    ctx: *mut raw::RedisModuleCtx,
    bc: *mut raw::RedisModuleBlockedClient,
    id: Option<u64>,
) -> Option<Waiter> {
    let qk = CLIENTS.with(|c| c.borrow().get(&(bc as usize)).cloned())?;
    let (waiter, was_head) = QUEUES.with(|q| {
        let mut queues = q.borrow_mut();
        let waiters = &mut queues.get_mut(&qk)?.waiters;
        let is = |w: &Waiter| w.bc == bc && id.is_none_or(|id| w.id == id);
        let was_head = waiters.iter().next().is_some_and(is);
        Some((waiters.remove(is)?, was_head))
    })?;
    CLIENTS.with(|c| c.borrow_mut().remove(&(bc as usize)));
    drop_queue_if_empty(ctx, (qk.0, &qk.1));
    multi::leave_other_queues(ctx, (qk.0, &qk.1), &waiter);
    if was_head && has_waiters(qk.0, &qk.1) {
        // The head stopped the scan; whoever is at the head now may be admissible (readers
        // behind a writer that gave up, while other readers hold the key).
        let detached = DETACHED.with(Cell::get);
        if !detached.is_null() {
            defer(detached, Work::Settle(qk));
        }
    }
    Some(waiter)
}

/// A waiter leaves its queue: its `BLOCK` timeout must not end it any more.
fn retire(waiter: &Waiter) {
    if let Some(at) = waiter.timeout {
        timeouts::cancel(at, waiter.id);
    }
}

fn drop_queue_if_empty(ctx: *mut raw::RedisModuleCtx, qk: KeyRef) {
    let timer = QUEUES.with(|q| {
        let mut queues = q.borrow_mut();
        if queues
            .get(&qk as &dyn KeyView)
            .is_some_and(|queue| queue.waiters.is_empty())
        {
            QUEUED_KEYS.fetch_sub(1, Relaxed);
            queues
                .remove(&qk as &dyn KeyView)
                .and_then(|queue| queue.timer)
        } else {
            None
        }
    });
    if let Some((id, _)) = timer {
        stop_timer(ctx, id);
    }
}

/// Fail every waiter of `qk` with `reply` (the key stopped being a lock, or this server can no
/// longer grant).
fn fail_all(ctx: *mut raw::RedisModuleCtx, qk: &QueueKey, reply: &'static str) {
    while let Some(waiter) = pop_front(ctx, qk) {
        unblock(waiter.bc, Outcome::Failed(reply.into()));
    }
}

fn unblock(bc: *mut raw::RedisModuleBlockedClient, outcome: Outcome) {
    let data = Box::into_raw(Box::new(outcome));
    // SAFETY: bc is a blocked client that has been removed from every queue, so this is the one
    // UnblockClient call it gets; Redis passes `data` to reply_callback, then free_outcome.
    unsafe { raw::RedisModule_UnblockClient.unwrap()(bc, data.cast()) };
}

/// Re-examine a key with waiters: hand the lock over if it is free, otherwise wait for the
/// holder's deadline; fail the waiters if the key is no longer a lock.
fn settle(ctx: *mut raw::RedisModuleCtx, qk: &QueueKey) {
    if !has_waiters(qk.0, &qk.1) {
        return;
    }
    if key::context_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_SLAVE != 0 {
        fail_all(
            ctx,
            qk,
            "UNBLOCKED this server became a replica while the client waited",
        );
        return;
    }
    if !key::select_db(ctx, qk.0) {
        return;
    }
    if !cluster::serves_key(ctx, &qk.1) {
        // The slot moved (MIGRATE, then SETSLOT): the lock lives on another node now. Granting
        // here would make a second owner; a retried command is redirected to the right node.
        fail_all(
            ctx,
            qk,
            "TRYAGAIN the lock key's slot moved to another node while the client waited; retry",
        );
        return;
    }
    let name = RedisString::create_from_slice(ctx, &qk.1);
    let mut lock_key = LockKey::open_raw(ctx, name.inner, raw::KeyMode::READ | raw::KeyMode::WRITE);
    let now = key::now();
    let head_admissible = match lock_key.lock() {
        Err(_) => {
            drop(lock_key);
            fail_all(
                ctx,
                qk,
                "WRONGTYPE the lock key now holds another kind of value",
            );
            return;
        }
        Ok(lock) => QUEUES.with(|q| {
            q.borrow()
                .get(qk)
                .and_then(|queue| queue.waiters.iter().next())
                .is_some_and(|w| {
                    // A multi-key head: this key alone is checked (it may still wait for
                    // another), which at worst refuses it NOREPLICAS a little early.
                    lock::decide_acquire(lock, &w.owner, w.mode, w.session, now, false)
                        .is_ok_and(|d| d != Acquire::Busy)
                        && w.set
                            .as_ref()
                            .is_none_or(|set| multi::might_go(qk, set, w.id))
                })
        }),
    };
    // A command is refused by the server itself when too few replicas are connected; a grant
    // from a timer is not, so check as the server would.
    if head_admissible && !cluster::replicas_allow_writes(ctx) {
        drop(lock_key);
        fail_all(ctx, qk, "NOREPLICAS Not enough good replicas to write.");
        return;
    }
    match serve(ctx, &mut lock_key, &qk.1, now) {
        Ok(_) => {
            if let Err(e) = lock_key.delete_if_empty() {
                logging::log_warning(format!("redis-lock: handoff cleanup failed: {e}"));
            }
        }
        Err(e) => logging::log_warning(format!("redis-lock: handoff failed: {e}")),
    }
}

fn revoke(ctx: *mut raw::RedisModuleCtx, qk: &QueueKey, token: u64) {
    if key::context_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_SLAVE != 0
        || !key::select_db(ctx, qk.0)
        || !cluster::serves_key(ctx, &qk.1)
    {
        return;
    }
    let name = RedisString::create_from_slice(ctx, &qk.1);
    let mut lock_key = LockKey::open_raw(ctx, name.inner, raw::KeyMode::READ | raw::KeyMode::WRITE);
    let now = key::now();
    let owner = match lock_key.lock() {
        Ok(Some(lock)) => lock
            .live(now)
            .find(|h| h.token == token)
            .map(|h| h.owner.to_vec()),
        _ => None,
    };
    let Some(owner) = owner.filter(|_| cluster::replicas_allow_writes(ctx)) else {
        return;
    };
    let revoked = lock_key.remove(&owner, Some(now)).and_then(|_| {
        lock_key.notify(c"lock.released");
        lock_key.feed(crate::redis::feed::Kind::Released, &owner, token, None);
        lock_key.replicate_release(&owner);
        serve(ctx, &mut lock_key, &qk.1, now)?;
        if lock_key.delete_if_empty()? {
            // Holders this server dropped as expired may remain on a replica.
            lock_key.replicate_delete();
        }
        Ok(())
    });
    if let Err(e) = revoked {
        logging::log_warning(format!("redis-lock: revoke failed: {e}"));
    }
}
