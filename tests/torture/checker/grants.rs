//! The checks on calls and grants: every call answered, a multi-key grant all or nothing, one
//! owner per token, grants in token order, exclusive holds that never overlap; and the
//! intervals in which a hold was certainly live, which the overlap checks share.

use super::*;

/// Pass: the server answers every call within the wait the call asked for (`BLOCK` timeout,
/// `WAIT` timeout) plus 2 s. A call may go unanswered only because its connection broke (the
/// server was killed, the client was killed) or because the client itself gave up early; a
/// client-side timeout on a live connection means the server never replied: the caller would
/// have hung forever.
pub(super) fn calls_answered(h: &History) -> Check {
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
pub(super) fn multi_all_or_nothing(h: &History) -> Check {
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
pub(super) fn token_owner(index: &Index) -> Check {
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
pub(super) fn grant_order(h: &History, index: &Index) -> Check {
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
pub(super) fn exclusive_holds(h: &History, index: &Index) -> Check {
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
pub(super) fn cutting_faults<'h>(
    h: &'h History,
    key: &'h str,
    after: Micros,
) -> impl Iterator<Item = &'h Fault> {
    h.faults
        .iter()
        .filter(move |f| f.effect != Effect::Keeps && f.covers(key) && f.complete > after)
}
