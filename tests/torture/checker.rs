//! The offline checker: reads a finished [`History`] (and the resources as the server holds
//! them at the end) and reports every violation of what the module promises.
//!
//! Every check is sound against the history alone: it flags only what no correct server could
//! have produced, given that an operation took effect at some instant between its invocation
//! and its completion (or, with an unknown outcome, at any instant after its invocation, or
//! never). The bounds it uses:
//!
//! - A hold is the lifetime of one `(key, token)`. An ok operation on it (grant, retry,
//!   extend, accepted fenced write) proves it live at some instant of that operation. A hold's
//!   life is one interval, so it was live from the *completion* of its first proof to the
//!   *invocation* of its last.
//! - After its last deadline-setting operation `L` (grant, retry or extend with ttl `t`) the
//!   server keeps it until `s + t`, `s` being when the server ran `L`: at least until
//!   `L.invoke + t` (a lower bound of the deadline), at most until `L.complete + t` (an upper
//!   bound), unless it is released or a fault drops it first.
//! - The workload extends with the hold's own ttl, so a hold's deadline only ever moves later.
//!
//! [`TOLERANCE`] absorbs the server's millisecond truncation of its clock.
//!
//! Shared holders (`SHARED [LIMIT n]`) are holds like any other, each with its own token; the
//! checks only they need (a shared and an exclusive hold never overlap, a limited key never
//! has more than `n` holders) are in `shared.rs`, on the same intervals ([`certain_intervals`]).

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::history::{Effect, Entry, Fault, History, Micros, Mode, Op, Outcome, Survival};
use crate::workload::NO_REPLY;

/// How far client-side times may disagree with the server's deadlines: the server truncates
/// its clock to whole milliseconds (so a deadline can fall up to 1 ms before `grant + ttl` in
/// real time), plus 1 ms for the rates of the monotonic and the wall clock.
pub const TOLERANCE: Micros = 2_000;

/// Violations listed per check in the report; the count is always complete.
const SHOWN: usize = 12;

/// What the scenario promises beyond the common checks.
pub struct Expect {
    /// No fault in the scenario loses data: every accepted fenced write must be in the final
    /// resource list.
    pub durable: bool,
}

/// One check's result.
#[derive(Clone, Debug)]
pub struct Check {
    pub name: String,
    /// The pass criterion, as the report prints it.
    pub criterion: String,
    /// How many cases were examined.
    pub checked: u64,
    pub violations: Vec<String>,
}

impl Check {
    pub fn new(name: &str, criterion: &str) -> Check {
        Check {
            name: name.to_string(),
            criterion: criterion.to_string(),
            checked: 0,
            violations: Vec::new(),
        }
    }

    fn violation(&mut self, detail: String) {
        self.violations.push(detail);
    }
}

/// Held locks expected and found after one fault.
#[derive(Clone, Debug)]
pub struct Kept {
    pub fault: String,
    pub survival: Survival,
    pub expected: u64,
    pub kept: u64,
}

#[derive(Clone, Debug)]
pub struct Verdict {
    pub checks: Vec<Check>,
    /// Accepted fenced writes that read the same state as another while both were open.
    pub lost_fenced: u64,
    /// The same for the unfenced counter.
    pub lost_unfenced: u64,
    /// Fenced writes the script refused: it answered 0, the token was not the live one.
    pub refused: u64,
    /// Distinct holds (key, token) granted.
    pub holds: usize,
    pub kept: Vec<Kept>,
}

impl Verdict {
    pub fn violations(&self) -> usize {
        self.checks.iter().map(|c| c.violations.len()).sum()
    }
}

/// One `(key, token)`: who got it and every operation on it.
pub struct Hold<'h> {
    pub key: &'h str,
    pub token: i64,
    pub owner: &'h str,
    /// The mode its grant asked for.
    pub mode: Mode,
    /// Ok operations proving it live: grants and retries, extends, accepted fenced writes and
    /// reads.
    pub proofs: Vec<&'h Entry>,
    /// `LOCK.RELEASE` calls on it, whatever their outcome.
    releases: Vec<&'h Entry>,
    /// Ok `WAIT`s after its grant.
    waits: Vec<&'h Entry>,
}

