//! `LOCK.SESSION KEEPALIVE` of a session holding 1, 100 and 10,000 locks (issue 19): server
//! instructions per call, counted by callgrind, against `LOCK.EXTEND` of each of N plain locks.
//! The counting is `benches/instructions/instructions_sessions.py` (the machinery of
//! `make bench-instructions`); this scenario runs it on the first server and reads its
//! `RESULT` lines. It needs `valgrind`; without it the section says so and sets no goal.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use super::{Env, Scenario};
use crate::config::Config;
use crate::report::{f, num, obj, ratio, s, Goal, Json};
use crate::server::Server;

/// `redis` or `valkey`, from `Redis 7.0.15`: the script adds the version.
fn product(name: &str) -> String {
    name.split(' ').next().unwrap_or("server").to_lowercase()
}

/// A count as the tables write it: `1`, `100`, `10,000`.
fn count(n: u64) -> String {
    if n >= 1000 {
        f(n as f64)
    } else {
        n.to_string()
    }
}

pub fn new() -> Box<dyn Scenario> {
    Box::new(SessionKeepalive {
        rows: Vec::new(),
        table: String::new(),
        skipped: None,
    })
}

pub struct SessionKeepalive {
    rows: Vec<Row>,
    /// The script's Markdown table.
    table: String,
    /// Why nothing was measured.
    skipped: Option<String>,
}

struct Row {
    server: String,
    setting: String,
    holds: u64,
    keepalive: f64,
    extend: f64,
}

impl SessionKeepalive {
    fn measure(&mut self, env: &mut Env) -> Result<(), String> {
        if env.cfg.existing_port.is_some() {
            return Err("a `REDIS_URL` run: callgrind needs a server of its own".into());
        }
        let has_valgrind = Command::new("valgrind")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !has_valgrind {
            return Err("`valgrind` is not installed (`apt-get install valgrind`)".into());
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let script = root.join("benches/instructions/instructions_sessions.py");
        let out = Command::new("python3")
            .arg(&script)
            .env(
                "REDIS_SERVERS",
                format!("{}={}", product(&Server::name(env.ctl)), env.cfg.server_bin),
            )
            .env("REDIS_LOCK_MODULE", &env.cfg.module)
            .env("QUICK", if env.cfg.quick { "1" } else { "" })
            .env("OUT_DIR", &env.cfg.out.dir)
            .output()
            .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(format!(
                "{} failed: {}{}",
                script.display(),
                text.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        for line in text.lines() {
            let cells: Vec<&str> = line.split('\t').collect();
            if let ["RESULT", server, setting, holds, keepalive, extend] = cells[..] {
                let num = |x: &str| x.parse::<f64>().map_err(|_| format!("bad RESULT {line:?}"));
                self.rows.push(Row {
                    server: server.into(),
                    setting: setting.into(),
                    holds: holds.parse().map_err(|_| format!("bad RESULT {line:?}"))?,
                    keepalive: num(keepalive)?,
                    extend: num(extend)?,
                });
            } else if line.starts_with('|') {
                self.table.push_str(line);
                self.table.push('\n');
            }
        }
        if self.rows.is_empty() {
            return Err(format!("{} printed no RESULT line", script.display()));
        }
        Ok(())
    }
}

impl Scenario for SessionKeepalive {
    fn run(&mut self, env: &mut Env) {
        eprintln!("[s2] session keepalive: instructions per call under callgrind (python3 benches/instructions/instructions_sessions.py)");
        if let Err(why) = self.measure(env) {
            eprintln!("session_keepalive: not measured: {why}");
            self.skipped = Some(why);
        }
    }
    fn intro(&self, o: &mut String, _cfg: &Config) {
        let _ = writeln!(
            o,
            "A session holding N locks (N = 1, 100, 10,000) is kept alive by one \
             `LOCK.SESSION KEEPALIVE id`; N plain locks need N `LOCK.EXTEND key owner ttl`. \
             Server instructions per call, counted by `valgrind --tool=callgrind` with the \
             machinery of `make bench-instructions`: \
             `python3 benches/instructions/instructions_sessions.py` (its docstring has the \
             details) on the first server's binary, started afresh under callgrind with `appendonly yes` + \
             `appendfsync everysec` (so the *bare* in the heading below is only where the \
             scenario ran, not the measured server's setting). Instruction \
             counts repeat to within about 1%; CPU time here does not.\n"
        );
    }
    fn markdown(&self, o: &mut String) {
        if let Some(why) = &self.skipped {
            let _ = writeln!(o, "Not measured: {why}.\n");
            return;
        }
        o.push_str(&self.table);
        o.push('\n');
    }
    fn goals(&self) -> Vec<Goal> {
        let (Some(lo), Some(hi)) = (
            self.rows.iter().min_by_key(|r| r.holds),
            self.rows.iter().max_by_key(|r| r.holds),
        ) else {
            return Vec::new();
        };
        // Flat: the most and the fewest instructions of any N, whichever N they are at.
        let most = self
            .rows
            .iter()
            .map(|r| r.keepalive)
            .fold(f64::MIN, f64::max);
        let fewest = self
            .rows
            .iter()
            .map(|r| r.keepalive)
            .fold(f64::MAX, f64::min);
        vec![Goal {
            goal: format!(
                "`LOCK.SESSION KEEPALIVE` server instructions flat from {} to {} holds (most / fewest <= 1.10; callgrind, {})",
                count(lo.holds),
                count(hi.holds),
                lo.setting
            ),
            measured: format!(
                "{} ({} at {} holds, {} at {}); {} `LOCK.EXTEND`s instead: {} ({} the keepalive)",
                ratio(most / fewest),
                f(hi.keepalive),
                count(hi.holds),
                f(lo.keepalive),
                count(lo.holds),
                count(hi.holds),
                f(hi.extend),
                ratio(hi.extend / hi.keepalive)
            ),
            met: most / fewest <= 1.10,
        }]
    }
    fn json(&self) -> Json {
        if let Some(why) = &self.skipped {
            return obj(vec![("not_measured", s(why.as_str()))]);
        }
        Json::Arr(
            self.rows
                .iter()
                .map(|r| {
                    obj(vec![
                        ("server", s(r.server.as_str())),
                        ("setting", s(r.setting.as_str())),
                        ("holds", num(r.holds as f64)),
                        ("keepalive_instructions", num(r.keepalive)),
                        ("extends_instructions", num(r.extend)),
                    ])
                })
                .collect(),
        )
    }
}
