//! A shifted wall clock for one server process: the project's LD_PRELOAD library
//! (`tests/clockshift/clockshift.c`, built by `make clockshift`) adds an offset to
//! `CLOCK_REALTIME`, `gettimeofday` and `time`, read from a file on every call, so a test can
//! move the clock of a running server. Monotonic clocks are left alone.
//!
//! Environment: `CLOCKSHIFT_LIB`, the library (default `<workspace>/target/clockshift/
//! libclockshift.so`).

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The library, as an absolute path; panics with the command that builds it.
pub fn library() -> PathBuf {
    let path = match std::env::var_os("CLOCKSHIFT_LIB") {
        Some(path) => PathBuf::from(path),
        None => crate::workspace_root().join("target/clockshift/libclockshift.so"),
    };
    assert!(
        path.is_file(),
        "the clock-shift library is not at {} (run `make clockshift`, or set CLOCKSHIFT_LIB)",
        path.display()
    );
    path
}

/// The width of the offset field in the file (the library reads at most this many bytes).
const FIELD: usize = 32;

/// A clock offset file; give [`ShiftedClock::env`] to the process whose clock it shifts.
pub struct ShiftedClock {
    file: PathBuf,
}

impl ShiftedClock {
    /// A clock `offset_ms` away from the real one (negative: behind), kept in a file that
    /// lives as long as the test's directory: `dir` is created if needed.
    pub fn new(dir: &Path, offset_ms: i64) -> ShiftedClock {
        fs::create_dir_all(dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let file = dir.join(format!("clockshift-{}", uuid::Uuid::new_v4()));
        let mut f = OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(&file)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", file.display()));
        f.write_all(&field(offset_ms))
            .expect("write the clock offset");
        ShiftedClock { file }
    }

    /// Move the clock to `offset_ms` from the real one; the process sees it at its next read.
    pub fn set(&self, offset_ms: i64) {
        let f = OpenOptions::new()
            .write(true)
            .open(&self.file)
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", self.file.display()));
        // One write of the whole field at offset 0, in place: the mapping sees the new bytes.
        f.write_all_at(&field(offset_ms), 0)
            .expect("rewrite the clock offset");
    }

    /// `LD_PRELOAD` and `CLOCKSHIFT_FILE` for the shifted process.
    pub fn env(&self) -> Vec<(String, String)> {
        let lib = library();
        vec![
            ("LD_PRELOAD".into(), lib.to_string_lossy().into_owned()),
            (
                "CLOCKSHIFT_FILE".into(),
                self.file.to_string_lossy().into_owned(),
            ),
        ]
    }
}

impl Drop for ShiftedClock {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.file);
    }
}

fn field(offset_ms: i64) -> [u8; FIELD] {
    let mut out = [b' '; FIELD];
    let text = offset_ms.to_string();
    out[..text.len()].copy_from_slice(text.as_bytes());
    out
}