impl Hold<'_> {
    /// Completion of the first proof: live from here on (at the latest).
    fn start(&self) -> Micros {
        self.proofs
            .iter()
            .map(|e| e.complete)
            .min()
            .unwrap_or(Micros::MAX)
    }

    /// The last deadline-setting proof completed before `before` (by `invoke + ttl`), with
    /// its lower bound of the deadline.
    fn deadline_floor(&self, before: Micros) -> Option<(&Entry, Micros)> {
        self.proofs
            .iter()
            .filter(|e| e.complete < before)
            .filter_map(|e| e.op.ttl().map(|ttl| (*e, e.invoke + ttl * 1000)))
            .max_by_key(|(_, floor)| *floor)
    }

    pub fn describe(&self) -> String {
        let mut out = format!(
            "hold {} token {} owner {}{}:",
            self.key, self.token, self.owner, self.mode
        );
        for e in self.proofs.iter().chain(&self.releases).take(8) {
            out.push_str(&format!("\n      {e}"));
        }
        out
    }
}

/// One key's ok acquires ordered by completion, and the running maximum (token, entry) up to
/// each position.
type Grants<'h> = (Vec<&'h Entry>, Vec<(i64, &'h Entry)>);

/// Lookups over the history shared by the checks.
pub struct Index<'h> {
    pub holds: Vec<Hold<'h>>,
    by_token: HashMap<(&'h str, i64), usize>,
    grants: HashMap<&'h str, Grants<'h>>,
    /// Violations of "one token, one owner" found while building.
    owner_clashes: Vec<String>,
}

impl<'h> Index<'h> {
    pub fn new(h: &'h History) -> Index<'h> {
        let mut index = Index {
            holds: Vec::new(),
            by_token: HashMap::new(),
            grants: HashMap::new(),
            owner_clashes: Vec::new(),
        };
        // Grants first, so every later operation finds its hold.
        for e in h.entries.iter().filter(|e| e.op.is_acquire()) {
            let (Outcome::Ok, Some(token)) = (e.outcome, e.token) else {
                continue;
            };
            let key = e.key.as_str();
            match index.by_token.get(&(key, token)) {
                Some(&i) if index.holds[i].owner != e.owner => {
                    let first = index.holds[i].proofs[0];
                    index.owner_clashes.push(format!(
                        "token {token} on {key} granted to two owners:\n      {first}\n      {e}"
                    ));
                }
                Some(&i) => index.holds[i].proofs.push(e),
                None => {
                    index.by_token.insert((key, token), index.holds.len());
                    index.holds.push(Hold {
                        key,
                        token,
                        owner: &e.owner,
                        mode: e.op.mode().unwrap_or(Mode::Exclusive),
                        proofs: vec![e],
                        releases: Vec::new(),
                        waits: Vec::new(),
                    });
                }
            }
            index.grants.entry(key).or_default().0.push(e);
        }
        for e in &h.entries {
            let Some(token) = e.token else { continue };
            let Some(&i) = index.by_token.get(&(e.key.as_str(), token)) else {
                continue;
            };
            let hold = &mut index.holds[i];
            if hold.owner != e.owner {
                continue;
            }
            match (&e.op, e.outcome) {
                (Op::Extend { .. } | Op::FencedWrite { .. } | Op::FencedRead, Outcome::Ok) => {
                    hold.proofs.push(e)
                }
                (Op::Release, _) => hold.releases.push(e),
                (Op::Wait, Outcome::Ok) => hold.waits.push(e),
                _ => {}
            }
        }
        for (ordered, running) in index.grants.values_mut() {
            ordered.sort_by_key(|e| e.complete);
            let mut best: Option<(i64, &Entry)> = None;
            for e in ordered.iter() {
                let token = e.token.unwrap_or(0);
                if best.is_none_or(|(t, _)| token > t) {
                    best = Some((token, e));
                }
                running.push(best.expect("set above"));
            }
        }
        index
    }

    fn hold(&self, key: &str, token: i64) -> Option<&Hold<'h>> {
        self.by_token.get(&(key, token)).map(|&i| &self.holds[i])
    }

    /// The largest token granted on `key` by an acquire that completed before `time`.
    fn max_granted_before(&self, key: &str, time: Micros) -> Option<(i64, &'h Entry)> {
        let (ordered, running) = self.grants.get(key)?;
        let n = ordered.partition_point(|e| e.complete < time);
        (n > 0).then(|| running[n - 1])
    }
}

/// Run every check over `h`. `lists` holds each lock key's fenced resource as the server had
/// it at the end.
pub fn check(h: &History, lists: &BTreeMap<String, Vec<String>>, expect: &Expect) -> Verdict {
    let index = Index::new(h);
    let mut checks = vec![
        calls_answered(h),
        token_owner(&index),
        grant_order(h, &index),
        exclusive_holds(h, &index),
        token_epochs(h, &index),
        stale_fenced_writes(h, &index),
        multi_all_or_nothing(h),
    ];
    checks.extend(crate::shared::checks(h, &index));
    let (lost_fenced_check, lost_fenced) = lost_updates(h, true);
    let (_, lost_unfenced) = lost_updates(h, false);
    checks.push(lost_fenced_check);
    checks.push(resource_order(lists));
    checks.push(resource_matches_history(h, lists, expect));
    let (survival_checks, kept) = survival(h, &index);
    checks.extend(survival_checks);
    for (name, tally) in &h.tallies {
        checks.push(Check {
            name: name.clone(),
            criterion: tally.criterion.clone(),
            checked: tally.passed + tally.violations.len() as u64,
            violations: tally.violations.clone(),
        });
    }
    let refused = h
        .entries
        .iter()
        .filter(|e| matches!(e.op, Op::FencedWrite { .. }) && e.reply == "0")
        .count() as u64;
    Verdict {
        checks,
        lost_fenced,
        lost_unfenced,
        refused,
        holds: index.holds.len(),
        kept,
    }
}

/// Pass: the server answers every call within the wait the call asked for (`BLOCK` timeout,
/// `WAIT` timeout) plus 2 s. A call may go unanswered only because its connection broke (the
/// server was killed, the client was killed) or because the client itself gave up early; a
/// client-side timeout on a live connection means the server never replied: the caller would
/// have hung forever.
fn calls_answered(h: &History) -> Check {
    let mut c = Check::new(
        "calls-answered",
        "every call is answered within its own wait (BLOCK, WAIT) + 2 s on a live connection",
    );
    for e in &h.entries {
        c.checked += 1;
        if e.reply.starts_with(NO_REPLY) {
            c.violation(format!("no reply:\n      {e}"));
        }
    }
    c
}

/// Pass: every `LOCK.MACQUIRE` (owners ending in `MULTI_SUFFIX`) got all of its keys or none:
/// its entries (one per key, same owner and invocation) share one outcome, a grant has a token
/// for every key, a refusal is nil or an error, and the `LOCK.MRELEASE` the client sends after
/// a nil reply releases nothing (a partial grant behind a nil would show there).
fn multi_all_or_nothing(h: &History) -> Check {
    use crate::workload::MULTI_SUFFIX;
    let mut c = Check::new(
        "multi-all-or-nothing",
        "each LOCK.MACQUIRE grants every key or none; a refused one holds nothing",
    );
    let mut sets: BTreeMap<(&str, Micros), Vec<&Entry>> = BTreeMap::new();
    for e in &h.entries {
        if !e.owner.ends_with(MULTI_SUFFIX) {
            continue;
        }
        match (&e.op, e.token) {
            (Op::Acquire { .. }, _) => sets.entry((&e.owner, e.invoke)).or_default().push(e),
            (Op::Release, None) => {
                c.checked += 1;
                if e.outcome != Outcome::Unknown && e.reply != "0" {
                    c.violation(format!("a refused set still held keys:\n      {e}"));
                }
            }
            _ => {}
        }
    }
    for entries in sets.values() {
        c.checked += 1;
        let first = entries[0];
        let same = entries.iter().all(|e| e.outcome == first.outcome);
        let whole = match first.outcome {
            Outcome::Ok => entries.len() >= 2 && entries.iter().all(|e| e.token.is_some()),
            Outcome::Fail => !first.reply.starts_with("Array"),
            Outcome::Unknown => true,
        };
        if !same || !whole {
            let lines: Vec<String> = entries.iter().map(|e| format!("      {e}")).collect();
            c.violation(format!("a partial set:\n{}", lines.join("\n")));
        }
    }
    c
}

/// Pass: per key, a token is granted to one owner only (a retry by the same owner may get the
/// same token again).
fn token_owner(index: &Index) -> Check {
    let mut c = Check::new("token-owner", "per key, no token is granted to two owners");
    c.checked = index.holds.len() as u64;
    for clash in &index.owner_clashes {
        c.violation(clash.clone());
    }
    c
}

/// Pass: per key, for any two grants G1, G2 where G1 completed before G2 was invoked, G1's
/// token <= G2's (equal only for a retry by the same owner: the token-owner check). This is
/// the real-time order of grants, across every fault: completion order alone would be wrong
/// for concurrent grants (a hold of 1 ms can expire and be handed over before the first
/// grant's reply is read). Shared grants included: tokens on a key only grow, whatever the
/// mode. A shared retry answers the token its owner's first attempt was granted, and other
/// shared holders may have been granted larger ones since, so for it G2's invocation is that
/// first attempt's (an exclusive retry gets its token back only if nobody was granted since).
fn grant_order(h: &History, index: &Index) -> Check {
    let mut c = Check::new(
        "grant-order",
        "per key, a grant that completed before another was invoked has a smaller (or, for the \
         same owner's retry, the same) token",
    );
    let mut first_attempt: HashMap<(&str, &str), Micros> = HashMap::new();
    for e in h.entries.iter().filter(|e| e.op.is_acquire()) {
        let t = first_attempt
            .entry((e.key.as_str(), e.owner.as_str()))
            .or_insert(e.invoke);
        *t = (*t).min(e.invoke);
    }
    for e in h.entries.iter().filter(|e| e.op.is_acquire()) {
        let (Outcome::Ok, Some(token)) = (e.outcome, e.token) else {
            continue;
        };
        c.checked += 1;
        let since = match e.op.mode() {
            Some(Mode::Shared { .. }) => first_attempt[&(e.key.as_str(), e.owner.as_str())],
            _ => e.invoke,
        };
        if let Some((before, by)) = index.max_granted_before(&e.key, since) {
            if before > token {
                c.violation(format!(
                    "token {token} granted after token {before} on {}:\n      {by}\n      {e}",
                    e.key
                ));
            }
        }
    }
    c
}

/// Pass: per key, the intervals in which two different exclusive holds were certainly both
/// live, by the server's own answers, do not overlap by more than [`TOLERANCE`] (an exclusive
/// and a shared hold: `shared-exclusive-holds`; shared holds may overlap).
fn exclusive_holds(h: &History, index: &Index) -> Check {
    let mut c = Check::new(
        "exclusive-holds",
        "per key, no two exclusive holds were live at once: [grant completion, min(release \
         invocation, grant invocation + ttl, fault)] intervals overlap by at most 2 ms",
    );
    let mut per_key = certain_intervals(h, index);
    for intervals in per_key.values_mut() {
        intervals.retain(|&(_, _, i)| index.holds[i].mode == Mode::Exclusive);
        c.checked += intervals.len() as u64;
        let mut widest: Option<(Micros, usize)> = None;
        for &(start, end, i) in intervals.iter() {
            if let Some((until, j)) = widest {
                if start < until - TOLERANCE {
                    c.violation(format!(
                        "two holds live at once for {:.3} ms:\n    {}\n    {}",
                        (until.min(end) - start) as f64 / 1000.0,
                        index.holds[j].describe(),
                        index.holds[i].describe()
                    ));
                }
            }
            if widest.is_none_or(|(until, _)| end > until) {
                widest = Some((end, i));
            }
        }
    }
    c
}

/// Per key, the `(start, end, index in Index::holds)` of every hold that was certainly live
/// for a while, sorted by start.
///
/// A hold is certainly live from its first proof's completion to the later of its last
/// proof's invocation and its tail: `L.invoke + ttl` (a lower bound of its deadline), cut at
/// the invocation of its first release (whatever the outcome) and of any fault that may drop
/// holds (flush, restart without fsync, failover, eviction...) and could have run after `L`.
pub fn certain_intervals<'h>(
    h: &'h History,
    index: &Index<'h>,
) -> HashMap<&'h str, Vec<(Micros, Micros, usize)>> {
    let mut per_key: HashMap<&str, Vec<(Micros, Micros, usize)>> = HashMap::new();
    for (i, hold) in index.holds.iter().enumerate() {
        let start = hold.start();
        let last_proof = hold.proofs.iter().map(|e| e.invoke).max().unwrap_or(start);
        let mut tail = Micros::MIN;
        if let Some((last, floor)) = hold.deadline_floor(Micros::MAX) {
            tail = floor;
            for r in &hold.releases {
                tail = tail.min(r.invoke);
            }
            for f in cutting_faults(h, hold.key, last.invoke) {
                tail = tail.min(f.invoke);
            }
        }
        let end = last_proof.max(tail);
        if end > start {
            per_key.entry(hold.key).or_default().push((start, end, i));
        }
    }
    for intervals in per_key.values_mut() {
        intervals.sort();
    }
    per_key
}

