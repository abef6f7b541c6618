//! The report writer: BENCHMARKS.md and benches/results/results.json from the scenarios' results
//! (written by hand: no plotting or serialisation crate), and the facts about the machine.

use std::fmt::Write as _;
use std::fs;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::config::Config;
use crate::scenarios::{Entry, Scenario, Setting};

/// A JSON value, written by hand (no serialisation crate).
pub enum Json {
    Num(f64),
    Str(String),
    Bool(bool),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    pub fn write(&self, out: &mut String, indent: usize) {
        let pad = "  ".repeat(indent + 1);
        match self {
            Json::Num(x) if x.is_finite() => {
                if x.fract() == 0.0 && x.abs() < 1e15 {
                    let _ = write!(out, "{}", *x as i64);
                } else {
                    let _ = write!(out, "{}", (x * 1e4).round() / 1e4);
                }
            }
            Json::Num(_) => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Str(s) => {
                out.push('"');
                for ch in s.chars() {
                    match ch {
                        '"' => out.push_str("\\\""),
                        '\\' => out.push_str("\\\\"),
                        '\n' => out.push_str("\\n"),
                        c if (c as u32) < 0x20 => {
                            let _ = write!(out, "\\u{:04x}", c as u32);
                        }
                        c => out.push(c),
                    }
                }
                out.push('"');
            }
            Json::Arr(items) => {
                if items.iter().all(|i| matches!(i, Json::Num(_))) {
                    out.push('[');
                    for (i, item) in items.iter().enumerate() {
                        if i > 0 {
                            out.push_str(", ");
                        }
                        item.write(out, indent);
                    }
                    out.push(']');
                    return;
                }
                out.push_str("[\n");
                for (i, item) in items.iter().enumerate() {
                    out.push_str(&pad);
                    item.write(out, indent + 1);
                    out.push_str(if i + 1 < items.len() { ",\n" } else { "\n" });
                }
                out.push_str(&"  ".repeat(indent));
                out.push(']');
            }
            Json::Obj(fields) => {
                out.push_str("{\n");
                for (i, (k, v)) in fields.iter().enumerate() {
                    out.push_str(&pad);
                    Json::Str(k.clone()).write(out, indent + 1);
                    out.push_str(": ");
                    v.write(out, indent + 1);
                    out.push_str(if i + 1 < fields.len() { ",\n" } else { "\n" });
                }
                out.push_str(&"  ".repeat(indent));
                out.push('}');
            }
        }
    }
}

pub fn num(x: f64) -> Json {
    Json::Num(x)
}
pub fn s(x: impl Into<String>) -> Json {
    Json::Str(x.into())
}
pub fn obj(fields: Vec<(&str, Json)>) -> Json {
    Json::Obj(
        fields
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    )
}

/// A goal and whether this run met it.
pub struct Goal {
    pub goal: String,
    pub measured: String,
    pub met: bool,
}

impl Goal {
    /// A goal on the ratio `r` of `a` to `b`, measured as `1.23x (a vs b unit)`.
    pub fn ratio(
        goal: impl Into<String>,
        r: f64,
        (a, b): (f64, f64),
        unit: &str,
        met: bool,
    ) -> Goal {
        Goal {
            goal: goal.into(),
            measured: format!("{} ({} vs {} {unit})", ratio(r), f(a), f(b)),
            met,
        }
    }

    /// `what` per worker within 5% of each other, given the fewest and the most.
    pub fn spread(goal: impl Into<String>, min: u64, max: u64) -> Goal {
        Goal {
            goal: goal.into(),
            measured: format!(
                "min {min} / max {max} ({:.1}% apart)",
                (max - min) as f64 / max as f64 * 100.0
            ),
            met: min as f64 >= 0.95 * max as f64,
        }
    }
}

/// A compact number: 3 significant figures, thousands separated for large ones.
/// The *wait max ms* cell of a contention table: the longest completed wait (`waits` sorted),
/// or `>= x` when a starved worker's unfinished wait was longer.
pub fn max_wait(waits: &[f64], unfinished: &[f64]) -> String {
    let unfinished = unfinished.iter().copied().fold(0.0, f64::max);
    if unfinished > crate::stats::pct(waits, 100.0) {
        format!(">= {}", f(unfinished))
    } else {
        f(crate::stats::pct(waits, 100.0))
    }
}

