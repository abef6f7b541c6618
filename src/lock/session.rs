//! Sessions: one lease for many holds, as etcd's leases and ZooKeeper's sessions are.
//!
//! A session has a ttl, renewed by one keepalive however many holds it covers, and may be
//! *bound* to a connection: then it also ends the moment that connection closes, or, with a
//! grace (`BOUND GRACE ms`), is only *detached* then and ends at the grace's end unless a
//! connection attaches it first ([`Sessions::detach`], [`Sessions::attach`]). Every hold
//! granted `SESSION id` carries the session's [`Serial`] and ends when the session does.
//!
//! Two names per session, because they are used for different things:
//! - the **id** is a secret (128 random bits behind a hash tag): whoever knows it can keep the
//!   session alive or close it, so it travels only in `LOCK.SESSION` commands (flagged out of
//!   `MONITOR` and `SLOWLOG`), the replication stream and the persistence files;
//! - the **serial** is a public handle (64 random bits) stored in each hold, so that a key's
//!   value, `DUMP` of it and the events about it never carry the secret.
//!
//! Pure: the table answers which session is due, which are bound to a closing connection and
//! which holds a session has; the Redis side (`crate::redis::session`) ends them.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use super::Millis;

/// A session's public handle; 0 is "no session" in a [`super::Hold`].
pub type Serial = u64;

/// Where one hold of a session lives: database, key, owner.
pub type HoldRef = (i32, Vec<u8>, Vec<u8>);

/// The longest `LOCKDELAY` (ms), for sessions and plain locks alike.
pub const MAX_LOCK_DELAY: Millis = 60_000;

/// The longest `GRACE` (ms) of a `BOUND` session. A grace is for a connection blip (a
/// reconnect takes milliseconds); a minute is far past any blip, and the ttl caps it anyway.
pub const MAX_GRACE: Millis = 60_000;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    /// The secret id, as the client sends it.
    pub id: Vec<u8>,
    pub serial: Serial,
    /// What each keepalive renews to.
    pub ttl: Millis,
    /// Absolute: the session ends at this millisecond unless renewed.
    pub deadline: Millis,
    /// Lock-delay of its holds when the session ends uncleanly.
    pub lock_delay: Millis,
    /// Opened with `BOUND`: ends with the connection it is bound to.
    pub bound: bool,
    /// The connection it is bound to now. Client ids restart with every process, so this is
    /// never persisted or replicated: after a restart or a promotion a bound session is
    /// unbound until `ATTACH`.
    pub client: Option<u64>,
    /// `BOUND GRACE ms`: how long the session outlives its bound connection's close, for a
    /// connection to `ATTACH` it (0: it ends with the connection). Persisted and replicated.
    pub grace: Millis,
    /// Detached: its bound connection closed with a grace to run; the grace ends at this
    /// millisecond, and the deadline is no later. Only `ATTACH` clears it; a keepalive cannot
    /// move the deadline past it. Kept by the primary only: what replicas and the files learn
    /// is the shortened deadline (a `RENEW`), so after a restart or a promotion the session is
    /// as any unbound bound one.
    pub detached: Option<Millis>,
    /// The ACL user that opened it: nobody else may use it.
    pub user: Vec<u8>,
    /// Where its holds are. May include holds that went away without telling the session
    /// (a `DEL`, a flush, an expiry): whoever walks this set checks each hold's serial.
    pub holds: HashSet<HoldRef>,
}

impl Session {
    /// Milliseconds left at `now` (0 when due).
    pub fn remaining(&self, now: Millis) -> Millis {
        (self.deadline - now).max(0)
    }
}

/// Why a session ended: a clean `CLOSE` frees its holds at once; the others apply lock-delay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    Closed,
    Expired,
    Disconnected,
}

impl End {
    pub fn clean(self) -> bool {
        self == End::Closed
    }
}

/// Every session of this server, with the indexes that keep each operation's cost
/// independent of how many holds a session has.
#[derive(Debug, Default)]
pub struct Sessions {
    /// Ordered by serial: `LOCK.SESSION LIST` pages through it with the serial as cursor.
    by_serial: BTreeMap<Serial, Session>,
    by_id: HashMap<Vec<u8>, Serial>,
    /// Ordered by deadline: the expiry timer looks only at the front.
    by_deadline: BTreeSet<(Millis, Serial)>,
    /// Bound sessions by connection: a disconnect finds its sessions without a scan.
    by_client: BTreeSet<(u64, Serial)>,
}

