//! The cases run with the async API (`redis_lock_client::aio`), on a tokio runtime; a cancel is a
//! dropped future (the task that awaits the acquire aborted), and every step has a deadline.

use std::collections::HashMap;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::Value;
use redis_lock_client::aio::{Client, Guard, Leadership, Observer, Session};
use redis_lock_client::{Election, Error, MultiLock, ReadWriteLock, Semaphore};
use tokio::task::JoinHandle;

use crate::json::Json;
use crate::sync_runner::{kind_of, not_in_the_crate, settle, Kind, StepErr};
use crate::{
    check, expect, fail, field, from_value, ms, needs, report, same, unsupported, Outcome, Vars,
    STEP_DEADLINE,
};

#[derive(Clone)]
struct Spec {
    kind: Kind,
    client: Client,
    ttl: Duration,
    /// Start the guard's watchdog once granted.
    watchdog: bool,
}

impl Spec {
    async fn acquire(&self, wait: Option<Duration>) -> Result<Option<Guard>, Error> {
        let mut granted = self.take(wait).await?;
        if let (Some(guard), true) = (granted.as_mut(), self.watchdog) {
            guard.start_watchdog()?;
        }
        Ok(granted)
    }

    async fn take(&self, wait: Option<Duration>) -> Result<Option<Guard>, Error> {
        let (c, ttl) = (&self.client, self.ttl);
        match (&self.kind, wait) {
            (Kind::Exclusive(k), None) => c.acquire(k, ttl).await,
            (Kind::Exclusive(k), Some(w)) => c.acquire_blocking(k, ttl, w).await,
            (Kind::Semaphore(k, n), None) => Semaphore::new(c, k, *n).acquire(ttl).await,
            (Kind::Semaphore(k, n), Some(w)) => {
                Semaphore::new(c, k, *n).acquire_blocking(ttl, w).await
            }
            (Kind::Read(k), None) => ReadWriteLock::new(c, k).read(ttl).await,
            (Kind::Read(k), Some(w)) => ReadWriteLock::new(c, k).read_blocking(ttl, w).await,
            (Kind::Write(k), None) => ReadWriteLock::new(c, k).write(ttl).await,
            (Kind::Write(k), Some(w)) => ReadWriteLock::new(c, k).write_blocking(ttl, w).await,
            (Kind::Multi(keys), None) => MultiLock::new(c, keys).acquire(ttl).await,
            (Kind::Multi(keys), Some(w)) => MultiLock::new(c, keys).acquire_blocking(ttl, w).await,
        }
    }
}

type Pending = (String, JoinHandle<Result<Option<Guard>, Error>>);

struct Runner<'a> {
    nodes: &'a crate::Nodes,
    cluster: bool,
    base: Client,
    conn: MultiplexedConnection,
    vars: Vars,
    locks: HashMap<String, (Spec, Option<Guard>)>,
    sessions: HashMap<String, Session>,
    elections: HashMap<String, Election<Client>>,
    leaderships: HashMap<String, Leadership>,
    watches: HashMap<String, Observer>,
    pending: HashMap<String, Pending>,
}

fn words(v: &[&str]) -> Json {
    Json::Arr(v.iter().map(|s| Json::Str(s.to_string())).collect())
}

