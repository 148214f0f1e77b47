//! Where each VM's lifetime prediction comes from (SPEC section 7).
//!
//! Predictions do not depend on where VMs are placed, so every VM's initial prediction is computed
//! once, before the run, in start order ([`predict`]):
//!
//! - **oracle**: the true lifetime from placement ([`Workload::lifetime_s`]).
//! - **binned oracle**: what the trace itself records of each lifetime and no more: the middle of
//!   the lifetime's bin (the Azure V1 bins by default: 5 minutes up to 1 hour, hourly up to 1 day,
//!   daily up to 20 days). The Azure V1 trace records only these bins, and its lifetimes were drawn
//!   uniformly inside them when it was converted, so the exact oracle also knows where each draw
//!   fell, which no predictor can. This source is the best any predictor can do on such a trace.
//!   VMs still running at the trace's end keep the oracle's common far exit.
//! - **noisy precision/recall** (paper 003 B.6 and C.1, "randomly making mistakes at a rate
//!   consistent with the model"): on the long class (lifetime >= the policy's `long_threshold_s`),
//!   exactly round(recall x long) long VMs are predicted long, and as many short VMs as make the
//!   precision the target; both drawn at random. A VM predicted in its true class keeps its true
//!   lifetime; one predicted in the other class takes the true lifetime of a random VM of that class
//!   (so the lifetime it carries agrees with its class for every policy).
//! - **noisy accuracy** (paper 002 G.1): each VM is "correct" with probability `accuracy`; its
//!   log10 lifetime gets Gaussian noise of sigma 0.001 if correct, 3 otherwise, and the result is
//!   capped to [1 s, 14 days].
//! - **model**: the trained bundle in process, with an online tenant history so that each prediction
//!   sees only the trace's past (the trainer's replay, `lifetime_model::dataset`): before a VM's
//!   row is encoded, every VM of the trace that ended by its start is recorded. The history starts
//!   empty, or with `bundle_history` from the bundle's feature store, as the inference server's
//!   live history does (for a trace that follows the bundle's training period). The interval class
//!   is predicted for LA-multiclass only (it is the costly model). The bundle's remaining-lifetime
//!   model also repredicts for NILAS and LAVA ([`Predictions::repredictor`]); with the other
//!   sources the allocator repredicts "initial prediction minus age" by itself.
//! - **hybrid**: each part of a prediction from the oracle or from the model, to measure what each
//!   part of the model's error costs: the class (P(long) and the binary class), the exit (the
//!   lifetime read at request time) and the repredictions of running VMs (an oracle repredictor
//!   answers the true remaining lifetime). Oracle class with model exits, model class with oracle
//!   exits, model at request time with oracle repredictions, and the reverse, are rows of
//!   `configs/experiments/survival-test.toml`.
//! - **none**: no prediction (every VM is short-lived to the policies).
//!
//! Then `fallback_fraction` of the VMs, drawn at random, get the short-lived fallback the control
//! service uses when the model does not answer, with its source (experiment 5).
//!
//! Every draw comes from ChaCha generators seeded by the run's seed (one stream per purpose), so a
//! run is reproducible.

use crate::workload::{Workload, CENSORED_LIFETIME_S};
use domain::{LifetimeClass, LifetimePrediction, PredictionSource, VmId};
use lifetime_model::curve_cache::CurveCache;
use lifetime_model::history::{FeatureStore, Histories};
use lifetime_model::survival::LifetimeReading;
use lifetime_model::{LifetimeModel, RequestFeatures};
use placement::reprediction::{BundleRepredictor, Repredictor};
use placement::{Policy, PolicyConfig};
use rand::seq::index::sample;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Generator streams of the run's seed, one per purpose (the allocator's tie-breaking uses the
/// seed itself).
const STREAM_NOISE: u64 = 1;
const STREAM_FALLBACK: u64 = 2;

/// Gaussian noise of paper 002 G.1, in log10 seconds.
const SIGMA_CORRECT: f64 = 0.001;
const SIGMA_WRONG: f64 = 3.0;

