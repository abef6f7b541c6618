//! The conformance suite (`<repo>/conformance/cases/*.json`) run by the Rust client, sync and async.
//!
//! One test per topic file and API (`sync_api::basic`, `async_api::basic`, ...) runs every case of
//! that file unchanged, each on a fresh keyspace of the topic's own server (a replica of it for a
//! case that needs one, a 3-master cluster for the cluster cases): `sync_runner.rs` and
//! `async_runner.rs` map each step of the vocabulary (conformance/README.md) to the crate's API,
//! and [`error_kind`] each [`Error`] to an outcome kind. A case this runner cannot run is counted
//! as skipped with its reason, never as passed; a failed case fails the topic's test, naming it.
//! The summary per topic goes to `target/conformance/rust-sync.json` and `rust-async.json`.
//!
//! `json.rs` is a small JSON reader (the workspace has no JSON crate).

mod async_runner;
mod json;
mod sync_runner;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use json::Json;
use redis::Value;
use redis_lock_client::Error;

/// The longest a step may take beyond the wait it asks for: no case hangs its runner.
pub const STEP_DEADLINE: Duration = Duration::from_secs(30);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The cases of `conformance/cases/<topic>.json`.
pub fn cases(topic: &str) -> Vec<Json> {
    let path = repo()
        .join("conformance/cases")
        .join(format!("{topic}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let doc = json::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(doc.get("topic").and_then(Json::as_str), Some(topic));
    doc.get("cases")
        .and_then(Json::as_array)
        .expect("cases")
        .to_vec()
}

/// Why a case did not run: `kind` is "needs" (the environment lacks it) or "unsupported" (this
/// client or runner cannot do a step).
#[derive(Debug)]
pub struct Skip {
    pub kind: &'static str,
    pub reason: String,
}

/// A case's outcome: `Ok(())` passed, `Err(Outcome::Skipped)`, `Err(Outcome::Failed)`.
#[derive(Debug)]
pub enum Outcome {
    Skipped(Skip),
    Failed(String),
}

impl From<Skip> for Outcome {
    fn from(s: Skip) -> Outcome {
        Outcome::Skipped(s)
    }
}

pub fn unsupported(reason: &str) -> Outcome {
    Outcome::Skipped(Skip {
        kind: "unsupported",
        reason: reason.to_string(),
    })
}

pub fn fail(message: String) -> Outcome {
    Outcome::Failed(message)
}

/// `cond`, or the case fails with `message`.
#[macro_export]
macro_rules! check {
    ($cond:expr, $($message:tt)+) => {
        if !$cond {
            return Err($crate::fail(format!($($message)+)).into());
        }
    };
}

/// The vocabulary's outcome kind of an error (conformance/README.md, "Errors").
pub fn error_kind(e: &Error) -> String {
    match e {
        Error::StaleToken { .. } => "stale_token".into(),
        Error::NotDurable { .. } => "not_durable".into(),
        Error::InvalidArgument(_) => "invalid_argument".into(),
        Error::Server(_) => "server".into(),
        other => format!("unexpected {other:?}"),
    }
}

/// The error code of a server error (`WRONGTYPE`), if any.
pub fn error_code(e: &Error) -> Option<String> {
    match e {
        Error::Server(e) => e.code().map(str::to_string),
        _ => None,
    }
}

/// Checks an error against the step's `error` (and `code`).
pub fn check_error(step: &Json, e: &Error) -> Result<(), Outcome> {
    let want = step.str("error");
    let got = error_kind(e);
    check!(
        got == want,
        "{}: wanted a {want} error, got {got}: {e}",
        step.str("do")
    );
    if let Some(code) = step.get("code").and_then(Json::as_str) {
        check!(
            error_code(e).as_deref() == Some(code),
            "wanted code {code}, got {e}"
        );
    }
    Ok(())
}

/// A reply as the cases write it.
pub fn from_value(v: &Value) -> Json {
    match v {
        Value::Nil => Json::Null,
        Value::Int(n) => Json::Num(*n),
        Value::BulkString(b) => Json::Str(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Json::Str(s.clone()),
        Value::Okay => Json::Str("OK".into()),
        Value::Array(items) | Value::Set(items) => {
            Json::Arr(items.iter().map(from_value).collect())
        }
        Value::Map(pairs) => Json::Arr(
            pairs
                .iter()
                .flat_map(|(k, v)| [from_value(k), from_value(v)])
                .collect(),
        ),
        Value::Boolean(b) => Json::Bool(*b),
        other => Json::Str(format!("{other:?}")),
    }
}

/// The field `name` of a flat `[name, value, ...]` reply (LOCK.INFO, LOCK.SESSION INFO).
pub fn field(reply: &Json, name: &str) -> Option<Json> {
    let items = reply.as_array()?;
    items
        .chunks(2)
        .find(|p| p[0].as_str() == Some(name))
        .map(|p| p[1].clone())
}

/// Values the case saved (`save`, `save_term`), and "$name" replaced by them.
#[derive(Default)]
pub struct Vars(BTreeMap<String, Json>);

impl Vars {
    pub fn save(&mut self, name: &str, v: Json) {
        self.0.insert(name.to_string(), v);
    }

    pub fn get(&self, name: &str) -> Result<Json, Outcome> {
        self.0
            .get(name)
            .cloned()
            .ok_or_else(|| fail(format!("no saved value {name}")))
    }

    pub fn subst(&self, v: &Json) -> Result<Json, Outcome> {
        Ok(match v {
            Json::Str(s) if s.starts_with('$') => self.get(&s[1..])?,
            Json::Arr(items) => Json::Arr(
                items
                    .iter()
                    .map(|x| self.subst(x))
                    .collect::<Result<_, _>>()?,
            ),
            other => other.clone(),
        })
    }

    /// The `token` step's checks of `token`.
    pub fn check_token(&mut self, step: &Json, token: Option<u64>) -> Result<(), Outcome> {
        let got = token.map_or(Json::Null, |t| Json::Num(t as i64));
        if let Some(want) = step.get("expect") {
            check!(&got == want, "token {got:?}, wanted {want:?}");
        }
        if let Some(name) = step.get("greater_than").and_then(Json::as_str) {
            let earlier = self.get(name)?.as_i64().unwrap_or(i64::MAX);
            check!(
                got.as_i64().is_some_and(|t| t > earlier),
                "token {got:?} not greater than {earlier}"
            );
        }
        if let Some(name) = step.get("save").and_then(Json::as_str) {
            self.save(name, got);
        }
        Ok(())
    }
}

/// What `wait_raw` waits for: the reply `expect`, or a number `below` / `above` a bound.
pub struct RawWanted {
    expect: Option<Json>,
    below: Option<i64>,
    above: Option<i64>,
}

impl RawWanted {
    pub fn of(step: &Json, vars: &Vars) -> Result<RawWanted, Outcome> {
        Ok(RawWanted {
            expect: step.get("expect").map(|e| vars.subst(e)).transpose()?,
            below: step.get("below").and_then(Json::as_i64),
            above: step.get("above").and_then(Json::as_i64),
        })
    }

    pub fn matches(&self, got: &Json) -> bool {
        match (&self.expect, got.as_i64()) {
            (Some(want), _) => same(got, want),
            (None, Some(n)) => self.below.is_none_or(|b| n < b) && self.above.is_none_or(|a| n > a),
            (None, None) => false,
        }
    }
}

/// Replies compare as numbers when one side is a number and the other its digits.
pub fn same(got: &Json, want: &Json) -> bool {
    match (got, want) {
        (Json::Str(s), Json::Num(n)) => s.parse::<i64>().ok() == Some(*n),
        _ => got == want,
    }
}

/// The `expect` of a step, if any, against `got`.
pub fn expect(step: &Json, got: Json) -> Result<(), Outcome> {
    if let Some(want) = step.get("expect") {
        check!(
            &got == want,
            "{}: got {got:?}, wanted {want:?}",
            step.str("do")
        );
    }
    Ok(())
}

pub fn ms(step: &Json, name: &str) -> Duration {
    Duration::from_millis(step.get(name).and_then(Json::as_i64).unwrap_or(0) as u64)
}

/// Polls `cond` until it holds, for up to `timeout`.
pub fn poll(
    what: &str,
    timeout: Duration,
    mut cond: impl FnMut() -> Result<bool, Outcome>,
) -> Result<(), Outcome> {
    let end = Instant::now() + timeout;
    while !cond()? {
        check!(
            Instant::now() < end,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// The needs of a case this runner cannot meet, as a skip; a replica ([`replica_for`]) and a
/// cluster ([`Nodes`]) it can.
pub fn needs(case: &Json) -> Result<(), Outcome> {
    for need in case.get("needs").and_then(Json::as_array).unwrap_or(&[]) {
        match need.as_str().unwrap_or("?") {
            "replica" => {}
            "cluster" => {}
            other => {
                return Err(Outcome::Skipped(Skip {
                    kind: "needs",
                    reason: format!("needs a {other}: this runner starts none"),
                }))
            }
        }
    }
    Ok(())
}

/// For a case that needs a replica: one of `server`, in sync with it, kept for the case's run
/// (dropped after it, so the other cases see none).
pub fn replica_for(case: &Json, server: &harness::Server) -> Option<harness::Server> {
    let needs = case.get("needs").and_then(Json::as_array).unwrap_or(&[]);
    needs
        .iter()
        .any(|n| n.as_str() == Some("replica"))
        .then(|| {
            let replica = harness::Server::replica_of(server);
            harness::wait_for_replica_sync(server, &replica);
            replica
        })
}

/// True if the case runs on a cluster.
pub fn on_cluster(case: &Json) -> bool {
    let needs = case.get("needs").and_then(Json::as_array).unwrap_or(&[]);
    needs.iter().any(|n| n.as_str() == Some("cluster"))
}

/// Where a case's commands go: one server, or a 3-master cluster (started on first use by a
/// topic's test), whose raw commands follow `MOVED` to the node that serves their key, and whose
/// locks are made on `Client::for_key`'s client (the crate's routing).
pub struct Nodes {
    pub server: harness::Server,
    cluster: std::sync::OnceLock<Vec<harness::Server>>,
}

impl Nodes {
    /// Starts the server (the cluster waits for its first case).
    pub fn start() -> Nodes {
        Nodes {
            server: harness::Server::start(),
            cluster: std::sync::OnceLock::new(),
        }
    }

    pub fn cluster(&self) -> &[harness::Server] {
        self.cluster.get_or_init(|| {
            harness::cluster::start(3, 0, &harness::test_dir("conformance-cluster"))
        })
    }

    /// The URL the case's clients open: the server's, or the cluster's first node's.
    pub fn url(&self, case: &Json) -> String {
        match on_cluster(case) {
            true => self.cluster()[0].url(),
            false => self.server.url(),
        }
    }

    /// FLUSHALL on the server, or on every node of the cluster.
    pub fn flush(&self, case: &Json) -> Result<(), Outcome> {
        let servers = match on_cluster(case) {
            true => self.cluster(),
            false => std::slice::from_ref(&self.server),
        };
        for s in servers {
            redis::cmd("FLUSHALL")
                .query::<()>(&mut s.conn())
                .map_err(|e| fail(e.to_string()))?;
        }
        Ok(())
    }

    /// A raw command of a cluster case, sent to its key's node (the first node, then the one a
    /// `MOVED` names). Sync on purpose: the async runner calls it too (a test runner's check).
    pub fn cluster_query(&self, cmd: &redis::Cmd) -> redis::RedisResult<Value> {
        let nodes = self.cluster();
        match cmd.query::<Value>(&mut nodes[0].conn()) {
            Err(e) if e.kind() == redis::ErrorKind::Moved => {
                // `MOVED slot host:port`: the detail is `slot host:port`.
                let port = e
                    .detail()
                    .and_then(|d| d.rsplit(':').next()?.parse::<u16>().ok());
                let node = nodes
                    .iter()
                    .find(|n| Some(n.port()) == port)
                    .unwrap_or_else(|| {
                        panic!("no node of the cluster is the one MOVED names: {e}")
                    });
                cmd.query(&mut node.conn())
            }
            other => other,
        }
    }
}

// --- results -------------------------------------------------------------------------------

#[derive(Default)]
struct TopicResult {
    passed: usize,
    skipped: Vec<(String, Skip)>,
    failed: Vec<(String, String)>,
}

static RESULTS: Mutex<BTreeMap<&'static str, BTreeMap<String, TopicResult>>> =
    Mutex::new(BTreeMap::new());

/// Records the outcomes of a topic's cases for `client`, rewrites its results file, and panics
/// naming the failed cases, if any.
pub fn report(client: &'static str, topic: &str, outcomes: Vec<(String, Result<(), Outcome>)>) {
    let mut result = TopicResult::default();
    for (case, outcome) in outcomes {
        match outcome {
            Ok(()) => result.passed += 1,
            Err(Outcome::Skipped(s)) => {
                eprintln!("{client} {topic}: skipped {case:?}: {}", s.reason);
                result.skipped.push((case, s));
            }
            Err(Outcome::Failed(e)) => result.failed.push((case, e)),
        }
    }
    let failures: Vec<String> = result
        .failed
        .iter()
        .map(|(c, e)| format!("{c}: {e}"))
        .collect();
    let mut all = RESULTS.lock().unwrap_or_else(|p| p.into_inner());
    all.entry(client)
        .or_default()
        .insert(topic.to_string(), result);
    write(client, &all[client]);
    drop(all);
    assert!(
        failures.is_empty(),
        "{client} {topic}: {} case(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

fn write(client: &str, topics: &BTreeMap<String, TopicResult>) {
    let text = |s: &str| Json::Str(s.to_string());
    let topics = topics
        .iter()
        .map(|(topic, r)| {
            let skips = r.skipped.iter().map(|(c, s)| {
                Json::Obj(vec![
                    ("case".into(), text(c)),
                    ("kind".into(), text(s.kind)),
                    ("reason".into(), text(&s.reason)),
                ])
            });
            let failures = r
                .failed
                .iter()
                .map(|(c, e)| Json::Obj(vec![("case".into(), text(c)), ("error".into(), text(e))]));
            let fields = vec![
                ("failed".into(), Json::Num(r.failed.len() as i64)),
                ("failures".into(), Json::Arr(failures.collect())),
                ("passed".into(), Json::Num(r.passed as i64)),
                ("skipped".into(), Json::Num(r.skipped.len() as i64)),
                ("skips".into(), Json::Arr(skips.collect())),
            ];
            (topic.clone(), Json::Obj(fields))
        })
        .collect();
    let doc = Json::Obj(vec![
        ("client".into(), text(client)),
        ("runner".into(), text("clients/rust/tests/conformance")),
        ("topics".into(), Json::Obj(topics)),
    ]);
    let dir = repo().join("target/conformance");
    std::fs::create_dir_all(&dir).expect("target/conformance");
    std::fs::write(
        dir.join(format!("{client}.json")),
        format!("{}\n", doc.to_pretty(0)),
    )
    .expect("results file");
}

// --- one test per topic and API --------------------------------------------------------------

macro_rules! topics {
    ($($topic:ident),* $(,)?) => {
        /// The topic files this binary has a test for.
        const TOPICS: &[&str] = &[$(stringify!($topic)),*];

        mod sync_api {
            $(#[test]
            fn $topic() {
                crate::sync_runner::run_topic(stringify!($topic));
            })*
        }

        mod async_api {
            $(#[test]
            fn $topic() {
                crate::async_runner::run_topic(stringify!($topic));
            })*
        }
    };
}

topics!(
    basic, waits, cancel, fenced, shared, multikey, sessions, lock_delay, feed, elections, durable,
    cluster, errors, watchdog
);

#[test]
fn every_topic_file_has_a_test() {
    let mut files: Vec<String> = std::fs::read_dir(repo().join("conformance/cases"))
        .expect("conformance/cases/")
        .filter_map(|e| {
            e.ok()?
                .file_name()
                .into_string()
                .ok()?
                .strip_suffix(".json")
                .map(str::to_string)
        })
        .collect();
    files.sort();
    let mut known: Vec<String> = TOPICS.iter().map(|t| t.to_string()).collect();
    known.sort();
    assert_eq!(
        files, known,
        "add the new topic to topics!(...) in clients/rust/tests/conformance/main.rs"
    );
}
