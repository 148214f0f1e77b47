//! The trainer: from a trace to a validated model bundle with its evaluation report.
//!
//! Time split: VMs that arrived before the cut-off train; VMs that arrived after it evaluate.
//! Training labels are censored at the cut-off, so nothing from the evaluation period leaks in, and
//! the feature store is frozen there too. Evaluation uses the native evaluator the services serve
//! with, so the report measures what is served.
//!
//! Choices are made on a validation split of the training period alone: its last
//! `validation_fraction` validates, the part before fits with labels censored at the validation
//! start (and a feature schema of its own). On it the trainer picks the feature groups (by the
//! long-lived classifier's AUC) and each model's number of rounds (early stopping), then refits the
//! models on the whole training period with those rounds.
//!
//! The survival model ([`lifetime_model::survival`]) is a fourth LightGBM model: a binary hazard per
//! person-period row (one row per VM and lifetime interval it was alive at the start of), so that
//! every VM counts, censored ones included, each for the intervals it was seen to outlive. A validation slice of a few hours
//! (the former last tenth) is so noisy that early stopping on it kept 2-18 trees; a quarter of the
//! period, and a refit that also learns from it, does not waste the most recent data.

use lifetime_model::bundle::{
    sha256_hex, LifetimeModel, Manifest, ProbeCase, TrainingWindow, BINARY_MODEL_FILE, FEATURE_STORE_FILE,
    FORMAT_VERSION, MANIFEST_FILE, MULTICLASS_MODEL_FILE, REMAINING_MODEL_FILE, SURVIVAL_MODEL_FILE,
};
use lifetime_model::dataset::{replay, ObservedLifetime, ReplayedTrace};
use lifetime_model::features::{encode_uptime, FeatureGroup, FeatureSchema, RequestFeatures, SchemaBuilder};
use lifetime_model::gbdt::{OutputTransform, TreeEnsemble};
use lifetime_model::history::FeatureStore;
use lifetime_model::metrics::{brier_at, harrell_c, uno_c, KaplanMeier, Scored};
use lifetime_model::report::{
    AgeConcordance, BinaryReport, CalibrationPoint, Concordance, EvaluationReport, ExitTimeReport, FeatureCandidate,
    FeatureSelection, ModelRounds, MulticlassReport, ReadingCandidate, RemainingReport, RepredictionCurve,
    SurvivalReport, ValidationReport, RECALL_LEVELS,
};
use lifetime_model::survival::{curve_of, LifetimeReading, SurvivalCurve, SurvivalSpec};
use lightgbm3::{Booster, Dataset};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use traces::VmRecord;

mod evaluate;
mod example_rows;
mod validation;

use evaluate::*;
pub use evaluate::{CALIBRATION_HORIZONS_S, MIN_AT_RISK, REPORT_AGES_S};
use example_rows::*;
use validation::*;
pub use validation::{ServedReading, READING_CANDIDATES};

const MINUTE: f64 = 60.0;
const HOUR: f64 = 3_600.0;
const DAY: f64 = 86_400.0;

/// Uptime fractions at which each training VM becomes a remaining-lifetime example.
pub const UPTIME_FRACTIONS: [f64; 8] = [0.0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875];
/// Number of per-VM uptime quantiles of the reprediction curve.
pub const REPREDICTION_QUANTILES: usize = 20;
/// Feature sets whose validation AUCs differ by at most this much are equally good, and the smaller
/// one is kept: differences this small are within the noise of one validation split.
pub const AUC_TIE: f64 = 0.002;
/// Fewer labelled validation examples than this cannot choose rounds; the model then gets the
/// configured maximum.
const MIN_VALIDATION_EXAMPLES: usize = 50;

/// Which feature groups the bundle keeps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum FeatureChoice {
    /// Chosen by validation AUC among every subset of the groups (weekday, tenant, job) dropped.
    #[default]
    Auto,
    /// Exactly these groups dropped, nothing tried (to reproduce a bundle).
    Drop(Vec<FeatureGroup>),
}