/// Faults that may have dropped `key`'s holds after an operation invoked at `after` ran.
fn cutting_faults<'h>(
    h: &'h History,
    key: &'h str,
    after: Micros,
) -> impl Iterator<Item = &'h Fault> {
    h.faults
        .iter()
        .filter(move |f| f.effect != Effect::Keeps && f.covers(key) && f.complete > after)
}

/// Pass: for every server-side fault F, every grant to an owner whose first attempt was
/// invoked after F completed has a token above every token known to exist before F was
/// invoked (granted to a client, read by the nemesis, or in the dead primary's AOF), on any
/// key. That is "tokens never go backwards" across restarts, failovers, flushes, reloads.
fn token_epochs(h: &History, index: &Index) -> Check {
    let mut c = Check::new(
        "token-epochs",
        "after each server fault, new grants' tokens exceed every token seen before it",
    );
    // Every token known, by when it was known.
    let mut known: Vec<(Micros, i64, String)> = h
        .observations
        .iter()
        .map(|o| (o.time, o.token, o.source.clone()))
        .collect();
    for hold in &index.holds {
        for e in hold.proofs.iter().filter(|e| e.op.is_acquire()) {
            known.push((e.complete, hold.token, format!("{e}")));
        }
    }
    known.sort_by_key(|k| k.0);
    let mut running: Vec<usize> = Vec::with_capacity(known.len());
    for (i, k) in known.iter().enumerate() {
        let best = match running.last() {
            Some(&b) if known[b].1 >= k.1 => b,
            _ => i,
        };
        running.push(best);
    }
    // Fresh grants: by the first attempt of their owner on their key.
    let mut first_attempt: HashMap<(&str, &str), Micros> = HashMap::new();
    for e in h.entries.iter().filter(|e| e.op.is_acquire()) {
        let t = first_attempt
            .entry((e.key.as_str(), e.owner.as_str()))
            .or_insert(e.invoke);
        *t = (*t).min(e.invoke);
    }
    let mut fresh: Vec<(Micros, &Entry)> = h
        .entries
        .iter()
        .filter(|e| e.op.is_acquire() && e.outcome == Outcome::Ok && e.token.is_some())
        .map(|e| (first_attempt[&(e.key.as_str(), e.owner.as_str())], e))
        .collect();
    fresh.sort_by_key(|(t, _)| *t);
    for f in h.faults.iter().filter(|f| f.server_side) {
        let n = known.partition_point(|k| k.0 <= f.invoke);
        if n == 0 {
            continue;
        }
        let (_, before, source) = &known[running[n - 1]];
        let from = fresh.partition_point(|(t, _)| *t <= f.complete);
        c.checked += 1;
        let offenders: Vec<&Entry> = fresh[from..]
            .iter()
            .map(|(_, e)| *e)
            .filter(|e| e.token.unwrap_or(0) <= *before)
            .collect();
        if !offenders.is_empty() {
            let mut detail = format!(
                "{} grants after {f}\n    are not above token {before}, known before it from: {source}",
                offenders.len()
            );
            for e in offenders.iter().take(4) {
                detail.push_str(&format!("\n      {e}"));
            }
            c.violation(detail);
        }
    }
    c
}

