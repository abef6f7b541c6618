//! The tables: one per scenario when it ends, and the summary over every scenario when the
//! last one ends (all of this file's scenarios ran in this process, as `make torture` does).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

use crate::checker::{shown, Kept, Verdict};
use crate::history::{History, Op, Outcome, Survival};
use crate::run::Scenario;

/// The figures of one scenario.
#[derive(Clone, Debug)]
pub struct Report {
    pub name: String,
    pub what: String,
    pub secs: f64,
    pub seed: u64,
    pub workers: usize,
    pub keys: usize,
    /// Operation row -> [ok, fail, unknown].
    pub ops: BTreeMap<&'static str, [u64; 3]>,
    /// Fault kind -> how many times.
    pub faults: BTreeMap<String, u64>,
    /// Check -> (checked, violations).
    pub checks: BTreeMap<String, (u64, u64)>,
    pub criteria: BTreeMap<String, String>,
    pub holds: usize,
    pub accepted: u64,
    pub refused: u64,
    pub lost_fenced: u64,
    pub lost_unfenced: u64,
    pub kept: Vec<Kept>,
    pub counters: BTreeMap<String, i64>,
}

impl Report {
    pub fn new(s: &Scenario, secs: f64, seed: u64, h: &History, v: &Verdict) -> Report {
        let mut ops: BTreeMap<&'static str, [u64; 3]> = BTreeMap::new();
        for e in &h.entries {
            let column = match e.outcome {
                Outcome::Ok => 0,
                Outcome::Fail => 1,
                Outcome::Unknown => 2,
            };
            ops.entry(e.op.row()).or_default()[column] += 1;
        }
        let mut faults = BTreeMap::new();
        for f in &h.faults {
            *faults.entry(f.kind.clone()).or_default() += 1;
        }
        let accepted = h
            .entries
            .iter()
            .filter(|e| matches!(e.op, Op::FencedWrite { .. }) && e.outcome == Outcome::Ok)
            .count() as u64;
        Report {
            name: s.name.to_string(),
            what: s.what.to_string(),
            secs,
            seed,
            workers: s.workload.workers,
            keys: s.workload.keys,
            ops,
            faults,
            checks: v
                .checks
                .iter()
                .map(|c| (c.name.clone(), (c.checked, c.violations.len() as u64)))
                .collect(),
            criteria: v
                .checks
                .iter()
                .map(|c| (c.name.clone(), c.criterion.clone()))
                .collect(),
            holds: v.holds,
            accepted,
            refused: v.refused,
            lost_fenced: v.lost_fenced,
            lost_unfenced: v.lost_unfenced,
            kept: v.kept.clone(),
            counters: h.counters.clone(),
        }
    }

    fn violations(&self) -> u64 {
        self.checks.values().map(|(_, v)| v).sum()
    }

    fn ops_total(&self) -> [u64; 3] {
        let mut total = [0; 3];
        for row in self.ops.values() {
            for (t, n) in total.iter_mut().zip(row) {
                *t += n;
            }
        }
        total
    }

    /// Print this scenario's tables, then every violation with its history entries.
    pub fn print(&self, v: &Verdict) {
        let mut out = String::new();
        let _ = writeln!(out, "\n==== torture scenario: {} ====", self.name);
        let _ = writeln!(out, "{}", self.what);
        let _ = writeln!(
            out,
            "workload {:.1} s, {} client threads, {} lock keys, seed {} (TORTURE_SEED)",
            self.secs, self.workers, self.keys, self.seed
        );
        ops_table(&mut out, &self.ops);
        faults_table(&mut out, &self.faults);
        checks_table(&mut out, &self.checks, &self.criteria);
        let _ = writeln!(
            out,
            "holds granted {}; fenced writes accepted {}, refused {} (stale token); lost updates: \
             fenced {}, unfenced {}",
            self.holds, self.accepted, self.refused, self.lost_fenced, self.lost_unfenced
        );
        kept_lines(&mut out, &self.kept);
        for (name, n) in &self.counters {
            let _ = writeln!(out, "{name}: {n}");
        }
        for c in v.checks.iter().filter(|c| !c.violations.is_empty()) {
            let _ = writeln!(
                out,
                "\nVIOLATION {} ({} of them): {}",
                c.name,
                c.violations.len(),
                c.criterion
            );
            for detail in shown(c) {
                let _ = writeln!(out, "  - {detail}");
            }
        }
        println!("{out}");
    }
}

fn ops_table(out: &mut String, ops: &BTreeMap<&'static str, [u64; 3]>) {
    let _ = writeln!(
        out,
        "{:<30} {:>9} {:>9} {:>9}",
        "operations", "ok", "fail", "unknown"
    );
    let mut total = [0; 3];
    for (row, counts) in ops {
        let _ = writeln!(
            out,
            "  {:<28} {:>9} {:>9} {:>9}",
            row, counts[0], counts[1], counts[2]
        );
        for (t, n) in total.iter_mut().zip(counts) {
            *t += n;
        }
    }
    let _ = writeln!(
        out,
        "  {:<28} {:>9} {:>9} {:>9}",
        "total", total[0], total[1], total[2]
    );
}

