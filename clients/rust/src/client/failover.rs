//! How a cluster node's [`Endpoint`] follows its slot to another master (issue 34): after
//! `MOVED`, `READONLY` or a role-change `UNBLOCKED` (a planned failover), and after its node is
//! gone (a killed master: `CLUSTER SLOTS` of the nodes it knows, until the replica is promoted).
//!
//! The decisions are here, once for both APIs: [`Endpoint::follow_plan`] (a planned failover),
//! [`Pursuit`] (a killed master: whether a failed command is sent again, until when, and how
//! long to pause while the cluster still names the dead node) and [`Endpoint::adopt`] (what a
//! `CLUSTER SLOTS` answer changes). The sync and the async client differ only in how they ask.

use std::sync::PoisonError;
use std::time::{Duration, Instant};

use super::Endpoint;
use crate::command::{Failure, Resend};
use crate::error::Error;

/// Where a cluster node's client goes after an error that says its node gave up the slot.
pub(crate) enum Next {
    /// The node a `MOVED` named.
    To(redis::Client),
    /// The master the demoted node's `ROLE` names (an I/O step: the sync and the async client
    /// each ask in their own way, and read the reply with [`Endpoint::master_in_role`]).
    ByRole,
}

/// How long to wait before asking again while the nodes still name the gone node as the
/// slot's master (its replica not promoted yet): short against a promotion (about a second
/// after `CLUSTER FAILOVER FORCE`, several node timeouts by itself), long enough not to spin.
const PAUSE: Duration = Duration::from_millis(100);

/// A command's pursuit of its slot after its node is gone (a killed master, issue 34): until
/// the caller's own deadline (the command's reply timeout from its first send; an acquire's
/// wait plus the I/O timeout), a failure that says the node cannot be reached sends it again
/// to the slot's master as the other nodes name it, once its replica is promoted.
pub(crate) struct Pursuit {
    /// When the caller stops waiting.
    deadline: Instant,
}

impl Pursuit {
    /// A pursuit for a command whose caller waits `budget` from now.
    pub(crate) fn within(budget: Duration) -> Pursuit {
        Pursuit {
            deadline: Instant::now() + budget,
        }
    }

    /// After `failure` of a command sent through `endpoint`: whether to ask the nodes for the
    /// slot's master and send it again. Only a cluster node's client made for a key (it knows
    /// the slot and other nodes), only after a connection error (refused, broken, no answer:
    /// an error reply is an answer), only as the command allows (`resend`: a command that may
    /// have run is sent again only if running it twice is safe), and only before the deadline.
    pub(crate) fn again(&self, endpoint: &Endpoint, failure: &Failure, resend: Resend) -> bool {
        let allowed = match resend {
            Resend::Never => false,
            Resend::Unsent => !failure.maybe_sent,
            Resend::Always => true,
        };
        allowed
            && matches!(failure.error, Error::Connection(_))
            && endpoint.is_cluster()
            && endpoint.slot.is_some()
            && Instant::now() < self.deadline
    }

    /// A pursuit until `deadline` (a session's, as of its last keepalive).
    pub(crate) fn until(deadline: Instant) -> Pursuit {
        Pursuit { deadline }
    }

    /// The time left until the deadline (at least 1 ms: a timeout of zero is refused).
    pub(crate) fn left(&self) -> Duration {
        self.deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    }

    /// How long to pause before the next try when no other master was named.
    pub(crate) fn pause(&self) -> Duration {
        PAUSE.min(self.deadline.saturating_duration_since(Instant::now()))
    }
}

