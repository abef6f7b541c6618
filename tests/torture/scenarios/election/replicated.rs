//! `election_failover`'s checks: the election under asynchronous replication and failovers,
//! where a promoted replica may not have seen the last terms, and a candidate may believe it
//! leads while a newer term is granted (paused, cut off, or on a primary that died). What
//! fencing promises there, and so what fails the scenario:
//!
//! - `election-fenced-writes-in-term-order`: no fenced write of a term is accepted after an
//!   accepted write of a larger term completed (over the whole history, every server);
//! - `election-terms-increase-per-server`: between two failovers (one server), a term granted
//!   after another one completed has a larger token (`checks.rs`'s `election-terms-increase`
//!   on each server's grants; a grant whose call spans a failover is on neither);
//! - `election-observed-terms-increase-per-server`: the terms the observer reports from one
//!   server increase (after a failover it may read again an older term the replica kept);
//! - `election-terms-observed` and `election-writes-in-term-order`, as on one server: every term
//!   is observed; no write with a term is accepted once a larger term was granted (a candidate
//!   talks to one server only: it is replaced at each failover).
//!
//! Reported, not failed: terms that overlapped in time, by the candidates' own view (from the
//! grant's completion until the candidate could have known it lost: its resignation, the end
//! of the kill, pause, cut or failover that ended it), and by `checks.rs`'s "certainly live"
//! intervals (`election-one-leader` on one server) with a failover as a possible end of every
//! term.

use super::checks::{
    candidate, loss_of, observed_terms_increase, one_leader, terms, terms_increase,
    writes_in_term_order, Term,
};
use super::*;

/// The failovers' (invoke, complete), in order.
fn failovers(h: &History) -> Vec<(Micros, Micros)> {
    let mut f: Vec<(Micros, Micros)> = h
        .faults
        .iter()
        .filter(|f| f.kind == FAILOVER)
        .map(|f| (f.invoke, f.complete))
        .collect();
    f.sort();
    f
}

/// Which server (0 the first, 1 after the first failover, ...) an operation from `invoke` to
/// `complete` ran on, if no failover overlaps it.
fn server_of(failovers: &[(Micros, Micros)], invoke: Micros, complete: Micros) -> Option<usize> {
    let after = failovers.iter().filter(|f| f.1 <= invoke).count();
    let begun = failovers.iter().filter(|f| f.0 < complete).count();
    (after == begun).then_some(after)
}

pub(super) fn failover_checks(h: &History) -> Vec<Check> {
    let terms = terms(h);
    let fo = failovers(h);
    // The single-server checks that still hold, and their summary lines.
    let mut checks: Vec<Check> = election_checks(h)
        .into_iter()
        .filter(|c| c.name == "election-terms-observed")
        .collect();
    checks.push(writes_in_term_order(h, &terms));
    checks.push(fenced_writes_in_term_order(h));
    checks.push(terms_increase_per_server(&terms, &fo));
    checks.push(observed_terms_increase_per_server(h));
    let believed = believed_overlaps(h, &terms, &fo);
    let live = certainly_live_overlaps(&terms, &fo);
    let max = believed.iter().max().copied().unwrap_or(0);
    println!(
        "election_failover: {} failovers; {} terms; {} times a candidate still believed it led \
         while a newer term was granted (longest {:.1} ms); {live} overlaps of certainly live \
         terms",
        fo.len(),
        terms.len(),
        believed.len(),
        max as f64 / 1000.0
    );
    checks
}

/// Pass: in the order they completed, the accepted fenced writes' terms never go down (a write
/// invoked after an accepted write of term t completed has a term >= t).
fn fenced_writes_in_term_order(h: &History) -> Check {
    let mut c = Check::new(
        "election-fenced-writes-in-term-order",
        "no fenced write of a term is accepted after an accepted write of a larger term \
         completed (every server)",
    );
    let mut accepted: Vec<(&Entry, i64)> = h
        .entries
        .iter()
        .filter(|e| {
            matches!(e.op, Op::FencedWrite { .. })
                && e.owner.starts_with("cand")
                && e.outcome == Outcome::Ok
        })
        .filter_map(|e| Some((e, e.token?)))
        .collect();
    accepted.sort_by_key(|(e, _)| e.complete);
    // The largest term among the writes completed so far, and which write it was.
    let mut top: Vec<(Micros, i64, usize)> = Vec::new();
    for (i, (e, token)) in accepted.iter().enumerate() {
        let next = match top.last() {
            Some(&(_, t, j)) if t >= *token => (e.complete, t, j),
            _ => (e.complete, *token, i),
        };
        top.push(next);
    }
    for (w, token) in &accepted {
        c.checked += 1;
        let n = top.partition_point(|t| t.0 < w.invoke);
        if n == 0 {
            continue;
        }
        let (_, t, j) = top[n - 1];
        if t > *token {
            c.violations.push(format!(
                "a write of term {token} accepted after a write of term {t}:\n    {}\n    {w}",
                accepted[j].0
            ));
        }
    }
    c
}