fn faults_table(out: &mut String, faults: &BTreeMap<String, u64>) {
    let _ = writeln!(out, "{:<62} {:>7}", "faults injected", "count");
    if faults.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    for (kind, n) in faults {
        let _ = writeln!(out, "  {kind:<60} {n:>7}");
    }
}

fn checks_table(
    out: &mut String,
    checks: &BTreeMap<String, (u64, u64)>,
    criteria: &BTreeMap<String, String>,
) {
    let _ = writeln!(
        out,
        "{:<32} {:>9} {:>10}  pass criterion",
        "checks", "checked", "violations"
    );
    for (name, (checked, violations)) in checks {
        let criterion = criteria.get(name).map_or("", String::as_str);
        let _ = writeln!(
            out,
            "  {name:<30} {checked:>9} {violations:>10}  {criterion}"
        );
    }
}

fn kept_lines(out: &mut String, kept: &[Kept]) {
    let mut by_kind: BTreeMap<(String, &'static str), (u64, u64, u64)> = BTreeMap::new();
    for k in kept {
        let mode = match k.survival {
            Survival::Acked => "required: every acknowledged live hold",
            Survival::WaitAcked => "required: every live hold acknowledged by WAIT 1",
            Survival::Informational => "not required (counted)",
        };
        let e = by_kind.entry((k.fault.clone(), mode)).or_default();
        e.0 += 1;
        e.1 += k.expected;
        e.2 += k.kept;
    }
    for ((fault, mode), (times, expected, kept)) in by_kind {
        let _ = writeln!(
            out,
            "held locks kept across {fault} (x{times}): {kept} of {expected} live acknowledged \
             holds ({mode})"
        );
    }
}

static FINISHED: Mutex<Vec<Report>> = Mutex::new(Vec::new());

/// Record a finished scenario; when it is the `total`-th, print the summary.
pub fn finished(report: Report, total: usize) {
    let mut done = FINISHED.lock().unwrap_or_else(|e| e.into_inner());
    done.push(report);
    if done.len() == total {
        print_summary(&done);
    }
}

fn print_summary(reports: &[Report]) {
    let mut out = String::new();
    let secs = reports.first().map_or(0.0, |r| r.secs);
    let _ = writeln!(
        out,
        "\n==== torture summary: {} scenarios, {secs:.1} s of workload each ====",
        reports.len()
    );
    let _ = writeln!(
        out,
        "{:<30} {:>8} {:>7} {:>7} {:>6} {:>5} {:>6} {:>6} {:>9} {:>10}",
        "scenario",
        "ops ok",
        "fail",
        "unknown",
        "faults",
        "viol",
        "lost F",
        "lost U",
        "refused",
        "kept"
    );
    let mut ops: BTreeMap<&'static str, [u64; 3]> = BTreeMap::new();
    let mut faults: BTreeMap<String, u64> = BTreeMap::new();
    let mut checks: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut criteria = BTreeMap::new();
    let mut kept = Vec::new();
    let (mut lost_fenced, mut lost_unfenced, mut refused, mut accepted) = (0, 0, 0, 0);
    let mut sorted: Vec<&Report> = reports.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    for r in sorted {
        let total = r.ops_total();
        let (expected, found) = r
            .kept
            .iter()
            .filter(|k| k.survival != Survival::Informational)
            .fold((0, 0), |(e, f), k| (e + k.expected, f + k.kept));
        let kept_cell = if r.kept.is_empty() {
            "-".to_string()
        } else if expected == 0 {
            let (e, f) = r
                .kept
                .iter()
                .fold((0, 0), |(e, f), k| (e + k.expected, f + k.kept));
            format!("({f}/{e})")
        } else {
            format!("{found}/{expected}")
        };
        let _ = writeln!(
            out,
            "{:<30} {:>8} {:>7} {:>7} {:>6} {:>5} {:>6} {:>6} {:>9} {:>10}",
            r.name,
            total[0],
            total[1],
            total[2],
            r.faults.values().sum::<u64>(),
            r.violations(),
            r.lost_fenced,
            r.lost_unfenced,
            r.refused,
            kept_cell
        );
        for (row, counts) in &r.ops {
            let e = ops.entry(row).or_default();
            for (t, n) in e.iter_mut().zip(counts) {
                *t += n;
            }
        }
        for (kind, n) in &r.faults {
            *faults.entry(kind.clone()).or_default() += n;
        }
        for (name, (c, v)) in &r.checks {
            let e = checks.entry(name.clone()).or_default();
            e.0 += c;
            e.1 += v;
        }
        criteria.extend(r.criteria.clone());
        kept.extend(r.kept.clone());
        lost_fenced += r.lost_fenced;
        lost_unfenced += r.lost_unfenced;
        refused += r.refused;
        accepted += r.accepted;
    }
    let _ = writeln!(
        out,
        "(kept: held locks found / expected after restarts and failovers; in parentheses when \
         only counted, not required)\n"
    );
    ops_table(&mut out, &ops);
    faults_table(&mut out, &faults);
    let _ = writeln!(out, "violations per check (must all be zero):");
    checks_table(&mut out, &checks, &criteria);
    let _ = writeln!(
        out,
        "lost updates: fenced {lost_fenced}, unfenced {lost_unfenced}; fenced writes accepted \
         {accepted}, refused {refused}"
    );
    kept_lines(&mut out, &kept);
    println!("{out}");
}
