//! A set is replicated and written to the AOF as one `MULTI`/`EXEC`, so a replica never sees
//! part of one.

use super::*;

#[test]
fn a_set_is_replicated_and_persisted_as_one_transaction() {
    let (mut primary, replica) =
        primary_and_replica(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut p = primary.conn();
    let mut r = replica.conn();
    let ks = keys(3);
    let got = macquire(&mut p, &ks, "order-1", LONG_TTL).expect("a grant");
    wait_for_replica_sync(&primary, &replica);
    for (key, token) in ks.iter().zip(&got) {
        assert_eq!(fence(&mut r, key), Some(*token), "{key} on the replica");
    }
    assert_err_code(
        call(&mut r, "LOCK.MACQUIRE", &macquire_args(&ks, "x", 1000, &[])),
        "READONLY",
    );
    // SELECT may come anywhere (Valkey puts it inside the MULTI): leave it out.
    let commands = aof_commands(&aof_incr(&primary));
    let names: Vec<&str> = commands
        .iter()
        .map(|c| c[0].as_str())
        .filter(|n| *n != "SELECT")
        .collect();
    assert_eq!(
        names,
        ["MULTI", "LOCK.LOAD", "LOCK.LOAD", "LOCK.LOAD", "EXEC"],
        "{commands:?}"
    );

    assert_eq!(mrelease(&mut p, &ks[..2], "order-1"), 2);
    // One replication entry: the command itself.
    let commands = aof_commands(&aof_incr(&primary));
    let after: Vec<&str> = commands
        .iter()
        .map(|c| c[0].as_str())
        .filter(|n| *n != "SELECT")
        .skip(names.len())
        .collect();
    assert_eq!(after.len(), 1, "{commands:?}");
    assert_eq!(after[0].to_uppercase(), "LOCK.MRELEASE", "{commands:?}");
    wait_for_replica_sync(&primary, &replica);
    assert_all_absent(&mut r, &ks[..2]);
    assert_eq!(fence(&mut r, &ks[2]), Some(got[2]));

    primary.kill9();
    primary.restart();
    let mut p = primary.conn();
    assert_all_absent(&mut p, &ks[..2]);
    assert_eq!(fence(&mut p, &ks[2]), Some(got[2]));
}
