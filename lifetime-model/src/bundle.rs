//! Model bundles: a directory with the LightGBM models (long-lived, interval, remaining lifetime and,
//! since the survival model, the lifetime distribution's hazards), the feature store and
//! `manifest.json`, and [`LifetimeModel`], a loaded and validated bundle that predicts in process.
//!
//! A bundle with a survival model ([`Manifest::survival`]) serves every lifetime from it: the
//! predicted lifetime at request time and the remaining lifetime at any age are what its
//! [`LifetimeReading`] reads of one distribution ([`crate::survival`]). Bundles without one (older
//! ones) serve the remaining-lifetime regression as before.
//!
//! Loading validates everything a rollout must trust: the manifest parses, the schema hash matches
//! the schema, every other file matches its SHA-256 checksum in the manifest, every model parses and
//! has as many inputs as the schema, and the bundle reproduces its own probe predictions (recorded
//! at training time) within 1e-6.
//!
//! Reading is defensive, because a models directory is written by people and scripts: only regular
//! files are read (a FIFO, device or socket is refused without blocking on it), each file has a size
//! limit ([`LoadLimits`]) enforced while reading, and no file may resolve (through symlinks) outside
//! the confinement directory: the models directory when the inference server loads, the bundle's
//! own directory otherwise. Symlinks that stay inside it are followed.
//!
//! The checksums are written by the trainer, or by [`seal`] (`lifetime-train --seal DIR`) after an
//! operator changed a bundle by hand. They detect files changed, truncated or swapped after sealing;
//! they are not a signature (whoever can rewrite the manifest can re-seal).

mod confined;
mod seal;

use confined::io_error;
pub use confined::{canonical_root, read_confined, sha256_hex};
pub use seal::seal;

use crate::curve_cache::CurveCache;
use crate::features::{encode_uptime, FeatureEncoder, FeatureSchema, RequestFeatures};
use crate::gbdt::{ConstantRange, GridScorer, TreeEnsemble};
use crate::history::{FeatureStore, Histories, Past, PastHistories};
use crate::report::EvaluationReport;
use crate::survival::{curve_of, survival_from_logits, LifetimeReading, SurvivalCurve, SurvivalSpec};
use domain::{LifetimeClass, LifetimePrediction, PredictionSource};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

pub const MANIFEST_FILE: &str = "manifest.json";
pub const BINARY_MODEL_FILE: &str = "long_lived.lgbm.txt";
pub const MULTICLASS_MODEL_FILE: &str = "lifetime_interval.lgbm.txt";
pub const REMAINING_MODEL_FILE: &str = "remaining_lifetime.lgbm.txt";
pub const FEATURE_STORE_FILE: &str = "feature_store.json";
/// The survival model's hazards, in bundles that have one ([`Manifest::survival`]); checksummed too.
pub const SURVIVAL_MODEL_FILE: &str = "survival_hazard.lgbm.txt";
/// The files a bundle loads besides its manifest; each must match its checksum in the manifest.
pub const CHECKSUMMED_FILES: [&str; 4] =
    [BINARY_MODEL_FILE, MULTICLASS_MODEL_FILE, REMAINING_MODEL_FILE, FEATURE_STORE_FILE];
/// Every file a bundle may load: [`CHECKSUMMED_FILES`], [`SURVIVAL_MODEL_FILE`] when the bundle
/// has a survival model, and its manifest.
pub const LOADED_FILES: [&str; 6] = [
    BINARY_MODEL_FILE,
    MULTICLASS_MODEL_FILE,
    REMAINING_MODEL_FILE,
    FEATURE_STORE_FILE,
    SURVIVAL_MODEL_FILE,
    MANIFEST_FILE,
];

