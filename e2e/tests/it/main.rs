//! The end-to-end tests, as one binary: each module is what was a
//! test file of its own (issue 58: one link and one build of the dependencies' generic code per
//! crate instead of one per file). `cargo test --release -p e2e --test it MODULE::` runs one.
//! Apart, as binaries of their own: `tests/python.rs`, `tests/openstack.rs`.

mod support;

mod architecture;
mod compose;
mod compose_smoke;
mod demo_consolidation;
mod monitoring;
mod retrain;
mod secure_by_default;
mod service_parity;
