//! The tools the nemeses use: signals to processes, the server's client list, `MULTI`/`EXEC`
//! with every reply kept, what the server holds, the largest token in an AOF, a `DUMP`
//! payload cut short with a valid checksum (`harness::dump`), and holder processes.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use rand::Rng;
use redis::{Cmd, Connection, ConnectionLike, RedisResult, Value};

use crate::common::{info_field, Server};
use crate::history::{load_child, Micros, Recorder};
use crate::run::Env;
use crate::workload::{HolderSpec, HOLDER_ENV};

/// Send `sig` (`STOP`, `CONT`, `KILL`) to `pid` with kill(1): std has no signal API and the
/// test takes no `libc` dependency.
pub fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap_or_else(|e| panic!("cannot run kill -{sig} {pid}: {e}"));
    assert!(status.success(), "kill -{sig} {pid} failed: {status}");
}

/// The server's process id (`INFO server`).
pub fn server_pid(server: &Server) -> u32 {
    server
        .info_field("server", "process_id")
        .and_then(|p| p.parse().ok())
        .expect("INFO server has no process_id")
}

/// One line of `CLIENT LIST`.
#[derive(Clone, Debug)]
pub struct Client {
    pub id: i64,
    pub name: String,
    pub flags: String,
    pub cmd: String,
}

/// Clients named `{prefix}...` blocked in `LOCK.ACQUIRE ... BLOCK` right now.
pub fn waiters(c: &mut Connection, prefix: &str) -> Vec<Client> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(c)
        .expect("CLIENT LIST");
    list.lines()
        .map(|line| {
            let field = |name: &str| {
                line.split(' ')
                    .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                    .unwrap_or("")
                    .to_string()
            };
            Client {
                id: field("id").parse().unwrap_or(-1),
                name: field("name"),
                flags: field("flags"),
                cmd: field("cmd"),
            }
        })
        .filter(|c| c.name.starts_with(prefix) && c.flags.contains('b') && c.cmd == "lock.acquire")
        .collect()
}

/// `MULTI`, `cmds`, `EXEC`, keeping each command's own reply (an error reply is a
/// `Value::ServerError` in the list). Also returns when `EXEC` was sent and answered: the
/// whole transaction ran at one instant in between.
pub fn transaction(
    rec: &Recorder,
    c: &mut Connection,
    cmds: &[Cmd],
) -> RedisResult<(Vec<Value>, Micros, Micros)> {
    redis::cmd("MULTI").query::<()>(c)?;
    for cmd in cmds {
        // QUEUED, or an error that makes EXEC abort (reported by EXEC itself).
        c.req_command(cmd)?;
    }
    let invoke = rec.clock.now();
    let reply = c.req_command(&redis::cmd("EXEC"))?;
    let complete = rec.clock.now();
    match reply {
        Value::Array(replies) => Ok((replies, invoke, complete)),
        other => panic!("EXEC answered {other:?}"),
    }
}

/// `args` as one command, with its raw reply (an error reply is a `Value::ServerError`).
pub fn raw(c: &mut Connection, args: &[&str]) -> Value {
    let mut cmd = redis::cmd(args[0]);
    cmd.arg(&args[1..]);
    c.req_command(&cmd)
        .unwrap_or_else(|e| panic!("{args:?}: no reply: {e}"))
}

/// `LOCK.INFO key`, as it came.
fn lock_info_reply(c: &mut Connection, key: &str) -> Value {
    redis::cmd("LOCK.INFO")
        .arg(key)
        .query(c)
        .unwrap_or_else(|e| panic!("LOCK.INFO {key}: {e}"))
}

/// The `(owner, token, ttl)` of `key`'s live hold (`LOCK.INFO`), or `None` when free.
pub fn lock_info(c: &mut Connection, key: &str) -> Option<(String, i64, i64)> {
    parse_lock_info(&lock_info_reply(c, key))
}

