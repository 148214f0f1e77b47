//! `simulate compare`: an experiment, a matrix of policies by prediction sources (by variants such
//! as LARS drain orders) by seeds, replayed in parallel on one workload, written out as JSON and
//! Markdown tables and SVG plots.
//!
//! Every run is repeated with each of the experiment's seeds; a row of the table is the mean over
//! seeds with its spread, and a gain is paired: each seed's run against the baseline's run with the
//! same seed. With an `oracle_reference` (the run whose gain is the possible one, such as NILAS with
//! oracle lifetimes), every row also shows the share of that gain it keeps; with an
//! `oracle_prediction`, the share of its own policy's oracle gain.
//!
//! An [`Experiment`] is a TOML file (see `configs/experiments/`): a base [`SimConfig`], the
//! policies, the predictions, optional variants, and the run every other is compared with. A
//! policy that reads no lifetime (PBFR) runs once, not once per prediction, since predictions
//! cannot change it. Every run's result carries its full configuration and seed, so any row of a
//! table is reproducible alone with `simulate run --config`.
//!
//! Every run also carries the realized quality of its predictions ([`engine::RealizedQuality`], the
//! allocator's own outcome tracker); a row shows it over seeds. In a sweep (predictions with `x`
//! values), [`crossings`] finds where each policy's mean gain over the baseline falls to zero as `x`
//! goes down, and the realized quality there: the point where the policy stops paying off, from
//! which a quality safeguard's floors are chosen (docs/evaluation.md, section 3).

use crate::engine::{self, DrainPlan, SimConfig, SimError, SimResult};
#[cfg(feature = "plots")]
use crate::plot::{self, Bar, PlotError, Series};
use crate::predict::PredictionConfig;
use crate::workload::Workload;
use domain::quality::QualityFigures;
use placement::{Policy, PolicyConfig, Registry};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    #[error("experiment: {0}")]
    Invalid(String),
    #[error("run `{label}`: {source}")]
    Run { label: String, source: SimError },
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("writing results as JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    #[cfg(feature = "plots")]
    Plot(#[from] PlotError),
    #[error("run `{0}` did not finish (its thread panicked)")]
    Unfinished(String),
}

/// One policy of the matrix.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyVariant {
    pub name: String,
    pub policy: PolicyConfig,
    /// Run this policy with this prediction only (by name), or with these ones (a list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub only_prediction: Option<OneOrMany>,
}

/// A name, or a list of names.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn names(&self) -> &[String] {
        match self {
            OneOrMany::One(name) => std::slice::from_ref(name),
            OneOrMany::Many(names) => names,
        }
    }
}

/// One prediction source of the matrix.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PredictionVariant {
    pub name: String,
    pub prediction: PredictionConfig,
    /// Its position on the x axis of a sweep plot (for example the accuracy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x: Option<f64>,
}

/// Anything else that varies between runs (LARS drain plans, consolidation).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drains: Option<DrainPlan>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consolidation: Option<placement::consolidation::ConsolidationConfig>,
    /// Run this variant with this policy only (by name), or with these ones (a list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub only_policy: Option<OneOrMany>,
}

/// An experiment file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Experiment {
    pub name: String,
    #[serde(default)]
    pub title: String,
    /// What every run starts from; the trace and inventory usually come from the command line.
    #[serde(default)]
    pub base: SimConfig,
    pub policies: Vec<PolicyVariant>,
    pub predictions: Vec<PredictionVariant>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub variants: Vec<Variant>,
    /// The label of the run the gains are measured against.
    pub baseline: String,
    /// Seeds every run is repeated with (default: the base's seed alone).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seeds: Vec<u64>,
    /// The label of the run whose mean gain over the baseline is the possible gain (for example
    /// `nilas / oracle`): each row shows the share of it that its own mean gain is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oracle_reference: Option<String>,
    /// The name of the oracle prediction: each row also shows the share of the gain that the same
    /// policy (and variant) makes with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oracle_prediction: Option<String>,
    /// The x axis label of the sweep plot, when the predictions have `x` values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep_label: Option<String>,
}

