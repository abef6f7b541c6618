//! The module's integration tests start their servers through the workspace's harness crate
//! (`harness/`): this module only re-exports it, under the names the tests use.

pub use harness::*;
