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

/// Feature rows (row-major) with their labels and, when sampled unevenly, their weights.
struct Examples {
    n_features: usize,
    rows: Vec<f64>,
    labels: Vec<f32>,
    /// One per row, or none: every row weighs 1.
    weights: Vec<f32>,
}

impl Examples {
    fn new(n_features: usize) -> Self {
        Examples { n_features, rows: Vec::new(), labels: Vec::new(), weights: Vec::new() }
    }

    fn row(&self, i: usize) -> &[f64] {
        &self.rows[i * self.n_features..(i + 1) * self.n_features]
    }

    fn weight(&self, i: usize) -> f64 {
        self.weights.get(i).map_or(1.0, |&w| f64::from(w))
    }

    /// The rows as a LightGBM dataset (built against `reference`'s bins when given).
    fn dataset(&self, reference: Option<&Dataset>) -> Result<Dataset, TrainError> {
        let n = self.n_features as i32;
        let mut dataset = match reference {
            Some(reference) => Dataset::from_slice_with_reference(&self.rows, &self.labels, n, true, Some(reference))?,
            None => Dataset::from_slice(&self.rows, &self.labels, n, true)?,
        };
        if !self.weights.is_empty() {
            dataset.set_weights(&self.weights)?;
        }
        Ok(dataset)
    }
}

/// The columns `cols` of VM `i`'s row.
fn push_row(out: &mut Vec<f64>, replayed: &ReplayedTrace, i: usize, cols: &[usize]) {
    let row = replayed.row(i);
    out.extend(cols.iter().map(|&c| row[c]));
}

/// The labelled VMs of `idx`, with columns `cols`.
fn gather(replayed: &ReplayedTrace, idx: &[usize], cols: &[usize], label: impl Fn(usize) -> Option<f32>) -> Examples {
    let mut examples = Examples::new(cols.len());
    for &i in idx {
        if let Some(y) = label(i) {
            push_row(&mut examples.rows, replayed, i, cols);
            examples.labels.push(y);
        }
    }
    examples
}

/// The examples of `model` from the VMs `idx`, labelled by `label`.
fn examples(
    model: Model,
    replayed: &ReplayedTrace,
    idx: &[usize],
    cols: &[usize],
    config: &TrainConfig,
    label: impl Fn(usize) -> ObservedLifetime,
) -> Examples {
    match model {
        Model::Binary => gather(replayed, idx, cols, |i| binary_label(&label(i), config.long_threshold_s)),
        Model::Multiclass => {
            gather(replayed, idx, cols, |i| label(i).interval_class(&config.class_cutoffs_s).map(|c| c as f32))
        }
        Model::Remaining => remaining_examples(replayed, idx, cols, config, label),
        Model::Hazard => hazard_examples(replayed, idx, cols, config, label),
    }
}

fn binary_label(observed: &ObservedLifetime, threshold_s: f64) -> Option<f32> {
    observed.at_least(threshold_s).map(|long| f32::from(u8::from(long)))
}

/// The VMs of the training period replayed for validation: `fit` arrived before `valid_from_s` and
/// carry labels censored there; `valid` arrived from then to the cut-off and carry labels censored
/// at the cut-off. Categories are ranked on the fit part only, so no validation lifetime shapes the
/// encoding either.
pub(crate) struct ValidationSplit {
    pub valid_from_s: f64,
    pub schema: FeatureSchema,
    pub replayed: ReplayedTrace,
    pub fit: Vec<usize>,
    pub valid: Vec<usize>,
}

impl ValidationSplit {
    /// `training` must hold only VMs that arrived before `cutoff_s`, sorted by arrival.
    pub fn new(training: &[VmRecord], valid_from_s: f64, cutoff_s: f64, config: &TrainConfig) -> Self {
        debug_assert!(training.iter().all(|r| r.start_s < cutoff_s));
        let fit_count = training.partition_point(|r| r.start_s < valid_from_s);
        let schema = build_schema(&training[..fit_count], valid_from_s, config);
        // Training labels censored at the validation start, full labels at the cut-off.
        let replayed = replay(training, &schema.encoder(), valid_from_s, cutoff_s, valid_from_s);
        let (fit, valid) = (0..replayed.len()).partition(|&i| replayed.start_s[i] < valid_from_s);
        ValidationSplit { valid_from_s, schema, replayed, fit, valid }
    }

    fn examples(&self, model: Model, cols: &[usize], config: &TrainConfig) -> (Examples, Examples) {
        let r = &self.replayed;
        (
            examples(model, r, &self.fit, cols, config, |i| r.train_label[i]),
            examples(model, r, &self.valid, cols, config, |i| r.full_label[i]),
        )
    }
}

/// A feature schema from the VMs `records`, with labels censored at `censor_at_s`.
fn build_schema(records: &[VmRecord], censor_at_s: f64, config: &TrainConfig) -> FeatureSchema {
    let mut builder = SchemaBuilder::new(config.history_window_s, config.long_threshold_s);
    for record in records {
        let observed = ObservedLifetime::of(record, censor_at_s);
        builder.observe(&RequestFeatures::from(record), Some(observed.seconds.max(1.0).log10()));
    }
    builder.build()
}

/// The best round of a model on validation examples.
struct Best {
    /// Rounds (1-based); 0 when there were too few validation examples to tell.
    iteration: usize,
    value: f64,
    /// Probabilities at the best round (long-lived model only), for the decision threshold.
    scores: Vec<f64>,
    /// The validation model, cut to its best round (hazard model only, to read P(long) off it).
    ensemble: Option<TreeEnsemble>,
}