#[derive(Debug, thiserror::Error)]
pub enum PredictError {
    #[error("{field}: {message}")]
    Invalid { field: &'static str, message: String },
    #[error(
        "precision {precision} at recall {recall} needs {needed} short-lived VMs predicted long, but the workload \
         has only {available} short-lived VMs ({long} long): raise the precision or lower the recall"
    )]
    Unreachable { precision: f64, recall: f64, needed: usize, available: usize, long: usize },
    #[error("loading the model bundle {}: {source}", path.display())]
    Bundle {
        path: PathBuf,
        #[source]
        source: lifetime_model::BundleError,
    },
    #[error(
        "the policy reads the model's interval classes as its own (LA-multiclass), but the bundle's cut-offs \
         {bundle:?} differ from the policy's {policy:?}: set policy.class_cutoffs_s to the bundle's"
    )]
    CutoffMismatch { bundle: Vec<f64>, policy: Vec<f64> },
}

fn invalid(field: &'static str, message: impl Into<String>) -> PredictError {
    PredictError::Invalid { field, message: message.into() }
}

/// Which predictor.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum PredictionSourceConfig {
    #[default]
    Oracle,
    NoisyPrecisionRecall {
        precision: f64,
        recall: f64,
    },
    NoisyAccuracy {
        accuracy: f64,
    },
    Model {
        bundle: PathBuf,
        /// What the policies read of the bundle's lifetime distribution (its survival model), instead
        /// of the bundle's own default; ignored by a bundle without one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reading: Option<LifetimeReading>,
    },
    /// Each part from the oracle or the model ([`PredictionPart`]).
    Hybrid {
        bundle: PathBuf,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reading: Option<LifetimeReading>,
        /// P(long) and the binary class.
        class: PredictionPart,
        /// The lifetime read at request time (the arriving VM's exit).
        exit: PredictionPart,
        /// The remaining lifetime of running VMs (their hosts' exit times, for NILAS and LAVA).
        reprediction: PredictionPart,
    },
    /// The oracle at the trace's recorded resolution: each completed VM's lifetime is read as the
    /// middle of its bin. `edges_s`: the bins' increasing inner edges in seconds (the last bin is
    /// open); empty: [`azure_v1_bin_edges_s`].
    BinnedOracle {
        #[serde(default)]
        edges_s: Vec<f64>,
    },
    None,
}

impl PredictionSourceConfig {
    /// A source as a short text: `oracle`, `binned-oracle`, `none`, `model` (the bundle in
    /// `models/default`), `model:BUNDLE_DIR`, `accuracy:A` (paper 002 G.1), `pr:PRECISION,RECALL`
    /// (paper 003 B.6, on the long class). The error starts with the text or its form, so a caller
    /// can put its own flag or field name in front.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (kind, value) = text.split_once(':').map_or((text, None), |(k, v)| (k, Some(v)));
        let number = |v: &str, what: &str| -> Result<f64, String> {
            v.trim().parse::<f64>().map_err(|_| format!("{text}: {what} `{v}` is not a number"))
        };
        Ok(match (kind, value) {
            ("oracle", None) => PredictionSourceConfig::Oracle,
            ("binned-oracle", None) => PredictionSourceConfig::BinnedOracle { edges_s: Vec::new() },
            ("none", None) => PredictionSourceConfig::None,
            ("model", None) => PredictionSourceConfig::Model { bundle: PathBuf::from("models/default"), reading: None },
            ("model", Some(dir)) => PredictionSourceConfig::Model { bundle: PathBuf::from(dir), reading: None },
            ("accuracy", Some(a)) => {
                let accuracy = number(a, "the accuracy")?;
                if !(0.0..=1.0).contains(&accuracy) {
                    return Err(format!("accuracy:A needs A in [0, 1], got {accuracy}"));
                }
                PredictionSourceConfig::NoisyAccuracy { accuracy }
            }
            ("pr", Some(pr)) => {
                let Some((p, r)) = pr.split_once(',') else {
                    return Err(format!("pr:PRECISION,RECALL, e.g. pr:0.9,0.8; got `{text}`"));
                };
                let (precision, recall) = (number(p, "the precision")?, number(r, "the recall")?);
                for (what, v) in [("precision", precision), ("recall", recall)] {
                    if !(v > 0.0 && v <= 1.0) {
                        return Err(format!("pr:PRECISION,RECALL needs the {what} in (0, 1], got {v}"));
                    }
                }
                PredictionSourceConfig::NoisyPrecisionRecall { precision, recall }
            }
            _ => {
                return Err(format!(
                    "`{text}` is not a source: use oracle, binned-oracle, none, model, model:BUNDLE_DIR, accuracy:0.9 or pr:0.9,0.8"
                ))
            }
        })
    }
}

