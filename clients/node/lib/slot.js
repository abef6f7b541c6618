'use strict';
// The Redis Cluster hash slot of a key (CRC16/XMODEM of the key, or of its {hash tag}, mod 16384),
// so that a wait on a cluster opens a connection to the one master that owns the key.

const TABLE = new Uint16Array(256);
for (let i = 0; i < 256; i++) {
  let crc = i << 8;
  for (let bit = 0; bit < 8; bit++) crc = crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1;
  TABLE[i] = crc & 0xffff;
}

function crc16(bytes) {
  let crc = 0;
  for (const b of bytes) crc = ((crc << 8) & 0xffff) ^ TABLE[((crc >> 8) ^ b) & 0xff];
  return crc;
}

function slotOf(key) {
  let bytes = Buffer.isBuffer(key) ? key : Buffer.from(String(key));
  const open = bytes.indexOf(0x7b); // {
  if (open >= 0) {
    const close = bytes.indexOf(0x7d, open + 1); // }
    if (close > open + 1) bytes = bytes.subarray(open + 1, close);
  }
  return crc16(bytes) % 16384;
}

module.exports = { slotOf };