/// A cell of the matrix: a policy with a prediction (and a variant), under its table label.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    pub label: String,
    pub policy: String,
    pub prediction: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x: Option<f64>,
}

/// One run of the matrix: a cell with one seed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlannedRun {
    #[serde(flatten)]
    pub cell: Cell,
    pub config: SimConfig,
}

/// One finished run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompareRun {
    #[serde(flatten)]
    pub plan: PlannedRun,
    pub result: SimResult,
}

/// The outcome of an experiment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub experiment: Experiment,
    pub baseline: String,
    /// Every run against the baseline's run with the same seed.
    pub gains: Vec<Gain>,
    /// The runs over seeds, in table order.
    pub rows: Vec<Row>,
    /// In a sweep, where each policy stops beating the baseline.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub crossings: Vec<Crossing>,
    pub runs: Vec<CompareRun>,
}

impl Comparison {
    /// The comparison of finished `runs` of `experiment`.
    pub fn new(experiment: Experiment, runs: Vec<CompareRun>) -> Comparison {
        let gains = gains(&runs, &experiment.baseline);
        let rows = rows(&experiment, &runs, &gains);
        let crossings = crossings(&rows, &runs, &gains);
        Comparison { baseline: experiment.baseline.clone(), experiment, gains, rows, crossings, runs }
    }
}

/// Policies whose rules read no lifetime: predictions cannot change their runs.
fn ignores_predictions(policy: &PolicyConfig, registry: &Registry) -> bool {
    Policy::from_config(policy, &std::collections::HashMap::new(), registry)
        .is_ok_and(|policy| !policy.reads_predictions())
}

impl Experiment {
    pub fn from_toml(text: &str) -> Result<Self, CompareError> {
        toml::from_str(text).map_err(|e| CompareError::Invalid(e.to_string()))
    }