/// Trains `model` on `fit` with early stopping on `valid`, and reads its best round off the
/// validation curve (computed here: LightGBM keeps every round when early stopping never fires).
fn best_rounds(model: Model, fit: &Examples, valid: &Examples, config: &TrainConfig) -> Result<Best, TrainError> {
    if fit.labels.len() < 50 {
        return Err(TrainError::NotEnoughData(format!("only {} labelled fitting examples", fit.labels.len())));
    }
    if valid.labels.len() < MIN_VALIDATION_EXAMPLES {
        return Ok(Best { iteration: 0, value: f64::NAN, scores: Vec::new(), ensemble: None });
    }
    let train = fit.dataset(None)?;
    let validation = valid.dataset(Some(&train))?;
    let parameters = params(
        &model.params(config),
        json!({"num_iterations": model.max_rounds(config), "early_stopping_rounds": config.early_stopping_rounds}),
    );
    let booster = Booster::train_with_valid(train, Some(validation), &parameters)?;
    let ensemble = TreeEnsemble::from_lightgbm_text(&booster.save_string()?)?;
    let mut best = validation_curve_best(model, &ensemble, valid);
    if model == Model::Hazard && best.iteration > 0 {
        best.ensemble = Some(ensemble.truncated(best.iteration * ensemble.num_outputs()));
    }
    Ok(best)
}

/// Sums the ensemble's trees round by round over `valid` and keeps the best round.
fn validation_curve_best(model: Model, ensemble: &TreeEnsemble, valid: &Examples) -> Best {
    let k = ensemble.num_outputs();
    let rounds = ensemble.num_trees() / k.max(1);
    let mut raw = vec![0.0; valid.labels.len() * k];
    let mut best = Best { iteration: 0, value: f64::NAN, scores: Vec::new(), ensemble: None };
    for round in 0..rounds {
        for class in 0..k {
            let tree = round * k + class;
            for (r, score) in raw.iter_mut().skip(class).step_by(k).enumerate() {
                *score += ensemble.tree_value(tree, valid.row(r));
            }
        }
        let value = model.value(&raw, valid, k);
        if best.iteration == 0 || model.better(value, best.value) {
            best.iteration = round + 1;
            best.value = value;
            if model == Model::Binary {
                let transform: OutputTransform = ensemble.output_transform();
                best.scores = raw.iter().map(|&x| transform.apply(x)).collect();
            }
        }
    }
    best
}

/// The candidate feature sets (as dropped groups): every subset of the groups the schema has,
/// dropping none first.
fn candidates(schema: &FeatureSchema, choice: &FeatureChoice) -> Vec<Vec<FeatureGroup>> {
    match choice {
        FeatureChoice::Auto => {
            let present = schema.groups();
            (0..1u32 << present.len())
                .map(|mask| present.iter().enumerate().filter(|(i, _)| mask >> i & 1 == 1).map(|(_, g)| *g).collect())
                .collect()
        }
        FeatureChoice::Drop(groups) => {
            let mut groups = groups.clone();
            groups.sort();
            groups.dedup();
            vec![groups]
        }
    }
}

/// Index of the chosen candidate: the fewest features among those within [`AUC_TIE`] of the best
/// validation AUC (higher AUC first among equally small ones); the first candidate when no AUC is
/// known.
fn choose_candidate(candidates: &[FeatureCandidate]) -> usize {
    let best = candidates.iter().map(|c| c.auc).filter(|a| a.is_finite()).fold(f64::NEG_INFINITY, f64::max);
    if !best.is_finite() {
        return 0;
    }
    candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| c.auc >= best - AUC_TIE)
        .min_by(|a, b| a.1.features.cmp(&b.1.features).then(b.1.auc.total_cmp(&a.1.auc)))
        .map_or(0, |(i, _)| i)
}

/// What the validation split decided.
struct Validated {
    report: ValidationReport,
    decision_threshold: f64,
}

