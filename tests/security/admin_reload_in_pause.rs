//! Admin commands: `DEBUG RELOAD` while writes are paused (issue 28, item 11). A `BOUND`
//! session lost during a `CLIENT PAUSE WRITE` ends after the pause; a reload in between used to
//! save its holds with no session deadline (the session had left the table), so the load capped
//! them at the epoch and the key was free at once, lock-delay skipped.

use std::time::{Duration, Instant};

use redis::Value;

use crate::common::*;
use crate::sessions_common::*;

const DELAY_MS: u64 = 3000;

#[test]
fn debug_reload_during_a_pause_keeps_the_lock_delay_of_a_lost_session() {
    let server = Server::start();
    let mut c = server.conn();
    let key = unique_key("reload");
    let mut holder = server.conn();
    let id = open(
        &mut holder,
        30_000,
        &["BOUND", "LOCKDELAY", &DELAY_MS.to_string()],
    );
    let token = match call(
        &mut holder,
        "LOCK.ACQUIRE",
        &[&key, "holder", "0", "SESSION", &id],
    ) {
        Ok(Value::Int(t)) => t,
        other => panic!("{other:?}"),
    };
    let victim: i64 = redis::cmd("CLIENT").arg("ID").query(&mut holder).unwrap();
    redis::cmd("CLIENT")
        .arg(&["PAUSE", "20000", "WRITE"])
        .query::<()>(&mut c)
        .unwrap();
    // No later than the loss: the delay is measured from here, so this only shortens it.
    let before_loss = Instant::now();
    redis::cmd("CLIENT")
        .arg(&["KILL", "ID", &victim.to_string()])
        .query::<()>(&mut c)
        .unwrap();
    redis::cmd("DEBUG")
        .arg("RELOAD")
        .query::<()>(&mut c)
        .unwrap();
    redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query::<()>(&mut c)
        .unwrap();
    // The hold is lost (no token fences any more) but its key stays taken for the delay.
    assert_eq!(fence(&mut c, &key), None);
    assert!(token > 0);
    // Poll for the first grant: it must not come before the loss + LOCKDELAY.
    let granted_after = wait_for("the key is granted", Duration::from_secs(30), || {
        acquire(&mut c, &key, "next", 1000).map(|_| before_loss.elapsed())
    });
    assert!(
        granted_after >= Duration::from_millis(DELAY_MS - 5),
        "granted {granted_after:?} after the loss; LOCKDELAY is {DELAY_MS} ms"
    );
}
