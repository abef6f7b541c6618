//! A measurement, not a check (ignored by default): lock throughput on one master vs three.

use super::*;

/// Not a check: prints LOCK.ACQUIRE + LOCK.RELEASE cycles per second with every client thread
/// on one master, then with the same threads spread over the three masters, and what each
/// master's process spent in CPU for them.
///
/// `REDIS_LOCK_MODULE=$PWD/target/release/libredis_lock.so cargo test --release --test cluster
///  -- --ignored --nocapture throughput` (threads and seconds: `LOCK_BENCH_THREADS`,
/// `LOCK_BENCH_SECS`).
#[test]
#[ignore = "a measurement, not a check; run with --ignored --nocapture"]
fn throughput_one_master_vs_three() {
    let _turn = one_at_a_time();
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let threads = env("LOCK_BENCH_THREADS", 6) as usize;
    let secs = env("LOCK_BENCH_SECS", 3);
    let cores = thread::available_parallelism().map_or(0, |n| n.get());
    let cluster = Cluster::start();
    let mut any = cluster.nodes[0].conn();
    let keys: Vec<Vec<String>> = (0..MASTERS)
        .map(|s| cluster.keys_on(&mut any, s, threads, "bench"))
        .collect();

    println!(
        "\ncluster throughput: LOCK.ACQUIRE + LOCK.RELEASE cycles (2 commands each, one in \
         flight per connection), {threads} client threads, {secs} s per run"
    );
    println!(
        "machine: {cores} cores, shared by the client threads and all 6 servers (3 masters, \
         3 replicas); module {}",
        nodes::module_path()
    );
    for used in [1, MASTERS] {
        // Thread i drives shard i % used, on a key of its own.
        let plan: Vec<(usize, String)> = (0..threads)
            .map(|i| (i % used, keys[i % used][i].clone()))
            .collect();
        let cpu_before: Vec<f64> = cluster.nodes.iter().map(server_cpu).collect();
        let barrier = Barrier::new(threads);
        let started = Instant::now();
        let counts: Vec<u64> = thread::scope(|scope| {
            let handles: Vec<_> = plan
                .iter()
                .map(|(s, key)| {
                    let barrier = &barrier;
                    let port = cluster.master_node(*s).port();
                    scope.spawn(move || {
                        let mut c = nodes::connect(port);
                        let owner = format!("bench-{key}");
                        barrier.wait();
                        let end = Instant::now() + Duration::from_secs(secs);
                        let mut n = 0u64;
                        while Instant::now() < end {
                            must_acquire(&mut c, key, owner.as_str(), 10_000);
                            assert_eq!(release(&mut c, key, owner.as_str()), 1);
                            n += 1;
                        }
                        n
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let wall = started.elapsed().as_secs_f64();
        let cpu: Vec<f64> = cluster
            .nodes
            .iter()
            .zip(&cpu_before)
            .map(|(n, before)| server_cpu(n) - before)
            .collect();

        println!("\n{used} master(s) in use:");
        println!("  master  port   threads   cycles/s    cmds/s  master CPU  cmds per master CPU-s  replica CPU");
        let mut total = 0u64;
        for s in 0..used {
            let cycles: u64 = plan
                .iter()
                .zip(&counts)
                .filter(|((ps, _), _)| *ps == s)
                .map(|(_, n)| n)
                .sum();
            total += cycles;
            let shard = &cluster.shards[s];
            let (mcpu, rcpu) = (cpu[shard.master], cpu[shard.replica]);
            let cmds = 2.0 * cycles as f64;
            println!(
                "  {s:>6}  {:>5}  {:>7}  {:>9.0}  {:>8.0}  {:>9.0}%  {:>20.0}  {:>10.0}%",
                cluster.nodes[shard.master].port(),
                plan.iter().filter(|(ps, _)| *ps == s).count(),
                cycles as f64 / wall,
                cmds / wall,
                100.0 * mcpu / wall,
                cmds / mcpu,
                100.0 * rcpu / wall,
            );
        }
        let all_cpu: f64 = cpu.iter().sum();
        println!(
            "  total: {:.0} cycles/s = {:.0} cmds/s; {:.0} cmds/s per core of this {cores}-core \
             machine; all 6 servers used {:.2} cores",
            total as f64 / wall,
            2.0 * total as f64 / wall,
            2.0 * total as f64 / wall / cores.max(1) as f64,
            all_cpu / wall
        );
    }
}

/// `used_cpu_sys + used_cpu_user` of a node, in seconds.
fn server_cpu(node: &Node) -> f64 {
    let mut c = node.conn();
    ["used_cpu_sys", "used_cpu_user"]
        .iter()
        .map(|f| {
            nodes::info_field(&mut c, "cpu", f)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("INFO cpu {f}"))
        })
        .sum()
}
