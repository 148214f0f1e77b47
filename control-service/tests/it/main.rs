//! The control service's integration tests, as one binary: each module is what was a
//! test file of its own (issue 58: one link and one build of the dependencies' generic code per
//! crate instead of one per file). `cargo test --release -p control-service --test it MODULE::` runs one.

mod agents;
mod api_fuzz;
mod credentials;
mod dashboard;
mod dashboard_palette;
mod hardening;
mod learning;
mod quality_loop;
mod stack;
mod transport;
