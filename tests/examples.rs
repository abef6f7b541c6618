//! The use cases in `examples/` run against a real server, so they never rot:
//!
//! - `clients/python/examples/one_job.py`: of five worker processes exactly one runs the job, with the
//!   `redislock_native` package from `clients/python/` (needs redis-py: the test fails, naming
//!   `make test-deps`, when `python3 -c "import redis"` fails; it never passes without running).
//! - `clients/python/examples/concurrency_limit.py`: eight processes share a semaphore of three; never
//!   more than three calls run at once (same redis-py condition).
//! - `clients/python/examples/leader_election.py`: three candidates, each leader SIGKILLed in
//!   turn, the next one leads; an observer prints every change (same redis-py condition).
//! - `clients/node/examples/tokens.js`: tokens reach Node (ioredis) as exact numbers (fails when
//!   `node` or `clients/node/node_modules/ioredis` is missing; `make test` leaves it out with
//!   `--skip` where node is not installed, and says so).
//! - `examples/leader.rs`: two candidates take turns as leader with growing tokens, and a leader
//!   whose lease disappears says `lost`. The binary is `target/debug/examples/leader`, which
//!   `cargo test` builds; `cargo test --test examples` alone does not, so this file builds it
//!   first (see [`leader_bin`]).
//! - `examples/inventory.lua`: an order's items locked with `LOCK.MACQUIRE`, a fenced decrement
//!   of each; stale tokens and overdrafts change nothing.
//!
//! Child processes write to files in a scratch directory and are killed if they outlive a
//! deadline. Nothing sleeps to wait for them: the tests poll their output and the server.

mod common;

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Once;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use redis::{Connection, RedisResult, Value};

/// The longest any example process may run before the test kills it and fails. Generous: a
/// healthy run takes a second or two even on a busy machine.
const PATIENCE: Duration = Duration::from_secs(30);

/// A ttl long enough that no hold in these tests expires by accident.
const LONG_TTL: i64 = 100_000;

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

// --- Child processes -----------------------------------------------------------

/// A directory for the output of child processes, removed on drop unless the test is failing
/// (then its path is printed, for diagnosis).
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        let dir = std::env::temp_dir()
            .join("redis-lock-examples")
            .join(uuid::Uuid::new_v4().to_string());
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        Scratch(dir)
    }

    /// A file in the scratch directory opened for appending: children that share it write
    /// whole lines in the order they make them.
    fn append(&self, name: &str) -> File {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.0.join(name))
            .unwrap_or_else(|e| panic!("cannot open {name} in {}: {e}", self.0.display()))
    }

    fn read(&self, name: &str) -> String {
        fs::read_to_string(self.0.join(name)).unwrap_or_default()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if thread::panicking() {
            eprintln!("examples: keeping child output in {}", self.0.display());
        } else {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
}

/// Spawn `cmd` with stdout appended to `stdout` and stderr to `stderr` in `scratch`.
fn spawn(cmd: &mut Command, scratch: &Scratch, stdout: &str, stderr: &str) -> Child {
    cmd.stdin(Stdio::null())
        .stdout(scratch.append(stdout))
        .stderr(scratch.append(stderr))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// Wait for `child` to exit; kill it and panic with `stderr`'s content if it runs past
/// [`PATIENCE`].
fn wait_exit(child: &mut Child, what: &str, scratch: &Scratch, stderr: &str) -> ExitStatus {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(status) = child.try_wait().expect("cannot poll child") {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what} still running after {PATIENCE:?}; killed; stderr:\n{}",
                scratch.read(stderr)
            );
        }
        thread::sleep(Duration::from_millis(10));
    }
}

// --- Python: one job, one worker ------------------------------------------------

/// `python3` with this repository's `clients/python/` (the redislock_native package) first on
/// `PYTHONPATH`, ahead of whatever the caller's `PYTHONPATH` holds (`make test` puts
/// redis-py there).
fn python3() -> Command {
    let mut path = std::ffi::OsString::from(manifest_dir().join("clients/python"));
    if let Some(outer) = std::env::var_os("PYTHONPATH") {
        path.push(":");
        path.push(outer);
    }
    let mut cmd = Command::new("python3");
    cmd.env("PYTHONPATH", path);
    cmd
}