impl Sessions {
    pub fn len(&self) -> usize {
        self.by_serial.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_serial.is_empty()
    }

    /// True when `serial` or `id` is taken (a new session draws again).
    pub fn taken(&self, serial: Serial, id: &[u8]) -> bool {
        serial == 0 || self.by_serial.contains_key(&serial) || self.by_id.contains_key(id)
    }

    /// Add a session (a new one, or one loaded or replicated): replaces one with the same
    /// serial.
    pub fn insert(&mut self, session: Session) {
        self.remove(session.serial);
        self.by_id.insert(session.id.clone(), session.serial);
        self.by_deadline.insert((session.deadline, session.serial));
        if let Some(client) = session.client {
            self.by_client.insert((client, session.serial));
        }
        self.by_serial.insert(session.serial, session);
    }

    pub fn remove(&mut self, serial: Serial) -> Option<Session> {
        let session = self.by_serial.remove(&serial)?;
        self.by_id.remove(&session.id);
        self.by_deadline.remove(&(session.deadline, serial));
        if let Some(client) = session.client {
            self.by_client.remove(&(client, serial));
        }
        Some(session)
    }

    pub fn by_id(&self, id: &[u8]) -> Option<&Session> {
        self.by_serial.get(self.by_id.get(id)?)
    }

    pub fn get(&self, serial: Serial) -> Option<&Session> {
        self.by_serial.get(&serial)
    }