/// `election-terms-increase` on each server's terms, as one check.
fn terms_increase_per_server(terms: &[Term], fo: &[(Micros, Micros)]) -> Check {
    let mut c = Check::new(
        "election-terms-increase-per-server",
        "on one server (between failovers), a term granted after another one completed has a \
         larger token",
    );
    let mut by_server: BTreeMap<usize, Vec<&Term>> = BTreeMap::new();
    for t in terms {
        if let Some(s) = server_of(fo, t.grant.invoke, t.grant.complete) {
            by_server.entry(s).or_default().push(t);
        }
    }
    for group in by_server.values() {
        let group: Vec<Term> = group
            .iter()
            .map(|t| Term {
                grant: t.grant,
                token: t.token,
                start: t.start,
                end: t.end,
            })
            .collect();
        let one = terms_increase(&group);
        c.checked += one.checked;
        c.violations.extend(one.violations);
    }
    c
}

/// `election-observed-terms-increase` on each server's observations (by the `port=` the
/// observer notes), as one check.
fn observed_terms_increase_per_server(h: &History) -> Check {
    let mut c = Check::new(
        "election-observed-terms-increase-per-server",
        "the terms the observer reports from one server (feed messages, resynchronisations) \
         increase",
    );
    let mut by_port: BTreeMap<&str, Vec<crate::history::Observation>> = BTreeMap::new();
    for o in &h.observations {
        let port = o
            .source
            .split(' ')
            .find_map(|w| w.strip_prefix("port="))
            .unwrap_or("");
        by_port.entry(port).or_default().push(o.clone());
    }
    for observations in by_port.into_values() {
        let one = observed_terms_increase(&History {
            observations,
            ..History::default()
        });
        c.checked += one.checked;
        c.violations.extend(one.violations);
    }
    c
}

/// For each term granted while a term with a smaller token was still believed to lead, how
/// long the two overlapped, us. A candidate believes it leads from its grant's completion
/// until it resigns (the release's invocation) or could have learnt of its loss: the end of
/// the first fault that names it (kill, pause, cut, a `KEEPALIVE` answered nil) or of the
/// first failover, after the grant.
fn believed_overlaps(h: &History, terms: &[Term], fo: &[(Micros, Micros)]) -> Vec<Micros> {
    let believed_end = |t: &Term| {
        let name = candidate(&t.grant.owner);
        let resigned = h
            .entries
            .iter()
            .filter(|e| e.op == Op::Release && e.owner == t.grant.owner)
            .map(|e| e.invoke);
        let lost = h
            .faults
            .iter()
            .filter(|f| f.complete > t.start && loss_of(f, name).is_some())
            .map(|f| f.complete);
        let failed_over = fo.iter().filter(|f| f.1 > t.start).map(|f| f.1);
        resigned
            .chain(lost)
            .chain(failed_over)
            .min()
            .unwrap_or(Micros::MAX)
    };
    let ends: Vec<Micros> = terms.iter().map(believed_end).collect();
    let mut overlaps = Vec::new();
    for t in terms {
        let longest = terms
            .iter()
            .zip(&ends)
            .filter(|(u, end)| u.token < t.token && u.start < t.start && **end > t.start)
            .map(|(_, end)| *end - t.start)
            .max();
        overlaps.extend(longest);
    }
    overlaps
}

/// `election-one-leader`'s violations, counted, with each failover also a possible end of
/// every term live at it.
fn certainly_live_overlaps(terms: &[Term], fo: &[(Micros, Micros)]) -> usize {
    let cut: Vec<Term> = terms
        .iter()
        .map(|t| {
            let end = fo
                .iter()
                .filter(|f| f.1 > t.start)
                .map(|f| f.0)
                .fold(t.end, Micros::min);
            Term {
                grant: t.grant,
                token: t.token,
                start: t.start,
                end,
            }
        })
        .collect();
    one_leader(&cut).violations.len()
}

#[cfg(test)]
mod tests {
    //! The checks on hand-made histories: each catches the violation written into it and
    //! accepts the same history without it.
    use super::super::checks::tests::{feed, grant, history, release, resync, stop, write};
    use super::*;
    use crate::history::{Fault, Observation};

    /// The failover as `failover.rs` records it, from `at.0` to `at.1` ms.
    fn failover(at: (f64, f64)) -> Fault {
        Fault {
            kind: FAILOVER.to_string(),
            invoke: (at.0 * 1000.0) as i64,
            complete: (at.1 * 1000.0) as i64,
            wall_ms: 0,
            keys: None,
            effect: Effect::MayLose,
            server_side: true,
            note: "new primary on port 2 (test)".to_string(),
        }
    }

    fn on(port: u16, mut o: Observation) -> Observation {
        o.source = format!("{} port={port}", o.source);
        o
    }

    /// Violations per check, in `failover_checks`' order.
    fn violations(h: &History) -> Vec<(String, usize)> {
        failover_checks(h)
            .iter()
            .map(|c| (c.name.clone(), c.violations.len()))
            .collect()
    }

