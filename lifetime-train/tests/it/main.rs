//! The trainer's integration tests, as one binary: each module is what was a
//! test file of its own (issue 58: one link and one build of the dependencies' generic code per
//! crate instead of one per file). `cargo test --release -p lifetime-train --test it MODULE::` runs one.

mod cli;
mod gbdt_matches_lightgbm;
mod train_bundle;