/// Where one part of a hybrid prediction comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PredictionPart {
    Oracle,
    Model,
}

impl PredictionPart {
    fn letter(self) -> char {
        match self {
            PredictionPart::Oracle => 'O',
            PredictionPart::Model => 'M',
        }
    }
}

/// The inner edges of the Azure V1 trace's lifetime bins, in seconds: every 5 minutes up to 1
/// hour, every hour up to 1 day, every day up to 20 days.
pub fn azure_v1_bin_edges_s() -> Vec<f64> {
    let five_minutes = (1..=12).map(|k| f64::from(k) * 300.0);
    let hours = (2..=24).map(|k| f64::from(k) * 3_600.0);
    let days = (2..=20).map(|k| f64::from(k) * 86_400.0);
    five_minutes.chain(hours).chain(days).collect()
}

/// The middle of the bin of `lifetime_s` among `edges_s` (increasing inner edges; the first bin
/// starts at 0, the last one is open and read as its lower edge).
fn bin_middle_s(lifetime_s: f64, edges_s: &[f64]) -> f64 {
    let upper = edges_s.partition_point(|&edge| edge <= lifetime_s);
    let lower_edge = if upper == 0 { 0.0 } else { edges_s[upper - 1] };
    match edges_s.get(upper) {
        Some(&upper_edge) => (lower_edge + upper_edge) / 2.0,
        None => lower_edge,
    }
}

/// Predictions of a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PredictionConfig {
    pub source: PredictionSourceConfig,
    /// Share of VMs, drawn at random, whose prediction is replaced by the short-lived fallback.
    pub fallback_fraction: f64,
    /// With the model: the tenants' history starts from the bundle's feature store (as the
    /// inference server's live history does) rather than empty, so that a replay of what followed
    /// the training period predicts as the services did (the OpenStack plug-in's parity check).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub bundle_history: bool,
    /// The fallback's source (a fallback one: `fallback_timeout`, `fallback_error`,
    /// `fallback_unavailable` or `safeguard`).
    pub fallback_source: PredictionSource,
}

impl Default for PredictionConfig {
    fn default() -> Self {
        PredictionConfig {
            source: PredictionSourceConfig::Oracle,
            fallback_fraction: 0.0,
            bundle_history: false,
            fallback_source: PredictionSource::FallbackTimeout,
        }
    }
}

impl PredictionConfig {
    pub fn validate(&self) -> Result<(), PredictError> {
        match self.source {
            PredictionSourceConfig::NoisyPrecisionRecall { precision, recall } => {
                if !(precision > 0.0 && precision <= 1.0) {
                    return Err(invalid("prediction.source.precision", format!("must be in (0, 1], got {precision}")));
                }
                if !(recall > 0.0 && recall <= 1.0) {
                    return Err(invalid("prediction.source.recall", format!("must be in (0, 1], got {recall}")));
                }
            }
            PredictionSourceConfig::Model { reading: Some(reading), .. }
            | PredictionSourceConfig::Hybrid { reading: Some(reading), .. } => {
                reading.check().map_err(|message| invalid("prediction.source.reading", message))?;
            }
            PredictionSourceConfig::NoisyAccuracy { accuracy } if !(0.0..=1.0).contains(&accuracy) => {
                return Err(invalid("prediction.source.accuracy", format!("must be in [0, 1], got {accuracy}")));
            }
            PredictionSourceConfig::BinnedOracle { ref edges_s }
                if !edges_s.windows(2).all(|pair| pair[0] < pair[1])
                    || edges_s.iter().any(|edge| !(edge.is_finite() && *edge > 0.0)) =>
            {
                return Err(invalid("prediction.source.edges_s", "must be positive, finite and increasing"));
            }
            _ => {}
        }
        if !(0.0..=1.0).contains(&self.fallback_fraction) {
            return Err(invalid(
                "prediction.fallback_fraction",
                format!("must be in [0, 1], got {}", self.fallback_fraction),
            ));
        }
        if !self.fallback_source.is_fallback() {
            return Err(invalid(
                "prediction.fallback_source",
                "must be a fallback source: fallback_timeout, fallback_error, fallback_unavailable or safeguard",
            ));
        }
        Ok(())
    }

