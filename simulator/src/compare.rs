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

use crate::engine::{self, DrainPlan, SimConfig, SimError, SimResult};
use crate::plot::{self, Bar, PlotError, Series};
use crate::predict::PredictionConfig;
use crate::workload::Workload;
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
    /// Run this policy with this prediction only (by name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub only_prediction: Option<String>,
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
    pub runs: Vec<CompareRun>,
}

impl Comparison {
    /// The comparison of finished `runs` of `experiment`.
    pub fn new(experiment: Experiment, runs: Vec<CompareRun>) -> Comparison {
        let gains = gains(&runs, &experiment.baseline);
        let rows = rows(&experiment, &runs, &gains);
        Comparison { baseline: experiment.baseline.clone(), experiment, gains, rows, runs }
    }
}

/// Policies whose rules read no lifetime: predictions cannot change their runs.
fn ignores_predictions(policy: &PolicyConfig) -> bool {
    Policy::from_config(policy, &std::collections::HashMap::new()).is_ok_and(|policy| !policy.reads_predictions())
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
                Some(name) => match self.predictions.iter().find(|p| &p.name == name) {
                    Some(p) => vec![p],
                    None => {
                        return Err(CompareError::Invalid(format!(
                            "policy `{}`: only_prediction `{name}` is not one of the [[predictions]]",
                            policy.name
                        )))
                    }
                },
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
        let rejected: Vec<f64> = runs
            .iter()
            .filter(|r| r.plan.cell.label == run.plan.cell.label)
            .map(|r| r.result.counters.rejected as f64)
            .collect();
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
        let _ = writeln!(out, " {:.0} |", row.rejected.mean);
    }
    if let Some(first) = comparison.runs.first() {
        let m = &first.result.metrics;
        let _ = writeln!(
            out,
            "| offline bound (seed {}) | {:.2} | | {:.2} | |{}{} |",
            first.plan.config.seed,
            100.0 * m.bound_packing_density,
            m.bound_empty_hosts_pct,
            if reference.is_some() { " |" } else { "" },
            if own.is_some() { " |" } else { "" },
        );
    }
    out.push_str("\nEvery run:\n\n");
    out.push_str(
        "| run | seed | packing density % | gain pp (rel %) | empty hosts % | gain pp | empty-to-free | stranded CPU / mem % | \
         rejected | migrations (avoided) | migrated share of drained VMs | prediction accuracy / precision / recall (long) | decisions/s | wall s |\n",
    );
    out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
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
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} | {} | {:.3} | {} / {} | {} | {} ({}) | {} | {:.3} / {:.3} / {:.3} | {:.0} | {:.1} |",
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
            r.timing.decisions_per_s,
            r.timing.wall_s,
        );
    }
    out
}

fn write(path: &Path, text: &str) -> Result<(), CompareError> {
    std::fs::write(path, text).map_err(|source| CompareError::Write { path: path.to_owned(), source })
}

/// Writes `results.json`, `summary.md` and the plots into `dir`; returns the files written.
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
    }
    Ok(written)
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
        assert_eq!(seen, 8, "the experiments of the evaluation and the validation sweep");
    }
}
