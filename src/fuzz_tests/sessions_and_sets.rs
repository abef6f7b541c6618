//! The lock state machine with everything the newest layer added, against a model of plain
//! fields: sessions (open, keepalive, close, expiry, loss of a bound connection), lock-delay
//! (a plain hold's own, and a session's on an unclean end), shared holds with and without a
//! limit, multi-key sets (`LOCK.MACQUIRE`'s all-or-none decision), and a bound session's grace
//! (detached by its connection's loss, rescued by an attach, never kept past the grace by a
//! keepalive).
//!
//! The system under test is driven as the command handlers drive it: `decide_acquire` /
//! `decide_macquire`, then a grant ([`Lock::prune`] at `now` and [`Lock::admit`], as
//! `LockKey::grant` does), a retry's [`Lock::set_deadline`], a release's [`Lock::discard`] and
//! prune, a session's end through [`Lock::end_session_hold`] for every hold its [`Sessions`]
//! entry recorded, and Redis expiring a key at [`Lock::key_deadline`]. The model knows none of
//! that code: each key is a list of `(owner, token, deadline, session, delay)` and a mode, and
//! the documented rules (docs/commands.md) decide.
//!
//! Checked after every step, for every key: the decision of every owner in every mode, alone
//! and in each live session; who holds (live) and who occupies (live or in lock-delay); which
//! tokens pass the fence; the largest live token; when a lock-delay ends; that an exclusive key
//! has at most one occupant and a semaphore at most its limit; and that no hold is left in a
//! session that ended.

use std::collections::BTreeMap;

use super::*;
use crate::lock::session::{Serial, Session, Sessions};
use crate::lock::{decide_macquire, Conflict, KeyGrant, KeyState, MultiAcquire, NO_DEADLINE};

mod model;

use model::{MHold, MKey, MSession};

const RUNS: usize = 250;
const STEPS: usize = 70;
const KEYS: usize = 3;
const OWNERS: &[&[u8]] = &[b"a", b"b", b"c"];
/// The modes a caller may ask for: alone, shared without a limit, a semaphore of 2.
const MODES: &[Mode] = &[
    Mode::Exclusive,
    Mode::Shared { limit: None },
    Mode::Shared { limit: Some(2) },
];

struct World {
    locks: Vec<Option<Lock>>,
    sessions: Sessions,
    mint: TokenMint,
    model: Vec<MKey>,
    msessions: BTreeMap<Serial, MSession>,
    /// Every token granted, and the serials of every session that ended.
    tokens: Vec<u64>,
    ended: Vec<Serial>,
    next_serial: Serial,
    now: Millis,
}

fn key_name(k: usize) -> Vec<u8> {
    format!("k{k}").into_bytes()
}

impl World {
    fn new(now: Millis) -> World {
        World {
            locks: vec![None; KEYS],
            sessions: Sessions::default(),
            mint: TokenMint::new(),
            model: vec![MKey::default(); KEYS],
            msessions: BTreeMap::new(),
            tokens: Vec::new(),
            ended: Vec::new(),
            next_serial: 1,
            now,
        }
    }

    /// `SESSION id` resolved as the command does it: the session's serial and lock-delay, or
    /// "no such session". The model: a session is usable from its open to its end.
    fn resolve(&self, serial: Serial) -> Option<(Serial, Millis)> {
        let real = self.sessions.get(serial).map(|s| (s.serial, s.lock_delay));
        let model = self.msessions.get(&serial).map(|s| (serial, s.lock_delay));
        assert_eq!(real, model, "session {serial} resolves");
        real
    }

    /// The hold's deadline as the commands compute it: ttl 0 in a session is no deadline.
    fn deadline(&self, ttl: Millis, serial: Serial) -> Millis {
        match ttl {
            0 if serial != 0 => NO_DEADLINE,
            _ => self.now + ttl,
        }
    }

    fn mint(&mut self) -> u64 {
        let token = self.mint.next(self.now);
        assert!(
            self.tokens.last().is_none_or(|t| token > *t),
            "tokens increase"
        );
        self.tokens.push(token);
        token
    }

