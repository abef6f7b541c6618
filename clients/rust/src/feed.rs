//! The change feed of a lock key (`LOCK.WATCH key`, then `SSUBSCRIBE` to the channel it names),
//! as the client reads it, written once for both APIs with no I/O: the commands and their
//! replies, a message ([`Message`]), a key's state as `LOCK.INFO` shows it ([`KeyState`]), and
//! what each means to a guard ([`HoldWatch`]: is this a loss of mine?) and to an election's
//! observer ([`Picture`]: who leads now?). The connections and the thread that reads them are
//! `subscriber.rs`.
//!
//! A message is `<seq> <event> <token> <ttl-ms> <owner>`; `seq` grows by 1 per message of the
//! key, so a gap means messages were lost (pub/sub delivers at most once), and the reader then
//! reads `LOCK.INFO` again (a resynchronisation).
//!
//! A message is a claim, never proof: anyone allowed to `SPUBLISH` on the channel can publish
//! one (`SECURITY.md`). So a listener never acts on a message alone: one that would report a
//! loss or a new leader keeps what it claims and asks for the state ([`Heard::Resync`]), and
//! what is reported is what `LOCK.INFO` shows. A guard is lost only when the state no longer
//! shows its token (with the message's reason when it agrees); an observer reports the leader
//! the state shows, as fed (not `resync`) when the message said the same. A real change costs
//! one round trip more than the message; a forged one a read, and nothing is reported.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::Value;

use crate::command::{unexpected, Command};
use crate::error::Error;
use crate::hold::Hold;
use crate::watchdog::{LossReason, Report};

/// What a feed message says happened to the key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// A new token was granted (a free key, or a shared holder joining).
    Acquired,
    /// A hold ended and the next waiter was granted in the same step (the new owner, token).
    Handoff,
    /// The owner released it (`LOCK.RELEASE`, or its session was closed).
    Released,
    /// The owner's deadline moved.
    Extended,
    /// The owner's hold reached its deadline.
    Expired,
    /// The owner's session expired or its bound connection closed.
    Lost,
    /// The key went away for another reason (`DEL`, `RENAME`, eviction, ...).
    Deleted,
    /// `FLUSHDB` / `FLUSHALL`.
    Flushed,
    /// `SWAPDB`.
    Swapped,
    /// The server became a replica.
    Demoted,
    /// An event this client does not know (a newer server's): it changes nothing it tracks.
    Other(String),
}

impl Event {
    fn parse(word: &str) -> Event {
        match word {
            "acquired" => Event::Acquired,
            "handoff" => Event::Handoff,
            "released" => Event::Released,
            "extended" => Event::Extended,
            "expired" => Event::Expired,
            "lost" => Event::Lost,
            "deleted" => Event::Deleted,
            "flushed" => Event::Flushed,
            "swapped" => Event::Swapped,
            "demoted" => Event::Demoted,
            other => Event::Other(other.to_string()),
        }
    }

    /// The key itself went away, with every hold on it.
    fn removes_key(&self) -> bool {
        matches!(
            self,
            Event::Deleted | Event::Flushed | Event::Swapped | Event::Demoted
        )
    }
}

/// One feed message: `<seq> <event> <token> <ttl-ms> <owner>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Message {
    /// The key's sequence number.
    pub(crate) seq: u64,
    /// What happened.
    pub(crate) event: Event,
    /// The hold's token (0 for events about the whole key).
    pub(crate) token: u64,
    /// The hold's remaining ttl (-1: a session hold with no deadline of its own; 0: none).
    pub(crate) ttl_ms: i64,
    /// The hold's owner, raw (it may contain spaces; empty for events about the whole key).
    pub(crate) owner: String,
}

impl Message {
    /// The message's fields, or `None` if it is not one (then it is skipped).
    pub(crate) fn parse(payload: &[u8]) -> Option<Message> {
        let text = String::from_utf8_lossy(payload);
        let mut parts = text.splitn(5, ' ');
        let seq = parts.next()?.parse().ok()?;
        let event = Event::parse(parts.next()?);
        let token = parts.next()?.parse().ok()?;
        let ttl_ms = parts.next()?.parse().ok()?;
        let owner = parts.next().unwrap_or("").to_string();
        Some(Message {
            seq,
            event,
            token,
            ttl_ms,
            owner,
        })
    }
}

