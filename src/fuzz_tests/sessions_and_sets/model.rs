//! The model side of `sessions_and_sets`: holds, keys and sessions as plain fields, and the
//! documented rules (docs/commands.md) that decide an acquire and a grant on them. It knows
//! none of the lock state machine's code.

use super::super::*;
use crate::lock::session::Serial;
use crate::lock::Conflict;

/// One hold as the model keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct MHold {
    pub(super) owner: Vec<u8>,
    pub(super) token: u64,
    pub(super) deadline: Millis,
    pub(super) session: Serial,
    pub(super) delay: Millis,
}

impl MHold {
    /// The documented rule: nobody else gets the place before the deadline plus the
    /// lock-delay (capped where deadlines are).
    pub(super) fn frees_at(&self) -> Millis {
        (i128::from(self.deadline) + i128::from(self.delay)).min(i128::from(MAX_DEADLINE)) as Millis
    }
}

/// One key as the model keeps it; no holds means no key.
#[derive(Clone, Debug)]
pub(super) struct MKey {
    pub(super) mode: Mode,
    pub(super) holds: Vec<MHold>,
}

impl Default for MKey {
    fn default() -> Self {
        MKey {
            mode: Mode::Exclusive,
            holds: Vec::new(),
        }
    }
}

impl MKey {
    pub(super) fn live(&self, now: Millis) -> impl Iterator<Item = &MHold> {
        self.holds.iter().filter(move |h| now < h.deadline)
    }

    pub(super) fn occupying(&self, now: Millis) -> impl Iterator<Item = &MHold> {
        self.holds.iter().filter(move |h| now < h.frees_at())
    }

    /// Forget the holds whose place was free by `at`.
    pub(super) fn prune(&mut self, at: Millis) {
        self.holds.retain(|h| h.frees_at() > at);
    }

    /// What an acquire by `owner` in `mode` and `session` deserves (docs/commands.md): a free
    /// key (nobody live or in lock-delay) is granted; the owner's own live hold is retried,
    /// unless it is in another session or mode (an error); a shared acquire with another limit
    /// than the key's is an error; shared joins shared while the limit allows; else busy. A
    /// lost hold in its lock-delay keeps everyone out, its own owner included.
    pub(super) fn decide(
        &self,
        owner: &[u8],
        mode: Mode,
        session: Serial,
        now: Millis,
    ) -> Result<Acquire, Conflict> {
        let occupying = self.occupying(now).count();
        if occupying == 0 {
            return Ok(Acquire::Grant);
        }
        if let Some(h) = self.live(now).find(|h| h.owner == owner) {
            return if h.session != session {
                Err(Conflict::OtherSession)
            } else if self.mode.is_shared() != mode.is_shared() {
                Err(Conflict::OtherMode { held: self.mode })
            } else if self.mode != mode {
                Err(Conflict::Limit {
                    limit: self.mode.limit(),
                })
            } else {
                Ok(Acquire::Retry { token: h.token })
            };
        }
        match (self.mode, mode) {
            (Mode::Shared { limit: held }, Mode::Shared { limit }) if held != limit => {
                Err(Conflict::Limit { limit: held })
            }
            (Mode::Shared { limit }, Mode::Shared { .. })
                if limit.is_none_or(|n| (occupying as u64) < n) =>
            {
                Ok(Acquire::Grant)
            }
            _ => Ok(Acquire::Busy),
        }
    }

    /// A grant: the holds that no longer occupy go; an exclusive grant (or a shared one on a
    /// key that was not shared) is the only hold; a shared one replaces the owner's old entry
    /// or joins.
    pub(super) fn grant(&mut self, mode: Mode, hold: MHold, now: Millis) {
        self.prune(now);
        if mode.is_shared() && self.mode.is_shared() && !self.holds.is_empty() {
            self.holds.retain(|h| h.owner != hold.owner);
            self.holds.push(hold);
        } else {
            self.holds = vec![hold];
        }
        self.mode = mode;
    }
}

/// A session as the model keeps it.
#[derive(Clone, Debug)]
pub(super) struct MSession {
    pub(super) deadline: Millis,
    pub(super) lock_delay: Millis,
    pub(super) ttl: Millis,
    /// `BOUND GRACE ms` (0: none, or not bound).
    pub(super) grace: Millis,
    /// While detached: when its grace ends.
    pub(super) detached: Option<Millis>,
}