    /// The runs of the matrix, in table order; checks that names are unique and the baseline is one.
    /// A policy that reads no prediction (its rules looked up in `registry`) runs once, with the first.
    pub fn plan(&self, registry: &Registry) -> Result<Vec<PlannedRun>, CompareError> {
        if self.policies.is_empty() || self.predictions.is_empty() {
            return Err(CompareError::Invalid("needs at least one [[policies]] and one [[predictions]]".into()));
        }
        let unique = |names: Vec<&str>, what: &str| {
            let mut sorted = names.clone();
            sorted.sort_unstable();
            match sorted.windows(2).find(|w| w[0] == w[1]) {
                Some(w) => Err(CompareError::Invalid(format!("two {what} are named `{}`: names must be unique", w[0]))),
                None => Ok(()),
            }
        };
        unique(self.policies.iter().map(|p| p.name.as_str()).collect(), "policies")?;
        unique(self.predictions.iter().map(|p| p.name.as_str()).collect(), "predictions")?;
        unique(self.variants.iter().map(|v| v.name.as_str()).collect(), "variants")?;
        for variant in &self.variants {
            let names = variant.only_policy.as_ref().map_or(&[][..], |only| only.names());
            if let Some(name) = names.iter().find(|n| !self.policies.iter().any(|p| &p.name == *n)) {
                return Err(CompareError::Invalid(format!(
                    "variant `{}`: only_policy `{name}` is not one of the [[policies]]",
                    variant.name
                )));
            }
        }
        let variants: Vec<Option<&Variant>> =
            if self.variants.is_empty() { vec![None] } else { self.variants.iter().map(Some).collect() };
        let seeds = self.seeds();
        let mut sorted = seeds.clone();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            return Err(CompareError::Invalid(format!("seeds {seeds:?} name a seed twice")));
        }
        let mut runs = Vec::new();
        for policy in &self.policies {
            let predictions: Vec<&PredictionVariant> = match &policy.only_prediction {
                Some(names) => {
                    let mut chosen = Vec::new();
                    for name in names.names() {
                        match self.predictions.iter().find(|p| &p.name == name) {
                            Some(p) => chosen.push(p),
                            None => {
                                return Err(CompareError::Invalid(format!(
                                    "policy `{}`: only_prediction `{name}` is not one of the [[predictions]]",
                                    policy.name
                                )))
                            }
                        }
                    }
                    chosen
                }
                None if ignores_predictions(&policy.policy, registry) => vec![&self.predictions[0]],
                None => self.predictions.iter().collect(),
            };
            // A label names the prediction only where the policy ran with several.
            let once = predictions.len() == 1;
            for prediction in predictions {
                for variant in &variants {
                    if variant
                        .and_then(|v| v.only_policy.as_ref())
                        .is_some_and(|only| !only.names().contains(&policy.name))
                    {
                        continue;
                    }
                    let mut label =
                        if once { policy.name.clone() } else { format!("{} / {}", policy.name, prediction.name) };
                    if let Some(v) = variant {
                        label = format!("{label} / {}", v.name);
                    }
                    let mut config = self.base.clone();
                    config.policy = policy.policy.clone();
                    config.prediction = prediction.prediction.clone();
                    if let Some(v) = variant {
                        config.drains = v.drains.clone();
                        config.consolidation = v.consolidation.clone();
                    }
                    config.validate().map_err(|e| CompareError::Invalid(format!("run `{label}`: {e}")))?;
                    for &seed in &seeds {
                        runs.push(PlannedRun {
                            cell: Cell {
                                label: label.clone(),
                                policy: policy.name.clone(),
                                prediction: prediction.name.clone(),
                                variant: variant.map(|v| v.name.clone()),
                                x: if once && self.predictions.len() > 1 { None } else { prediction.x },
                            },
                            config: SimConfig { seed, ..config.clone() },
                        });
                    }
                }
            }
        }
        let named = [("baseline", Some(&self.baseline)), ("oracle_reference", self.oracle_reference.as_ref())];
        for (what, label) in named {
            if let Some(label) = label.filter(|l| !runs.iter().any(|r| &r.cell.label == *l)) {
                let mut labels: Vec<&str> = runs.iter().map(|r| r.cell.label.as_str()).collect();
                labels.dedup();
                return Err(CompareError::Invalid(format!(
                    "{what} `{label}` is not a run of the matrix; the runs are: {}",
                    labels.join(", ")
                )));
            }
        }
        if let Some(name) = self.oracle_prediction.as_ref().filter(|n| !self.predictions.iter().any(|p| &p.name == *n))
        {
            return Err(CompareError::Invalid(format!("oracle_prediction `{name}` is not one of the [[predictions]]")));
        }
        Ok(runs)
    }

    /// The seeds every run is repeated with.
    pub fn seeds(&self) -> Vec<u64> {
        if self.seeds.is_empty() {
            vec![self.base.seed]
        } else {
            self.seeds.clone()
        }
    }
}

/// Runs `plan` on `workload`, `jobs` runs at a time; `progress(events)` receives every run's
/// events as they are done (from several threads).
pub fn run_all(
    workload: &Workload,
    plan: Vec<PlannedRun>,
    registry: &Registry,
    jobs: usize,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Vec<CompareRun>, CompareError> {
    let next = AtomicUsize::new(0);
    let slots: Vec<Mutex<Option<Result<SimResult, CompareError>>>> = plan.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..jobs.clamp(1, plan.len().max(1)) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(run) = plan.get(i) else { break };
                let mut reported = 0;
                let result = engine::run(workload, &run.config, registry, |done| {
                    progress(done.saturating_sub(reported));
                    reported = done;
                })
                .map_err(|source| CompareError::Run { label: run.cell.label.clone(), source });
                if let Ok(mut slot) = slots[i].lock() {
                    *slot = Some(result);
                }
            });
        }
    });
    plan.into_iter()
        .zip(slots)
        .map(|(plan, slot)| {
            let result =
                slot.into_inner().ok().flatten().ok_or_else(|| CompareError::Unfinished(plan.cell.label.clone()))??;
            Ok(CompareRun { plan, result })
        })
        .collect()
}

mod crossings;
mod report;
mod stats;
#[cfg(test)]
mod tests;

pub use crossings::*;
pub use report::*;
pub use stats::*;
