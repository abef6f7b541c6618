//! The threat model of `SECURITY.md`, one file per row: what each kind of actor (an ACL user
//! with narrow key and channel patterns, a script, a replica, `DUMP`/`RESTORE`, `MONITOR`, an
//! administrator) may and may not do, against a real server with the module loaded.
//!
//! Every test starts its own server (ACL users and configs are server-wide state), asserts the
//! exact reply or error, and waits on observable state, never on a wall-clock window.

#[path = "../common/mod.rs"]
mod common;

mod admin_reload_in_pause;
mod feed_channels;
mod replicas;
mod restore;
mod scripts;
mod secrets;
mod sessions_acl;
mod sessions_admin;
mod sessions_common;
mod waiting_keys;
