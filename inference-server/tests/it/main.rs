//! The inference server's integration tests, as one binary: each module is what was a
//! test file of its own (issue 58: one link and one build of the dependencies' generic code per
//! crate instead of one per file). `cargo test --release -p inference-server --test it MODULE::` runs one.

mod bundle_safety;
mod rollout;
