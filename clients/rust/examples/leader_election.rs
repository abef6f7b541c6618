// Leader election: three candidates campaign for `service:leader`, each in a bound session of
// its own; the leader is killed (its session's connection closes, as when its process dies),
// the next candidate takes over within milliseconds, then resigns to the third, which resigns
// too; an observer prints every change, "no leader" included. Run it against a server with the
// module loaded:
//
// ```sh
// cargo run -p redis-lock-client --example leader_election -- redis://127.0.0.1:6379/
// ```
//
// `tests/election.rs` (`the_example_runs`) runs `run` against a test server.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redis_lock_client::{Change, Client, Election, Error, Session};

/// What a candidate tells the example once it leads.
struct Leading {
    value: String,
    term: u64,
    /// The client id of its session's connection, to kill it.
    connection: i64,
    /// Send to make it resign.
    resign: mpsc::Sender<()>,
}

/// One candidate: a session of its own (bound: it ends the moment its connection closes), a
/// campaign, then lead until told to resign or until the leadership is lost.
fn candidate(url: String, value: String, leading: mpsc::Sender<Leading>) -> Result<(), Error> {
    let client = Client::open(&url)?;
    let session = Session::builder(&client, Duration::from_secs(10))
        .bound(true)
        .open()?;
    // ttl 0: the leadership lasts as long as the session (no watchdog of its own).
    let election = Election::new(&client, "service:leader", Duration::ZERO).session(&session);
    let leadership = election.campaign(&value)?;
    let (resign, resigned) = mpsc::channel();
    let connection = session.info()?.and_then(|i| i.bound).unwrap_or(0);
    let _ = leading.send(Leading {
        value: value.clone(),
        term: leadership.term(),
        connection,
        resign,
    });
    loop {
        // A leader does its work here, writing with leadership.fenced(...).
        if let Some(reason) = leadership.wait_lost(Duration::from_millis(5)) {
            println!("{value}: no longer the leader: {reason}");
            return Ok(());
        }
        if resigned.try_recv().is_ok() {
            println!("{value}: resigns");
            leadership.resign()?;
            return Ok(());
        }
    }
}

/// The example; returns the changes the observer saw.
pub fn run(url: &str) -> Result<Vec<Change>, Error> {
    let client = Client::open(url)?;
    let election = Election::new(&client, "service:leader", Duration::from_secs(10));
    let observer = election.observe()?;
    let mut seen = Vec::new();
    let mut next_change = |what: &str| -> Result<Change, Error> {
        let change = observer
            .next_timeout(Duration::from_secs(10))
            .ok_or(Error::InvalidArgument("no change observed within 10 s"))?;
        match &change.leader {
            Some(l) => println!("observer: {} leads, term {} ({what})", l.value, l.term),
            None => println!("observer: no leader ({what})"),
        }
        seen.push(change.clone());
        Ok(change)
    };
    next_change("at the start")?;

    let (tx, leaders) = mpsc::channel();
    let candidates: Vec<_> = ["node-a:7000", "node-b:7000", "node-c:7000"]
        .into_iter()
        .map(|value| {
            let (url, value, tx) = (url.to_string(), value.to_string(), tx.clone());
            thread::spawn(move || candidate(url, value, tx))
        })
        .collect();
    let wait = Duration::from_secs(10);
    let no_leader = |_| Error::InvalidArgument("no candidate led within 10 s");

    let first: Leading = leaders.recv_timeout(wait).map_err(no_leader)?;
    next_change("elected")?;
    let mut conn = redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .map_err(Error::Connection)?;
    // Kill the leader once the two others wait in the queue (`waiters` of LOCK.INFO), so that
    // the next takes over in the same step.
    let queued = Instant::now();
    while waiters(&mut conn, "service:leader")? < 2 {
        if queued.elapsed() > wait {
            return Err(Error::InvalidArgument(
                "the candidates did not queue within 10 s",
            ));
        }
        thread::sleep(Duration::from_millis(1));
    }
    println!("killing {}'s connection", first.value);
    let killed = Instant::now();
    redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(first.connection)
        .query::<i64>(&mut conn)
        .map_err(Error::Server)?;
    let second: Leading = leaders.recv_timeout(wait).map_err(no_leader)?;
    println!(
        "{} leads {:?} after the kill, term {} > {}",
        second.value,
        killed.elapsed(),
        second.term,
        first.term
    );
    next_change("took over")?;

    let _ = second.resign.send(());
    let third: Leading = leaders.recv_timeout(wait).map_err(no_leader)?;
    next_change("after a resignation")?;
    let _ = third.resign.send(());
    next_change("the last one resigned")?;
    for candidate in candidates {
        candidate.join().expect("a candidate panicked")?;
    }
    Ok(seen)
}

/// The `waiters` field of `LOCK.INFO key` (0 when no one holds it).
fn waiters(conn: &mut redis::Connection, key: &str) -> Result<i64, Error> {
    let info: Option<Vec<redis::Value>> = redis::cmd("LOCK.INFO")
        .arg(key)
        .query(conn)
        .map_err(Error::Server)?;
    let fields = info.unwrap_or_default();
    let waiters = fields.chunks(2).find_map(|pair| match pair {
        [redis::Value::BulkString(name), redis::Value::Int(n)] if name == b"waiters" => Some(*n),
        _ => None,
    });
    Ok(waiters.unwrap_or(0))
}

#[allow(dead_code)]
fn main() {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:6379/".to_string());
    if let Err(e) = run(&url) {
        eprintln!("{e}");
        std::process::exit(1);
    }
}
