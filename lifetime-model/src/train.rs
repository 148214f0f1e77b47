//! The trainer: from a trace to a validated model bundle with its evaluation report.
//!
//! Time split: VMs that arrived before the cut-off train (the last tenth of that period validates,
//! for early stopping and for choosing the decision threshold); VMs that arrived after it evaluate.
//! Training labels are censored at the cut-off, so nothing from the evaluation period leaks in, and
//! the feature store is frozen there too. Evaluation uses the native evaluator the services serve
//! with, so the report measures what is served.

use crate::bundle::{
    LifetimeModel, Manifest, ProbeCase, TrainingWindow, BINARY_MODEL_FILE, FEATURE_STORE_FILE, FORMAT_VERSION,
    MANIFEST_FILE, MULTICLASS_MODEL_FILE, REMAINING_MODEL_FILE,
};
use crate::dataset::{replay, ObservedLifetime, ReplayedTrace};
use crate::features::{RequestFeatures, SchemaBuilder};
use crate::gbdt::TreeEnsemble;
use crate::history::FeatureStore;
use crate::metrics::Scored;
use crate::report::{
    BinaryReport, EvaluationReport, MulticlassReport, RemainingReport, RepredictionCurve, RECALL_LEVELS,
};
use lightgbm3::{Booster, Dataset};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use traces::VmRecord;

const MINUTE: f64 = 60.0;
const HOUR: f64 = 3_600.0;
const DAY: f64 = 86_400.0;

