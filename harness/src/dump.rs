//! `DUMP` payloads as the server writes them (the RDB-encoded value, the 2-byte RDB version,
//! then a CRC-64 of both), for tests that edit one and must give it a valid footer again: the
//! torture suite's truncated values and the security tests' forged tokens.

/// CRC-64 as Redis computes it over `DUMP` payloads ("Jones": reflected polynomial
/// 0xad93d23594c935a9, initial value 0, no final xor).
pub fn crc64(data: &[u8]) -> u64 {
    const POLY: u64 = 0x95ac_9329_ac4b_c9b5; // 0xad93d23594c935a9 bit-reversed
    let mut crc = 0u64;
    for &byte in data {
        crc ^= byte as u64;
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ POLY
            } else {
                crc >> 1
            };
        }
    }
    crc
}

/// True if `payload`'s footer holds its own CRC-64 (so [`crc64`] agrees with the server).
pub fn checksum_matches(payload: &[u8]) -> bool {
    let n = payload.len();
    n > 10 && crc64(&payload[..n - 8]).to_le_bytes() == payload[n - 8..]
}

/// `body` (value and RDB version) with its CRC-64 appended: a payload `RESTORE` accepts.
pub fn with_checksum(mut body: Vec<u8>) -> Vec<u8> {
    let crc = crc64(&body);
    body.extend_from_slice(&crc.to_le_bytes());
    body
}
