//! Model bundles: a directory with the three LightGBM models, the feature store and `manifest.json`,
//! and [`LifetimeModel`], a loaded and validated bundle that predicts in process.
//!
//! Loading validates everything a rollout must trust: the manifest parses, the schema hash matches
//! the schema, every model parses and has as many inputs as the schema, and the bundle reproduces
//! its own probe predictions (recorded at training time) within 1e-6.

use crate::features::{encode_uptime, FeatureEncoder, FeatureSchema, RequestFeatures};
use crate::gbdt::{ConstantRange, TreeEnsemble};
use crate::history::{FeatureStore, TenantSummary};
use crate::report::EvaluationReport;
use domain::{LifetimeClass, LifetimePrediction, PredictionSource};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub const MANIFEST_FILE: &str = "manifest.json";
pub const BINARY_MODEL_FILE: &str = "long_lived.lgbm.txt";
pub const MULTICLASS_MODEL_FILE: &str = "lifetime_interval.lgbm.txt";
pub const REMAINING_MODEL_FILE: &str = "remaining_lifetime.lgbm.txt";
pub const FEATURE_STORE_FILE: &str = "feature_store.json";
/// Bundle layout version this code reads and writes.
pub const FORMAT_VERSION: u32 = 1;
/// Largest difference tolerated between a probe's recorded and recomputed prediction.
pub const PROBE_TOLERANCE: f64 = 1e-6;
/// Longest row (base row plus uptime) that remaining-lifetime predictions build on the stack.
const STACK_ROW: usize = 64;

/// Where the training data came from and how it was split.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainingWindow {
    pub source: String,
    pub first_start_s: f64,
    /// Training uses VMs that arrived before this instant; evaluation those after.
    pub cutoff_s: f64,
    pub trace_end_s: f64,
    pub training_vms: usize,
    pub evaluation_vms: usize,
}