/// A `LOCK.INFO` reply (RESP2 flat array of field, value) as `(owner, token, ttl)`.
pub fn parse_lock_info(reply: &Value) -> Option<(String, i64, i64)> {
    let Value::Array(items) = reply else {
        return None;
    };
    let (mut owner, mut token, mut ttl) = (None, None, None);
    for pair in items.chunks(2) {
        match (&pair[0], pair.get(1)) {
            (Value::BulkString(f), Some(Value::BulkString(v))) if f == b"owner" => {
                owner = Some(String::from_utf8_lossy(v).into_owned())
            }
            (Value::BulkString(f), Some(Value::Int(v))) if f == b"token" => token = Some(*v),
            (Value::BulkString(f), Some(Value::Int(v))) if f == b"ttl" => ttl = Some(*v),
            _ => {}
        }
    }
    Some((owner?, token?, ttl?))
}

/// The `(owner, token, ttl)` of every live holder of `key` (`LOCK.INFO`), shared or not;
/// empty when free.
pub fn lock_holders(c: &mut Connection, key: &str) -> Vec<(String, i64, i64)> {
    parse_holders(&lock_info_reply(c, key))
}

/// The `holders` field of a `LOCK.INFO` reply (RESP2: a list of field, value lists) as
/// `(owner, token, ttl)` each.
pub fn parse_holders(reply: &Value) -> Vec<(String, i64, i64)> {
    let Value::Array(items) = reply else {
        return Vec::new();
    };
    let Some(Value::Array(holders)) = items
        .chunks(2)
        .find(|pair| pair[0] == Value::BulkString(b"holders".to_vec()))
        .and_then(|pair| pair.get(1))
    else {
        return Vec::new();
    };
    holders
        .iter()
        .filter_map(|h| {
            let Value::Array(fields) = h else { return None };
            let (mut owner, mut token, mut ttl) = (None, None, None);
            for pair in fields.chunks(2) {
                match (&pair[0], pair.get(1)) {
                    (Value::BulkString(f), Some(Value::BulkString(v))) if f == b"owner" => {
                        owner = Some(String::from_utf8_lossy(v).into_owned())
                    }
                    (Value::BulkString(f), Some(Value::Int(v))) if f == b"token" => {
                        token = Some(*v)
                    }
                    (Value::BulkString(f), Some(Value::Int(v))) if f == b"ttl" => ttl = Some(*v),
                    _ => {}
                }
            }
            Some((owner?, token?, ttl?))
        })
        .collect()
}

/// `INFO lock` `lock_token_high_water`.
pub fn high_water(c: &mut Connection) -> Option<i64> {
    info_field(c, "lock", "lock_token_high_water")?.parse().ok()
}

/// The largest token in any `LOCK.LOAD` of the AOF files in `dir/appendonlydir`, and how many
/// `LOCK.LOAD`s the base files (the output of a rewrite) hold. Every grant, retry, extend and
/// handoff is written there as `LOCK.LOAD key owner token deadline` before its reply is sent.
pub fn aof_tokens(dir: &Path) -> (Option<i64>, u64) {
    let mut max = None;
    let mut in_base = 0;
    let Ok(files) = fs::read_dir(dir.join("appendonlydir")) else {
        return (None, 0);
    };
    for file in files.flatten() {
        let name = file.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".aof") {
            continue;
        }
        let Ok(bytes) = fs::read(file.path()) else {
            continue;
        };
        for command in resp_commands(&bytes) {
            if command.len() == 5 && command[0].eq_ignore_ascii_case(b"LOCK.LOAD") {
                let token = String::from_utf8_lossy(&command[3]).parse::<i64>().ok();
                max = max.max(token);
                if name.contains(".base.") {
                    in_base += 1;
                }
            }
        }
    }
    (max, in_base)
}

