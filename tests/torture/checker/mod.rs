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
//!
//! Here: what the checks share (the expectations, the verdict, the index of holds) and the
//! run of every check; the checks by family in `grants.rs`, `tokens.rs`, `resources.rs` and
//! `survival.rs`.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::history::{Effect, Entry, Fault, History, Micros, Mode, Op, Outcome, Survival};
use crate::workload::NO_REPLY;

mod grants;
mod resources;
mod survival;
mod tokens;

pub use grants::certain_intervals;
use grants::*;
use resources::*;
use survival::*;
use tokens::*;

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

/// The first few violations of a check, for the report.
pub fn shown(c: &Check) -> impl Iterator<Item = &String> {
    c.violations.iter().take(SHOWN)
}
