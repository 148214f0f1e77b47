//! What a run depends on ([`SimConfig`]: the workload's window and inventory, the policy, the
//! predictions, LARS drains ([`DrainPlan`]) and consolidation, the seed) and why a run could not be done ([`SimError`]).

use crate::predict::{PredictError, PredictionConfig};
use crate::workload::{Inventory, WorkloadConfig, WorkloadError};
use placement::consolidation::ConsolidationConfig;
use placement::defrag::MigrationOrder;
use placement::reprediction::RepredictionConfig;
use placement::{AllocateError, AllocatorConfig, AllocatorError, Engine, PolicyConfig, TieBreak};
use serde::{Deserialize, Serialize};

/// Why a run could not be done. The causes are boxed: a `Result` of this stays small on the
/// success path.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error(transparent)]
    Workload(Box<WorkloadError>),
    #[error("predictions: {0}")]
    Predict(Box<PredictError>),
    #[error("allocator: {0}")]
    Allocator(Box<AllocatorError>),
    #[error("allocator refused a trace VM: {0}")]
    Allocate(Box<AllocateError>),
    #[error("{field}: {message}")]
    Invalid { field: &'static str, message: String },
}

impl From<WorkloadError> for SimError {
    fn from(e: WorkloadError) -> Self {
        SimError::Workload(Box::new(e))
    }
}

impl From<PredictError> for SimError {
    fn from(e: PredictError) -> Self {
        SimError::Predict(Box::new(e))
    }
}

impl From<AllocatorError> for SimError {
    fn from(e: AllocatorError) -> Self {
        SimError::Allocator(Box::new(e))
    }
}

impl From<AllocateError> for SimError {
    fn from(e: AllocateError) -> Self {
        SimError::Allocate(Box::new(e))
    }
}

pub(crate) fn invalid(field: &'static str, message: impl Into<String>) -> SimError {
    SimError::Invalid { field, message: message.into() }
}

/// Everything a run depends on; with the trace, it reproduces the run exactly.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimConfig {
    pub workload: WorkloadConfig,
    pub inventory: Inventory,
    pub policy: PolicyConfig,
    pub tie_break: TieBreak,
    /// `incremental` (the allocator's cached index) or `full-scan` (the reference).
    pub engine: Engine,
    /// Seeds the tie-breaking (the allocator's own seed) and every draw of the predictions.
    pub seed: u64,
    pub prediction: PredictionConfig,
    /// How NILAS and LAVA refresh hosts' exit times (`refresh_interval_s`, 0 = only on events).
    pub reprediction: RepredictionConfig,
    /// Seconds between metric samples.
    pub sample_interval_s: f64,
    /// Seconds after the window start that the averages leave out.
    pub warmup_s: f64,
    /// Trace time from which the averages count, when later than the warm-up's end (the start of
    /// the test period of a timeline whose earlier trace warms the inventory up).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measure_from_s: Option<f64>,
    /// Inflation stranding at every n-th sample (0: never).
    pub inflation_every: u32,
    /// Shapes of the representative VM mix that inflation fills hosts with (the workload's most
    /// common demands).
    pub inflation_shapes: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drains: Option<DrainPlan>,
    /// Consolidation under a migration budget (none: off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consolidation: Option<ConsolidationConfig>,
    /// Keep every VM's host in the result (for cross-checks; large on big traces).
    pub record_placements: bool,
    /// Also measure the realized quality over a sliding window of this many outcomes (the
    /// allocator's window, 5,000 by default), read at every metric sample once full: how far the
    /// figures a quality gate reads move for predictions of constant quality.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quality_window: Option<usize>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            workload: WorkloadConfig::default(),
            inventory: Inventory::default(),
            policy: PolicyConfig::default(),
            tie_break: TieBreak::default(),
            engine: Engine::default(),
            seed: 1,
            prediction: PredictionConfig::default(),
            reprediction: RepredictionConfig::default(),
            sample_interval_s: 3600.0,
            warmup_s: 0.0,
            measure_from_s: None,
            inflation_every: 6,
            inflation_shapes: 16,
            drains: None,
            consolidation: None,
            record_placements: false,
            quality_window: None,
        }
    }
}

