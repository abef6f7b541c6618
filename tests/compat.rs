//! On a server the module cannot support it refuses to load with one clear log line, and the
//! server does not crash. Run by `make test-servers`, which sets OLD_REDIS_SERVER to Redis 6.2.
//! (Redis 6.2 has no module configs; the module needs 7.0.)

use std::process::Command;
use std::time::{Duration, Instant};

#[test]
#[ignore = "needs OLD_REDIS_SERVER, a Redis 6.2 binary: run by make test-servers"]
fn refuses_to_load_on_redis_6_with_one_clear_line() {
    let server = std::env::var("OLD_REDIS_SERVER")
        .expect("OLD_REDIS_SERVER must name a Redis 6.2 redis-server binary");
    let module = std::env::var("REDIS_LOCK_MODULE").unwrap_or_else(|_| {
        format!(
            "{}/target/debug/libredis_lock.so",
            env!("CARGO_MANIFEST_DIR")
        )
    });
    let dir = std::env::temp_dir().join(format!("redis-lock-compat-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("log");
    // A server that cannot load a module named in its configuration exits at start: that is
    // the refusal. What matters is how: a clean exit with our log line, not a signal.
    let mut child = Command::new(&server)
        // A unix socket only: no TCP port to pick, and the server still starts.
        .args(["--port", "0", "--unixsocket"])
        .arg(dir.join("sock"))
        .arg("--dir")
        .arg(&dir)
        .arg("--logfile")
        .arg(&log)
        .arg("--loadmodule")
        .arg(&module)
        .spawn()
        .expect("start the old server");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the server kept running with a module it cannot support"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(
        status.code(),
        Some(1),
        "exit status {status:?}; log:\n{text}"
    );
    let ours: Vec<&str> = text.lines().filter(|l| l.contains("redis-lock")).collect();
    assert_eq!(ours.len(), 1, "log:\n{text}");
    assert!(
        ours[0].contains("redis-lock needs Redis 7.0 or later"),
        "log:\n{text}"
    );
    assert!(!text.contains("panicked"), "log:\n{text}");
}
