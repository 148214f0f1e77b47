//! The trace-replay simulator: replays traces event by event through the allocator library's very
//! own policy code ([`placement::Allocator`]) and measures packing density, empty hosts and the
//! offline bound (SPEC section 7).
//!
//! - [`workload`]: a trace turned into the VMs to replay (true lifetimes, warm-up, the inventory
//!   sized to the trace's peak demand).
//! - [`predict`]: where a VM's lifetime prediction comes from (oracle, noisy oracles, the trained
//!   model, none) and the short-lived fallback.
//! - [`metrics`]: packing density, empty hosts, empty-to-free, inflation stranding and the offline
//!   bound, as time series and time averages.
//! - [`config`]: what a run depends on ([`config::SimConfig`]); [`results`]: what it measured
//!   ([`results::SimResult`]).
//! - [`engine`]: the event loop: arrivals, exits, LARS migrations, consolidation rounds, metric samples
//!   (it re-exports the configuration and result types).
//! - [`drains`]: LARS drains in a run: the periodic plan and the drain running.
//! - [`migrations`]: the live migrations a run's metrics count, and those wasted.
//! - [`plot`]: the SVG plots of the evaluation.
//! - [`agents`]: several allocation agents of one zone on one shared store, with lagging views:
//!   conflicts, retries and the packing density lost against one agent (issue 17).
//! - [`compare`]: experiments: a matrix of policies by predictions run in parallel, with tables and
//!   plots.
//! - `cli` (feature `cli`): the `simulate` command line, given its policies' registry by the
//!   program's `main`.

pub mod agents;
#[cfg(feature = "cli")]
pub mod cli;
mod clock;
pub mod compare;
pub mod config;
pub mod drains;
pub mod engine;
pub mod metrics;
pub mod migrations;
#[cfg(feature = "plots")]
pub mod plot;
pub mod predict;
pub mod results;
pub mod workload;
