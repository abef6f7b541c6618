//! How long a connection blip takes to heal (issue 29: the data for the default `GRACE`): a
//! bound session opened with a grace through this client holds a lock; its bound connection is
//! killed (`CLIENT KILL`, as a proxy or a network reset would drop it), and the time from that
//! command to the moment the server shows the session bound to a new connection (the client's
//! thread noticed the close, reconnected and `LOCK.SESSION ATTACH`ed it) is measured. Every
//! round also checks that the lock kept its token and that no loss was reported.
//!
//! Starts its own server (the workspace's harness: `REDIS_SERVER`, `REDIS_LOCK_MODULE`), sync API:
//!
//! ```sh
//! cargo run -p redis-lock-client --example grace_reattach -- [rounds, default 20] [grace ms, default 1000]
//! ```

use std::time::{Duration, Instant};

use harness::Server;
use redis::Value;
use redis_lock_client::{Client, Session};

fn bound_to(conn: &mut redis::Connection, id: &str) -> Option<i64> {
    let info: Value = redis::cmd("LOCK.SESSION")
        .arg("INFO")
        .arg(id)
        .query(conn)
        .expect("LOCK.SESSION INFO");
    let Value::Array(pairs) = info else {
        panic!("the session is gone: {info:?}");
    };
    pairs.chunks(2).find_map(|kv| match kv {
        [Value::BulkString(k), Value::Int(id)] if k == b"bound" => Some(*id),
        _ => None,
    })
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().map_or(20, |a| a.parse().expect("rounds"));
    let grace_ms: u64 = args.next().map_or(1000, |a| a.parse().expect("grace ms"));
    let server = Server::start();
    let client = Client::open(server.url().as_str()).expect("client");
    let mut probe = server.conn();
    let mut heals = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let session = Session::builder(&client, Duration::from_secs(30))
            .bound(true)
            .grace(Duration::from_millis(grace_ms))
            .open()
            .expect("open");
        let key = format!("grace-probe-{round}");
        let guard = session
            .client()
            .acquire(&key, Duration::ZERO)
            .expect("acquire")
            .expect("free");
        let old = bound_to(&mut probe, session.id()).expect("bound");
        let killed_at = Instant::now();
        let killed: i64 = redis::cmd("CLIENT")
            .arg(&["KILL", "ID", &old.to_string()])
            .query(&mut probe)
            .expect("CLIENT KILL");
        assert_eq!(killed, 1);
        let healed = loop {
            if bound_to(&mut probe, session.id()).is_some_and(|id| id != old) {
                break killed_at.elapsed();
            }
            assert!(
                killed_at.elapsed() < Duration::from_millis(grace_ms),
                "round {round}: not re-attached within the {grace_ms} ms grace"
            );
        };
        let token: Option<i64> = redis::cmd("LOCK.FENCE")
            .arg(&key)
            .query(&mut probe)
            .expect("LOCK.FENCE");
        assert_eq!(
            token,
            Some(guard.token() as i64),
            "round {round}: token changed"
        );
        assert!(
            !session.is_lost(),
            "round {round}: {:?}",
            session.loss_reason()
        );
        println!(
            "round {round:2}: CLIENT KILL to ATTACH {:7.3} ms",
            ms(healed)
        );
        heals.push(healed);
        guard.release().expect("release");
        session.close().expect("close");
    }
    heals.sort();
    println!(
        "{rounds} rounds, grace {grace_ms} ms: p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        ms(percentile(&heals, 50.0)),
        ms(percentile(&heals, 99.0)),
        ms(*heals.last().unwrap()),
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