impl Runner<'_> {
    async fn raw(&mut self, command: &Json) -> Result<Json, StepErr> {
        let args = self.vars.subst(command)?;
        let args = args.as_array().unwrap_or(&[]);
        let word = |v: &Json| v.as_str().map_or_else(|| v.to_pretty(0), str::to_string);
        let mut cmd = redis::cmd(&word(&args[0]));
        for a in &args[1..] {
            cmd.arg(word(a));
        }
        let reply: Value = match self.cluster {
            true => self.nodes.cluster_query(&cmd),
            false => cmd.query_async(&mut self.conn).await,
        }
        .map_err(Error::Server)?;
        Ok(from_value(&reply))
    }

    async fn client_for(&self, step: &Json) -> Result<Client, Error> {
        let mut c = self.base.clone();
        if self.cluster {
            // The crate's routing: the client of the node that serves the (first) key.
            let keys = step.strings("keys");
            c = c
                .for_key(keys.first().map_or(step.str("key"), String::as_str))
                .await?;
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

    async fn poll_raw(
        &mut self,
        what: &str,
        command: &Json,
        timeout: Duration,
        want: impl Fn(&Json) -> bool,
    ) -> Result<(), StepErr> {
        let end = tokio::time::Instant::now() + timeout;
        while !want(&self.raw(command).await?) {
            check!(
                tokio::time::Instant::now() < end,
                "timed out after {timeout:?} waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    async fn step(&mut self, step: &Json) -> Result<(), StepErr> {
        if let Some(skip) = not_in_the_crate(step) {
            return Err(skip.into());
        }
        let name = step.str("as").to_string();
        let wait = step.get("wait").map(|_| ms(step, "wait"));
        match step.str("do") {
            "lock" | "semaphore" | "read_lock" | "write_lock" | "multilock" => {
                let spec = Spec {
                    kind: kind_of(step),
                    client: self.client_for(step).await?,
                    ttl: ms(step, "ttl"),
                    watchdog: step.get("watchdog") == Some(&Json::Bool(true)),
                };
                if step.get("error").is_some() {
                    spec.acquire(None).await?; // the crate takes the ttl at acquire
                }
                self.locks.insert(name, (spec, None));
            }
            "session" => {
                let mut b = Session::builder(&self.base, ms(step, "ttl"))
                    .bound(step.get("bound") == Some(&Json::Bool(true)));
                if step.get("lock_delay").is_some() {
                    b = b.lock_delay(ms(step, "lock_delay"));
                }
                self.sessions.insert(name, b.open().await?);
            }
            "election" => {
                let client = self.client_for(step).await?;
                self.elections.insert(
                    name,
                    Election::new(&client, step.str("key"), ms(step, "ttl")),
                );
            }
            "acquire" => {
                let entry = self.locks.get_mut(step.str("lock")).expect("lock");
                let got = entry.0.acquire(wait).await?;
                let granted = got.is_some();
                if granted {
                    entry.1 = got;
                }
                expect(step, Json::Bool(granted))?;
            }
            "start_acquire" => {
                let spec = self.locks[step.str("lock")].0.clone();
                let task = tokio::spawn(async move { spec.acquire(wait).await });
                self.pending
                    .insert(name, (step.str("lock").to_string(), task));
            }
            "finish" => {
                let (lock, task) = self.pending.remove(step.str("pending")).expect("pending");
                let got = task
                    .await
                    .map_err(|e| fail(format!("the wait's task: {e}")))??;
                let granted = got.is_some();
                if granted {
                    self.locks.get_mut(&lock).expect("lock").1 = got;
                }
                expect(step, Json::Bool(granted))?;
            }
            "cancel" => {
                let (_lock, task) = self.pending.remove(step.str("pending")).expect("pending");
                task.abort(); // drops the acquire's future
                let ended = task.await;
                check!(
                    matches!(&ended, Err(e) if e.is_cancelled()),
                    "the wait ended before it was cancelled"
                );
            }
            "release" => {
                let guard = self
                    .locks
                    .get_mut(step.str("lock"))
                    .and_then(|e| e.1.take());
                let released = match guard {
                    Some(g) => g.release().await?,
                    None => false,
                };
                expect(step, Json::Bool(released))?;
            }
            "extend" => {
                let held = self.guard(step)?.extend(ms(step, "ttl")).await?;
                expect(step, Json::Bool(held))?;
            }
            "held" => {
                let held = match &self.locks[step.str("lock")].1 {
                    Some(g) => g.is_held().await?,
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
                let reply: Value = self.guard(step)?.fenced(&cmd).await?;
                expect(step, from_value(&reply))?;
            }
            "fenced_script" => {
                let keys = step.strings("keys");
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                let args = step.strings("args");
                let reply: Value = self
                    .guard(step)?
                    .fenced_script(step.str("body"), &keys, &args)
                    .await?;
                expect(step, from_value(&reply))?;
            }
            "raw" => {
                let got = self.raw(step.get("command").expect("command")).await?;
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
                self.poll_raw("wait_raw", &command, ms(step, "timeout"), |got| {
                    want.matches(got)
                })
                .await?;
            }
            "wait_waiters" => {
                let count = step.get("count").and_then(Json::as_i64);
                let command = words(&["LOCK.INFO", step.str("key")]);
                let waiters = |info: &Json| {
                    field(info, "waiters").and_then(|v| v.as_i64()).or(Some(0)) == count
                };
                self.poll_raw("waiters", &command, STEP_DEADLINE, waiters)
                    .await?;
            }
            "kill_session_connection" => {
                let id = self.sessions[step.str("session")].id().to_string();
                let info = self.raw(&words(&["LOCK.SESSION", "INFO", &id])).await?;
                let bound = field(&info, "bound").and_then(|v| v.as_i64());
                check!(bound.is_some(), "the session is not bound");
                let killed = self
                    .raw(&words(&[
                        "CLIENT",
                        "KILL",
                        "ID",
                        &bound.unwrap().to_string(),
                    ]))
                    .await?;
                check!(killed == Json::Num(1), "CLIENT KILL answered {killed:?}");
            }
            "wait_session_lost" => {
                let lost = self.sessions[step.str("session")].lost();
                check!(
                    tokio::time::timeout(ms(step, "timeout"), lost)
                        .await
                        .is_ok(),
                    "the session was not reported lost"
                );
            }
            "wait_lost" => {
                let lost = self.guard(step)?.lost();
                check!(
                    tokio::time::timeout(ms(step, "timeout"), lost)
                        .await
                        .is_ok(),
                    "the hold was not reported lost"
                );
            }
            "close_session" => {
                let s = self.sessions.remove(step.str("session")).expect("session");
                let closed = s.close().await?;
                expect(step, closed.map_or(Json::Null, |n| Json::Num(n as i64)))?;
            }
            "campaign" => {
                let e = &self.elections[step.str("election")];
                let got = e
                    .campaign_for(step.str("value"), wait.unwrap_or_default())
                    .await?;
                expect(step, Json::Bool(got.is_some()))?;
                if let Some(l) = got {
                    if let Some(save) = step.get("save_term").and_then(Json::as_str) {
                        self.vars.save(save, Json::Num(l.term() as i64));
                    }
                    self.leaderships.insert(name, l);
                }
            }
            "leader" => {
                let leader = self.elections[step.str("election")].leader().await?;
                expect(step, leader.map_or(Json::Null, |l| Json::Str(l.value)))?;
            }
            "resign" => {
                let l = self
                    .leaderships
                    .remove(step.str("leadership"))
                    .expect("leadership");
                expect(step, Json::Bool(l.resign().await?))?;
            }
            "watch" => {
                let w = self.base.watch(step.str("key")).await?;
                self.watches.insert(name, w);
            }
            "observe" => {
                let w = self.elections[step.str("election")].observe().await?;
                self.watches.insert(name, w);
            }
            "next_change" => {
                let observer = self.watches.get_mut(step.str("watch")).expect("watch");
                let change = tokio::time::timeout(ms(step, "timeout"), observer.next()).await;
                let change = change.map_err(|_| StepErr::TimedOut)?;
                let change = change.ok_or_else(|| fail("the observer ended".into()))?;
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

async fn run_case(nodes: &crate::Nodes, case: &Json) -> Result<(), Outcome> {
    needs(case)?;
    let _replica = crate::replica_for(case, &nodes.server);
    nodes.flush(case)?;
    let redis_client = redis::Client::open(nodes.server.url()).map_err(|e| fail(e.to_string()))?;
    let conn = redis_client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| fail(e.to_string()))?;
    let mut runner = Runner {
        nodes,
        cluster: crate::on_cluster(case),
        base: Client::open(&nodes.url(case)).map_err(|e| fail(e.to_string()))?,
        conn,
        vars: Vars::default(),
        locks: HashMap::new(),
        sessions: HashMap::new(),
        elections: HashMap::new(),
        leaderships: HashMap::new(),
        watches: HashMap::new(),
        pending: HashMap::new(),
    };
    for step in case.get("steps").and_then(Json::as_array).unwrap_or(&[]) {
        let deadline = step
            .get("wait")
            .map_or(Duration::ZERO, |_| ms(step, "wait"))
            + STEP_DEADLINE;
        let result = match tokio::time::timeout(deadline, runner.step(step)).await {
            Ok(result) => result,
            Err(_) => Err(fail(format!(
                "{}: no outcome within {deadline:?}",
                step.str("do")
            ))
            .into()),
        };
        settle(step, result)?;
    }
    for (_name, (_lock, task)) in runner.pending.drain() {
        task.abort();
    }
    Ok(())
}

pub fn run_topic(topic: &str) {
    let nodes = crate::Nodes::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let outcomes = crate::cases(topic)
        .iter()
        .map(|case| {
            (
                case.str("description").to_string(),
                runtime.block_on(run_case(&nodes, case)),
            )
        })
        .collect();
    report("rust-async", topic, outcomes);
}
