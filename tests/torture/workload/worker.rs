//! A worker's loop and its calls: one lock attempt after another until told to stop, each
//! call sent with its own timeout and recorded in the history with its outcome.

use super::*;

impl Worker {
    pub fn new(
        name: String,
        cfg: Config,
        target: Arc<Target>,
        sink: Arc<dyn Sink>,
        stop: Arc<AtomicBool>,
        seed: u64,
    ) -> Worker {
        Worker {
            name,
            cfg,
            target,
            sink,
            stop,
            rng: StdRng::seed_from_u64(seed),
            conn: None,
            attempts: 0,
            writes: 0,
            giving_up: false,
        }
    }

    /// Take locks until told to stop.
    pub fn run(mut self) {
        while !self.stop.load(Ordering::Relaxed) {
            let i = self.rng.gen_range(0..self.cfg.keys);
            let key = lock_key(i);
            let ttl = self.rng.gen_range(self.cfg.ttl_ms.0..=self.cfg.ttl_ms.1);
            // Drawn only when shared acquires are configured, so the other scenarios' seeds
            // make the same choices as before shared holders existed.
            let mode = match self.cfg.shared_share > 0.0 && self.rng.gen_bool(self.cfg.shared_share)
            {
                false => Mode::Exclusive,
                true => Mode::Shared {
                    limit: self
                        .cfg
                        .shared_limits
                        .get(i % self.cfg.shared_limits.len().max(1))
                        .copied(),
                },
            };
            self.attempts += 1;
            let owner = format!("{}-{}", self.name, self.attempts);
            if self.cfg.keys >= 2 && self.rng.gen_bool(self.cfg.multi_share) {
                let n = self.rng.gen_range(2..=self.cfg.keys.min(3));
                let keys: Vec<String> = rand::seq::index::sample(&mut self.rng, self.cfg.keys, n)
                    .into_iter()
                    .map(lock_key)
                    .collect();
                let owner = format!("{owner}{MULTI_SUFFIX}");
                match self.macquire(&keys, &owner, ttl) {
                    Some(tokens) => {
                        for (key, token) in keys.iter().zip(tokens) {
                            self.hold(key, &owner, ttl, token, Mode::Exclusive);
                        }
                    }
                    None => self.sleep_ms((0, 3)),
                }
                continue;
            }
            match self.acquire(&key, &owner, ttl, mode) {
                Some(token) => self.hold(&key, &owner, ttl, token, mode),
                // Refused, or the wait timed out: back off a little so that non-blocking
                // callers do not spin.
                None => self.sleep_ms((0, 3)),
            }
        }
    }

    pub(super) fn sleep_ms(&mut self, range: (u64, u64)) {
        let ms = self.rng.gen_range(range.0..=range.1);
        if ms > 0 {
            thread::sleep(Duration::from_millis(ms));
        }
    }

    /// A connection to the current target, made if needed; `None` once told to stop.
    pub(super) fn take_conn(&mut self) -> Option<(Connection, u64)> {
        loop {
            let (port, generation) = self.target.get();
            if let Some((conn, made_for)) = self.conn.take() {
                if made_for == generation {
                    return Some((conn, made_for));
                }
            }
            if self.stop.load(Ordering::Relaxed) {
                return None;
            }
            match port.map(|p| connect(p, &self.name, Duration::from_millis(500))) {
                Some(Ok(conn)) => return Some((conn, generation)),
                // The server is down or being replaced: try again shortly.
                _ => thread::sleep(Duration::from_millis(5)),
            }
        }
    }

    /// Send `cmd` and read its reply; the connection is dropped if no reply came.
    pub(super) fn send(&mut self, cmd: &Cmd, timeout: Duration) -> Option<Reply> {
        let (mut conn, generation) = self.take_conn()?;
        let _ = conn.set_read_timeout(Some(timeout));
        let reply = match conn.req_command(cmd) {
            Ok(Value::ServerError(e)) => Reply::Error(match e.details() {
                Some(d) => format!("{} {d}", e.code()),
                None => e.code().to_string(),
            }),
            Ok(v) => Reply::Value(v),
            Err(e) if e.is_timeout() && self.giving_up => Reply::Lost(GAVE_UP.to_string()),
            Err(e) if e.is_timeout() => Reply::Lost(format!("{NO_REPLY} after {timeout:?}: {e})")),
            Err(e) if e.is_io_error() || e.is_connection_dropped() => {
                Reply::Lost(format!("(no reply: {e})"))
            }
            Err(e) => Reply::Error(e.to_string()),
        };
        if !matches!(reply, Reply::Lost(_)) {
            self.conn = Some((conn, generation));
        }
        Some(reply)
    }

    /// Run one recorded operation: `cmd` (the write, for a read-modify-write whose read was
    /// sent at `invoke`). `None` if the worker is stopping and nothing was sent.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn op(
        &mut self,
        key: &str,
        owner: &str,
        op: Op,
        token: Option<i64>,
        cmd: &Cmd,
        timeout: Duration,
        invoke: Option<Micros>,
    ) -> Option<(Outcome, Option<i64>)> {
        // Connect first: time spent reconnecting (a server being restarted) is not part of
        // the operation, and nothing is recorded if the worker stops meanwhile.
        let conn = self.take_conn()?;
        self.conn = Some(conn);
        let invoke = invoke.unwrap_or_else(|| self.sink.now());
        let mut entry = Entry {
            id: 0,
            client: self.name.clone(),
            key: key.to_string(),
            owner: owner.to_string(),
            op,
            invoke,
            complete: invoke,
            wall_ms: crate::history::wall_us() / 1000,
            outcome: Outcome::Unknown,
            token,
            reply: String::new(),
        };
        let id = self.sink.begin(&entry);
        let Some(reply) = self.send(cmd, timeout) else {
            // The target changed under us and the worker is stopping: nothing was sent.
            entry.outcome = Outcome::Fail;
            entry.reply = "(not sent: stopping)".to_string();
            self.sink.end(id, entry);
            return None;
        };
        entry.complete = self.sink.now();
        entry.outcome = classify(&entry.op, &reply);
        entry.reply = reply.text();
        if entry.op.is_acquire() {
            entry.token = (entry.outcome == Outcome::Ok)
                .then(|| reply.int())
                .flatten();
        }
        let result = (entry.outcome, entry.token);
        self.sink.end(id, entry);
        Some(result)
    }
}
