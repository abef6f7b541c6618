//! The subscriber's delivery rules, without a server.

use super::*;

/// A listener that records the seq of each message it is given.
struct Seen(Mutex<Vec<u64>>);

impl Listener for Seen {
    fn message(&self, _key: &str, message: &Message) -> Heard {
        lock(&self.0).push(message.seq);
        Heard::Done
    }
    fn resync(&self, _key: &str, _state: &KeyState, _again: bool) {}
    fn disconnected(&self, _error: &Arc<Error>) {}
}

/// Messages reach a listener in order, once, only those after its watch; a gap marks the key
/// for a resynchronisation.
#[test]
fn messages_are_delivered_once_in_order_and_gaps_resynchronise() {
    let endpoint = Endpoint::open("redis://127.0.0.1:1/").unwrap();
    let slot = std::sync::OnceLock::new();
    let sub = Subscriber::of(&endpoint, &slot);
    let (early, late) = (
        Arc::new(Seen(Mutex::new(Vec::new()))),
        Arc::new(Seen(Mutex::new(Vec::new()))),
    );
    let entry = |id, to: &Arc<Seen>, from_seq| Entry {
        id,
        to: Arc::downgrade(to) as Weak<dyn Listener>,
        from_seq,
        pending: false,
        synced: true,
    };
    let watched = Watched {
        channel: b"ch".to_vec(),
        last_seq: Some(3),
        recent: Default::default(),
        confirmed: true,
        listeners: vec![entry(1, &early, 3), entry(2, &late, 5)],
    };
    lock(&sub.shared).keys.insert("k".into(), watched);
    lock(&sub.shared)
        .channels
        .insert(b"ch".to_vec(), "k".into());
    let pending = || {
        let shared = lock(&sub.shared);
        shared.keys["k"]
            .listeners
            .iter()
            .map(|e| e.pending)
            .collect::<Vec<_>>()
    };
    for seq in [4, 5, 5, 3, 6] {
        let payload = format!("{seq} extended 7 100 me");
        sub.message(b"ch", &Message::parse(payload.as_bytes()).unwrap());
    }
    assert_eq!(*lock(&early.0), [4, 5, 6]);
    assert_eq!(*lock(&late.0), [6]);
    assert_eq!(pending(), [false, false]);
    sub.message(b"ch", &Message::parse(b"9 extended 7 100 me").unwrap());
    assert_eq!(*lock(&early.0), [4, 5, 6, 9]);
    assert_eq!(pending(), [true, true], "a gap: 7 and 8 were lost");
    sub.message(b"other", &Message::parse(b"10 deleted 0 0 ").unwrap());
    assert_eq!(*lock(&early.0), [4, 5, 6, 9]);
    // A second, different message with seq 9: one of the two was forged. Every listener
    // hears it (it keeps what it claims) and reads the state; the same one again is nothing.
    for e in &mut lock(&sub.shared).keys.get_mut("k").unwrap().listeners {
        e.pending = false;
    }
    sub.message(b"ch", &Message::parse(b"9 extended 7 100 me").unwrap());
    assert_eq!(pending(), [false, false]);
    sub.message(b"ch", &Message::parse(b"9 released 7 0 me").unwrap());
    assert_eq!(*lock(&early.0), [4, 5, 6, 9, 9]);
    assert_eq!(pending(), [true, true]);
}
