//! The traces crate's integration tests, as one binary: each module is what was a
//! test file of its own (issue 58: one link and one build of the dependencies' generic code per
//! crate instead of one per file). `cargo test --release -p traces --test it MODULE::` runs one.

mod azure_sqlite;
mod cli;
mod csv_format;
mod synthetic_calibration;