/// Copies the bundle in `from` into the directory `to` (which exists): every file it loads
/// ([`LOADED_FILES`]), the optional ones where it has them.
pub fn copy_bundle(from: &Path, to: &Path) -> std::io::Result<()> {
    for file in LOADED_FILES {
        let source = from.join(file);
        if file != SURVIVAL_MODEL_FILE || source.exists() {
            std::fs::copy(source, to.join(file))?;
        }
    }
    Ok(())
}

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
    /// The survival curve at the interval edges (bundles with a survival model).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub survival: Vec<f64>,
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
    /// The lifetime distribution, when the bundle has one: its intervals and default reading.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub survival: Option<SurvivalSpec>,
    /// SHA-256 (lowercase hex) of each of [`CHECKSUMMED_FILES`], by file name. Absent from bundles
    /// written before checksums existed: those parse, and are refused at load until sealed.
    #[serde(default)]
    pub checksums: BTreeMap<String, String>,
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
    #[error("the manifest's survival model is invalid: {0}")]
    Survival(String),
    #[error("{path} resolves to {resolved}, outside {root}: bundle files must stay inside it")]
    OutsideRoot { path: PathBuf, resolved: PathBuf, root: PathBuf },
    #[error("{path} is a {kind}, not a regular file")]
    NotRegularFile { path: PathBuf, kind: &'static str },
    #[error("{path} is larger than the limit of {limit} bytes")]
    TooLarge { path: PathBuf, limit: u64 },
    #[error("the manifest has no SHA-256 checksum for {file}; seal the bundle (`lifetime-train --seal DIR`)")]
    MissingChecksum { file: &'static str },
    #[error("{file} has SHA-256 {found}, but the manifest says {expected}: it changed after the bundle was sealed")]
    ChecksumMismatch { file: &'static str, expected: String, found: String },
}

/// Size limits of the files of a bundle, checked before and while reading, so that a huge, growing
/// or endless file (a link to `/dev/zero`) cannot exhaust memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadLimits {
    /// Largest model file or feature store, in bytes.
    pub max_file_bytes: u64,
    /// Largest manifest, in bytes.
    pub max_manifest_bytes: u64,
}

impl Default for LoadLimits {
    fn default() -> Self {
        // Real models are a few MB; 256 MiB leaves room for large ones. Manifests are tens of KB.
        LoadLimits { max_file_bytes: 256 << 20, max_manifest_bytes: 16 << 20 }
    }
}

/// How a bundle is loaded: its size limits and the directory its files must stay inside.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadOptions {
    pub limits: LoadLimits,
    /// No bundle file may resolve outside this directory; the bundle's own directory when `None`.
    pub confine_to: Option<PathBuf>,
}

fn parse_json<T: serde::de::DeserializeOwned>(path: &Path, bytes: &[u8]) -> Result<T, BundleError> {
    serde_json::from_slice(bytes).map_err(|source| BundleError::Json { path: path.to_owned(), source })
}

fn parse_model(path: &Path, bytes: &[u8]) -> Result<TreeEnsemble, BundleError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|error| io_error(path, std::io::Error::new(std::io::ErrorKind::InvalidData, error)))?;
    TreeEnsemble::from_lightgbm_text(text).map_err(|source| BundleError::Model { path: path.to_owned(), source })
}

/// The contents of a bundle's files, read within the limits and the confinement directory.
struct BundleFiles {
    manifest: Manifest,
    /// In the order of [`CHECKSUMMED_FILES`].
    contents: [Vec<u8>; 4],
    /// [`SURVIVAL_MODEL_FILE`], when the manifest has a survival model.
    survival: Option<Vec<u8>>,
}

impl BundleFiles {
    fn read(dir: &Path, options: &LoadOptions) -> Result<Self, BundleError> {
        let root = canonical_root(options.confine_to.as_deref().unwrap_or(dir))?;
        let manifest_path = dir.join(MANIFEST_FILE);
        let manifest: Manifest =
            parse_json(&manifest_path, &read_confined(&manifest_path, &root, options.limits.max_manifest_bytes)?)?;
        if manifest.format_version != FORMAT_VERSION {
            return Err(BundleError::Format { found: manifest.format_version });
        }
        let computed = manifest.schema.hash();
        if computed != manifest.schema_hash {
            return Err(BundleError::SchemaHash { manifest: manifest.schema_hash.clone(), computed });
        }
        if let Some(spec) = &manifest.survival {
            spec.check().map_err(BundleError::Survival)?;
        }
        let mut contents: [Vec<u8>; 4] = Default::default();
        for (file, content) in CHECKSUMMED_FILES.iter().zip(&mut contents) {
            *content = read_confined(&dir.join(file), &root, options.limits.max_file_bytes)?;
        }
        let survival = match manifest.survival {
            Some(_) => Some(read_confined(&dir.join(SURVIVAL_MODEL_FILE), &root, options.limits.max_file_bytes)?),
            None => None,
        };
        Ok(BundleFiles { manifest, contents, survival })
    }

