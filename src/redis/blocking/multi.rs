//! Multi-key waiters (`LOCK.MACQUIRE ... BLOCK`): one entry in the queue of every key, granted
//! the whole set at once when every key is free (or already its owner's) and it is at the head
//! of every one of those queues, or may overtake everyone ahead of it there (the bounded
//! overtaking of `crate::lock::multi`, which also argues why this cannot deadlock).
//!
//! How it fits the per-key queues: when a multi-key waiter is at the head of a key's queue, the
//! key's scan (`serve`) hands over to [`serve_set`], which looks at that key's waiters in
//! order, at most [`SCAN_DEPTH`] deep, and grants the first set that may go; it stops at the
//! first waiter that may not be overtaken, so nobody is passed but sets that wait on a busy
//! key, each at most ``lock.max-overtakes`` times. Keys outside a set never see it. Whenever one
//! of a set's keys is served (a release, an expiry, a waiter leaving), the scan of that key
//! finds it; a new blocking call is looked at once it has queued ([`block_set`]).

use std::cell::Cell;
use std::collections::HashMap;
use std::ops::Deref;
use std::rc::Rc;
use std::time::Instant;

use redis_module::{raw, Context, RedisString};

use super::{
    arm_deadline_timer, block_client, defer, drop_queue_if_empty, has_waiters, hold_deadline,
    pop_front, remove_waiter, retire, unblock, waiters, KeyRef, Outcome, Queue, QueueKey, Waiter,
    Wants, Work, CLIENTS, DETACHED, QUEUED_KEYS, QUEUES,
};
use crate::error::{self, Result};
use crate::lock::{self, Ahead, Hold, KeyGrant, KeyState, Lock, Millis, Mode, MultiAcquire};
use crate::redis::key::{self, LockKey};
use crate::redis::session;
use crate::{state, stats};

/// How deep into a key's queue [`serve_set`] looks for a set that may overtake: bounds the work
/// of one scan when many sets wait.
const SCAN_DEPTH: usize = 32;

/// A `LOCK.MACQUIRE` waiter's keys (in argument order) and how often it was overtaken; its
/// entry in every queue shares this.
pub(super) struct Set {
    keys: Vec<Vec<u8>>,
    /// Sets granted ahead of it so far (at most ``lock.max-overtakes``).
    overtaken: Cell<u32>,
}

impl Deref for Set {
    type Target = Vec<Vec<u8>>;

    fn deref(&self) -> &Vec<Vec<u8>> {
        &self.keys
    }
}

/// Block the calling client in the queue of every one of `keys` (distinct, in argument order)
/// until it is granted all of them, times out (`timeout` ms; 0 waits forever) or goes away.
/// `next_expiry[i]` is when `keys[i]`'s live holder expires (or now). Once queued, it is granted
/// at once if it may overtake everyone queued before it (its keys are all free).
pub fn block_set(
    ctx: &Context,
    keys: &[&[u8]],
    wants: Wants,
    timeout: Millis,
    next_expiry: &[Millis],
) -> Result<()> {
    let db = key::selected_db(ctx.ctx);
    let cap = state::max_waiters();
    if keys.iter().any(|k| waiters(db, k) >= cap) {
        return Err(error::too_many_waiters(cap));
    }
    let (bc, id, timeout) = block_client(ctx, timeout)?;
    let set = Rc::new(Set {
        keys: keys.iter().map(|k| k.to_vec()).collect(),
        overtaken: Cell::new(0),
    });
    let queued = Instant::now();
    let client = session::client_id(ctx);
    QUEUES.with(|q| {
        let mut queues = q.borrow_mut();
        for k in keys {
            let queue = queues.entry((db, k.to_vec())).or_insert_with(|| {
                QUEUED_KEYS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Queue::default()
            });
            let waiter = Waiter {
                bc,
                id,
                timeout,
                owner: wants.owner.to_vec(),
                mode: Mode::Exclusive,
                ttl: wants.ttl,
                session: wants.session,
                delay: wants.delay,
                queued,
                client,
                set: Some(set.clone()),
            };
            // Below the cap (checked above, nothing ran since): cannot fail. The cap is
            // ignored rather than leave the waiter in some queues and not others.
            queue.waiters.push(waiter, usize::MAX).ok();
        }
    });
    CLIENTS.with(|c| c.borrow_mut().insert(bc as usize, (db, keys[0].to_vec())));
    for (k, at) in keys.iter().zip(next_expiry) {
        arm_deadline_timer(ctx.ctx, (db, k), *at);
    }
    // Its keys may all be free, with only sets that wait on busy keys ahead of it.
    let qk: QueueKey = (db, keys[0].to_vec());
    let name = RedisString::create_from_slice(ctx.ctx, keys[0]);
    let mut lock_key = LockKey::open_raw(
        ctx.ctx,
        name.inner,
        raw::KeyMode::READ | raw::KeyMode::WRITE,
    );
    let candidate = Candidate {
        id,
        bc,
        set: Some(set),
        owner: wants.owner.to_vec(),
        ttl: wants.ttl,
        session: wants.session,
        delay: wants.delay,
        queued,
    };
    let mut locks = Locks::new(&qk);
    let is_head = waiters_ahead(&qk, id) == 0;
    try_set(
        ctx.ctx,
        &mut lock_key,
        &qk,
        &candidate,
        is_head,
        key::now(),
        &mut locks,
    )?;
    Ok(())
}

