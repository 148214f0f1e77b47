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
use placement::{Policy, PolicyConfig};
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

/// Anything else that varies between runs (LARS drain plans).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drains: Option<DrainPlan>,
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

/// Figures of one run against the baseline, in percentage points of the baseline's figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Gain {
    pub label: String,
    pub seed: u64,
    pub packing_density_pct: f64,
    pub packing_density_gain_pp: f64,
    /// Relative gain in packing density, percent of the baseline's.
    pub packing_density_gain_rel_pct: f64,
    pub empty_hosts_pct: f64,
    pub empty_hosts_gain_pp: f64,
}

/// The mean of one figure over seeds, and its spread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub mean: f64,
    /// Sample standard deviation (0 for one value).
    pub sd: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// The spread of `values` (all zero for none).
    pub fn of(values: &[f64]) -> Spread {
        if values.is_empty() {
            return Spread::default();
        }
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let sd = if values.len() > 1 {
            (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
        } else {
            0.0
        };
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Spread { mean, sd, min, max }
    }
}

/// A share of an oracle's gain that a row keeps: its mean gain over the oracle run's mean gain, in
/// percent (`None` where the oracle gains nothing, so that there is nothing to keep).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Kept {
    pub packing_density_pct: Option<f64>,
    pub empty_hosts_pct: Option<f64>,
}

impl Kept {
    fn of(row: &Row, oracle: &Row) -> Kept {
        let share = |gain: f64, possible: f64| (possible > 0.0).then(|| 100.0 * gain / possible);
        Kept {
            packing_density_pct: share(row.packing_density_gain_pp.mean, oracle.packing_density_gain_pp.mean),
            empty_hosts_pct: share(row.empty_hosts_gain_pp.mean, oracle.empty_hosts_gain_pp.mean),
        }
    }
}

/// The realized quality of a row's runs over seeds (a figure is absent when a run lacks it).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QualitySpread {
    /// VMs whose outcome resolved.
    pub resolved: Spread,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<Spread>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recall: Option<Spread>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roc_auc: Option<Spread>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub average_precision: Option<Spread>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub realized_long_share: Option<Spread>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_long_share: Option<Spread>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_p_long: Option<Spread>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifetime_log10_mae: Option<Spread>,
}

impl QualitySpread {
    /// The spread of the runs' qualities; `None` when a run has none.
    fn of(runs: &[&CompareRun]) -> Option<QualitySpread> {
        let figures: Vec<&QualityFigures> =
            runs.iter().map(|r| r.result.quality.as_ref().map(|q| &q.figures)).collect::<Option<_>>()?;
        if figures.is_empty() {
            return None;
        }
        let of = |f: &dyn Fn(&QualityFigures) -> Option<f64>| {
            figures.iter().map(|q| f(q)).collect::<Option<Vec<f64>>>().map(|v| Spread::of(&v))
        };
        Some(QualitySpread {
            resolved: Spread::of(&figures.iter().map(|q| q.resolved as f64).collect::<Vec<_>>()),
            precision: of(&|q| q.precision),
            recall: of(&|q| q.recall),
            roc_auc: of(&|q| q.roc_auc),
            average_precision: of(&|q| q.average_precision),
            realized_long_share: of(&|q| q.realized_long_share),
            predicted_long_share: of(&|q| q.predicted_long_share),
            mean_p_long: of(&|q| q.mean_p_long),
            lifetime_log10_mae: of(&|q| q.lifetime_log10_mae),
        })
    }
}

/// One row of the table: a cell of the matrix over all the seeds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    #[serde(flatten)]
    pub cell: Cell,
    pub seeds: Vec<u64>,
    pub packing_density_pct: Spread,
    pub empty_hosts_pct: Spread,
    /// Paired gains: each seed's run against the baseline's run with the same seed.
    pub packing_density_gain_pp: Spread,
    pub packing_density_gain_rel_pct: Spread,
    pub empty_hosts_gain_pp: Spread,
    pub rejected: Spread,
    /// The share of the `oracle_reference` run's gain that this row keeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_of_reference: Option<Kept>,
    /// The share of the gain of the same policy with the `oracle_prediction`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_of_own_oracle: Option<Kept>,
    /// The realized quality of the predictions its VMs were placed with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quality: Option<QualitySpread>,
}

/// The realized quality figures a crossing is read at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QualityPoint {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recall: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roc_auc: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub average_precision: Option<f64>,
}

impl QualityPoint {
    fn of(figures: &QualityFigures) -> QualityPoint {
        QualityPoint {
            precision: figures.precision,
            recall: figures.recall,
            roc_auc: figures.roc_auc,
            average_precision: figures.average_precision,
        }
    }

    fn mean_of(quality: Option<&QualitySpread>) -> QualityPoint {
        let mean = |s: Option<Spread>| s.map(|s| s.mean);
        quality.map_or_else(QualityPoint::default, |q| QualityPoint {
            precision: mean(q.precision),
            recall: mean(q.recall),
            roc_auc: mean(q.roc_auc),
            average_precision: mean(q.average_precision),
        })
    }

