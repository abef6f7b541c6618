//! Redlock over five independent servers: majority grants, contention versus unavailability,
//! expiry of the validity time, and acquisition latency with masters down.

mod support;

use std::time::{Duration, Instant};

use redis_lock_client::{Redlock, RedlockError};
use support::{five_servers, holders, raw_acquire, unique_key, urls, Server};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn redlock_over(servers: &[Server]) -> Redlock {
    Redlock::new(&urls(servers)).unwrap()
}

#[test]
fn acquires_on_a_majority_and_tells_contention_from_expiry() {
    let servers = five_servers();
    let redlock = redlock_over(&servers);
    assert_eq!((redlock.masters(), redlock.quorum()), (5, 3));

    // Acquire and release on all five.
    let key = unique_key("redlock");
    let guard = redlock.acquire(&key, ms(10_000)).unwrap();
    assert_eq!(guard.granted(), 5);
    let max = guard.tokens().iter().flatten().max().copied();
    assert_eq!(Some(guard.token()), max, "combined token is the maximum");
    assert!(guard.validity() > ms(9_000) && guard.validity() <= ms(10_000));
    assert_eq!(holders(&servers, &key), vec![true; 5]);
    let first = guard.token();
    assert_eq!(guard.release(), 5);
    assert_eq!(holders(&servers, &key), vec![false; 5]);

    // Dropping releases too; the next combined token is larger (one machine, one clock).
    {
        let guard = redlock.acquire(&key, ms(10_000)).unwrap();
        assert!(guard.token() > first);
    }
    assert_eq!(holders(&servers, &key), vec![false; 5]);

    // A competitor holds the key on three masters: contention, and our two grants are undone.
    for server in &servers[..3] {
        raw_acquire(&mut server.conn(), &key, "competitor", 10_000).expect("free");
    }
    match redlock.acquire(&key, ms(10_000)) {
        Err(RedlockError::Contended { granted, needed }) => assert_eq!((granted, needed), (2, 3)),
        other => panic!("expected Contended, got {other:?}"),
    }
    assert_eq!(
        holders(&servers, &key),
        vec![true, true, true, false, false]
    );

    // A master that stops answering eats the whole validity of a short ttl: Expired, and the
    // four grants are undone.
    let key = unique_key("expired");
    servers[4].signal("STOP");
    let result = redlock.acquire(&key, ms(50));
    servers[4].signal("CONT");
    match result {
        Err(RedlockError::Expired { granted, elapsed }) => {
            println!("redlock acquire, 5 masters, 1 stopped (SIGSTOP): Expired after {elapsed:?}");
            assert_eq!(granted, 4);
            assert!(elapsed >= ms(50), "{elapsed:?}");
        }
        other => panic!("expected Expired, got {other:?}"),
    }
    assert_eq!(holders(&servers[..4], &key), vec![false; 4]);
}

#[test]
fn survives_two_masters_down_and_reports_three_down_as_unavailable() {
    let mut servers = five_servers();
    let redlock = redlock_over(&servers);

    for down in 0..=2 {
        if down > 0 {
            servers[down - 1].kill9();
        }
        let key = unique_key("latency");
        let mut times = Vec::new();
        for _ in 0..30 {
            let start = Instant::now();
            let guard = redlock
                .acquire(&key, ms(10_000))
                .unwrap_or_else(|e| panic!("{down} master(s) down: {e}"));
            times.push(start.elapsed());
            assert_eq!(guard.granted(), 5 - down);
            assert!(guard.tokens()[..down].iter().all(Option::is_none));
            drop(guard);
        }
        times.sort();
        let mean = times.iter().sum::<Duration>() / times.len() as u32;
        println!(
            "redlock acquire, 5 masters, {down} down (kill -9): mean {mean:?}, p50 {:?}, \
             p90 {:?}, max {:?} over {} runs",
            times[times.len() / 2],
            times[times.len() * 9 / 10],
            times[times.len() - 1],
            times.len()
        );
    }

    servers[2].kill9();
    match redlock.acquire(&unique_key("unavailable"), ms(10_000)) {
        Err(RedlockError::Unavailable {
            reachable,
            needed,
            errors,
        }) => {
            assert_eq!((reachable, needed), (2, 3));
            let failed: Vec<usize> = errors.iter().map(|(i, _)| *i).collect();
            assert_eq!(failed, vec![0, 1, 2]);
            assert!(errors.iter().all(|(_, e)| e.is_unavailable()));
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}
