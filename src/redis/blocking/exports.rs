//! Waiters of a slot that Valkey 9's atomic slot migration exports (see `redis::asm`).
//!
//! A hold that a session takes while its slot streams to another node reaches that node as a
//! session hold of a session it was never told about (the session's own records are not writes
//! of the slot, so the migration does not carry them): it could only be given a deadline from
//! the largest session ttl. So no session takes a new hold in an exporting slot: `ACQUIRE` and
//! `MACQUIRE` with `SESSION` are refused there (`asm::refuse_session_hold`), and the session
//! waiters already queued there are answered when the export starts, before any handoff.

use super::*;

/// Fail every waiter in a session that is queued on a key of `slots`.
pub fn fail_session_waiters_in(ctx: *mut raw::RedisModuleCtx, slots: &[(u16, u16)]) {
    let theirs: Vec<(usize, u64)> = QUEUES.with(|q| {
        let mut found = vec![];
        for ((_, name), queue) in q.borrow().iter() {
            let slot = crate::redis::slots::key_slot(name);
            if !slots.iter().any(|&(lo, hi)| (lo..=hi).contains(&slot)) {
                continue;
            }
            for w in queue.waiters.iter().filter(|w| w.session != 0) {
                found.push((w.bc as usize, w.id));
            }
        }
        found.sort_unstable();
        found.dedup();
        found
    });
    for (bc, id) in theirs {
        let bc = bc as *mut raw::RedisModuleBlockedClient;
        if let Some(waiter) = remove_waiter(ctx, bc, Some(id)) {
            retire(&waiter);
            unblock(
                waiter.bc,
                Outcome::Failed(error::slot_exporting().to_string()),
            );
        }
    }
}