/// `LOCK.WATCH key` -> the key's channel and its current sequence number.
pub(crate) fn watch(key: &str) -> Command<(Vec<u8>, u64)> {
    let mut cmd = redis::cmd("LOCK.WATCH");
    cmd.arg(key);
    Command::new(cmd, |reply| match reply {
        Value::Array(items) => match <[Value; 2]>::try_from(items) {
            Ok([Value::BulkString(channel), Value::Int(seq)]) if seq >= 0 => {
                Ok((channel, seq as u64))
            }
            Ok(items) => Err(unexpected("LOCK.WATCH", Value::Array(items.into()))),
            Err(items) => Err(unexpected("LOCK.WATCH", Value::Array(items))),
        },
        other => Err(unexpected("LOCK.WATCH", other)),
    })
}

/// `LOCK.UNWATCH key` -> was this connection watching it?
pub(crate) fn unwatch(key: &str) -> Command<bool> {
    let mut cmd = redis::cmd("LOCK.UNWATCH");
    cmd.arg(key);
    Command::new(cmd, |reply| match reply {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        other => Err(unexpected("LOCK.UNWATCH", other)),
    })
}

/// One holder of a key, as `LOCK.INFO` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Holder {
    /// Its owner.
    pub(crate) owner: String,
    /// Its token.
    pub(crate) token: u64,
}

/// A key as `LOCK.INFO` shows it: its holders (none when it is free) and its sequence number
/// (`None` when the reply has none, e.g. a free key).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct KeyState {
    /// The live holders, in grant order.
    pub(crate) holders: Vec<Holder>,
    /// True for a shared key.
    pub(crate) shared: bool,
    /// The `seq` field.
    pub(crate) seq: Option<u64>,
}

/// `LOCK.INFO key` -> the key's state (a free key has no holders).
pub(crate) fn info(key: &str) -> Command<KeyState> {
    let mut cmd = redis::cmd("LOCK.INFO");
    cmd.arg(key);
    Command::new(cmd, |reply| match reply {
        Value::Nil => Ok(KeyState::default()),
        other => KeyState::from_reply(other),
    })
}

/// A map reply (RESP3) or a flat array of names and values (RESP2) as pairs.
fn pairs(reply: Value) -> Result<Vec<(String, Value)>, Error> {
    let items = match reply {
        Value::Map(pairs) => pairs,
        Value::Array(items) if items.len() % 2 == 0 => {
            let mut items = items.into_iter();
            let mut pairs = Vec::new();
            while let (Some(name), Some(value)) = (items.next(), items.next()) {
                pairs.push((name, value));
            }
            pairs
        }
        other => return Err(unexpected("LOCK.INFO", other)),
    };
    items
        .into_iter()
        .map(|(name, value)| Ok((text(name)?, value)))
        .collect()
}

