//! The lock state machine (`crate::lock`) against a model of plain fields: decisions, tokens
//! under a clock that steps back, and the wait queue's order and cap.

use super::*;

/// What the model knows about one key: the current hold as plain fields, and the queue of
/// waiting owners in arrival order.
#[derive(Clone, Debug, Default)]
struct ModelKey {
    /// (owner, token, deadline) of the last grant, live or not.
    hold: Option<(Vec<u8>, u64, Millis)>,
    queue: VecDeque<Vec<u8>>,
}

impl ModelKey {
    fn live_owner(&self, now: Millis) -> Option<&[u8]> {
        match &self.hold {
            Some((owner, _, deadline)) if now < *deadline => Some(owner),
            _ => None,
        }
    }
}

/// The system under test for one key: the stored hold and the waiters, driven through
/// `crate::lock` as the command handlers drive it.
#[derive(Debug, Default)]
struct RealKey {
    hold: Option<Hold>,
    queue: WaitQueue<Vec<u8>>,
}

impl RealKey {
    /// The key's value as the server stores it: an exclusive lock with this one holder.
    fn lock(&self) -> Option<Lock> {
        self.hold.clone().map(|h| Lock::new(Mode::Exclusive, h))
    }
}

const OWNERS: &[&[u8]] = &[b"a", b"b", b"c", b"\x00\xff"];
const KEYS: usize = 3;

/// The clock: mostly forward in small steps; sometimes exactly onto a deadline or one before
/// it; sometimes a step back (an NTP correction) that the token mint must survive.
fn step_clock(rng: &mut StdRng, now: Millis, real: &[RealKey]) -> Millis {
    let deadlines: Vec<Millis> = real
        .iter()
        .filter_map(|k| k.hold.as_ref().map(|h| h.deadline))
        .collect();
    match rng.gen_range(0..10) {
        0 if !deadlines.is_empty() => deadlines[rng.gen_range(0..deadlines.len())],
        1 if !deadlines.is_empty() => deadlines[rng.gen_range(0..deadlines.len())] - 1,
        2 => now - rng.gen_range(0..2_000),
        3 => now,
        _ => now + rng.gen_range(0..50),
    }
}

fn random_ttl(rng: &mut StdRng) -> Millis {
    match rng.gen_range(0..10) {
        0 => 1,
        1 => i64::MAX,
        2 => MAX_DEADLINE,
        3 => rng.gen_range(1..=i64::MAX),
        _ => rng.gen_range(1..100),
    }
}

/// Checks shared by every step: at most one owner holds each key at `now`, the live token is
/// the only one that passes the fence, and `decide_acquire` is right for every owner.
fn check_key(real: &RealKey, model: &ModelKey, tokens: &[u64], now: Millis) {
    let holders: Vec<&[u8]> = OWNERS
        .iter()
        .copied()
        .filter(|o| held_by(real.lock().as_ref(), o, now))
        .collect();
    assert!(holders.len() <= 1, "several live holders: {holders:?}");
    assert_eq!(holders.first().copied(), model.live_owner(now));
    let fenced: Vec<u64> = tokens
        .iter()
        .copied()
        .filter(|t| real.lock().is_some_and(|l| l.fences(*t, now)))
        .collect();
    let want_fenced: Vec<u64> = match (&model.hold, model.live_owner(now)) {
        (Some((_, token, _)), Some(_)) => vec![*token],
        _ => vec![],
    };
    assert_eq!(fenced, want_fenced, "tokens passing the fence");
    assert_eq!(
        real.lock().and_then(|l| l.max_token(now)),
        want_fenced.first().copied()
    );
    for owner in OWNERS {
        let want = match (&model.hold, model.live_owner(now)) {
            (Some((_, token, _)), Some(o)) if o == *owner => Acquire::Retry { token: *token },
            (_, Some(_)) => Acquire::Busy,
            (_, None) if !model.queue.is_empty() => Acquire::ServeQueue,
            (_, None) => Acquire::Grant,
        };
        assert_eq!(
            decide_acquire(
                real.lock().as_ref(),
                owner,
                Mode::Exclusive,
                0,
                now,
                !real.queue.is_empty()
            ),
            Ok(want),
            "decide_acquire for {:?}",
            owner.escape_ascii().to_string()
        );
    }
    let queued: Vec<&Vec<u8>> = real.queue.iter().collect();
    let want_queued: Vec<&Vec<u8>> = model.queue.iter().collect();
    assert_eq!(queued, want_queued, "queue order");
}