/// The commands of an AOF: RESP arrays of bulk strings; stops at the first thing that is not
/// one (a torn tail after a kill).
fn resp_commands(mut bytes: &[u8]) -> Vec<Vec<Vec<u8>>> {
    fn line<'a>(bytes: &mut &'a [u8]) -> Option<&'a [u8]> {
        let end = bytes.windows(2).position(|w| w == b"\r\n")?;
        let (head, rest) = bytes.split_at(end);
        *bytes = &rest[2..];
        Some(head)
    }
    let mut commands = Vec::new();
    while let Some(head) = line(&mut bytes) {
        if head.first() == Some(&b'#') {
            continue; // an annotation (aof-timestamp-enabled)
        }
        let Some(n) = head
            .strip_prefix(b"*")
            .and_then(|n| std::str::from_utf8(n).ok()?.parse::<usize>().ok())
        else {
            break;
        };
        let mut args = Vec::with_capacity(n);
        for _ in 0..n {
            let Some(len) = line(&mut bytes)
                .and_then(|h| h.strip_prefix(b"$"))
                .and_then(|l| std::str::from_utf8(l).ok()?.parse::<usize>().ok())
            else {
                return commands;
            };
            if bytes.len() < len + 2 {
                return commands;
            }
            args.push(bytes[..len].to_vec());
            bytes = &bytes[len + 2..];
        }
        commands.push(args);
    }
    commands
}

/// `payload` (a `DUMP`: value, 2-byte RDB version, 8-byte CRC-64) with its value cut to the
/// first `cut` bytes and a footer that is valid again, so that the server's checksum passes
/// and the value's loader itself meets the short data.
pub fn truncated_dump(payload: &[u8], cut: usize) -> Vec<u8> {
    let n = payload.len();
    let mut out = payload[..cut].to_vec();
    out.extend_from_slice(&payload[n - 10..n - 8]);
    harness::dump::with_checksum(out)
}

/// A connection authenticated as `user`.
pub fn conn_as(server: &Server, user: &str, password: &str) -> Connection {
    let url = format!("redis://{user}:{password}@127.0.0.1:{}/", server.port());
    redis::Client::open(url)
        .and_then(|c| c.get_connection_with_timeout(std::time::Duration::from_secs(5)))
        .unwrap_or_else(|e| panic!("cannot connect as {user}: {e}"))
}

/// A holder process: the test binary re-executed as one workload client
/// (`workload::holder_process_main`), so the nemesis can stop and kill a real process.
pub struct Holder {
    child: Child,
    pub name: String,
    file: PathBuf,
}

impl Holder {
    /// Start `proc{n}` against the current primary for 1 to 3 seconds.
    pub fn spawn(env: &mut Env) -> Holder {
        env.spawned += 1;
        let name = format!("proc{}", env.spawned);
        let dir = env.primary.dir().to_path_buf();
        let file = dir.join(format!("{name}.history"));
        let spec = HolderSpec {
            port: env.primary.port(),
            keys: env.cfg.keys,
            name: name.clone(),
            secs: env.rng.gen_range(1.0..3.0),
            ttl_ms: env.cfg.ttl_ms,
            seed: env.rng.gen(),
            file: file.to_string_lossy().into_owned(),
        };
        let stderr = File::create(dir.join(format!("{name}.stderr")))
            .unwrap_or_else(|e| panic!("cannot create {name}.stderr: {e}"));
        let exe = std::env::current_exe().expect("the test binary's path");
        let child = Command::new(exe)
            .args(["holder_process", "--exact", "--ignored", "--nocapture"])
            .args(["--test-threads", "1", "-q"])
            .env(HOLDER_ENV, spec.encode())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start a holder process: {e}"));
        Holder { child, name, file }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// True once the process has exited by itself.
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// SIGKILL it (if still running) and reap it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Reap it and add its operations to the history; those it never finished end now, with
    /// an unknown outcome.
    pub fn finish(mut self, env: &Env) {
        self.kill();
        let (entries, faults) = load_child(&self.file, &env.rec.clock, env.now());
        env.rec.push_entries(entries);
        env.rec.push_faults(faults);
    }
}