impl SimConfig {
    pub fn validate(&self) -> Result<(), SimError> {
        self.workload.validate()?;
        self.prediction.validate()?;
        if !(self.sample_interval_s.is_finite() && self.sample_interval_s > 0.0) {
            return Err(invalid("sample_interval_s", format!("must be > 0 seconds, got {}", self.sample_interval_s)));
        }
        if !(self.warmup_s.is_finite() && self.warmup_s >= 0.0) {
            return Err(invalid("warmup_s", format!("must be >= 0 seconds, got {}", self.warmup_s)));
        }
        if self.measure_from_s.is_some_and(|t| !t.is_finite()) {
            return Err(invalid("measure_from_s", "must be a finite trace time in seconds"));
        }
        if self.quality_window == Some(0) {
            return Err(invalid("quality_window", "must be at least 1 outcome"));
        }
        if let Some(consolidation) = &self.consolidation {
            consolidation.check().map_err(|e| invalid("consolidation", e.to_string()))?;
        }
        if let Some(plan) = &self.drains {
            if !(plan.every_s.is_finite() && plan.every_s > 0.0) {
                return Err(invalid("drains.every_s", format!("must be > 0 seconds, got {}", plan.every_s)));
            }
            if plan.first_after_s.is_some_and(|f| !(f.is_finite() && f >= 0.0)) {
                return Err(invalid("drains.first_after_s", "must be >= 0 seconds"));
            }
            if plan.hosts_per_drain == 0 {
                return Err(invalid("drains.hosts_per_drain", "must be at least 1"));
            }
            if plan.max_in_flight == 0 || plan.max_in_flight > placement::defrag::MAX_IN_FLIGHT {
                return Err(invalid(
                    "drains.max_in_flight",
                    format!("must be between 1 and {}", placement::defrag::MAX_IN_FLIGHT),
                ));
            }
            if !(plan.migration_s.is_finite() && plan.migration_s >= 0.0) {
                return Err(invalid("drains.migration_s", format!("must be >= 0 seconds, got {}", plan.migration_s)));
            }
        }
        Ok(())
    }

    /// Trace time from which the averages count, for a window starting at `from_s`.
    pub fn measured_from_s(&self, from_s: f64) -> f64 {
        (from_s + self.warmup_s).max(self.measure_from_s.unwrap_or(f64::NEG_INFINITY))
    }

    /// The allocator's configuration for this run.
    pub fn allocator_config(&self) -> AllocatorConfig {
        AllocatorConfig {
            policy: self.policy.clone(),
            tie_break: self.tie_break,
            seed: self.seed,
            engine: self.engine,
            reprediction: self.reprediction.clone(),
            ..AllocatorConfig::default()
        }
    }
}

/// Periodic LARS drains.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DrainPlan {
    /// Seconds between drain starts.
    pub every_s: f64,
    /// First drain, in seconds after the window start (default: `every_s`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_after_s: Option<f64>,
    /// Hosts per drain, picked by the allocator (fewest VMs, then most free).
    pub hosts_per_drain: usize,
    /// Drain a fixed sequence instead: the hosts in inventory order, `hosts_per_drain` at a time
    /// (a rolling maintenance), the same hosts in every run whatever their VMs.
    pub rolling: bool,
    /// `longest-remaining-first` (LARS) or `arrival` (the baseline).
    pub order: MigrationOrder,
    pub max_in_flight: usize,
    /// How long one live migration takes (both hosts hold the VM meanwhile).
    pub migration_s: f64,
}

impl Default for DrainPlan {
    fn default() -> Self {
        DrainPlan {
            every_s: 86_400.0,
            first_after_s: None,
            hosts_per_drain: 10,
            rolling: false,
            order: MigrationOrder::LongestRemainingFirst,
            max_in_flight: 3,
            migration_s: 1200.0,
        }
    }
}