    /// A short name for tables: `oracle`, `pr:0.9,0.8`, `accuracy:0.9`, `model`, `none`.
    pub fn label(&self) -> String {
        let base = match &self.source {
            PredictionSourceConfig::Oracle => "oracle".to_owned(),
            PredictionSourceConfig::NoisyPrecisionRecall { precision, recall } => format!("pr:{precision},{recall}"),
            PredictionSourceConfig::NoisyAccuracy { accuracy } => format!("accuracy:{accuracy}"),
            PredictionSourceConfig::Model { reading: None, .. } => "model".to_owned(),
            PredictionSourceConfig::Model { reading: Some(reading), .. } => format!("model:{reading}"),
            PredictionSourceConfig::Hybrid { class, exit, reprediction, .. } => {
                format!("hybrid:class{}-exit{}-repredict{}", class.letter(), exit.letter(), reprediction.letter())
            }
            PredictionSourceConfig::BinnedOracle { .. } => "binned-oracle".to_owned(),
            PredictionSourceConfig::None => "none".to_owned(),
        };
        if self.fallback_fraction > 0.0 {
            format!("{base}+fallback:{}", self.fallback_fraction)
        } else {
            base
        }
    }
}

/// What the predictions amounted to, against the true lifetimes (long = at least the policy's
/// `long_threshold_s`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PredictionReport {
    pub source: String,
    pub vms: usize,
    /// VMs truly long-lived.
    pub true_long: usize,
    /// VMs the allocator places as long-lived (fallbacks and no prediction are short).
    pub predicted_long: usize,
    /// Of the long-lived predictions, the truly long share (NaN-free: 0 when none is long).
    pub precision_long: f64,
    /// Of the truly long VMs, the share predicted long.
    pub recall_long: f64,
    /// VMs whose binary class is right.
    pub accuracy: f64,
    pub fallbacks: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_version: Option<String>,
    /// Wall time spent computing the predictions.
    pub wall_s: f64,
}

/// Every VM's initial prediction, in workload order.
pub struct Predictions {
    pub per_vm: Vec<Option<LifetimePrediction>>,
    /// The bundle's remaining-lifetime model, for NILAS and LAVA (`model` source only).
    pub repredictor: Option<Arc<dyn Repredictor>>,
    pub report: PredictionReport,
}

/// A generator for one purpose, from the run's seed.
fn stream(seed: u64, stream: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    rng
}

/// A prediction standing for a known lifetime (oracle and noisy sources).
fn of_lifetime(lifetime_s: f64, long: bool, source: PredictionSource) -> LifetimePrediction {
    LifetimePrediction {
        p_long: if long { 1.0 } else { 0.0 },
        class: if long { LifetimeClass::Long } else { LifetimeClass::Short },
        interval_class: None,
        expected_lifetime_s: Some(lifetime_s),
        model_version: None,
        source,
    }
}