#[derive(Clone, Debug)]
pub struct TrainConfig {
    pub name: String,
    pub version: String,
    pub long_threshold_s: f64,
    pub class_cutoffs_s: Vec<f64>,
    pub remaining_cap_s: f64,
    pub history_window_s: f64,
    /// Share of the trace's time span used for training when no separate evaluation trace is given.
    pub train_fraction: f64,
    /// Share of the training period, at its end, that validates the choices of features and rounds.
    pub validation_fraction: f64,
    /// Most boosting rounds (the interval model, 11 trees a round, gets half as many).
    pub iterations: usize,
    /// Validation rounds without improvement after which a model stops.
    pub early_stopping_rounds: usize,
    /// Fewest rounds of a refit model, whatever the validation said: a model of one or two trees
    /// is a symptom of a noisy validation split, not a good model.
    pub min_rounds: usize,
    pub features: FeatureChoice,
    pub learning_rate: f64,
    pub num_leaves: usize,
    /// At most this many VMs are expanded into remaining-lifetime examples (evenly sampled).
    pub max_remaining_vms: usize,
    /// About this many person-period rows per lifetime interval at most train the survival model
    /// (sampled and weighted per interval: see `hazard_examples`).
    pub max_hazard_rows_per_interval: usize,
    /// Upper edges of the survival model's lifetime intervals; empty: no survival model.
    pub survival_edges_s: Vec<f64>,
    /// What the bundle serves of the distribution by default: the median unless set (what the
    /// validation windows of docs/evaluation.md chose for the recommended policy on Azure V1 and
    /// Huawei), or the reading that ranks the validation split's long-lived VMs best.
    pub survival_reading: ServedReading,
    pub threads: usize,
    pub seed: u64,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            name: "lifetime".to_owned(),
            version: "dev".to_owned(),
            long_threshold_s: 2.0 * HOUR,
            class_cutoffs_s: (0..10).map(|i| 15.0 * MINUTE * f64::from(1u32 << i)).collect(),
            remaining_cap_s: 7.0 * DAY,
            history_window_s: 7.0 * DAY,
            train_fraction: 0.7,
            validation_fraction: 0.25,
            iterations: 300,
            early_stopping_rounds: 50,
            min_rounds: 10,
            features: FeatureChoice::Auto,
            learning_rate: 0.05,
            num_leaves: 63,
            max_remaining_vms: 150_000,
            max_hazard_rows_per_interval: 50_000,
            survival_edges_s: lifetime_model::survival::default_edges_s(),
            survival_reading: ServedReading::BestRanked,
            threads: 2,
            seed: 7,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("LightGBM: {0}")]
    LightGbm(#[from] lightgbm3::Error),
    #[error("the trained model does not parse back: {0}")]
    Parse(#[from] lifetime_model::gbdt::GbdtError),
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the written bundle does not load: {0}")]
    Reload(#[from] lifetime_model::bundle::BundleError),
    #[error("not enough data: {0}")]
    NotEnoughData(String),
    #[error("invalid configuration: {0}")]
    Config(String),
}

/// Progress callbacks, so the CLI can show a bar without this library knowing about terminals.
pub trait Progress {
    fn stage(&self, name: &str);
}

impl Progress for () {
    fn stage(&self, _name: &str) {}
}

/// Training inputs: one trace split in time, or a training trace and a later evaluation trace.
pub struct TrainData {
    pub source: String,
    pub train: Vec<VmRecord>,
    pub eval: Option<Vec<VmRecord>>,
    /// When the data was cut (censoring time); defaults to the latest timestamp.
    pub trace_end_s: Option<f64>,
}

fn check(config: &TrainConfig) -> Result<(), TrainError> {
    let bad = |what: &str| Err(TrainError::Config(what.to_owned()));
    if !(config.long_threshold_s.is_finite() && config.long_threshold_s > 0.0) {
        return bad("the long-lived threshold must be a positive number of seconds");
    }
    if config.class_cutoffs_s.is_empty() || config.class_cutoffs_s.windows(2).any(|w| w[0] >= w[1]) {
        return bad("class cut-offs must be a non-empty ascending list");
    }
    if !(0.05..=0.95).contains(&config.train_fraction) {
        return bad("the training fraction must be within [0.05, 0.95]");
    }
    if !(0.05..=0.5).contains(&config.validation_fraction) {
        return bad("the validation fraction must be within [0.05, 0.5]");
    }
    if config.iterations == 0 || config.num_leaves < 2 || config.threads == 0 {
        return bad("iterations, threads must be positive and num_leaves at least 2");
    }
    if config.early_stopping_rounds == 0 || config.min_rounds == 0 {
        return bad("early-stopping rounds and the least number of rounds must be positive");
    }
    if let Some(spec) = survival_spec(config, config.survival_reading.fixed().unwrap_or_default(), false) {
        spec.check().map_err(TrainError::Config)?;
    }
    Ok(())
}

/// The survival model's spec from the configuration, if it has one.
fn survival_spec(config: &TrainConfig, reading: LifetimeReading, p_long_from_survival: bool) -> Option<SurvivalSpec> {
    (!config.survival_edges_s.is_empty()).then(|| SurvivalSpec {
        edges_s: config.survival_edges_s.clone(),
        reading,
        p_long_from_survival,
    })
}

/// LightGBM parameters shared by every model.
fn base_params(config: &TrainConfig) -> Value {
    json!({
        "learning_rate": config.learning_rate,
        "num_leaves": config.num_leaves,
        "min_data_in_leaf": 50,
        "feature_fraction": 0.9,
        "bagging_fraction": 0.8,
        "bagging_freq": 1,
        "lambda_l2": 1.0,
        "num_threads": config.threads,
        "seed": config.seed,
        "deterministic": true,
        "verbosity": -1,
    })
}

/// One of the three models: its objective and validation metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Model {
    Binary,
    Multiclass,
    Remaining,
    Hazard,
}

impl Model {
    fn params(self, config: &TrainConfig) -> Value {
        let extra = match self {
            Model::Binary => json!({"objective": "binary", "metric": "auc"}),
            Model::Multiclass => json!({"objective": "multiclass", "num_class": config.class_cutoffs_s.len() + 1,
                                        "metric": "multi_logloss"}),
            Model::Remaining => json!({"objective": "regression", "metric": "l2"}),
            Model::Hazard => json!({"objective": "binary", "metric": "binary_logloss"}),
        };
        params(&base_params(config), extra)
    }

    fn metric(self) -> &'static str {
        match self {
            Model::Binary => "auc",
            Model::Multiclass => "multi_logloss",
            Model::Remaining => "l2",
            Model::Hazard => "binary_logloss",
        }
    }

    /// Most rounds: the interval model costs a tree per class and round, so it gets half.
    fn max_rounds(self, config: &TrainConfig) -> usize {
        match self {
            Model::Multiclass => (config.iterations / 2).max(1),
            _ => config.iterations,
        }
    }

    /// Whether validation value `a` beats `b` (a NaN never beats anything, anything beats NaN).
    fn better(self, a: f64, b: f64) -> bool {
        match self {
            Model::Binary => a > b || (b.is_nan() && !a.is_nan()),
            _ => a < b || (b.is_nan() && !a.is_nan()),
        }
    }

    /// The validation metric of raw scores (`k` per example) against `examples`' labels; the losses
    /// are weighted means when the examples carry weights.
    fn value(self, raw: &[f64], examples: &Examples, k: usize) -> f64 {
        let labels = &examples.labels;
        let weighted_mean = |loss: &dyn Fn(usize) -> f64| {
            let (mut sum, mut weights) = (0.0, 0.0);
            for i in 0..labels.len() {
                sum += examples.weight(i) * loss(i);
                weights += examples.weight(i);
            }
            sum / weights.max(f64::MIN_POSITIVE)
        };
        match self {
            // AUC depends only on the order, which the sigmoid keeps.
            Model::Binary => Scored::new(raw, &labels.iter().map(|&y| y > 0.5).collect::<Vec<_>>()).roc_auc(),
            Model::Multiclass => weighted_mean(&|i| {
                let scores = &raw[i * k..(i + 1) * k];
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let log_sum = scores.iter().map(|s| (s - max).exp()).sum::<f64>().ln() + max;
                // LightGBM clips probabilities at 1e-15.
                -(scores[labels[i] as usize] - log_sum).max(1e-15f64.ln())
            }),
            Model::Remaining => weighted_mean(&|i| (raw[i] - f64::from(labels[i])).powi(2)),
            // log(1 + e^-x) for the event, log(1 + e^x) for survival, stable for large |x|.
            Model::Hazard => {
                let softplus = |x: f64| x.max(0.0) + (-x.abs()).exp().ln_1p();
                weighted_mean(&|i| if labels[i] > 0.5 { softplus(-raw[i]) } else { softplus(raw[i]) })
            }
        }
    }
}

