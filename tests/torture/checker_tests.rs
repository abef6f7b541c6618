//! The checker on hand-made histories: each check that shared holders need must catch a
//! violation written into a history, and accept the same history without it (so a quiet run
//! means the server behaved, not that the check cannot fire). Also: the holder processes'
//! history file carries an acquire's mode.

use std::collections::BTreeMap;

use crate::checker::{self, Expect, Verdict};
use crate::history::{
    load_child, wall_us, Clock, Entry, FileSink, History, Mode, Op, Outcome, Sink,
};

const X: Mode = Mode::Exclusive;
const S: Mode = Mode::Shared { limit: None };
const KEY: &str = "lock:0";

fn sem(n: u64) -> Mode {
    Mode::Shared { limit: Some(n) }
}

/// A history written by hand; times in ms since the start.
#[derive(Default)]
struct Story {
    entries: Vec<Entry>,
}

impl Story {
    #[allow(clippy::too_many_arguments)]
    fn op(
        &mut self,
        owner: &str,
        op: Op,
        (invoke, complete): (f64, f64),
        outcome: Outcome,
        token: Option<i64>,
        reply: &str,
    ) -> &mut Story {
        self.entries.push(Entry {
            id: 0,
            client: format!("c-{owner}"),
            key: KEY.to_string(),
            owner: owner.to_string(),
            op,
            invoke: (invoke * 1000.0) as i64,
            complete: (complete * 1000.0) as i64,
            wall_ms: 0,
            outcome,
            token,
            reply: reply.to_string(),
        });
        self
    }

    /// `owner` is granted `token` in `mode` for `ttl` ms by a call running over `at`.
    fn grant(
        &mut self,
        owner: &str,
        mode: Mode,
        ttl: i64,
        at: (f64, f64),
        token: i64,
    ) -> &mut Story {
        let op = Op::Acquire {
            ttl,
            block: None,
            mode,
        };
        self.op(owner, op, at, Outcome::Ok, Some(token), &token.to_string())
    }

    fn release(&mut self, owner: &str, token: i64, at: (f64, f64)) -> &mut Story {
        self.op(owner, Op::Release, at, Outcome::Ok, Some(token), "1")
    }

    /// An accepted fenced read that saw `len` elements.
    fn read(&mut self, owner: &str, token: i64, at: (f64, f64), len: i64) -> &mut Story {
        self.op(
            owner,
            Op::FencedRead,
            at,
            Outcome::Ok,
            Some(token),
            &len.to_string(),
        )
    }

    fn check(&self) -> Verdict {
        let mut h = History {
            entries: self.entries.clone(),
            ..History::default()
        };
        h.entries.sort_by_key(|e| (e.invoke, e.complete));
        for (i, e) in h.entries.iter_mut().enumerate() {
            e.id = i;
        }
        checker::check(&h, &BTreeMap::new(), &Expect { durable: false })
    }
}

/// The violations of check `name`, after asserting that no other check found any.
fn only(v: &Verdict, name: &str) -> usize {
    for c in &v.checks {
        if c.name != name {
            assert!(c.violations.is_empty(), "{}: {:?}", c.name, c.violations);
        }
    }
    let c = v.checks.iter().find(|c| c.name == name);
    c.unwrap_or_else(|| panic!("no check {name}"))
        .violations
        .len()
}

#[test]
fn checker_catches_two_exclusive_holds_at_once() {
    let mut s = Story::default();
    s.grant("a", X, 100, (0.0, 1.0), 10);
    assert_eq!(only(&s.check(), "exclusive-holds"), 0);
    s.grant("b", X, 100, (10.0, 11.0), 11);
    assert_eq!(only(&s.check(), "exclusive-holds"), 1);
}

#[test]
fn checker_lets_readers_share_but_not_with_a_writer() {
    let mut s = Story::default();
    s.grant("r1", S, 100, (0.0, 1.0), 10)
        .grant("r2", S, 100, (5.0, 6.0), 11);
    assert_eq!(only(&s.check(), "shared-exclusive-holds"), 0);
    // A writer granted while both readers are certainly live.
    s.grant("w", X, 100, (10.0, 11.0), 12);
    assert_eq!(only(&s.check(), "shared-exclusive-holds"), 1);

    // A writer after the reader released: fine. A reader whose deadline (at least 10 ms after
    // its grant was sent) overlaps a writer's grant by less than the tolerance: fine too.
    let mut s = Story::default();
    s.grant("r1", S, 100, (0.0, 1.0), 10)
        .release("r1", 10, (20.0, 21.0))
        .grant("w", X, 100, (22.0, 23.0), 11)
        .grant("r2", S, 10, (200.0, 200.5), 12)
        .grant("w2", X, 100, (208.5, 209.0), 13);
    assert_eq!(only(&s.check(), "shared-exclusive-holds"), 0);
    // A writer 3 ms before that reader's deadline: caught.
    let mut s = Story::default();
    s.grant("r2", S, 10, (200.0, 200.5), 12)
        .grant("w3", X, 100, (206.0, 207.0), 14);
    assert_eq!(only(&s.check(), "shared-exclusive-holds"), 1);
}

