//! What a worker does with each lock: acquire it (one key, or a set with `LOCK.MACQUIRE`), hold
//! it (extend, stall, release), and write the two resources while it believes it holds it.

use super::*;

impl Worker {
    /// `LOCK.ACQUIRE` in `mode`, blocking or not; after a lost reply, one retry as the same
    /// owner (which answers the same token if the first one was granted). Returns the token.
    pub(super) fn acquire(&mut self, key: &str, owner: &str, ttl: i64, mode: Mode) -> Option<i64> {
        let block = self.rng.gen_bool(self.cfg.block_share).then(|| {
            self.rng
                .gen_range(self.cfg.block_ms.0..=self.cfg.block_ms.1)
        });
        let give_up = block.is_some() && self.rng.gen_bool(self.cfg.disconnect_share);
        let mut cmd = acquire_cmd(key, owner, ttl, mode);
        if let Some(b) = block {
            cmd.arg("BLOCK").arg(b);
        }
        let timeout = match block {
            Some(b) if give_up => {
                Duration::from_millis(self.rng.gen_range(1..=(b as u64 / 2).max(1)))
            }
            Some(b) => Duration::from_millis(b as u64) + SLACK,
            None => SLACK,
        };
        let started = self.sink.now();
        self.giving_up = give_up;
        let sent = self.op(
            key,
            owner,
            Op::Acquire { ttl, block, mode },
            None,
            &cmd,
            timeout,
            None,
        );
        self.giving_up = false;
        let (outcome, token) = sent?;
        if give_up && outcome == Outcome::Unknown {
            self.sink.client_fault(
                "waiter disconnected before its BLOCK timeout",
                started,
                self.sink.now(),
                format!("{owner} on {key}"),
            );
        }
        match outcome {
            Outcome::Ok => token,
            Outcome::Fail => None,
            Outcome::Unknown => {
                let retry = acquire_cmd(key, owner, ttl, mode);
                let (outcome, token) = self.op(
                    key,
                    owner,
                    Op::Acquire {
                        ttl,
                        block: None,
                        mode,
                    },
                    None,
                    &retry,
                    SLACK,
                    None,
                )?;
                (outcome == Outcome::Ok).then_some(token).flatten()
            }
        }
    }

    /// `LOCK.MACQUIRE` on `keys`, blocking or not, recorded as one acquire entry per key
    /// (same owner, same times, each with its own token). A refusal (nil) is followed by a
    /// `LOCK.MRELEASE` of the same keys by the same owner, recorded as one release entry with no
    /// token: it must release 0 (the checker's `multi-all-or-nothing`). A lost reply is not
    /// retried: a grant nobody heard of expires. Returns the tokens.
    pub(super) fn macquire(&mut self, keys: &[String], owner: &str, ttl: i64) -> Option<Vec<i64>> {
        let block = self.rng.gen_bool(self.cfg.block_share).then(|| {
            self.rng
                .gen_range(self.cfg.block_ms.0..=self.cfg.block_ms.1)
        });
        let mut cmd = redis::cmd("LOCK.MACQUIRE");
        cmd.arg(keys.len()).arg(keys).arg(owner).arg(ttl);
        if let Some(b) = block {
            cmd.arg("BLOCK").arg(b);
        }
        let timeout = block.map_or(SLACK, |b| Duration::from_millis(b as u64) + SLACK);
        let conn = self.take_conn()?;
        self.conn = Some(conn);
        let invoke = self.sink.now();
        let mut entries: Vec<Entry> = keys
            .iter()
            .map(|key| Entry {
                id: 0,
                client: self.name.clone(),
                key: key.clone(),
                owner: owner.to_string(),
                op: Op::Acquire {
                    ttl,
                    block,
                    mode: Mode::Exclusive,
                },
                invoke,
                complete: invoke,
                wall_ms: crate::history::wall_us() / 1000,
                outcome: Outcome::Unknown,
                token: None,
                reply: String::new(),
            })
            .collect();
        let ids: Vec<u64> = entries.iter().map(|e| self.sink.begin(e)).collect();
        let reply = self.send(&cmd, timeout);
        let complete = self.sink.now();
        let tokens: Option<Vec<i64>> = match &reply {
            Some(Reply::Value(Value::Array(items))) if items.len() == keys.len() => items
                .iter()
                .map(|v| match v {
                    Value::Int(t) if *t > 0 => Some(*t),
                    _ => None,
                })
                .collect(),
            _ => None,
        };
        let outcome = match (&reply, &tokens) {
            (_, Some(_)) => Outcome::Ok,
            (Some(Reply::Lost(_)), None) => Outcome::Unknown,
            _ => Outcome::Fail,
        };
        let text = reply
            .as_ref()
            .map_or("(not sent: stopping)".to_string(), Reply::text);
        for (i, (id, mut entry)) in ids.into_iter().zip(entries.drain(..)).enumerate() {
            entry.complete = complete;
            entry.outcome = outcome;
            entry.token = tokens.as_ref().map(|t| t[i]);
            entry.reply = text.clone();
            self.sink.end(id, entry);
        }
        if matches!(reply, Some(Reply::Value(Value::Nil))) {
            let mut probe = redis::cmd("LOCK.MRELEASE");
            probe.arg(keys.len()).arg(keys).arg(owner);
            let _ = self.op(
                &keys.join(" "),
                owner,
                Op::Release,
                None,
                &probe,
                SLACK,
                None,
            );
        }
        tokens
    }