impl Endpoint {
    /// Whether this is a cluster node's endpoint ([`Client::for_key`], or it met `MOVED`).
    pub(crate) fn is_cluster(&self) -> bool {
        self.cluster.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// After `error`: whether it says this cluster node no longer serves the client's slot as
    /// a master, and where to go (issue 34). `MOVED` names that node; `READONLY` (a replica
    /// now: a session's `OPEN` names no key to redirect by) and a waiter's `UNBLOCKED ...
    /// (master -> replica?)` are followed to the master the node's `ROLE` names. The command
    /// did not run in any of these cases, so it may be sent again. A node that is gone
    /// (`kill -9`) is a [`Pursuit`]'s: the other nodes' `CLUSTER SLOTS` name its successor.
    pub(crate) fn follow_plan(&self, error: &Error) -> Option<Next> {
        let Error::Server(e) = error else {
            return None;
        };
        if e.kind() == redis::ErrorKind::Moved {
            self.cluster
                .store(true, std::sync::atomic::Ordering::Relaxed);
            return self
                .redirected(e)
                .ok()
                .map(|endpoint| Next::To(endpoint.redis()));
        }
        (self.is_cluster() && demoted(e)).then_some(Next::ByRole)
    }

    /// Whether `error` says this cluster node does not serve the key's slot as a master now,
    /// or not yet: `MOVED`, and for a cluster node also `READONLY`, a role-change `UNBLOCKED`,
    /// `TRYAGAIN`, `CLUSTERDOWN` and `MASTERDOWN` (a failover under way). The change feed reads
    /// these as "follow the slot", never as "the key is free".
    pub(crate) fn slot_left(&self, error: &Error) -> bool {
        let Error::Server(e) = error else {
            return false;
        };
        use redis::ErrorKind::*;
        e.kind() == Moved
            || (self.is_cluster()
                && (demoted(e) || matches!(e.kind(), TryAgain | ClusterDown | MasterDown)))
    }

    /// This endpoint as a cluster node's for `key`, made through `seed` (kept to ask about the
    /// slot when this node is gone).
    pub(crate) fn for_cluster_key(mut self, seed: &Endpoint, key: &str) -> Endpoint {
        self.cluster
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let mut peers = vec![seed.redis()];
        if let Some((_, more)) = &seed.slot {
            peers.extend(more.iter().cloned());
        }
        self.slot = Some((hash_slot(key.as_bytes()), peers));
        self
    }

    /// After a connection `error`: whether a cluster node's client now points at another
    /// master of its slot, as the nodes it knows (the seed, then this one) answer `CLUSTER
    /// SLOTS` (issue 34: a killed master, its replica promoted). Blocking I/O: for the
    /// background threads (a bound session's re-attach, the feed) and the sync client's
    /// [`Pursuit`]s.
    pub(crate) fn follow_gone_blocking(&self, error: &Error) -> bool {
        matches!(error, Error::Connection(_)) && self.follow_slot_blocking()
    }

    /// Ask the nodes this cluster node's client knows (the seed, then this one) for its slot's
    /// master, with blocking I/O: true if it now points at another master ([`Endpoint::adopt`]).
    pub(crate) fn follow_slot_blocking(&self) -> bool {
        let Some((slot, peers)) = self.slot_peers() else {
            return false;
        };
        for peer in peers {
            let asked = Endpoint {
                redis: std::sync::RwLock::new(peer),
                ..self.with_timeouts(self.connect_timeout, self.io_timeout)
            };
            let Ok(ranges) = asked.cluster_slots() else {
                continue;
            };
            let Ok(master) = self.master_in_slots(slot, ranges) else {
                continue;
            };
            return self.adopt(master);
        }
        false
    }

    /// A cluster node's client made for a key: its slot, and the nodes to ask `CLUSTER SLOTS`
    /// (the seed and the nodes it knew, then this one).
    pub(crate) fn slot_peers(&self) -> Option<(u16, Vec<redis::Client>)> {
        let (slot, peers) = self.slot.as_ref().filter(|_| self.is_cluster())?;
        let mut peers = peers.clone();
        peers.push(self.redis());
        Some((*slot, peers))
    }

    /// After a node answered `CLUSTER SLOTS` with `master` for this client's slot: point this
    /// endpoint there if it is another node (true), else leave it (false: the gone node is
    /// still named, its replica not promoted yet).
    pub(crate) fn adopt(&self, master: redis::Client) -> bool {
        let here = self.redis().get_connection_info().addr.to_string();
        if master.get_connection_info().addr.to_string() == here {
            return false;
        }
        self.repoint(master);
        true
    }

    /// `CLUSTER SLOTS` on this node.
    fn cluster_slots(&self) -> Result<Vec<Vec<redis::Value>>, Error> {
        let mut conn = self.connect(self.connect_timeout)?;
        conn.set_read_timeout(Some(self.io_timeout))
            .map_err(Error::from_redis)?;
        redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query(&mut conn)
            .map_err(Error::from_redis)
    }

    /// The master of `slot` in a `CLUSTER SLOTS` reply, with this endpoint's credentials,
    /// database and TLS settings.
    pub(crate) fn master_in_slots(
        &self,
        slot: u16,
        ranges: Vec<Vec<redis::Value>>,
    ) -> Result<redis::Client, Error> {
        let bad = || Error::UnexpectedReply {
            command: "CLUSTER SLOTS",
            reply: format!("slot {slot}"),
        };
        for range in ranges {
            let (Some(redis::Value::Int(start)), Some(redis::Value::Int(end))) =
                (range.first(), range.get(1))
            else {
                continue;
            };
            if !(*start..=*end).contains(&i64::from(slot)) {
                continue;
            }
            let Some(redis::Value::Array(master)) = range.get(2) else {
                return Err(bad());
            };
            return match (master.first(), master.get(1)) {
                (Some(redis::Value::BulkString(host)), Some(redis::Value::Int(port))) => {
                    let host = String::from_utf8_lossy(host);
                    let port = u16::try_from(*port).map_err(|_| bad())?;
                    self.at(&host, port)
                }
                _ => Err(bad()),
            };
        }
        Err(bad())
    }

    /// Point this endpoint at `next` (a failover followed).
    pub(crate) fn repoint(&self, next: redis::Client) {
        *self.redis.write().unwrap_or_else(PoisonError::into_inner) = next;
    }

    /// [`Endpoint::follow_plan`] carried out with blocking I/O (`ROLE` on a sync connection):
    /// true if the endpoint now points at the slot's master. For the sync client, and for a
    /// bound session's thread in both APIs.
    pub(crate) fn follow_blocking(&self, error: &Error) -> bool {
        let next = match self.follow_plan(error) {
            None => return false,
            Some(Next::To(next)) => Ok(next),
            Some(Next::ByRole) => self.master_by_role(),
        };
        match next {
            Ok(next) => {
                self.repoint(next);
                true
            }
            Err(_) => false,
        }
    }

    /// The master this node replicates now (`ROLE` answers `slave host port ...`).
    fn master_by_role(&self) -> Result<redis::Client, Error> {
        let mut conn = self.connect(self.connect_timeout)?;
        conn.set_read_timeout(Some(self.io_timeout))
            .map_err(Error::from_redis)?;
        let role: Vec<redis::Value> = redis::cmd("ROLE")
            .query(&mut conn)
            .map_err(Error::from_redis)?;
        self.master_in_role(&role)
    }

    /// The master a replica's `ROLE` reply (`slave host port ...`) names, with this endpoint's
    /// credentials, database and TLS settings.
    pub(crate) fn master_in_role(&self, role: &[redis::Value]) -> Result<redis::Client, Error> {
        let text = |v: &redis::Value| match v {
            redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
            redis::Value::SimpleString(s) => Some(s.clone()),
            redis::Value::Int(n) => Some(n.to_string()),
            _ => None,
        };
        let words: Vec<Option<String>> = role.iter().take(3).map(text).collect();
        match words.as_slice() {
            [Some(kind), Some(host), Some(port)] if kind == "slave" => {
                let port = port.parse().map_err(|_| Error::UnexpectedReply {
                    command: "ROLE",
                    reply: format!("{role:?}"),
                })?;
                self.at(host, port)
            }
            _ => Err(Error::UnexpectedReply {
                command: "ROLE",
                reply: format!("{role:?}"),
            }),
        }
    }
}

/// The cluster hash slot of `key` (CRC16/XMODEM of its hash tag, or of the whole key, mod
/// 16384), as Redis computes it.
fn hash_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &byte in tagged {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// A reply that says the node stopped being a master: `READONLY ...`, or Redis's (and the
/// module's) answer to a waiter whose node turned replica.
fn demoted(e: &redis::RedisError) -> bool {
    let text = e.to_string();
    e.kind() == redis::ErrorKind::ReadOnly
        || text.contains("READONLY")
        || (text.contains("UNBLOCKED")
            && (text.contains("master -> replica") || text.contains("became a replica")))
}

#[cfg(test)]
mod tests {
    use super::hash_slot;

    /// Slots as Redis computes them (`CLUSTER KEYSLOT`): the whole key, or its hash tag.
    #[test]
    fn hash_slots_are_the_servers() {
        assert_eq!(hash_slot(b"foo"), 12182);
        assert_eq!(hash_slot(b"123456789"), 12739);
        assert_eq!(hash_slot(b"{foo}bar"), 12182);
        // An empty tag is no tag: the whole key is hashed.
        assert_ne!(hash_slot(b"{}foo"), hash_slot(b"foo"));
    }
}