    pub fn contains(&self, serial: Serial) -> bool {
        self.by_serial.contains_key(&serial)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Session> {
        self.by_serial.values()
    }

    /// Up to `count` sessions from serial `cursor` on, in serial order, and the cursor of the
    /// next page (0: this was the last). Like `SCAN`, a session present for the whole walk is
    /// seen exactly once, whatever opens or ends in between; cost O(count + log n).
    pub fn page(&self, cursor: Serial, count: usize) -> (Vec<&Session>, Serial) {
        let mut it = self.by_serial.range(cursor..);
        let page: Vec<&Session> = it.by_ref().take(count).map(|(_, s)| s).collect();
        let next = it.next().map_or(0, |(serial, _)| *serial);
        (page, next)
    }

    /// Move the deadline to `deadline` (a keepalive, or its replicated effect), and the ttl to
    /// `ttl`. O(log n) in sessions, independent of the session's holds. A detached session's
    /// deadline never moves past its grace's end: only [`Sessions::attach`] rescues it.
    pub fn renew(&mut self, serial: Serial, ttl: Millis, deadline: Millis) -> bool {
        let Some(session) = self.by_serial.get_mut(&serial) else {
            return false;
        };
        let deadline = session.detached.map_or(deadline, |end| deadline.min(end));
        self.by_deadline.remove(&(session.deadline, serial));
        session.deadline = deadline;
        session.ttl = ttl;
        self.by_deadline.insert((deadline, serial));
        true
    }

    /// Move the deadline to exactly `deadline`, whatever it was (the deadline index follows).
    fn set_deadline(&mut self, serial: Serial, deadline: Millis) {
        if let Some(session) = self.by_serial.get_mut(&serial) {
            self.by_deadline.remove(&(session.deadline, serial));
            session.deadline = deadline;
            self.by_deadline.insert((deadline, serial));
        }
    }

    /// The bound connection of `serial` closed at `now` and the session has a grace: it is
    /// unbound and detached, and ends at the earlier of its deadline and `now + grace` unless
    /// a connection attaches it first. Returns the deadline now; `None` when there is no such
    /// session or it has no grace (then the close ends it, as without `GRACE`).
    pub fn detach(&mut self, serial: Serial, now: Millis) -> Option<Millis> {
        let session = self.by_serial.get(&serial)?;
        if session.grace <= 0 {
            return None;
        }
        let end = now.saturating_add(session.grace);
        let deadline = session.deadline.min(end);
        self.bind(serial, None);
        self.set_deadline(serial, deadline);
        self.by_serial.get_mut(&serial)?.detached = Some(end);
        Some(deadline)
    }

    /// A connection (`client`) attaches `serial` at `now`: it is bound there, and if it was
    /// detached, rescued: no longer detached, and renewed to `now + ttl`. Returns the deadline
    /// it was renewed to (`None`: it was not detached, and its deadline is unchanged, as an
    /// `ATTACH` after a restart always was).
    pub fn attach(&mut self, serial: Serial, client: u64, now: Millis) -> Option<Millis> {
        self.bind(serial, Some(client));
        let session = self.by_serial.get_mut(&serial)?;
        session.detached.take()?;
        let deadline = now.saturating_add(session.ttl);
        self.set_deadline(serial, deadline);
        Some(deadline)
    }

    /// A detached session's grace (or deadline) came due while writes were paused, when no
    /// `ATTACH` could run: it gets its grace again from `now`, the pause's end. Returns the new
    /// deadline; `None` when it is not detached.
    pub fn detach_again(&mut self, serial: Serial, now: Millis) -> Option<Millis> {
        let session = self.by_serial.get_mut(&serial)?;
        session.detached?;
        let end = now.saturating_add(session.grace);
        session.detached = Some(end);
        let deadline = now.saturating_add(session.ttl).min(end);
        self.set_deadline(serial, deadline);
        Some(deadline)
    }

    /// Bind a session to `client` (or unbind it with `None`).
    pub fn bind(&mut self, serial: Serial, client: Option<u64>) {
        let Some(session) = self.by_serial.get_mut(&serial) else {
            return;
        };
        if let Some(old) = session.client.take() {
            self.by_client.remove(&(old, serial));
        }
        session.client = client;
        if let Some(new) = client {
            self.by_client.insert((new, serial));
        }
    }

    /// The sessions bound to `client`, unbound now (the connection closed).
    pub fn unbind_client(&mut self, client: u64) -> Vec<Serial> {
        let serials: Vec<Serial> = self
            .by_client
            .range((client, 0)..=(client, Serial::MAX))
            .map(|(_, s)| *s)
            .collect();
        for serial in &serials {
            self.bind(*serial, None);
        }
        serials
    }

    /// This server became a replica: connections here bind nothing, and nothing is detached
    /// (the new primary decides when sessions end; a replica applies its `RENEW`s as sent).
    pub fn unbind_all(&mut self) {
        let serials: Vec<Serial> = self.by_client.iter().map(|(_, s)| *s).collect();
        for serial in serials {
            self.bind(serial, None);
        }
        for session in self.by_serial.values_mut() {
            session.detached = None;
        }
    }

    /// True when some session is bound to a connection (a disconnect needs a look).
    pub fn any_bound(&self) -> bool {
        !self.by_client.is_empty()
    }

    /// Sessions whose deadline is at or before `now`, earliest first.
    pub fn due(&self, now: Millis) -> Vec<Serial> {
        self.by_deadline
            .range(..=(now, Serial::MAX))
            .map(|(_, s)| *s)
            .collect()
    }

    /// The earliest deadline of any session.
    pub fn next_deadline(&self) -> Option<Millis> {
        self.by_deadline.first().map(|(d, _)| *d)
    }

    /// Record a hold of `serial`; false if there is no such session.
    pub fn add_hold(&mut self, serial: Serial, hold: HoldRef) -> bool {
        match self.by_serial.get_mut(&serial) {
            Some(session) => {
                session.holds.insert(hold);
                true
            }
            None => false,
        }
    }

    pub fn remove_hold(&mut self, serial: Serial, hold: &HoldRef) {
        if let Some(session) = self.by_serial.get_mut(&serial) {
            session.holds.remove(hold);
        }
    }

    /// `SWAPDB a b`: the holds of every session change database with their keys.
    pub fn swap_db(&mut self, a: i32, b: i32) {
        for session in self.by_serial.values_mut() {
            if session.holds.iter().any(|(db, _, _)| *db == a || *db == b) {
                session.holds = session
                    .holds
                    .drain()
                    .map(|(db, key, owner)| match db {
                        _ if db == a => (b, key, owner),
                        _ if db == b => (a, key, owner),
                        _ => (db, key, owner),
                    })
                    .collect();
            }
        }
    }

    /// Every session's holds are forgotten (a flush of all databases emptied them).
    pub fn forget_holds(&mut self, db: Option<i32>) {
        for session in self.by_serial.values_mut() {
            session
                .holds
                .retain(|(d, _, _)| db.is_some_and(|db| db != *d));
        }
    }
}

/// The hex digits of a session id after its hash tag.
pub const ID_HEX_DIGITS: usize = 32;

/// Build a session id: `{tag}` and 128 random bits in hex.
pub fn make_id(tag: &str, secret: u128) -> Vec<u8> {
    format!("{{{tag}}}{secret:032x}").into_bytes()
}

/// True when `id` has the shape [`make_id`] gives (a quick refusal of garbage before a lookup).
pub fn well_formed_id(id: &[u8]) -> bool {
    let Some(rest) = id.strip_prefix(b"{") else {
        return false;
    };
    let Some(close) = rest.iter().position(|b| *b == b'}') else {
        return false;
    };
    let (tag, hex) = (&rest[..close], &rest[close + 1..]);
    !tag.is_empty()
        && tag.len() <= 8
        && hex.len() == ID_HEX_DIGITS
        && hex.iter().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Millis = 1_700_000_000_000;

    fn session(serial: Serial, deadline: Millis) -> Session {
        Session {
            id: make_id("a", serial as u128),
            serial,
            ttl: 1000,
            deadline,
            lock_delay: 0,
            bound: false,
            client: None,
            grace: 0,
            detached: None,
            user: b"default".to_vec(),
            holds: HashSet::new(),
        }
    }

    #[test]
    fn pages_see_every_session_once_in_serial_order() {
        let mut all = Sessions::default();
        for serial in [9, 3, 27, 5, 81, 1] {
            all.insert(session(serial, T0));
        }
        let serials = |p: &[&Session]| p.iter().map(|s| s.serial).collect::<Vec<_>>();
        let (page, next) = all.page(0, 4);
        assert_eq!((serials(&page), next), (vec![1, 3, 5, 9], 27));
        // A session that ends before its page and one that opens behind the cursor change
        // nothing for the others.
        all.remove(27);
        all.insert(session(2, T0));
        let (page, next) = all.page(next, 4);
        assert_eq!((serials(&page), next), (vec![81], 0));
        let (page, next) = all.page(0, 10);
        assert_eq!((serials(&page), next), (vec![1, 2, 3, 5, 9, 81], 0));
        assert_eq!(all.page(82, 10).0.len(), 0);
    }

    #[test]
    fn due_sessions_follow_the_injected_clock() {
        let mut t = Sessions::default();
        t.insert(session(1, T0 + 100));
        t.insert(session(2, T0 + 50));
        t.insert(session(3, T0 + 300));
        assert_eq!(t.next_deadline(), Some(T0 + 50));
        assert_eq!(t.due(T0 + 49), Vec::<Serial>::new());
        assert_eq!(t.due(T0 + 100), vec![2, 1]);
        // A keepalive moves a session out of the due range.
        assert!(t.renew(1, 1000, T0 + 1100));
        assert_eq!(t.due(T0 + 100), vec![2]);
        assert_eq!(t.get(1).unwrap().remaining(T0 + 100), 1000);
        assert!(!t.renew(9, 1000, T0));
        t.remove(2);
        assert_eq!(t.next_deadline(), Some(T0 + 300));
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn renew_costs_the_same_with_ten_thousand_holds() {
        // The keepalive touches the deadline index only: the hold set is not walked or copied.
        let mut t = Sessions::default();
        let mut s = session(7, T0 + 10);
        for i in 0..10_000 {
            s.holds
                .insert((0, format!("k{i}").into_bytes(), b"o".to_vec()));
        }
        t.insert(s);
        assert!(t.renew(7, 5000, T0 + 5000));
        assert_eq!(t.get(7).unwrap().holds.len(), 10_000);
        assert_eq!(t.due(T0 + 4999), Vec::<Serial>::new());
    }

    #[test]
    fn binding_and_disconnect() {
        let mut t = Sessions::default();
        let mut bound = session(1, T0);
        bound.bound = true;
        bound.client = Some(42);
        t.insert(bound);
        t.insert(session(2, T0));
        assert!(t.any_bound());
        assert_eq!(t.unbind_client(41), Vec::<Serial>::new());
        assert_eq!(t.unbind_client(42), vec![1]);
        assert!(!t.any_bound());
        assert_eq!(t.get(1).unwrap().client, None);
        t.bind(1, Some(43));
        t.bind(2, Some(43));
        assert_eq!(t.unbind_client(43), vec![1, 2]);
        // Removing a bound session drops its binding too.
        t.bind(1, Some(44));
        t.remove(1);
        assert_eq!(t.unbind_client(44), Vec::<Serial>::new());
    }

    fn bound(serial: Serial, ttl: Millis, grace: Millis, client: u64) -> Session {
        let mut s = session(serial, T0 + ttl);
        s.ttl = ttl;
        s.bound = true;
        s.grace = grace;
        s.client = Some(client);
        s
    }

    #[test]
    fn a_detached_session_ends_at_the_grace_unless_attached() {
        let mut t = Sessions::default();
        t.insert(bound(1, 10_000, 500, 42));
        t.insert(bound(2, 10_000, 0, 42));
        // The connection closes at T0 + 100: both are unbound; only the one with a grace is
        // detached, and its deadline comes in to the grace's end.
        assert_eq!(t.unbind_client(42), vec![1, 2]);
        assert_eq!(t.detach(2, T0 + 100), None);
        assert_eq!(t.detach(1, T0 + 100), Some(T0 + 600));
        let s = t.get(1).unwrap();
        assert_eq!(
            (s.client, s.detached, s.deadline),
            (None, Some(T0 + 600), T0 + 600)
        );
        assert_eq!(t.next_deadline(), Some(T0 + 600));
        assert_eq!(t.due(T0 + 599), Vec::<Serial>::new());
        assert_eq!(t.due(T0 + 600), vec![1]);
        assert!(!t.any_bound());
        assert_eq!(t.detach(9, T0), None);
    }

    #[test]
    fn a_keepalive_while_detached_does_not_pass_the_grace() {
        let mut t = Sessions::default();
        t.insert(bound(1, 10_000, 500, 42));
        t.unbind_client(42);
        t.detach(1, T0 + 100);
        // A keepalive at T0 + 200 asks for T0 + 10_200: capped at the grace's end.
        assert!(t.renew(1, 10_000, T0 + 10_200));
        assert_eq!(t.get(1).unwrap().deadline, T0 + 600);
        // One with a short ttl may still shorten it.
        assert!(t.renew(1, 100, T0 + 300));
        assert_eq!(t.get(1).unwrap().deadline, T0 + 300);
        assert_eq!(t.due(T0 + 300), vec![1]);
    }

    #[test]
    fn attach_in_time_binds_and_renews_for_the_ttl() {
        let mut t = Sessions::default();
        t.insert(bound(1, 10_000, 500, 42));
        t.unbind_client(42);
        t.detach(1, T0 + 100);
        assert_eq!(t.attach(1, 43, T0 + 400), Some(T0 + 10_400));
        let s = t.get(1).unwrap();
        assert_eq!(
            (s.client, s.detached, s.deadline),
            (Some(43), None, T0 + 10_400)
        );
        assert_eq!(t.due(T0 + 600), Vec::<Serial>::new());
        // Attached again, keepalives renew as ever; a second close detaches it again.
        assert!(t.renew(1, 10_000, T0 + 20_000));
        assert_eq!(t.get(1).unwrap().deadline, T0 + 20_000);
        assert_eq!(t.unbind_client(43), vec![1]);
        assert_eq!(t.detach(1, T0 + 21_000), Some(T0 + 20_000));
        // An attach of a session that was not detached (after a restart) binds it and leaves
        // its deadline alone.
        t.insert(bound(2, 10_000, 500, 7));
        t.bind(2, None);
        assert_eq!(t.attach(2, 8, T0 + 5000), None);
        assert_eq!(t.get(2).unwrap().deadline, T0 + 10_000);
        assert_eq!(t.unbind_client(8), vec![2]);
    }

    #[test]
    fn the_grace_never_keeps_a_session_past_its_deadline() {
        let mut t = Sessions::default();
        t.insert(bound(1, 1000, 800, 42));
        t.unbind_client(42);
        // Closed at T0 + 900: the deadline (T0 + 1000) comes before the grace's end.
        assert_eq!(t.detach(1, T0 + 900), Some(T0 + 1000));
        assert_eq!(t.get(1).unwrap().detached, Some(T0 + 1700));
        assert!(t.renew(1, 1000, T0 + 1950));
        assert_eq!(t.get(1).unwrap().deadline, T0 + 1700);
    }

    #[test]
    fn a_pause_gives_a_detached_session_its_grace_again() {
        let mut t = Sessions::default();
        t.insert(bound(1, 10_000, 500, 42));
        t.insert(session(2, T0 + 50));
        t.unbind_client(42);
        t.detach(1, T0);
        assert_eq!(t.detach_again(2, T0 + 9000), None);
        assert_eq!(t.detach_again(1, T0 + 9000), Some(T0 + 9500));
        assert_eq!(t.get(1).unwrap().detached, Some(T0 + 9500));
        // Demotion: nothing is bound or detached, and replicated renewals apply as sent.
        t.bind(2, Some(5));
        t.unbind_all();
        assert!(!t.any_bound());
        assert_eq!(t.get(1).unwrap().detached, None);
        assert!(t.renew(1, 10_000, T0 + 30_000));
        assert_eq!(t.get(1).unwrap().deadline, T0 + 30_000);
    }

    #[test]
    fn ids_and_serials_are_unique_keys() {
        let mut t = Sessions::default();
        t.insert(session(1, T0));
        assert!(t.taken(1, b"other"));
        assert!(t.taken(5, &make_id("a", 1)));
        assert!(t.taken(0, b"x"));
        assert!(!t.taken(2, b"x"));
        assert_eq!(t.by_id(&make_id("a", 1)).map(|s| s.serial), Some(1));
        // Re-inserting the same serial (a replicated open, a reload) replaces it.
        let mut again = session(1, T0 + 5);
        again.id = make_id("b", 9);
        t.insert(again);
        assert!(t.by_id(&make_id("a", 1)).is_none());
        assert_eq!(t.next_deadline(), Some(T0 + 5));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn holds_follow_swapdb_and_flushes() {
        let mut t = Sessions::default();
        t.insert(session(1, T0));
        assert!(t.add_hold(1, (0, b"a".to_vec(), b"o".to_vec())));
        assert!(t.add_hold(1, (2, b"b".to_vec(), b"o".to_vec())));
        assert!(!t.add_hold(3, (0, b"a".to_vec(), b"o".to_vec())));
        t.swap_db(0, 2);
        let holds = &t.get(1).unwrap().holds;
        assert!(holds.contains(&(2, b"a".to_vec(), b"o".to_vec())));
        assert!(holds.contains(&(0, b"b".to_vec(), b"o".to_vec())));
        t.forget_holds(Some(0));
        assert_eq!(t.get(1).unwrap().holds.len(), 1);
        t.remove_hold(1, &(2, b"a".to_vec(), b"o".to_vec()));
        assert!(t.get(1).unwrap().holds.is_empty());
        t.add_hold(1, (5, b"c".to_vec(), b"o".to_vec()));
        t.forget_holds(None);
        assert!(t.get(1).unwrap().holds.is_empty());
    }

    #[test]
    fn id_shape() {
        let id = make_id("x1", u128::MAX - 5);
        assert_eq!(id.len(), 4 + ID_HEX_DIGITS);
        assert!(well_formed_id(&id));
        assert!(well_formed_id(&make_id("a", 0)));
        for bad in [
            &b""[..],
            b"{}0000",
            b"{a}123",
            b"a}00000000000000000000000000000000",
            b"{a}0000000000000000000000000000000g",
            b"{a}000000000000000000000000000000000",
        ] {
            assert!(!well_formed_id(bad), "{bad:?}");
        }
    }
}
