//! The placement library's integration tests, as one binary: each module is what was a
//! test file of its own (issue 58: one link and one build of the dependencies' generic code per
//! crate instead of one per file). `cargo test --release -p placement --test it MODULE::` runs one.

mod conflict_avoidance;
mod consolidation;
mod custom_policy;
mod follow;
mod policies;