fn text(value: Value) -> Result<String, Error> {
    match value {
        Value::BulkString(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
        Value::SimpleString(s) => Ok(s),
        Value::VerbatimString { text, .. } => Ok(text),
        other => Err(unexpected("LOCK.INFO", other)),
    }
}

fn int(value: Value) -> Result<i64, Error> {
    match value {
        Value::Int(n) => Ok(n),
        other => Err(unexpected("LOCK.INFO", other)),
    }
}

impl KeyState {
    fn from_reply(reply: Value) -> Result<KeyState, Error> {
        let (mut owner, mut token, mut holders) = (None, None, None);
        let mut state = KeyState::default();
        for (name, value) in pairs(reply)? {
            match name.as_str() {
                "owner" => owner = Some(text(value)?),
                "token" => token = Some(int(value)? as u64),
                "mode" => state.shared = text(value)? == "shared",
                "seq" => state.seq = Some(int(value)? as u64),
                "holders" => {
                    let Value::Array(entries) = value else {
                        return Err(unexpected("LOCK.INFO", value));
                    };
                    let mut list = Vec::new();
                    for entry in entries {
                        let (mut owner, mut token) = (String::new(), 0);
                        for (name, value) in pairs(entry)? {
                            match name.as_str() {
                                "owner" => owner = text(value)?,
                                "token" => token = int(value)? as u64,
                                _ => {}
                            }
                        }
                        list.push(Holder { owner, token });
                    }
                    holders = Some(list);
                }
                _ => {}
            }
        }
        state.holders = match (holders, owner, token) {
            (Some(list), _, _) => list,
            (None, Some(owner), Some(token)) => vec![Holder { owner, token }],
            _ => Vec::new(),
        };
        Ok(state)
    }

    /// The one holder of an exclusive key (an election's leader), if any.
    pub(crate) fn exclusive_holder(&self) -> Option<&Holder> {
        match (self.shared, self.holders.as_slice()) {
            (false, [holder]) => Some(holder),
            _ => None,
        }
    }
}

/// What a listener wants after a message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Heard {
    /// Nothing more.
    Done,
    /// Read the key's state again: the message alone does not tell.
    Resync,
}

/// Someone who follows a key's feed: a guard, or an election's observer. Called from the
/// subscriber's thread, in the order of the key's messages.
pub(crate) trait Listener: Send + Sync + 'static {
    /// A message about `key` (only those later than what the listener has seen).
    fn message(&self, key: &str, message: &Message) -> Heard;
    /// The key's state, read with `LOCK.INFO` once the subscription is in place, and again after
    /// a gap in the messages or a reconnect (`again`).
    fn resync(&self, key: &str, state: &KeyState, again: bool);
    /// The feed's connection was lost: messages may be missed until it is back (the subscriber
    /// reconnects and resynchronises).
    fn disconnected(&self, error: &Arc<Error>);
    /// When the listener's own deadline passes, if it has one ([`Listener::deadline_passed`]).
    fn deadline(&self) -> Option<Instant> {
        None
    }
    /// The deadline of [`Listener::deadline`] has passed.
    fn deadline_passed(&self) {}
}

/// A guard's listener: reports to the guard the losses the feed shows, its own conservative
/// deadline, and a lost feed connection.
pub(crate) struct HoldWatch {
    /// The hold: its keys, tokens, TTL and when it was last renewed.
    pub(crate) hold: Arc<Hold>,
    /// The guard's loss signal.
    report: Arc<dyn Report>,
    /// A loss was reported: the deadline is over.
    reported: AtomicBool,
    /// The loss a message claimed, until the state read confirms it (or not).
    claim: Mutex<Option<LossReason>>,
}

impl HoldWatch {
    pub(crate) fn new(hold: Arc<Hold>, report: Arc<dyn Report>) -> HoldWatch {
        HoldWatch {
            hold,
            report,
            reported: AtomicBool::new(false),
            claim: Mutex::new(None),
        }
    }

    fn report(&self, reason: LossReason) {
        self.reported.store(true, Ordering::Relaxed);
        self.report.report(reason);
    }

    fn token_of(&self, key: &str) -> Option<u64> {
        let i = self.hold.keys().iter().position(|k| k == key)?;
        self.hold.tokens().get(i).copied()
    }
}

impl Listener for HoldWatch {
    fn message(&self, key: &str, message: &Message) -> Heard {
        let Some(mine) = self.token_of(key) else {
            return Heard::Done;
        };
        let ours = message.token == mine;
        let reason = match &message.event {
            Event::Released if ours => LossReason::Released,
            Event::Expired if ours => LossReason::Expired,
            Event::Lost if ours => LossReason::SessionEnded,
            Event::Deleted => LossReason::Deleted,
            Event::Flushed => LossReason::Flushed,
            Event::Swapped => LossReason::Swapped,
            Event::Demoted => LossReason::Demoted,
            // Another owner granted: an exclusive key has one holder, so mine ended. A shared
            // key has several: a grant to someone else says nothing, unless it was a handoff
            // (some hold ended: maybe mine).
            Event::Acquired | Event::Handoff if !ours && !self.hold.shared() => LossReason::Taken {
                owner: message.owner.clone(),
                token: message.token,
            },
            Event::Handoff if !ours => return Heard::Resync,
            _ => return Heard::Done,
        };
        // A claim: reported once the state read shows the hold gone.
        lock(&self.claim).get_or_insert(reason);
        Heard::Resync
    }