/// Fail (never pass) when redis-py is missing: a test that cannot run must not count as a pass.
#[track_caller]
fn require_redis_py() {
    assert!(
        python_has_redis(),
        "python3 cannot import redis-py: `make test-deps` puts it in target/pydeps (PYTHONPATH)"
    );
}

/// True if `python3` runs and imports redis-py.
fn python_has_redis() -> bool {
    python3()
        .args(["-c", "import redis"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

#[test]
fn python_one_job_runs_once() {
    require_redis_py();
    let server = Server::start();
    let scratch = Scratch::new();
    let script = manifest_dir().join("clients/python/examples/one_job.py");
    // Work for 1.5 leases, so the winner extends its hold while it works.
    let mut child = spawn(
        python3().arg(&script).args([
            "--port",
            &server.port().to_string(),
            "--workers",
            "5",
            "--ttl-ms",
            "600",
            "--work-ms",
            "900",
        ]),
        &scratch,
        "stdout",
        "stderr",
    );
    let status = wait_exit(&mut child, "one_job.py", &scratch, "stderr");
    let (stdout, stderr) = (scratch.read("stdout"), scratch.read("stderr"));
    assert!(
        status.success(),
        "one_job.py exited with {status}; stdout:\n{stdout}\nstderr:\n{stderr}"
    );

    // job=NAME workers=5 ran=1 runner=ID skipped=4 busy=.. done=.. lost=0 errors=0 extends=N
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "expected one summary line, got:\n{stdout}");
    let fields: Vec<(&str, &str)> = lines[0]
        .split(' ')
        .map(|f| {
            f.split_once('=')
                .unwrap_or_else(|| panic!("bad field {f:?}"))
        })
        .collect();
    let field = |name: &str| {
        fields
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("no {name}= in {:?}", lines[0]))
            .1
    };
    assert_eq!(field("workers"), "5", "{}", lines[0]);
    assert_eq!(field("ran"), "1", "{}", lines[0]);
    assert_eq!(field("skipped"), "4", "{}", lines[0]);
    assert_eq!(field("lost"), "0", "{}", lines[0]);
    assert_eq!(field("errors"), "0", "{}", lines[0]);
    let extends: u32 = field("extends").parse().expect("extends= is a number");
    assert!(extends >= 1, "the winner never extended: {}", lines[0]);

    // The server agrees: one run, by the runner, and the lock is free again.
    let job = format!("job:{}", field("job"));
    let mut conn = server.conn();
    let runs: Vec<String> = redis::cmd("LRANGE")
        .arg(format!("{job}:runs"))
        .arg(0)
        .arg(-1)
        .query(&mut conn)
        .expect("LRANGE runs");
    assert_eq!(runs, vec![field("runner").to_string()]);
    assert_absent(&mut conn, &job);
}

// --- Python: a concurrency limit (semaphore) --------------------------------------

/// `name=value` fields of a summary line, in order.
fn summary_fields(line: &str) -> Vec<(String, String)> {
    line.split(' ')
        .map(|f| {
            let (n, v) = f
                .split_once('=')
                .unwrap_or_else(|| panic!("bad field {f:?}"));
            (n.to_string(), v.to_string())
        })
        .collect()
}

#[test]
fn python_concurrency_limit_is_never_exceeded() {
    require_redis_py();
    let server = Server::start();
    let scratch = Scratch::new();
    let script = manifest_dir().join("clients/python/examples/concurrency_limit.py");
    let mut child = spawn(
        python3().arg(&script).args([
            "--port",
            &server.port().to_string(),
            "--limit",
            "3",
            "--workers",
            "8",
            "--calls",
            "4",
            "--work-ms",
            "15",
        ]),
        &scratch,
        "stdout",
        "stderr",
    );
    let status = wait_exit(&mut child, "concurrency_limit.py", &scratch, "stderr");
    let (stdout, stderr) = (scratch.read("stdout"), scratch.read("stderr"));
    assert!(
        status.success(),
        "concurrency_limit.py exited with {status}; stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "expected one summary line, got:\n{stdout}");
    let fields = summary_fields(lines[0]);
    let field = |name: &str| {
        fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {name}= in {:?}", lines[0]))
    };
    assert_eq!(field("calls"), "32", "{}", lines[0]);
    assert_eq!(field("errors"), "0", "{}", lines[0]);
    let most: i64 = field("max_in_flight").parse().unwrap();
    assert!(
        (1..=3).contains(&most),
        "more calls at once than permits: {}",
        lines[0]
    );
    // Every permit came back: the semaphore's key is gone.
    let mut conn = server.conn();
    assert_absent(&mut conn, &format!("limit:{}", field("api")));
}

// --- Python: leader election ------------------------------------------------------

/// `clients/python/examples/leader_election.py`: three candidates in bound sessions; each
/// leader is SIGKILLed in turn and the next one leads, the last resigns; the script's observer
/// prints every change and checks the order, the growing terms and the final "no leader".
#[test]
fn python_leader_election_survives_killed_leaders() {
    require_redis_py();
    let server = Server::start();
    let scratch = Scratch::new();
    let script = manifest_dir().join("clients/python/examples/leader_election.py");
    let mut child = spawn(
        python3()
            .arg(&script)
            .args(["--port", &server.port().to_string(), "--candidates", "3"]),
        &scratch,
        "stdout",
        "stderr",
    );
    let status = wait_exit(&mut child, "leader_election.py", &scratch, "stderr");
    let (stdout, stderr) = (scratch.read("stdout"), scratch.read("stderr"));
    assert!(
        status.success(),
        "leader_election.py exited with {status}; stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let changes: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("change "))
        .collect();
    assert_eq!(changes.len(), 4, "three leaders and no leader:\n{stdout}");
    assert_eq!(changes[3], "change leader=none resync=no", "{stdout}");
    let summary = stdout.lines().last().unwrap_or_default();
    let fields = summary_fields(summary);
    let field = |name: &str| {
        fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {name}= in {summary:?}"))
    };
    assert_eq!(field("leaders"), "cand-1,cand-2,cand-3", "{summary}");
    assert_eq!(field("terms_increasing"), "yes", "{summary}");
    let mut conn = server.conn();
    assert_absent(&mut conn, &field("election"));
}

// --- Node: exact tokens ------------------------------------------------------------

/// True if `node` runs and clients/node has its dependencies (`make test-deps` installs them).
fn node_ready() -> bool {
    manifest_dir()
        .join("clients/node/node_modules/ioredis")
        .is_dir()
        && Command::new("node")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
}

#[test]
fn node_tokens_are_exact_numbers() {
    assert!(
        node_ready(),
        "node or clients/node/node_modules/ioredis is missing: `make test-deps` installs them \
         (where node is not installed, `make test` leaves this test out with --skip and says so)"
    );
    let server = Server::start();
    let scratch = Scratch::new();
    let script = manifest_dir().join("clients/node/examples/tokens.js");
    let mut child = spawn(
        Command::new("node")
            .arg(&script)
            .args(["--port", &server.port().to_string()]),
        &scratch,
        "stdout",
        "stderr",
    );
    let status = wait_exit(&mut child, "tokens.js", &scratch, "stderr");
    let (stdout, stderr) = (scratch.read("stdout"), scratch.read("stderr"));
    assert!(
        status.success(),
        "tokens.js exited with {status}; stdout:\n{stdout}\nstderr:\n{stderr}"
    );

    // key=node-example:<uuid> first=T1 second=T2 exact=yes
    let fields: Vec<(&str, &str)> = stdout
        .trim_end()
        .split(' ')
        .map(|f| {
            f.split_once('=')
                .unwrap_or_else(|| panic!("bad field {f:?}"))
        })
        .collect();
    let [("key", key), ("first", first), ("second", second), ("exact", "yes")] = fields[..] else {
        panic!("unexpected output: {stdout:?}");
    };
    let (first, second): (u64, u64) = (first.parse().unwrap(), second.parse().unwrap());
    assert!(first < second && second < 1 << 53, "{stdout}");
    // The server's own high-water mark is the second token, printed exactly.
    assert_eq!(
        server.info_field("lock", "lock_token_high_water"),
        Some(second.to_string())
    );
    assert_absent(&mut server.conn(), key);
}

// --- Rust: leader election --------------------------------------------------------

/// `target/debug/examples/leader`, built if need be.
///
/// `cargo test` builds every example before it runs any test, but `cargo test --test examples`
/// builds only this test. So the first call runs `cargo build --example leader`, which is a
/// no-op when the binary is up to date and otherwise keeps it from being stale.
fn leader_bin() -> PathBuf {
    static BUILD: Once = Once::new();
    BUILD.call_once(|| {
        let out = Command::new(env!("CARGO"))
            .args(["build", "--quiet", "--example", "leader"])
            .current_dir(manifest_dir())
            .output()
            .expect("cannot run cargo");
        assert!(
            out.status.success(),
            "cargo build --example leader failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
    let bin = manifest_dir().join("target/debug/examples/leader");
    assert!(bin.is_file(), "{} not found", bin.display());
    bin
}

/// A leader candidate: `leader --url ... --id ID --lease-ms .. --run-ms .. --campaign-ms ..`.
fn leader(server: &Server, id: &str, lease_ms: u64, run_ms: u64) -> Command {
    let mut cmd = Command::new(leader_bin());
    cmd.args(["--url", &format!("redis://127.0.0.1:{}", server.port())])
        .args(["--id", id])
        .args(["--lease-ms", &lease_ms.to_string()])
        .args(["--run-ms", &run_ms.to_string()])
        .args(["--campaign-ms", "20000"]);
    cmd
}

/// One line of the leader's output.
#[derive(Debug, PartialEq)]
enum Event {
    /// `leader ID token T`
    Elected(String, i64),
    /// `resigned ID`
    Resigned(String),
    /// `lost ID`
    Lost(String),
}

fn events(output: &str) -> Vec<Event> {
    output
        .lines()
        .map(|line| match line.split(' ').collect::<Vec<_>>()[..] {
            ["leader", id, "token", token] => Event::Elected(
                id.to_string(),
                token
                    .parse()
                    .unwrap_or_else(|e| panic!("token in {line:?}: {e}")),
            ),
            ["resigned", id] => Event::Resigned(id.to_string()),
            ["lost", id] => Event::Lost(id.to_string()),
            _ => panic!("unexpected leader output line {line:?} in:\n{output}"),
        })
        .collect()
}

#[test]
fn leaders_take_turns_with_growing_tokens() {
    let server = Server::start();
    let scratch = Scratch::new();
    // Both candidates write to one file opened for appending, so its lines are in the order the
    // processes wrote them. A leader prints `resigned` before it releases the lease, and the
    // next one prints `leader` after it was granted: so the leaderships did not overlap if and
    // only if the lines alternate. The lease is renewed every 333 ms and survives a 667 ms
    // stall, plenty on a busy machine.
    let mut a = spawn(
        &mut leader(&server, "a", 1000, 800),
        &scratch,
        "out",
        "a.err",
    );
    let mut b = spawn(
        &mut leader(&server, "b", 1000, 800),
        &scratch,
        "out",
        "b.err",
    );
    let a_status = wait_exit(&mut a, "leader a", &scratch, "a.err");
    let b_status = wait_exit(&mut b, "leader b", &scratch, "b.err");
    let out = scratch.read("out");
    let diag = format!(
        "output:\n{out}\na stderr:\n{}\nb stderr:\n{}",
        scratch.read("a.err"),
        scratch.read("b.err")
    );
    assert!(
        a_status.success(),
        "leader a exited with {a_status}; {diag}"
    );
    assert!(
        b_status.success(),
        "leader b exited with {b_status}; {diag}"
    );

    let events = events(&out);
    let (first, t1, second, t2) = match &events[..] {
        [Event::Elected(a, t1), Event::Resigned(ra), Event::Elected(b, t2), Event::Resigned(rb)]
            if ra == a && rb == b =>
        {
            (a, t1, b, t2)
        }
        _ => panic!("expected leader X, resigned X, leader Y, resigned Y; {diag}"),
    };
    let mut ids = [first.as_str(), second.as_str()];
    ids.sort();
    assert_eq!(ids, ["a", "b"], "{diag}");
    assert!(t2 > t1, "the second leader's token is not larger; {diag}");

    let mut conn = server.conn();
    assert_absent(&mut conn, "election");
}

#[test]
fn leader_says_lost_when_its_lease_disappears() {
    let server = Server::start();
    let scratch = Scratch::new();
    let mut child = spawn(
        &mut leader(&server, "c", 1000, 20_000),
        &scratch,
        "out",
        "err",
    );
    wait_until("leader c to be elected", PATIENCE, || {
        scratch.read("out").starts_with("leader c token ")
    });
    let Event::Elected(_, token) = &events(&scratch.read("out"))[0] else {
        unreachable!("the first line was checked above");
    };
    let mut conn = server.conn();
    assert_eq!(
        fence(&mut conn, "election"),
        Some(*token),
        "LOCK.FENCE election"
    );

    // The lease disappears under the leader, as if it had lapsed; the next renewal sees it.
    let _: i64 = redis::cmd("DEL")
        .arg("election")
        .query(&mut conn)
        .expect("DEL election");
    let status = wait_exit(&mut child, "leader c", &scratch, "err");
    let out = scratch.read("out");
    assert_eq!(
        status.code(),
        Some(1),
        "leader c exited with {status}; output:\n{out}\nstderr:\n{}",
        scratch.read("err")
    );
    assert_eq!(
        events(&out),
        [Event::Elected("c".into(), *token), Event::Lost("c".into())],
        "output:\n{out}"
    );
}

// --- Lua: an order under its items' locks, with fenced writes -------------------------

/// Item `sku`'s lock and stock keys (one hash tag for the whole shop, as in inventory.md).
fn item(sku: u32) -> (String, String) {
    (
        format!("{{shop}}:sku:{sku}:lock"),
        format!("{{shop}}:sku:{sku}:stock"),
    )
}

/// `SCRIPT LOAD` examples/inventory.lua; returns its SHA1.
fn load_inventory(conn: &mut Connection) -> String {
    let path = manifest_dir().join("examples/inventory.lua");
    let source =
        fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(source)
        .query(conn)
        .expect("SCRIPT LOAD examples/inventory.lua")
}

/// `EVALSHA sha 2n lock stock ... token quantity ...` for `(sku, token, quantity)` lines.
fn take(conn: &mut Connection, sha: &str, lines: &[(u32, i64, i64)]) -> RedisResult<Value> {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(sha).arg(2 * lines.len());
    for (sku, _, _) in lines {
        let (lock, stock) = item(*sku);
        cmd.arg(lock).arg(stock);
    }
    for (_, token, quantity) in lines {
        cmd.arg(*token).arg(*quantity);
    }
    cmd.query(conn)
}

fn ints(values: &[i64]) -> RedisResult<Value> {
    Ok(Value::Array(
        values.iter().map(|v| Value::Int(*v)).collect(),
    ))
}

fn stocks(conn: &mut Connection, skus: &[u32]) -> Vec<String> {
    skus.iter()
        .map(|sku| {
            redis::cmd("GET")
                .arg(item(*sku).1)
                .query(conn)
                .expect("GET stock")
        })
        .collect()
}

/// `LOCK.MACQUIRE` on the locks of `skus` for `order`; the tokens.
fn lock_order(conn: &mut Connection, skus: &[u32], order: &str) -> Option<Vec<i64>> {
    let mut cmd = redis::cmd("LOCK.MACQUIRE");
    cmd.arg(skus.len());
    for sku in skus {
        cmd.arg(item(*sku).0);
    }
    cmd.arg(order)
        .arg(LONG_TTL)
        .query(conn)
        .expect("LOCK.MACQUIRE")
}

/// A server with the script loaded, 10 of item 42 and 4 of item 7 in stock.
fn inventory() -> (Server, Connection, String) {
    let server = Server::start();
    let mut conn = server.conn();
    let sha = load_inventory(&mut conn);
    let _: () = redis::cmd("MSET")
        .arg(item(42).1)
        .arg(10)
        .arg(item(7).1)
        .arg(4)
        .query(&mut conn)
        .expect("MSET stock");
    (server, conn, sha)
}

#[test]
fn inventory_live_tokens_decrement_every_item() {
    let (_server, mut conn, sha) = inventory();
    let t = lock_order(&mut conn, &[42, 7], "order-1001").expect("both locks");
    assert_eq!(
        take(&mut conn, &sha, &[(42, t[0], 3), (7, t[1], 1)]),
        ints(&[7, 3])
    );
    assert_eq!(take(&mut conn, &sha, &[(7, t[1], 2)]), ints(&[1]));
    assert_eq!(stocks(&mut conn, &[42, 7]), ["7", "1"]);
    assert_err(
        take(&mut conn, &sha, &[(42, t[0], 1), (7, t[1], 0)]),
        "ERR quantity must be a positive integer, got 0",
    );
    assert_err(
        take(&mut conn, &sha, &[(42, t[0], 1), (42, t[0], 1)]),
        &format!("ERR {} is listed twice", item(42).1),
    );
    assert_eq!(stocks(&mut conn, &[42, 7]), ["7", "1"]);

    // examples/inventory.md shows the script's SHA1: it must be this file's.
    let doc = fs::read_to_string(manifest_dir().join("examples/inventory.md"))
        .expect("read examples/inventory.md");
    assert!(
        doc.contains(&sha),
        "examples/inventory.md does not show the script's SHA1 {sha}: update it"
    );
}

#[test]
fn inventory_stale_token_refuses_the_whole_order() {
    let (_server, mut conn, sha) = inventory();
    let old = lock_order(&mut conn, &[42, 7], "order-1001").expect("both locks");
    assert_eq!(take(&mut conn, &sha, &[(42, old[0], 1)]), ints(&[9]));
    // A second order sharing item 7 gets nothing until the first releases its set.
    assert_eq!(lock_order(&mut conn, &[7, 99], "order-1002"), None);
    let released: i64 = redis::cmd("LOCK.MRELEASE")
        .arg(2)
        .arg(item(42).0)
        .arg(item(7).0)
        .arg("order-1001")
        .query(&mut conn)
        .unwrap();
    assert_eq!(released, 2);
    let new = lock_order(&mut conn, &[7, 99], "order-1002").expect("both locks");
    assert!(new[0] > old[1], "token {new:?} after {old:?}");

    // Item 42 is free, item 7 is someone else's: both old tokens are stale; nothing changes.
    let stale =
        |key: String, token: i64| format!("STALE token {token} is not the live hold on {key}");
    assert_err(
        take(&mut conn, &sha, &[(42, old[0], 1), (7, old[1], 1)]),
        &stale(item(42).0, old[0]),
    );
    assert_err(
        take(&mut conn, &sha, &[(7, old[1], 1)]),
        &stale(item(7).0, old[1]),
    );
    assert_eq!(stocks(&mut conn, &[42, 7]), ["9", "4"]);
    assert_eq!(take(&mut conn, &sha, &[(7, new[0], 4)]), ints(&[0]));
}

#[test]
fn inventory_never_goes_below_zero_and_an_overdraft_changes_nothing() {
    let (_server, mut conn, sha) = inventory();
    let t = lock_order(&mut conn, &[42, 7], "order-1001").expect("both locks");
    assert_err(
        take(&mut conn, &sha, &[(42, t[0], 1), (7, t[1], 5)]),
        &format!("NOSTOCK {} has 4, asked for 5", item(7).1),
    );
    assert_eq!(stocks(&mut conn, &[42, 7]), ["10", "4"]);
    assert_eq!(
        take(&mut conn, &sha, &[(42, t[0], 10), (7, t[1], 4)]),
        ints(&[0, 0])
    );
    assert_err(
        take(&mut conn, &sha, &[(42, t[0], 1)]),
        &format!("NOSTOCK {} has 0, asked for 1", item(42).1),
    );
    assert_eq!(stocks(&mut conn, &[42, 7]), ["0", "0"]);
}
