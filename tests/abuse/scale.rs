//! Scale: thousands of blocked waiters on one key are served in order, and many locks at once;
//! the memory both take comes back once they are gone.

use super::*;

#[test]
fn thousands_of_waiters_are_served_in_order_and_their_memory_comes_back() {
    let wanted = env_usize("WAITERS", 2000);
    // Each waiter is one socket here and one client there; leave room for everything else.
    let limit = fd_soft_limit().unwrap_or(1024) as usize;
    let n = wanted.min(limit.saturating_sub(256));
    if n < wanted {
        eprintln!("waiters: the open-file limit is {limit}; using {n} waiters instead of {wanted}");
    }
    assert!(
        n >= 100,
        "open-file limit {limit} leaves room for only {n} waiters"
    );
    let maxclients = (n + 64).to_string();
    let server = Server::start_with(&["--maxclients", &maxclients]);
    let mut c = server.conn();
    let key = "waiters:k";
    let holder_token = must_acquire(&mut c, key, "holder", LONG_TTL);

    let baseline = used_memory(&mut c);
    let mut streams = open_clients(&server, &mut c, n, "waiter");
    let connected = used_memory(&mut c);

    // One at a time, so that arrival order is known: waiter i is queued i-th.
    for (i, stream) in streams.iter_mut().enumerate() {
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        // A ttl far longer than the test: on a loaded machine the walk down 2,000 waiters
        // takes seconds, and a grant that expired before its release would pass the lock on.
        let cmd = format!(
            "*6\r\n$12\r\nLOCK.ACQUIRE\r\n${}\r\n{key}\r\n${}\r\nw{i}\r\n$6\r\n600000\r\n$5\r\nBLOCK\r\n$1\r\n0\r\n",
            key.len(),
            format!("w{i}").len()
        );
        stream.write_all(cmd.as_bytes()).expect("send waiter");
        let deadline = Instant::now() + PATIENCE;
        while lock_stat(&mut c, "waiters") < i as i64 + 1 {
            assert!(Instant::now() < deadline, "waiter {i} never blocked");
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    assert_eq!(lock_stat(&mut c, "waiters"), n as i64);
    assert_eq!(lock_stat(&mut c, "waiting_keys"), 1);
    assert_eq!(info_int(&mut c, "clients", "blocked_clients"), n as i64);
    assert_eq!(lock_info(&mut c, key).map(|i| i.3), Some(n as i64));
    let blocked = used_memory(&mut c);

    // Hand the lock down the queue: each release must go to the next waiter in arrival order
    // (the release by w{i} returns 1 only if w{i} was granted), with increasing tokens.
    let handed_before = lock_stat(&mut c, "handed_off");
    assert_eq!(release(&mut c, key, "holder"), 1);
    let mut last = holder_token;
    let mut readers: Vec<BufReader<TcpStream>> = streams.drain(..).map(BufReader::new).collect();
    for (i, reader) in readers.iter_mut().enumerate() {
        let line = read_resp_line(reader);
        let token: i64 = line
            .strip_prefix(':')
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("waiter {i}: expected a token, got {line:?}"));
        assert!(token > last, "waiter {i}: token {token} not above {last}");
        last = token;
        if i % 97 == 0 || i == n - 1 {
            let info = lock_info(&mut c, key).expect("held");
            assert_eq!(
                (info.0, info.1, info.3),
                (format!("w{i}").into_bytes(), token, (n - 1 - i) as i64),
                "sample {i}"
            );
        }
        assert_eq!(
            release(&mut c, key, format!("w{i}")),
            1,
            "w{i} should hold the lock (arrival order)"
        );
    }
    assert_eq!(fence(&mut c, key), None);
    assert_eq!(lock_stat(&mut c, "waiters"), 0);
    assert_eq!(lock_stat(&mut c, "waiting_keys"), 0);
    assert_eq!(lock_stat(&mut c, "handed_off") - handed_before, n as i64);
    let served = used_memory(&mut c);

    drop(readers);
    wait_until("the waiters to disconnect", PATIENCE, || {
        info_int(&mut c, "clients", "connected_clients") == 1
    });
    let disconnected = used_memory(&mut c);
    // Some slack: the module keeps the capacity of its client map, the allocator its caches.
    let slack = (512 * 1024).max((blocked - baseline) / 100);
    // The server keeps a pool of the reply clients it made for blocked module clients (about
    // 32 KB each on 7.0) and trims it over a few seconds: wait for that.
    let settle_started = Instant::now();
    let after = settle_memory(&mut c, baseline, slack);
    let per_client = (connected - baseline) as f64 / n as f64;
    let per_waiter = (blocked - connected) as f64 / n as f64;
    let pool = (disconnected - baseline) as f64 / n as f64;
    eprintln!(
        "waiters: n={n} used_memory baseline={baseline} connected={connected} \
         (+{per_client:.0} B per idle client) blocked={blocked} (+{per_waiter:.0} B per \
         blocked waiter; {:.0} B per client in all) all-served={served} \
         disconnected={disconnected} (baseline {:+}, {pool:.0} B per waiter kept by the \
         server's pool of module reply clients) settled={after} (baseline {:+}, after {:?})",
        (blocked - baseline) as f64 / n as f64,
        disconnected - baseline,
        after - baseline,
        settle_started.elapsed()
    );
    assert!(
        after - baseline <= slack,
        "used_memory {after} is {} above the baseline {baseline} {:?} after every waiter \
         left (slack {slack})",
        after - baseline,
        settle_started.elapsed()
    );

    // For comparison, what the server itself charges for a client blocked in BLPOP (its
    // query buffer and blocking state, no module involved).
    let blpop_baseline = used_memory(&mut c);
    let mut streams = open_clients(&server, &mut c, n, "BLPOP client");
    let blpop_connected = used_memory(&mut c);
    for stream in &mut streams {
        stream
            .write_all(b"*3\r\n$5\r\nBLPOP\r\n$6\r\nblpop:\r\n$1\r\n0\r\n")
            .expect("send BLPOP");
    }
    wait_until("every BLPOP client blocked", PATIENCE, || {
        info_int(&mut c, "clients", "blocked_clients") as usize == n
    });
    let blpop_blocked = used_memory(&mut c);
    drop(streams);
    eprintln!(
        "waiters: for comparison, BLPOP: +{:.0} B per blocked client (baseline \
         {blpop_baseline}, connected {blpop_connected}, blocked {blpop_blocked})",
        (blpop_blocked - blpop_connected) as f64 / n as f64
    );
    assert_clean_log(&server);
}

/// Wait until `used_memory` is within `slack` of `baseline` and has stopped falling for a
/// second (the server shrinks its hash tables and trims its pool of module reply clients from
/// its cron, a little at a time), or 30 s have passed; return the last reading.
/// `n` bare connections to `server` (`what` each is, for the messages), all seen connected.
fn open_clients(server: &Server, c: &mut Connection, n: usize, what: &str) -> Vec<TcpStream> {
    let streams: Vec<TcpStream> = (0..n)
        .map(|_| {
            TcpStream::connect(("127.0.0.1", server.port()))
                .unwrap_or_else(|e| panic!("connect {what}: {e}"))
        })
        .collect();
    wait_until(&format!("every {what} connected"), PATIENCE, || {
        info_int(c, "clients", "connected_clients") as usize > n
    });
    streams
}

fn settle_memory(c: &mut Connection, baseline: i64, slack: i64) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut lowest = used_memory(c);
    let mut lowest_at = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let now = used_memory(c);
        if now < lowest {
            lowest = now;
            lowest_at = Instant::now();
        }
        let stable = lowest_at.elapsed() >= Duration::from_secs(1);
        if (now - baseline <= slack && stable) || Instant::now() >= deadline {
            return now;
        }
    }
}