/// Chooses the feature groups and the three models' rounds on the validation split.
fn validate(split: &ValidationSplit, config: &TrainConfig, progress: &dyn Progress) -> Result<Validated, TrainError> {
    let sets = candidates(&split.schema, &config.features);
    let mut tried = Vec::new();
    let mut bests = Vec::new();
    for (k, dropped) in sets.iter().enumerate() {
        progress.stage(&format!("validation: feature set {} of {} (long-lived classifier)", k + 1, sets.len()));
        let cols = split.schema.kept_indices(dropped);
        let (fit, valid) = split.examples(Model::Binary, &cols, config);
        let best = best_rounds(Model::Binary, &fit, &valid, config)?;
        tried.push(FeatureCandidate {
            dropped: dropped.clone(),
            features: cols.len(),
            auc: best.value,
            best_iteration: best.iteration,
        });
        bests.push((best, valid));
    }
    let chosen = choose_candidate(&tried);
    let dropped = tried[chosen].dropped.clone();
    let cols = split.schema.kept_indices(&dropped);
    let (binary_best, binary_valid) = bests.swap_remove(chosen);
    let decision_threshold = if binary_best.scores.is_empty() {
        0.5
    } else {
        let labels: Vec<bool> = binary_valid.labels.iter().map(|&y| y > 0.5).collect();
        Scored::new(&binary_best.scores, &labels).best_f1_threshold().0
    };
    let rounds = |model: Model, best: &Best, examples: usize| ModelRounds {
        metric: model.metric().to_owned(),
        validation_examples: examples,
        best_iteration: best.iteration,
        best_value: best.value,
        rounds: if best.iteration == 0 {
            model.max_rounds(config)
        } else {
            best.iteration.max(config.min_rounds).min(model.max_rounds(config))
        },
    };
    let binary = rounds(Model::Binary, &binary_best, binary_valid.labels.len());
    let mut others = Vec::new();
    for (model, what) in
        [(Model::Multiclass, "lifetime-interval classifier"), (Model::Remaining, "remaining-lifetime model")]
    {
        progress.stage(&format!("validation: rounds of the {what}"));
        let (fit, valid) = split.examples(model, &cols, config);
        let best = best_rounds(model, &fit, &valid, config)?;
        others.push(rounds(model, &best, valid.labels.len()));
    }
    let remaining = others.pop().unwrap_or_else(|| unreachable!("two models were validated"));
    let multiclass = others.pop().unwrap_or_else(|| unreachable!("two models were validated"));
    let (mut hazard, mut survival_auc, mut readings) = (None, None, Vec::new());
    if !config.survival_edges_s.is_empty() {
        progress.stage("validation: rounds of the survival model");
        let (fit, valid) = split.examples(Model::Hazard, &cols, config);
        let best = best_rounds(Model::Hazard, &fit, &valid, config)?;
        hazard = Some(rounds(Model::Hazard, &best, valid.labels.len()));
        if let Some(ensemble) = &best.ensemble {
            let edges = &config.survival_edges_s;
            let r = &split.replayed;
            let curves: Vec<Vec<f64>> = split
                .valid
                .iter()
                .map(|&i| {
                    let row: Vec<f64> = cols.iter().map(|&c| r.row(i)[c]).collect();
                    survival_curve(ensemble, &row, edges.len())
                })
                .collect();
            // P(long) read off the curves, on the validation VMs whose class is known (the
            // classifier's validation examples).
            let (scores, labels): (Vec<f64>, Vec<bool>) = split
                .valid
                .iter()
                .zip(&curves)
                .filter_map(|(&i, curve)| {
                    let threshold = config.long_threshold_s;
                    let long = r.full_label[i].at_least(threshold)?;
                    Some((SurvivalCurve { edges_s: edges, survival: curve }.at(threshold), long))
                })
                .unzip();
            survival_auc = Some(Scored::new(&scores, &labels).roc_auc());
            let observed: Vec<f64> = split.valid.iter().map(|&i| r.full_label[i].seconds).collect();
            let completed: Vec<bool> = split.valid.iter().map(|&i| !r.full_label[i].censored).collect();
            readings = READING_CANDIDATES
                .iter()
                .map(|&reading| reading_candidate(reading, edges, &curves, &observed, &completed, config))
                .collect();
        }
    }
    Ok(Validated {
        report: ValidationReport {
            valid_from_s: split.valid_from_s,
            fit_vms: split.fit.len(),
            validation_vms: split.valid.len(),
            features: FeatureSelection {
                forced: matches!(config.features, FeatureChoice::Drop(_)),
                candidates: tried,
                dropped,
            },
            binary,
            multiclass,
            remaining,
            hazard,
            survival_auc,
            readings,
        },
        decision_threshold,
    })
}

/// Which reading a bundle serves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ServedReading {
    Fixed(LifetimeReading),
    /// The candidate ([`READING_CANDIDATES`]) that orders the validation split's long-lived VMs'
    /// exits best: the highest mean of Harrell's C at request time and at the threshold.
    BestRanked,
}

impl ServedReading {
    /// The reading, when it is not chosen on validation.
    pub fn fixed(self) -> Option<LifetimeReading> {
        match self {
            ServedReading::Fixed(reading) => Some(reading),
            ServedReading::BestRanked => None,
        }
    }
}

/// `auto` ([`ServedReading::BestRanked`]) or a reading ([`LifetimeReading`]'s syntax).
impl std::str::FromStr for ServedReading {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.trim() == "auto" {
            return Ok(ServedReading::BestRanked);
        }
        text.parse().map(ServedReading::Fixed).map_err(|e| format!("{e}, or auto"))
    }
}

/// The candidate reading whose validation C (mean of request time and the threshold) is highest;
/// the median when none could be measured.
fn best_ranked_reading(readings: &[ReadingCandidate]) -> LifetimeReading {
    let score = |r: &ReadingCandidate| (r.c_long_at_request + r.c_long_at_threshold) / 2.0;
    readings
        .iter()
        .zip(READING_CANDIDATES)
        .filter(|(r, _)| score(r).is_finite())
        .max_by(|a, b| score(a.0).total_cmp(&score(b.0)))
        .map_or(LifetimeReading::default(), |(_, reading)| reading)
}

/// The readings of the lifetime distribution the validation split compares.
pub const READING_CANDIDATES: [LifetimeReading; 8] = [
    LifetimeReading::Quantile { q: 0.25 },
    LifetimeReading::Quantile { q: 0.5 },
    LifetimeReading::Quantile { q: 0.75 },
    LifetimeReading::Quantile { q: 0.9 },
    LifetimeReading::TruncatedMean { horizon_s: DAY },
    LifetimeReading::TruncatedMean { horizon_s: 3.0 * DAY },
    LifetimeReading::TruncatedMean { horizon_s: 7.0 * DAY },
    LifetimeReading::GeometricMean,
];

