// A session: one lease for several locks, renewed by one keepalive, ended the moment this
// process dies (BOUND). Run it against a server with the module loaded:
//
// ```sh
// cargo run -p redis-lock-client --example session -- redis://127.0.0.1:6379/
// ```
//
// `tests/session.rs` (`sync::the_readme_example_runs`) runs `run` against a test server.

use std::time::Duration;

use redis_lock_client::{Client, Error, MultiLock, Semaphore, Session};

pub fn run(url: &str) -> Result<(), Error> {
    let client = Client::open(url)?;

    // LOCK.SESSION OPEN 10000 BOUND LOCKDELAY 1000, on a connection the session keeps to itself.
    // If this process crashes, the server ends the session (and releases every lock in it) as
    // soon as that connection closes; others wait the lock delay, 1 s, not the 10 s TTL.
    let session = Session::builder(&client, Duration::from_secs(10))
        .bound(true)
        .lock_delay(Duration::from_secs(1))
        .open()?;

    // Locks in the session: ttl 0 means no deadline of their own (they live as long as the
    // session), and none needs a watchdog: the session's keepalive covers them all.
    let locks = session.client();
    let Some(order) = MultiLock::new(&locks, &["{order:7}:items", "{order:7}:payment"])
        .acquire(Duration::ZERO)?
    else {
        println!("order 7 is busy");
        return Ok(());
    };
    let Some(permit) = Semaphore::new(&client, "payments-api", 4)
        .session(&session)
        .acquire(Duration::ZERO)?
    else {
        println!("no payments-api permit free");
        return Ok(());
    };
    println!(
        "order 7 tokens {:?}, permit {}",
        order.tokens(),
        permit.token()
    );

    for _step in 0..3 {
        // The session's loss (and each guard's: they report the same) tells the worker to stop.
        if let Some(reason) = session.wait_lost(Duration::from_millis(10)) {
            println!("stop: {reason}");
            return Ok(());
        }
        // ... one step of work, fenced with order.fenced_by(key, command) ...
    }

    // Releases every hold in the session at once, with no lock delay.
    let released = session.close()?;
    println!("closed the session: {released:?} holds released");
    Ok(())
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