    /// Use a granted lock: (`WAIT`), write (read, when shared), hold, maybe extend and write
    /// again, then release or walk away and let it expire. Abandons the hold when an
    /// operation's reply is lost.
    pub(super) fn hold(&mut self, key: &str, owner: &str, ttl: i64, token: i64, mode: Mode) {
        if self.cfg.wait_replicas {
            // A durable client's WAIT is short here (100 ms), so that the nemesis's stops of the
            // replica (50-300 ms) leave some grants unacknowledged and given back.
            let wait_ms = if self.cfg.durable { 100 } else { 1000 };
            let mut wait = redis::cmd("WAIT");
            wait.arg(1).arg(wait_ms);
            let timeout = Duration::from_millis(wait_ms) + SLACK;
            // Whatever WAIT answers, go on: the checker decides what an acknowledgement buys.
            // A durable client gives an unacknowledged grant back instead.
            match self.op(key, owner, Op::Wait, Some(token), &wait, timeout, None) {
                Some((Outcome::Unknown, _)) | None => return,
                Some((Outcome::Fail, _)) if self.cfg.durable => {
                    let mut release = redis::cmd("LOCK.RELEASE");
                    release.arg(key).arg(owner);
                    let _ = self.op(key, owner, Op::Release, Some(token), &release, SLACK, None);
                    return;
                }
                Some(_) => {}
            }
        }
        for _ in 0..self.rng.gen_range(1..=2) {
            if !self.use_resource(key, owner, ttl, token, mode) {
                return;
            }
        }
        self.sleep_ms(self.cfg.hold_ms);
        if self.rng.gen_bool(self.cfg.extend_share) {
            let mut extend = redis::cmd("LOCK.EXTEND");
            extend.arg(key).arg(owner).arg(ttl);
            let extended = self.op(
                key,
                owner,
                Op::Extend { ttl },
                Some(token),
                &extend,
                SLACK,
                None,
            );
            match extended {
                Some((Outcome::Ok, _)) => {
                    if !self.use_resource(key, owner, ttl, token, mode) {
                        return;
                    }
                    self.sleep_ms(self.cfg.hold_ms);
                }
                Some((Outcome::Fail, _)) => {}
                _ => return,
            }
        }
        if self.rng.gen_bool(self.cfg.expire_share) {
            return;
        }
        let mut release = redis::cmd("LOCK.RELEASE");
        release.arg(key).arg(owner);
        let _ = self.op(key, owner, Op::Release, Some(token), &release, SLACK, None);
    }

    /// What a holder does with the resources: an exclusive holder writes, a shared one only
    /// reads (see the module docs). False if a reply was lost.
    pub(super) fn use_resource(
        &mut self,
        key: &str,
        owner: &str,
        ttl: i64,
        token: i64,
        mode: Mode,
    ) -> bool {
        if !mode.is_shared() {
            return self.write(key, owner, ttl, token);
        }
        let mut eval = redis::cmd("EVAL");
        eval.arg(FENCED_READ)
            .arg(2)
            .arg(key)
            .arg(fenced_key(key))
            .arg(token);
        let read = self.op(key, owner, Op::FencedRead, Some(token), &eval, SLACK, None);
        matches!(read, Some((Outcome::Ok | Outcome::Fail, _)))
    }

