//! The checks on the resources the holders wrote: no lost update in the fenced list, its
//! elements in token order, and the list as the server holds it matching the history.

use super::*;

/// Lost updates among ok writes of one resource: two writes on the same key that read the
/// same state while both were open (each write's window runs from its read to its write's
/// reply). For the fenced list this is a check — pass: none; for the unfenced counter, only
/// a count (the pause scenarios expect some). Not a lost update: a pair with a fault that wipes
/// every key (`FLUSHALL`, `FLUSHDB`, a restart without persistence) inside the time both were
/// open, which also wipes the resource: the later write then reads the emptied list (seen in
/// `flushall` on Redis 8.2: the earlier write landed, the flush emptied the list and dropped
/// the lock, and the next holder read length 0 again).
pub(super) fn lost_updates(h: &History, fenced: bool) -> (Check, u64) {
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
    let wipes: Vec<&Fault> = h
        .faults
        .iter()
        .filter(|f| f.effect == Effect::Destroys && f.keys.is_none())
        .collect();
    let wiped_between = |earlier: &Entry, later: &Entry| {
        wipes
            .iter()
            .any(|f| f.complete > later.invoke && f.invoke < earlier.complete)
    };
    let mut lost = 0;
    for writes in groups.values_mut() {
        writes.sort_by_key(|e| e.invoke);
        c.checked += writes.len() as u64;
        let mut open_until: Option<&Entry> = None;
        for &w in writes.iter() {
            if let Some(earlier) = open_until {
                if w.invoke < earlier.complete && !wiped_between(earlier, w) {
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
pub(super) fn element_token(element: &str) -> Option<i64> {
    element.split('|').next()?.parse().ok()
}

/// Pass: in each fenced resource list, tokens never decrease from one element to the next:
/// the fence admits a writer only while its token is the live one, and live tokens only grow.
pub(super) fn resource_order(lists: &BTreeMap<String, Vec<String>>) -> Check {
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
pub(super) fn resource_matches_history(
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
