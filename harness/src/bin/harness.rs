//! `harness`: start servers through the harness crate for tests in other languages (the Python
//! tests; later Node). It prints one JSON line describing what it started, keeps it running
//! until its standard input closes, then stops it and removes its directory.
//!
//! ```text
//! harness server [--bin PATH] [--no-module] [--module-arg ARG]... [--replica-of PORT]
//!                [--clock-offset-ms MS] [-- SERVER-ARG...]
//!     {"port":40123,"pid":5012,"dir":"/tmp/redis-lock-tests/…","url":"redis://127.0.0.1:40123/"}
//! harness cluster [--masters N] [--replicas N] [--until-signal]
//!     {"nodes":[{"port":…,"pid":…,"dir":"…","url":"…"},…]}
//! harness sentinel --primary-port PORT [--master-name NAME] [--quorum N] [--down-after-ms MS]
//!                  [--failover-timeout-ms MS]
//!     {"port":…,"pid":…,"dir":"…","url":"…"}
//! ```
//!
//! The environment is the crate's (`REDIS_SERVER`, `REDIS_LOCK_MODULE`, ...). Exit status: 0
//! after a normal stop; the server's own status if it had exited by itself before standard
//! input closed (after `SHUTDOWN`, say: under valgrind, 99 means valgrind found errors); 2 on a
//! usage error; 1 if the start failed (the reason on standard error). SIGTERM, SIGINT and
//! SIGHUP stop them too; `--until-signal` ignores standard input and waits for a signal only
//! (`make cluster` runs it in the background).

use std::io::{Read, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use harness::clock::ShiftedClock;
use harness::Server;

const USAGE: &str = "usage:
  harness server [--bin PATH] [--no-module] [--module-arg ARG]... [--replica-of PORT]
                 [--clock-offset-ms MS] [-- SERVER-ARG...]
  harness cluster [--masters N] [--replicas N] [--until-signal]
  harness sentinel --primary-port PORT [--master-name NAME] [--quorum N] [--down-after-ms MS]
                   [--failover-timeout-ms MS]
Prints one JSON line, keeps the server(s) running until stdin closes. See harness/README.md.";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(code) => code,
        Err(Usage(message)) => {
            eprintln!("harness: {message}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// A usage error, with what was wrong.
struct Usage(String);

fn run(args: &[String]) -> Result<ExitCode, Usage> {
    let (command, rest) = args
        .split_first()
        .ok_or_else(|| Usage("no command".into()))?;
    match command.as_str() {
        "server" => server(rest),
        "cluster" => cluster(rest),
        "sentinel" => sentinel(rest),
        "help" | "--help" | "-h" => {
            println!("{USAGE}");
            Ok(ExitCode::SUCCESS)
        }
        other => Err(Usage(format!("unknown command {other:?}"))),
    }
}

fn server(args: &[String]) -> Result<ExitCode, Usage> {
    let mut builder = Server::builder();
    let mut clock = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| Usage(format!("{arg} needs a value")))
        };
        builder = match arg.as_str() {
            "--bin" => builder.bin(&value()?),
            "--no-module" => builder.without_module(),
            "--module-arg" => builder.module_args(&[&value()?]),
            "--replica-of" => builder.replica_of(number(arg, &value()?)?),
            "--clock-offset-ms" => {
                let offset: i64 = number(arg, &value()?)?;
                let dir = harness::test_dir("clock");
                let shifted = ShiftedClock::new(&dir, offset);
                let builder = builder.clock(&shifted);
                clock = Some((shifted, dir));
                builder
            }
            "--" => {
                let rest: Vec<&str> = it.by_ref().map(String::as_str).collect();
                builder.args(&rest)
            }
            other => return Err(Usage(format!("unknown option {other:?}"))),
        };
    }
    let mut server = match builder.try_start() {
        Ok(server) => server,
        Err(e) => {
            eprintln!("harness: {e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let code = hold(std::slice::from_mut(&mut server), false, |s| {
        describe(&s[0])
    });
    drop(server);
    if let Some((clock, dir)) = clock {
        drop(clock);
        let _ = std::fs::remove_dir_all(dir);
    }
    Ok(code)
}

fn cluster(args: &[String]) -> Result<ExitCode, Usage> {
    let (mut masters, mut replicas, mut until_signal) = (3, 1, false);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| Usage(format!("{arg} needs a value")))
        };
        match arg.as_str() {
            "--masters" => masters = number(arg, value()?)?,
            "--replicas" => replicas = number(arg, value()?)?,
            "--until-signal" => until_signal = true,
            other => return Err(Usage(format!("unknown option {other:?}"))),
        }
    }
    let dir = harness::test_dir("cluster");
    let mut nodes = harness::cluster::start(masters, replicas, &dir);
    let code = hold(&mut nodes, until_signal, |nodes| {
        let list: Vec<String> = nodes.iter().map(describe).collect();
        format!("{{\"nodes\":[{}]}}", list.join(","))
    });
    drop(nodes);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(code)
}

