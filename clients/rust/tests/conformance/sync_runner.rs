//! The cases run with the sync API (`redis_lock_client::Client` and its lock types).

use std::collections::HashMap;
use std::sync::mpsc;
use std::time::Duration;

use redis::{Connection, Value};
use redis_lock_client::{
    Client, Election, Error, Guard, Leadership, MultiLock, Observer, ReadWriteLock, Semaphore,
    Session,
};

use crate::json::Json;
use crate::{
    check, check_error, expect, fail, field, from_value, ms, needs, poll, report, same,
    unsupported, Outcome, Vars, STEP_DEADLINE,
};

/// A step's failure: the client's error (an outcome the step may expect), a wait for a change
/// that ran out (the timeout outcome: `Observer::next_timeout` answers `None`), or the case's.
pub enum StepErr {
    Client(Error),
    TimedOut,
    Case(Outcome),
}

impl From<Error> for StepErr {
    fn from(e: Error) -> StepErr {
        StepErr::Client(e)
    }
}

impl From<Outcome> for StepErr {
    fn from(o: Outcome) -> StepErr {
        StepErr::Case(o)
    }
}

/// What kind of lock an object is, and on which keys.
#[derive(Clone)]
pub enum Kind {
    Exclusive(String),
    Semaphore(String, u32),
    Read(String),
    Write(String),
    Multi(Vec<String>),
}

/// A lock object of the vocabulary: what to acquire and how; its guard while held.
#[derive(Clone)]
struct Spec {
    kind: Kind,
    client: Client,
    ttl: Duration,
    /// Start the guard's watchdog once granted.
    watchdog: bool,
}

impl Spec {
    fn acquire(&self, wait: Option<Duration>) -> Result<Option<Guard>, Error> {
        let mut granted = self.take(wait)?;
        if let (Some(guard), true) = (granted.as_mut(), self.watchdog) {
            guard.start_watchdog()?;
        }
        Ok(granted)
    }

    fn take(&self, wait: Option<Duration>) -> Result<Option<Guard>, Error> {
        let (c, ttl) = (&self.client, self.ttl);
        match (&self.kind, wait) {
            (Kind::Exclusive(k), None) => c.acquire(k, ttl),
            (Kind::Exclusive(k), Some(w)) => c.acquire_blocking(k, ttl, w),
            (Kind::Semaphore(k, n), None) => Semaphore::new(c, k, *n).acquire(ttl),
            (Kind::Semaphore(k, n), Some(w)) => Semaphore::new(c, k, *n).acquire_blocking(ttl, w),
            (Kind::Read(k), None) => ReadWriteLock::new(c, k).read(ttl),
            (Kind::Read(k), Some(w)) => ReadWriteLock::new(c, k).read_blocking(ttl, w),
            (Kind::Write(k), None) => ReadWriteLock::new(c, k).write(ttl),
            (Kind::Write(k), Some(w)) => ReadWriteLock::new(c, k).write_blocking(ttl, w),
            (Kind::Multi(keys), None) => MultiLock::new(c, keys).acquire(ttl),
            (Kind::Multi(keys), Some(w)) => MultiLock::new(c, keys).acquire_blocking(ttl, w),
        }
    }
}

/// The lock kind a `lock`/`semaphore`/... step makes (shared with the async runner).
pub fn kind_of(step: &Json) -> Kind {
    let key = step.str("key").to_string();
    match step.str("do") {
        "semaphore" => Kind::Semaphore(
            key,
            step.get("limit").and_then(Json::as_i64).unwrap_or(1) as u32,
        ),
        "read_lock" => Kind::Read(key),
        "write_lock" => Kind::Write(key),
        "multilock" => Kind::Multi(step.strings("keys")),
        _ => Kind::Exclusive(key),
    }
}

/// The steps the crate has no counterpart of, and why (shared with the async runner).
pub fn not_in_the_crate(step: &Json) -> Option<Outcome> {
    if step.get("lock_delay").is_some() && step.str("do") != "session" {
        return Some(unsupported(
            "the crate takes no LOCKDELAY for a plain hold (only a session's lock_delay)",
        ));
    }
    match step.str("do") {
        "hold" => Some(unsupported(
            "the crate has no scoped form that fails busy: acquire answers Ok(None)",
        )),
        _ => None,
    }
}