    /// Store a new hold on key `k` in both.
    fn grant(
        &mut self,
        k: usize,
        owner: &[u8],
        mode: Mode,
        ttl: Millis,
        serial: Serial,
        delay: Millis,
    ) -> u64 {
        let (now, deadline) = (self.now, self.deadline(ttl, serial));
        let token = self.mint();
        let hold = Hold {
            owner: owner.into(),
            token,
            deadline,
            granted_at: now,
            session: serial,
            delay,
        };
        match &mut self.locks[k] {
            Some(lock) => {
                lock.prune(now);
                lock.admit(mode, hold);
            }
            None => self.locks[k] = Some(Lock::new(mode, hold)),
        }
        if serial != 0 {
            assert!(self
                .sessions
                .add_hold(serial, (0, key_name(k), owner.to_vec())));
        }
        let mhold = MHold {
            owner: owner.to_vec(),
            token,
            deadline,
            session: serial,
            delay,
        };
        self.model[k].grant(mode, mhold, now);
        token
    }

    /// A retry: the same token, the deadline moves.
    fn retry(&mut self, k: usize, owner: &[u8], token: u64, ttl: Millis, serial: Serial) {
        let (now, deadline) = (self.now, self.deadline(ttl, serial));
        let lock = self.locks[k].as_mut().expect("retry on a missing key");
        assert!(
            lock.set_deadline(owner, deadline, now),
            "retry without a live hold"
        );
        let h = self.model[k]
            .holds
            .iter_mut()
            .find(|h| h.owner == owner && now < h.deadline)
            .expect("model: retry without a live hold");
        assert_eq!(h.token, token, "a retry keeps the token");
        h.deadline = deadline;
    }

    /// `LOCK.ACQUIRE k owner ttl [mode] [SESSION] [LOCKDELAY]`, without BLOCK.
    fn acquire(
        &mut self,
        k: usize,
        owner: &[u8],
        mode: Mode,
        ttl: Millis,
        session: Option<Serial>,
        delay: Millis,
    ) {
        let (serial, delay) = match session {
            Some(serial) => match self.resolve(serial) {
                Some(found) => found,
                None => return, // "no such session": nothing changes
            },
            None => (0, delay),
        };
        if ttl == 0 && serial == 0 {
            return; // refused by the parser
        }
        let now = self.now;
        let got = decide_acquire(self.locks[k].as_ref(), owner, mode, serial, now, false);
        assert_eq!(
            got,
            self.model[k].decide(owner, mode, serial, now),
            "acquire decision"
        );
        match got {
            Ok(Acquire::Grant) => {
                self.grant(k, owner, mode, ttl, serial, delay);
            }
            Ok(Acquire::Retry { token }) => self.retry(k, owner, token, ttl, serial),
            _ => {}
        }
    }

    /// `LOCK.MACQUIRE n k... owner ttl [SESSION]`: every key or none, exclusive, no lock-delay
    /// of its own (a session's on an unclean end).
    fn macquire(&mut self, keys: &[usize], owner: &[u8], ttl: Millis, session: Option<Serial>) {
        let (serial, delay) = match session {
            Some(serial) => match self.resolve(serial) {
                Some(found) => found,
                None => return,
            },
            None => (0, 0),
        };
        if ttl == 0 && serial == 0 {
            return;
        }
        let now = self.now;
        let states: Vec<KeyState> = keys
            .iter()
            .map(|k| KeyState {
                lock: self.locks[*k].as_ref(),
                ahead: false,
            })
            .collect();
        let got = decide_macquire(&states, owner, serial, now);
        // The model: each key decided alone; the first key (in argument order) whose decision
        // is an error makes the whole call that error; a grant needs every key granted or
        // retried.
        let each: Vec<Result<Acquire, Conflict>> = keys
            .iter()
            .map(|k| self.model[*k].decide(owner, Mode::Exclusive, serial, now))
            .collect();
        let want = match each.iter().position(Result::is_err) {
            Some(i) => Err((i, *each[i].as_ref().unwrap_err())),
            None if each.iter().all(|d| !matches!(d, Ok(Acquire::Busy))) => {
                Ok(MultiAcquire::Grant(
                    each.iter()
                        .map(|d| match d {
                            Ok(Acquire::Retry { token }) => KeyGrant::Retry { token: *token },
                            _ => KeyGrant::New,
                        })
                        .collect(),
                ))
            }
            None => Ok(MultiAcquire::Busy),
        };
        assert_eq!(got, want, "macquire decision for keys {keys:?}");
        if let Ok(MultiAcquire::Grant(grants)) = got {
            for (k, grant) in keys.iter().zip(grants) {
                match grant {
                    KeyGrant::New => {
                        self.grant(*k, owner, Mode::Exclusive, ttl, serial, delay);
                    }
                    KeyGrant::Retry { token } => self.retry(*k, owner, token, ttl, serial),
                }
            }
        }
    }