    /// Server 1 (port 1): cand1 leads term 10 and resigns; cand2 leads term 11 and is paused
    /// past its session (loss possible from 300 ms) while cand3 is granted term 12 at 320 ms;
    /// cand2 wakes at 390 ms and its write of term 11 is refused. A failover (400-500 ms):
    /// the new primary (port 2) kept term 12 and grants term 20 to cand4 after it.
    fn clean() -> (Vec<Entry>, Vec<Fault>, Vec<Observation>) {
        let entries = vec![
            grant("cand1-1", (0.0, 1.0), 10),
            write("cand1-1", (5.0, 6.0), Outcome::Ok, 10),
            release("cand1-1", (50.0, 51.0), 10),
            grant("cand2-1", (2.0, 51.0), 11),
            write("cand2-1", (60.0, 61.0), Outcome::Ok, 11),
            grant("cand3-1", (100.0, 320.0), 12),
            write("cand3-1", (330.0, 331.0), Outcome::Ok, 12),
            write("cand2-1", (391.0, 392.0), Outcome::Fail, 11),
            grant("cand4-1", (510.0, 760.0), 20),
            write("cand4-1", (770.0, 771.0), Outcome::Ok, 20),
        ];
        let faults = vec![
            stop("cand2", (70.0, 390.0), 300.0),
            failover((400.0, 500.0)),
        ];
        let obs = vec![
            on(1, feed(1.5, 1, "acquired", 10)),
            on(1, feed(51.5, 2, "handoff", 11)),
            on(1, feed(320.5, 3, "handoff", 12)),
            on(2, resync(505.0, 12, 12)),
            on(2, feed(760.5, 9, "handoff", 20)),
        ];
        (entries, faults, obs)
    }

    const NAMES: [&str; 5] = [
        "election-terms-observed",
        "election-writes-in-term-order",
        "election-fenced-writes-in-term-order",
        "election-terms-increase-per-server",
        "election-observed-terms-increase-per-server",
    ];

    fn expect(counts: [usize; 5]) -> Vec<(String, usize)> {
        NAMES
            .iter()
            .zip(counts)
            .map(|(n, c)| (n.to_string(), c))
            .collect()
    }

    #[test]
    fn a_clean_history_passes_and_its_overlap_is_reported() {
        let (e, f, o) = clean();
        let h = history(e, f, o);
        assert_eq!(violations(&h), expect([0; 5]));
        let terms = terms(&h);
        // cand2 believed it led term 11 until its pause ended (390 ms); term 12 from 320 ms.
        assert_eq!(believed_overlaps(&h, &terms, &failovers(&h)), vec![70_000]);
        assert_eq!(certainly_live_overlaps(&terms, &failovers(&h)), 0);
    }

    #[test]
    fn a_write_of_an_older_term_accepted_after_a_newer_one_is_caught() {
        // cand2's write of term 11 after cand3's write of term 12: accepted.
        let (mut e, f, o) = clean();
        e[7] = write("cand2-1", (391.0, 392.0), Outcome::Ok, 11);
        // Also a write after a larger term was granted, and so term 11 certainly live at
        // 391 ms beside term 12 (reported only).
        assert_eq!(violations(&history(e, f, o)), expect([0, 1, 1, 0, 0]));
        // Accepted before term 12's first write completed: fencing allows it (term 12 was
        // granted, so the single-server order check still objects).
        let (mut e, f, o) = clean();
        e[7] = write("cand2-1", (325.0, 330.5), Outcome::Ok, 11);
        assert_eq!(violations(&history(e, f, o)), expect([0, 1, 0, 0, 0]));
    }

    #[test]
    fn a_term_going_down_on_one_server_is_caught_not_across_a_failover() {
        // The new primary grants term 9 after term 20: on one server, a violation.
        let (mut e, f, mut o) = clean();
        e.push(grant("cand5-1", (800.0, 801.0), 9));
        e.push(release("cand5-1", (802.0, 803.0), 9));
        o.push(on(2, feed(801.5, 10, "acquired", 9)));
        assert_eq!(violations(&history(e, f, o)), expect([0, 0, 0, 1, 1]));
        // The new primary's first term below the old one's last (a replica that missed
        // terms): allowed, on another server.
        let (mut e, f, mut o) = clean();
        e[8] = grant("cand4-1", (510.0, 760.0), 11);
        e[9] = write("cand4-1", (770.0, 771.0), Outcome::Ok, 11);
        o[3] = on(2, resync(505.0, 12, 0));
        o[4] = on(2, feed(760.5, 9, "handoff", 11));
        // Its write of term 11 after term 12's write is what fencing forbids, though.
        assert_eq!(violations(&history(e, f, o)), expect([0, 1, 1, 0, 0]));
    }

    #[test]
    fn a_term_the_observer_never_saw_is_caught() {
        let (e, f, mut o) = clean();
        o.remove(4);
        assert_eq!(violations(&history(e, f, o)), expect([1, 0, 0, 0, 0]));
    }
}
