//! The README's Rust programs run as pasted: each `rust,no_run` block of `clients/rust/README.md`
//! (whole programs that read `REDIS_URL`) is compiled into this test by `build.rs` and its
//! `main` called against a test server, in README order, with `REDIS_URL` set to it. A Redlock
//! block's five local masters are replaced by three test servers. A block that returns an
//! error or panics fails the test naming its README line.

mod support;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use support::Server;

/// The masters a Redlock block gets in place of 127.0.0.1:6379..6383.
static MASTERS: OnceLock<Vec<String>> = OnceLock::new();

fn redlock_masters() -> Vec<String> {
    MASTERS.get().expect("masters not started").clone()
}

mod blocks {
    #[allow(unused_imports)]
    use super::redlock_masters;
    include!(concat!(env!("OUT_DIR"), "/readme_blocks.rs"));
}

#[test]
fn every_rust_program_of_the_readme_runs() {
    let server = Server::start();
    let others = [Server::start(), Server::start()];
    MASTERS
        .set(
            [&server, &others[0], &others[1]]
                .iter()
                .map(|s| s.url())
                .collect(),
        )
        .unwrap();
    // The only test of this binary: nothing else reads the environment meanwhile.
    std::env::set_var("REDIS_URL", server.url());
    assert!(blocks::BLOCKS.len() >= 9, "{} blocks", blocks::BLOCKS.len());
    let mut conn = server.conn();
    for (line, run) in blocks::BLOCKS {
        let _: () = redis::cmd("FLUSHALL").query(&mut conn).unwrap(); // fixed key names
        match catch_unwind(AssertUnwindSafe(run)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("clients/rust/README.md:{line}: the program returned {e}"),
            Err(_) => panic!("clients/rust/README.md:{line}: the program panicked (above)"),
        }
    }
}
