//! Cluster nodes and Sentinels, from the workspace's harness crate (`harness/`), under the
//! names the cluster, Sentinel and partition tests use.

pub use harness::*;
