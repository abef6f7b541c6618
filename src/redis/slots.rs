//! Cluster hash slots as the server computes them, and the shortest hash tag of each slot:
//! session ids and change-feed channels carry a tag so that a cluster client routes them to the
//! node that serves the slot.

use std::cell::RefCell;

thread_local! {
    /// The shortest hash tag of each cluster slot, computed at first use (a few ms).
    static SLOT_TAGS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// The shortest tag whose cluster slot is `slot`.
pub fn slot_tag(slot: u16) -> String {
    SLOT_TAGS.with(|t| {
        let mut tags = t.borrow_mut();
        if tags.is_empty() {
            *tags = shortest_tags();
        }
        tags[slot as usize % tags.len()].clone()
    })
}

/// The slot of a key: of its hash tag (the bytes between the first `{` and the first `}` after
/// it, when there are any), else of the whole key. The server's own rule (`keyHashSlot`).
pub fn key_slot(key: &[u8]) -> u16 {
    if let Some(open) = key.iter().position(|b| *b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|b| *b == b'}') {
            if len > 0 {
                return slot_of(&key[open + 1..open + 1 + len]);
            }
        }
    }
    slot_of(key)
}

/// CRC16/XMODEM's table, one entry per byte value, built at compile time.
const TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

pub fn crc16(data: &[u8]) -> u16 {
    data.iter().fold(0u16, |crc, byte| {
        (crc << 8) ^ TABLE[(((crc >> 8) as u8) ^ byte) as usize]
    })
}

pub fn slot_of(tag: &[u8]) -> u16 {
    crc16(tag) & 16383
}

/// For every slot, the shortest alphanumeric tag that hashes to it (first found in order
/// of length, then of characters).
pub fn shortest_tags() -> Vec<String> {
    const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let mut tags = vec![String::new(); 16384];
    let mut missing = 16384;
    // Tags of length 1, 2, 3, 4 in order, as base-62 numbers: no allocation per candidate.
    for len in 1..=4u32 {
        let count = (ALPHABET.len() as u64).pow(len);
        let mut tag = [0u8; 4];
        for n in 0..count {
            let mut rest = n;
            for i in (0..len as usize).rev() {
                tag[i] = ALPHABET[(rest % ALPHABET.len() as u64) as usize];
                rest /= ALPHABET.len() as u64;
            }
            let tag = &tag[..len as usize];
            let slot = slot_of(tag) as usize;
            if tags[slot].is_empty() {
                tags[slot] = String::from_utf8_lossy(tag).into_owned();
                missing -= 1;
                if missing == 0 {
                    return tags;
                }
            }
        }
    }
    tags
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_matches_the_cluster_spec() {
        // The reference value in the Redis Cluster specification.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        // CLUSTER KEYSLOT foo = 12182, {user1000} = 3443 (redis-cli on 7.0.15).
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"user1000"), 3443);
    }

    #[test]
    fn key_slots_follow_hash_tags() {
        // As the server's keyHashSlot: the first `{`, then the first `}` after it, a non-empty
        // tag; otherwise the whole key.
        assert_eq!(key_slot(b"{user1000}.following"), 3443);
        assert_eq!(key_slot(b"foo{}{bar}"), slot_of(b"foo{}{bar}"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), slot_of(b"{bar"));
        assert_eq!(key_slot(b"foo{bar"), slot_of(b"foo{bar"));
        assert_eq!(key_slot(b"a{b}c{d}"), slot_of(b"b"));
    }

    #[test]
    fn every_slot_has_a_short_tag() {
        let tags = shortest_tags();
        assert_eq!(tags.len(), 16384);
        for (slot, tag) in tags.iter().enumerate() {
            assert!((1..=4).contains(&tag.len()), "slot {slot}: {tag:?}");
            assert_eq!(slot_of(tag.as_bytes()) as usize, slot);
        }
    }
}