/// The survival curve of `row` (a base row) at the `intervals` edges of a hazard model.
fn survival_curve(hazards: &TreeEnsemble, row: &[f64], intervals: usize) -> Vec<f64> {
    let grid: Vec<f64> = (0..intervals).map(SurvivalSpec::interval_input).collect();
    curve_of(hazards, row, &grid)
}

/// Trains `model` on all of `examples` for exactly `rounds` rounds.
fn refit(model: Model, examples: &Examples, rounds: usize, config: &TrainConfig) -> Result<Booster, TrainError> {
    if examples.labels.len() < 50 {
        return Err(TrainError::NotEnoughData(format!("only {} labelled training examples", examples.labels.len())));
    }
    let dataset = examples.dataset(None)?;
    Ok(Booster::train(dataset, &params(&model.params(config), json!({"num_iterations": rounds})))?)
}

/// Trains the three models, evaluates them, and writes a bundle to `out_dir`. Returns the manifest
/// of the bundle, which has been reloaded and validated.
pub fn train_bundle(
    data: TrainData,
    config: &TrainConfig,
    out_dir: &Path,
    progress: &dyn Progress,
) -> Result<Manifest, TrainError> {
    check(config)?;
    let TrainData { source, train, eval, trace_end_s } = data;
    if train.is_empty() {
        return Err(TrainError::NotEnoughData("the training trace is empty".to_owned()));
    }
    let first_start = train.iter().map(|r| r.start_s).fold(f64::INFINITY, f64::min);
    let (mut records, cutoff) = match eval {
        Some(eval) => {
            let cutoff = eval.iter().map(|r| r.start_s).fold(f64::INFINITY, f64::min);
            let mut all: Vec<VmRecord> = train.into_iter().filter(|r| r.start_s < cutoff).collect();
            all.extend(eval);
            (all, cutoff)
        }
        None => {
            let last_start = train.iter().map(|r| r.start_s).fold(f64::NEG_INFINITY, f64::max);
            (train, first_start + config.train_fraction * (last_start - first_start))
        }
    };
    let trace_end = trace_end_s.unwrap_or_else(|| {
        records.iter().map(|r| r.end_s.unwrap_or(r.start_s).max(r.start_s)).fold(f64::NEG_INFINITY, f64::max)
    });
    // In arrival order (stable, as the replay orders them), the training period is a prefix.
    records.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
    let training_vms = records.partition_point(|r| r.start_s < cutoff);
    let evaluation_vms = records.len() - training_vms;
    if training_vms < 100 || evaluation_vms < 100 {
        return Err(TrainError::NotEnoughData(format!(
            "{training_vms} training and {evaluation_vms} evaluation VMs; need at least 100 of each"
        )));
    }

    // The survival model's intervals stop where the training period stops supporting them.
    let supported = supported_intervals(
        records[..training_vms].iter().map(|r| ObservedLifetime::of(r, cutoff)),
        &config.survival_edges_s,
    );
    let config = &TrainConfig { survival_edges_s: config.survival_edges_s[..supported].to_vec(), ..config.clone() };

    let valid_from = first_start + (1.0 - config.validation_fraction) * (cutoff - first_start);
    progress.stage("validation split: replaying the training period");
    let split = ValidationSplit::new(&records[..training_vms], valid_from, cutoff, config);
    let validated = validate(&split, config, progress)?;
    drop(split);
    let choice = &validated.report;

    progress.stage("building the feature schema");
    let schema = build_schema(&records[..training_vms], cutoff, config).without(&choice.features.dropped);
    let encoder = schema.encoder();

    progress.stage("replaying the trace (features from the past only)");
    let replayed = replay(&records, &encoder, cutoff, trace_end, cutoff);
    // Histories the model does not read are left out: they would only make the bundle bigger.
    let groups = schema.groups();
    let store = replayed.histories.clone().snapshot(
        cutoff,
        config.history_window_s,
        groups.contains(&FeatureGroup::Tenant),
        groups.contains(&FeatureGroup::Job),
    );
    let train_idx: Vec<usize> = (0..replayed.len()).filter(|&i| replayed.start_s[i] < cutoff).collect();
    let eval_idx: Vec<usize> = (0..replayed.len()).filter(|&i| replayed.start_s[i] >= cutoff).collect();
    let all_cols: Vec<usize> = (0..replayed.n_features).collect();
    let training_examples =
        |model: Model| examples(model, &replayed, &train_idx, &all_cols, config, |i| replayed.train_label[i]);

    progress.stage("training the long-lived classifier");
    let binary = refit(Model::Binary, &training_examples(Model::Binary), choice.binary.rounds, config)?;
    progress.stage("training the lifetime-interval classifier");
    let multiclass = refit(Model::Multiclass, &training_examples(Model::Multiclass), choice.multiclass.rounds, config)?;
    progress.stage("training the remaining-lifetime model");
    let remaining = refit(Model::Remaining, &training_examples(Model::Remaining), choice.remaining.rounds, config)?;
    let survival = match &choice.hazard {
        Some(rounds) => {
            progress.stage("training the survival model (hazards per lifetime interval)");
            Some(refit(Model::Hazard, &training_examples(Model::Hazard), rounds.rounds, config)?)
        }
        None => None,
    };
    // P(long) comes from the distribution only when it validated better than the classifier.
    let p_long_from_survival = choice.survival_auc.is_some_and(|auc| auc > choice.binary.best_value);
    let reading = config.survival_reading.fixed().unwrap_or_else(|| best_ranked_reading(&choice.readings));
    let spec = survival_spec(config, reading, p_long_from_survival);

    progress.stage("evaluating on the held-out period");
    let binary_native = TreeEnsemble::from_lightgbm_text(&binary.save_string()?)?;
    let multiclass_native = TreeEnsemble::from_lightgbm_text(&multiclass.save_string()?)?;
    let remaining_native = TreeEnsemble::from_lightgbm_text(&remaining.save_string()?)?;
    let survival_native = match &survival {
        Some(booster) => Some(TreeEnsemble::from_lightgbm_text(&booster.save_string()?)?),
        None => None,
    };
    let survival_report = match (&survival_native, &spec) {
        (Some(hazards), Some(spec)) => {
            progress.stage("evaluating the lifetime distribution");
            Some(evaluate_survival(&replayed, &train_idx, &eval_idx, hazards, spec, &remaining_native, config))
        }
        _ => None,
    };
    // The refit model has no held-out part of its own: the threshold comes from the validation
    // model, trained the same way for the same rounds on a little less data.
    let decision_threshold = validated.decision_threshold;
    let threshold = config.long_threshold_s;
    let cutoffs = &config.class_cutoffs_s;
    let evaluation = EvaluationReport {
        binary: evaluate_binary(&replayed, &eval_idx, &binary_native, threshold, decision_threshold),
        multiclass: evaluate_multiclass(&replayed, &eval_idx, &multiclass_native, cutoffs),
        remaining: evaluate_remaining(&replayed, &eval_idx, &remaining_native, config),
        exit_time: Some(evaluate_exit_time(&replayed, &eval_idx, &remaining_native, config)),
        validation: Some(validated.report),
        survival: survival_report,
    };

    progress.stage("writing the bundle");
    let probes = eval_idx
        .iter()
        .step_by((eval_idx.len() / 32).max(1))
        .take(32)
        .map(|&i| {
            let row = replayed.row(i).to_vec();
            let mut with_uptime = row.clone();
            with_uptime.push(0.0);
            ProbeCase {
                p_long: binary_native.predict(&row),
                log10_remaining: remaining_native.predict(&with_uptime),
                survival: survival_native
                    .as_ref()
                    .map(|hazards| survival_curve(hazards, &row, config.survival_edges_s.len()))
                    .unwrap_or_default(),
                row,
            }
        })
        .collect();
    let manifest = Manifest {
        format_version: FORMAT_VERSION,
        name: config.name.clone(),
        version: config.version.clone(),
        created_unix_s: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        schema_hash: schema.hash(),
        schema,
        long_threshold_s: config.long_threshold_s,
        decision_threshold,
        class_cutoffs_s: config.class_cutoffs_s.clone(),
        remaining_cap_s: config.remaining_cap_s,
        survival: spec,
        // Filled in by `write_bundle` from the bytes it writes.
        checksums: Default::default(),
        training: TrainingWindow {
            source,
            first_start_s: first_start,
            cutoff_s: cutoff,
            trace_end_s: trace_end,
            training_vms: train_idx.len(),
            evaluation_vms: eval_idx.len(),
        },
        evaluation,
        probes,
    };
    let manifest = write_bundle(out_dir, manifest, [&binary, &multiclass, &remaining], survival.as_ref(), &store)?;
    LifetimeModel::load(out_dir)?;
    Ok(manifest)
}