/// Pass: no fenced write is accepted once its hold has certainly ended, i.e. when, before the
/// write was sent, (a) a grant with a larger token on that key had completed, (b) the hold's
/// deadline had passed (its upper bound: the last grant/retry/extend completion + ttl, when no
/// such call of the owner is unknown), (c) its release had succeeded, or (d) a fault that
/// drops every hold of the key (FLUSHALL, RENAME away, restart with no persistence...) had run
/// after the hold was granted.
fn stale_fenced_writes(h: &History, index: &Index) -> Check {
    let mut c = Check::new(
        "stale-fenced-writes",
        "no fenced write is accepted after its hold ended (newer grant, deadline, release, or a \
         fault that drops the lock)",
    );
    // Per (key, owner): the upper bound of the deadline of anything it holds, over time.
    let mut calls: HashMap<(&str, &str), Vec<&Entry>> = HashMap::new();
    for e in &h.entries {
        if matches!(e.op, Op::Acquire { .. } | Op::Extend { .. }) && e.outcome != Outcome::Fail {
            calls
                .entry((e.key.as_str(), e.owner.as_str()))
                .or_default()
                .push(e);
        }
    }
    for w in &h.entries {
        let (Op::FencedWrite { .. }, Outcome::Ok, Some(token)) = (&w.op, w.outcome, w.token) else {
            continue;
        };
        c.checked += 1;
        let Some(hold) = index.hold(&w.key, token) else {
            c.violation(format!(
                "accepted write with a token never granted on {}:\n      {w}",
                w.key
            ));
            continue;
        };
        if let Some((newer, by)) = index.max_granted_before(&w.key, w.invoke) {
            if newer > token {
                c.violation(format!(
                    "accepted write of token {token} after token {newer} was granted:\n      \
                     {by}\n      {w}"
                ));
                continue;
            }
        }
        let mut ceiling = Some(Micros::MIN);
        for e in calls
            .get(&(w.key.as_str(), w.owner.as_str()))
            .into_iter()
            .flatten()
        {
            if e.invoke < w.invoke {
                ceiling = match (ceiling, e.outcome, e.op.ttl()) {
                    (Some(cur), Outcome::Ok, Some(ttl)) => Some(cur.max(e.complete + ttl * 1000)),
                    _ => None, // an unknown call may have moved the deadline at any time
                };
            }
        }
        if let Some(deadline) = ceiling.filter(|d| *d > Micros::MIN) {
            if w.invoke > deadline + TOLERANCE {
                c.violation(format!(
                    "accepted write sent {:.3} ms after its hold's deadline (at the latest):\n    \
                     {}\n      {w}",
                    (w.invoke - deadline) as f64 / 1000.0,
                    hold.describe()
                ));
                continue;
            }
        }
        if let Some(r) = hold
            .releases
            .iter()
            .find(|r| r.outcome == Outcome::Ok && r.complete < w.invoke)
        {
            c.violation(format!(
                "accepted write after its release:\n      {r}\n      {w}"
            ));
            continue;
        }
        let start = hold.start();
        if let Some(f) = h.faults.iter().find(|f| {
            f.effect == Effect::Destroys
                && f.covers(&w.key)
                && start < f.invoke
                && f.complete < w.invoke
        }) {
            c.violation(format!(
                "accepted write after a fault dropped its hold:\n      {f}\n    {}\n      {w}",
                hold.describe()
            ));
        }
    }
    c
}