/// How well `reading` of the `curves` orders the exits of the VMs that live past the long-lived
/// threshold: at request time, and repredicted at that age.
fn reading_candidate(
    reading: LifetimeReading,
    edges: &[f64],
    curves: &[Vec<f64>],
    observed: &[f64],
    completed: &[bool],
    config: &TrainConfig,
) -> ReadingCandidate {
    let age = config.long_threshold_s;
    let long: Vec<usize> = (0..observed.len()).filter(|&k| observed[k] >= age).collect();
    let c_at = |at: f64| {
        let predicted: Vec<f64> = long
            .iter()
            .map(|&k| {
                SurvivalCurve { edges_s: edges, survival: &curves[k] }
                    .remaining_s(at, reading)
                    .min(config.remaining_cap_s)
            })
            .collect();
        let obs: Vec<f64> = long.iter().map(|&k| observed[k]).collect();
        let done: Vec<bool> = long.iter().map(|&k| completed[k]).collect();
        harrell_c(&predicted, &obs, &done)
    };
    ReadingCandidate {
        reading: reading.to_string(),
        long_vms: long.len(),
        c_long_at_request: c_at(0.0),
        c_long_at_threshold: c_at(age),
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

/// Expands VMs into (base row + log10 uptime, log10 capped remaining lifetime) examples. A VM
/// counts when its remaining lifetime at that uptime is known: it ended, or it was still running
/// beyond the cap.
fn remaining_examples(
    replayed: &ReplayedTrace,
    idx: &[usize],
    cols: &[usize],
    config: &TrainConfig,
    label: impl Fn(usize) -> ObservedLifetime,
) -> Examples {
    let stride = idx.len().div_ceil(config.max_remaining_vms.max(1)).max(1);
    let mut examples = Examples::new(cols.len() + 1);
    for &i in idx.iter().step_by(stride) {
        let observed = label(i);
        for fraction in UPTIME_FRACTIONS {
            let uptime = fraction * observed.seconds;
            let remaining = observed.seconds - uptime;
            if observed.censored && remaining < config.remaining_cap_s {
                continue;
            }
            push_row(&mut examples.rows, replayed, i, cols);
            examples.rows.push(encode_uptime(uptime));
            examples.labels.push(remaining.clamp(1.0, config.remaining_cap_s).log10() as f32);
        }
    }
    examples
}

/// Expands VMs into person-period rows of the hazard model: base row + interval index, labelled 1
/// for the interval the VM ended in and 0 for each interval it outlived. A censored VM gives only
/// the intervals it outlived (it is never dropped: those rows are what it tells). A VM is
/// followed up to the last edge; past it the model says nothing.
///
/// Early intervals have every VM at risk, late ones only the long-lived few, whose order is what
/// the exit times need. So rows are sampled per interval, not per VM: an interval keeps at most
/// about `max_hazard_rows_per_interval` of its rows, chosen at random (seeded), each weighted by
/// the inverse of its interval's rate so that the likelihood stays the full data's. Every row of
/// the sparse late intervals is kept.
fn hazard_examples(
    replayed: &ReplayedTrace,
    idx: &[usize],
    cols: &[usize],
    config: &TrainConfig,
    label: impl Fn(usize) -> ObservedLifetime,
) -> Examples {
    let edges = &config.survival_edges_s;
    // The intervals VM `i` gives a row for, and whether it ended in the last of them.
    let rows_of = |i: usize| -> (usize, bool) {
        let observed = label(i);
        match edges.iter().position(|&upper| observed.seconds < upper) {
            Some(j) if observed.censored => (j, false), // still running inside interval j: no verdict on it
            Some(j) => (j + 1, true),
            None => (edges.len(), false),
        }
    };
    let mut at_risk = vec![0usize; edges.len()];
    for &i in idx {
        for count in &mut at_risk[..rows_of(i).0] {
            *count += 1;
        }
    }
    let cap = config.max_hazard_rows_per_interval.max(1) as f64;
    let rate: Vec<f64> = at_risk.iter().map(|&n| (cap / n.max(1) as f64).min(1.0)).collect();
    let mut examples = Examples::new(cols.len() + 1);
    for &i in idx {
        let (intervals, ended) = rows_of(i);
        for (j, &rate) in rate[..intervals].iter().enumerate() {
            if rate < 1.0 && unit_hash(config.seed, i, j) >= rate {
                continue;
            }
            push_row(&mut examples.rows, replayed, i, cols);
            examples.rows.push(SurvivalSpec::interval_input(j));
            examples.labels.push(if ended && j + 1 == intervals { 1.0 } else { 0.0 });
            examples.weights.push((1.0 / rate) as f32);
        }
    }
    examples
}

/// A number in [0, 1) that depends only on (`seed`, `vm`, `interval`): a reproducible coin.
fn unit_hash(seed: u64, vm: usize, interval: usize) -> f64 {
    // splitmix64 of the three, mixed.
    let mut z =
        seed ^ (vm as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (interval as u64).wrapping_mul(0xd1b5_4a32_d192_ed03);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// The number of leading intervals of `edges` in which enough VMs of `labels` were seen at risk
/// (alive at the interval's start and not censored inside it) to estimate a hazard: at least
/// [`MIN_AT_RISK`] and 0.2% of the VMs. Past them the data says next to nothing (the training
/// period is a few days long), and a tree model would extrapolate arbitrarily.
fn supported_intervals(labels: impl Iterator<Item = ObservedLifetime>, edges: &[f64]) -> usize {
    let mut at_risk = vec![0usize; edges.len()];
    let mut vms = 0usize;
    for observed in labels {
        vms += 1;
        for (j, &upper) in edges.iter().enumerate() {
            if observed.censored && observed.seconds < upper {
                break;
            }
            at_risk[j] += 1;
            if observed.seconds < upper {
                break;
            }
        }
    }
    let needed = MIN_AT_RISK.max(vms / 500);
    at_risk.iter().take_while(|&&n| n >= needed).count()
}

/// Fewest VMs at risk in a survival interval for the trainer to keep it.
pub const MIN_AT_RISK: usize = 200;

/// Ages at which the report measures the remaining lifetime (besides the request time).
pub const REPORT_AGES_S: [f64; 2] = [2.0 * HOUR, DAY];
/// Horizons of the calibration of `P(T > age + t | T > age)`.
pub const CALIBRATION_HORIZONS_S: [f64; 3] = [HOUR, DAY, 7.0 * DAY];

/// The survival model on the held-out period: concordance of its reading at request time and at
/// later ages (beside the remaining-lifetime regression on the same VMs), integrated Brier score
/// against a featureless Kaplan-Meier curve of the training period, and calibration.
fn evaluate_survival(
    replayed: &ReplayedTrace,
    train_idx: &[usize],
    eval_idx: &[usize],
    hazards: &TreeEnsemble,
    spec: &SurvivalSpec,
    regression: &TreeEnsemble,
    config: &TrainConfig,
) -> SurvivalReport {
    let edges = &spec.edges_s;
    let curves: Vec<Vec<f64>> =
        eval_idx.iter().map(|&i| survival_curve(hazards, replayed.row(i), edges.len())).collect();
    let curve = |k: usize| SurvivalCurve { edges_s: edges, survival: &curves[k] };
    let observed: Vec<f64> = eval_idx.iter().map(|&i| replayed.full_label[i].seconds).collect();
    let completed: Vec<bool> = eval_idx.iter().map(|&i| !replayed.full_label[i].censored).collect();
    let censoring = KaplanMeier::new(&observed, &completed.iter().map(|&c| !c).collect::<Vec<_>>());
    // Uno's weights blow up where hardly any VM is still observed: stop where G falls below 0.1.
    let tau_s = {
        let mut sorted: Vec<f64> = observed.iter().zip(&completed).filter(|(_, &c)| c).map(|(&t, _)| t).collect();
        sorted.sort_by(f64::total_cmp);
        let last = sorted.iter().rev().find(|&&t| censoring.before(t) >= 0.1).copied().unwrap_or(f64::INFINITY);
        last.min(config.remaining_cap_s)
    };
    let cap = config.remaining_cap_s;
    let regression_at = |k: usize, age: f64| {
        let mut row = replayed.row(eval_idx[k]).to_vec();
        row.push(encode_uptime(age));
        10f64.powf(regression.predict(&row)).clamp(1.0, cap)
    };
    let concordance = |members: &[usize], predict: &dyn Fn(usize) -> f64| {
        let predicted: Vec<f64> = members.iter().map(|&k| predict(k)).collect();
        let obs: Vec<f64> = members.iter().map(|&k| observed[k]).collect();
        let done: Vec<bool> = members.iter().map(|&k| completed[k]).collect();
        Concordance {
            vms: members.len(),
            harrell: harrell_c(&predicted, &obs, &done),
            uno: uno_c(&predicted, &obs, &done, tau_s),
        }
    };
    let at_age = |members: &[usize], age: f64| AgeConcordance {
        age_s: age,
        survival: concordance(members, &|k| curve(k).remaining_s(age, spec.reading).min(cap)),
        regression: concordance(members, &|k| regression_at(k, age)),
    };
    let everyone: Vec<usize> = (0..eval_idx.len()).collect();
    let alive_at = |age: f64| everyone.iter().copied().filter(|&k| observed[k] >= age).collect::<Vec<_>>();
    let all = at_age(&everyone, 0.0);
    let long = at_age(&alive_at(config.long_threshold_s), 0.0);
    let by_age = REPORT_AGES_S.iter().map(|&age| at_age(&alive_at(age), age)).collect();

    // P(long) off the distribution, on the VMs whose class is known.
    let (scores, labels): (Vec<f64>, Vec<bool>) = eval_idx
        .iter()
        .enumerate()
        .filter_map(|(k, &i)| {
            replayed.full_label[i]
                .at_least(config.long_threshold_s)
                .map(|long| (curve(k).at(config.long_threshold_s), long))
        })
        .unzip();
    let auc_p_long = Scored::new(&scores, &labels).roc_auc();

    // Integrated Brier score over an even grid of (0, horizon].
    let horizon = tau_s.min(7.0 * DAY);
    let train_observed: Vec<f64> = train_idx.iter().map(|&i| replayed.train_label[i].seconds).collect();
    let train_events: Vec<bool> = train_idx.iter().map(|&i| !replayed.train_label[i].censored).collect();
    let marginal = KaplanMeier::new(&train_observed, &train_events);
    const BRIER_POINTS: usize = 100;
    let (mut model_sum, mut marginal_sum) = (0.0, 0.0);
    let mut predicted = vec![0.0; eval_idx.len()];
    for p in 1..=BRIER_POINTS {
        let t = horizon * p as f64 / BRIER_POINTS as f64;
        for (k, value) in predicted.iter_mut().enumerate() {
            *value = curve(k).at(t);
        }
        model_sum += brier_at(&predicted, &observed, &completed, &censoring, t);
        predicted.fill(marginal.at(t));
        marginal_sum += brier_at(&predicted, &observed, &completed, &censoring, t);
    }

    // Calibration: among the VMs alive at each age, predicted against Kaplan-Meier survival.
    let mut calibration = Vec::new();
    for age in std::iter::once(0.0).chain(REPORT_AGES_S) {
        let members = alive_at(age);
        let residual: Vec<f64> = members.iter().map(|&k| observed[k] - age).collect();
        let events: Vec<bool> = members.iter().map(|&k| completed[k]).collect();
        let km = KaplanMeier::new(&residual, &events);
        for t in CALIBRATION_HORIZONS_S {
            let mean = members
                .iter()
                .map(|&k| {
                    let c = curve(k);
                    let alive = c.at(age);
                    if alive > 0.0 {
                        c.at(age + t) / alive
                    } else {
                        0.0
                    }
                })
                .sum::<f64>()
                / members.len().max(1) as f64;
            calibration.push(CalibrationPoint {
                age_s: age,
                t_s: t,
                vms: members.len(),
                predicted: mean,
                observed: km.at(t),
            });
        }
    }
    let readings = READING_CANDIDATES
        .iter()
        .map(|&reading| reading_candidate(reading, edges, &curves, &observed, &completed, config))
        .collect();
    SurvivalReport {
        readings,
        reading: spec.reading.to_string(),
        intervals: edges.len(),
        auc_p_long,
        p_long_from_survival: spec.p_long_from_survival,
        tau_s,
        all,
        long,
        by_age,
        integrated_brier: model_sum / BRIER_POINTS as f64,
        integrated_brier_marginal: marginal_sum / BRIER_POINTS as f64,
        brier_horizon_s: horizon,
        calibration,
    }
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
        let predicted = lifetime_model::argmax(&probabilities);
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
    let all_cols: Vec<usize> = (0..replayed.n_features).collect();
    let Examples { rows, labels, n_features: n, .. } =
        remaining_examples(replayed, eval_idx, &all_cols, config, |i| replayed.full_label[i]);
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
                lifetime_model::metrics::Confusion::from_pairs(pairs.collect::<Vec<_>>()).f1()
            })
            .collect();
        curves.push(RepredictionCurve { threshold_s: threshold, positives, vms: completed.len(), f1_by_quantile });
    }
    RemainingReport { examples: labels.len(), mae_log10: mae, curves }
}

/// Exit-time quality of the predicted lifetime (remaining lifetime at uptime 0, capped as served)
/// over the held-out VMs, with their full labels.
fn evaluate_exit_time(
    replayed: &ReplayedTrace,
    eval_idx: &[usize],
    model: &TreeEnsemble,
    config: &TrainConfig,
) -> ExitTimeReport {
    let max_log10 = config.remaining_cap_s.log10();
    let mut row = Vec::with_capacity(replayed.n_features + 1);
    let mut predicted = Vec::with_capacity(eval_idx.len());
    let mut observed = Vec::with_capacity(eval_idx.len());
    let mut completed = Vec::with_capacity(eval_idx.len());
    for &i in eval_idx {
        row.clear();
        row.extend_from_slice(replayed.row(i));
        row.push(encode_uptime(0.0));
        predicted.push(model.predict(&row).clamp(0.0, max_log10));
        let label = replayed.full_label[i];
        observed.push(label.seconds);
        completed.push(!label.censored);
    }
    exit_time_report(&predicted, &observed, &completed, config.long_threshold_s)
}

/// [`ExitTimeReport`] of predicted log10 lifetimes against observed lifetimes in seconds.
fn exit_time_report(predicted_log10: &[f64], observed: &[f64], completed: &[bool], threshold_s: f64) -> ExitTimeReport {
    let long: Vec<usize> = (0..observed.len()).filter(|&i| observed[i] >= threshold_s).collect();
    let pick = |values: &[f64]| long.iter().map(|&i| values[i]).collect::<Vec<_>>();
    let long_completed: Vec<bool> = long.iter().map(|&i| completed[i]).collect();
    let errors: Vec<f64> = long
        .iter()
        .filter(|&&i| completed[i])
        .map(|&i| (predicted_log10[i] - observed[i].max(1.0).log10()).abs())
        .collect();
    ExitTimeReport {
        vms: observed.len(),
        c_index: harrell_c(predicted_log10, observed, completed),
        long_vms: long.len(),
        c_index_long: harrell_c(&pick(predicted_log10), &pick(observed), &long_completed),
        completed_long_vms: errors.len(),
        mae_log10_long: if errors.is_empty() { f64::NAN } else { errors.iter().sum::<f64>() / errors.len() as f64 },
    }
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
mod tests {
    use super::*;
    use domain::Priority;
    use lifetime_model::features::{FeatureKind, OTHER};
    use traces::record::ExtraColumns;

    fn vm(vm_type: &str, start_s: f64, end_s: Option<f64>) -> VmRecord {
        VmRecord {
            vm_id: format!("{vm_type}-{start_s}"),
            tenant_id: "t".to_owned(),
            vm_type: vm_type.to_owned(),
            cores: 2.0,
            memory_gib: 8.0,
            priority: Priority::Regular,
            start_s,
            end_s,
            extra: ExtraColumns::default(),
        }
    }

    fn vm_type_codes(schema: &FeatureSchema) -> Vec<String> {
        let spec = schema.features.iter().find(|f| f.name == "vm_type").expect("a vm_type feature");
        let FeatureKind::Categorical { codes, .. } = &spec.kind else { panic!("vm_type is categorical") };
        codes.iter().map(|(c, _)| c.clone()).collect()
    }

    #[test]
    fn the_validation_split_censors_the_fit_part_at_the_validation_start() {
        let (valid_from, cutoff) = (10_000.0, 20_000.0);
        let mut training = Vec::new();
        for k in 0..20 {
            let start = f64::from(k) * 100.0;
            // Ends after the validation start (known only later), ends before it, never ends.
            training.push(vm("a", start, Some(valid_from + 5_000.0)));
            training.push(vm("b", start + 1.0, Some(start + 60.0)));
            training.push(vm("c", start + 2.0, None));
        }
        for k in 0..20 {
            let start = valid_from + f64::from(k) * 100.0;
            // "late" exists only in the validation part; its VMs end after the cut-off.
            training.push(vm("late", start, Some(cutoff + 50_000.0)));
            training.push(vm("b", start + 1.0, Some(start + 60.0)));
        }
        training.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
        let config = TrainConfig::default();
        let split = ValidationSplit::new(&training, valid_from, cutoff, &config);
        let r = &split.replayed;
        assert_eq!((split.fit.len(), split.valid.len()), (60, 40));
        for &i in &split.fit {
            assert!(r.start_s[i] < valid_from);
            let label = r.train_label[i];
            // Nothing that happens from the validation start on is known to the fit part.
            assert!(r.start_s[i] + label.seconds <= valid_from);
            if label.censored {
                assert_eq!(label.seconds, valid_from - r.start_s[i]);
            }
        }
        let a = split.fit.iter().find(|&&i| r.start_s[i] == 0.0).copied().expect("the first VM");
        assert_eq!(r.train_label[a], ObservedLifetime { seconds: valid_from, censored: true });
        for &i in &split.valid {
            assert!(r.start_s[i] >= valid_from && r.start_s[i] < cutoff);
            let label = r.full_label[i];
            assert!(r.start_s[i] + label.seconds <= cutoff, "validation labels stop at the cut-off");
        }
        // Categories are ranked on the fit part: the validation-only type is "other".
        let codes = vm_type_codes(&split.schema);
        assert!(!codes.contains(&"late".to_owned()) && codes.contains(&OTHER.to_owned()), "{codes:?}");
        // Each model's examples: fit labels from the censored view, validation from the cut-off.
        let cols = split.schema.kept_indices(&[]);
        let (fit, valid) = split.examples(Model::Binary, &cols, &config);
        // a: censored after >= 2 h, long; b: short; c: censored >= 2 h before the validation start.
        assert_eq!(fit.labels.len(), 60);
        assert_eq!(valid.labels.len(), 40);
        assert_eq!(valid.labels.iter().filter(|&&y| y > 0.5).count(), 20);
    }

    fn candidate(dropped: &[FeatureGroup], features: usize, auc: f64) -> FeatureCandidate {
        FeatureCandidate { dropped: dropped.to_vec(), features, auc, best_iteration: 10 }
    }

    #[test]
    fn the_smallest_feature_set_within_the_tie_wins() {
        use FeatureGroup::{Tenant, Weekday};
        let all = candidate(&[], 15, 0.800);
        let no_weekday = candidate(&[Weekday], 14, 0.830);
        let no_tenant = candidate(&[Tenant], 8, 0.8285);
        let neither = candidate(&[Weekday, Tenant], 7, 0.8100);
        assert_eq!(choose_candidate(&[all.clone(), no_weekday.clone(), no_tenant.clone(), neither.clone()]), 2);
        // Beyond the tie, the better AUC wins even with more features.
        let no_tenant_worse = candidate(&[Tenant], 8, 0.8270);
        assert_eq!(choose_candidate(&[all.clone(), no_weekday, no_tenant_worse, neither]), 1);
        // Without any AUC (a validation split with one class), nothing is dropped.
        let unknown = [candidate(&[], 15, f64::NAN), candidate(&[Weekday], 14, f64::NAN)];
        assert_eq!(choose_candidate(&unknown), 0);
    }

    #[test]
    fn candidates_skip_groups_the_schema_lacks() {
        let mut builder = SchemaBuilder::new(DAY, 2.0 * HOUR);
        let with_tenant = RequestFeatures { tenant_id: "t".into(), vm_type: "a".into(), ..RequestFeatures::default() };
        builder.observe(&with_tenant, Some(2.0));
        let schema = builder.build();
        assert_eq!(candidates(&schema, &FeatureChoice::Auto).len(), 8);
        let no_tenant = schema.without(&[FeatureGroup::Tenant, FeatureGroup::Job]);
        assert_eq!(
            candidates(&no_tenant, &FeatureChoice::Auto),
            [vec![], vec![FeatureGroup::Weekday]],
            "an absent group is never a candidate to drop"
        );
        let forced = FeatureChoice::Drop(vec![FeatureGroup::Tenant, FeatureGroup::Weekday, FeatureGroup::Tenant]);
        assert_eq!(candidates(&schema, &forced), [vec![FeatureGroup::Weekday, FeatureGroup::Tenant]]);
    }

    #[test]
    fn validation_metrics_of_raw_scores() {
        // Multiclass log loss: uniform scores over 4 classes cost ln 4 whatever the label.
        let labelled = |labels: &[f32]| Examples { labels: labels.to_vec(), ..Examples::new(1) };
        let loss = Model::Multiclass.value(&[0.0; 8], &labelled(&[1.0, 3.0]), 4);
        assert!((loss - 4f64.ln()).abs() < 1e-12);
        assert_eq!(Model::Remaining.value(&[1.0, 3.0], &labelled(&[2.0, 2.0]), 1), 1.0);
        assert_eq!(Model::Binary.value(&[0.2, -1.0, 3.0], &labelled(&[0.0, 0.0, 1.0]), 1), 1.0);
        // Weighted: the second example counts three times.
        let weighted = Examples { weights: vec![1.0, 3.0], ..labelled(&[2.0, 2.0]) };
        assert_eq!(Model::Remaining.value(&[1.0, 4.0], &weighted, 1), (1.0 + 3.0 * 4.0) / 4.0);
        assert!(Model::Binary.better(0.8, 0.7) && Model::Remaining.better(0.7, 0.8));
        assert!(Model::Binary.better(0.5, f64::NAN) && !Model::Binary.better(f64::NAN, 0.5));
    }

    #[test]
    fn hazard_rows_follow_each_vm_until_it_ends_or_is_censored() {
        let records = vec![
            vm("a", 0.0, Some(250.0)),   // ends in interval 2 ([200, 400))
            vm("b", 1.0, None),          // still running at the cut-off: censored after 299 s, in interval 2
            vm("c", 2.0, Some(5_000.0)), // outlives every edge
        ];
        let config = TrainConfig { survival_edges_s: vec![100.0, 200.0, 400.0], ..TrainConfig::default() };
        let schema = build_schema(&records, 300.0, &config);
        let replayed = replay(&records, &schema.encoder(), 300.0, 10_000.0, 300.0);
        let cols: Vec<usize> = (0..replayed.n_features).collect();
        let idx: Vec<usize> = (0..replayed.len()).collect();
        let full = hazard_examples(&replayed, &idx, &cols, &config, |i| replayed.full_label[i]);
        let interval = |e: &Examples, k: usize| e.row(k)[cols.len()];
        // a: survived 0 and 1, ended in 2; b (full data: never ends, censored at 9999 s): 3 survivals;
        // c: 3 survivals, and nothing past the last edge.
        assert_eq!(full.labels, [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!(
            (0..9).map(|k| interval(&full, k)).collect::<Vec<_>>(),
            [0.0, 1.0, 2.0, 0.0, 1.0, 2.0, 0.0, 1.0, 2.0]
        );
        // As the training side sees it at 300 s: a ended (250 s); b and c are censored after about
        // 300 s: they count as alive through intervals 0 and 1, and say nothing of interval 2.
        let train = hazard_examples(&replayed, &idx, &cols, &config, |i| replayed.train_label[i]);
        assert_eq!(train.labels, [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn crowded_intervals_are_sampled_and_weighted_and_sparse_ones_kept_whole() {
        // 2,000 VMs: all at risk in interval 0, half of them (those ending after 150 s) in 1.
        let records: Vec<VmRecord> =
            (0..2_000).map(|i| vm("D", f64::from(i), Some(f64::from(i) + 50.0 + f64::from(i % 2) * 200.0))).collect();
        let config = TrainConfig {
            survival_edges_s: vec![100.0, 200.0, 400.0],
            max_hazard_rows_per_interval: 500,
            ..TrainConfig::default()
        };
        let schema = build_schema(&records, 10_000.0, &config);
        let replayed = replay(&records, &schema.encoder(), 10_000.0, 10_000.0, 10_000.0);
        let cols: Vec<usize> = (0..replayed.n_features).collect();
        let idx: Vec<usize> = (0..replayed.len()).collect();
        let sampled = hazard_examples(&replayed, &idx, &cols, &config, |i| replayed.full_label[i]);
        let interval_input = cols.len();
        let sampled = &sampled;
        let in_interval =
            |j: usize| (0..sampled.labels.len()).filter(move |&k| sampled.row(k)[interval_input] == j as f64);
        // Interval 0: 2,000 at risk, rate 1/4; interval 1: 1,000 at risk, rate 1/2; interval 2: 1,000 at risk.
        for (j, at_risk) in [(0, 2_000.0), (1, 1_000.0), (2, 1_000.0)] {
            let kept = in_interval(j).count() as f64;
            let weight = sampled.weight(in_interval(j).next().unwrap());
            assert!((weight - at_risk / 500.0).abs() < 1e-6, "interval {j}: weight {weight}");
            assert!((kept * weight - at_risk).abs() < 0.15 * at_risk, "interval {j}: {kept} rows of weight {weight}");
        }
        // The weighted event rate of each interval is the full data's (half of the VMs end in 0, all
        // the rest in 2), within the sampling's noise.
        let rate = |j: usize| {
            let (events, total) = in_interval(j).fold((0.0, 0.0), |(e, t), k| {
                (e + sampled.weight(k) * f64::from(sampled.labels[k]), t + sampled.weight(k))
            });
            events / total
        };
        assert!(
            (rate(0) - 0.5).abs() < 0.06 && rate(1) == 0.0 && rate(2) == 1.0,
            "{} {} {}",
            rate(0),
            rate(1),
            rate(2)
        );
        // Without a cap in the way, every row is kept with weight 1.
        let whole = hazard_examples(
            &replayed,
            &idx,
            &cols,
            &TrainConfig { max_hazard_rows_per_interval: 10_000, ..config },
            |i| replayed.full_label[i],
        );
        assert_eq!(whole.labels.len(), 2_000 + 1_000 + 1_000);
        assert!(whole.weights.iter().all(|&w| w == 1.0));
    }

    #[test]
    fn auto_serves_the_reading_that_ranks_the_long_lived_exits_best() {
        let candidate = |k: usize, request: f64, threshold: f64| ReadingCandidate {
            reading: READING_CANDIDATES[k].to_string(),
            long_vms: 10,
            c_long_at_request: request,
            c_long_at_threshold: threshold,
        };
        // The mean of the two columns decides: the third candidate's 0.65 beats the second's 0.6.
        let readings =
            [candidate(0, 0.5, 0.5), candidate(1, 0.55, 0.65), candidate(2, 0.6, 0.7), candidate(3, f64::NAN, 0.9)];
        assert_eq!(best_ranked_reading(&readings), READING_CANDIDATES[2]);
        assert_eq!(best_ranked_reading(&[]), LifetimeReading::default(), "nothing measured: the median");
        assert_eq!("auto".parse::<ServedReading>(), Ok(ServedReading::BestRanked));
        assert_eq!("geomean".parse::<ServedReading>(), Ok(ServedReading::Fixed(LifetimeReading::GeometricMean)));
        assert!("mode".parse::<ServedReading>().unwrap_err().contains("or auto"));
    }

    #[test]
    fn exit_time_report_by_hand() {
        let hour = HOUR;
        // Lifetimes 1 h, 3 h, 5 h (censored), 10 h; predicted log10 lifetimes.
        let observed = [hour, 3.0 * hour, 5.0 * hour, 10.0 * hour];
        let completed = [true, true, false, true];
        let predicted = [(2.0 * hour).log10(), (3.0 * hour).log10(), (20.0 * hour).log10(), (4.0 * hour).log10()];
        let report = exit_time_report(&predicted, &observed, &completed, 2.0 * hour);
        assert_eq!(report.vms, 4);
        // All: comparable pairs (1,3) (1,5) (1,10) (3,5) (3,10) = 5, all concordant.
        assert_eq!(report.c_index, 1.0);
        // Long (>= 2 h): 3 h, 5 h (censored), 10 h: pairs (3,5) (3,10), concordant.
        assert_eq!((report.long_vms, report.c_index_long), (3, 1.0));
        // Completed long: 3 h (exact) and 10 h (predicted 4 h).
        assert_eq!(report.completed_long_vms, 2);
        assert!((report.mae_log10_long - (10f64 / 4.0).log10() / 2.0).abs() < 1e-12);
    }
}