fn params(base: &Value, extra: Value) -> Value {
    let mut merged = base.clone();
    if let (Some(target), Some(extra)) = (merged.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            target.insert(k.clone(), v.clone());
        }
    }
    merged
}

/// Writes the bundle's files and then its manifest, sealed with the checksums of what was written.
/// Returns the sealed manifest.
fn write_bundle(
    dir: &Path,
    mut manifest: Manifest,
    [binary, multiclass, remaining]: [&Booster; 3],
    survival: Option<&Booster>,
    store: &FeatureStore,
) -> Result<Manifest, TrainError> {
    std::fs::create_dir_all(dir).map_err(|source| TrainError::Write { path: dir.to_owned(), source })?;
    let mut write_sealed = |file: &str, contents: Vec<u8>| {
        manifest.checksums.insert(file.to_owned(), sha256_hex(&contents));
        write_file(dir, file, contents)
    };
    write_sealed(BINARY_MODEL_FILE, binary.save_string()?.into_bytes())?;
    write_sealed(MULTICLASS_MODEL_FILE, multiclass.save_string()?.into_bytes())?;
    write_sealed(REMAINING_MODEL_FILE, remaining.save_string()?.into_bytes())?;
    write_sealed(FEATURE_STORE_FILE, serde_json::to_vec(store).unwrap_or_default())?;
    if let Some(survival) = survival {
        write_sealed(SURVIVAL_MODEL_FILE, survival.save_string()?.into_bytes())?;
    }
    // The manifest goes last: a directory without one is an incomplete bundle and is never loaded.
    write_file(dir, MANIFEST_FILE, serde_json::to_vec_pretty(&manifest).unwrap_or_default())?;
    Ok(manifest)
}

fn write_file(dir: &Path, file: &str, contents: Vec<u8>) -> Result<(), TrainError> {
    let path = dir.join(file);
    std::fs::write(&path, contents).map_err(|source| TrainError::Write { path, source })
}

#[cfg(test)]
mod tests;