    /// The point a share `t` of the way from `self` to `other`.
    fn lerp(&self, other: &QualityPoint, t: f64) -> QualityPoint {
        let at = |a: Option<f64>, b: Option<f64>| Some(a? + t * (b? - a?));
        QualityPoint {
            precision: at(self.precision, other.precision),
            recall: at(self.recall, other.recall),
            roc_auc: at(self.roc_auc, other.roc_auc),
            average_precision: at(self.average_precision, other.average_precision),
        }
    }
}

/// Where a policy's packing-density gain over the baseline falls to zero along a sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CrossingKind {
    /// It gains at the highest `x` and not at a lower one: the crossing is interpolated between
    /// the highest `x` where it does not gain and the next one up.
    Crosses,
    /// It gains at every `x` of the sweep: it never stops beating the baseline within it.
    AlwaysAbove,
    /// It does not gain even at the highest `x`.
    NeverAbove,
}

/// A crossing: the `x` where the gain is zero (linear between the bracketing points) and the
/// realized quality there (each figure interpolated between the same points).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CrossingPoint {
    pub kind: CrossingKind,
    /// The bracketing `x` values (gain <= 0 at the first, > 0 at the second).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub between: Option<(f64, f64)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x: Option<f64>,
    pub quality: QualityPoint,
}

/// One seed's crossing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SeedCrossing {
    pub seed: u64,
    #[serde(flatten)]
    pub point: CrossingPoint,
}

/// Where one policy (and variant) of a sweep stops beating the baseline: on the mean gains over
/// seeds, and for each seed on its own paired gains.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Crossing {
    pub policy: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    #[serde(flatten)]
    pub mean: CrossingPoint,
    pub per_seed: Vec<SeedCrossing>,
}

/// The crossing of points `(x, gain, quality)` sorted by `x`: scanning down from the highest `x`,
/// the first point where the gain is not positive, and the point above it.
fn crossing_of(points: &[(f64, f64, QualityPoint)]) -> CrossingPoint {
    let none = |kind| CrossingPoint { kind, between: None, x: None, quality: QualityPoint::default() };
    let Some(&(_, top_gain, _)) = points.last() else { return none(CrossingKind::NeverAbove) };
    if top_gain <= 0.0 {
        return none(CrossingKind::NeverAbove);
    }
    let Some(below) = points.iter().rposition(|&(_, gain, _)| gain <= 0.0) else {
        return none(CrossingKind::AlwaysAbove);
    };
    let ((x0, g0, q0), (x1, g1, q1)) = (points[below], points[below + 1]);
    // g0 <= 0 < g1, so the share is in [0, 1).
    let t = -g0 / (g1 - g0);
    CrossingPoint {
        kind: CrossingKind::Crosses,
        between: Some((x0, x1)),
        x: Some(x0 + t * (x1 - x0)),
        quality: q0.lerp(&q1, t),
    }
}

