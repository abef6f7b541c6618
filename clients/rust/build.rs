//! Writes the README's Rust programs (its `rust,no_run` blocks) into `$OUT_DIR/readme_blocks.rs`,
//! one module each, for `tests/readme.rs` to run against a test server. `cargo test --doc`
//! compiles the same blocks (see `ReadmeDoctests` in `src/lib.rs`); this runs them.

use std::fmt::Write as _;
use std::path::Path;

/// A Redlock block's masters as the README spells them, and what the test puts in their place
/// (the test's own servers: nothing else on this machine is touched).
const REDLOCK_MASTERS: &str =
    r#"(6379..6384).map(|port| format!("redis://127.0.0.1:{port}/")).collect()"#;

fn main() {
    println!("cargo:rerun-if-changed=README.md");
    let readme = std::fs::read_to_string("README.md").expect("README.md");
    let mut modules = String::new();
    let mut table = String::from(
        "/// A block's main, its error as text.\npub type Main = fn() -> Result<(), String>;\n\n/// (README line, the block's main).\npub const BLOCKS: &[(usize, Main)] = &[\n",
    );
    let mut lines = readme.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        if line.trim_end() != "```rust,no_run" {
            continue;
        }
        let code: Vec<&str> = lines
            .by_ref()
            .map(|(_, l)| l)
            .take_while(|l| !l.starts_with("```"))
            .collect();
        let code = code
            .join("\n")
            .replace(REDLOCK_MASTERS, "super::redlock_masters()")
            .replace("\nfn main(", "\npub fn main("); // called from the table below
        let line = n + 1;
        writeln!(
            modules,
            "#[allow(unused, clippy::all)]\npub mod block_{line} {{\n{code}\n}}"
        )
        .unwrap();
        writeln!(
            table,
            "    ({line}, || block_{line}::main().map_err(|e| format!(\"{{e:?}}\"))),"
        )
        .unwrap();
    }
    table.push_str("];\n");
    let out = Path::new(&std::env::var("OUT_DIR").unwrap()).join("readme_blocks.rs");
    std::fs::write(out, modules + &table).unwrap();
}