    /// Every checksummed file with its contents: the four of every bundle, and the survival model.
    fn files(&self) -> impl Iterator<Item = (&'static str, &Vec<u8>)> {
        CHECKSUMMED_FILES.into_iter().zip(&self.contents).chain(self.survival.iter().map(|c| (SURVIVAL_MODEL_FILE, c)))
    }

    /// Every file matches its checksum in the manifest; a file without one is refused.
    fn verify(&self) -> Result<(), BundleError> {
        for (file, content) in self.files() {
            let expected = self.manifest.checksums.get(file).ok_or(BundleError::MissingChecksum { file })?;
            let found = sha256_hex(content);
            if !expected.eq_ignore_ascii_case(&found) {
                return Err(BundleError::ChecksumMismatch { file, expected: expected.clone(), found });
            }
        }
        Ok(())
    }

    fn checksums(&self) -> BTreeMap<String, String> {
        self.files().map(|(file, content)| (file.to_owned(), sha256_hex(content))).collect()
    }
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
    /// The hazard model, with what is read of its distribution.
    survival: Option<Survival>,
    store: FeatureStore,
}

/// A bundle's survival model in process.
struct Survival {
    hazards: TreeEnsemble,
    /// The manifest's spec; its reading is what is served, unless changed.
    spec: SurvivalSpec,
    /// The hazard model's interval inputs, one per interval.
    grid: Vec<f64>,
    /// The hazard model read over `grid` without a walk (every placement computes a curve), when
    /// the model is one it scores; the grid walk of [`curve_of`] otherwise.
    scorer: Option<GridScorer>,
}

impl Survival {
    fn new(hazards: TreeEnsemble, spec: &SurvivalSpec) -> Survival {
        let grid: Vec<f64> = (0..spec.edges_s.len()).map(SurvivalSpec::interval_input).collect();
        // The interval is the hazard model's last input, after the base row's.
        let scorer = hazards.num_features().checked_sub(1).and_then(|last| GridScorer::new(&hazards, last, &grid));
        Survival { hazards, spec: spec.clone(), grid, scorer }
    }

    /// The survival at each interval's edge of an encoded base row: [`curve_of`]'s values, bit
    /// for bit (the scorer's raw scores are the walk's).
    fn values(&self, row: &[f64]) -> Vec<f64> {
        match &self.scorer {
            // The scorer's interval input is the row's width the model was trained on; a row of
            // another width has its interval elsewhere, where the walk puts it.
            Some(scorer) if row.len() + 1 == self.hazards.num_features() => {
                // Ranks on the stack (`predict_raw`): no allocation beyond the curve's.
                let mut values = vec![0.0; scorer.grid_len()];
                scorer.predict_raw(row, &mut values);
                survival_from_logits(&mut values);
                values
            }
            _ => curve_of(&self.hazards, row, &self.grid),
        }
    }

    /// [`Survival::values`], remembered in `cache` by what the scorer reads of the row.
    fn values_cached(&self, row: &[f64], cache: &mut CurveCache) -> Vec<f64> {
        match &self.scorer {
            Some(scorer) if row.len() + 1 == self.hazards.num_features() => {
                scorer.read_ranks(row, &mut cache.ranks);
                cache.get_or_compute(|ranks| survival_of_ranks(scorer, ranks))
            }
            _ => self.values(row),
        }
    }

    /// `values` (survival at each edge) as a curve over this model's intervals.
    fn curve<'a>(&'a self, values: &'a [f64]) -> SurvivalCurve<'a> {
        SurvivalCurve { edges_s: &self.spec.edges_s, survival: values }
    }
}

/// The survival at each interval's edge of a row the scorer read as `ranks`.
fn survival_of_ranks(scorer: &GridScorer, ranks: &[u16]) -> Vec<f64> {
    let mut values = vec![0.0; scorer.grid_len()];
    scorer.predict_ranked(ranks, &mut values);
    survival_from_logits(&mut values);
    values
}