pub fn f(x: f64) -> String {
    if !x.is_finite() {
        return "-".into();
    }
    let a = x.abs();
    if a >= 1000.0 {
        let n = x.round() as i64;
        let digits = n.abs().to_string();
        let mut out = String::new();
        for (i, ch) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(ch);
        }
        if n < 0 {
            out.insert(0, '-');
        }
        out
    } else if a >= 100.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

pub fn ratio(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2}x")
    } else {
        "-".into()
    }
}

pub fn verdict(met: bool) -> &'static str {
    if met {
        "**met**"
    } else {
        "**missed**"
    }
}

/// Where a scenario ran: the server and its setting.
pub struct Done {
    /// e.g. `Redis 7.0.15` or `Valkey 8.1.8`.
    pub server: String,
    pub setting: Setting,
    pub entry: &'static Entry,
    pub scenario: Box<dyn Scenario>,
}

impl Done {
    pub fn place(&self) -> String {
        format!("{}, {}", self.server, self.setting.label())
    }
}

pub struct Machine {
    pub cpus: usize,
    pub cpu_model: String,
    pub date: String,
    /// Every server of the run, with how it was started.
    pub servers: Vec<String>,
    pub module: String,
    pub started_here: bool,
    /// `git describe` of the working tree the module was built from.
    pub source: String,
    /// `/proc/loadavg` (1-minute) before and after the run: other work on the machine.
    pub load_before: String,
    pub load_after: String,
}

pub struct Report<'a> {
    pub cfg: &'a Config,
    pub machine: Machine,
    pub total_secs: f64,
    /// Every scenario run, in the order they ran.
    pub done: Vec<Done>,
    /// benches/results/instructions.md as `make bench-instructions` last wrote it, if it exists.
    pub instructions: Option<String>,
    /// The instruction-count goals read from benches/results/instructions.json: (where, goal).
    pub instruction_goals: Vec<(String, Goal)>,
}