/// For `settle`'s replica check: may the set waiter `id` at the head of `qk`, or a set behind
/// it, be granted now as far as queue positions go?
pub(super) fn might_go(qk: &QueueKey, set: &[Vec<u8>], id: u64) -> bool {
    at_head_everywhere(qk.0, set, id) || waiters(qk.0, &qk.1) > 1
}

/// True when the waiter `id` is at the head of the queue of every key in `set`.
pub(super) fn at_head_everywhere(db: i32, set: &[Vec<u8>], id: u64) -> bool {
    QUEUES.with(|q| {
        let queues = q.borrow();
        set.iter().all(|k| {
            queues
                .get(&(db, k.clone()))
                .and_then(|queue| queue.waiters.iter().next())
                .is_some_and(|w| w.id == id)
        })
    })
}

/// A waiter just taken out of `qk`'s queue: if it is a multi-key waiter, take its entries out
/// of its other keys' queues too, and have each key whose head it was looked at again (the
/// next waiter there may go now, or needs the timer for the new holder's deadline).
pub(super) fn leave_other_queues(ctx: *mut raw::RedisModuleCtx, qk: KeyRef, waiter: &Waiter) {
    let Some(set) = &waiter.set else { return };
    for k in set.iter().filter(|k| k.as_slice() != qk.1) {
        let other: QueueKey = (qk.0, k.clone());
        let was_head = QUEUES.with(|q| {
            let mut queues = q.borrow_mut();
            let Some(queue) = queues.get_mut(&other) else {
                return false;
            };
            let was_head = queue
                .waiters
                .iter()
                .next()
                .is_some_and(|w| w.id == waiter.id);
            queue.waiters.remove(|w| w.id == waiter.id);
            was_head
        });
        drop_queue_if_empty(ctx, (other.0, &other.1));
        if was_head && has_waiters(other.0, &other.1) {
            let detached = DETACHED.with(std::cell::Cell::get);
            if !detached.is_null() {
                defer(detached, Work::Settle(other));
            }
        }
    }
}

/// What [`serve_set`] did with the multi-key waiters of a queue.
pub(super) enum SetStep {
    /// Granted a set every key; it left every queue.
    Granted,
    /// Refused the set at the head with an error (a key became another type, or the owner
    /// holds one SHARED); it left every queue.
    Failed,
    /// No set can go yet: they stay queued, and the scan of this key stops.
    Wait,
}

/// A queued waiter, copied out of its queue.
struct Candidate {
    id: u64,
    bc: *mut raw::RedisModuleBlockedClient,
    /// `None` for a single-key waiter.
    set: Option<Rc<Set>>,
    owner: Vec<u8>,
    ttl: Millis,
    /// The session its grant will belong to (0: none), and the hold's lock-delay.
    session: lock::Serial,
    delay: Millis,
    queued: Instant,
}

/// The first `depth` waiters of `qk`'s queue, in order.
fn candidates(qk: &QueueKey, depth: usize) -> Vec<Candidate> {
    QUEUES.with(|q| {
        q.borrow().get(qk).map_or(vec![], |queue| {
            queue
                .waiters
                .iter()
                .take(depth)
                .map(|w| Candidate {
                    id: w.id,
                    bc: w.bc,
                    set: w.set.clone(),
                    owner: w.owner.clone(),
                    ttl: w.ttl,
                    session: w.session,
                    delay: w.delay,
                    queued: w.queued,
                })
                .collect()
        })
    })
}