#[test]
fn checker_catches_a_limited_key_over_its_limit() {
    let mut s = Story::default();
    s.grant("p1", sem(2), 100, (0.0, 1.0), 10)
        .grant("p2", sem(2), 100, (2.0, 3.0), 11)
        .release("p1", 10, (20.0, 21.0))
        .grant("p3", sem(2), 100, (22.0, 23.0), 12);
    assert_eq!(only(&s.check(), "holders-within-limit"), 0);
    s.grant("p4", sem(2), 100, (30.0, 31.0), 13);
    assert_eq!(only(&s.check(), "holders-within-limit"), 1);
    // Unlimited shared holders are not counted.
    let mut s = Story::default();
    for (i, owner) in ["r1", "r2", "r3", "r4"].iter().enumerate() {
        s.grant(owner, S, 100, (i as f64, i as f64 + 0.5), 10 + i as i64);
    }
    assert_eq!(only(&s.check(), "holders-within-limit"), 0);
}

#[test]
fn checker_catches_a_token_going_back_across_modes() {
    // A shared retry answers its owner's old token after another reader got a larger one:
    // tokens still only grew (the old one was minted first).
    let mut s = Story::default();
    let first = Op::Acquire {
        ttl: 100,
        block: Some(50),
        mode: S,
    };
    s.op(
        "r1",
        first,
        (0.0, 40.0),
        Outcome::Unknown,
        None,
        "(no reply: killed)",
    )
    .grant("r2", S, 100, (10.0, 11.0), 11)
    .grant("r1", S, 100, (45.0, 46.0), 10);
    assert_eq!(only(&s.check(), "grant-order"), 0);
    // A reader granted a smaller token than a writer granted before it: caught.
    let mut s = Story::default();
    s.grant("w", X, 10, (0.0, 1.0), 20)
        .grant("r", S, 100, (50.0, 51.0), 15);
    assert_eq!(only(&s.check(), "grant-order"), 1);
}

#[test]
fn checker_catches_a_write_under_a_reader() {
    let mut s = Story::default();
    s.grant("r", S, 100, (0.0, 1.0), 10)
        .read("r", 10, (2.0, 3.0), 5)
        .read("r", 10, (20.0, 21.0), 5);
    assert_eq!(only(&s.check(), "shared-reads-stable"), 0);
    s.read("r", 10, (30.0, 31.0), 6);
    assert_eq!(only(&s.check(), "shared-reads-stable"), 1);
}

#[test]
fn history_file_carries_the_mode() {
    let path = std::env::temp_dir().join(format!("torture-modes-{}.history", std::process::id()));
    let sink = FileSink::create(&path);
    let modes = [X, S, sem(1), sem(7)];
    for (i, mode) in modes.iter().enumerate() {
        let now = wall_us();
        let entry = Entry {
            id: 0,
            client: "proc1".to_string(),
            key: KEY.to_string(),
            owner: format!("proc1-{i}"),
            op: Op::Acquire {
                ttl: 100 + i as i64,
                block: (i % 2 == 1).then_some(20),
                mode: *mode,
            },
            invoke: now,
            complete: now + 1,
            wall_ms: now / 1000,
            outcome: Outcome::Ok,
            token: Some(10 + i as i64),
            reply: format!("{}", 10 + i),
        };
        let id = sink.begin(&entry);
        sink.end(id, entry);
    }
    let read = FileSink::create(&path.with_extension("read"));
    read.end(1, {
        let now = wall_us();
        Entry {
            id: 0,
            client: "proc1".to_string(),
            key: KEY.to_string(),
            owner: "proc1-9".to_string(),
            op: Op::FencedRead,
            invoke: now,
            complete: now,
            wall_ms: 0,
            outcome: Outcome::Ok,
            token: Some(3),
            reply: "4".to_string(),
        }
    });
    let clock = Clock::new();
    let (entries, _) = load_child(&path, &clock, clock.now());
    let got: Vec<Option<Mode>> = entries.iter().map(|e| e.op.mode()).collect();
    assert_eq!(got, modes.map(Some));
    assert!(entries.iter().all(|e| e.outcome == Outcome::Ok));
    let (reads, _) = load_child(&path.with_extension("read"), &clock, clock.now());
    assert_eq!(
        reads.iter().map(|e| &e.op).collect::<Vec<_>>(),
        [&Op::FencedRead]
    );
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(path.with_extension("read"));
}
