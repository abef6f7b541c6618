//! Multi-key waiters (`LOCK.MACQUIRE ... BLOCK`): one entry in the queue of every key, granted
//! the whole set at once when it is at the head of every one of those queues and every key is
//! free (or already its owner's).
//!
//! How it fits the per-key queues: a multi-key waiter at the head of a key's queue stops that
//! key's scan (`serve`) until the whole set can go, so nobody queued after it on that key
//! overtakes it; keys outside its set never see it. Whenever one of its keys is served (a
//! release, an expiry, a waiter leaving), the scan of that key finds it at the head and checks
//! the whole set. Why that cannot deadlock is argued in `crate::lock::multi`.

use std::rc::Rc;
use std::time::Instant;

use redis_module::{raw, Context, RedisString};

use super::{
    arm_deadline_timer, block_client, defer, drop_queue_if_empty, has_waiters, hold_deadline,
    pop_front, unblock, waiters, Outcome, Queue, QueueKey, Waiter, Wants, Work, CLIENTS, DETACHED,
    QUEUED_KEYS, QUEUES,
};
use crate::error::{self, Error, Result};
use crate::lock::{self, Hold, KeyGrant, KeyState, Millis, Mode, MultiAcquire};
use crate::redis::key::{self, LockKey};
use crate::redis::session;
use crate::{state, stats};

/// Block the calling client in the queue of every one of `keys` (distinct, in argument order)
/// until it is granted all of them, times out (`timeout` ms; 0 waits forever) or goes away.
/// `next_expiry[i]` is when `keys[i]`'s live holder expires (or now).
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
    let (bc, id, timeout_timer) = block_client(ctx, timeout)?;
    let set = Rc::new(keys.iter().map(|k| k.to_vec()).collect::<Vec<_>>());
    let queued = Instant::now();
    QUEUES.with(|q| {
        let mut queues = q.borrow_mut();
        for k in keys {
            let queue = queues.entry((db, k.to_vec())).or_insert_with(|| {
                QUEUED_KEYS.with(|n| n.set(n.get() + 1));
                Queue::default()
            });
            let waiter = Waiter {
                bc,
                id,
                timeout_timer,
                owner: wants.owner.to_vec(),
                mode: Mode::Exclusive,
                ttl: wants.ttl,
                session: wants.session,
                delay: wants.delay,
                queued,
                set: Some(set.clone()),
            };
            // Below the cap (checked above, nothing ran since): cannot fail. The cap is
            // ignored rather than leave the waiter in some queues and not others.
            queue.waiters.push(waiter, usize::MAX).ok();
        }
    });
    CLIENTS.with(|c| c.borrow_mut().insert(bc as usize, (db, keys[0].to_vec())));
    for (k, at) in keys.iter().zip(next_expiry) {
        arm_deadline_timer(ctx.ctx, &(db, k.to_vec()), *at);
    }
    Ok(())
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
pub(super) fn leave_other_queues(ctx: *mut raw::RedisModuleCtx, qk: &QueueKey, waiter: &Waiter) {
    let Some(set) = &waiter.set else { return };
    for k in set.iter().filter(|k| **k != qk.1) {
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
        drop_queue_if_empty(ctx, &other);
        if was_head && has_waiters(other.0, &other.1) {
            let detached = DETACHED.with(std::cell::Cell::get);
            if !detached.is_null() {
                defer(detached, Work::Settle(other));
            }
        }
    }
}

/// What [`serve_set`] did with the multi-key waiter at the head of a queue.
pub(super) enum SetStep {
    /// Granted every key; it left every queue.
    Granted,
    /// Refused with an error (a key became another type, or the owner holds one SHARED); it
    /// left every queue.
    Failed,
    /// Not every key can go yet: it stays at the head, and the scan of this key stops.
    Wait,
}

/// The head of `qk`'s queue is a multi-key waiter: grant it every key of its set if it is at
/// the head of each of their queues and each key is free (or its owner's). `lock_key` is
/// `qk`'s key, open; the other keys are opened here (no caller has them open: every caller of
/// `serve` has exactly one key open).
pub(super) fn serve_set(
    ctx: *mut raw::RedisModuleCtx,
    lock_key: &mut LockKey,
    qk: &QueueKey,
    now: Millis,
) -> Result<SetStep> {
    let head = QUEUES.with(|q| {
        let queues = q.borrow();
        let w = queues.get(qk)?.waiters.iter().next()?;
        Some((
            w.id,
            w.set.clone()?,
            w.owner.clone(),
            w.ttl,
            w.queued,
            w.session,
            w.delay,
        ))
    });
    let Some((id, set, owner, ttl, queued, serial, delay)) = head else {
        return Ok(SetStep::Wait);
    };
    if !session::alive(serial) {
        if let Some(waiter) = pop_front(ctx, qk) {
            let msg = error::session_ended_while_waiting().to_string();
            unblock(waiter.bc, Outcome::Failed(msg));
        }
        return Ok(SetStep::Failed);
    }
    if !at_head_everywhere(qk.0, &set, id) {
        return Ok(SetStep::Wait);
    }
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
    let decision = {
        let states: Result<Vec<KeyState>> = others
            .iter()
            .map(|other| {
                Ok(KeyState {
                    lock: match other {
                        Some(k) => k.lock()?,
                        None => lock_key.lock()?,
                    },
                    ahead: false,
                })
            })
            .collect();
        states.map(|states| lock::decide_macquire(&states, &owner, serial, now))
    };
    let grants = match decision {
        Ok(Ok(MultiAcquire::Grant(grants))) => grants,
        Ok(Ok(MultiAcquire::Busy)) => return Ok(SetStep::Wait),
        failed => {
            drop(others);
            let msg = match failed {
                Ok(Err((_, conflict))) => error::conflict(conflict),
                Err(e) => e,
                Ok(Ok(_)) => Error::WrongType,
            };
            let msg = match msg {
                Error::WrongType => {
                    "WRONGTYPE one of the lock keys now holds another kind of value".into()
                }
                other => other.reply_text(),
            };
            if let Some(waiter) = pop_front(ctx, qk) {
                unblock(waiter.bc, Outcome::Failed(msg));
            }
            return Ok(SetStep::Failed);
        }
    };
    // The ttl was checked when the waiter queued (see `serve`).
    let deadline = hold_deadline(now, ttl, serial);
    let mut tokens = Vec::with_capacity(grants.len());
    for (i, (other, grant)) in others.iter_mut().zip(grants).enumerate() {
        let k: &mut LockKey = match other {
            Some(k) => k,
            None => &mut *lock_key,
        };
        let token = match grant {
            KeyGrant::Retry { token } => k.set_deadline(&owner, deadline, now).map(|_| token),
            KeyGrant::New => {
                let token = state::next_token(now);
                let hold = Hold {
                    owner: owner.clone(),
                    token,
                    deadline,
                    granted_at: now,
                    session: serial,
                    delay,
                };
                session::track(serial, qk.0, &set[i], &owner);
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
                if let Some(waiter) = pop_front(ctx, qk) {
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
        k.replicate_holder(&owner, now);
        k.notify(c"lock.acquired");
        stats::ACQUIRED.incr();
        tokens.push(token);
    }
    drop(others);
    stats::HANDED_OFF.incr();
    stats::WAIT_US.record(queued.elapsed().as_micros() as u64);
    if let Some(waiter) = pop_front(ctx, qk) {
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
    // The other keys' queues (if anyone waits there) are looked at again from a zero-delay
    // timer (`leave_other_queues`), which arms their deadline timers for this grant.
    Ok(SetStep::Granted)
}
