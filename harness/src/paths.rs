//! Where the programs and files come from: the server binary of the matrix, the module, the
//! CLI, Sentinel, the clock-shift library, and the per-test directories.

use std::path::{Path, PathBuf};

/// The workspace root (this crate lives in `<root>/harness`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the harness crate sits in the workspace root")
        .to_path_buf()
}

/// The server binary: `REDIS_SERVER`, else Debian's `/usr/bin/redis-server` if it exists (as
/// the Makefile), else `redis-server` on `PATH`.
pub fn server_bin() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| {
        if Path::new("/usr/bin/redis-server").exists() {
            "/usr/bin/redis-server".to_string()
        } else {
            "redis-server".to_string()
        }
    })
}

/// The `redis-cli` binary: `REDIS_CLI`, else `redis-cli` on `PATH`.
pub fn cli_bin() -> String {
    std::env::var("REDIS_CLI").unwrap_or_else(|_| "redis-cli".to_string())
}

/// How to start a Sentinel: the binary, and what goes after its config file's path
/// (`redis-sentinel <conf>`, or `redis-server <conf> --sentinel`, the same program).
/// `REDIS_SENTINEL` if set, else `redis-sentinel` if on `PATH`, else the server binary.
pub fn sentinel_cmd() -> (String, Vec<String>) {
    if let Ok(bin) = std::env::var("REDIS_SENTINEL") {
        return (bin, vec![]);
    }
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).any(|d| d.join("redis-sentinel").is_file()))
        .unwrap_or(false);
    if on_path {
        ("redis-sentinel".to_string(), vec![])
    } else {
        (server_bin(), vec!["--sentinel".to_string()])
    }
}

/// The module: `REDIS_LOCK_MODULE`, else `<root>/target/debug/libredis_lock.so` (what
/// `cargo build` at the root produces). Not checked; see [`module_path()`].
pub fn module_file() -> PathBuf {
    match std::env::var_os("REDIS_LOCK_MODULE") {
        Some(path) => PathBuf::from(path),
        None => workspace_root().join("target/debug/libredis_lock.so"),
    }
}

/// [`module_file`] as an argument; panics with the command that builds it if it is missing.
pub fn module_path() -> String {
    let path = module_file();
    assert!(
        path.is_file(),
        "module not found at {} (run `cargo build`, or set REDIS_LOCK_MODULE)",
        path.display()
    );
    path_arg(&path)
}

/// A path as a command-line argument.
pub fn path_arg(path: &Path) -> String {
    path.to_str()
        .unwrap_or_else(|| panic!("non-UTF-8 path {}", path.display()))
        .to_string()
}

/// A fresh directory name for one test's processes: `<tmp>/redis-lock-tests/<prefix>-<uuid>`
/// (not created here).
pub fn test_dir(prefix: &str) -> PathBuf {
    std::env::temp_dir()
        .join("redis-lock-tests")
        .join(format!("{prefix}-{}", uuid::Uuid::new_v4()))
}