    fn resync(&self, key: &str, state: &KeyState, _again: bool) {
        let claim = lock(&self.claim).take();
        let Some(mine) = self.token_of(key) else {
            return;
        };
        if !state.holders.iter().any(|h| h.token == mine) {
            self.report(claim.unwrap_or(LossReason::NotHeld));
        }
    }

    fn disconnected(&self, error: &Arc<Error>) {
        self.report(LossReason::FeedDisconnected(Arc::clone(error)));
    }

    fn deadline(&self) -> Option<Instant> {
        match self.reported.load(Ordering::Relaxed) {
            true => None,
            false => self.hold.local_deadline(),
        }
    }

    fn deadline_passed(&self) {
        self.report(LossReason::Expired);
    }
}

/// Who leads an election, as its observer knows it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Leader {
    /// What the leader published about itself (its lock's owner).
    pub value: String,
    /// Its term: the fencing token of its hold. Larger for every later leader.
    pub term: u64,
}

/// A change of an election's leadership, as [`Election::observe`](crate::Election::observe)
/// reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// The leader from now on, or `None`: no one leads.
    pub leader: Option<Leader>,
    /// True when the change was learned by reading the state again (`LOCK.INFO`) after a
    /// reconnect or a gap in the feed, not from a feed message: changes in between may have
    /// been missed (a term that began and ended while the observer could not see).
    pub resync: bool,
}

/// An observer's picture of an election: the leader it last reported, and where its changes go.
pub(crate) struct Picture<F: Fn(Change) + Send + Sync + 'static> {
    /// The leader last reported; `None` before the first report.
    known: Mutex<Option<Option<Leader>>>,
    /// The leader a message claimed, until the state read confirms it (or not).
    claim: Mutex<Option<Option<Leader>>>,
    /// Where changes go.
    tell: F,
}

impl<F: Fn(Change) + Send + Sync + 'static> Picture<F> {
    pub(crate) fn new(tell: F) -> Picture<F> {
        Picture {
            known: Mutex::new(None),
            claim: Mutex::new(None),
            tell,
        }
    }

    /// Report `leader` unless it is what was reported last.
    fn set(&self, leader: Option<Leader>, resync: bool) {
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        let first = known.is_none();
        if known.as_ref() == Some(&leader) {
            return;
        }
        *known = Some(leader.clone());
        drop(known);
        (self.tell)(Change {
            leader,
            resync: resync && !first,
        });
    }

    fn current_term(&self) -> Option<u64> {
        let known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        known.as_ref().and_then(|l| l.as_ref().map(|l| l.term))
    }
}

