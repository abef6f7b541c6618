//! Randomized property tests over the pure modules: the argument parsers (`crate::parse`) and the
//! lock state machine (`crate::lock`).
//!
//! Each test draws a few thousand cases from a seeded [`StdRng`]. The seed is random on every
//! run and printed when a case fails, together with the case number; `FUZZ_SEED=<seed> cargo
//! test --lib fuzz_tests` replays exactly the failing run. Every case gets its own generator
//! derived from (seed, case), so a failure does not depend on what earlier cases drew.
//!
//! The parsers are checked against reference implementations written here from the documented
//! rules (docs/commands.md), not from the code: the integer reference accumulates digits in
//! `i128`, and the acquire reference collects *every* error an argument list deserves, so the
//! test accepts any of them and does not pin the order in which the parser checks things.
//!
//! The state machine is driven like the commands drive it (decide, then grant, retry, extend,
//! release or hand off) on a few keys sharing one [`TokenMint`], with an injected clock that
//! mostly moves forward, sometimes lands exactly on a deadline, and sometimes steps back. A
//! separate model (plain fields, no `crate::lock` calls) predicts every decision.
//!
//! Layout: `parsers.rs` (the parser properties) with `reference.rs` (their reference parsers,
//! every option of every command), `state_machine.rs` (plain exclusive holds, tokens, the wait
//! queue), `sessions_and_sets.rs` (sessions, lock-delay, shared holds and multi-key sets against
//! a model, in `sessions_and_sets/model.rs`); the harness and the argument generators are below.

use std::collections::{HashSet, VecDeque};
use std::panic::{self, AssertUnwindSafe};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::{self, Error};
use crate::lock::{
    deadline_after, decide_acquire, held_by, Acquire, Hold, Lock, Millis, Mode, QueueFull,
    TokenMint, WaitQueue, CLOCK_SHIFT, MAX_DEADLINE,
};
use crate::parse::{self, MAX_BLOCK_MS};

mod parsers;
mod reference;
mod sessions_and_sets;
mod state_machine;

/// Cases per parser test; each case is a handful of microseconds.
const PARSER_CASES: usize = 4_000;
/// Operation sequences for the state machine, and operations in each.
const MACHINE_RUNS: usize = 300;
const MACHINE_STEPS: usize = 60;
/// Sequences for the wait queue, and operations in each.
const QUEUE_RUNS: usize = 500;
const QUEUE_STEPS: usize = 80;

// --- Harness -----------------------------------------------------------------