/// Computes the predictions of `workload` under `config`, for a run of `policy` (built as `built`)
/// seeded with `seed`.
pub fn predict(
    workload: &Workload,
    config: &PredictionConfig,
    policy: &PolicyConfig,
    built: &Policy,
    seed: u64,
) -> Result<Predictions, PredictError> {
    config.validate()?;
    let started = Instant::now();
    let threshold = policy.long_threshold_s;
    let lifetimes: Vec<f64> = workload.vms.iter().map(|vm| workload.lifetime_s(vm)).collect();
    let mut rng = stream(seed, STREAM_NOISE);
    let mut repredictor: Option<Arc<dyn Repredictor>> = None;
    let mut model_version = None;
    let mut per_vm: Vec<Option<LifetimePrediction>> = match &config.source {
        PredictionSourceConfig::None => vec![None; lifetimes.len()],
        PredictionSourceConfig::Oracle => {
            lifetimes.iter().map(|&l| Some(of_lifetime(l, l >= threshold, PredictionSource::Oracle))).collect()
        }
        PredictionSourceConfig::BinnedOracle { edges_s } => {
            let default_edges;
            let edges_s = if edges_s.is_empty() {
                default_edges = azure_v1_bin_edges_s();
                &default_edges
            } else {
                edges_s
            };
            workload
                .vms
                .iter()
                .zip(&lifetimes)
                .map(|(vm, &lifetime)| {
                    // A censored VM's lifetime is the oracle's common far exit, not a record.
                    let read = if vm.end_s.is_some() { bin_middle_s(lifetime, edges_s) } else { lifetime };
                    Some(of_lifetime(read, read >= threshold, PredictionSource::Oracle))
                })
                .collect()
        }
        PredictionSourceConfig::NoisyPrecisionRecall { precision, recall } => {
            noisy_precision_recall(&lifetimes, threshold, *precision, *recall, &mut rng)?
        }
        PredictionSourceConfig::NoisyAccuracy { accuracy } => {
            noisy_accuracy(&lifetimes, threshold, *accuracy, &mut rng)
        }
        PredictionSourceConfig::Model { bundle, reading } => {
            let model = load_model(bundle, *reading)?;
            // Only a policy that reads interval classes as its own classes needs the model's.
            let with_interval = built.reads_interval_classes();
            if with_interval {
                let policy_cutoffs = built.classes().cutoffs_s().to_vec();
                if model.manifest().class_cutoffs_s != policy_cutoffs {
                    return Err(PredictError::CutoffMismatch {
                        bundle: model.manifest().class_cutoffs_s.clone(),
                        policy: policy_cutoffs,
                    });
                }
            }
            model_version = Some(model.version().to_owned());
            let predictions = model_predictions(workload, &model, with_interval, config.bundle_history);
            repredictor = Some(Arc::new(BundleRepredictor(model)));
            predictions
        }
        PredictionSourceConfig::Hybrid { bundle, reading, class, exit, reprediction } => {
            let model = load_model(bundle, *reading)?;
            model_version = Some(model.version().to_owned());
            let from_model = model_predictions(workload, &model, false, config.bundle_history);
            repredictor = Some(match reprediction {
                PredictionPart::Model => Arc::new(BundleRepredictor(model)),
                PredictionPart::Oracle => Arc::new(OracleRepredictor::new(workload, &lifetimes)),
            });
            from_model
                .into_iter()
                .zip(&lifetimes)
                .map(|(model, &lifetime)| {
                    let model = model.unwrap_or_else(|| unreachable!("the model predicts every VM"));
                    let oracle = of_lifetime(lifetime, lifetime >= threshold, PredictionSource::Oracle);
                    let (classed, exited) = (
                        if *class == PredictionPart::Oracle { &oracle } else { &model },
                        if *exit == PredictionPart::Oracle { &oracle } else { &model },
                    );
                    Some(LifetimePrediction {
                        p_long: classed.p_long,
                        class: classed.class,
                        expected_lifetime_s: exited.expected_lifetime_s,
                        ..model.clone()
                    })
                })
                .collect()
        }
    };
    let fallbacks = (config.fallback_fraction * per_vm.len() as f64).round() as usize;
    if fallbacks > 0 {
        let mut rng = stream(seed, STREAM_FALLBACK);
        for i in sample(&mut rng, per_vm.len(), fallbacks.min(per_vm.len())) {
            per_vm[i] = Some(LifetimePrediction::fallback(config.fallback_source));
        }
    }
    let mut report = score(&per_vm, &lifetimes, threshold);
    report.source = config.label();
    report.fallbacks = fallbacks;
    report.model_version = model_version;
    report.wall_s = started.elapsed().as_secs_f64();
    Ok(Predictions { per_vm, repredictor, report })
}