impl<F: Fn(Change) + Send + Sync + 'static> Listener for Picture<F> {
    fn message(&self, _key: &str, message: &Message) -> Heard {
        if self
            .known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none()
        {
            // Before the first state is read, a message alone is not a picture.
            return Heard::Resync;
        }
        let claimed = match &message.event {
            Event::Acquired | Event::Handoff => Some(Leader {
                value: message.owner.clone(),
                term: message.token,
            }),
            Event::Released | Event::Expired | Event::Lost => {
                match self.current_term() == Some(message.token) {
                    true => None,
                    // About a hold the picture does not have: read the state again.
                    false => return Heard::Resync,
                }
            }
            event if event.removes_key() => None,
            _ => return Heard::Done,
        };
        let known = lock(&self.known).clone();
        if known.as_ref() == Some(&claimed) {
            return Heard::Done;
        }
        // A claim: reported once the state read shows it (or what the state shows instead).
        lock(&self.claim).get_or_insert(claimed);
        Heard::Resync
    }

    fn resync(&self, _key: &str, state: &KeyState, again: bool) {
        let leader = state.exclusive_holder().map(|h| Leader {
            value: h.owner.clone(),
            term: h.token,
        });
        let confirmed = lock(&self.claim).take().as_ref() == Some(&leader);
        self.set(leader, again && !confirmed);
    }

    fn disconnected(&self, _error: &Arc<Error>) {}
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How often an idle feed connection is pinged, and how long it may stay silent after a ping
/// before it counts as lost (a network that drops packets gives no error of its own).
pub(crate) const PING_EVERY: Duration = Duration::from_millis(1000);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_parse_with_an_owner_that_has_spaces() {
        let m = Message::parse(b"7 handoff 3678192830795776 9000 worker b:1").unwrap();
        assert_eq!(m.seq, 7);
        assert_eq!(m.event, Event::Handoff);
        assert_eq!(m.token, 3678192830795776);
        assert_eq!(m.ttl_ms, 9000);
        assert_eq!(m.owner, "worker b:1");
        let m = Message::parse(b"8 deleted 0 0 ").unwrap();
        assert_eq!(
            (m.event, m.token, m.owner.as_str()),
            (Event::Deleted, 0, "")
        );
        let m = Message::parse(b"9 flushed 0 0").unwrap();
        assert_eq!(m.owner, "");
        assert_eq!(Message::parse(b"x acquired 1 2 a"), None);
        assert_eq!(
            Message::parse(b"3 lockdelay 0 5 ").unwrap().event,
            Event::Other("lockdelay".into())
        );
    }

    /// Every loss is the first one reported (a guard keeps the first): record them all.
    struct Told(Mutex<Vec<String>>);

    impl Report for Told {
        fn report(&self, reason: LossReason) {
            self.0.lock().unwrap().push(format!("{reason:?}"));
        }
    }

    /// A guard's listener on `key` held as `target` with token 5: what it answers `message`,
    /// what it reports at once, and what it reports after a state read that shows `holders`.
    fn heard(
        target: crate::hold::Target,
        message: &str,
        holders: &[u64],
    ) -> (Heard, Vec<String>, Vec<String>) {
        use crate::hold::{Acquisition, Settled};
        let acquisition = Acquisition::new(target, &None, Duration::from_secs(9), None, None);
        let Settled::Granted(hold) = acquisition.unwrap().settle(Ok(Some(vec![5]))) else {
            panic!("granted");
        };
        let told = Arc::new(Told(Mutex::new(Vec::new())));
        let watch = HoldWatch::new(Arc::new(hold), Arc::clone(&told) as Arc<dyn Report>);
        let heard = watch.message("k", &Message::parse(message.as_bytes()).unwrap());
        let at_once = told.0.lock().unwrap().clone();
        let state = KeyState {
            holders: holders
                .iter()
                .map(|t| Holder {
                    owner: "x".into(),
                    token: *t,
                })
                .collect(),
            shared: false,
            seq: Some(2),
        };
        watch.resync("k", &state, true);
        let after = told.0.lock().unwrap().clone();
        (heard, at_once, after)
    }

    #[test]
    fn a_guard_reports_its_own_losses_once_the_state_shows_them() {
        use crate::command::Mode;
        use crate::hold::Target;
        let alone = || Target::exclusive("k");
        let permit = || Target::One {
            key: "k".into(),
            mode: Mode::Shared { limit: Some(3) },
        };
        let said = |reasons: &[&str]| reasons.iter().map(|r| r.to_string()).collect::<Vec<_>>();
        for (target, message, reasons) in [
            (alone(), "2 released 5 0 me", said(&["Released"])),
            (alone(), "2 expired 5 0 me", said(&["Expired"])),
            (alone(), "2 lost 5 0 me", said(&["SessionEnded"])),
            (alone(), "2 deleted 0 0 ", said(&["Deleted"])),
            (alone(), "2 flushed 0 0 ", said(&["Flushed"])),
            (alone(), "2 swapped 0 0 ", said(&["Swapped"])),
            (alone(), "2 demoted 0 0 ", said(&["Demoted"])),
            (
                alone(),
                "2 handoff 6 100 you",
                said(&["Taken { owner: \"you\", token: 6 }"]),
            ),
            (
                alone(),
                "2 acquired 6 100 you",
                said(&["Taken { owner: \"you\", token: 6 }"]),
            ),
            (permit(), "2 expired 5 0 me", said(&["Expired"])),
            (permit(), "2 deleted 0 0 ", said(&["Deleted"])),
            // A handoff on a shared key: some hold ended, maybe mine: read the key again.
            (permit(), "2 handoff 6 100 you", said(&["NotHeld"])),
        ] {
            // A claim: nothing reported until the state read; then the message's reason if
            // the state no longer shows the hold, and nothing if it does (a forged message).
            assert_eq!(
                heard(target.clone(), message, &[6]),
                (Heard::Resync, said(&[]), reasons),
                "{message}"
            );
            assert_eq!(
                heard(target, message, &[5]),
                (Heard::Resync, said(&[]), said(&[])),
                "{message}, still held"
            );
        }
        for (target, message) in [
            (alone(), "2 extended 5 100 me"),
            (alone(), "2 delayed 5 100 me"),
            // Someone else's hold on a shared key: not mine.
            (permit(), "2 acquired 6 100 you"),
            (permit(), "2 released 6 0 you"),
            (permit(), "2 expired 6 0 you"),
        ] {
            assert_eq!(
                heard(target, message, &[5]),
                (Heard::Done, said(&[]), said(&[])),
                "{message}"
            );
        }
    }

    #[test]
    fn an_observer_reports_what_the_state_confirms() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let to = Arc::clone(&seen);
        let picture = Picture::new(move |c| to.lock().unwrap().push(c));
        let msg = |seq, event: &str, token, owner: &str| {
            Message::parse(format!("{seq} {event} {token} 100 {owner}").as_bytes()).unwrap()
        };
        let state = |holder: Option<(&str, u64)>| KeyState {
            holders: holder
                .map(|(owner, token)| Holder {
                    owner: owner.into(),
                    token,
                })
                .into_iter()
                .collect(),
            shared: false,
            seq: Some(1),
        };
        // Before the first state is read, a message alone is not a picture.
        assert_eq!(
            picture.message("k", &msg(1, "acquired", 5, "a")),
            Heard::Resync
        );
        picture.resync("k", &state(None), false);
        // Each change a message claims is read, and reported as the state shows it.
        assert_eq!(
            picture.message("k", &msg(2, "acquired", 5, "a")),
            Heard::Resync
        );
        picture.resync("k", &state(Some(("a", 5))), true);
        assert_eq!(
            picture.message("k", &msg(3, "extended", 5, "a")),
            Heard::Done
        );
        // A forged grant: the state still shows a, nothing is reported.
        assert_eq!(
            picture.message("k", &msg(4, "handoff", 66, "mallory")),
            Heard::Resync
        );
        picture.resync("k", &state(Some(("a", 5))), true);
        // A forged release of a: the same.
        assert_eq!(
            picture.message("k", &msg(4, "released", 5, "a")),
            Heard::Resync
        );
        picture.resync("k", &state(Some(("a", 5))), true);
        // A real handoff.
        assert_eq!(
            picture.message("k", &msg(4, "handoff", 6, "b")),
            Heard::Resync
        );
        picture.resync("k", &state(Some(("b", 6))), true);
        // The state moved past what the message said: what it shows, marked as a resync.
        assert_eq!(
            picture.message("k", &msg(5, "deleted", 0, "")),
            Heard::Resync
        );
        picture.resync("k", &state(Some(("c", 9))), true);
        // A gap: read again, nothing new.
        picture.resync("k", &state(Some(("c", 9))), true);
        let leader = |value: &str, term| {
            Some(Leader {
                value: value.into(),
                term,
            })
        };
        let got: Vec<Change> = seen.lock().unwrap().clone();
        let change = |leader, resync| Change { leader, resync };
        let want = vec![
            change(None, false),
            change(leader("a", 5), false),
            change(leader("b", 6), false),
            change(leader("c", 9), true),
        ];
        assert_eq!(got, want);
    }
}
