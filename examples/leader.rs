//! A leader elected with a lease and kept with `LOCK.EXTEND`.
//!
//! ```sh
//! cargo build --examples
//! target/debug/examples/leader --url redis://127.0.0.1:6379 --id a --lease-ms 300 --run-ms 1500 &
//! target/debug/examples/leader --url redis://127.0.0.1:6379 --id b --lease-ms 300 --run-ms 1500
//! ```
//!
//! Each candidate campaigns with `LOCK.ACQUIRE election <id> <lease> BLOCK <campaign>`: the
//! first gets the lease at once, the others wait in the key's FIFO queue and the server hands the
//! lease to the next one the moment the leader resigns or its lease lapses. The leader renews the
//! lease with `LOCK.EXTEND` every lease/3, so it survives a stall of up to 2/3 of a lease, and
//! steps down with `LOCK.RELEASE` after `--run-ms`.
//!
//! Output, one line per event:
//!
//! - `leader ID token T`: elected; `T` is the fencing token, larger for every later leader.
//! - `resigned ID`: stopped acting as leader; printed *before* the lease is released, so the
//!   next leader's `leader` line always comes after it.
//! - `lost ID`: the lease was gone when the leader tried to renew (or release) it: it expired,
//!   or the key was deleted. The process stops acting as leader at once.
//! - `gave up ID`: not elected within `--campaign-ms`.
//!
//! Exit status: 0 after `resigned`, 1 after `lost` or `gave up`, 2 on a usage or connection error.

use std::process::ExitCode;
use std::thread;
use std::time::{Duration, Instant};

use redis::{Connection, RedisResult};

/// The key every candidate campaigns for, unless `--key` names another.
const DEFAULT_KEY: &str = "election";

const USAGE: &str = "usage: leader --url redis://HOST:PORT --id NAME --lease-ms N --run-ms N \
                     [--campaign-ms N (0 = wait forever, the default)] [--key KEY]";

/// The command line, parsed.
struct Args {
    /// Server address, e.g. `redis://127.0.0.1:6379`.
    url: String,
    /// This candidate's name: the lock's owner. Must be unique among candidates.
    id: String,
    /// The lease: how long a hold lasts unless renewed.
    lease_ms: u64,
    /// How long to lead before resigning.
    run_ms: u64,
    /// How long to wait to be elected; 0 waits without limit.
    campaign_ms: u64,
    /// The election's key.
    key: String,
}

/// How a term ended.
enum Outcome {
    /// The leader stepped down and released the lease.
    Resigned,
    /// The lease was gone when the leader tried to renew or release it.
    Lost,
    /// Not elected within the campaign timeout.
    GaveUp,
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(msg) => {
            eprintln!("leader: {msg}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(Outcome::Resigned) => ExitCode::SUCCESS,
        Ok(Outcome::Lost | Outcome::GaveUp) => ExitCode::from(1),
        Err(e) => {
            eprintln!("leader {}: {e}", args.id);
            ExitCode::from(2)
        }
    }
}

fn run(args: &Args) -> RedisResult<Outcome> {
    let lease = Duration::from_millis(args.lease_ms);
    let mut conn = redis::Client::open(args.url.as_str())?.get_connection()?;

    // Campaign. The read must outlast the server-side wait, so its timeout is
    // the campaign's plus a margin (none at all when the campaign has no limit).
    let read_timeout = (args.campaign_ms > 0)
        .then(|| Duration::from_millis(args.campaign_ms) + Duration::from_secs(5));
    conn.set_read_timeout(read_timeout)?;
    let token: Option<u64> = redis::cmd("LOCK.ACQUIRE")
        .arg(&args.key)
        .arg(&args.id)
        .arg(args.lease_ms)
        .arg("BLOCK")
        .arg(args.campaign_ms)
        .query(&mut conn)?;
    let Some(token) = token else {
        println!("gave up {}", args.id);
        return Ok(Outcome::GaveUp);
    };
    let elected = Instant::now();
    println!("leader {} token {token}", args.id);

    // Lead. A renewal whose reply comes later than a lease is worthless: the
    // lease may have lapsed meanwhile. So the read timeout is one lease, and a
    // failed renewal of any kind ends the term.
    conn.set_read_timeout(Some(lease))?;
    let term_end = elected + Duration::from_millis(args.run_ms);
    let renew_every = lease / 3;
    loop {
        let now = Instant::now();
        if now >= term_end {
            break;
        }
        thread::sleep(renew_every.min(term_end - now));
        if Instant::now() >= term_end {
            break;
        }
        if !renew(&mut conn, args) {
            println!("lost {}", args.id);
            return Ok(Outcome::Lost);
        }
    }

    // Step down. Stop acting as leader first, then give the lease back: the
    // lease passes to the next candidate only once this process has stopped,
    // so no two processes ever act as leader at the same time.
    println!("resigned {}", args.id);
    let released: i64 = redis::cmd("LOCK.RELEASE")
        .arg(&args.key)
        .arg(&args.id)
        .query(&mut conn)?;
    if released == 1 {
        Ok(Outcome::Resigned)
    } else {
        // The lease lapsed before the release: another candidate may have
        // been elected while this one still acted as leader.
        println!("lost {}", args.id);
        Ok(Outcome::Lost)
    }
}

/// `LOCK.EXTEND key id lease`: true if this candidate still holds the lease.
fn renew(conn: &mut Connection, args: &Args) -> bool {
    let reply: RedisResult<i64> = redis::cmd("LOCK.EXTEND")
        .arg(&args.key)
        .arg(&args.id)
        .arg(args.lease_ms)
        .query(conn);
    match reply {
        Ok(held) => held == 1,
        Err(e) => {
            eprintln!("leader {}: renewal failed: {e}", args.id);
            false
        }
    }
}

fn parse_args(mut argv: impl Iterator<Item = String>) -> Result<Args, String> {
    let (mut url, mut id, mut lease_ms, mut run_ms) = (None, None, None, None);
    let mut campaign_ms = 0;
    let mut key = DEFAULT_KEY.to_string();
    while let Some(flag) = argv.next() {
        let value = argv.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<u64>()
                .map_err(|_| format!("{flag} must be a non-negative integer, got {value:?}"))
        };
        match flag.as_str() {
            "--url" => url = Some(value),
            "--id" => id = Some(value),
            "--lease-ms" => lease_ms = Some(number()?),
            "--run-ms" => run_ms = Some(number()?),
            "--campaign-ms" => campaign_ms = number()?,
            "--key" => key = value,
            _ => return Err(format!("unknown argument {flag:?}")),
        }
    }
    let lease_ms = lease_ms.ok_or("--lease-ms is required")?;
    if lease_ms < 3 {
        return Err("--lease-ms must be at least 3 (it is renewed every lease/3)".into());
    }
    Ok(Args {
        url: url.ok_or("--url is required")?,
        id: id.filter(|id| !id.is_empty()).ok_or("--id is required")?,
        lease_ms,
        run_ms: run_ms.ok_or("--run-ms is required")?,
        campaign_ms,
        key,
    })
}
