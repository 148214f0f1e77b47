//! What a run measured ([`SimResult`]): its workload, counters, filtering factor, metrics and
//! series, timing, realized prediction quality and, on request, every placement and migration.

use crate::config::SimConfig;
use crate::metrics::{InstantMetrics, MetricsSummary};
use crate::predict::PredictionReport;
use crate::workload::{PeakDemand, SizedInventory, Workload};
use domain::quality::QualityFigures;
use domain::LifetimePrediction;
use placement::consolidation::ConsolidationCounters;
use placement::AllocatorStats;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The workload and inventory a run had.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkloadSummary {
    pub vms: usize,
    pub warmup_vms: usize,
    pub from_s: f64,
    pub to_s: f64,
    pub records_read: u64,
    pub records_skipped: u64,
    pub hosts: usize,
    pub host_cores: f64,
    pub host_memory_gib: f64,
    pub peak: PeakDemand,
}

impl WorkloadSummary {
    /// The summary of `workload` placed on `inventory` (the simulation's and the agents' alike).
    pub fn of(workload: &Workload, inventory: &SizedInventory) -> WorkloadSummary {
        WorkloadSummary {
            vms: workload.vms.len(),
            warmup_vms: workload.warmup_vms,
            from_s: workload.from_s,
            to_s: workload.to_s,
            records_read: workload.records_read,
            records_skipped: workload.records_skipped,
            hosts: inventory.hosts,
            host_cores: inventory.host_capacity.cores(),
            host_memory_gib: inventory.host_capacity.memory_gib(),
            peak: inventory.peak,
        }
    }
}

/// LARS drains and their migrations, summed over drains.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MigrationCounters {
    pub drains_started: u64,
    pub drains_completed: u64,
    /// Scheduled drains that found no non-empty available host.
    pub drains_without_hosts: u64,
    pub performed: u64,
    /// VMs that exited before their turn: migrations saved.
    pub avoided: u64,
    /// VMs that exited while migrating.
    pub cancelled: u64,
    /// Times a VM found no target host when its turn came (it waits and is tried again).
    pub no_target: u64,
}

/// What happened to the VMs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Counters {
    pub arrivals: u64,
    pub placed: u64,
    pub rejected: u64,
    pub rejected_by_reason: BTreeMap<String, u64>,
    pub exits: u64,
    /// VMs placed and still running at the end of the window.
    pub vms_at_end: u64,
    pub migrations: MigrationCounters,
    /// What consolidation did over the whole run (warm-up included), when on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consolidation: Option<ConsolidationCounters>,
    /// Consolidation's in-flight limit on this inventory (`max_in_flight` resolved), when on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consolidation_in_flight_limit: Option<usize>,
    /// When that limit cannot carry out the budget: the migrations per host-day it can.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consolidation_budget_shortfall: Option<f64>,
}

/// The filtering factor (paper 003 s5.1): the share of the inventory that the packing logic (the
/// preference rules) removes from the candidates the validators left, averaged over placements.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FilteringFactor {
    /// Placements it is averaged over.
    pub decisions: u64,
    /// Mean of (candidates after the validators - hosts tied at the end) / hosts, percent.
    pub mean_pct: f64,
    /// The same for each preference rule alone (hosts it saw - hosts it kept) / hosts, percent.
    pub by_rule: Vec<RuleFiltering>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RuleFiltering {
    pub rule: String,
    pub mean_pct: f64,
}

/// Wall-clock figures of the run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// The event loop (predictions and setup excluded).
    pub wall_s: f64,
    /// Computing the predictions before the loop.
    pub prediction_s: f64,
    /// Inside `Allocator::allocate`.
    pub allocate_s: f64,
    /// Arrivals per second of `allocate` time.
    pub decisions_per_s: f64,
    pub events: u64,
    /// Events per second of loop wall time.
    pub events_per_s: f64,
    pub samples: u64,
    /// Inside the metric samples (inflation included).
    pub metrics_s: f64,
}

/// Where one VM went.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VmPlacement {
    pub vm_id: String,
    /// `None`: rejected.
    pub host_id: Option<String>,
    /// The prediction it was placed with (P(long), the lifetime read at request time), to compare
    /// a run's predictions with another's (the OpenStack plug-in's parity check).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p_long: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_lifetime_s: Option<f64>,
}