/// How many waiters are queued before `id` in `qk`'s queue.
fn waiters_ahead(qk: &QueueKey, id: u64) -> usize {
    QUEUES.with(|q| {
        q.borrow().get(qk).map_or(0, |queue| {
            queue.waiters.iter().take_while(|w| w.id != id).count()
        })
    })
}

/// The locks of the keys one scan looks at, read once each. `qk`'s own key is the caller's
/// open handle and is read from it.
struct Locks {
    db: i32,
    own: Vec<u8>,
    /// `Err` for a key that holds another type.
    read: HashMap<Vec<u8>, std::result::Result<Option<Lock>, ()>>,
}

impl Locks {
    fn new(qk: &QueueKey) -> Locks {
        Locks {
            db: qk.0,
            own: qk.1.clone(),
            read: HashMap::new(),
        }
    }

    /// Read `k` (once per scan).
    fn load(&mut self, ctx: *mut raw::RedisModuleCtx, k: &[u8]) {
        if k != self.own && !self.read.contains_key(k) {
            let name = RedisString::create_from_slice(ctx, k);
            let other = LockKey::open_raw(ctx, name.inner, raw::KeyMode::READ);
            let lock = other.lock().map(|l| l.cloned()).map_err(|_| ());
            self.read.insert(k.to_vec(), lock);
        }
    }

    /// `k`'s lock, read by [`Locks::load`] before.
    fn get<'a>(
        &'a self,
        lock_key: &'a LockKey,
        k: &[u8],
    ) -> std::result::Result<Option<&'a Lock>, ()> {
        if k == self.own {
            return lock_key.lock().map_err(|_| ());
        }
        match self.read.get(k) {
            Some(read) => read.as_ref().map(Option::as_ref).map_err(|_| ()),
            None => Err(()),
        }
    }

    /// Does a waiter for `keys` as `owner` wait on a busy key?
    fn busy(
        &mut self,
        ctx: *mut raw::RedisModuleCtx,
        lock_key: &LockKey,
        keys: &[Vec<u8>],
        owner: &[u8],
        now: Millis,
    ) -> bool {
        keys.iter().any(|k| {
            self.load(ctx, k);
            self.get(lock_key, k)
                .is_ok_and(|l| lock::busy_for(l, owner, now))
        })
    }
}

/// The waiters queued before `c` on any of its keys, each once, with the sets among them, up
/// to the first that may not be overtaken.
fn ahead_of(
    ctx: *mut raw::RedisModuleCtx,
    lock_key: &LockKey,
    c: &Candidate,
    set: &Set,
    locks: &mut Locks,
    now: Millis,
    bound: u32,
) -> (Vec<Ahead>, Vec<Rc<Set>>) {
    let mut seen = std::collections::HashSet::new();
    let mut before: Vec<(Option<Rc<Set>>, Vec<u8>)> = vec![];
    QUEUES.with(|q| {
        let queues = q.borrow();
        for k in set.iter() {
            let Some(queue) = queues.get(&(locks.db, k.clone())) else {
                continue;
            };
            for w in queue.waiters.iter().take_while(|w| w.id != c.id) {
                if seen.insert(w.id) {
                    before.push((w.set.clone(), w.owner.clone()));
                }
            }
        }
    });
    let mut ahead = Vec::with_capacity(before.len());
    let mut sets = vec![];
    for (s, owner) in before {
        let view = match s {
            None => Ahead {
                set: false,
                overtaken: 0,
                busy: true,
            },
            Some(s) => {
                let busy = locks.busy(ctx, lock_key, &s, &owner, now);
                let overtaken = s.overtaken.get();
                sets.push(s);
                Ahead {
                    set: true,
                    overtaken,
                    busy,
                }
            }
        };
        ahead.push(view);
        if !view.overtakable(bound) {
            // The candidate may not pass this one, so it is not granted: the rest does not
            // change that (and is not read).
            break;
        }
    }
    (ahead, sets)
}

/// `set`'s keys as [`lock::decide_macquire`] takes them, from locks [`Locks::load`] read
/// (`Err`: one holds another type).
fn key_states<'a>(
    locks: &'a Locks,
    lock_key: &'a LockKey,
    set: &Set,
) -> std::result::Result<Vec<KeyState<'a>>, ()> {
    set.iter()
        .map(|k| {
            Ok(KeyState {
                lock: locks.get(lock_key, k)?,
                ahead: false,
            })
        })
        .collect()
}

