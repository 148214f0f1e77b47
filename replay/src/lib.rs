//! The trace replay client's logic, free of I/O and clocks: which VMs of a trace to request (the
//! [`Plan`], cut by `traces::window` like the simulator's workloads), when to send each allocation
//! and release ([`schedule`]: time compression plus a rate cap), how to read the control service's
//! answers ([`classify_answer`]), and what the run amounted to ([`Tally`], [`percentile`],
//! [`stats_delta`], [`series_point`], [`thin_indices`], the plain-text [`Summary`] and its SVG
//! plots: packing and empty hosts, and the realized prediction quality per model version
//! ([`QualitySummary`], [`QualitySample`], [`write_quality_plot`]); each VM's prediction as CSV
//! ([`PredictionRow`]); which migrations to confirm as the orchestrator of an allocator that
//! consolidates ([`due`], [`MigrationSummary`])). The `vmreplay` binary does the HTTP and the waiting.
//!
//! One module a subject (`error`, `plan`, `pacing`, `answer`, `tally`, `stats`, `summary`,
//! `plots`, `migrations`), each re-exported here.

/// The window flags (`--from-s`, `--duration-s`, `--max-vms`) and the default `--from-s`.
pub use traces::window::{first_start, WindowSpec};
/// Tenant sent for trace rows without one (the Huawei trace): the wire format requires a tenant.
pub use traces::NO_TENANT;

/// Most rows of the time-series table in the text summary.
pub const TABLE_ROWS: usize = 15;

/// Most distinct error messages kept as examples.
const ERROR_SAMPLES: usize = 5;

mod answer;
mod error;
mod migrations;
mod pacing;
mod plan;
mod plots;
mod stats;
mod summary;
mod tally;

pub use answer::*;
pub use error::*;
pub use migrations::*;
pub use pacing::*;
pub use plan::*;
pub use plots::*;
pub use stats::*;
pub use summary::*;
pub use tally::*;

#[cfg(test)]
mod tests;