impl VmPlacement {
    pub fn new(vm_id: &str, host_id: Option<String>, prediction: Option<&LifetimePrediction>) -> Self {
        VmPlacement {
            vm_id: vm_id.to_owned(),
            host_id,
            p_long: prediction.map(|p| p.p_long),
            expected_lifetime_s: prediction.and_then(|p| p.expected_lifetime_s),
        }
    }
}

/// The realized quality of the predictions a run placed its VMs with, resolved by the allocator's
/// [`OutcomeTracker`] over the whole run (no sliding window).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RealizedQuality {
    /// The version the predictions were tracked under: the bundle's version for the model, else
    /// the run's prediction label (`oracle`, `accuracy:0.8`, ...).
    pub version: String,
    /// Lifetime at and above which a VM is long-lived (the policy's `long_threshold_s`).
    pub long_threshold_s: f64,
    /// Placed VMs whose prediction was tracked (fallbacks and missing predictions are not).
    pub tracked: u64,
    /// Of them, those in no figure: the VMs placed less than the threshold before the end of the
    /// window, whose cohort is not complete (an outcome counts once every VM that started with it
    /// has resolved, as in the allocator's windows). Every VM placed earlier has resolved, at its
    /// exit or as long-lived once it outlived the threshold, whether it exits in the window or not.
    pub unresolved: u64,
    /// Precision and recall of the long-lived class, ROC AUC, average precision, calibration and
    /// the lifetime error of the resolved VMs (`figures.resolved` = `tracked` - `unresolved`).
    pub figures: QualityFigures,
    /// With `quality_window`: the figures of the sliding window at the metric samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub windows: Option<WindowedQuality>,
}

/// How the figures of a sliding window of outcomes (as a quality gate reads them) spread over a
/// run: their quantiles over the metric samples at which the window was full.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WindowedQuality {
    /// Outcomes per window.
    pub window: usize,
    /// Samples taken (each a full window; consecutive ones overlap when fewer than `window` VMs
    /// resolved in between).
    pub samples: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<Quantiles>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recall: Option<Quantiles>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roc_auc: Option<Quantiles>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub average_precision: Option<Quantiles>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub realized_long_share: Option<Quantiles>,
}

/// Quantiles of a figure over samples (nearest rank).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Quantiles {
    pub min: f64,
    pub p5: f64,
    pub p50: f64,
    pub p95: f64,
    pub max: f64,
}

impl Quantiles {
    /// The quantiles of `values` (`None` for none).
    pub fn of(mut values: Vec<f64>) -> Option<Quantiles> {
        values.retain(|v| v.is_finite());
        if values.is_empty() {
            return None;
        }
        values.sort_by(f64::total_cmp);
        let at = |q: f64| values[((q * values.len() as f64).ceil() as usize).clamp(1, values.len()) - 1];
        Some(Quantiles { min: values[0], p5: at(0.05), p50: at(0.5), p95: at(0.95), max: values[values.len() - 1] })
    }
}

impl WindowedQuality {
    /// The spread of the figures of a window of `window` outcomes over the samples it was full at.
    pub(crate) fn of(window: usize, samples: &[QualityFigures]) -> WindowedQuality {
        let of = |f: &dyn Fn(&QualityFigures) -> Option<f64>| Quantiles::of(samples.iter().filter_map(f).collect());
        WindowedQuality {
            window,
            samples: samples.len(),
            precision: of(&|q| q.precision),
            recall: of(&|q| q.recall),
            roc_auc: of(&|q| q.roc_auc),
            average_precision: of(&|q| q.average_precision),
            realized_long_share: of(&|q| q.realized_long_share),
        }
    }
}

/// A run's outcome, with the configuration that reproduces it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimResult {
    pub config: SimConfig,
    pub workload: WorkloadSummary,
    pub prediction: PredictionReport,
    pub counters: Counters,
    pub filtering: FilteringFactor,
    pub metrics: MetricsSummary,
    pub series: Vec<InstantMetrics>,
    pub timing: Timing,
    /// The allocator's own figures at the end of the window.
    pub final_stats: AllocatorStats,
    /// The realized quality of the predictions the VMs were placed with (`None`: none tracked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quality: Option<RealizedQuality>,
    /// Every VM's host in workload order, when `record_placements` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placements: Option<Vec<VmPlacement>>,
    /// Every migration started (drains' and consolidation's), in order, when `record_placements`
    /// is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migrations_started: Option<Vec<VmMigration>>,
}

/// A migration as it started: the VM, where to, and when.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VmMigration {
    pub vm_id: String,
    pub target: String,
    pub at_s: f64,
}