/// What [`try_set`] found for one set.
enum Turn {
    Granted,
    Failed,
    /// It waits; `passable`: a set behind it may still overtake it.
    Wait {
        passable: bool,
    },
}

/// Multi-key waiters are at the head of `qk`'s queue: grant the first set in it (at most
/// [`SCAN_DEPTH`] deep) whose keys are all free and that is at the head of each of their queues
/// or may overtake everyone ahead of it there. The scan stops at the first waiter that may not
/// be overtaken (a single-key waiter, a set waiting on nothing busy, or one passed
/// ``lock.max-overtakes`` times). `lock_key` is `qk`'s key, open; the other keys are opened
/// here (no caller has them open: every caller of `serve` has exactly one key open).
pub(super) fn serve_set(
    ctx: *mut raw::RedisModuleCtx,
    lock_key: &mut LockKey,
    qk: &QueueKey,
    now: Millis,
) -> Result<SetStep> {
    let mut locks = Locks::new(qk);
    for (pos, c) in candidates(qk, SCAN_DEPTH).iter().enumerate() {
        if c.set.is_none() {
            break;
        }
        match try_set(ctx, lock_key, qk, c, pos == 0, now, &mut locks)? {
            Turn::Granted => return Ok(SetStep::Granted),
            Turn::Failed => return Ok(SetStep::Failed),
            Turn::Wait { passable: true } => {}
            Turn::Wait { passable: false } => break,
        }
    }
    Ok(SetStep::Wait)
}

/// Grant the set waiter `c` of `qk`'s queue if it may go now (see [`serve_set`]); a set at the
/// head (`is_head`) that can never be granted as asked is failed.
fn try_set(
    ctx: *mut raw::RedisModuleCtx,
    lock_key: &mut LockKey,
    qk: &QueueKey,
    c: &Candidate,
    is_head: bool,
    now: Millis,
    locks: &mut Locks,
) -> Result<Turn> {
    let Some(set) = c.set.clone() else {
        return Ok(Turn::Wait { passable: false });
    };
    let bound = state::max_overtakes();
    if !session::alive(c.session) {
        // Its session ended while it waited: it is never granted.
        let waiter = if is_head {
            pop_front(ctx, qk)
        } else {
            let waiter = remove_waiter(ctx, c.bc, Some(c.id));
            if let Some(waiter) = &waiter {
                retire(waiter);
            }
            waiter
        };
        if let Some(waiter) = waiter {
            let msg = error::session_ended_while_waiting().to_string();
            unblock(waiter.bc, Outcome::Failed(msg));
        }
        return Ok(Turn::Failed);
    }
    for k in set.iter() {
        locks.load(ctx, k);
    }
    // Its own keys first: most candidates wait on a busy key, and then who is ahead of them
    // (every queue of their keys, the keys of every set there) does not matter.
    let own = key_states(locks, lock_key, &set)
        .map(|keys| lock::decide_macquire(&keys, &c.owner, c.session, now));
    let decision = match own {
        Ok(Ok(MultiAcquire::Grant(_))) => {
            let (ahead, passed) = ahead_of(ctx, lock_key, c, &set, locks, now, bound);
            key_states(locks, lock_key, &set).map(|states| {
                lock::decide_queued_set(&states, &c.owner, c.session, now, &ahead, bound)
                    .map(|d| (d, passed))
            })
        }
        other => other.map(|d| d.map(|d| (d, vec![]))),
    };
    let (grants, passed) = match decision {
        Ok(Ok((MultiAcquire::Grant(_), _)))
            if !session::room_for(c.session, qk.0, &set, &c.owner) =>
        {
            // Its session took other holds while it waited: no room for the set.
            let waiter = if is_head {
                pop_front(ctx, qk)
            } else {
                let waiter = remove_waiter(ctx, c.bc, Some(c.id));
                if let Some(waiter) = &waiter {
                    retire(waiter);
                }
                waiter
            };
            if let Some(waiter) = waiter {
                let msg = error::too_many_session_holds(state::max_session_holds()).reply_text();
                unblock(waiter.bc, Outcome::Failed(msg));
            }
            return Ok(Turn::Failed);
        }
        Ok(Ok((MultiAcquire::Grant(grants), passed))) => (grants, passed),
        Ok(Ok((MultiAcquire::Busy, _))) => {
            let busy = locks.busy(ctx, lock_key, &set, &c.owner, now);
            let me = Ahead {
                set: true,
                overtaken: set.overtaken.get(),
                busy,
            };
            return Ok(Turn::Wait {
                passable: me.overtakable(bound),
            });
        }
        _ if !is_head => return Ok(Turn::Wait { passable: false }),
        failed => {
            let msg = match failed {
                Ok(Err((_, conflict))) => error::conflict(conflict).reply_text(),
                _ => "WRONGTYPE one of the lock keys now holds another kind of value".into(),
            };
            if let Some(waiter) = pop_front(ctx, qk) {
                unblock(waiter.bc, Outcome::Failed(msg));
            }
            return Ok(Turn::Failed);
        }
    };
    grant(ctx, lock_key, qk, c, &set, grants, is_head, now)?;
    for s in passed {
        s.overtaken.set(s.overtaken.get() + 1);
        crate::stats::SETS_OVERTAKEN.incr();
    }
    Ok(Turn::Granted)
}

