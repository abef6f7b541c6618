//! Holder processes: the test binary re-executed as one worker that the nemesis can `SIGSTOP`
//! and `SIGKILL`, writing its history to a file.

use super::*;

/// The environment variable that turns the test binary into a holder process.
pub const HOLDER_ENV: &str = "TORTURE_HOLDER";

/// What a holder process is told, as `HOLDER_ENV`'s value:
/// `port keys name secs ttl_min ttl_max seed history-file`.
pub struct HolderSpec {
    pub port: u16,
    pub keys: usize,
    pub name: String,
    pub secs: f64,
    pub ttl_ms: (i64, i64),
    pub seed: u64,
    pub file: String,
}

impl HolderSpec {
    pub fn encode(&self) -> String {
        format!(
            "{} {} {} {} {} {} {} {}",
            self.port,
            self.keys,
            self.name,
            self.secs,
            self.ttl_ms.0,
            self.ttl_ms.1,
            self.seed,
            self.file
        )
    }

    fn decode(s: &str) -> Option<HolderSpec> {
        let f: Vec<&str> = s.splitn(8, ' ').collect();
        Some(HolderSpec {
            port: f.first()?.parse().ok()?,
            keys: f.get(1)?.parse().ok()?,
            name: f.get(2)?.to_string(),
            secs: f.get(3)?.parse().ok()?,
            ttl_ms: (f.get(4)?.parse().ok()?, f.get(5)?.parse().ok()?),
            seed: f.get(6)?.parse().ok()?,
            file: f.get(7)?.to_string(),
        })
    }
}

/// The body of a holder process: one worker for `secs`, history to a file. It spends most of
/// each hold between a write's read and its write, so that a `SIGSTOP` usually lands there.
/// Does nothing when `HOLDER_ENV` is not set (a normal test run).
pub fn holder_process_main() {
    let Ok(spec) = std::env::var(HOLDER_ENV) else {
        return;
    };
    let spec = HolderSpec::decode(&spec).unwrap_or_else(|| panic!("bad {HOLDER_ENV}: {spec:?}"));
    let cfg = Config {
        workers: 1,
        keys: spec.keys,
        ttl_ms: spec.ttl_ms,
        hold_ms: (0, 5),
        gap_ms: (10, 30),
        ..Config::default()
    };
    let sink: Arc<dyn Sink> = Arc::new(FileSink::create(std::path::Path::new(&spec.file)));
    let stop = Arc::new(AtomicBool::new(false));
    let worker = Worker::new(
        spec.name.clone(),
        cfg,
        Target::new(spec.port),
        sink,
        stop.clone(),
        spec.seed,
    );
    let until = Instant::now() + Duration::from_secs_f64(spec.secs);
    let handle = thread::spawn(move || worker.run());
    while Instant::now() < until {
        thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    let _ = handle.join();
}