/// A background acquire: its lock object, its outcome when it comes, and its wait.
type Pending = (
    String,
    mpsc::Receiver<Result<Option<Guard>, Error>>,
    Duration,
);

struct Runner<'a> {
    nodes: &'a crate::Nodes,
    cluster: bool,
    base: Client,
    conn: Connection,
    vars: Vars,
    locks: HashMap<String, (Spec, Option<Guard>)>,
    sessions: HashMap<String, Session>,
    elections: HashMap<String, Election>,
    leaderships: HashMap<String, Leadership>,
    watches: HashMap<String, Observer>,
    pending: HashMap<String, Pending>,
}

impl Runner<'_> {
    fn raw(&mut self, command: &Json) -> Result<Json, StepErr> {
        let args = self.vars.subst(command)?;
        let args = args.as_array().unwrap_or(&[]);
        let word = |v: &Json| v.as_str().map_or_else(|| v.to_pretty(0), str::to_string);
        let mut cmd = redis::cmd(&word(&args[0]));
        for a in &args[1..] {
            cmd.arg(word(a));
        }
        let reply: Value = match self.cluster {
            true => self.nodes.cluster_query(&cmd),
            false => cmd.query(&mut self.conn),
        }
        .map_err(Error::Server)?;
        Ok(from_value(&reply))
    }

    fn client_for(&self, step: &Json) -> Result<Client, Error> {
        let mut c = self.base.clone();
        if self.cluster {
            // The crate's routing: the client of the node that serves the (first) key.
            let keys = step.strings("keys");
            c = c.for_key(keys.first().map_or(step.str("key"), String::as_str))?;
        }
        if let Some(owner) = step.get("owner").and_then(Json::as_str) {
            c = c.with_owner(owner);
        }
        if let Some(s) = step.get("session").and_then(Json::as_str) {
            c = c.with_session(&self.sessions[s]);
        }
        if let Some(n) = step.get("durable").and_then(Json::as_i64) {
            let t = step
                .get("durable_timeout")
                .map_or(Duration::from_secs(1), |_| ms(step, "durable_timeout"));
            c = c.durable(n as u32, t);
        }
        if step.get("report_loss").and_then(Json::as_bool) == Some(true) {
            c = c.watch_losses();
        }
        Ok(c)
    }

    fn guard(&self, step: &Json) -> Result<&Guard, StepErr> {
        match self.locks.get(step.str("lock")) {
            Some((_, Some(g))) => Ok(g),
            _ => Err(fail(format!(
                "{}: {} holds nothing",
                step.str("do"),
                step.str("lock")
            ))
            .into()),
        }
    }

    fn waiters(&mut self, key: &str) -> Result<i64, StepErr> {
        let info = self.raw(&Json::Arr(vec![
            Json::Str("LOCK.INFO".into()),
            Json::Str(key.into()),
        ]))?;
        Ok(field(&info, "waiters")
            .and_then(|v| v.as_i64())
            .unwrap_or(0))
    }

    fn step(&mut self, step: &Json) -> Result<(), StepErr> {
        if let Some(skip) = not_in_the_crate(step) {
            return Err(skip.into());
        }
        let name = step.str("as").to_string();
        let wait = step.get("wait").map(|_| ms(step, "wait"));
        match step.str("do") {
            "lock" | "semaphore" | "read_lock" | "write_lock" | "multilock" => {
                let spec = Spec {
                    kind: kind_of(step),
                    client: self.client_for(step)?,
                    ttl: ms(step, "ttl"),
                    watchdog: step.get("watchdog") == Some(&Json::Bool(true)),
                };
                if step.get("error").is_some() {
                    // The crate takes the ttl at acquire: its refusal is checked there.
                    spec.acquire(None)?;
                }
                self.locks.insert(name, (spec, None));
            }
            "session" => {
                let mut b = Session::builder(&self.base, ms(step, "ttl"))
                    .bound(step.get("bound") == Some(&Json::Bool(true)));
                if step.get("lock_delay").is_some() {
                    b = b.lock_delay(ms(step, "lock_delay"));
                }
                self.sessions.insert(name, b.open()?);
            }
            "election" => {
                let client = self.client_for(step)?;
                self.elections.insert(
                    name,
                    Election::new(&client, step.str("key"), ms(step, "ttl")),
                );
            }
            "acquire" => {
                let entry = self.locks.get_mut(step.str("lock")).expect("lock");
                let got = entry.0.acquire(wait)?;
                let granted = got.is_some();
                if granted {
                    entry.1 = got;
                }
                expect(step, Json::Bool(granted))?;
            }
            "start_acquire" => {
                let spec = self.locks[step.str("lock")].0.clone();
                let (tx, rx) = mpsc::channel();
                std::thread::spawn(move || {
                    let _ = tx.send(spec.acquire(wait));
                });
                self.pending.insert(
                    name,
                    (step.str("lock").to_string(), rx, wait.unwrap_or_default()),
                );
            }
            "finish" => {
                let (lock, rx, wait) = self.pending.remove(step.str("pending")).expect("pending");
                let got = rx
                    .recv_timeout(wait + STEP_DEADLINE)
                    .map_err(|_| fail("the wait did not end".into()))??;
                let granted = got.is_some();
                if granted {
                    self.locks.get_mut(&lock).expect("lock").1 = got;
                }
                expect(step, Json::Bool(granted))?;
            }
            "cancel" => {
                return Err(unsupported(
                    "a sync wait cannot be cancelled: it ends at its wait or I/O timeout",
                )
                .into())
            }
            "release" => {
                let guard = self
                    .locks
                    .get_mut(step.str("lock"))
                    .and_then(|e| e.1.take());
                let released = match guard {
                    Some(g) => g.release()?,
                    None => false,
                };
                expect(step, Json::Bool(released))?;
            }
            "extend" => {
                let held = self.guard(step)?.extend(ms(step, "ttl"))?;
                expect(step, Json::Bool(held))?;
            }
            "held" => {
                let held = match &self.locks[step.str("lock")].1 {
                    Some(g) => g.is_held()?,
                    None => false,
                };
                expect(step, Json::Bool(held))?;
            }
            "token" => {
                let token = self.locks[step.str("lock")].1.as_ref().map(Guard::token);
                self.vars.check_token(step, token)?;
            }
            "fenced" => {
                let words = step.strings("command");
                let mut cmd = redis::cmd(&words[0]);
                for w in &words[1..] {
                    cmd.arg(w);
                }
                let reply: Value = self.guard(step)?.fenced(&cmd)?;
                expect(step, from_value(&reply))?;
            }
            "fenced_script" => {
                let keys = step.strings("keys");
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                let args = step.strings("args");
                let reply: Value =
                    self.guard(step)?
                        .fenced_script(step.str("body"), &keys, &args)?;
                expect(step, from_value(&reply))?;
            }
            "raw" => {
                let got = self.raw(step.get("command").expect("command"))?;
                if let Some(want) = step.get("expect") {
                    let want = self.vars.subst(want)?;
                    check!(
                        same(&got, &want),
                        "{:?}: got {got:?}, wanted {want:?}",
                        step.strings("command")
                    );
                }
                if let Some(save) = step.get("save").and_then(Json::as_str) {
                    self.vars.save(save, got);
                }
            }
            "wait_raw" => {
                let want = crate::RawWanted::of(step, &self.vars)?;
                let command = step.get("command").expect("command").clone();
                poll("wait_raw", ms(step, "timeout"), || {
                    Ok(want.matches(&self.raw(&command).map_err(as_outcome)?))
                })?;
            }
            "wait_waiters" => {
                let (key, count) = (
                    step.str("key").to_string(),
                    step.get("count").and_then(Json::as_i64),
                );
                poll("waiters", STEP_DEADLINE, || {
                    Ok(Some(self.waiters(&key).map_err(as_outcome)?) == count)
                })?;
            }
            "kill_session_connection" => {
                let id = self.sessions[step.str("session")].id().to_string();
                let info = self.raw(&Json::Arr(
                    ["LOCK.SESSION", "INFO", &id]
                        .map(|s| Json::Str(s.into()))
                        .to_vec(),
                ))?;
                let bound = field(&info, "bound").and_then(|v| v.as_i64());
                check!(bound.is_some(), "the session is not bound");
                let killed = self.raw(&Json::Arr(vec![
                    Json::Str("CLIENT".into()),
                    Json::Str("KILL".into()),
                    Json::Str("ID".into()),
                    Json::Num(bound.unwrap()),
                ]))?;
                check!(killed == Json::Num(1), "CLIENT KILL answered {killed:?}");
            }
            "wait_session_lost" => {
                let s = &self.sessions[step.str("session")];
                poll("the session reported lost", ms(step, "timeout"), || {
                    Ok(s.is_lost())
                })?;
            }
            "wait_lost" => {
                let g = self.guard(step)?;
                check!(
                    g.wait_lost(ms(step, "timeout")).is_some(),
                    "the hold was not reported lost"
                );
            }
            "close_session" => {
                let s = self.sessions.remove(step.str("session")).expect("session");
                let closed = s.close()?;
                expect(step, closed.map_or(Json::Null, |n| Json::Num(n as i64)))?;
            }
            "campaign" => {
                let e = &self.elections[step.str("election")];
                let got = e.campaign_for(step.str("value"), wait.unwrap_or_default())?;
                expect(step, Json::Bool(got.is_some()))?;
                if let Some(l) = got {
                    if let Some(save) = step.get("save_term").and_then(Json::as_str) {
                        self.vars.save(save, Json::Num(l.term() as i64));
                    }
                    self.leaderships.insert(name, l);
                }
            }
            "leader" => {
                let leader = self.elections[step.str("election")].leader()?;
                expect(step, leader.map_or(Json::Null, |l| Json::Str(l.value)))?;
            }
            "resign" => {
                let l = self
                    .leaderships
                    .remove(step.str("leadership"))
                    .expect("leadership");
                expect(step, Json::Bool(l.resign()?))?;
            }
            "watch" => {
                let w = self.base.watch(step.str("key"))?;
                self.watches.insert(name, w);
            }
            "observe" => {
                let w = self.elections[step.str("election")].observe()?;
                self.watches.insert(name, w);
            }
            "next_change" => {
                let change = self.watches[step.str("watch")].next_timeout(ms(step, "timeout"));
                let change = change.ok_or(StepErr::TimedOut)?;
                if let Some(want) = step.get("expect_holder") {
                    let got = change.leader.map_or(Json::Null, |l| Json::Str(l.value));
                    check!(&got == want, "next change: holder {got:?}, wanted {want:?}");
                }
            }
            "close_watch" => {
                self.watches.remove(step.str("watch"));
            }
            other => return Err(unsupported(&format!("the runner has no step {other:?}")).into()),
        }
        Ok(())
    }
}

