//! The election scenario's checks: terms, leaders, observations and fenced writes read from
//! the history (see the parent module's docs).

use super::*;

/// One term: its grant, and the bounds of when it was certainly live.
pub(super) struct Term<'h> {
    pub(super) grant: &'h Entry,
    pub(super) token: i64,
    /// The grant's completion.
    pub(super) start: Micros,
    /// The earliest moment it could have ended, or its last accepted write's invocation if
    /// later.
    pub(super) end: Micros,
}

/// The candidate whose campaign `owner` is (`cand3-7` -> `cand3`).
pub(super) fn candidate(owner: &str) -> &str {
    owner.rsplit_once('-').map_or(owner, |(name, _)| name)
}

/// The earliest moment fault `f` could have ended `name`'s session, if it is about `name`:
/// the `loss_from_us` of the nemesis's faults (`holder=NAME loss_from_us=T ...`), else the
/// fault's invocation (the faults `finish` records: `NAME: ...`).
pub(super) fn loss_of(f: &crate::history::Fault, name: &str) -> Option<Micros> {
    if f.effect != Effect::MayLose {
        return None;
    }
    if let Some(rest) = f.note.strip_prefix(&format!("holder={name} ")) {
        let from = rest
            .split(' ')
            .next()
            .and_then(|w| w.strip_prefix("loss_from_us="))
            .and_then(|w| w.parse::<Micros>().ok());
        return Some(from.unwrap_or(f.invoke));
    }
    f.note.strip_prefix(&format!("{name}: ")).map(|_| f.invoke)
}

/// Every term granted in `h` (candidates' grants), by start.
pub(super) fn terms(h: &History) -> Vec<Term<'_>> {
    let mut terms: Vec<Term> = h
        .entries
        .iter()
        .filter(|e| e.op.is_acquire() && e.outcome == Outcome::Ok && e.owner.starts_with("cand"))
        .filter_map(|g| {
            let token = g.token?;
            let name = candidate(&g.owner);
            let mut end = Micros::MAX;
            for e in &h.entries {
                if e.op == Op::Release && e.owner == g.owner && e.invoke >= g.invoke {
                    end = end.min(e.invoke);
                }
            }
            for f in h.faults.iter().filter(|f| f.complete > g.invoke) {
                if let Some(at) = loss_of(f, name) {
                    end = end.min(at);
                }
            }
            let last_write = h
                .entries
                .iter()
                .filter(|e| {
                    matches!(e.op, Op::FencedWrite { .. })
                        && e.outcome == Outcome::Ok
                        && e.owner == g.owner
                        && e.token == Some(token)
                })
                .map(|e| e.invoke)
                .max();
            let end = last_write.map_or(end, |w| end.max(w));
            Some(Term {
                grant: g,
                token,
                start: g.complete,
                end,
            })
        })
        .collect();
    terms.sort_by_key(|t| (t.start, t.token));
    terms
}

pub(super) fn election_checks(h: &History) -> Vec<Check> {
    let terms = terms(h);
    let (observed, how) = terms_observed(h, &terms);
    let (stale_sent, stale_refused) = stale_writes(h, &terms);
    let checks = vec![
        terms_increase(&terms),
        observed_terms_increase(h),
        one_leader(&terms),
        observed,
        writes_in_term_order(h, &terms),
    ];
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for f in &h.faults {
        let kind = match f.kind.as_str() {
            k if k == KILL => "killed",
            k if k == STOP => "paused",
            k if k == CUT => "cut off",
            k if k == OBSERVER_CUT => "observer connection killed",
            k if k == FAILOVER => "failovers",
            "SIGSTOP of the replica" => "replica stopped",
            _ => "other session ends",
        };
        *kinds.entry(kind).or_default() += 1;
    }
    let resigned = terms
        .iter()
        .filter(|t| {
            h.entries.iter().any(|e| {
                e.op == Op::Release && e.owner == t.grant.owner && e.outcome == Outcome::Ok
            })
        })
        .count();
    let feed = h
        .observations
        .iter()
        .filter(|o| o.source.starts_with("observer feed "))
        .count();
    let resyncs = h
        .observations
        .iter()
        .filter(|o| o.source.starts_with("observer resync "))
        .count();
    println!(
        "election: {} terms granted ({resigned} resigned); faults {kinds:?}; the observer read \
         {feed} feed messages and resynchronised {resyncs} times; terms observed in the feed {}, \
         read by a resynchronisation {}, only inside a marked gap {}",
        terms.len(),
        how[0],
        how[1],
        how[2]
    );
    println!(
        "election: {stale_sent} fenced writes sent with a term after a larger term was granted, \
         {stale_refused} of them refused"
    );
    let (mut to_grant, mut to_seen) = failovers_after_kills(h, &terms);
    for (what, v) in [
        ("the next term granted", &mut to_grant),
        ("the observer has its message", &mut to_seen),
    ] {
        v.sort();
        if let (Some(min), Some(max)) = (v.first(), v.last()) {
            println!(
                "election: from a leader's SIGKILL (its process reaped) until {what}: {} \
                 failovers, min {:.2} p50 {:.2} max {:.2} ms",
                v.len(),
                *min as f64 / 1000.0,
                v[v.len() / 2] as f64 / 1000.0,
                *max as f64 / 1000.0
            );
        }
    }
    checks
}

