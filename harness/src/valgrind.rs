//! Every server under valgrind memcheck, for `tests/memcheck.sh`.
//!
//! With `REDIS_LOCK_VALGRIND=<dir>` set, each process the harness spawns runs as
//! `valgrind --tool=memcheck ... <program> <args>` (one log per process, `<dir>/vg-<pid>.log`;
//! valgrind runs the program in its own process, so the pid the harness checks with
//! `INFO server` is the server's), waits six times longer to be ready, and is stopped with
//! SIGTERM so that valgrind runs its leak check (SIGKILL after 30 s). `REDIS_LOCK_GRACEFUL_STOP`
//! alone asks for the SIGTERM stop without valgrind.

use std::path::{Path, PathBuf};

/// The directory for valgrind's logs, when every server runs under valgrind.
pub fn log_dir() -> Option<PathBuf> {
    std::env::var_os("REDIS_LOCK_VALGRIND")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// True if servers are stopped with SIGTERM (and a deadline) rather than SIGKILL.
pub fn graceful_stop() -> bool {
    log_dir().is_some() || std::env::var_os("REDIS_LOCK_GRACEFUL_STOP").is_some()
}

/// The suppressions for redis-server's own known false positive (`lzf_compress`).
pub fn suppressions() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("valgrind.supp")
}

/// valgrind's arguments before the program: memcheck, full leak check with definite leaks as
/// errors (exit status 99), logs in `logs`.
pub fn args(logs: &Path) -> Vec<String> {
    vec![
        "--tool=memcheck".into(),
        "--leak-check=full".into(),
        "--errors-for-leak-kinds=definite".into(),
        "--error-exitcode=99".into(),
        "--num-callers=40".into(),
        format!("--suppressions={}", suppressions().display()),
        format!("--log-file={}", logs.join("vg-%p.log").display()),
    ]
}