fn as_outcome(e: StepErr) -> Outcome {
    match e {
        StepErr::Case(o) => o,
        StepErr::Client(e) => fail(format!("{e}")),
        StepErr::TimedOut => fail("timed out".into()),
    }
}

/// One step's outcome against what it expects (`error`, or none).
pub fn settle(step: &Json, result: Result<(), StepErr>) -> Result<(), Outcome> {
    let wanted = step.get("error").and_then(Json::as_str);
    match (result, wanted) {
        (Ok(()), None) => Ok(()),
        (Ok(()), Some(w)) => Err(fail(format!(
            "{}: wanted a {w} error, got none",
            step.str("do")
        ))),
        (Err(StepErr::Case(o)), _) => Err(o),
        (Err(StepErr::Client(e)), Some(_)) => check_error(step, &e),
        (Err(StepErr::TimedOut), Some("timeout")) => Ok(()),
        (Err(StepErr::TimedOut), _) => Err(fail(format!("{}: no change in time", step.str("do")))),
        (Err(StepErr::Client(e)), None) => Err(fail(format!("{}: {e}", step.str("do")))),
    }
}

fn run_case(nodes: &crate::Nodes, case: &Json) -> Result<(), Outcome> {
    needs(case)?;
    let _replica = crate::replica_for(case, &nodes.server);
    nodes.flush(case)?;
    let mut runner = Runner {
        nodes,
        cluster: crate::on_cluster(case),
        base: Client::open(&nodes.url(case)).map_err(|e| fail(e.to_string()))?,
        conn: nodes.server.conn(),
        vars: Vars::default(),
        locks: HashMap::new(),
        sessions: HashMap::new(),
        elections: HashMap::new(),
        leaderships: HashMap::new(),
        watches: HashMap::new(),
        pending: HashMap::new(),
    };
    for step in case.get("steps").and_then(Json::as_array).unwrap_or(&[]) {
        let result = runner.step(step);
        settle(step, result)?;
    }
    Ok(())
}

pub fn run_topic(topic: &str) {
    let nodes = crate::Nodes::start();
    let outcomes = crate::cases(topic)
        .iter()
        .map(|case| (case.str("description").to_string(), run_case(&nodes, case)))
        .collect();
    report("rust-sync", topic, outcomes);
}