    /// One read-modify-write of each resource while believing `token` is held: read both,
    /// wait (maybe pause past the ttl), write both. False if a reply was lost.
    pub(super) fn write(&mut self, key: &str, owner: &str, ttl: i64, token: i64) -> bool {
        let (list, counter) = (fenced_key(key), plain_key(key));
        let fenced_invoke = self.sink.now();
        let Some(Reply::Value(Value::Int(read_len))) =
            self.send(redis::cmd("LLEN").arg(&list), SLACK)
        else {
            return false;
        };
        let plain_invoke = self.sink.now();
        let read = match self.send(redis::cmd("GET").arg(&counter), SLACK) {
            Some(Reply::Value(Value::Nil)) => 0,
            Some(Reply::Value(Value::BulkString(b))) => {
                match String::from_utf8_lossy(&b).parse::<i64>() {
                    Ok(n) => n,
                    Err(_) => return false,
                }
            }
            _ => return false,
        };
        self.sleep_ms(self.cfg.gap_ms);
        if self.cfg.pause_share > 0.0 && self.rng.gen_bool(self.cfg.pause_share) {
            let started = self.sink.now();
            let pause = ttl as u64 + self.rng.gen_range(20..=60);
            thread::sleep(Duration::from_millis(pause));
            self.sink.client_fault(
                "holder paused past its ttl (thread sleep)",
                started,
                self.sink.now(),
                format!("{owner} token {token} on {key}, {pause} ms"),
            );
        }
        self.writes += 1;
        let reads = Reads {
            fenced: (fenced_invoke, read_len),
            plain: (plain_invoke, read),
        };
        let writer = format!("{}.{}", self.name, self.writes);
        write_step(self, key, owner, token, reads, &writer, |_| {})
    }
}

/// What a read-modify-write read before its writes: when each read was sent (the write's
/// invocation in the history), and what it answered.
pub struct Reads {
    /// The fenced list's `LLEN`: (sent at, length).
    pub fenced: (Micros, i64),
    /// The counter's `GET`: (sent at, value; 0 for none).
    pub plain: (Micros, i64),
}

/// A client that sends and records operations as [`Worker`]'s `op` does (its outcome and, for
/// a grant, the token; `None` if nothing was sent). The session holder processes are one too.
pub trait Recording {
    #[allow(clippy::too_many_arguments)]
    fn op(
        &mut self,
        key: &str,
        owner: &str,
        op: Op,
        token: Option<i64>,
        cmd: &Cmd,
        timeout: Duration,
        invoke: Option<Micros>,
    ) -> Option<(Outcome, Option<i64>)>;
}

impl Recording for Worker {
    fn op(
        &mut self,
        key: &str,
        owner: &str,
        op: Op,
        token: Option<i64>,
        cmd: &Cmd,
        timeout: Duration,
        invoke: Option<Micros>,
    ) -> Option<(Outcome, Option<i64>)> {
        Worker::op(self, key, owner, op, token, cmd, timeout, invoke)
    }
}

/// The write half of every holder's read-modify-write: the fenced append through
/// [`FENCED_APPEND`] tagged `token|read|owner|writer` (`writer` unique per write, e.g.
/// `w3.17`), then the counter's `SET` to what was read + 1, each recorded from its read's
/// invocation. `sending` is told the tag just before the append is sent. False if a reply was
/// lost.
pub fn write_step(
    c: &mut impl Recording,
    key: &str,
    owner: &str,
    token: i64,
    reads: Reads,
    writer: &str,
    sending: impl FnOnce(&str),
) -> bool {
    let (list, counter) = (fenced_key(key), plain_key(key));
    let ((fenced_invoke, read_len), (plain_invoke, read)) = (reads.fenced, reads.plain);
    let tag = format!("{token}|{read_len}|{owner}|{writer}");
    let mut eval = redis::cmd("EVAL");
    eval.arg(FENCED_APPEND)
        .arg(2)
        .arg(key)
        .arg(&list)
        .arg(token)
        .arg(&tag);
    sending(&tag);
    let fenced = Op::FencedWrite {
        read: read_len,
        tag,
    };
    match c.op(
        key,
        owner,
        fenced,
        Some(token),
        &eval,
        SLACK,
        Some(fenced_invoke),
    ) {
        Some((Outcome::Unknown, _)) | None => return false,
        Some(_) => {}
    }
    let mut set = redis::cmd("SET");
    set.arg(&counter).arg(read + 1);
    let plain = Op::UnfencedWrite { read };
    matches!(
        c.op(
            key,
            owner,
            plain,
            Some(token),
            &set,
            SLACK,
            Some(plain_invoke)
        ),
        Some((Outcome::Ok | Outcome::Fail, _))
    )
}

/// `LOCK.ACQUIRE key owner ttl` with `mode`'s options.
fn acquire_cmd(key: &str, owner: &str, ttl: i64, mode: Mode) -> Cmd {
    let mut cmd = redis::cmd("LOCK.ACQUIRE");
    cmd.arg(key).arg(owner).arg(ttl);
    if let Mode::Shared { limit } = mode {
        cmd.arg("SHARED");
        if let Some(n) = limit {
            cmd.arg("LIMIT").arg(n);
        }
    }
    cmd
}
