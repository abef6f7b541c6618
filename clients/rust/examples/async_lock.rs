// The async API in one piece: a blocking acquire, a watchdog, work that stops when the lock is
// lost, and Redlock. Run it against a server with the module loaded:
//
// ```sh
// cargo run -p redis-lock-client --features tokio --example async_lock -- redis://127.0.0.1:6379/
// ```
//
// `tests/client.rs` (`aio::the_readme_example_runs`) runs `run` against a test server.

use std::time::Duration;

use redis_lock_client::aio::{Client, Redlock};
use redis_lock_client::Error;

pub async fn run(url: &str) -> Result<(), Error> {
    let client = Client::open(url)?;

    // Wait up to 5 s in the server's FIFO queue: one LOCK.ACQUIRE ... BLOCK 5000.
    let Some(mut guard) = client
        .acquire_blocking(
            "job:nightly",
            Duration::from_secs(3),
            Duration::from_secs(5),
        )
        .await?
    else {
        println!("still held by someone else after 5 s");
        return Ok(());
    };
    println!("{} held with token {}", guard.key(), guard.token());

    // Renew every second (ttl / 3) while working; stop at once if a renewal fails.
    guard.start_watchdog()?;
    tokio::select! {
        reason = guard.lost() => {
            eprintln!("lost the lock, stopping: {reason}");
            return Ok(());
        }
        _ = work(guard.token()) => {}
    }
    println!("released: {}", guard.release().await?); // true: it was still ours

    // Redlock over independent masters (here the same server three times, for the demo only).
    let redlock = Redlock::new(&[url, url, url])?;
    match redlock.acquire("report", Duration::from_secs(5)).await {
        Ok(guard) => {
            println!(
                "redlock token {}, valid {:?}",
                guard.token(),
                guard.validity()
            );
            guard.release().await;
        }
        Err(e) => eprintln!("redlock: {e}"),
    }
    Ok(())
}

/// Some steps of work, each fenced with the token (the resource rejects older tokens).
async fn work(token: u64) {
    for step in 0..3 {
        println!("step {step} with token {token}");
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:6379/".to_string());
    run(&url).await
}
