//! The allocator's integration tests, as one binary: each module is what was a
//! test file of its own (issue 58: one link and one build of the dependencies' generic code per
//! crate instead of one per file). `cargo test --release -p allocator --test it MODULE::` runs one.
//! Apart, as a binary of its own: `tests/power_loss` (its simulated disks, registered with SQLite,
//! live as long as the process).

mod support;

mod cloud_inventory;
mod consolidation;
mod crash;
mod duplicate_sends;
mod export;
mod lars;
mod patroni_failover;
mod postgres_cluster;
mod postgres_failover;
mod postgres_faults;
mod postgres_retries;
mod postgres_store;
mod properties;
mod quality;
mod restart;
mod service;
mod upgrade;
