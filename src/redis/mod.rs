//! The boundary with the server. `unsafe` lives here and nowhere else.
//!
//! - `key`: open a lock key, read and write its hold, expiry and replication.
//! - `datatype`: the `redislock` type's RDB, AOF and memory callbacks.
//! - `blocking`: waiter queues, handoff, timers, and reacting to locks freed behind our back.
//! - `guard`: turns panics into error replies and log lines.
//! - `acl`: ACL categories for the commands, on servers that can set them.
//! - `pause`: nothing is written while the server holds writes back (client pauses, failover).
//! - `role`: the token jumps at start-up and when this server is promoted to primary.
//! - `feed`: the change feed of watched lock keys (`LOCK.WATCH`), published to sharded pub/sub.
//! - `slots`: cluster hash slots and the shortest hash tag of each.
//! - `asm`: Valkey 9's atomic slot migration (`CLUSTER MIGRATESLOTS`): declared, and what an
//!   import brings in of another node's sessions.
//! - `session`: the sessions table, its expiry timer, disconnects of bound sessions, ids.
//! - `server`: which server and release this is, for the behaviours that differ by release.

pub mod acl;
pub mod asm;
pub mod blocking;
pub mod cluster;
pub mod config;
pub mod datatype;
pub mod docs;
pub mod feed;
pub mod guard;
pub mod key;
pub mod pause;
pub mod restore;
pub mod role;
pub mod server;
pub mod session;
pub mod slots;
