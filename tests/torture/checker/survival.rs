//! The check on what survived: held locks after restarts, reloads and failovers.

use super::*;

/// Held locks after restarts, reloads and failovers. Pass (for `Acked` and `WaitAcked`
/// snapshots): every hold whose grant was acknowledged before the fault (by the reply, or by
/// an ok `WAIT 1` for `WaitAcked`), that nobody tried to release, that no other lock-dropping
/// fault touched, and whose deadline (lower bound) is after the snapshot, is in the snapshot
/// with the same owner and token. `Informational` snapshots are only counted.
pub(super) fn survival(h: &History, index: &Index) -> (Vec<Check>, Vec<Kept>) {
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