/// For each SIGKILL of a candidate that held a term (by the nemesis's note), the time from the
/// kill's completion (the process reaped) to the next term's grant completion, and to the
/// observer's first feed message with that term, us. The handoff may complete before the reap:
/// those figures are negative.
fn failovers_after_kills(h: &History, terms: &[Term]) -> (Vec<Micros>, Vec<Micros>) {
    let (mut to_grant, mut to_seen) = (Vec::new(), Vec::new());
    for f in h
        .faults
        .iter()
        .filter(|f| f.kind == KILL && f.note.contains("(holding a lock;"))
    {
        let Some(name) = f
            .note
            .strip_prefix("holder=")
            .and_then(|r| r.split(' ').next())
        else {
            continue;
        };
        let next = terms
            .iter()
            .filter(|t| t.start >= f.invoke && candidate(&t.grant.owner) != name)
            .min_by_key(|t| t.start);
        let Some(next) = next else { continue };
        to_grant.push(next.start - f.complete);
        let seen = h.observations.iter().find(|o| {
            o.token == next.token && o.source.starts_with("observer feed ") && o.time >= f.invoke
        });
        if let Some(o) = seen {
            to_seen.push(o.time - f.complete);
        }
    }
    (to_grant, to_seen)
}

/// Pass: a term whose grant was invoked after another's completed has a larger token.
pub(super) fn terms_increase(terms: &[Term]) -> Check {
    let mut c = Check::new(
        "election-terms-increase",
        "a term granted after another one completed has a larger token",
    );
    let mut by_complete: Vec<&Term> = terms.iter().collect();
    by_complete.sort_by_key(|t| t.grant.complete);
    // The largest token among the grants completed so far, and whose.
    let mut best: Vec<(Micros, i64, usize)> = Vec::new();
    for (i, t) in by_complete.iter().enumerate() {
        let prev = best.last().copied();
        best.push(match prev {
            Some(p) if p.1 >= t.token => (t.grant.complete, p.1, p.2),
            _ => (t.grant.complete, t.token, i),
        });
    }
    for t in &by_complete {
        c.checked += 1;
        let n = best.partition_point(|b| b.0 < t.grant.invoke);
        if n == 0 {
            continue;
        }
        let (_, top, j) = best[n - 1];
        if top >= t.token {
            c.violations.push(format!(
                "term {} granted after term {top}:\n    {}\n    {}",
                t.token, by_complete[j].grant, t.grant
            ));
        }
    }
    c
}