/// Uptime fractions at which each training VM becomes a remaining-lifetime example.
pub const UPTIME_FRACTIONS: [f64; 8] = [0.0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875];
/// Number of per-VM uptime quantiles of the reprediction curve.
pub const REPREDICTION_QUANTILES: usize = 20;

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
    pub iterations: usize,
    pub learning_rate: f64,
    pub num_leaves: usize,
    /// At most this many VMs are expanded into remaining-lifetime examples (evenly sampled).
    pub max_remaining_vms: usize,
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
            iterations: 300,
            learning_rate: 0.05,
            num_leaves: 63,
            max_remaining_vms: 150_000,
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
    Parse(#[from] crate::gbdt::GbdtError),
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the written bundle does not load: {0}")]
    Reload(#[from] crate::bundle::BundleError),
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
    if config.iterations == 0 || config.num_leaves < 2 || config.threads == 0 {
        return bad("iterations, threads must be positive and num_leaves at least 2");
    }
    Ok(())
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
    let (records, cutoff) = match eval {
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

    progress.stage("building the feature schema");
    let mut builder = SchemaBuilder::new(config.history_window_s, config.long_threshold_s);
    for record in records.iter().filter(|r| r.start_s < cutoff) {
        let observed = ObservedLifetime::of(record, cutoff);
        builder.observe(&RequestFeatures::from(record), Some(observed.seconds.max(1.0).log10()));
    }
    let schema = builder.build();
    let encoder = schema.encoder();

    progress.stage("replaying the trace (features from the past only)");
    let replayed = replay(&records, &encoder, cutoff, trace_end, cutoff);
    let store = FeatureStore::snapshot(replayed.histories.clone(), cutoff, config.history_window_s);
    let train_idx: Vec<usize> = (0..replayed.len()).filter(|&i| replayed.start_s[i] < cutoff).collect();
    let eval_idx: Vec<usize> = (0..replayed.len()).filter(|&i| replayed.start_s[i] >= cutoff).collect();
    if train_idx.len() < 100 || eval_idx.len() < 100 {
        return Err(TrainError::NotEnoughData(format!(
            "{} training and {} evaluation VMs; need at least 100 of each",
            train_idx.len(),
            eval_idx.len()
        )));
    }
    // The last tenth of the training period validates.
    let valid_from = first_start + 0.9 * (cutoff - first_start);
    let (fit_idx, valid_idx): (Vec<usize>, Vec<usize>) =
        train_idx.iter().partition(|&&i| replayed.start_s[i] < valid_from);

    let base = json!({
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
        "early_stopping_rounds": 30,
    });

    progress.stage("training the long-lived classifier");
    let threshold = config.long_threshold_s;
    let binary_label = |l: &ObservedLifetime| l.at_least(threshold).map(|long| f32::from(u8::from(long)));
    let binary = fit(
        &replayed,
        &fit_idx,
        &valid_idx,
        |i| binary_label(&replayed.train_label[i]),
        params(&base, json!({"objective": "binary", "metric": "auc", "num_iterations": config.iterations})),
    )?;

    progress.stage("training the lifetime-interval classifier");
    let cutoffs = &config.class_cutoffs_s;
    let num_class = cutoffs.len() + 1;
    let multiclass = fit(
        &replayed,
        &fit_idx,
        &valid_idx,
        |i| replayed.train_label[i].interval_class(cutoffs).map(|c| c as f32),
        params(
            &base,
            json!({"objective": "multiclass", "num_class": num_class, "metric": "multi_logloss",
                   "num_iterations": (config.iterations / 2).max(1)}),
        ),
    )?;

    progress.stage("training the remaining-lifetime model");
    let (fit_rows, fit_labels) = remaining_examples(&replayed, &fit_idx, config, |i| replayed.train_label[i]);
    let (valid_rows, valid_labels) = remaining_examples(&replayed, &valid_idx, config, |i| replayed.train_label[i]);
    let remaining = fit_rows_labels(
        &fit_rows,
        &fit_labels,
        &valid_rows,
        &valid_labels,
        replayed.n_features + 1,
        params(&base, json!({"objective": "regression", "metric": "l2", "num_iterations": config.iterations})),
    )?;

    progress.stage("evaluating on the held-out period");
    let binary_native = TreeEnsemble::from_lightgbm_text(&binary.save_string()?)?;
    let multiclass_native = TreeEnsemble::from_lightgbm_text(&multiclass.save_string()?)?;
    let remaining_native = TreeEnsemble::from_lightgbm_text(&remaining.save_string()?)?;

    let valid_binary: Vec<(f64, bool)> = valid_idx
        .iter()
        .filter_map(|&i| {
            binary_label(&replayed.train_label[i]).map(|y| (binary_native.predict(replayed.row(i)), y > 0.5))
        })
        .collect();
    let (decision_threshold, _) = Scored::new(
        &valid_binary.iter().map(|p| p.0).collect::<Vec<_>>(),
        &valid_binary.iter().map(|p| p.1).collect::<Vec<_>>(),
    )
    .best_f1_threshold();

    let evaluation = EvaluationReport {
        binary: evaluate_binary(&replayed, &eval_idx, &binary_native, threshold, decision_threshold),
        multiclass: evaluate_multiclass(&replayed, &eval_idx, &multiclass_native, cutoffs),
        remaining: evaluate_remaining(&replayed, &eval_idx, &remaining_native, config),
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
    write_bundle(out_dir, &manifest, &binary, &multiclass, &remaining, &store)?;
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

/// Trains on the rows of `fit_idx` that have a label, early-stopping on those of `valid_idx`.
fn fit(
    replayed: &ReplayedTrace,
    fit_idx: &[usize],
    valid_idx: &[usize],
    label: impl Fn(usize) -> Option<f32>,
    parameters: Value,
) -> Result<Booster, TrainError> {
    let gather = |idx: &[usize]| {
        let mut rows = Vec::new();
        let mut labels = Vec::new();
        for &i in idx {
            if let Some(y) = label(i) {
                rows.extend_from_slice(replayed.row(i));
                labels.push(y);
            }
        }
        (rows, labels)
    };
    let (fit_rows, fit_labels) = gather(fit_idx);
    let (valid_rows, valid_labels) = gather(valid_idx);
    fit_rows_labels(&fit_rows, &fit_labels, &valid_rows, &valid_labels, replayed.n_features, parameters)
}

fn fit_rows_labels(
    fit_rows: &[f64],
    fit_labels: &[f32],
    valid_rows: &[f64],
    valid_labels: &[f32],
    n_features: usize,
    mut parameters: Value,
) -> Result<Booster, TrainError> {
    if fit_labels.len() < 50 {
        return Err(TrainError::NotEnoughData(format!("only {} labelled training examples", fit_labels.len())));
    }
    let n = n_features as i32;
    let train = Dataset::from_slice(fit_rows, fit_labels, n, true)?;
    let valid = if valid_labels.len() >= 20 {
        Some(Dataset::from_slice_with_reference(valid_rows, valid_labels, n, true, Some(&train))?)
    } else {
        if let Some(p) = parameters.as_object_mut() {
            p.remove("early_stopping_rounds");
        }
        None
    };
    Ok(Booster::train_with_valid(train, valid, &parameters)?)
}

/// Expands VMs into (base row + log10 uptime, log10 capped remaining lifetime) examples. A VM
/// counts when its remaining lifetime at that uptime is known: it ended, or it was still running
/// beyond the cap.
fn remaining_examples(
    replayed: &ReplayedTrace,
    idx: &[usize],
    config: &TrainConfig,
    label: impl Fn(usize) -> ObservedLifetime,
) -> (Vec<f64>, Vec<f32>) {
    let stride = idx.len().div_ceil(config.max_remaining_vms.max(1)).max(1);
    let mut rows = Vec::new();
    let mut labels = Vec::new();
    for &i in idx.iter().step_by(stride) {
        let observed = label(i);
        for fraction in UPTIME_FRACTIONS {
            let uptime = fraction * observed.seconds;
            let remaining = observed.seconds - uptime;
            if observed.censored && remaining < config.remaining_cap_s {
                continue;
            }
            rows.extend_from_slice(replayed.row(i));
            rows.push((1.0 + uptime).log10());
            labels.push(remaining.clamp(1.0, config.remaining_cap_s).log10() as f32);
        }
    }
    (rows, labels)
}

fn evaluate_binary(
    replayed: &ReplayedTrace,
    eval_idx: &[usize],
    model: &TreeEnsemble,
    threshold_s: f64,
    decision_threshold: f64,
) -> BinaryReport {
    let (scores, labels): (Vec<f64>, Vec<bool>) = eval_idx
        .iter()
        .filter_map(|&i| {
            replayed.full_label[i].at_least(threshold_s).map(|long| (model.predict(replayed.row(i)), long))
        })
        .unzip();
    let scored = Scored::new(&scores, &labels);
    let confusion = scored.confusion_at(decision_threshold);
    BinaryReport {
        examples: scored.len(),
        long_share: scored.positives() as f64 / scored.len().max(1) as f64,
        auc: scored.roc_auc(),
        average_precision: scored.average_precision(),
        decision_threshold,
        f1: confusion.f1(),
        precision: confusion.precision(),
        recall: confusion.recall(),
        precision_at_recall: RECALL_LEVELS.iter().map(|&r| (r, scored.precision_at_recall(r))).collect(),
        confusion,
        roc: scored.roc_curve(200),
    }
}

fn evaluate_multiclass(
    replayed: &ReplayedTrace,
    eval_idx: &[usize],
    model: &TreeEnsemble,
    cutoffs: &[f64],
) -> MulticlassReport {
    let mut probabilities = vec![0.0; model.num_outputs()];
    let (mut examples, mut exact, mut near) = (0usize, 0usize, 0usize);
    for &i in eval_idx {
        let Some(truth) = replayed.full_label[i].interval_class(cutoffs) else { continue };
        model.predict_into(replayed.row(i), &mut probabilities);
        let predicted = crate::argmax(&probabilities);
        examples += 1;
        exact += usize::from(predicted == truth);
        near += usize::from(predicted.abs_diff(truth) <= 1);
    }
    MulticlassReport {
        examples,
        classes: cutoffs.len() + 1,
        accuracy: exact as f64 / examples.max(1) as f64,
        within_one_class: near as f64 / examples.max(1) as f64,
    }
}

fn evaluate_remaining(
    replayed: &ReplayedTrace,
    eval_idx: &[usize],
    model: &TreeEnsemble,
    config: &TrainConfig,
) -> RemainingReport {
    let (rows, labels) = remaining_examples(replayed, eval_idx, config, |i| replayed.full_label[i]);
    let n = replayed.n_features + 1;
    let mae = rows.chunks(n).zip(&labels).map(|(row, &y)| (model.predict(row) - f64::from(y)).abs()).sum::<f64>()
        / labels.len().max(1) as f64;

    // Reprediction curve over completed VMs: at uptime k/20 of its lifetime, does the VM live beyond
    // the threshold (uptime + predicted remaining >= threshold)?
    let completed: Vec<(usize, f64)> = eval_idx
        .iter()
        .filter(|&&i| !replayed.full_label[i].censored)
        .map(|&i| (i, replayed.full_label[i].seconds))
        .collect();
    let mut curves = Vec::new();
    for threshold in [config.long_threshold_s, config.remaining_cap_s] {
        let positives = completed.iter().filter(|(_, life)| *life >= threshold).count();
        if positives == 0 {
            continue; // the data cannot tell (e.g. no VM lives a week within the trace)
        }
        let mut row = Vec::with_capacity(n);
        let f1_by_quantile = (0..REPREDICTION_QUANTILES)
            .map(|k| {
                let fraction = k as f64 / REPREDICTION_QUANTILES as f64;
                let pairs = completed.iter().map(|&(i, life)| {
                    let uptime = fraction * life;
                    row.clear();
                    row.extend_from_slice(replayed.row(i));
                    row.push((1.0 + uptime).log10());
                    let predicted_total = uptime + 10f64.powf(model.predict(&row));
                    (predicted_total >= threshold, life >= threshold)
                });
                crate::metrics::Confusion::from_pairs(pairs.collect::<Vec<_>>()).f1()
            })
            .collect();
        curves.push(RepredictionCurve { threshold_s: threshold, positives, vms: completed.len(), f1_by_quantile });
    }
    RemainingReport { examples: labels.len(), mae_log10: mae, curves }
}

fn write_bundle(
    dir: &Path,
    manifest: &Manifest,
    binary: &Booster,
    multiclass: &Booster,
    remaining: &Booster,
    store: &FeatureStore,
) -> Result<(), TrainError> {
    std::fs::create_dir_all(dir).map_err(|source| TrainError::Write { path: dir.to_owned(), source })?;
    write_file(dir, BINARY_MODEL_FILE, binary.save_string()?.into_bytes())?;
    write_file(dir, MULTICLASS_MODEL_FILE, multiclass.save_string()?.into_bytes())?;
    write_file(dir, REMAINING_MODEL_FILE, remaining.save_string()?.into_bytes())?;
    write_file(dir, FEATURE_STORE_FILE, serde_json::to_vec(store).unwrap_or_default())?;
    // The manifest goes last: a directory without one is an incomplete bundle and is never loaded.
    write_file(dir, MANIFEST_FILE, serde_json::to_vec_pretty(manifest).unwrap_or_default())
}

fn write_file(dir: &Path, file: &str, contents: Vec<u8>) -> Result<(), TrainError> {
    let path = dir.join(file);
    std::fs::write(&path, contents).map_err(|source| TrainError::Write { path, source })
}