/// The token mint and what the test has seen of it.
struct Minted {
    mint: TokenMint,
    /// The largest token minted or observed so far.
    high: u64,
    /// Every token granted, in grant order.
    tokens: Vec<u64>,
}

impl Minted {
    /// Grant a fresh token to `owner` at `now`, checking that it exceeds every token ever
    /// minted or observed, and the clock floor.
    fn grant(&mut self, owner: Vec<u8>, deadline: Millis, now: Millis) -> Hold {
        let token = self.mint.next(now);
        assert!(
            token > self.high,
            "token {token} not above earlier {}",
            self.high
        );
        assert!(
            token >= TokenMint::floor(now),
            "token below the clock floor"
        );
        assert_eq!(self.mint.high_water(), token);
        self.high = token;
        self.tokens.push(token);
        Hold {
            owner: owner.into(),
            token,
            deadline,
            granted_at: now,
            session: 0,
            delay: 0,
        }
    }

    /// The lock on this key is free (released, expired, or found free by an acquire while
    /// waiters are queued): the first waiter gets a new token, or the key goes away.
    fn hand_off(&mut self, r: &mut RealKey, m: &mut ModelKey, now: Millis, ttl: Millis) {
        match r.queue.pop_front() {
            Some(next) => {
                assert_eq!(
                    Some(&next),
                    m.queue.front(),
                    "handoff goes to the first waiter"
                );
                m.queue.pop_front();
                // As blocking::serve does: clamp a deadline that would overflow.
                let deadline = deadline_after(now, ttl).unwrap_or(MAX_DEADLINE);
                let h = self.grant(next.clone(), deadline, now);
                m.hold = Some((next, h.token, deadline));
                r.hold = Some(h);
            }
            None => {
                assert!(m.queue.is_empty());
                r.hold = None;
                m.hold = None;
            }
        }
    }
}