/// Pass: in the observer's sequence (receive order), each new term (an `acquired` or
/// `handoff` message, or a resynchronisation's holder) is larger than every term before it;
/// a resynchronisation may read again the term it last saw, and a message whose seq is not
/// above the last resynchronisation's was published before it (and delivered after): old news,
/// not judged.
pub(super) fn observed_terms_increase(h: &History) -> Check {
    let mut c = Check::new(
        "election-observed-terms-increase",
        "the terms the observer reports (feed messages, resynchronisations) increase",
    );
    let seq_of = |rest: &str| {
        rest.split(' ')
            .next()
            .and_then(|w| w.strip_prefix("seq="))
            .and_then(|w| w.parse::<i64>().ok())
    };
    let mut last: Option<&crate::history::Observation> = None;
    let mut resync_seq: Option<i64> = None;
    for o in &h.observations {
        let fresh = if let Some(rest) = o.source.strip_prefix("observer feed ") {
            let old = matches!((seq_of(rest), resync_seq), (Some(s), Some(r)) if s <= r);
            !old && matches!(rest.split(' ').nth(1), Some("acquired" | "handoff"))
        } else if let Some(rest) = o.source.strip_prefix("observer resync ") {
            resync_seq = seq_of(rest);
            o.token > 0
        } else {
            false
        };
        if !fresh {
            continue;
        }
        c.checked += 1;
        if let Some(l) = last {
            let resync_again = o.source.starts_with("observer resync ") && o.token == l.token;
            if o.token <= l.token && !resync_again {
                c.violations.push(format!(
                    "term {} reported after term {}:\n    {} us: {}\n    {} us: {}",
                    o.token, l.token, l.time, l.source, o.time, o.source
                ));
            }
        }
        if last.is_none_or(|l| o.token > l.token) {
            last = Some(o);
        }
    }
    c
}

/// Pass: no two terms certainly live at once (beyond [`TOLERANCE`]).
pub(super) fn one_leader(terms: &[Term]) -> Check {
    let mut c = Check::new(
        "election-one-leader",
        "no two leaders at once: [grant completion, earliest possible end (resignation, session \
         loss) or last accepted write] intervals of terms overlap by at most 2 ms",
    );
    let mut widest: Option<(Micros, &Term)> = None;
    for t in terms {
        c.checked += 1;
        if t.end <= t.start {
            continue;
        }
        if let Some((until, w)) = widest {
            if t.start < until - TOLERANCE {
                c.violations.push(format!(
                    "two leaders for {:.3} ms:\n    term {} {} .. {} us: {}\n    term {} {} .. {} \
                     us: {}",
                    (until.min(t.end) - t.start) as f64 / 1000.0,
                    w.token,
                    w.start,
                    w.end,
                    w.grant,
                    t.token,
                    t.start,
                    t.end,
                    t.grant
                ));
            }
        }
        if widest.is_none_or(|(until, _)| t.end > until) {
            widest = Some((t.end, t));
        }
    }
    c
}

/// Pass: every term is in the observer's sequence, or in a gap a resynchronisation marked.
/// Also returns how many terms were in the feed, read by a resynchronisation (and not in the
/// feed), and only inside a marked gap.
fn terms_observed(h: &History, terms: &[Term]) -> (Check, [usize; 3]) {
    let mut c = Check::new(
        "election-terms-observed",
        "every term granted is observed: an acquired/handoff message or a resynchronisation \
         with its token, or a gap a later resynchronisation marked",
    );
    let (mut seen, mut fed): (HashSet<i64>, HashSet<i64>) = Default::default();
    let mut how = [0; 3];
    // (when, the largest token seen before it) of each resynchronisation.
    let mut marks: Vec<(Micros, i64)> = Vec::new();
    for o in &h.observations {
        if let Some(rest) = o.source.strip_prefix("observer feed ") {
            let event = rest.split(' ').nth(1).unwrap_or("");
            if event == "acquired" || event == "handoff" {
                seen.insert(o.token);
                fed.insert(o.token);
            }
        } else if let Some(rest) = o.source.strip_prefix("observer resync ") {
            seen.insert(o.token);
            let after = rest
                .split(' ')
                .find_map(|w| w.strip_prefix("after_token="))
                .and_then(|w| w.parse::<i64>().ok())
                .unwrap_or(i64::MAX);
            marks.push((o.time, after));
        }
    }
    for t in terms {
        c.checked += 1;
        let in_gap = marks
            .iter()
            .any(|&(at, after)| after < t.token && at >= t.grant.invoke);
        if fed.contains(&t.token) {
            how[0] += 1;
        } else if seen.contains(&t.token) {
            how[1] += 1;
        } else if in_gap {
            how[2] += 1;
        } else {
            c.violations.push(format!(
                "term {} never observed, nor inside a marked resynchronisation:\n    {}",
                t.token, t.grant
            ));
        }
    }
    (c, how)
}