impl LifetimeModel {
    /// Loads and validates the bundle in `dir`, with the default limits, confined to `dir`.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self, BundleError> {
        Self::load_with(dir, &LoadOptions::default())
    }

    /// Loads and validates the bundle in `dir` with `options`.
    pub fn load_with(dir: impl AsRef<Path>, options: &LoadOptions) -> Result<Self, BundleError> {
        let dir = dir.as_ref();
        let files = BundleFiles::read(dir, options)?;
        files.verify()?;
        Self::from_files(dir, files)
    }

    fn from_files(dir: &Path, files: BundleFiles) -> Result<Self, BundleError> {
        let BundleFiles { manifest, contents: [binary, multiclass, remaining, store], survival } = files;
        let survival = match (&manifest.survival, survival) {
            (Some(spec), Some(bytes)) => {
                Some(Survival::new(parse_model(&dir.join(SURVIVAL_MODEL_FILE), &bytes)?, spec))
            }
            _ => None,
        };
        let binary = parse_model(&dir.join(BINARY_MODEL_FILE), &binary)?;
        let multiclass = parse_model(&dir.join(MULTICLASS_MODEL_FILE), &multiclass)?;
        let remaining = parse_model(&dir.join(REMAINING_MODEL_FILE), &remaining)?;
        let store: FeatureStore = parse_json(&dir.join(FEATURE_STORE_FILE), &store)?;
        let model = LifetimeModel {
            encoder: manifest.schema.encoder(),
            remaining_encoder: manifest.schema.with_uptime().encoder(),
            manifest,
            dir: dir.to_owned(),
            binary,
            multiclass,
            remaining,
            survival,
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
        if let Some(survival) = &self.survival {
            let hazards = &survival.hazards;
            if hazards.num_features() != inputs + 1 {
                return Err(BundleError::InputCount {
                    model: "survival model",
                    model_inputs: hazards.num_features(),
                    schema_inputs: inputs + 1,
                });
            }
            if hazards.num_outputs() != 1 {
                return Err(BundleError::OutputCount {
                    model: "survival model",
                    found: hazards.num_outputs(),
                    expected: 1,
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
            if let Some(curve) = self.survival_curve(&probe.row) {
                if probe.survival.len() != curve.len() {
                    return Err(BundleError::Probe {
                        index,
                        what: "survival curve length",
                        recorded: probe.survival.len() as f64,
                        recomputed: curve.len() as f64,
                    });
                }
                for (&recorded, &recomputed) in probe.survival.iter().zip(&curve) {
                    if !recomputed.is_finite() || (recorded - recomputed).abs() > PROBE_TOLERANCE {
                        return Err(BundleError::Probe { index, what: "survival", recorded, recomputed });
                    }
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

    /// The past of `request` (its tenant's and its job's, as of its request time) from `histories`
    /// (the bundle's own feature store, or a live one), with this bundle's look-back window and
    /// long-lived threshold.
    pub fn past(&self, histories: &dyn Histories, request: &RequestFeatures) -> Past {
        let schema = &self.manifest.schema;
        histories.past(
            &request.tenant_id,
            &request.vm_type,
            request.time_s,
            schema.history_window_s,
            schema.long_threshold_s,
        )
    }

    /// The past of `request` from its histories already looked up (`Histories::histories` of its
    /// tenant and type), as of its request time: [`LifetimeModel::past`] without the look-ups, for
    /// many requests of one tenant and type.
    pub fn past_from(&self, histories: &PastHistories<'_>, request: &RequestFeatures) -> Past {
        let schema = &self.manifest.schema;
        histories.past(request.time_s, schema.history_window_s, schema.long_threshold_s)
    }

    /// The histories as of the end of the training data.
    pub fn feature_store(&self) -> &FeatureStore {
        &self.store
    }

    /// The encoded base row of a request (what the long-lived and interval models take).
    pub fn encode(&self, request: &RequestFeatures) -> Vec<f64> {
        self.encoder.encode(request, &self.past(&self.store, request), None)
    }

    /// The encoded base row of a request whose past is `past`.
    pub fn encode_with(&self, request: &RequestFeatures, past: &Past) -> Vec<f64> {
        self.encoder.encode(request, past, None)
    }

    /// Predicts from an encoded base row; the interval only when `with_interval` is set.
    pub fn predict_row(&self, row: &[f64], with_interval: bool) -> ModelPrediction {
        self.predict_row_with(row, with_interval, None)
    }

    /// [`LifetimeModel::predict_row`], the same bit for bit, its survival curve remembered in
    /// `cache` (this model's: see [`CurveCache`]), for many rows predicted in one thread.
    pub fn predict_row_cached(&self, row: &[f64], with_interval: bool, cache: &mut CurveCache) -> ModelPrediction {
        self.predict_row_with(row, with_interval, Some(cache))
    }

    fn predict_row_with(&self, row: &[f64], with_interval: bool, cache: Option<&mut CurveCache>) -> ModelPrediction {
        let interval_class = with_interval.then(|| self.interval_class(row));
        let (p_long, expected_lifetime_s) = match &self.survival {
            Some(survival) => {
                let values = match cache {
                    Some(cache) => survival.values_cached(row, cache),
                    None => survival.values(row),
                };
                let curve = survival.curve(&values);
                let p_long = if survival.spec.p_long_from_survival {
                    curve.at(self.manifest.long_threshold_s)
                } else {
                    self.binary.predict(row)
                };
                (p_long, self.clamp_remaining(curve.remaining_s(0.0, survival.spec.reading)))
            }
            None => {
                let mut with_uptime = row.to_vec();
                with_uptime.push(0.0);
                (self.binary.predict(row), self.remaining_from_log10(self.remaining.predict(&with_uptime)))
            }
        };
        let p_long = p_long.clamp(0.0, 1.0);
        ModelPrediction {
            p_long,
            class: if p_long >= self.manifest.decision_threshold { LifetimeClass::Long } else { LifetimeClass::Short },
            interval_class,
            expected_lifetime_s,
        }
    }

    /// The lifetime interval of an encoded base row, the multi-class model alone: what
    /// [`LifetimeModel::predict_row`] gives with the interval.
    pub fn interval_class(&self, row: &[f64]) -> u32 {
        let mut classes = vec![0.0; self.multiclass.num_outputs()];
        self.multiclass.predict_into(row, &mut classes);
        crate::argmax(&classes) as u32
    }

    /// P(long) of many encoded base rows (`rows` row-major, [`FeatureSchema::len`] values a row)
    /// into `out`, one per row: bit for bit [`LifetimeModel::predict_row`]'s `p_long` of each row,
    /// with only the model that P(long) comes from evaluated, tree by tree over blocks of rows
    /// ([`TreeEnsemble::predict_rows`]). One thread: a caller with many rows shares them out.
    ///
    /// # Panics
    ///
    /// If `rows.len()` is not `out.len()` rows of the schema's width.
    pub fn p_long_rows(&self, rows: &[f64], out: &mut [f64]) {
        let width = self.manifest.schema.len();
        match &self.survival {
            Some(survival) if survival.spec.p_long_from_survival => {
                assert_eq!(rows.len(), width * out.len(), "`rows` must hold one row of the schema per output");
                for (row, p_long) in rows.chunks_exact(width).zip(out.iter_mut()) {
                    *p_long = self.predict_row(row, false).p_long;
                }
            }
            _ => {
                self.binary.predict_rows(rows, width, out);
                for p_long in out.iter_mut() {
                    *p_long = p_long.clamp(0.0, 1.0);
                }
            }
        }
    }

    /// The expected lifetime of many encoded base rows (as [`LifetimeModel::p_long_rows`] takes
    /// them) into `out`: bit for bit [`LifetimeModel::predict_row`]'s `expected_lifetime_s`.
    ///
    /// # Panics
    ///
    /// If `rows.len()` is not `out.len()` rows of the schema's width.
    pub fn expected_lifetime_rows(&self, rows: &[f64], out: &mut [f64]) {
        let width = self.manifest.schema.len();
        assert_eq!(rows.len(), width * out.len(), "`rows` must hold one row of the schema per output");
        if self.survival.is_some() {
            for (row, lifetime) in rows.chunks_exact(width).zip(out.iter_mut()) {
                *lifetime = self.predict_row(row, false).expected_lifetime_s;
            }
            return;
        }
        // The remaining-lifetime model reads the uptime after the base row: 0 at request time.
        let mut with_uptime = Vec::with_capacity(rows.len() + out.len());
        for row in rows.chunks_exact(width) {
            with_uptime.extend_from_slice(row);
            with_uptime.push(0.0);
        }
        self.remaining.predict_rows(&with_uptime, width + 1, out);
        for lifetime in out.iter_mut() {
            *lifetime = self.remaining_from_log10(*lifetime);
        }
    }

    pub fn predict(&self, request: &RequestFeatures, with_interval: bool) -> ModelPrediction {
        self.predict_row(&self.encode(request), with_interval)
    }

    /// Predicted remaining lifetime in seconds of a VM that has been running for `uptime_s`.
    pub fn predict_remaining(&self, request: &RequestFeatures, uptime_s: f64) -> f64 {
        self.predict_remaining_with(request, &self.past(&self.store, request), uptime_s)
    }

    /// [`LifetimeModel::predict_remaining`] for a request whose past is `past`.
    pub fn predict_remaining_with(&self, request: &RequestFeatures, past: &Past, uptime_s: f64) -> f64 {
        if self.survival.is_some() {
            return self.predict_remaining_row(&self.encoder.encode(request, past, None), uptime_s);
        }
        let row = self.remaining_encoder.encode(request, past, Some(uptime_s));
        self.remaining_from_log10(self.remaining.predict(&row))
    }

    /// The survival curve of an encoded base row at the interval edges
    /// ([`LifetimeModel::survival_edges_s`]), when the bundle has a survival model.
    pub fn survival_curve(&self, row: &[f64]) -> Option<Vec<f64>> {
        let survival = self.survival.as_ref()?;
        Some(survival.values(row))
    }

    /// [`LifetimeModel::survival_curve`], the same bit for bit, remembered in `cache` (which must
    /// be this model's: see [`CurveCache`]).
    pub fn survival_curve_cached(&self, row: &[f64], cache: &mut CurveCache) -> Option<Vec<f64>> {
        let survival = self.survival.as_ref()?;
        Some(survival.values_cached(row, cache))
    }

    /// The survival model's interval edges, when the bundle has one.
    pub fn survival_edges_s(&self) -> Option<&[f64]> {
        self.survival.as_ref().map(|s| s.spec.edges_s.as_slice())
    }

    /// What this model serves of its distribution (`None` without a survival model).
    pub fn reading(&self) -> Option<LifetimeReading> {
        self.survival.as_ref().map(|s| s.spec.reading)
    }

    /// The same model serving another reading of its distribution (no effect without one).
    pub fn with_reading(mut self, reading: LifetimeReading) -> Self {
        if let Some(survival) = &mut self.survival {
            survival.spec.reading = reading;
        }
        self
    }

    /// The remaining lifetime at `uptime_s` read off a curve from [`LifetimeModel::survival_curve`],
    /// capped like every remaining lifetime the bundle serves. Without a survival model, NaN.
    pub fn remaining_from_curve(&self, curve: &[f64], uptime_s: f64) -> f64 {
        match &self.survival {
            Some(survival) => self.clamp_remaining(survival.curve(curve).remaining_s(uptime_s, survival.spec.reading)),
            None => f64::NAN,
        }
    }

    /// The chances that a VM alive at `uptime_s` is still alive `after_s[k]` seconds later,
    /// `S(uptime + t) / S(uptime)`, read off a curve from [`LifetimeModel::survival_curve`] into
    /// `out[k]`. `false` (and `out` untouched) without a survival model.
    pub fn conditional_survival_from_curve(
        &self,
        curve: &[f64],
        uptime_s: f64,
        after_s: &[f64],
        out: &mut [f64],
    ) -> bool {
        let Some(survival) = &self.survival else { return false };
        survival.curve(curve).conditional(uptime_s, after_s, out);
        true
    }

    /// The bundle reading remaining lifetimes from its regression, as a bundle without a
    /// survival model does (its survival model dropped).
    pub fn without_survival(mut self) -> Self {
        self.survival = None;
        self
    }

    /// Remaining lifetime from an encoded base row plus uptime (the row is reused by repredictions).
    pub fn predict_remaining_row(&self, row: &[f64], uptime_s: f64) -> f64 {
        self.predict_remaining_encoded(row, encode_uptime(uptime_s))
    }

    /// Remaining lifetime from an encoded base row plus an encoded uptime ([`encode_uptime`]).
    pub fn predict_remaining_encoded(&self, row: &[f64], log10_uptime: f64) -> f64 {
        if let Some(curve) = self.survival_curve(row) {
            return self.remaining_from_curve(&curve, 10f64.powf(log10_uptime) - 1.0);
        }
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
        if self.survival.is_some() {
            // Read off a curve, the remaining lifetime moves with every second of age.
            return None;
        }
        // The uptime is the input after the base row (`FeatureSchema::with_uptime`).
        self.remaining.constant_range(self.manifest.schema.len(), log10_uptime)
    }

    fn remaining_from_log10(&self, log10: f64) -> f64 {
        self.clamp_remaining(10f64.powf(log10))
    }

    fn clamp_remaining(&self, seconds: f64) -> f64 {
        seconds.clamp(1.0, self.manifest.remaining_cap_s)
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
mod tests;