/// Lost updates among ok writes of one resource: two writes on the same key that read the
/// same state while both were open (each write's window runs from its read to its write's
/// reply). For the fenced list this is a check — pass: none; for the unfenced counter, only
/// a count (the pause scenarios expect some).
fn lost_updates(h: &History, fenced: bool) -> (Check, u64) {
    let mut c = Check::new(
        "fenced-lost-updates",
        "no two accepted fenced writes on a key read the same list length while both were open",
    );
    let mut groups: HashMap<(&str, i64), Vec<&Entry>> = HashMap::new();
    for e in h.entries.iter().filter(|e| e.outcome == Outcome::Ok) {
        let read = match (&e.op, fenced) {
            (Op::FencedWrite { read, .. }, true) | (Op::UnfencedWrite { read }, false) => *read,
            _ => continue,
        };
        groups.entry((&e.key, read)).or_default().push(e);
    }
    let mut lost = 0;
    for writes in groups.values_mut() {
        writes.sort_by_key(|e| e.invoke);
        c.checked += writes.len() as u64;
        let mut open_until: Option<&Entry> = None;
        for &w in writes.iter() {
            if let Some(earlier) = open_until {
                if w.invoke < earlier.complete {
                    lost += 1;
                    if fenced {
                        c.violation(format!(
                            "two accepted fenced writes read the same state:\n      {earlier}\n      {w}"
                        ));
                    }
                }
            }
            if open_until.is_none_or(|e| w.complete > e.complete) {
                open_until = Some(w);
            }
        }
    }
    (c, lost)
}

