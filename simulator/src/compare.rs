//! `simulate compare`: an experiment, a matrix of policies by prediction sources (by variants such
//! as LARS drain orders), replayed in parallel on one workload, written out as JSON and Markdown
//! tables and SVG plots.
//!
//! An [`Experiment`] is a TOML file (see `configs/experiments/`): a base [`SimConfig`], the
//! policies, the predictions, optional variants, and the run every other is compared with. A
//! policy that reads no lifetime (PBFR) runs once, not once per prediction, since predictions
//! cannot change it. Every run's result carries its full configuration and seed, so any row of a
//! table is reproducible alone with `simulate run --config`.

use crate::engine::{self, DrainPlan, SimConfig, SimError, SimResult};
use crate::plot::{self, PlotError, Series};
use crate::predict::PredictionConfig;
use crate::workload::Workload;
use allocator::{PolicyConfig, PolicyKind};
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
    /// The x axis label of the sweep plot, when the predictions have `x` values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep_label: Option<String>,
}

/// One run of the matrix.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlannedRun {
    pub label: String,
    pub policy: String,
    pub prediction: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x: Option<f64>,
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
    pub packing_density_pct: f64,
    pub packing_density_gain_pp: f64,
    /// Relative gain in packing density, percent of the baseline's.
    pub packing_density_gain_rel_pct: f64,
    pub empty_hosts_pct: f64,
    pub empty_hosts_gain_pp: f64,
}

/// The outcome of an experiment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub experiment: Experiment,
    pub baseline: String,
    pub gains: Vec<Gain>,
    pub runs: Vec<CompareRun>,
}

/// Policies whose rules read no lifetime: predictions cannot change their runs.
fn ignores_predictions(policy: &PolicyConfig) -> bool {
    policy.kind == PolicyKind::Pbfr
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
                    runs.push(PlannedRun {
                        label,
                        policy: policy.name.clone(),
                        prediction: prediction.name.clone(),
                        variant: variant.map(|v| v.name.clone()),
                        x: if once && self.predictions.len() > 1 { None } else { prediction.x },
                        config,
                    });
                }
            }
        }
        if !runs.iter().any(|r| r.label == self.baseline) {
            let labels: Vec<&str> = runs.iter().map(|r| r.label.as_str()).collect();
            return Err(CompareError::Invalid(format!(
                "baseline `{}` is not a run of the matrix; the runs are: {}",
                self.baseline,
                labels.join(", ")
            )));
        }
        Ok(runs)
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
                .map_err(|source| CompareError::Run { label: run.label.clone(), source });
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
                slot.into_inner().ok().flatten().ok_or_else(|| CompareError::Unfinished(plan.label.clone()))??;
            Ok(CompareRun { plan, result })
        })
        .collect()
}