/// Where each policy of a sweep stops beating the baseline (rows with an `x` only; none without).
pub fn crossings(rows: &[Row], runs: &[CompareRun], gains: &[Gain]) -> Vec<Crossing> {
    let mut out: Vec<Crossing> = Vec::new();
    for row in rows.iter().filter(|r| r.cell.x.is_some()) {
        if out.iter().any(|c| c.policy == row.cell.policy && c.variant == row.cell.variant) {
            continue;
        }
        let mut mine: Vec<&Row> = rows
            .iter()
            .filter(|r| r.cell.x.is_some() && r.cell.policy == row.cell.policy && r.cell.variant == row.cell.variant)
            .collect();
        mine.sort_by(|a, b| a.cell.x.unwrap_or_default().total_cmp(&b.cell.x.unwrap_or_default()));
        let mean: Vec<(f64, f64, QualityPoint)> = mine
            .iter()
            .map(|r| {
                (
                    r.cell.x.unwrap_or_default(),
                    r.packing_density_gain_pp.mean,
                    QualityPoint::mean_of(r.quality.as_ref()),
                )
            })
            .collect();
        let per_seed = row
            .seeds
            .iter()
            .map(|&seed| {
                let points: Vec<(f64, f64, QualityPoint)> = mine
                    .iter()
                    .filter_map(|r| {
                        let gain = gains.iter().find(|g| g.label == r.cell.label && g.seed == seed)?;
                        let run = runs
                            .iter()
                            .find(|run| run.plan.cell.label == r.cell.label && run.plan.config.seed == seed)?;
                        let quality = run
                            .result
                            .quality
                            .as_ref()
                            .map_or_else(QualityPoint::default, |q| QualityPoint::of(&q.figures));
                        Some((r.cell.x.unwrap_or_default(), gain.packing_density_gain_pp, quality))
                    })
                    .collect();
                SeedCrossing { seed, point: crossing_of(&points) }
            })
            .collect();
        out.push(Crossing {
            policy: row.cell.policy.clone(),
            variant: row.cell.variant.clone(),
            mean: crossing_of(&mean),
            per_seed,
        });
    }
    out
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
fn ignores_predictions(policy: &PolicyConfig) -> bool {
    Policy::from_config(policy, &std::collections::HashMap::new(), &placement::Registry::standard())
        .is_ok_and(|policy| !policy.reads_predictions())
}

impl Experiment {
    pub fn from_toml(text: &str) -> Result<Self, CompareError> {
        toml::from_str(text).map_err(|e| CompareError::Invalid(e.to_string()))
    }

    /// The runs of the matrix, in table order; checks that names are unique and the baseline is one.
    pub fn plan(&self) -> Result<Vec<PlannedRun>, CompareError> {
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
                None if ignores_predictions(&policy.policy) => vec![&self.predictions[0]],
                None => self.predictions.iter().collect(),
            };
            // A label names the prediction only where the policy ran with several.
            let once = predictions.len() == 1;
            for prediction in predictions {
                for variant in &variants {
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
                let result = engine::run(workload, &run.config, |done| {
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

/// Gains of every run over the baseline's run with the same seed (runs whose seed the baseline
/// did not run with are left out).
pub fn gains(runs: &[CompareRun], baseline: &str) -> Vec<Gain> {
    runs.iter()
        .filter_map(|r| {
            let base =
                runs.iter().find(|b| b.plan.cell.label == baseline && b.plan.config.seed == r.plan.config.seed)?;
            let base_density = 100.0 * base.result.metrics.packing_density;
            let base_empty = base.result.metrics.empty_hosts_pct;
            let density = 100.0 * r.result.metrics.packing_density;
            let empty = r.result.metrics.empty_hosts_pct;
            Some(Gain {
                label: r.plan.cell.label.clone(),
                seed: r.plan.config.seed,
                packing_density_pct: density,
                packing_density_gain_pp: density - base_density,
                packing_density_gain_rel_pct: if base_density > 0.0 {
                    100.0 * (density - base_density) / base_density
                } else {
                    0.0
                },
                empty_hosts_pct: empty,
                empty_hosts_gain_pp: empty - base_empty,
            })
        })
        .collect()
}

/// The rows of the table: each label's runs over the seeds, in plan order, with the kept shares.
pub fn rows(experiment: &Experiment, runs: &[CompareRun], gains: &[Gain]) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::new();
    for run in runs {
        if rows.iter().any(|row| row.cell.label == run.plan.cell.label) {
            continue;
        }
        let mine: Vec<&Gain> = gains.iter().filter(|g| g.label == run.plan.cell.label).collect();
        let of = |f: &dyn Fn(&Gain) -> f64| Spread::of(&mine.iter().map(|g| f(g)).collect::<Vec<_>>());
        let same: Vec<&CompareRun> = runs.iter().filter(|r| r.plan.cell.label == run.plan.cell.label).collect();
        let rejected: Vec<f64> = same.iter().map(|r| r.result.counters.rejected as f64).collect();
        rows.push(Row {
            cell: run.plan.cell.clone(),
            seeds: mine.iter().map(|g| g.seed).collect(),
            packing_density_pct: of(&|g| g.packing_density_pct),
            empty_hosts_pct: of(&|g| g.empty_hosts_pct),
            packing_density_gain_pp: of(&|g| g.packing_density_gain_pp),
            packing_density_gain_rel_pct: of(&|g| g.packing_density_gain_rel_pct),
            empty_hosts_gain_pp: of(&|g| g.empty_hosts_gain_pp),
            rejected: Spread::of(&rejected),
            kept_of_reference: None,
            kept_of_own_oracle: None,
            quality: QualitySpread::of(&same),
        });
    }
    // Computed from all rows first: each row's oracle is another row.
    let reference = experiment.oracle_reference.as_ref().and_then(|label| rows.iter().find(|r| &r.cell.label == label));
    let kept: Vec<(Option<Kept>, Option<Kept>)> = rows
        .iter()
        .map(|row| {
            let own = experiment.oracle_prediction.as_ref().and_then(|name| {
                rows.iter().find(|o| {
                    &o.cell.prediction == name && o.cell.policy == row.cell.policy && o.cell.variant == row.cell.variant
                })
            });
            (reference.map(|oracle| Kept::of(row, oracle)), own.map(|oracle| Kept::of(row, oracle)))
        })
        .collect();
    for (row, (reference, own)) in rows.iter_mut().zip(kept) {
        row.kept_of_reference = reference;
        row.kept_of_own_oracle = own;
    }
    rows
}

/// Of the VMs that drains had to move, the share actually migrated (the rest exited first): the
/// figure LARS lowers (paper 000 Table 2), comparable between runs whose drains met different VMs.
fn migrated_share(m: &crate::engine::MigrationCounters) -> String {
    let drained = m.performed + m.avoided + m.cancelled;
    if drained == 0 {
        return "-".to_owned();
    }
    format!("{:.2}%", 100.0 * m.performed as f64 / drained as f64)
}

fn opt(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"))
}

/// `mean ±sd` with two decimals, the mean signed for gains.
fn spread(s: &Spread, signed: bool) -> String {
    if signed {
        format!("{:+.2} ±{:.2}", s.mean, s.sd)
    } else {
        format!("{:.2} ±{:.2}", s.mean, s.sd)
    }
}

fn kept(k: Option<Kept>) -> String {
    let pct = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.0}%"));
    k.map_or_else(|| "-".to_owned(), |k| format!("{} / {}", pct(k.packing_density_pct), pct(k.empty_hosts_pct)))
}

/// The Markdown summary of a comparison: the rows over seeds, then every run.
pub fn markdown(comparison: &Comparison) -> String {
    let mut out = String::new();
    let title =
        if comparison.experiment.title.is_empty() { &comparison.experiment.name } else { &comparison.experiment.title };
    let _ = writeln!(out, "### {title}\n");
    if let Some(first) = comparison.runs.first() {
        let w = &first.result.workload;
        let config = &first.plan.config;
        let measured_from = config.measured_from_s(w.from_s);
        let _ = writeln!(
            out,
            "{} VMs ({} warm-up) over {:.1} days, measured over the last {:.1} days; {} hosts of {} cores / {} GiB; \
             baseline `{}`; seeds {:?}; {:?} ties.\n",
            w.vms,
            w.warmup_vms,
            (w.to_s - w.from_s) / 86_400.0,
            (w.to_s - measured_from).max(0.0) / 86_400.0,
            w.hosts,
            w.host_cores,
            w.host_memory_gib,
            comparison.baseline,
            comparison.experiment.seeds(),
            config.tie_break,
        );
    }
    let reference = comparison.experiment.oracle_reference.as_deref();
    let own = comparison.experiment.oracle_prediction.as_deref();
    let _ = write!(
        out,
        "Means over seeds ±1 sample standard deviation; gains are paired with the baseline's run of the same seed."
    );
    if let Some(reference) = reference {
        let _ = write!(
            out,
            " *Kept*: the share of `{reference}`'s mean gain that the row's mean gain is (density / empty hosts)."
        );
    }
    if let Some(own) = own {
        let _ = write!(out, " *Own oracle*: the same for the row's policy with the `{own}` prediction.");
    }
    out.push_str("\n\n| run | packing density % | gain pp | empty hosts % | gain pp |");
    let mut rule = String::from("|---|---:|---:|---:|---:|");
    if reference.is_some() {
        out.push_str(" kept |");
        rule.push_str("---:|");
    }
    if own.is_some() {
        out.push_str(" own oracle |");
        rule.push_str("---:|");
    }
    let with_quality = comparison.rows.iter().any(|row| row.quality.is_some());
    if with_quality {
        out.push_str(" realized precision | recall | ROC AUC | AP |");
        rule.push_str("---:|---:|---:|---:|");
    }
    out.push_str(" rejected |\n");
    rule.push_str("---:|\n");
    out.push_str(&rule);
    for row in &comparison.rows {
        let _ = write!(
            out,
            "| {} | {} | {} | {} | {} |",
            row.cell.label,
            spread(&row.packing_density_pct, false),
            spread(&row.packing_density_gain_pp, true),
            spread(&row.empty_hosts_pct, false),
            spread(&row.empty_hosts_gain_pp, true),
        );
        if reference.is_some() {
            let _ = write!(out, " {} |", kept(row.kept_of_reference));
        }
        if own.is_some() {
            let _ = write!(out, " {} |", kept(row.kept_of_own_oracle));
        }
        if with_quality {
            let q = row.quality.as_ref();
            for figure in [
                q.and_then(|q| q.precision),
                q.and_then(|q| q.recall),
                q.and_then(|q| q.roc_auc),
                q.and_then(|q| q.average_precision),
            ] {
                let _ = write!(
                    out,
                    " {} |",
                    figure.map_or_else(|| "-".to_owned(), |s| format!("{:.3} ±{:.3}", s.mean, s.sd))
                );
            }
        }
        let _ = writeln!(out, " {:.0} |", row.rejected.mean);
    }
    if let Some(first) = comparison.runs.first() {
        let m = &first.result.metrics;
        let _ = writeln!(
            out,
            "| offline bound (seed {}) | {:.2} | | {:.2} | |{}{}{} |",
            first.plan.config.seed,
            100.0 * m.bound_packing_density,
            m.bound_empty_hosts_pct,
            if reference.is_some() { " |" } else { "" },
            if own.is_some() { " |" } else { "" },
            if with_quality { " | | | |" } else { "" },
        );
    }
    if !comparison.crossings.is_empty() {
        crossings_markdown(&mut out, comparison);
    }
    windows_markdown(&mut out, comparison);
    out.push_str("\nEvery run:\n\n");
    out.push_str(
        "| run | seed | packing density % | gain pp (rel %) | empty hosts % | gain pp | empty-to-free | stranded CPU / mem % | \
         rejected | migrations (avoided) | migrated share of drained VMs | prediction accuracy / precision / recall (long) | \
         realized precision / recall / ROC AUC / AP | resolved (unresolved) | decisions/s | wall s |\n",
    );
    out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for run in &comparison.runs {
        let r = &run.result;
        let m = &r.metrics;
        let p = &r.prediction;
        let migrations = &r.counters.migrations;
        let seed = run.plan.config.seed;
        let gain = comparison.gains.iter().find(|g| g.label == run.plan.cell.label && g.seed == seed);
        let gains = gain.map_or_else(
            || "- | - | -".to_owned(),
            |g| {
                format!(
                    "{:+.2} ({:+.2}) | {:.2} | {:+.2}",
                    g.packing_density_gain_pp, g.packing_density_gain_rel_pct, g.empty_hosts_pct, g.empty_hosts_gain_pp
                )
            },
        );
        let (realized, resolved) = r.quality.as_ref().map_or_else(
            || ("-".to_owned(), "-".to_owned()),
            |q| {
                let f = &q.figures;
                let figure = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"));
                (
                    format!(
                        "{} / {} / {} / {}",
                        figure(f.precision),
                        figure(f.recall),
                        figure(f.roc_auc),
                        figure(f.average_precision)
                    ),
                    format!("{} ({})", f.resolved, q.unresolved),
                )
            },
        );
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} | {} | {:.3} | {} / {} | {} | {} ({}) | {} | {:.3} / {:.3} / {:.3} | {} | {} | {:.0} | {:.1} |",
            run.plan.cell.label,
            seed,
            100.0 * m.packing_density,
            gains,
            m.empty_to_free,
            opt(m.stranded_cpu_pct),
            opt(m.stranded_memory_pct),
            r.counters.rejected,
            migrations.performed,
            migrations.avoided,
            migrated_share(migrations),
            p.accuracy,
            p.precision_long,
            p.recall_long,
            realized,
            resolved,
            r.timing.decisions_per_s,
            r.timing.wall_s,
        );
    }
    out
}

/// The table of [`crossings`]: where each policy stops beating the baseline and the realized
/// quality there, on the mean gains and seed by seed.
fn crossings_markdown(out: &mut String, comparison: &Comparison) {
    let x_label = comparison.experiment.sweep_label.as_deref().unwrap_or("x");
    let _ = writeln!(
        out,
        "\nWhere each policy stops beating `{}` ({x_label} where its packing-density gain is zero, linear between the \
         bracketing points, scanning down from the highest; the realized quality interpolated the same way). \
         *Mean*: on the mean gains over seeds; *per seed*: on each seed's paired gains.\n",
        comparison.baseline
    );
    out.push_str(
        "| policy | between | at | realized precision | recall | ROC AUC | AP | per seed: at (precision / AP) |\n",
    );
    out.push_str("|---|---:|---:|---:|---:|---:|---:|---|\n");
    let figure = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"));
    let at = |p: &CrossingPoint| match p.kind {
        CrossingKind::Crosses => figure(p.x),
        CrossingKind::AlwaysAbove => "gains everywhere".to_owned(),
        CrossingKind::NeverAbove => "never gains at the top".to_owned(),
    };
    for c in &comparison.crossings {
        let name = c.variant.as_ref().map_or_else(|| c.policy.clone(), |v| format!("{} / {v}", c.policy));
        let between = c.mean.between.map_or_else(|| "-".to_owned(), |(a, b)| format!("{a} .. {b}"));
        let q = &c.mean.quality;
        let seeds: Vec<String> = c
            .per_seed
            .iter()
            .map(|s| match s.point.kind {
                CrossingKind::Crosses => format!(
                    "{}: {} ({} / {})",
                    s.seed,
                    figure(s.point.x),
                    figure(s.point.quality.precision),
                    figure(s.point.quality.average_precision)
                ),
                _ => format!("{}: {}", s.seed, at(&s.point)),
            })
            .collect();
        let _ = writeln!(
            out,
            "| {name} | {between} | {} | {} | {} | {} | {} | {} |",
            at(&c.mean),
            figure(q.precision),
            figure(q.recall),
            figure(q.roc_auc),
            figure(q.average_precision),
            seeds.join("; ")
        );
    }
}

/// With `quality_window`: how the realized figures of a sliding window (what a quality gate reads)
/// spread over each row's runs, their quantiles averaged over seeds.
fn windows_markdown(out: &mut String, comparison: &Comparison) {
    let windows = |row: &Row| -> Vec<&engine::WindowedQuality> {
        comparison
            .runs
            .iter()
            .filter(|r| r.plan.cell.label == row.cell.label)
            .filter_map(|r| r.result.quality.as_ref().and_then(|q| q.windows.as_ref()))
            .collect()
    };
    let Some(size) = comparison.rows.iter().find_map(|row| windows(row).first().map(|w| w.window)) else { return };
    let _ = writeln!(
        out,
        "\nRealized figures over a sliding window of {size} outcomes (what a quality gate reads), at every metric \
         sample once full: 5th percentile / median / 95th percentile over the samples, averaged over seeds.\n"
    );
    out.push_str("| run | samples | precision | recall | ROC AUC | AP | long-lived share |\n");
    out.push_str("|---|---:|---:|---:|---:|---:|---:|\n");
    for row in &comparison.rows {
        let list = windows(row);
        if list.is_empty() {
            continue;
        }
        let n = list.len() as f64;
        let cell = |f: &dyn Fn(&engine::WindowedQuality) -> Option<engine::Quantiles>| {
            let q: Vec<engine::Quantiles> = list.iter().filter_map(|w| f(w)).collect();
            if q.len() != list.len() {
                return "-".to_owned();
            }
            let mean = |g: &dyn Fn(&engine::Quantiles) -> f64| q.iter().map(g).sum::<f64>() / n;
            format!("{:.3} / {:.3} / {:.3}", mean(&|q| q.p5), mean(&|q| q.p50), mean(&|q| q.p95))
        };
        let samples = list.iter().map(|w| w.samples as f64).sum::<f64>() / n;
        let _ = writeln!(
            out,
            "| {} | {:.0} | {} | {} | {} | {} | {} |",
            row.cell.label,
            samples,
            cell(&|w| w.precision),
            cell(&|w| w.recall),
            cell(&|w| w.roc_auc),
            cell(&|w| w.average_precision),
            cell(&|w| w.realized_long_share),
        );
    }
}

fn write(path: &Path, text: &str) -> Result<(), CompareError> {
    std::fs::write(path, text).map_err(|source| CompareError::Write { path: path.to_owned(), source })
}

/// Writes `results.json`, `summary.md` and (with the `plots` feature) the plots into `dir`; returns
/// the files written.
pub fn write_outputs(comparison: &Comparison, dir: &Path) -> Result<Vec<PathBuf>, CompareError> {
    std::fs::create_dir_all(dir).map_err(|source| CompareError::Write { path: dir.to_owned(), source })?;
    let mut written = Vec::new();
    // The series are in the plots; without them the file stays small enough to keep beside them.
    let mut without_series = comparison.clone();
    for run in &mut without_series.runs {
        run.result.series.clear();
    }
    let json = dir.join("results.json");
    write(&json, &serde_json::to_string_pretty(&without_series)?)?;
    written.push(json);
    let md = dir.join("summary.md");
    write(&md, &markdown(comparison))?;
    written.push(md);
    #[cfg(feature = "plots")]
    write_plots(comparison, dir, &mut written)?;
    Ok(written)
}

/// The comparison's SVG plots (time series of the first seed, gains, sweeps) into `dir`.
#[cfg(feature = "plots")]
fn write_plots(comparison: &Comparison, dir: &Path, written: &mut Vec<PathBuf>) -> Result<(), CompareError> {
    let hours = |run: &CompareRun, f: &dyn Fn(&crate::metrics::InstantMetrics) -> f64| {
        let from = run.result.workload.from_s;
        run.result.series.iter().map(|m| ((m.time_s - from) / 3600.0, f(m))).collect::<Vec<_>>()
    };
    // Time series of the first seed's runs: one line per row.
    let first_seed = comparison.runs.first().map(|r| r.plan.config.seed);
    let shown: Vec<&CompareRun> = comparison.runs.iter().filter(|r| Some(r.plan.config.seed) == first_seed).collect();
    let mut density: Vec<Series> = shown
        .iter()
        .map(|r| Series::new(r.plan.cell.label.clone(), hours(r, &|m| 100.0 * m.packing_density)))
        .collect();
    if let Some(first) = comparison.runs.first() {
        density.push(Series::new("offline bound", hours(first, &|m| 100.0 * m.bound.packing_density)));
    }
    let path = dir.join("packing_density.svg");
    plot::time_series_svg(&path, "Packing density over time", "packing density (%)", &density)?;
    written.push(path);
    let mut empty: Vec<Series> =
        shown.iter().map(|r| Series::new(r.plan.cell.label.clone(), hours(r, &|m| m.empty_hosts_pct))).collect();
    if let Some(first) = comparison.runs.first() {
        empty.push(Series::new("offline bound", hours(first, &|m| m.bound.empty_hosts_pct)));
    }
    let path = dir.join("empty_hosts.svg");
    plot::time_series_svg(&path, "Empty hosts over time", "empty hosts (%)", &empty)?;
    written.push(path);
    // Mean gains over seeds, with their range as whiskers.
    let bars = |f: &dyn Fn(&Row) -> Spread| -> Vec<Bar> {
        comparison
            .rows
            .iter()
            .filter(|row| row.cell.label != comparison.baseline)
            .map(|row| {
                let s = f(row);
                Bar::new(row.cell.label.clone(), s.mean).with_range(s.min, s.max)
            })
            .collect()
    };
    let path = dir.join("gains_packing_density.svg");
    let title = format!("Packing density gain over {} (pp; mean, range over seeds)", comparison.baseline);
    plot::bars_svg(&path, &title, "pp", &bars(&|r| r.packing_density_gain_pp))?;
    written.push(path);
    let path = dir.join("gains_empty_hosts.svg");
    let title = format!("Empty hosts gain over {} (pp; mean, range over seeds)", comparison.baseline);
    plot::bars_svg(&path, &title, "pp", &bars(&|r| r.empty_hosts_gain_pp))?;
    written.push(path);
    if let Some(x_label) = &comparison.experiment.sweep_label {
        let sweep = |f: &dyn Fn(&Row) -> f64| {
            let mut series: Vec<Series> = Vec::new();
            for row in comparison.rows.iter().filter(|r| r.cell.x.is_some()) {
                let point = (row.cell.x.unwrap_or_default(), f(row));
                match series.iter_mut().find(|s| s.name == row.cell.policy) {
                    Some(s) => s.points.push(point),
                    None => series.push(Series::new(row.cell.policy.clone(), vec![point])),
                }
            }
            series
        };
        let path = dir.join("sweep_packing_density.svg");
        let series = sweep(&|r| r.packing_density_pct.mean);
        plot::sweep_svg(&path, "Packing density by prediction accuracy", x_label, "packing density (%)", &series)?;
        written.push(path);
        let path = dir.join("sweep_empty_hosts.svg");
        let series = sweep(&|r| r.empty_hosts_pct.mean);
        plot::sweep_svg(&path, "Empty hosts by prediction accuracy", x_label, "empty hosts (%)", &series)?;
        written.push(path);
        // The gain against the realized quality the allocator would measure: where a safeguard's
        // floor belongs.
        let by_quality = |f: &dyn Fn(&QualitySpread) -> Option<Spread>| {
            let mut series: Vec<Series> = Vec::new();
            for row in comparison.rows.iter().filter(|r| r.cell.x.is_some()) {
                let Some(figure) = row.quality.as_ref().and_then(f) else { continue };
                let point = (figure.mean, row.packing_density_gain_pp.mean);
                match series.iter_mut().find(|s| s.name == row.cell.policy) {
                    Some(s) => s.points.push(point),
                    None => series.push(Series::new(row.cell.policy.clone(), vec![point])),
                }
            }
            for s in &mut series {
                s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
            }
            series
        };
        for (name, figure, title, f) in [
            (
                "sweep_gain_by_precision.svg",
                "realized precision (long-lived)",
                "Packing density gain by realized precision",
                (&|q: &QualitySpread| q.precision) as &dyn Fn(&QualitySpread) -> Option<Spread>,
            ),
            (
                "sweep_gain_by_average_precision.svg",
                "realized average precision",
                "Packing density gain by realized average precision",
                &|q: &QualitySpread| q.average_precision,
            ),
        ] {
            let series = by_quality(f);
            if series.is_empty() {
                continue;
            }
            let path = dir.join(name);
            let y_label = format!("gain over {} (pp)", comparison.baseline);
            plot::sweep_svg(&path, title, figure, &y_label, &series)?;
            written.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MATRIX: &str = r#"
        name = "t"
        baseline = "pbfr"
        [[policies]]
        name = "pbfr"
        policy = { kind = "pbfr" }
        [[policies]]
        name = "la-binary"
        policy = { kind = "la-binary" }
        [[predictions]]
        name = "a0.5"
        prediction = { source = { kind = "noisy-accuracy", accuracy = 0.5 } }
        x = 0.5
        [[predictions]]
        name = "oracle"
        prediction = { source = { kind = "oracle" } }
        x = 1.0
    "#;

    #[test]
    fn a_policy_that_reads_no_lifetime_runs_once() {
        let plan = Experiment::from_toml(MATRIX).unwrap().plan().unwrap();
        let labels: Vec<&str> = plan.iter().map(|r| r.cell.label.as_str()).collect();
        assert_eq!(labels, ["pbfr", "la-binary / a0.5", "la-binary / oracle"]);
        assert_eq!(plan[2].cell.x, Some(1.0));
        assert_eq!(plan[0].cell.x, None, "a run made once is not a point of the sweep");
        let single = MATRIX.split("[[predictions]]").take(2).collect::<Vec<_>>().join("[[predictions]]");
        let plan = Experiment::from_toml(&single).unwrap().plan().unwrap();
        let labels: Vec<&str> = plan.iter().map(|r| r.cell.label.as_str()).collect();
        assert_eq!(labels, ["pbfr", "la-binary"], "one prediction: labels are the policies");
    }

    #[test]
    fn bad_experiments_say_what_is_wrong() {
        let no_baseline = MATRIX.replace("baseline = \"pbfr\"", "baseline = \"nope\"");
        let err = Experiment::from_toml(&no_baseline).unwrap().plan().unwrap_err().to_string();
        assert!(err.contains("baseline `nope`") && err.contains("la-binary / oracle"), "{err}");
        let twice = MATRIX.replace("name = \"la-binary\"", "name = \"pbfr\"");
        let err = Experiment::from_toml(&twice).unwrap().plan().unwrap_err().to_string();
        assert!(err.contains("named `pbfr`"), "{err}");
        let typo = MATRIX.replace("baseline", "basline");
        assert!(Experiment::from_toml(&typo).is_err());
        let with = |line: &str| MATRIX.replace("baseline = \"pbfr\"", &format!("baseline = \"pbfr\"\n{line}"));
        let twice = with("seeds = [1, 2, 1]");
        let err = Experiment::from_toml(&twice).unwrap().plan().unwrap_err().to_string();
        assert!(err.contains("seed twice"), "{err}");
        let reference = with("oracle_reference = \"nilas / oracle\"");
        let err = Experiment::from_toml(&reference).unwrap().plan().unwrap_err().to_string();
        assert!(err.contains("oracle_reference `nilas / oracle`"), "{err}");
        let own = with("oracle_prediction = \"perfect\"");
        let err = Experiment::from_toml(&own).unwrap().plan().unwrap_err().to_string();
        assert!(err.contains("oracle_prediction `perfect`"), "{err}");
    }

    #[test]
    fn seeds_repeat_every_run_and_rows_pair_gains_by_seed() {
        let header = "baseline = \"pbfr\"\nseeds = [3, 4]\noracle_reference = \"la-binary / oracle\"\n\
                      oracle_prediction = \"oracle\"\n[base.workload]\nmax_vms = 300\n\
                      [base.workload.trace]\nkind = \"synthetic\"\ndays = 1.0\nwarmup_days = 0.5";
        let text = MATRIX.replace("baseline = \"pbfr\"", header);
        let experiment = Experiment::from_toml(&text).unwrap();
        let plan = experiment.plan().unwrap();
        let seeds: Vec<(&str, u64)> = plan.iter().map(|r| (r.cell.label.as_str(), r.config.seed)).collect();
        assert_eq!(
            seeds,
            [
                ("pbfr", 3),
                ("pbfr", 4),
                ("la-binary / a0.5", 3),
                ("la-binary / a0.5", 4),
                ("la-binary / oracle", 3),
                ("la-binary / oracle", 4)
            ]
        );
        let workload = Workload::load(&experiment.base.workload).unwrap();
        let runs = run_all(&workload, plan, 2, &|_| {}).unwrap();
        let comparison = Comparison::new(experiment, runs);
        assert_eq!(comparison.rows.len(), 3);
        let density = |label: &str, seed: u64| {
            let run =
                comparison.runs.iter().find(|r| r.plan.cell.label == label && r.plan.config.seed == seed).unwrap();
            100.0 * run.result.metrics.packing_density
        };
        let gain = |label: &str, seed: u64| density(label, seed) - density("pbfr", seed);
        let noisy = &comparison.rows[1];
        assert_eq!(noisy.seeds, [3, 4]);
        let want = (gain("la-binary / a0.5", 3) + gain("la-binary / a0.5", 4)) / 2.0;
        assert!((noisy.packing_density_gain_pp.mean - want).abs() < 1e-9);
        let spread = (gain("la-binary / a0.5", 3) - gain("la-binary / a0.5", 4)).abs();
        assert!((noisy.packing_density_gain_pp.max - noisy.packing_density_gain_pp.min - spread).abs() < 1e-9);
        let possible = (gain("la-binary / oracle", 3) + gain("la-binary / oracle", 4)) / 2.0;
        let kept = noisy.kept_of_reference.unwrap().packing_density_pct;
        if possible > 0.0 {
            assert!((kept.unwrap() - 100.0 * want / possible).abs() < 1e-6);
            assert_eq!(noisy.kept_of_own_oracle.unwrap().packing_density_pct, kept, "its own oracle is the reference");
        } else {
            assert_eq!(kept, None, "nothing to keep when the oracle gains nothing");
        }
        assert_eq!(comparison.rows[0].packing_density_gain_pp, Spread::default(), "the baseline gains nothing");
        let md = markdown(&comparison);
        assert!(md.contains("| kept |") && md.contains("seeds [3, 4]"), "{md}");
    }

    #[test]
    fn a_crossing_is_where_the_gain_last_falls_to_zero_going_down() {
        let q =
            |p: f64| QualityPoint { precision: Some(p), recall: Some(p), roc_auc: None, average_precision: Some(p) };
        // Not monotonic: it gains at 0.5, loses at 0.6 and 0.7, gains from 0.8 on. Scanning down
        // from the top, it stops gaining between 0.7 and 0.8.
        let points =
            [(0.5, 0.1, q(0.5)), (0.6, -0.2, q(0.6)), (0.7, -0.3, q(0.7)), (0.8, 0.1, q(0.8)), (1.0, 1.0, q(1.0))];
        let c = crossing_of(&points);
        assert_eq!((c.kind, c.between), (CrossingKind::Crosses, Some((0.7, 0.8))));
        // 0.3 of the 0.4 pp step: three quarters of the way.
        assert!((c.x.unwrap() - 0.775).abs() < 1e-12);
        assert!((c.quality.precision.unwrap() - 0.775).abs() < 1e-12);
        assert_eq!(c.quality.roc_auc, None, "a figure missing at either end is missing");
        // A gain of exactly zero is where it stops.
        let c = crossing_of(&[(0.5, -1.0, q(0.5)), (0.6, 0.0, q(0.6)), (0.7, 1.0, q(0.7))]);
        assert_eq!((c.between, c.x), (Some((0.6, 0.7)), Some(0.6)));
        assert_eq!(crossing_of(&[(0.5, 0.2, q(0.5)), (1.0, 1.0, q(1.0))]).kind, CrossingKind::AlwaysAbove);
        assert_eq!(crossing_of(&[(0.5, 0.2, q(0.5)), (1.0, -0.1, q(1.0))]).kind, CrossingKind::NeverAbove);
        assert_eq!(crossing_of(&[]).kind, CrossingKind::NeverAbove);
    }

    #[test]
    fn spreads_are_means_with_sample_deviations() {
        let s = Spread::of(&[1.0, 2.0, 6.0]);
        assert_eq!((s.mean, s.min, s.max), (3.0, 1.0, 6.0));
        assert!((s.sd - 7f64.sqrt()).abs() < 1e-12);
        assert_eq!(Spread::of(&[5.0]).sd, 0.0);
        assert_eq!(Spread::of(&[]), Spread::default());
    }

    #[test]
    fn the_checked_in_experiments_plan() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/experiments");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            let plan = Experiment::from_toml(&text).and_then(|e| e.plan());
            assert!(plan.is_ok(), "{}: {}", path.display(), plan.unwrap_err());
            seen += 1;
        }
        assert_eq!(seen, 12, "the experiments of the evaluation, the validation sweeps and the survival test");
    }
}
