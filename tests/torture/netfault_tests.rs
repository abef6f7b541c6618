//! The network and clock scenarios as tests: each prints its table and fails on a violation.
//! `skew_60s_margin_0_is_caught` runs the skew scenario with the margin off and fails unless
//! the checks catch the tokens going back: the proof that the skew test can fail.

use crate::netfault::Row;
use crate::{clockjump, partitions, skew, slowlink};

fn assert_clean(row: &Row) {
    assert_eq!(
        row.violations(),
        0,
        "{}: {} violations (see the table above)",
        row.scenario,
        row.violations()
    );
}

#[test]
fn skew_10s_behind() {
    assert_clean(&skew::skewed_failovers("skew_10s_behind", -10_000, 60_000));
}

#[test]
fn skew_60s_behind() {
    assert_clean(&skew::skewed_failovers("skew_60s_behind", -60_000, 60_000));
}

#[test]
fn skew_60s_margin_0_is_caught() {
    let row = skew::skewed_failovers("skew_60s_margin_0_is_caught", -60_000, 0);
    assert!(
        row.violations() > 0,
        "margin 0 with a replica 60 s behind: the checks found nothing"
    );
}

#[test]
fn clock_jumps_30s() {
    assert_clean(&clockjump::clock_jumps("clock_jumps_30s"));
}

#[test]
fn partition_sentinel() {
    assert_clean(&partitions::partition("partition_sentinel", false));
}

#[test]
fn partition_sentinel_min_replicas() {
    assert_clean(&partitions::partition(
        "partition_sentinel_min_replicas",
        true,
    ));
}

#[test]
fn slow_link_50ms() {
    assert_clean(&slowlink::slow_link("slow_link_50ms"));
}