    /// `LOCK.RELEASE k owner`: 1 when the owner held it live (its hold, and its lock-delay, go).
    fn release(&mut self, k: usize, owner: &[u8]) {
        let now = self.now;
        let held = held_by(self.locks[k].as_ref(), owner, now);
        let m = &mut self.model[k];
        assert_eq!(held, m.live(now).any(|h| h.owner == owner), "release: held");
        if !held {
            return;
        }
        let lock = self.locks[k].as_mut().unwrap();
        let session = lock.discard(owner).expect("held but not stored");
        lock.prune(now);
        if session != 0 {
            self.sessions
                .remove_hold(session, &(0, key_name(k), owner.to_vec()));
        }
        if lock.is_empty() {
            self.locks[k] = None;
        }
        let at = m.holds.iter().position(|h| h.owner == owner).unwrap();
        assert_eq!(m.holds.remove(at).session, session);
        m.prune(now);
    }

    /// `LOCK.EXTEND k owner ttl`: only a live holder; the token stays.
    fn extend(&mut self, k: usize, owner: &[u8], ttl: Millis) {
        let now = self.now;
        let held = held_by(self.locks[k].as_ref(), owner, now);
        assert_eq!(
            held,
            self.model[k].live(now).any(|h| h.owner == owner),
            "extend: held"
        );
        if held {
            let token = self.model[k]
                .live(now)
                .find(|h| h.owner == owner)
                .unwrap()
                .token;
            self.retry(k, owner, token, ttl, 0);
        }
    }

    /// Redis expires a key whose every hold freed its place.
    fn expire_keys(&mut self) {
        let now = self.now;
        for k in 0..KEYS {
            let due = self.locks[k]
                .as_ref()
                .is_some_and(|l| l.key_deadline().is_some_and(|d| d <= now));
            let m = &self.model[k];
            let model_due = !m.holds.is_empty() && m.holds.iter().all(|h| h.frees_at() <= now);
            assert_eq!(due, model_due, "key {k} due to expire");
            if due {
                self.locks[k] = None;
                self.model[k].holds.clear();
            }
        }
    }

    fn open(&mut self, ttl: Millis, lock_delay: Millis, grace: Millis) {
        let serial = self.next_serial;
        self.next_serial += 1;
        self.sessions.insert(Session {
            id: crate::lock::session::make_id("t", u128::from(serial)),
            serial,
            ttl,
            deadline: self.now + ttl,
            lock_delay,
            bound: grace > 0,
            // Its connection: one per session, numbered as the session.
            client: (grace > 0).then_some(serial),
            grace,
            detached: None,
            user: b"default".to_vec(),
            holds: Default::default(),
        });
        self.msessions.insert(
            serial,
            MSession {
                deadline: self.now + ttl,
                lock_delay,
                ttl,
                grace,
                detached: None,
            },
        );
    }

    /// The session's connection closes. With a grace it is detached (the documented rule: it
    /// ends at the earlier of its deadline and now + grace, unless attached); without, it ends
    /// now, uncleanly.
    fn lose(&mut self, serial: Serial) {
        let graced = self.msessions.get(&serial).is_some_and(|m| m.grace > 0);
        if !graced {
            return self.end_session(serial, false);
        }
        let now = self.now;
        let unbound = self.sessions.unbind_client(serial);
        let m = self.msessions.get_mut(&serial).unwrap();
        if m.detached.is_some() {
            // No connection to lose: a detached session is bound to none.
            assert!(unbound.is_empty(), "a detached session was still bound");
            return;
        }
        assert_eq!(unbound, vec![serial], "session {serial} was bound");
        let detached = self.sessions.detach(serial, now);
        let end = now + m.grace;
        m.deadline = m.deadline.min(end);
        m.detached = Some(end);
        assert_eq!(detached, Some(m.deadline), "session {serial} detached");
    }