/// Run `cases` cases of `body`, each with a generator derived from the run's seed and the case
/// number. On a failure, print how to replay it and re-raise the panic.
fn cases(name: &str, count: usize, mut body: impl FnMut(&mut StdRng)) {
    let seed: u64 = match std::env::var("FUZZ_SEED") {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("FUZZ_SEED={s:?} is not a u64: {e}")),
        Err(_) => rand::random(),
    };
    for case in 0..count {
        let mut rng =
            StdRng::seed_from_u64(seed ^ (case as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        if let Err(payload) = panic::catch_unwind(AssertUnwindSafe(|| body(&mut rng))) {
            eprintln!(
                "fuzz_tests::{name}: case {case} failed; replay with \
                 FUZZ_SEED={seed} cargo test --lib {name}"
            );
            panic::resume_unwind(payload);
        }
    }
}

/// Owned arguments and the `&[&[u8]]` view the parsers take.
fn view(args: &[Vec<u8>]) -> Vec<&[u8]> {
    args.iter().map(Vec::as_slice).collect()
}

/// Printable form of an argument list for failure messages.
fn show(args: &[Vec<u8>]) -> Vec<String> {
    args.iter()
        .map(|a| {
            if a.len() > 40 {
                format!("<{} bytes: {}...>", a.len(), a[..16].escape_ascii())
            } else {
                a.escape_ascii().to_string()
            }
        })
        .collect()
}

// --- Generators ----------------------------------------------------------------

/// Numbers and near-numbers, chosen to sit on every boundary the parsers care about.
const NUMBERISH: &[&str] = &[
    "0",
    "1",
    "-1",
    "-0",
    "00",
    "007",
    "-007",
    "+5",
    " 5",
    "5 ",
    "5\r\n",
    "1.5",
    "1e3",
    "0x10",
    "",
    "-",
    "--1",
    "1-",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "99999999999999999999",
    "-99999999999999999999",
    "000000000000000000000000000000000042",
    "4611686018427387903",
    "4611686018427387904",
    "100000000000",
    "100000000001",
    "99999999999",
    "18446744073709551615",
    "18446744073709551616",
    "\u{0663}", // ARABIC-INDIC DIGIT THREE: a digit, but not an ASCII one
    "\u{FF11}", // FULLWIDTH DIGIT ONE
    "1\u{0}",
    "60000",
    "60001",
    "59999",
];

/// Option names and near-misses.
const OPTIONISH: &[&str] = &[
    "BLOCK",
    "block",
    "Block",
    "bLoCk",
    "BLOCKS",
    "BLOC",
    "BLOCK ",
    " BLOCK",
    "BLOCK\0",
    "FOO",
    "NX",
    "PX",
    "",
    "SHARED",
    "shared",
    "SHARE",
    "LIMIT",
    "limit",
    "LIMITS",
    "SESSION",
    "session",
    "SESSIONS",
    "LOCKDELAY",
    "lockdelay",
    "LOCK-DELAY",
    "BOUND",
    "bound",
    "GRACE",
    "grace",
    "GRACES",
];

fn random_bytes(rng: &mut StdRng, max_len: usize) -> Vec<u8> {
    let len = rng.gen_range(0..=max_len);
    (0..len).map(|_| rng.gen()).collect()
}

/// A decimal string of `n` random digits, maybe negative.
fn random_digits(rng: &mut StdRng) -> Vec<u8> {
    let n = rng.gen_range(1..=22);
    let mut s: Vec<u8> = (0..n).map(|_| b'0' + rng.gen_range(0..10u8)).collect();
    if rng.gen_bool(0.3) {
        s.insert(0, b'-');
    }
    s
}

/// Anything that might stand where a number is expected.
fn numberish(rng: &mut StdRng) -> Vec<u8> {
    match rng.gen_range(0..10) {
        0..=2 => NUMBERISH[rng.gen_range(0..NUMBERISH.len())]
            .as_bytes()
            .to_vec(),
        3 => rng.gen::<i64>().to_string().into_bytes(),
        4 => rng.gen_range(-3i64..=3).to_string().into_bytes(),
        5 => rng.gen_range(1..=MAX_BLOCK_MS + 2).to_string().into_bytes(),
        6 | 7 => random_digits(rng),
        8 => {
            // A valid number with one byte changed, inserted or removed.
            let mut s = random_digits(rng);
            let at = rng.gen_range(0..=s.len());
            match rng.gen_range(0..3) {
                0 => s.insert(at, rng.gen()),
                1 if at < s.len() => s[at] = rng.gen(),
                _ if !s.is_empty() => {
                    s.remove(at.min(s.len() - 1));
                }
                _ => {}
            }
            s
        }
        _ => random_bytes(rng, 6),
    }
}

/// Anything that might stand where an owner is expected: around `max` bytes long, empty,
/// binary.
fn ownerish(rng: &mut StdRng, max: usize) -> Vec<u8> {
    match rng.gen_range(0..8) {
        0 => Vec::new(),
        1 => vec![b'o'; max],
        2 => vec![b'o'; max + 1],
        3 => vec![b'o'; max.saturating_sub(1)],
        4 => b"\x00\xff\r\n\x1b".to_vec(),
        5 => format!("worker-{}", rng.gen::<u16>()).into_bytes(),
        _ => random_bytes(rng, max.min(40) + 2),
    }
}

fn optionish(rng: &mut StdRng) -> Vec<u8> {
    if rng.gen_bool(0.8) {
        OPTIONISH[rng.gen_range(0..OPTIONISH.len())]
            .as_bytes()
            .to_vec()
    } else {
        random_bytes(rng, 8)
    }
}

/// A random argument list shaped like `CMD key owner number [opts...]` most of the time, and
/// entirely random otherwise (including fewer than two arguments).
fn random_args(rng: &mut StdRng, max_owner: usize) -> Vec<Vec<u8>> {
    if rng.gen_bool(0.15) {
        let n = rng.gen_range(0..8);
        return (0..n)
            .map(|_| match rng.gen_range(0..4) {
                0 => numberish(rng),
                1 => ownerish(rng, max_owner),
                2 => optionish(rng),
                _ => random_bytes(rng, 10),
            })
            .collect();
    }
    let mut args = vec![b"LOCK.X".to_vec(), b"key".to_vec()];
    if rng.gen_bool(0.95) {
        args.push(ownerish(rng, max_owner));
    }
    if rng.gen_bool(0.95) {
        args.push(numberish(rng));
    }
    for _ in 0..rng.gen_range(0..=4) {
        if rng.gen_bool(0.5) {
            args.push(optionish(rng));
        } else {
            args.push(numberish(rng));
        }
    }
    args
}

fn random_max_owner(rng: &mut StdRng) -> usize {
    [1, 2, 8, 64, 1024][rng.gen_range(0..5)]
}

/// Keys for the multi-key commands: few names, so duplicates are common.
const KEYISH: &[&str] = &["a", "b", "c", "{t}a", "A", "", "\u{4E00}", "\0\r\n"];

/// `LOCK.MACQUIRE`/`LOCK.MRELEASE`-shaped argument lists: `numkeys` (usually the true count),
/// keys drawn from [`KEYISH`], an owner, a ttl (`with_ttl`), options.
fn random_multi_args(rng: &mut StdRng, max_owner: usize, with_ttl: bool) -> Vec<Vec<u8>> {
    if rng.gen_bool(0.1) {
        return random_args(rng, max_owner);
    }
    let n = rng.gen_range(0..=4usize);
    let mut args = vec![b"LOCK.M".to_vec()];
    args.push(match rng.gen_range(0..10) {
        0..=6 => n.to_string().into_bytes(),
        7 => (n + 1).to_string().into_bytes(),
        _ => numberish(rng),
    });
    for _ in 0..n {
        args.push(KEYISH[rng.gen_range(0..KEYISH.len())].as_bytes().to_vec());
    }
    if rng.gen_bool(0.95) {
        args.push(ownerish(rng, max_owner));
    }
    if with_ttl && rng.gen_bool(0.95) {
        args.push(numberish(rng));
    }
    for _ in 0..rng.gen_range(0..=3) {
        args.push(match rng.gen_range(0..3) {
            0 | 1 => optionish(rng),
            _ => numberish(rng),
        });
    }
    args
}

/// `LOCK.SESSION`-shaped argument lists: a subcommand (or a near miss), then ids, numbers and
/// options in any order.
fn random_session_args(rng: &mut StdRng) -> Vec<Vec<u8>> {
    const SUBS: &[&str] = &[
        "OPEN",
        "open",
        "KEEPALIVE",
        "keepalive",
        "CLOSE",
        "ATTACH",
        "INFO",
        "RESTORE",
        "RENEW",
        "ENDED",
        "Ended",
        "OPEN ",
        "OPENX",
        "CLOS",
        "",
        "\u{4E00}",
    ];
    let mut args = vec![b"LOCK.SESSION".to_vec()];
    if rng.gen_bool(0.97) {
        args.push(match rng.gen_bool(0.9) {
            true => SUBS[rng.gen_range(0..SUBS.len())].as_bytes().to_vec(),
            false => random_bytes(rng, 8),
        });
    }
    for _ in 0..rng.gen_range(0..=8) {
        args.push(match rng.gen_range(0..6) {
            0 | 1 => numberish(rng),
            2 => optionish(rng),
            3 => ["CLOSED", "closed", "LOST", "x"][rng.gen_range(0..4)]
                .as_bytes()
                .to_vec(),
            4 => crate::lock::session::make_id("ab", rng.gen()),
            _ => ownerish(rng, 8),
        });
    }
    args
}

fn random_max_keys(rng: &mut StdRng) -> usize {
    [1, 2, 3, 64][rng.gen_range(0..4)]
}