/// One Sentinel monitoring the primary on 127.0.0.1:PORT (defaults: `mymaster`, quorum 1,
/// down-after 1000 ms, failover-timeout 10000 ms), for the clients' failover tests.
fn sentinel(args: &[String]) -> Result<ExitCode, Usage> {
    let (mut primary_port, mut master_name) = (None, "mymaster".to_string());
    let (mut quorum, mut down_after_ms, mut failover_timeout_ms) = (1, 1000, 10_000);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| Usage(format!("{arg} needs a value")))
        };
        match arg.as_str() {
            "--primary-port" => primary_port = Some(number(arg, value()?)?),
            "--master-name" => master_name = value()?.clone(),
            "--quorum" => quorum = number(arg, value()?)?,
            "--down-after-ms" => down_after_ms = number(arg, value()?)?,
            "--failover-timeout-ms" => failover_timeout_ms = number(arg, value()?)?,
            other => return Err(Usage(format!("unknown option {other:?}"))),
        }
    }
    let primary_port = primary_port.ok_or_else(|| Usage("--primary-port is required".into()))?;
    let cfg = harness::SentinelConfig {
        master_name: &master_name,
        primary_port,
        quorum,
        down_after_ms,
        failover_timeout_ms,
    };
    let dir = harness::test_dir("sentinel");
    let mut sentinel = harness::sentinel(0, &dir, &cfg);
    let code = hold(std::slice::from_mut(&mut sentinel), false, |s| {
        describe(&s[0])
    });
    drop(sentinel);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(code)
}

fn number<T: std::str::FromStr>(option: &str, value: &str) -> Result<T, Usage> {
    value
        .parse()
        .map_err(|_| Usage(format!("{option}: not a number: {value:?}")))
}

/// One server as a JSON object.
fn describe(server: &Server) -> String {
    format!(
        "{{\"port\":{},\"pid\":{},\"dir\":{},\"url\":{}}}",
        server.port(),
        server.pid(),
        json_string(&server.dir().to_string_lossy()),
        json_string(&server.url())
    )
}

fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Set when it is time to stop: standard input closed, or SIGTERM, SIGINT or SIGHUP arrived.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    // An atomic store is async-signal-safe; the main thread does the rest.
    STOP.store(true, Ordering::Relaxed);
}

/// Print `line(servers)`, then wait until standard input closes (or, with `until_signal`,
/// only for a signal) or a signal arrives. The exit status is the first server's own if it
/// exited by itself meanwhile.
fn hold(
    servers: &mut [Server],
    until_signal: bool,
    line: impl Fn(&[Server]) -> String,
) -> ExitCode {
    for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        // SAFETY: on_signal only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(signal, on_signal as *const () as libc::sighandler_t) };
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", line(servers));
    let _ = out.flush();
    drop(out);
    if !until_signal {
        std::thread::spawn(|| {
            let mut sink = [0u8; 256];
            let mut stdin = std::io::stdin().lock();
            while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
            STOP.store(true, Ordering::Relaxed);
        });
    }
    while !STOP.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(20));
    }
    match servers.first_mut().and_then(Server::exited) {
        Some(Some(code)) => ExitCode::from(code as u8),
        Some(None) => ExitCode::FAILURE,
        None => ExitCode::SUCCESS,
    }
}