    /// `LOCK.SESSION ATTACH`: a detached session whose deadline has not passed is bound again
    /// and renewed for its ttl; one whose deadline passed is nil (the timer ends it).
    fn attach(&mut self, serial: Serial) {
        let now = self.now;
        let Some(m) = self.msessions.get_mut(&serial) else {
            assert!(self.sessions.get(serial).is_none());
            return;
        };
        let Some(_) = m.detached else {
            return;
        };
        if m.deadline <= now {
            return; // the command answers nil
        }
        m.detached = None;
        m.deadline = now + m.ttl;
        assert_eq!(self.sessions.attach(serial, serial, now), Some(m.deadline));
    }

    fn keepalive(&mut self, serial: Serial, ttl: Millis) {
        let renewed = self.sessions.renew(serial, ttl, self.now + ttl);
        let m = self.msessions.get_mut(&serial);
        assert_eq!(renewed, m.is_some(), "keepalive of {serial}");
        if let Some(m) = m {
            // Never past a detached session's grace.
            m.deadline = (self.now + ttl).min(m.detached.unwrap_or(Millis::MAX));
            m.ttl = ttl;
        }
    }

    /// The session ends at `now`: cleanly (`CLOSE`: its holds go) or not (expiry, a lost
    /// connection: each hold is lost now and keeps its place for the session's lock-delay).
    fn end_session(&mut self, serial: Serial, clean: bool) {
        let now = self.now;
        let Some(session) = self.sessions.remove(serial) else {
            assert!(
                !self.msessions.contains_key(&serial),
                "model has ended {serial}"
            );
            return;
        };
        assert!(self.msessions.remove(&serial).is_some());
        self.ended.push(serial);
        let mut released = 0;
        for (_, key, owner) in &session.holds {
            let k: usize = std::str::from_utf8(&key[1..]).unwrap().parse().unwrap();
            let Some(lock) = self.locks[k].as_mut() else {
                continue;
            };
            if let Some((_, live)) = lock.end_session_hold(owner, serial, now, clean) {
                released += usize::from(live);
                if lock.is_empty() {
                    self.locks[k] = None;
                }
            }
        }
        let mut want = 0;
        for m in &mut self.model {
            let n = m.holds.iter().filter(|h| h.session == serial).count();
            if n == 0 {
                continue;
            }
            // Released (counted by CLOSE, announced): the holds still live at the end; one
            // that expired on its own is only cleaned up.
            want += m.live(now).filter(|h| h.session == serial).count();
            if clean {
                m.holds.retain(|h| h.session != serial);
            } else {
                for h in m.holds.iter_mut().filter(|h| h.session == serial) {
                    h.deadline = h.deadline.min(now);
                    h.session = 0;
                }
            }
            m.prune(now);
        }
        assert_eq!(
            released, want,
            "holds ended with session {serial} (clean: {clean})"
        );
    }

    /// The session expiry timer fires: every session due at `now` ends, uncleanly.
    fn expire_sessions(&mut self) {
        let due = self.sessions.due(self.now);
        let want: Vec<Serial> = self
            .msessions
            .iter()
            .filter(|(_, s)| s.deadline <= self.now)
            .map(|(serial, _)| *serial)
            .collect();
        let mut sorted = due.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, want, "sessions due");
        for serial in due {
            self.end_session(serial, false);
        }
    }
}

type Pairs = Vec<(Vec<u8>, u64)>;

fn sorted(mut v: Pairs) -> Pairs {
    v.sort();
    v
}