/// The candidates' fenced writes with a known outcome, each with the first larger term whose
/// grant completed before the write was invoked, if any.
fn writes_and_newer<'h>(
    h: &'h History,
    terms: &'h [Term<'h>],
) -> impl Iterator<Item = (&'h Entry, i64, Option<&'h Term<'h>>)> {
    h.entries
        .iter()
        .filter(|e| {
            matches!(e.op, Op::FencedWrite { .. })
                && e.owner.starts_with("cand")
                && e.outcome != Outcome::Unknown
        })
        .filter_map(move |w| {
            let token = w.token?;
            let newer = terms
                .iter()
                .filter(|t| t.token > token && t.grant.complete < w.invoke)
                .min_by_key(|t| t.grant.complete);
            Some((w, token, newer))
        })
}

/// How many fenced writes were sent after a larger term was granted, and how many of them the
/// fence refused.
fn stale_writes(h: &History, terms: &[Term]) -> (usize, usize) {
    let stale: Vec<&Entry> = writes_and_newer(h, terms)
        .filter(|(_, _, newer)| newer.is_some())
        .map(|(w, _, _)| w)
        .collect();
    let refused = stale.iter().filter(|w| w.reply == "0").count();
    (stale.len(), refused)
}

/// Pass: no fenced write with a term is accepted once a larger term was granted (by the
/// grant's completion before the write's invocation).
pub(super) fn writes_in_term_order(h: &History, terms: &[Term]) -> Check {
    let mut c = Check::new(
        "election-writes-in-term-order",
        "no fenced write with a term is accepted after a larger term was granted",
    );
    for (w, token, newer) in writes_and_newer(h, terms) {
        c.checked += 1;
        if let Some(t) = newer {
            if w.outcome == Outcome::Ok {
                c.violations.push(format!(
                    "a write of term {token} accepted after term {} was granted:\n    {}\n    {w}",
                    t.token, t.grant
                ));
            }
        }
    }
    c
}

#[cfg(test)]
pub(super) mod tests {
    //! The election checks on hand-made histories: each catches the violation written into it
    //! and accepts the same history without it.
    use super::*;
    use crate::history::{Fault, Mode, Observation};

    pub(in crate::scenarios::election) fn entry(
        owner: &str,
        op: Op,
        at: (f64, f64),
        outcome: Outcome,
        token: i64,
    ) -> Entry {
        Entry {
            id: 0,
            client: candidate(owner).to_string(),
            key: "lock:0".to_string(),
            owner: owner.to_string(),
            op,
            invoke: (at.0 * 1000.0) as i64,
            complete: (at.1 * 1000.0) as i64,
            wall_ms: 0,
            outcome,
            token: Some(token),
            reply: if outcome == Outcome::Ok { "1" } else { "0" }.to_string(),
        }
    }

    pub(in crate::scenarios::election) fn grant(owner: &str, at: (f64, f64), token: i64) -> Entry {
        let op = Op::Acquire {
            ttl: 60_000,
            block: Some(500),
            mode: Mode::Exclusive,
        };
        entry(owner, op, at, Outcome::Ok, token)
    }

    pub(in crate::scenarios::election) fn release(
        owner: &str,
        at: (f64, f64),
        token: i64,
    ) -> Entry {
        entry(owner, Op::Release, at, Outcome::Ok, token)
    }

    pub(in crate::scenarios::election) fn write(
        owner: &str,
        at: (f64, f64),
        outcome: Outcome,
        token: i64,
    ) -> Entry {
        let op = Op::FencedWrite {
            read: 0,
            tag: format!("{token}|{owner}"),
        };
        entry(owner, op, at, outcome, token)
    }

    /// The SIGSTOP of `name` as the nemesis records it: loss possible from `from` ms.
    pub(in crate::scenarios::election) fn stop(name: &str, at: (f64, f64), from: f64) -> Fault {
        Fault {
            kind: STOP.to_string(),
            invoke: (at.0 * 1000.0) as i64,
            complete: (at.1 * 1000.0) as i64,
            wall_ms: 0,
            keys: None,
            effect: Effect::MayLose,
            server_side: false,
            note: format!(
                "holder={name} loss_from_us={} (test)",
                (from * 1000.0) as i64
            ),
        }
    }