/// Give `c` every key of `set` as `grants` says, take it out of every queue and unblock it.
#[allow(clippy::too_many_arguments)]
fn grant(
    ctx: *mut raw::RedisModuleCtx,
    lock_key: &mut LockKey,
    qk: &QueueKey,
    c: &Candidate,
    set: &Set,
    grants: Vec<KeyGrant>,
    is_head: bool,
    now: Millis,
) -> Result<()> {
    let names: Vec<Option<RedisString>> = set
        .iter()
        .map(|k| (*k != qk.1).then(|| RedisString::create_from_slice(ctx, k)))
        .collect();
    let mut others: Vec<Option<LockKey>> = names
        .iter()
        .map(|n| {
            n.as_ref()
                .map(|n| LockKey::open_raw(ctx, n.inner, raw::KeyMode::READ | raw::KeyMode::WRITE))
        })
        .collect();
    let take_out = |ctx| {
        if is_head {
            pop_front(ctx, qk)
        } else {
            let waiter = remove_waiter(ctx, c.bc, Some(c.id));
            if let Some(waiter) = &waiter {
                retire(waiter);
            }
            waiter
        }
    };
    // The ttl was checked when the waiter queued (see `serve`).
    let deadline = hold_deadline(now, c.ttl, c.session);
    let mut tokens = Vec::with_capacity(grants.len());
    for (i, (other, grant)) in others.iter_mut().zip(grants).enumerate() {
        let k: &mut LockKey = match other {
            Some(k) => k,
            None => &mut *lock_key,
        };
        let token = match grant {
            KeyGrant::Retry { token } => k.set_deadline(&c.owner, deadline, now).map(|_| token),
            KeyGrant::New => {
                let token = state::next_token(now);
                let hold = Hold {
                    owner: c.owner.as_slice().into(),
                    token,
                    deadline,
                    granted_at: now,
                    session: c.session,
                    delay: c.delay,
                };
                session::track(c.session, qk.0, &set[i], &c.owner);
                k.grant(Mode::Exclusive, hold, Some(now)).map(|_| token)
            }
        };
        // An error here is an internal one (the server refused to store a value or an
        // expiry): the keys granted so far stay until their deadline, and the server log says
        // why. Nothing a client sends can cause it.
        let token = match token {
            Ok(token) => token,
            Err(e) => {
                drop(others);
                if let Some(waiter) = take_out(ctx) {
                    unblock(
                        waiter.bc,
                        Outcome::Failed("ERR could not grant the locks".into()),
                    );
                }
                return Err(e);
            }
        };
        // One LOCK.LOAD per key, in the same propagation unit as the rest of the set (the
        // command, or the timer callback), which Redis wraps in MULTI/EXEC.
        k.replicate_holder(&c.owner, now);
        k.notify(c"lock.acquired");
        k.feed(
            crate::redis::feed::Kind::HandedTo,
            &c.owner,
            token,
            Some(deadline),
        );
        stats::ACQUIRED.incr();
        tokens.push(token);
    }
    drop(others);
    stats::HANDED_OFF.incr();
    stats::WAIT_US.record(c.queued.elapsed().as_micros() as u64);
    if let Some(waiter) = take_out(ctx) {
        unblock(
            waiter.bc,
            Outcome::GrantedSet {
                tokens,
                db: qk.0,
                keys: set.to_vec(),
                delivered: false,
            },
        );
    }
    // The keys' queues where it was at the head are looked at again from a zero-delay timer
    // (`leave_other_queues`); whoever it passed now waits for this grant's deadline.
    for k in set.iter() {
        arm_deadline_timer(ctx, (qk.0, k), deadline);
    }
    Ok(())
}