impl World {
    /// Every check of the module docs, at `now`.
    fn check(&self) {
        let now = self.now;
        let serials: Vec<Serial> = std::iter::once(0)
            .chain(self.msessions.keys().copied())
            .collect();
        for k in 0..KEYS {
            let (real, m) = (self.locks[k].as_ref(), &self.model[k]);
            assert_eq!(real.is_some(), !m.holds.is_empty(), "key {k} exists");
            for owner in OWNERS {
                for mode in MODES {
                    for serial in &serials {
                        assert_eq!(
                            decide_acquire(real, owner, *mode, *serial, now, false),
                            m.decide(owner, *mode, *serial, now),
                            "key {k}: decision for {} {mode:?} in session {serial}",
                            owner.escape_ascii()
                        );
                    }
                }
            }
            let pairs = |it: &mut dyn Iterator<Item = (Vec<u8>, u64)>| sorted(it.collect());
            let (live, occupying) = match real {
                Some(l) => (
                    pairs(&mut l.live(now).map(|h| (h.owner.to_vec(), h.token))),
                    pairs(&mut l.occupying(now).map(|h| (h.owner.to_vec(), h.token))),
                ),
                None => (vec![], vec![]),
            };
            assert_eq!(
                live,
                pairs(&mut m.live(now).map(|h| (h.owner.clone(), h.token))),
                "key {k}: live holders"
            );
            assert_eq!(
                occupying,
                pairs(&mut m.occupying(now).map(|h| (h.owner.clone(), h.token))),
                "key {k}: holders occupying it (live or in lock-delay)"
            );
            let fenced: Vec<u64> = self
                .tokens
                .iter()
                .copied()
                .filter(|t| real.is_some_and(|l| l.fences(*t, now)))
                .collect();
            let mut want: Vec<u64> = m.live(now).map(|h| h.token).collect();
            want.sort_unstable();
            assert_eq!(fenced, want, "key {k}: tokens passing the fence");
            assert_eq!(real.and_then(|l| l.max_token(now)), want.last().copied());
            let delayed = m
                .holds
                .iter()
                .filter(|h| h.deadline <= now && now < h.frees_at())
                .map(MHold::frees_at)
                .max();
            assert_eq!(
                real.and_then(|l| l.delayed_until(now)),
                delayed,
                "key {k}: end of its lock-delay"
            );
            if let Some(l) = real {
                // Safety, stated on the real value alone.
                let n = l.occupying(now).count() as u64;
                match l.mode() {
                    Mode::Exclusive => assert!(n <= 1, "key {k}: {n} exclusive occupants"),
                    Mode::Shared { limit } => {
                        assert!(
                            limit.is_none_or(|lim| n <= lim),
                            "key {k}: {n} over {limit:?}"
                        )
                    }
                }
                let stale: Vec<Serial> = l
                    .holders()
                    .map(|h| h.session)
                    .filter(|s| self.ended.contains(s))
                    .collect();
                assert!(
                    stale.is_empty(),
                    "key {k}: holds of ended sessions {stale:?}"
                );
            }
        }
        let real: Vec<(Serial, Millis)> = {
            let mut v: Vec<_> = self
                .sessions
                .iter()
                .map(|s| (s.serial, s.deadline))
                .collect();
            v.sort_unstable();
            v
        };
        let model: Vec<(Serial, Millis)> = self
            .msessions
            .iter()
            .map(|(s, m)| (*s, m.deadline))
            .collect();
        assert_eq!(real, model, "sessions and their deadlines");
    }

    /// The next moment: mostly forward a little; sometimes exactly onto (or just before) a
    /// hold's deadline, the end of its lock-delay, or a session's deadline; rarely back.
    fn step_clock(&mut self, rng: &mut StdRng) {
        let mut marks: Vec<Millis> = self
            .model
            .iter()
            .flat_map(|m| m.holds.iter().flat_map(|h| [h.deadline, h.frees_at()]))
            .chain(self.msessions.values().map(|s| s.deadline))
            .filter(|d| *d < NO_DEADLINE)
            .collect();
        marks.sort_unstable();
        self.now = match rng.gen_range(0..12) {
            0 | 1 if !marks.is_empty() => marks[rng.gen_range(0..marks.len())],
            2 if !marks.is_empty() => marks[rng.gen_range(0..marks.len())] - 1,
            3 => self.now - rng.gen_range(0..100),
            4 => self.now,
            _ => self.now + rng.gen_range(0..40),
        };
    }
}

/// A serial to name: a live session most of the time, sometimes one that ended or never was.
fn pick_serial(rng: &mut StdRng, w: &World) -> Serial {
    let live: Vec<Serial> = w.msessions.keys().copied().collect();
    if !live.is_empty() && rng.gen_bool(0.8) {
        live[rng.gen_range(0..live.len())]
    } else {
        rng.gen_range(1..=w.next_serial)
    }
}

