//! A private network namespace for a test that filters packets: its own loopback, so the
//! addresses and `iptables` rules set up inside touch nothing else on the machine. The servers
//! a test starts inside inherit the namespace.

use std::process::Command;
use std::thread;

/// Run `f` on a thread of its own in a new network namespace; the processes it starts inherit
/// the namespace. Not root: the test fails and says why, rather than pass without running
/// (`make test` leaves these scenarios out with `--skip partition_` when not root, and says
/// so). As root, a failure to create the namespace fails the test.
pub fn in_private_netns<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    // SAFETY: geteuid has no preconditions.
    assert!(
        unsafe { libc::geteuid() } == 0,
        "{name} needs root (network namespaces and iptables): run it as root, or leave it out \
         with `--skip partition_`"
    );
    let name = name.to_string();
    let handle = thread::spawn(move || {
        // SAFETY: unshare affects only this thread (and what it starts) and takes no pointers.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(
            rc,
            0,
            "{name}: unshare(CLONE_NEWNET) as root: {}",
            std::io::Error::last_os_error()
        );
        sh(&["ip", "link", "set", "lo", "up"]);
        f()
    });
    handle
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
}

/// Run a command; panic with its output if it fails.
pub fn sh(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {args:?}: {e} (run `make deps`)"));
    assert!(
        out.status.success(),
        "{args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