/// One operation on key `k`, applied to both the system and the model.
fn apply(
    rng: &mut StdRng,
    op: u32,
    (r, m): (&mut RealKey, &mut ModelKey),
    minted: &mut Minted,
    (owner, ttl, cap, now): (Vec<u8>, Millis, usize, Millis),
) {
    match op {
        // LOCK.ACQUIRE, with BLOCK when op == 2.
        0..=2 => {
            let Some(deadline) = deadline_after(now, ttl) else {
                // `ttl-ms is too large`: refused before anything changes.
                assert!(now.checked_add(ttl).is_none_or(|d| d > MAX_DEADLINE));
                return;
            };
            assert_eq!(Some(deadline), now.checked_add(ttl));
            let queued = !r.queue.is_empty();
            let decision =
                decide_acquire(r.lock().as_ref(), &owner, Mode::Exclusive, 0, now, queued);
            match decision.expect("exclusive acquires never conflict") {
                Acquire::Retry { token } => {
                    // Idempotent retry: same token; the deadline moves, either way.
                    assert_eq!(Some(token), m.hold.as_ref().map(|h| h.1));
                    let h = r.hold.as_mut().expect("retry without a hold");
                    assert_eq!(*h.owner, *owner);
                    h.deadline = deadline;
                    m.hold.as_mut().expect("model has no hold").2 = deadline;
                }
                Acquire::Grant => {
                    assert!(m.live_owner(now).is_none() && m.queue.is_empty());
                    let h = minted.grant(owner.clone(), deadline, now);
                    m.hold = Some((owner, h.token, deadline));
                    r.hold = Some(h);
                }
                decision @ (Acquire::Busy | Acquire::ServeQueue) => {
                    if decision == Acquire::ServeQueue {
                        // Free but others queued first: they get it, never this caller.
                        assert!(m.live_owner(now).is_none() && !m.queue.is_empty());
                        let waiter_ttl = rng.gen_range(1..100);
                        minted.hand_off(r, m, now, waiter_ttl);
                        assert!(r.hold.as_ref().is_some_and(|h| h.is_live(now)));
                    }
                    if op == 2 {
                        let pushed = r.queue.push(owner.clone(), cap);
                        if m.queue.len() < cap {
                            assert_eq!(pushed, Ok(()));
                            m.queue.push_back(owner);
                        } else {
                            assert_eq!(pushed, Err(QueueFull(owner)));
                        }
                    }
                }
            }
        }
        // LOCK.RELEASE: free the lock, or hand it to the first waiter.
        3 => {
            let held = held_by(r.lock().as_ref(), &owner, now);
            assert_eq!(held, m.live_owner(now) == Some(owner.as_slice()));
            if held {
                minted.hand_off(r, m, now, ttl);
            }
        }
        // LOCK.EXTEND: only the live holder; the token does not change.
        4 => {
            let held = held_by(r.lock().as_ref(), &owner, now);
            assert_eq!(held, m.live_owner(now) == Some(owner.as_slice()));
            if let (true, Some(deadline)) = (held, deadline_after(now, ttl)) {
                let h = r.hold.as_mut().expect("held without a hold");
                h.deadline = deadline;
                let mh = m.hold.as_mut().expect("model has no hold");
                mh.2 = deadline;
                assert_eq!(mh.1, h.token);
            }
        }
        // Expiry: the deadline timer fires (the clock is at or past the deadline); the first
        // waiter gets the lock, and without waiters Redis deletes the key.
        5 => {
            if r.hold.as_ref().is_some_and(|h| !h.is_live(now)) {
                assert!(m.live_owner(now).is_none());
                minted.hand_off(r, m, now, ttl);
            }
        }
        // A waiter leaves (timeout, disconnect, CLIENT KILL).
        6 => {
            let gone = r.queue.remove(|w| *w == owner);
            let at = m.queue.iter().position(|w| *w == owner);
            assert_eq!(gone, at.and_then(|i| m.queue.remove(i)));
        }
        // A token observed from an RDB, the AOF or the replication stream, maybe far ahead.
        _ => {
            let seen = if rng.gen_bool(0.5) {
                minted.high.saturating_sub(rng.gen_range(0..10))
            } else {
                TokenMint::floor(now + rng.gen_range(-5_000..5_000))
            };
            minted.mint.observe(seen);
            minted.high = minted.high.max(seen);
            assert_eq!(minted.mint.high_water(), minted.high);
        }
    }
}

#[test]
fn state_machine_matches_a_simple_model() {
    cases(
        "state_machine_matches_a_simple_model",
        MACHINE_RUNS,
        |rng| {
            let mut now: Millis = 1_700_000_000_000 + rng.gen_range(0..1_000_000);
            let mut minted = Minted {
                mint: TokenMint::new(),
                high: 0,
                tokens: Vec::new(),
            };
            let mut real: Vec<RealKey> = (0..KEYS).map(|_| RealKey::default()).collect();
            let mut model: Vec<ModelKey> = vec![ModelKey::default(); KEYS];
            let cap = rng.gen_range(0..4);
            let mut log: Vec<String> = Vec::new();

            for _ in 0..MACHINE_STEPS {
                now = step_clock(rng, now, &real);
                let k = rng.gen_range(0..KEYS);
                let owner = OWNERS[rng.gen_range(0..OWNERS.len())].to_vec();
                let ttl = random_ttl(rng);
                let op = rng.gen_range(0..8);
                log.push(format!(
                    "t={now} key={k} op={op} owner={} ttl={ttl}",
                    owner.escape_ascii()
                ));
                let step = panic::catch_unwind(AssertUnwindSafe(|| {
                    let pair = (&mut real[k], &mut model[k]);
                    apply(rng, op, pair, &mut minted, (owner, ttl, cap, now));
                    for (r, m) in real.iter().zip(&model) {
                        check_key(r, m, &minted.tokens, now);
                    }
                    // Tokens were minted in strictly increasing order, so all are distinct.
                    assert!(minted.tokens.windows(2).all(|w| w[0] < w[1]));
                }));
                if let Err(payload) = step {
                    eprintln!("operations (op: 0 acquire, 1 acquire, 2 acquire BLOCK, 3 release, 4 extend, 5 expire, 6 waiter leaves, 7 observe):\n  {}", log.join("\n  "));
                    panic::resume_unwind(payload);
                }
            }
            let distinct: HashSet<u64> = minted.tokens.iter().copied().collect();
            assert_eq!(distinct.len(), minted.tokens.len());
        },
    );
}