const OPS: &str = "0-2 acquire, 3 macquire, 4 release, 5 extend, 6 open, 7 keepalive, \
                   8 close, 9 connection lost, 10 session timer, 11 key expiry, 12 attach";

#[test]
fn sessions_lock_delay_shared_and_sets_match_a_simple_model() {
    cases(
        "sessions_lock_delay_shared_and_sets_match_a_simple_model",
        RUNS,
        |rng| {
            let mut w = World::new(1_700_000_000_000 + rng.gen_range(0..1_000_000));
            let mut log: Vec<String> = Vec::new();
            for _ in 0..STEPS {
                w.step_clock(rng);
                let k = rng.gen_range(0..KEYS);
                let owner = OWNERS[rng.gen_range(0..OWNERS.len())];
                let ttl = match rng.gen_range(0..8) {
                    0 => 0,
                    1 => 1,
                    _ => rng.gen_range(1..150),
                };
                let session = rng.gen_bool(0.4).then(|| pick_serial(rng, &w));
                let op = rng.gen_range(0..13);
                log.push(format!(
                    "t={} op {op} k{k} {} ttl {ttl} session {session:?}",
                    w.now,
                    owner.escape_ascii()
                ));
                let step = panic::catch_unwind(AssertUnwindSafe(|| {
                    let entry = match op {
                        0..=2 => {
                            let mode = MODES[rng.gen_range(0..MODES.len())];
                            let delay = if rng.gen_bool(0.3) {
                                rng.gen_range(1..100)
                            } else {
                                0
                            };
                            w.acquire(k, owner, mode, ttl, session, delay);
                            format!(
                                "acquire k{k} {} {ttl} {mode:?} session {session:?} delay {delay}",
                                owner.escape_ascii()
                            )
                        }
                        3 => {
                            let mut keys: Vec<usize> = (0..KEYS).collect();
                            for i in (1..keys.len()).rev() {
                                keys.swap(i, rng.gen_range(0..=i));
                            }
                            keys.truncate(rng.gen_range(1..=KEYS));
                            w.macquire(&keys, owner, ttl, session);
                            format!(
                                "macquire {keys:?} {} {ttl} session {session:?}",
                                owner.escape_ascii()
                            )
                        }
                        4 => {
                            w.release(k, owner);
                            format!("release k{k} {}", owner.escape_ascii())
                        }
                        5 => {
                            let ttl = ttl.max(1);
                            w.extend(k, owner, ttl);
                            format!("extend k{k} {} {ttl}", owner.escape_ascii())
                        }
                        6 if w.msessions.len() < 3 => {
                            let delay = if rng.gen_bool(0.6) {
                                rng.gen_range(1..100)
                            } else {
                                0
                            };
                            let ttl = ttl.max(1);
                            let grace = match rng.gen_range(0..3) {
                                0 => 0,
                                _ => rng.gen_range(1..=ttl),
                            };
                            w.open(ttl, delay, grace);
                            format!(
                                "open ttl {ttl} lockdelay {delay} grace {grace} -> {}",
                                w.next_serial - 1
                            )
                        }
                        7 => {
                            let serial = pick_serial(rng, &w);
                            w.keepalive(serial, ttl.max(1));
                            format!("keepalive {serial} {}", ttl.max(1))
                        }
                        8 => {
                            let serial = pick_serial(rng, &w);
                            w.end_session(serial, true);
                            format!("close {serial}")
                        }
                        9 => {
                            let serial = pick_serial(rng, &w);
                            w.lose(serial);
                            format!("lose {serial}")
                        }
                        12 => {
                            let serial = pick_serial(rng, &w);
                            w.attach(serial);
                            format!("attach {serial}")
                        }
                        10 => {
                            w.expire_sessions();
                            "session timer".into()
                        }
                        _ => {
                            w.expire_keys();
                            "key expiry".into()
                        }
                    };
                    w.check();
                    entry
                }));
                match step {
                    Ok(entry) => *log.last_mut().unwrap() = format!("t={} {entry}", w.now),
                    Err(payload) => {
                        eprintln!("operations ({OPS}):\n  {}", log.join("\n  "));
                        panic::resume_unwind(payload);
                    }
                }
            }
        },
    );
}
