//! Redlock over five independent servers, sync and async from one definition: majority grants,
//! contention versus unavailability and expiry, masters killed with `kill -9` (and the
//! acquisition latency then). Then what only the async API has: a cancelled acquisition.

mod apis;
mod support;

use std::time::{Duration, Instant};

use redis_lock_client::RedlockError;
use support::{eventually, five_servers, holders, ms, raw_acquire, unique_key, urls, Server};

macro_rules! shared_tests {
    () => {
        fn redlock_over(servers: &[Server]) -> Redlock {
            Redlock::new(&urls(servers)).unwrap()
        }

        api_test! { fn acquires_on_a_majority_and_tells_contention_from_expiry() {
            let servers = five_servers();
            // Timeouts of 1 s, not the default 100 ms: on a loaded 2-core machine (CI run 37, six
            // suites at once) three of the async API's first five connects took longer. The
            // stopped master below still costs a whole timeout, past the 50 ms ttl.
            let redlock = redlock_over(&servers).with_timeouts(ms(1_000), ms(1_000));
            assert_eq!((redlock.masters(), redlock.quorum()), (5, 3));

            // Acquire and release on all five.
            let key = unique_key("redlock");
            let guard = io!(redlock.acquire(&key, ms(10_000))).unwrap();
            assert_eq!(guard.granted(), 5);
            let max = guard.tokens().iter().flatten().max().copied();
            assert_eq!(Some(guard.token()), max, "combined token is the maximum");
            // ttl - elapsed - drift, drift = ttl / 100 + 2 ms: at most 9,898 ms, and some left.
            assert!(guard.validity() > ms(0) && guard.validity() <= ms(10_000 - 100 - 2));
            assert_eq!(holders(&servers, &key), vec![true; 5]);
            let first = guard.token();
            assert_eq!(io!(guard.release()), 5);
            assert_eq!(holders(&servers, &key), vec![false; 5]);

            // Dropping releases too; the next acquisition from the same Redlock finds the key
            // free, and its combined token is larger (one machine, one clock).
            for _ in 0..5 {
                let guard = io!(redlock.acquire(&key, ms(10_000))).unwrap();
                assert!(guard.token() > first);
            }
            io!(settled("the releases on drop", || holders(&servers, &key) == vec![false; 5]));

            // A competitor holds the key on three masters: contention, and our two grants are
            // undone.
            for server in &servers[..3] {
                raw_acquire(&mut server.conn(), &key, "competitor", 10_000).expect("free");
            }
            match io!(redlock.acquire(&key, ms(10_000))) {
                Err(RedlockError::Contended { granted, needed }) => {
                    assert_eq!((granted, needed), (2, 3))
                }
                other => panic!("expected Contended, got {other:?}"),
            }
            assert_eq!(holders(&servers, &key), vec![true, true, true, false, false]);

            // A master that stops answering eats the whole validity of a short ttl: Expired,
            // and the four grants are undone. (The async API asks the masters at once, so it
            // costs one timeout.)
            let key = unique_key("expired");
            servers[4].signal("STOP");
            let result = io!(redlock.acquire(&key, ms(50)));
            servers[4].signal("CONT");
            match result {
                Err(RedlockError::Expired { granted, elapsed }) => {
                    println!(
                        "{} redlock acquire, 5 masters, 1 stopped (SIGSTOP): Expired after {elapsed:?}",
                        module_path!()
                    );
                    assert_eq!(granted, 4);
                    assert!(elapsed >= ms(50), "{elapsed:?}");
                }
                other => panic!("expected Expired, got {other:?}"),
            }
            assert_eq!(holders(&servers[..4], &key), vec![false; 4]);
        } }

        api_test! { fn survives_two_masters_down_and_reports_three_down_as_unavailable() {
            let mut servers = five_servers();
            // A killed master refuses connections at once, so longer per-master timeouts cost
            // nothing here; the 100 ms defaults made a live master count as down on a loaded
            // machine (seen once: 3 grants of 4).
            let redlock = redlock_over(&servers).with_timeouts(ms(1_000), ms(1_000));

            for down in 0..=2 {
                if down > 0 {
                    servers[down - 1].kill9();
                }
                let key = unique_key("latency");
                let mut times = Vec::new();
                for _ in 0..30 {
                    let start = Instant::now();
                    let guard = io!(redlock.acquire(&key, ms(10_000)))
                        .unwrap_or_else(|e| panic!("{down} master(s) down: {e}"));
                    times.push(start.elapsed());
                    assert_eq!(guard.granted(), 5 - down);
                    assert!(guard.tokens()[..down].iter().all(Option::is_none));
                    io!(guard.release());
                }
                times.sort();
                let mean = times.iter().sum::<Duration>() / times.len() as u32;
                println!(
                    "{} redlock acquire, 5 masters, {down} down (kill -9): mean {mean:?}, \
                     p50 {:?}, p90 {:?}, max {:?} over {} runs",
                    module_path!(),
                    times[times.len() / 2],
                    times[times.len() * 9 / 10],
                    times[times.len() - 1],
                    times.len()
                );
            }

            servers[2].kill9();
            match io!(redlock.acquire(&unique_key("unavailable"), ms(10_000))) {
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
        } }
    };
}

apis::both!(
    shared_tests,
    aio: {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancelled_acquisition_leaves_no_grant_behind() {
        let servers = five_servers();
        // One master stopped, with a long timeout: the round waits for it, and the caller gives
        // up first, after the four others granted.
        let redlock = redlock_over(&servers).with_timeouts(ms(1_000), ms(1_000));
        let key = unique_key("cancelled");
        servers[4].signal("STOP");
        let attempt = tokio::time::timeout(ms(300), redlock.acquire(&key, ms(30_000))).await;
        assert!(attempt.is_err(), "the round should still be waiting");
        assert_eq!(holders(&servers[..4], &key), vec![true; 4]);
        servers[4].signal("CONT");
        // The round ends on its own and its guard, which no one receives, releases everywhere.
        eventually("the abandoned round to be released", ms(3_000), || {
            holders(&servers, &key) == vec![false; 5]
        })
        .await;
    }
    }
);