// --- Many locks ------------------------------------------------------------------------

/// Pipeline `cmd key(i) ...` for every `i` in `range`, in batches; return every reply.
fn pipelined(
    c: &mut Connection,
    range: std::ops::Range<usize>,
    mut build: impl FnMut(&mut redis::Pipeline, usize),
) -> Vec<Value> {
    const BATCH: usize = 10_000;
    let mut replies = Vec::with_capacity(range.len());
    let mut start = range.start;
    while start < range.end {
        let end = (start + BATCH).min(range.end);
        let mut pipe = redis::pipe();
        for i in start..end {
            build(&mut pipe, i);
        }
        let batch: Vec<Value> = pipe.query(c).expect("pipeline");
        replies.extend(batch);
        start = end;
    }
    replies
}

fn lock_key(i: usize) -> String {
    format!("many:{i:08}")
}

/// A typical owner: 36 bytes, like a UUID.
fn lock_owner(i: usize) -> String {
    format!("{i:08x}-0000-4000-8000-000000000000")
}

#[test]
fn many_locks_cost_and_cleanup() {
    let count = env_usize("LOCK_COUNT", 100_000);
    let (server, mut c) = start();
    let started = Instant::now();

    let baseline = used_memory(&mut c);
    let replies = pipelined(&mut c, 0..count, |p, i| {
        p.cmd("LOCK.ACQUIRE")
            .arg(lock_key(i))
            .arg(lock_owner(i))
            .arg(LONG_TTL);
    });
    let mut last = 0;
    for (i, r) in replies.iter().enumerate() {
        match r {
            Value::Int(t) if *t > last => last = *t,
            other => panic!(
                "LOCK.ACQUIRE {}: {other:?} (previous token {last})",
                lock_key(i)
            ),
        }
    }
    assert_eq!(lock_stat(&mut c, "locks"), count as i64);
    assert_eq!(dbsize(&mut c), count as i64);
    let held = used_memory(&mut c);
    let acquire_time = started.elapsed();

    // Release the even ones; let the odd ones expire (deadline moved to 1 ms from now).
    let expired_before = lock_stat(&mut c, "expired");
    let replies = pipelined(&mut c, 0..count, |p, i| {
        if i % 2 == 0 {
            p.cmd("LOCK.RELEASE").arg(lock_key(i)).arg(lock_owner(i));
        } else {
            p.cmd("LOCK.EXTEND")
                .arg(lock_key(i))
                .arg(lock_owner(i))
                .arg(1);
        }
    });
    assert!(
        replies.iter().all(|r| *r == Value::Int(1)),
        "every release and extend should answer 1"
    );
    wait_until("lock_locks == 0 after release and expiry", PATIENCE, || {
        lock_stat(&mut c, "locks") == 0
    });
    assert_eq!(dbsize(&mut c), 0);
    assert!(
        lock_stat(&mut c, "expired") - expired_before >= (count / 2) as i64 - 1,
        "lock_expired should count the expired half"
    );
    let slack = (1 << 20).max((held - baseline) / 50);
    let freed = settle_memory(&mut c, baseline, slack);

    // The same thing with the usual recipe: SET key owner NX PX ttl.
    let set_baseline = used_memory(&mut c);
    let replies = pipelined(&mut c, 0..count, |p, i| {
        p.cmd("SET")
            .arg(lock_key(i))
            .arg(lock_owner(i))
            .arg("NX")
            .arg("PX")
            .arg(LONG_TTL);
    });
    assert!(replies.iter().all(|r| *r == Value::Okay));
    let set_held = used_memory(&mut c);
    let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    let set_freed = settle_memory(&mut c, set_baseline, slack);

    let per_lock = (held - baseline) as f64 / count as f64;
    let per_set = (set_held - set_baseline) as f64 / count as f64;
    eprintln!(
        "many_locks: {count} locks (key {} B, owner {} B) acquired in {acquire_time:?}; \
         used_memory baseline={baseline} held={held} ({per_lock:.1} B per lock) \
         after release+expiry={freed} (baseline {:+}); SET NX PX: baseline={set_baseline} \
         held={set_held} ({per_set:.1} B per key) after FLUSHALL={set_freed} (baseline {:+}); \
         lock/SET = {:.2}",
        lock_key(0).len(),
        lock_owner(0).len(),
        freed - baseline,
        set_freed - set_baseline,
        per_lock / per_set
    );
    assert!(
        freed - baseline <= slack,
        "used_memory {freed} did not return near the baseline {baseline} (slack {slack})"
    );
    assert_eq!(lock_stat(&mut c, "locks"), 0);
    assert_clean_log(&server);
}
