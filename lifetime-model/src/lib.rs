//! The lifetime model as served: feature computation shared by training and serving, model bundles,
//! the native evaluator and in-process prediction. It links no LightGBM: the trainer that writes the
//! bundles is the `lifetime-train` crate.
//!
//! - [`features`] and [`history`]: the one encoding of a VM request (plus its tenant's past) into a
//!   model row, for training and serving alike.
//! - [`live`]: the feature store kept current with the arrivals and exits the control service
//!   reports (live tenant history).
//! - [`dataset`]: replaying a trace into rows and censoring-aware labels.
//! - [`survival`]: the lifetime distribution (discrete-time hazards) and what policies read of it:
//!   the lifetime at request time and the remaining lifetime at any age, from one curve.
//! - [`bundle`]: the bundle format and [`LifetimeModel`], a loaded, validated bundle.
//! - [`gbdt`]: a native evaluator of LightGBM models, thread-safe and lock-free.
//! - [`metrics`] and [`report`]: evaluation figures and their Markdown.
//!
//! It must never know HTTP: the inference server, the allocator and the simulator link it as a
//! library.

pub mod bundle;
pub mod curve_cache;
pub mod dataset;
pub mod features;
pub mod gbdt;
pub mod history;
pub mod live;
pub mod metrics;
mod nan_json;
pub mod registry;
pub mod report;
pub mod survival;

pub use bundle::{BundleError, LifetimeModel, Manifest, ModelPrediction};
pub use features::{FeatureSchema, RequestFeatures};

/// Index of the largest value (the first on ties; 0 for an empty slice).
pub fn argmax(values: &[f64]) -> usize {
    values.iter().enumerate().fold((0, f64::NEG_INFINITY), |best, (i, &v)| if v > best.1 { (i, v) } else { best }).0
}