    pub(in crate::scenarios::election) fn feed(
        at: f64,
        seq: i64,
        event: &str,
        token: i64,
    ) -> Observation {
        Observation {
            time: (at * 1000.0) as i64,
            token,
            source: format!("observer feed seq={seq} {event} owner=x"),
        }
    }

    pub(in crate::scenarios::election) fn resync(at: f64, after: i64, holder: i64) -> Observation {
        resync_at_seq(at, 1, after, holder)
    }

    pub(in crate::scenarios::election) fn resync_at_seq(
        at: f64,
        seq: i64,
        after: i64,
        holder: i64,
    ) -> Observation {
        Observation {
            time: (at * 1000.0) as i64,
            token: holder,
            source: format!("observer resync seq={seq} after_token={after} holder={holder} (test)"),
        }
    }

    /// The observations in time order, as the observer (one thread) records them.
    pub(in crate::scenarios::election) fn history(
        entries: Vec<Entry>,
        faults: Vec<Fault>,
        mut obs: Vec<Observation>,
    ) -> History {
        obs.sort_by_key(|o| o.time);
        History {
            entries,
            faults,
            observations: obs,
            ..History::default()
        }
    }

    /// Violations per check, in `election_checks`' order.
    fn violations(h: &History) -> Vec<usize> {
        election_checks(h)
            .iter()
            .map(|c| c.violations.len())
            .collect()
    }

    /// cand1 leads term 10 and resigns; cand2 leads term 11 and is stopped past its session
    /// (loss possible from 300 ms); cand3 leads term 12 from 320 ms; cand2 wakes and its write
    /// with term 11 is refused. The observer sees 10 and 12 and marks a gap covering 11.
    fn clean() -> (Vec<Entry>, Vec<Fault>, Vec<Observation>) {
        let entries = vec![
            grant("cand1-1", (0.0, 1.0), 10),
            write("cand1-1", (5.0, 6.0), Outcome::Ok, 10),
            release("cand1-1", (50.0, 51.0), 10),
            grant("cand2-1", (2.0, 51.0), 11),
            write("cand2-1", (60.0, 61.0), Outcome::Ok, 11),
            grant("cand3-1", (100.0, 320.0), 12),
            write("cand3-1", (330.0, 331.0), Outcome::Ok, 12),
            write("cand2-1", (400.0, 401.0), Outcome::Fail, 11),
        ];
        let faults = vec![stop("cand2", (70.0, 390.0), 300.0)];
        let obs = vec![
            feed(1.5, 1, "acquired", 10),
            feed(51.5, 3, "handoff", 12),
            resync(52.0, 10, 12),
        ];
        (entries, faults, obs)
    }

    #[test]
    fn resp_replies_parse_only_when_whole() {
        let msg = b"*3\r\n$8\r\nsmessage\r\n$2\r\nch\r\n$23\r\n7 handoff 12 -1 cand1-1\r\n+OK\r\n";
        let whole = msg.len() - 5;
        for cut in 0..whole {
            assert_eq!(parse(&msg[..cut], 0), None, "{cut} bytes");
        }
        let bulk = |b: &str| Resp::Bulk(Some(b.as_bytes().to_vec()));
        let items = vec![
            bulk("smessage"),
            bulk("ch"),
            bulk("7 handoff 12 -1 cand1-1"),
        ];
        assert_eq!(parse(msg, 0), Some((Resp::Array(Some(items)), whole)));
        assert_eq!(
            parse(msg, whole),
            Some((Resp::Simple("OK".into()), msg.len()))
        );
        assert_eq!(parse(b"$-1\r\n", 0), Some((Resp::Bulk(None), 5)));
        assert_eq!(parse(b"*-1\r\n", 0), Some((Resp::Array(None), 5)));
        assert_eq!(parse(b":-3\r\n", 0), Some((Resp::Int(-3), 5)));
        let err = b"-ERR no\r\n";
        assert_eq!(
            parse(err, 0),
            Some((Resp::Error("ERR no".into()), err.len()))
        );
    }