#[test]
fn tokens_strictly_increase_whatever_the_clock_does() {
    cases(
        "tokens_strictly_increase_whatever_the_clock_does",
        PARSER_CASES,
        |rng| {
            let mut mint = TokenMint::new();
            let mut now: Millis = rng.gen_range(0..4_000_000_000_000);
            let mut last = 0u64;
            for _ in 0..20 {
                now = match rng.gen_range(0..4) {
                    0 => now - rng.gen_range(0..100_000),
                    1 => now,
                    _ => now + rng.gen_range(0..3),
                };
                if rng.gen_bool(0.1) {
                    let seen = rng.gen_range(0..=(last.max(1) << 1));
                    mint.observe(seen);
                    last = last.max(seen);
                }
                let t = mint.next(now);
                assert!(t > last, "token {t} not above {last} at now={now}");
                assert!(t >= TokenMint::floor(now));
                // Below the next millisecond's floor unless the counter was already above it.
                if last < TokenMint::floor(now) {
                    assert!(t < TokenMint::floor(now + 1));
                }
                last = t;
            }
            assert_eq!(TokenMint::floor(now), (now.max(0) as u64) << CLOCK_SHIFT);
        },
    );
}

#[test]
fn wait_queue_is_fifo_and_respects_its_cap() {
    // Waiters are (arrival id, client group); removal matches on the group, which several
    // queued waiters may share, so it must take the earliest of them.
    cases(
        "wait_queue_is_fifo_and_respects_its_cap",
        QUEUE_RUNS,
        |rng| {
            let mut queue: WaitQueue<(u32, u8)> = WaitQueue::default();
            let mut model: VecDeque<(u32, u8)> = VecDeque::new();
            let mut next_id = 0u32;
            for _ in 0..QUEUE_STEPS {
                // The cap may change between pushes (CONFIG SET lock.max-waiters).
                let cap = rng.gen_range(0..8);
                match rng.gen_range(0..10) {
                    0..=4 => {
                        let waiter = (next_id, rng.gen_range(0..4));
                        next_id += 1;
                        let got = queue.push(waiter, cap);
                        if model.len() < cap {
                            assert_eq!(got, Ok(()));
                            model.push_back(waiter);
                        } else {
                            assert_eq!(
                                got,
                                Err(QueueFull(waiter)),
                                "push at len {} cap {cap}",
                                model.len()
                            );
                        }
                    }
                    5..=6 => assert_eq!(queue.pop_front(), model.pop_front()),
                    7..=8 => {
                        let group = rng.gen_range(0..5);
                        let want = model
                            .iter()
                            .position(|w| w.1 == group)
                            .and_then(|i| model.remove(i));
                        assert_eq!(queue.remove(|w| w.1 == group), want, "remove group {group}");
                    }
                    _ => {
                        if rng.gen_bool(0.2) {
                            let drained: Vec<(u32, u8)> = queue.drain().collect();
                            let want: Vec<(u32, u8)> = model.drain(..).collect();
                            assert_eq!(drained, want);
                        }
                    }
                }
                assert_eq!(queue.len(), model.len());
                assert_eq!(queue.is_empty(), model.is_empty());
                assert!(queue.iter().copied().eq(model.iter().copied()), "order");
                // Arrival order: ids were pushed increasing, so the queue stays sorted.
                assert!(queue
                    .iter()
                    .zip(queue.iter().skip(1))
                    .all(|(a, b)| a.0 < b.0));
            }
        },
    );
}