/// One fixed input with the predictions the bundle made for it when it was written.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProbeCase {
    /// An encoded base row (no uptime).
    #[serde(with = "crate::nan_json::vec")]
    pub row: Vec<f64>,
    pub p_long: f64,
    /// log10 remaining lifetime at uptime 0.
    pub log10_remaining: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    pub name: String,
    pub version: String,
    pub created_unix_s: u64,
    pub schema: FeatureSchema,
    /// `schema.hash()`; the remaining-lifetime model takes `schema.with_uptime()`.
    pub schema_hash: String,
    /// A VM is long-lived when it lives at least this long.
    pub long_threshold_s: f64,
    /// P(long) at or above which the binary class is "long".
    pub decision_threshold: f64,
    /// Ascending lifetime cut-offs of the interval classes (class i: between cut-offs i-1 and i).
    pub class_cutoffs_s: Vec<f64>,
    /// Remaining-lifetime labels were capped here.
    pub remaining_cap_s: f64,
    pub training: TrainingWindow,
    pub evaluation: EvaluationReport,
    pub probes: Vec<ProbeCase>,
}

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not valid JSON of the expected shape: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: {source}")]
    Model {
        path: PathBuf,
        #[source]
        source: crate::gbdt::GbdtError,
    },
    #[error("bundle format {found} is not supported (expected {FORMAT_VERSION})")]
    Format { found: u32 },
    #[error("schema hash mismatch: manifest says {manifest}, the schema hashes to {computed}")]
    SchemaHash { manifest: String, computed: String },
    #[error("{model} expects {model_inputs} inputs but the schema has {schema_inputs}")]
    InputCount { model: &'static str, model_inputs: usize, schema_inputs: usize },
    #[error("{model} has {found} outputs, expected {expected}")]
    OutputCount { model: &'static str, found: usize, expected: usize },
    #[error("probe {index}: recorded {recorded}, recomputed {recomputed} ({what})")]
    Probe { index: usize, what: &'static str, recorded: f64, recomputed: f64 },
    #[error("the bundle has no probe predictions to validate against")]
    NoProbes,
}

fn read(path: &Path) -> Result<String, BundleError> {
    std::fs::read_to_string(path).map_err(|source| BundleError::Io { path: path.to_owned(), source })
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, BundleError> {
    serde_json::from_str(&read(path)?).map_err(|source| BundleError::Json { path: path.to_owned(), source })
}

fn read_model(dir: &Path, file: &str) -> Result<TreeEnsemble, BundleError> {
    let path = dir.join(file);
    TreeEnsemble::from_lightgbm_text(&read(&path)?).map_err(|source| BundleError::Model { path, source })
}

/// What the model says about one VM at request time.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelPrediction {
    pub p_long: f64,
    pub class: LifetimeClass,
    /// The lifetime interval, when asked for (the multi-class model is the costly one).
    pub interval_class: Option<u32>,
    /// Predicted lifetime in seconds (remaining lifetime at uptime 0, capped like the labels).
    pub expected_lifetime_s: f64,
}

/// A loaded, validated bundle.
pub struct LifetimeModel {
    manifest: Manifest,
    dir: PathBuf,
    encoder: FeatureEncoder,
    remaining_encoder: FeatureEncoder,
    binary: TreeEnsemble,
    multiclass: TreeEnsemble,
    remaining: TreeEnsemble,
    store: FeatureStore,
}

impl LifetimeModel {
    /// Loads and validates the bundle in `dir`.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self, BundleError> {
        let dir = dir.as_ref();
        let manifest: Manifest = read_json(&dir.join(MANIFEST_FILE))?;
        if manifest.format_version != FORMAT_VERSION {
            return Err(BundleError::Format { found: manifest.format_version });
        }
        let computed = manifest.schema.hash();
        if computed != manifest.schema_hash {
            return Err(BundleError::SchemaHash { manifest: manifest.schema_hash.clone(), computed });
        }
        let binary = read_model(dir, BINARY_MODEL_FILE)?;
        let multiclass = read_model(dir, MULTICLASS_MODEL_FILE)?;
        let remaining = read_model(dir, REMAINING_MODEL_FILE)?;
        let store: FeatureStore = read_json(&dir.join(FEATURE_STORE_FILE))?;
        let model = LifetimeModel {
            encoder: manifest.schema.encoder(),
            remaining_encoder: manifest.schema.with_uptime().encoder(),
            manifest,
            dir: dir.to_owned(),
            binary,
            multiclass,
            remaining,
            store,
        };
        model.validate()?;
        Ok(model)
    }

    fn validate(&self) -> Result<(), BundleError> {
        let inputs = self.manifest.schema.len();
        for (model, ensemble, expected_inputs, expected_outputs) in [
            ("long-lived model", &self.binary, inputs, 1),
            ("interval model", &self.multiclass, inputs, self.manifest.class_cutoffs_s.len() + 1),
            ("remaining-lifetime model", &self.remaining, inputs + 1, 1),
        ] {
            if ensemble.num_features() != expected_inputs {
                return Err(BundleError::InputCount {
                    model,
                    model_inputs: ensemble.num_features(),
                    schema_inputs: expected_inputs,
                });
            }
            if ensemble.num_outputs() != expected_outputs {
                return Err(BundleError::OutputCount {
                    model,
                    found: ensemble.num_outputs(),
                    expected: expected_outputs,
                });
            }
        }
        if self.manifest.probes.is_empty() {
            return Err(BundleError::NoProbes);
        }
        for (index, probe) in self.manifest.probes.iter().enumerate() {
            let p_long = self.binary.predict(&probe.row);
            let mut with_uptime = probe.row.clone();
            with_uptime.push(0.0);
            let log10_remaining = self.remaining.predict(&with_uptime);
            for (what, recorded, recomputed) in
                [("P(long)", probe.p_long, p_long), ("log10 remaining", probe.log10_remaining, log10_remaining)]
            {
                if !recomputed.is_finite() || (recorded - recomputed).abs() > PROBE_TOLERANCE {
                    return Err(BundleError::Probe { index, what, recorded, recomputed });
                }
            }
        }
        Ok(())
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn version(&self) -> &str {
        &self.manifest.version
    }

    pub fn schema(&self) -> &FeatureSchema {
        &self.manifest.schema
    }

    pub fn encoder(&self) -> &FeatureEncoder {
        &self.encoder
    }

    /// The tenant's past as of `now_s`, from the bundle's feature store.
    pub fn tenant_summary(&self, tenant_id: &str, now_s: f64) -> TenantSummary {
        match self.store.history(tenant_id) {
            Some(history) if !tenant_id.is_empty() => {
                history.summary(now_s, self.manifest.schema.history_window_s, self.manifest.schema.long_threshold_s)
            }
            _ => TenantSummary::unknown(),
        }
    }

    /// The encoded base row of a request (what the long-lived and interval models take).
    pub fn encode(&self, request: &RequestFeatures) -> Vec<f64> {
        let tenant = self.tenant_summary(&request.tenant_id, request.time_s);
        self.encoder.encode(request, &tenant, None)
    }

    /// Predicts from an encoded base row; the interval only when `with_interval` is set.
    pub fn predict_row(&self, row: &[f64], with_interval: bool) -> ModelPrediction {
        let p_long = self.binary.predict(row).clamp(0.0, 1.0);
        let interval_class = with_interval.then(|| {
            let mut classes = vec![0.0; self.multiclass.num_outputs()];
            self.multiclass.predict_into(row, &mut classes);
            crate::argmax(&classes) as u32
        });
        let mut with_uptime = row.to_vec();
        with_uptime.push(0.0);
        let expected_lifetime_s = self.remaining_from_log10(self.remaining.predict(&with_uptime));
        ModelPrediction {
            p_long,
            class: if p_long >= self.manifest.decision_threshold { LifetimeClass::Long } else { LifetimeClass::Short },
            interval_class,
            expected_lifetime_s,
        }
    }

    pub fn predict(&self, request: &RequestFeatures, with_interval: bool) -> ModelPrediction {
        self.predict_row(&self.encode(request), with_interval)
    }

    /// Predicted remaining lifetime in seconds of a VM that has been running for `uptime_s`.
    pub fn predict_remaining(&self, request: &RequestFeatures, uptime_s: f64) -> f64 {
        let tenant = self.tenant_summary(&request.tenant_id, request.time_s);
        let row = self.remaining_encoder.encode(request, &tenant, Some(uptime_s));
        self.remaining_from_log10(self.remaining.predict(&row))
    }

    /// Remaining lifetime from an encoded base row plus uptime (the row is reused by repredictions).
    pub fn predict_remaining_row(&self, row: &[f64], uptime_s: f64) -> f64 {
        self.predict_remaining_encoded(row, encode_uptime(uptime_s))
    }

    /// Remaining lifetime from an encoded base row plus an encoded uptime ([`encode_uptime`]).
    pub fn predict_remaining_encoded(&self, row: &[f64], log10_uptime: f64) -> f64 {
        // Repredictions call this for every running VM: a row that fits is built on the stack.
        let mut buffer = [0.0; STACK_ROW];
        let mut heap = Vec::new();
        let with_uptime = match buffer.get_mut(..row.len() + 1) {
            Some(with_uptime) => with_uptime,
            None => {
                heap.resize(row.len() + 1, 0.0);
                &mut heap[..]
            }
        };
        with_uptime[..row.len()].copy_from_slice(row);
        with_uptime[row.len()] = log10_uptime;
        self.remaining_from_log10(self.remaining.predict(with_uptime))
    }

    /// An interval of encoded uptimes ([`encode_uptime`]), containing `log10_uptime`, over which
    /// [`LifetimeModel::predict_remaining_encoded`] gives every row the same answer, bit for bit, as
    /// at `log10_uptime` (the remaining-lifetime model's trees cut the uptime at a few hundred
    /// thresholds, so a VM's reprediction changes only when its uptime crosses one). `None` when no
    /// such interval is known.
    pub fn remaining_constant_range(&self, log10_uptime: f64) -> Option<ConstantRange> {
        // The uptime is the input after the base row (`FeatureSchema::with_uptime`).
        self.remaining.constant_range(self.manifest.schema.len(), log10_uptime)
    }

    fn remaining_from_log10(&self, log10: f64) -> f64 {
        10f64.powf(log10).clamp(1.0, self.manifest.remaining_cap_s)
    }

    /// The wire prediction for `prediction`, marked as coming from this model.
    pub fn to_wire(&self, prediction: &ModelPrediction, source: PredictionSource) -> LifetimePrediction {
        LifetimePrediction {
            p_long: prediction.p_long,
            class: prediction.class,
            interval_class: prediction.interval_class,
            expected_lifetime_s: Some(prediction.expected_lifetime_s),
            model_version: Some(self.manifest.version.clone()),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn default_bundle() -> LifetimeModel {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/default");
        LifetimeModel::load(&dir).unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
    }

    /// Repredicting a VM every `step` seconds of uptime (every second for the first 1,000), reusing
    /// the last evaluation while the uptime stays in its constant range, gives bit for bit what
    /// evaluating every time gives.
    #[test]
    fn remaining_predictions_are_constant_over_their_uptime_ranges() {
        let model = default_bundle();
        let (mut evaluations, mut calls) = (0u64, 0u64);
        for probe in &model.manifest().probes {
            for step in [60.0, 900.0, 3_601.5] {
                let mut cached: Option<(ConstantRange, f64)> = None;
                let mut uptime = 0.0;
                while uptime < 30.0 * 86_400.0 {
                    let key = encode_uptime(uptime);
                    let expected = model.predict_remaining_row(&probe.row, uptime);
                    calls += 1;
                    let got = match cached {
                        Some((range, remaining)) if range.contains(key) => remaining,
                        _ => {
                            evaluations += 1;
                            let range = model.remaining_constant_range(key).expect("the uptime is a numerical input");
                            assert!(range.contains(key), "uptime {uptime}: {key} not in {range:?}");
                            let remaining = model.predict_remaining_encoded(&probe.row, key);
                            // The range's ends answer like its inside.
                            for end in [crate::gbdt::tests::next_up(range.above), range.up_to]
                                .into_iter()
                                .filter(|v| v.is_finite())
                            {
                                let at_end = model.predict_remaining_encoded(&probe.row, end);
                                assert_eq!(at_end.to_bits(), remaining.to_bits(), "{end} in {range:?}");
                            }
                            cached = Some((range, remaining));
                            remaining
                        }
                    };
                    assert_eq!(got.to_bits(), expected.to_bits(), "uptime {uptime}, row {:?}", probe.row);
                    // Every second at first, where the thresholds are densest.
                    uptime += if uptime < 1_000.0 { 1.0 } else { step };
                }
            }
        }
        assert!(evaluations * 4 < calls, "the ranges save evaluations: {evaluations} of {calls}");
    }

    #[test]
    fn rows_on_the_stack_and_on_the_heap_predict_like_a_vector() {
        let model = default_bundle();
        let row = &model.manifest().probes[0].row;
        let mut long = row.clone();
        long.resize(STACK_ROW + 5, 1.0);
        for candidate in [row, &long] {
            for uptime in [0.0, 100.0, 86_400.0] {
                let mut with_uptime = candidate.clone();
                with_uptime.push(encode_uptime(uptime));
                let expected = model.remaining_from_log10(model.remaining.predict(&with_uptime));
                assert_eq!(model.predict_remaining_row(candidate, uptime).to_bits(), expected.to_bits());
            }
        }
    }

    /// Bundles written before features and rounds were chosen on validation (and exit-time
    /// quality was measured) have neither report, and still load.
    #[test]
    fn manifests_without_the_validation_and_exit_time_reports_load() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/default").join(MANIFEST_FILE);
        let mut manifest: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let evaluation = manifest["evaluation"].as_object_mut().expect("an evaluation report");
        evaluation.remove("validation");
        evaluation.remove("exit_time");
        let old: Manifest = serde_json::from_value(manifest).expect("an old manifest parses");
        assert!(old.evaluation.validation.is_none() && old.evaluation.exit_time.is_none());
        // And what is absent is not written back.
        let written = serde_json::to_string(&old).unwrap();
        assert!(!written.contains("\"validation\"") && !written.contains("\"exit_time\""));
        default_bundle();
    }
}
