//! The checks on tokens: they never go backwards across a server-side fault, and a fenced
//! write with a stale token is never accepted.

use super::*;

/// Pass: for every server-side fault F, every grant to an owner whose first attempt was
/// invoked after F completed has a token above every token known to exist before F was
/// invoked (granted to a client, read by the nemesis, or in the dead primary's AOF), on any
/// key. That is "tokens never go backwards" across restarts, failovers, flushes, reloads.
pub(super) fn token_epochs(h: &History, index: &Index) -> Check {
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
pub(super) fn stale_fenced_writes(h: &History, index: &Index) -> Check {
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