fn load_model(bundle: &PathBuf, reading: Option<LifetimeReading>) -> Result<Arc<LifetimeModel>, PredictError> {
    let mut model =
        LifetimeModel::load(bundle).map_err(|source| PredictError::Bundle { path: bundle.clone(), source })?;
    if let Some(reading) = reading {
        model = model.with_reading(reading);
    }
    Ok(Arc::new(model))
}

/// Every VM's true remaining lifetime, as a repredictor (the consolidation's `oracle` chooser).
pub fn oracle_lifetimes(workload: &Workload) -> Arc<dyn Repredictor> {
    let lifetimes: Vec<f64> = workload.vms.iter().map(|vm| workload.lifetime_s(vm)).collect();
    Arc::new(OracleRepredictor::new(workload, &lifetimes))
}

/// Repredicts every VM's true remaining lifetime (the oracle part of a hybrid source).
#[derive(Debug)]
struct OracleRepredictor {
    lifetimes: HashMap<VmId, f64>,
}

impl OracleRepredictor {
    fn new(workload: &Workload, lifetimes: &[f64]) -> Self {
        OracleRepredictor {
            lifetimes: workload.vms.iter().zip(lifetimes).map(|(vm, &l)| (vm.request.vm_id.clone(), l)).collect(),
        }
    }
}

impl Repredictor for OracleRepredictor {
    fn version(&self) -> &str {
        "oracle"
    }
    fn encode(&self, id: &VmId, _features: &RequestFeatures) -> Vec<f64> {
        vec![self.lifetimes.get(id).copied().unwrap_or(0.0)]
    }
    fn remaining_s(&self, row: &[f64], uptime_s: f64) -> f64 {
        (row[0] - uptime_s).max(0.0)
    }
}

fn noisy_precision_recall(
    lifetimes: &[f64],
    threshold: f64,
    precision: f64,
    recall: f64,
    rng: &mut ChaCha8Rng,
) -> Result<Vec<Option<LifetimePrediction>>, PredictError> {
    let long: Vec<usize> = (0..lifetimes.len()).filter(|&i| lifetimes[i] >= threshold).collect();
    let short: Vec<usize> = (0..lifetimes.len()).filter(|&i| lifetimes[i] < threshold).collect();
    let true_positives = (recall * long.len() as f64).round() as usize;
    let predicted_long = (true_positives as f64 / precision).round() as usize;
    let false_positives = predicted_long.saturating_sub(true_positives);
    if false_positives > short.len() {
        return Err(PredictError::Unreachable {
            precision,
            recall,
            needed: false_positives,
            available: short.len(),
            long: long.len(),
        });
    }
    let mut says_long = vec![false; lifetimes.len()];
    for i in sample(rng, long.len(), true_positives) {
        says_long[long[i]] = true;
    }
    for i in sample(rng, short.len(), false_positives) {
        says_long[short[i]] = true;
    }
    Ok((0..lifetimes.len())
        .map(|i| {
            let truly_long = lifetimes[i] >= threshold;
            let lifetime = if says_long[i] == truly_long {
                lifetimes[i]
            } else {
                // A lifetime of the predicted class: that of a random VM of it.
                let pool = if says_long[i] { &long } else { &short };
                match pool.len() {
                    0 if says_long[i] => CENSORED_LIFETIME_S,
                    0 => threshold / 2.0,
                    n => lifetimes[pool[rng.random_range(0..n)]],
                }
            };
            Some(of_lifetime(lifetime, says_long[i], PredictionSource::NoisyOracle))
        })
        .collect())
}