/// The token a resource list element was written with (`token|read|owner|tag`).
fn element_token(element: &str) -> Option<i64> {
    element.split('|').next()?.parse().ok()
}

/// Pass: in each fenced resource list, tokens never decrease from one element to the next:
/// the fence admits a writer only while its token is the live one, and live tokens only grow.
fn resource_order(lists: &BTreeMap<String, Vec<String>>) -> Check {
    let mut c = Check::new(
        "resource-order",
        "in every fenced resource list, tokens never decrease in append order",
    );
    for (key, list) in lists {
        let mut last: Option<(usize, i64)> = None;
        for (i, element) in list.iter().enumerate() {
            c.checked += 1;
            let Some(token) = element_token(element) else {
                c.violation(format!("{key}: unparsable element {i}: {element:?}"));
                continue;
            };
            if let Some((j, before)) = last {
                if token < before {
                    c.violation(format!(
                        "{key}: element {i} ({element}) has a smaller token than element {j} \
                         ({before})"
                    ));
                }
            }
            last = Some((i, token));
        }
    }
    c
}

/// Pass: every element of a fenced resource list was written by a fenced write the history
/// shows as accepted or unknown (never one the script refused, never one nobody sent); and,
/// in a scenario without data loss, every accepted fenced write is in its list.
fn resource_matches_history(
    h: &History,
    lists: &BTreeMap<String, Vec<String>>,
    expect: &Expect,
) -> Check {
    let mut c = Check::new(
        "resource-matches-history",
        "resource lists hold no refused or unsent write (and, without data-losing faults, every \
         accepted one)",
    );
    let mut writes: HashMap<&str, &Entry> = HashMap::new();
    for e in &h.entries {
        if let Op::FencedWrite { tag, .. } = &e.op {
            writes.insert(tag, e);
        }
    }
    let mut present: HashSet<&str> = HashSet::new();
    for (key, list) in lists {
        for element in list {
            c.checked += 1;
            present.insert(element);
            match writes.get(element.as_str()) {
                None => c.violation(format!("{key}: element {element} was never written")),
                Some(e) if e.outcome == Outcome::Fail => c.violation(format!(
                    "{key}: element {element} of a refused write:\n      {e}"
                )),
                Some(_) => {}
            }
        }
    }
    if expect.durable {
        for e in writes.values().filter(|e| e.outcome == Outcome::Ok) {
            c.checked += 1;
            if let Op::FencedWrite { tag, .. } = &e.op {
                if !present.contains(tag.as_str()) {
                    c.violation(format!("accepted write missing from its list:\n      {e}"));
                }
            }
        }
    }
    c
}