impl Report<'_> {
    /// The scenarios' ids in report order, each once.
    fn ids(&self) -> Vec<&'static str> {
        let mut ids: Vec<&'static str> = Vec::new();
        for d in &self.done {
            if !ids.contains(&d.entry.id) {
                ids.push(d.entry.id);
            }
        }
        ids
    }

    pub fn markdown(&self) -> String {
        let mut o = String::new();
        let m = &self.machine;
        let _ = writeln!(o, "# Benchmarks\n");
        let _ = writeln!(
            o,
            "redis-lock against the classic client-side pattern (`SET key owner NX PX ttl`, an \
             owner-checked Lua release, retry loops) and against the lock libraries users pick \
             instead, **all measured in the same run on the same server**, contenders \
             alternating so that the machine's drift hits both. Only the ratios mean anything \
             across machines and runs. Written by `make bench` (`benches/lockbench/`, one file \
             per scenario; `benches/README.md` says what each one measures); do not edit by \
             hand.\n"
        );
        let _ = writeln!(o, "| | |\n|---|---|");
        let _ = writeln!(o, "| command | `{}` |", self.cfg.command);
        let _ = writeln!(
            o,
            "| run | {}{} s in all |",
            if self.cfg.quick {
                "QUICK smoke run (small counts; not the figures to quote), "
            } else {
                "full run, "
            },
            f(self.total_secs)
        );
        let _ = writeln!(o, "| date | {} |", m.date);
        for (i, srv) in m.servers.iter().enumerate() {
            let _ = writeln!(o, "| {} | {srv} |", if i == 0 { "servers" } else { "" });
        }
        let _ = writeln!(
            o,
            "| settings | *bare*: `--save \"\" --appendonly no`, no replica; *AOF everysec + \
             replica*: `--appendonly yes --appendfsync everysec` with one replica (module \
             loaded) attached; defaults otherwise. {} |",
            if m.started_here {
                "Every server started by the benchmark."
            } else {
                "The `REDIS_URL` server as it is."
            }
        );
        let _ = writeln!(o, "| module | {} |", m.module);
        let _ = writeln!(
            o,
            "| machine | {} cores (`nproc`), {}; the clients share the cores with the server |",
            m.cpus, m.cpu_model
        );
        let _ = writeln!(
            o,
            "| module source | {} |\n| load average (1 min) | {} before, {} after the run (anything above ~0 is other work sharing the cores) |\n",
            m.source, m.load_before, m.load_after
        );

        let _ = writeln!(o, "## Goals\n");
        let _ = writeln!(
            o,
            "| where | goal | measured | verdict |\n|---|---|---|---|"
        );
        for d in &self.done {
            for g in d.scenario.goals() {
                let _ = writeln!(
                    o,
                    "| {} | {} | {} | {} |",
                    d.place(),
                    g.goal,
                    g.measured,
                    verdict(g.met)
                );
            }
        }
        for (place, g) in &self.instruction_goals {
            let _ = writeln!(
                o,
                "| {place} | {} | {} | {} |",
                g.goal,
                g.measured,
                verdict(g.met)
            );
        }
        let _ = writeln!(
            o,
            "\nThe `-P 16` rows show the commands' own cost (the server reads 16 commands per \
             socket read). At `-P 1` the socket work per command, the same for every contender, \
             dominates the server's CPU, so ratios there sit closer to 1. Instruction counts \
             (which repeat to within 1%, unlike CPU time here) are in the next section.\n"
        );
        let _ = writeln!(o, "## Server instructions per operation (callgrind)\n");
        match &self.instructions {
            Some(text) => o.push_str(text),
            None => o.push_str("Not measured yet: run `make bench-instructions`.\n"),
        }
        o.push('\n');

        for (n, id) in self.ids().into_iter().enumerate() {
            let runs: Vec<&Done> = self.done.iter().filter(|d| d.entry.id == id).collect();
            let _ = writeln!(o, "## {}. {}\n", n + 1, runs[0].entry.title);
            runs[0].scenario.intro(&mut o, self.cfg);
            for d in runs {
                let _ = writeln!(o, "### {}\n", d.place());
                d.scenario.markdown(&mut o);
            }
        }
        o
    }

    pub fn json(&self) -> String {
        let m = &self.machine;
        let goals = self
            .done
            .iter()
            .flat_map(|d| {
                d.scenario.goals().into_iter().map(|g| {
                    obj(vec![
                        ("server", s(&d.server)),
                        ("setting", s(d.setting.id())),
                        ("goal", s(g.goal)),
                        ("measured", s(g.measured)),
                        ("met", Json::Bool(g.met)),
                    ])
                })
            })
            .collect();
        let scenarios = self
            .ids()
            .into_iter()
            .map(|id| {
                let runs = self
                    .done
                    .iter()
                    .filter(|d| d.entry.id == id)
                    .map(|d| {
                        obj(vec![
                            ("server", s(&d.server)),
                            ("setting", s(d.setting.id())),
                            ("results", d.scenario.json()),
                        ])
                    })
                    .collect();
                (id.to_string(), Json::Arr(runs))
            })
            .collect();
        let root = obj(vec![
            ("command", s(&self.cfg.command)),
            ("quick", Json::Bool(self.cfg.quick)),
            ("date", s(&m.date)),
            ("total_seconds", num(self.total_secs)),
            (
                "servers",
                Json::Arr(m.servers.iter().map(|x| s(x.as_str())).collect()),
            ),
            ("module", s(&m.module)),
            ("servers_started_by_benchmark", Json::Bool(m.started_here)),
            ("nproc", num(m.cpus as f64)),
            ("cpu_model", s(&m.cpu_model)),
            ("module_source", s(&m.source)),
            ("loadavg_before", s(&m.load_before)),
            ("loadavg_after", s(&m.load_after)),
            ("goals", Json::Arr(goals)),
            ("scenarios", Json::Obj(scenarios)),
        ]);
        let mut out = String::new();
        root.write(&mut out, 0);
        out.push('\n');
        out
    }
}

// ---------------------------------------------------------------------------------------------
// Machine facts
// ---------------------------------------------------------------------------------------------

/// `YYYY-MM-DD HH:MM UTC` from the system clock (civil-from-days, no date crate).
pub fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock before 1970")
        .as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60
    )
}

/// The 1-minute load average.
pub fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|t| t.split_whitespace().next().map(String::from))
        .unwrap_or_else(|| "?".into())
}

/// `git describe --always --dirty` of the crate, e.g. `1582b0e-dirty`.
pub fn git_describe() -> String {
    Command::new("git")
        .args([
            "-C",
            env!("CARGO_MANIFEST_DIR"),
            "describe",
            "--always",
            "--dirty",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| format!("commit `{}`", String::from_utf8_lossy(&o.stdout).trim()))
        .unwrap_or_else(|| "unknown (no git)".into())
}

pub fn cpu_model() -> String {
    fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}