/// Gains of every run over the baseline.
pub fn gains(runs: &[CompareRun], baseline: &str) -> Vec<Gain> {
    let Some(base) = runs.iter().find(|r| r.plan.label == baseline) else { return Vec::new() };
    let base_density = 100.0 * base.result.metrics.packing_density;
    let base_empty = base.result.metrics.empty_hosts_pct;
    runs.iter()
        .map(|r| {
            let density = 100.0 * r.result.metrics.packing_density;
            let empty = r.result.metrics.empty_hosts_pct;
            Gain {
                label: r.plan.label.clone(),
                packing_density_pct: density,
                packing_density_gain_pp: density - base_density,
                packing_density_gain_rel_pct: if base_density > 0.0 {
                    100.0 * (density - base_density) / base_density
                } else {
                    0.0
                },
                empty_hosts_pct: empty,
                empty_hosts_gain_pp: empty - base_empty,
            }
        })
        .collect()
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

/// The Markdown summary of a comparison.
pub fn markdown(comparison: &Comparison) -> String {
    let mut out = String::new();
    let title =
        if comparison.experiment.title.is_empty() { &comparison.experiment.name } else { &comparison.experiment.title };
    let _ = writeln!(out, "### {title}\n");
    if let Some(first) = comparison.runs.first() {
        let w = &first.result.workload;
        let _ = writeln!(
            out,
            "{} VMs ({} warm-up) over {:.1} days, {} hosts of {} cores / {} GiB; baseline `{}`; seed {}.\n",
            w.vms,
            w.warmup_vms,
            (w.to_s - w.from_s) / 86_400.0,
            w.hosts,
            w.host_cores,
            w.host_memory_gib,
            comparison.baseline,
            first.plan.config.seed
        );
    }
    out.push_str(
        "| run | packing density % | gain pp (rel %) | empty hosts % | gain pp | empty-to-free | stranded CPU / mem % | \
         rejected | migrations (avoided) | migrated share of drained VMs | prediction accuracy / precision / recall (long) | decisions/s | wall s |\n",
    );
    out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (run, gain) in comparison.runs.iter().zip(&comparison.gains) {
        let r = &run.result;
        let m = &r.metrics;
        let p = &r.prediction;
        let migrations = &r.counters.migrations;
        let _ = writeln!(
            out,
            "| {} | {:.2} | {:+.2} ({:+.2}) | {:.2} | {:+.2} | {:.3} | {} / {} | {} | {} ({}) | {} | {:.3} / {:.3} / {:.3} | {:.0} | {:.1} |",
            run.plan.label,
            gain.packing_density_pct,
            gain.packing_density_gain_pp,
            gain.packing_density_gain_rel_pct,
            gain.empty_hosts_pct,
            gain.empty_hosts_gain_pp,
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
    if let Some(first) = comparison.runs.first() {
        let m = &first.result.metrics;
        let _ = writeln!(
            out,
            "| offline bound | {:.2} | | {:.2} | | | | | | | | | |",
            100.0 * m.bound_packing_density,
            m.bound_empty_hosts_pct
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
    let mut density: Vec<Series> = comparison
        .runs
        .iter()
        .map(|r| Series::new(r.plan.label.clone(), hours(r, &|m| 100.0 * m.packing_density)))
        .collect();
    if let Some(first) = comparison.runs.first() {
        density.push(Series::new("offline bound", hours(first, &|m| 100.0 * m.bound.packing_density)));
    }
    let path = dir.join("packing_density.svg");
    plot::time_series_svg(&path, "Packing density over time", "packing density (%)", &density)?;
    written.push(path);
    let mut empty: Vec<Series> =
        comparison.runs.iter().map(|r| Series::new(r.plan.label.clone(), hours(r, &|m| m.empty_hosts_pct))).collect();
    if let Some(first) = comparison.runs.first() {
        empty.push(Series::new("offline bound", hours(first, &|m| m.bound.empty_hosts_pct)));
    }
    let path = dir.join("empty_hosts.svg");
    plot::time_series_svg(&path, "Empty hosts over time", "empty hosts (%)", &empty)?;
    written.push(path);
    let others = || comparison.gains.iter().filter(|g| g.label != comparison.baseline);
    let path = dir.join("gains_packing_density.svg");
    let bars: Vec<(String, f64)> = others().map(|g| (g.label.clone(), g.packing_density_gain_pp)).collect();
    plot::bars_svg(&path, &format!("Packing density gain over {} (pp)", comparison.baseline), "pp", &bars)?;
    written.push(path);
    let path = dir.join("gains_empty_hosts.svg");
    let bars: Vec<(String, f64)> = others().map(|g| (g.label.clone(), g.empty_hosts_gain_pp)).collect();
    plot::bars_svg(&path, &format!("Empty hosts gain over {} (pp)", comparison.baseline), "pp", &bars)?;
    written.push(path);
    if let Some(x_label) = &comparison.experiment.sweep_label {
        let sweep = |f: &dyn Fn(&CompareRun) -> f64| {
            let mut series: Vec<Series> = Vec::new();
            for run in comparison.runs.iter().filter(|r| r.plan.x.is_some()) {
                let point = (run.plan.x.unwrap_or_default(), f(run));
                match series.iter_mut().find(|s| s.name == run.plan.policy) {
                    Some(s) => s.points.push(point),
                    None => series.push(Series::new(run.plan.policy.clone(), vec![point])),
                }
            }
            series
        };
        let path = dir.join("sweep_packing_density.svg");
        let series = sweep(&|r| 100.0 * r.result.metrics.packing_density);
        plot::sweep_svg(&path, "Packing density by prediction accuracy", x_label, "packing density (%)", &series)?;
        written.push(path);
        let path = dir.join("sweep_empty_hosts.svg");
        let series = sweep(&|r| r.result.metrics.empty_hosts_pct);
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
        let labels: Vec<&str> = plan.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(labels, ["pbfr", "la-binary / a0.5", "la-binary / oracle"]);
        assert_eq!(plan[2].x, Some(1.0));
        assert_eq!(plan[0].x, None, "a run made once is not a point of the sweep");
        let single = MATRIX.split("[[predictions]]").take(2).collect::<Vec<_>>().join("[[predictions]]");
        let plan = Experiment::from_toml(&single).unwrap().plan().unwrap();
        let labels: Vec<&str> = plan.iter().map(|r| r.label.as_str()).collect();
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
        assert_eq!(seen, 5, "the five experiments of the evaluation");
    }
}
