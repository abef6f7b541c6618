//! Looking a queue up by a borrowed key name: `QUEUES` is keyed by an owned [`QueueKey`], and
//! a lookup with `&(db, key.to_vec())` copied the name into a new allocation every time (a
//! `malloc` and a `free` through the server's allocator, several times per handoff). A
//! `(i32, &[u8])` hashes and compares the same as the owned key, so it finds the entry as it is.

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};

use super::QueueKey;

/// A queue key borrowed: its database and name (what the hot path has, without a copy).
pub(super) type KeyRef<'a> = (i32, &'a [u8]);

/// A queue key, owned or borrowed: its database and name.
pub(super) trait KeyView {
    fn view(&self) -> (i32, &[u8]);
}

impl KeyView for QueueKey {
    fn view(&self) -> (i32, &[u8]) {
        (self.0, &self.1)
    }
}

impl KeyView for (i32, &[u8]) {
    fn view(&self) -> (i32, &[u8]) {
        (self.0, self.1)
    }
}

impl<'a> Borrow<dyn KeyView + 'a> for QueueKey {
    fn borrow(&self) -> &(dyn KeyView + 'a) {
        self
    }
}

/// As `QueueKey`'s own (derived tuple) hash: the database, then the name as a slice (length,
/// then bytes), which is how `Vec<u8>` hashes too. `Borrow` requires the two to agree.
impl Hash for dyn KeyView + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let (db, key) = self.view();
        db.hash(state);
        key.hash(state);
    }
}

impl PartialEq for dyn KeyView + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.view() == other.view()
    }
}

impl Eq for dyn KeyView + '_ {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn a_borrowed_key_finds_the_owned_one() {
        let mut queues: HashMap<QueueKey, u32> = HashMap::new();
        queues.insert((0, b"k".to_vec()), 1);
        queues.insert((1, b"k".to_vec()), 2);
        queues.insert((0, b"".to_vec()), 3);
        queues.insert((0, b"k\0".to_vec()), 4);
        for (db, key, want) in [(0, &b"k"[..], 1), (1, b"k", 2), (0, b"", 3), (0, b"k\0", 4)] {
            assert_eq!(queues.get(&(db, key) as &dyn KeyView), Some(&want));
        }
        assert_eq!(queues.get(&(2, &b"k"[..]) as &dyn KeyView), None);
        assert_eq!(queues.get(&(0, &b"kk"[..]) as &dyn KeyView), None);
    }
}
