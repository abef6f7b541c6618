//! `lock.max-session-holds` in a cluster (issue 28, item 7): a session's shared holds that
//! expired inside keys others still hold stop counting. A command there may not look at keys
//! of other slots, so the first acquire at the cap is refused and has the records checked from
//! a timer; a retry finds the room.

use super::*;

#[test]
fn expired_shared_holds_stop_counting_in_a_cluster() {
    let _turn = one_at_a_time();
    let cluster = Cluster::start();
    let mut any = cluster.nodes[0].conn();
    let mut a = cluster.master(0);
    assert_eq!(
        reply_text(run(
            &mut a,
            &["CONFIG", "SET", "lock.max-session-holds", "2"]
        )),
        "OK"
    );
    let keys = cluster.keys_on(&mut any, 0, 3, "cap");
    let id = match run(&mut a, &["LOCK.SESSION", "OPEN", "60000"]) {
        Ok(Value::BulkString(id)) => String::from_utf8(id).unwrap(),
        other => panic!("OPEN: {}", reply_text(other)),
    };
    for k in &keys[..2] {
        reply_text(run(
            &mut a,
            &["LOCK.ACQUIRE", k, "other", "60000", "SHARED"],
        ))
        .parse::<i64>()
        .unwrap();
        reply_text(run(
            &mut a,
            &["LOCK.ACQUIRE", k, "me", "50", "SHARED", "SESSION", &id],
        ))
        .parse::<i64>()
        .unwrap();
    }
    // Each key's holders: only "other" once the session's entries expired.
    for k in &keys[..2] {
        common::wait_until("the session's shared hold expires", PATIENCE, || {
            !reply_text(run(&mut a, &["LOCK.INFO", k])).contains("me")
        });
    }
    let third = &keys[2];
    // The first try at the cap is refused (and has the records checked); a retry gets in.
    let granted = common::wait_for("a hold in the session again", PATIENCE, || {
        match run(&mut a, &["LOCK.ACQUIRE", third, "me", "0", "SESSION", &id]) {
            Ok(Value::Int(token)) => Some(token),
            refused => {
                assert_eq!(
                    error_text("LOCK.ACQUIRE", refused),
                    "ERR the session has too many holds (lock.max-session-holds is 2)"
                );
                None
            }
        }
    });
    assert!(granted > 0);
}
