//! The lifetime model's trainer, and the only crate that links LightGBM.
//!
//! - [`train`]: the LightGBM models (long-lived, lifetime interval, remaining lifetime, and the
//!   survival model's hazards), the time-split evaluation, and bundle writing.
//! - [`plots`]: the SVG plots of the evaluation report.
//!
//! What it writes is read by `lifetime-model` (features, bundles, the native evaluator), which is
//! all that serving links: the services and the simulator never build LightGBM's C++.

pub mod plots;
pub mod train;