    /// One history with the three faults at once: term 12 granted while term 11 still leads,
    /// term 11 never observed, and term 11's write accepted after term 12 was granted.
    #[test]
    fn an_overlap_a_skipped_term_and_a_stale_write_are_each_caught() {
        let (mut e, f, mut o) = clean();
        e[5] = grant("cand3-1", (100.0, 200.0), 12);
        e[7] = write("cand2-1", (400.0, 401.0), Outcome::Ok, 11);
        o.pop();
        let h = history(e, f, o);
        let checks = election_checks(&h);
        let failed: Vec<(&str, usize)> = checks
            .iter()
            .filter(|c| !c.violations.is_empty())
            .map(|c| (c.name.as_str(), c.violations.len()))
            .collect();
        assert_eq!(
            failed,
            vec![
                ("election-one-leader", 1),
                ("election-terms-observed", 1),
                ("election-writes-in-term-order", 1)
            ]
        );
        assert_eq!(stale_writes(&h, &terms(&h)), (1, 0));
    }

    #[test]
    fn a_clean_history_passes() {
        let (e, f, o) = clean();
        let h = history(e, f, o);
        assert_eq!(violations(&h), vec![0, 0, 0, 0, 0]);
        // cand2's write of term 11 after term 12's grant: sent, and refused.
        assert_eq!(stale_writes(&h, &terms(&h)), (1, 1));
    }

    #[test]
    fn two_leaders_at_once_are_caught() {
        // cand3 is granted at 200 ms, before cand2's loss could have happened (300 ms).
        let (mut e, f, o) = clean();
        e[5] = grant("cand3-1", (100.0, 200.0), 12);
        assert_eq!(violations(&history(e, f, o)), vec![0, 0, 1, 0, 0]);
    }

    #[test]
    fn a_term_out_of_order_is_caught() {
        // Term 9 granted after term 10 completed.
        let (mut e, f, mut o) = clean();
        e.push(grant("cand4-1", (52.0, 53.0), 9));
        e.push(release("cand4-1", (54.0, 55.0), 9));
        o.push(feed(53.5, 4, "acquired", 9));
        // Term 9 is also certainly live (53 .. 54 ms) inside term 11 (51 .. 300 ms).
        assert_eq!(violations(&history(e, f, o)), vec![1, 1, 1, 0, 0]);
    }

    #[test]
    fn old_news_after_a_resynchronisation_is_not_judged() {
        // After a reconnect the resynchronisation reads term 12 at seq 6; the handoff to term
        // 11 (seq 5), published before it, is delivered after it.
        let order = |late_seq: i64| {
            let h = history(
                Vec::new(),
                Vec::new(),
                vec![
                    feed(1.0, 4, "acquired", 10),
                    resync_at_seq(2.0, 6, 10, 12),
                    feed(2.5, late_seq, "handoff", 11),
                ],
            );
            observed_terms_increase(&h).violations.len()
        };
        assert_eq!(order(5), 0);
        assert_eq!(order(7), 1);
    }

    #[test]
    fn a_skipped_term_is_caught() {
        // Without the resynchronisation that marked the gap, term 11 was never observed.
        let (e, f, mut o) = clean();
        o.pop();
        assert_eq!(
            violations(&history(e.clone(), f.clone(), o.clone())),
            vec![0, 0, 0, 1, 0]
        );
        // A resynchronisation before term 11's grant was invoked, or one that had already
        // seen a larger token, does not cover it.
        let mut early = o.clone();
        early.push(resync(1.8, 10, 10));
        assert_eq!(
            violations(&history(e.clone(), f.clone(), early)),
            vec![0, 0, 0, 1, 0]
        );
        let mut late = o;
        late.push(resync(52.0, 12, 12));
        assert_eq!(violations(&history(e, f, late)), vec![0, 0, 0, 1, 0]);
    }

    #[test]
    fn a_stale_write_accepted_is_caught() {
        // cand2's write with term 11, sent after term 12 was granted, accepted.
        let (mut e, f, o) = clean();
        e[7] = write("cand2-1", (400.0, 401.0), Outcome::Ok, 11);
        let v = violations(&history(e, f, o));
        // Its accepted write also proves term 11 live at 400 ms, beside term 12.
        assert_eq!(v, vec![0, 0, 1, 0, 1]);
    }
}