fn noisy_accuracy(
    lifetimes: &[f64],
    threshold: f64,
    accuracy: f64,
    rng: &mut ChaCha8Rng,
) -> Vec<Option<LifetimePrediction>> {
    let correct = Normal::new(0.0, SIGMA_CORRECT).expect("a valid sigma");
    let wrong = Normal::new(0.0, SIGMA_WRONG).expect("a valid sigma");
    let cap = CENSORED_LIFETIME_S.log10();
    lifetimes
        .iter()
        .map(|&lifetime| {
            let noise = if rng.random_bool(accuracy) { correct.sample(rng) } else { wrong.sample(rng) };
            let predicted = 10f64.powf((lifetime.max(1.0).log10() + noise).clamp(0.0, cap));
            Some(of_lifetime(predicted, predicted >= threshold, PredictionSource::NoisyOracle))
        })
        .collect()
}

/// The model's prediction of every VM at its start, with tenant histories built from the
/// workload's own past (the trainer's replay order: departures up to the VM's start, its row, then
/// its start).
fn model_predictions(
    workload: &Workload,
    model: &LifetimeModel,
    with_interval: bool,
    bundle_history: bool,
) -> Vec<Option<LifetimePrediction>> {
    let schema = model.schema();
    let (window_s, long_threshold_s) = (schema.history_window_s, schema.long_threshold_s);
    let tenant_of = |i: usize| {
        let tenant = workload.vms[i].request.facts.tenant_id.as_str();
        if tenant == traces::NO_TENANT {
            ""
        } else {
            tenant
        }
    };
    let mut ends: Vec<(f64, usize)> =
        workload.vms.iter().enumerate().filter_map(|(i, vm)| vm.end_s.map(|end| (end, i))).collect();
    ends.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut next_end = 0;
    let mut histories =
        if bundle_history { model.feature_store().clone() } else { FeatureStore::empty(f64::NEG_INFINITY) };
    let mut row = Vec::with_capacity(schema.len());
    let mut curves = CurveCache::default();
    let mut out = Vec::with_capacity(workload.vms.len());
    for (i, vm) in workload.vms.iter().enumerate() {
        let now = vm.start_s;
        while next_end < ends.len() && ends[next_end].0 <= now {
            let (end, j) = ends[next_end];
            let ended = &workload.vms[j];
            histories.record_end(tenant_of(j), &ended.request.facts.vm_type, ended.start_s, end);
            next_end += 1;
        }
        let tenant = tenant_of(i);
        let mut features = RequestFeatures::of(&vm.request.facts, now);
        features.tenant_id = tenant.to_owned();
        let past = histories.past(tenant, &features.vm_type, now, window_s, long_threshold_s);
        row.clear();
        model.encoder().encode_into(&features, &past, None, &mut row);
        let prediction = model.predict_row_cached(&row, with_interval, &mut curves);
        out.push(Some(model.to_wire(&prediction, PredictionSource::Model)));
        histories.record_start(tenant, &features.vm_type, now);
    }
    out
}

/// Precision, recall and accuracy of the long class against the true lifetimes.
fn score(per_vm: &[Option<LifetimePrediction>], lifetimes: &[f64], threshold: f64) -> PredictionReport {
    let (mut true_long, mut predicted_long, mut both, mut right) = (0, 0, 0, 0);
    for (prediction, &lifetime) in per_vm.iter().zip(lifetimes) {
        let truly = lifetime >= threshold;
        let says = domain::prediction::placement_class(prediction.as_ref()) == LifetimeClass::Long;
        true_long += usize::from(truly);
        predicted_long += usize::from(says);
        both += usize::from(truly && says);
        right += usize::from(truly == says);
    }
    let ratio = |a: usize, b: usize| if b > 0 { a as f64 / b as f64 } else { 0.0 };
    PredictionReport {
        vms: per_vm.len(),
        true_long,
        predicted_long,
        precision_long: ratio(both, predicted_long),
        recall_long: ratio(both, true_long),
        accuracy: ratio(right, per_vm.len()),
        ..PredictionReport::default()
    }
}