/// Held locks after restarts, reloads and failovers. Pass (for `Acked` and `WaitAcked`
/// snapshots): every hold whose grant was acknowledged before the fault (by the reply, or by
/// an ok `WAIT 1` for `WaitAcked`), that nobody tried to release, that no other lock-dropping
/// fault touched, and whose deadline (lower bound) is after the snapshot, is in the snapshot
/// with the same owner and token. `Informational` snapshots are only counted.
fn survival(h: &History, index: &Index) -> (Vec<Check>, Vec<Kept>) {
    let mut acked = Check::new(
        "held-locks-survive",
        "after a restart from an fsynced AOF or DEBUG RELOAD, every acknowledged live hold is \
         still held with the same owner and token",
    );
    let mut wait_acked = Check::new(
        "waited-locks-survive-failover",
        "after promotion, every live hold acknowledged by WAIT 1 is still held with the same \
         owner and token",
    );
    let mut kept = Vec::new();
    for s in &h.snapshots {
        let fault = &h.faults[s.fault];
        let cutoff = fault.invoke;
        let mut tally = Kept {
            fault: fault.kind.clone(),
            survival: s.survival,
            expected: 0,
            kept: 0,
        };
        for hold in &index.holds {
            let floor = match s.survival {
                Survival::WaitAcked => hold
                    .waits
                    .iter()
                    .filter(|w| w.complete < cutoff)
                    .filter_map(|w| hold.deadline_floor(w.invoke))
                    .map(|(_, floor)| floor)
                    .max(),
                _ => hold.deadline_floor(cutoff).map(|(_, floor)| floor),
            };
            let Some(floor) = floor else { continue };
            let grant = hold.proofs[0];
            let released = hold.releases.iter().any(|r| r.invoke < s.complete);
            let touched = h.faults.iter().enumerate().any(|(i, f)| {
                i != s.fault
                    && f.effect != Effect::Keeps
                    && f.covers(hold.key)
                    && f.complete > grant.invoke
                    && f.invoke < s.complete
            });
            if released || touched || floor <= s.complete + TOLERANCE {
                continue;
            }
            tally.expected += 1;
            let found = s.holds.get(hold.key).cloned().unwrap_or_default();
            if found.contains(&(hold.owner.to_string(), hold.token)) {
                tally.kept += 1;
                continue;
            }
            let detail = format!(
                "{} lost the hold (deadline at least {:.3} ms; read back at {:.3} .. {:.3} ms: \
                 {:?}):\n    {}",
                fault.kind,
                floor as f64 / 1000.0,
                s.invoke as f64 / 1000.0,
                s.complete as f64 / 1000.0,
                found,
                hold.describe()
            );
            match s.survival {
                Survival::Acked => acked.violation(detail),
                Survival::WaitAcked => wait_acked.violation(detail),
                Survival::Informational => {}
            }
        }
        match s.survival {
            Survival::Acked => acked.checked += tally.expected,
            Survival::WaitAcked => wait_acked.checked += tally.expected,
            Survival::Informational => {}
        }
        kept.push(tally);
    }
    let checks = [acked, wait_acked]
        .into_iter()
        .filter(|c| c.checked > 0 || !c.violations.is_empty())
        .collect();
    (checks, kept)
}

/// The first few violations of a check, for the report.
pub fn shown(c: &Check) -> impl Iterator<Item = &String> {
    c.violations.iter().take(SHOWN)
}
