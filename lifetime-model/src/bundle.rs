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

/// Lowercase hex SHA-256 of `bytes`, the form of the manifest's checksums.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|byte| format!("{byte:02x}")).collect()
}

fn io_error(path: &Path, source: std::io::Error) -> BundleError {
    BundleError::Io { path: path.to_owned(), source }
}

fn file_kind(file_type: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if file_type.is_file() {
        "regular file"
    } else if file_type.is_dir() {
        "directory"
    } else if file_type.is_symlink() {
        "symbolic link"
    } else if file_type.is_fifo() {
        "FIFO"
    } else if file_type.is_char_device() {
        "character device"
    } else if file_type.is_block_device() {
        "block device"
    } else if file_type.is_socket() {
        "socket"
    } else {
        "special file"
    }
}

/// Canonical form of a confinement directory, for [`read_confined`].
pub fn canonical_root(root: &Path) -> Result<PathBuf, BundleError> {
    std::fs::canonicalize(root).map_err(|source| io_error(root, source))
}

/// Reads `path` whole, refusing anything but a regular file of at most `limit` bytes that resolves
/// inside `root` (canonical, see [`canonical_root`]).
///
/// Symlinks are resolved first and the target must stay inside `root`; the resolved path is then
/// opened without following a symlink again (`O_NOFOLLOW`) and without blocking (`O_NONBLOCK`, so a
/// FIFO swapped in after the check is refused instead of waiting for a writer), and the opened file's
/// own metadata decides. Reading stops one byte past the limit, so a file that grows meanwhile is
/// refused too.
pub fn read_confined(path: &Path, root: &Path, limit: u64) -> Result<Vec<u8>, BundleError> {
    let resolved = std::fs::canonicalize(path).map_err(|source| io_error(path, source))?;
    if !resolved.starts_with(root) {
        return Err(BundleError::OutsideRoot { path: path.to_owned(), resolved, root: root.to_owned() });
    }
    // Look before opening: opening some devices has effects of its own.
    let metadata = std::fs::metadata(&resolved).map_err(|source| io_error(path, source))?;
    check_regular(path, &metadata, limit)?;
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW);
    }
    let file = options.open(&resolved).map_err(|source| io_error(path, source))?;
    let metadata = file.metadata().map_err(|source| io_error(path, source))?;
    check_regular(path, &metadata, limit)?;
    let capacity = usize::try_from(metadata.len()).unwrap_or(0);
    let mut contents = Vec::with_capacity(capacity);
    file.take(limit.saturating_add(1)).read_to_end(&mut contents).map_err(|source| io_error(path, source))?;
    if contents.len() as u64 > limit {
        return Err(BundleError::TooLarge { path: path.to_owned(), limit });
    }
    Ok(contents)
}

fn check_regular(path: &Path, metadata: &std::fs::Metadata, limit: u64) -> Result<(), BundleError> {
    if !metadata.file_type().is_file() {
        return Err(BundleError::NotRegularFile { path: path.to_owned(), kind: file_kind(&metadata.file_type()) });
    }
    if metadata.len() > limit {
        return Err(BundleError::TooLarge { path: path.to_owned(), limit });
    }
    Ok(())
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

/// Writes (or rewrites) the checksums of the bundle in `dir` into its manifest, after checking that
/// the bundle loads with them: for a bundle an operator changed by hand, or one written before
/// checksums existed. Returns the sealed manifest.
///
/// Only the manifest's `checksums` member changes: the rest of its text is kept byte for byte (a
/// parse and rewrite could move floats by an ulp). The manifest is replaced atomically.
pub fn seal(dir: impl AsRef<Path>, limits: &LoadLimits) -> Result<Manifest, BundleError> {
    let dir = dir.as_ref();
    let root = canonical_root(dir)?;
    let manifest_path = dir.join(MANIFEST_FILE);
    let original = read_confined(&manifest_path, &root, limits.max_manifest_bytes)?;
    let mut files = BundleFiles::read(dir, &LoadOptions { limits: *limits, confine_to: None })?;
    let checksums = files.checksums();
    let sealed_text = std::str::from_utf8(&original)
        .ok()
        .and_then(|text| with_checksums(text, &checksums))
        .ok_or_else(|| BundleError::Io {
            path: manifest_path.clone(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, "the manifest is not a JSON object"),
        })?;
    let sealed: Manifest = parse_json(&manifest_path, sealed_text.as_bytes())?;
    if sealed.checksums != checksums {
        return Err(BundleError::Io {
            path: manifest_path,
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, "the checksums could not be written"),
        });
    }
    files.manifest = sealed.clone();
    // Only a bundle that passes every other check is sealed.
    files.verify()?;
    LifetimeModel::from_files(dir, files)?;
    let staging = dir.join(format!(".{MANIFEST_FILE}.seal"));
    std::fs::write(&staging, sealed_text).map_err(|source| io_error(&staging, source))?;
    std::fs::rename(&staging, &manifest_path).map_err(|source| io_error(&manifest_path, source))?;
    Ok(sealed)
}

/// `manifest` (the text of a JSON object) with its top-level `checksums` member set to `checksums`:
/// replaced in place when present, appended otherwise. `None` if the text is not a JSON object.
fn with_checksums(manifest: &str, checksums: &BTreeMap<String, String>) -> Option<String> {
    let entries: Vec<String> = checksums
        .iter()
        .map(|(file, checksum)| {
            format!("    {}: {}", serde_json::Value::from(file.as_str()), serde_json::Value::from(checksum.as_str()))
        })
        .collect();
    let object = format!("{{\n{}\n  }}", entries.join(",\n"));
    let members = top_level_members(manifest)?;
    let spliced = match members.members.iter().find(|member| member.key == "checksums") {
        Some(member) => format!("{}{object}{}", &manifest[..member.value.start], &manifest[member.value.end..]),
        None => {
            let close = members.close;
            let last = manifest[..close].trim_end().len();
            let separator = if members.members.is_empty() { "" } else { "," };
            format!("{}{separator}\n  \"checksums\": {object}\n{}", &manifest[..last], &manifest[close..])
        }
    };
    Some(spliced)
}

struct Member<'a> {
    key: &'a str,
    /// Byte range of the value, without surrounding whitespace.
    value: std::ops::Range<usize>,
}

struct TopLevel<'a> {
    members: Vec<Member<'a>>,
    /// Byte offset of the object's closing brace.
    close: usize,
}

/// Records the member `key` whose value spans `from..to` of `text` (with whitespace around it).
fn push_member<'a>(text: &'a str, members: &mut Vec<Member<'a>>, key: Option<&'a str>, from: Option<usize>, to: usize) {
    if let (Some(key), Some(from)) = (key, from) {
        let value = &text[from..to];
        let first = from + (value.len() - value.trim_start().len());
        let last = from + value.trim_end().len();
        members.push(Member { key, value: first..last });
    }
}

/// The top-level members of the JSON object `text`, by a scan that tracks strings and nesting only
/// (the text is parsed properly afterwards); `None` if `text` is not an object.
fn top_level_members(text: &str) -> Option<TopLevel<'_>> {
    let bytes = text.as_bytes();
    let start = bytes.iter().position(|b| !b.is_ascii_whitespace())?;
    if bytes[start] != b'{' {
        return None;
    }
    let (mut depth, mut in_string, mut escaped) = (1usize, false, false);
    let (mut expecting_key, mut key_start, mut key) = (true, None, None);
    let mut value_start: Option<usize> = None;
    let mut members = Vec::new();
    for (i, &byte) in bytes.iter().enumerate().skip(start + 1) {
        if in_string {
            if escaped {
                escaped = false;
            } else if byte == b'\\' {
                escaped = true;
            } else if byte == b'"' {
                in_string = false;
                if let Some(from) = key_start.take() {
                    key = Some(&text[from + 1..i]);
                }
            }
            continue;
        }
        match byte {
            b'"' => {
                in_string = true;
                if depth == 1 && expecting_key {
                    key_start = Some(i);
                    expecting_key = false;
                }
            }
            b':' if depth == 1 => value_start = Some(i + 1),
            b',' if depth == 1 => {
                push_member(text, &mut members, key.take(), value_start.take(), i);
                expecting_key = true;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    push_member(text, &mut members, key.take(), value_start.take(), i);
                    return (byte == b'}').then_some(TopLevel { members, close: i });
                }
            }
            _ => {}
        }
    }
    None
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
                cache.get_or_compute(|ranks| {
                    let mut values = vec![0.0; scorer.grid_len()];
                    scorer.predict_ranked(ranks, &mut values);
                    survival_from_logits(&mut values);
                    values
                })
            }
            _ => self.values(row),
        }
    }

    /// `values` (survival at each edge) as a curve over this model's intervals.
    fn curve<'a>(&'a self, values: &'a [f64]) -> SurvivalCurve<'a> {
        SurvivalCurve { edges_s: &self.spec.edges_s, survival: values }
    }
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
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn default_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/default")
    }

    /// A copy of the default bundle's loaded files in a temporary directory.
    fn default_copy() -> (tempfile::TempDir, PathBuf) {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path().join("bundle");
        std::fs::create_dir(&dir).unwrap();
        copy_bundle(&default_dir(), &dir).unwrap();
        (temp, dir)
    }

    fn mkfifo(path: &Path) {
        use std::os::unix::ffi::OsStrExt;
        let name = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: `name` is a valid NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0, "mkfifo {}", path.display());
    }

    /// The default bundle's curves come from the grid scorer, and are the grid walk's, bit for
    /// bit, for its probes' rows and variations of them (the scorer's own tests cover every kind
    /// of value; this one covers the bundle's wiring).
    #[test]
    fn survival_curves_are_the_grid_walks() {
        let model = LifetimeModel::load(default_dir()).unwrap();
        let survival = model.survival.as_ref().expect("the default bundle has a survival model");
        assert!(survival.scorer.is_some(), "the default hazard model is one the scorer reads");
        let mut rows: Vec<Vec<f64>> = model.manifest().probes.iter().map(|p| p.row.clone()).collect();
        for (i, probe) in model.manifest().probes.iter().enumerate() {
            let mut row = probe.row.clone();
            let at = i % row.len();
            row[at] = [f64::NAN, 0.0, 1e-40, -3.0][i % 4];
            rows.push(row);
        }
        for row in &rows {
            let curve = model.survival_curve(row).expect("a curve");
            let walked = curve_of(&survival.hazards, row, &survival.grid);
            assert_eq!(
                curve.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                walked.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{row:?}"
            );
        }
        // A row of another width is walked.
        let long: Vec<f64> = rows[0].iter().copied().chain([1.0]).collect();
        assert_eq!(model.survival_curve(&long), Some(curve_of(&survival.hazards, &long, &survival.grid)));
    }

    /// Curves remembered by their rows' ranks are the computed ones, bit for bit, for rows seen
    /// again and rows that differ from one seen only between two thresholds; a row that crosses a
    /// threshold is computed.
    #[test]
    fn remembered_curves_are_the_computed_ones() {
        let model = LifetimeModel::load(default_dir()).unwrap();
        let mut cache = CurveCache::default();
        let bits = |curve: Vec<f64>| curve.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let probes: Vec<Vec<f64>> = model.manifest().probes.iter().map(|p| p.row.clone()).collect();
        for row in &probes {
            let computed = bits(model.survival_curve(row).unwrap());
            assert_eq!(bits(model.survival_curve_cached(row, &mut cache).unwrap()), computed);
            assert_eq!(bits(model.survival_curve_cached(row, &mut cache).unwrap()), computed, "{row:?} again");
        }
        assert_eq!(cache.hits, probes.len() as u64);
        // The hour of day (the fifth input) moved by a millisecond stays between its thresholds.
        let hour = 4;
        let mut nudged = probes[0].clone();
        nudged[hour] += 1e-3 / 3600.0;
        let hits = cache.hits;
        assert_eq!(
            bits(model.survival_curve_cached(&nudged, &mut cache).unwrap()),
            bits(model.survival_curve(&nudged).unwrap())
        );
        assert_eq!(cache.hits, hits + 1, "a row between the same thresholds is remembered");
        // Every hour of the day: a new curve each time it crosses a threshold, the same as computed.
        let (mut misses, mut changes, mut last) = (cache.misses, 0, None);
        for minute in 0..24 * 60 {
            let mut row = probes[0].clone();
            row[hour] = minute as f64 / 60.0;
            let curve = bits(model.survival_curve_cached(&row, &mut cache).unwrap());
            assert_eq!(curve, bits(model.survival_curve(&row).unwrap()), "minute {minute}");
            changes += usize::from(last.as_ref() != Some(&curve));
            last = Some(curve);
            misses = cache.misses;
        }
        assert!(changes > 1 && misses > hits, "the hour moves the curve ({changes} changes)");
    }

    #[test]
    fn rows_predicted_together_equal_each_row_alone() {
        let model = LifetimeModel::load(default_dir()).unwrap();
        // The probes' rows, then variations of them (missing values, other sizes and times).
        let mut rows: Vec<Vec<f64>> = model.manifest().probes.iter().map(|p| p.row.clone()).collect();
        for i in 0..300 {
            let mut row = rows[i % model.manifest().probes.len()].clone();
            let at = i % row.len();
            row[at] = match i % 4 {
                0 => f64::NAN,
                1 => 0.0,
                2 => row[at] * 1.5 + 1.0,
                _ => (i as f64).ln(),
            };
            rows.push(row);
        }
        let matrix: Vec<f64> = rows.iter().flatten().copied().collect();
        let (mut p_long, mut lifetime) = (vec![f64::NAN; rows.len()], vec![f64::NAN; rows.len()]);
        model.p_long_rows(&matrix, &mut p_long);
        model.expected_lifetime_rows(&matrix, &mut lifetime);
        for (i, row) in rows.iter().enumerate() {
            let alone = model.predict_row(row, false);
            assert_eq!(p_long[i].to_bits(), alone.p_long.to_bits(), "row {i}");
            assert_eq!(lifetime[i].to_bits(), alone.expected_lifetime_s.to_bits(), "row {i}");
        }
    }

    #[test]
    fn a_fifo_is_refused_at_once_instead_of_waiting_for_a_writer() {
        let temp = tempfile::tempdir().unwrap();
        let root = canonical_root(temp.path()).unwrap();
        let fifo = temp.path().join("model.txt");
        mkfifo(&fifo);
        let started = Instant::now();
        let error = read_confined(&fifo, &root, 1 << 20).expect_err("a FIFO is not read");
        assert!(matches!(error, BundleError::NotRegularFile { kind: "FIFO", .. }), "{error}");
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn devices_and_directories_are_not_regular_files() {
        let dev = canonical_root(Path::new("/dev")).unwrap();
        let error = read_confined(Path::new("/dev/zero"), &dev, 1 << 20).expect_err("a device is not read");
        assert!(matches!(error, BundleError::NotRegularFile { kind: "character device", .. }), "{error}");
        let temp = tempfile::tempdir().unwrap();
        let root = canonical_root(temp.path()).unwrap();
        std::fs::create_dir(temp.path().join("sub")).unwrap();
        let error = read_confined(&temp.path().join("sub"), &root, 1 << 20).expect_err("a directory is not read");
        assert!(matches!(error, BundleError::NotRegularFile { kind: "directory", .. }), "{error}");
    }

    #[test]
    fn symlinks_are_followed_only_inside_the_root() {
        let temp = tempfile::tempdir().unwrap();
        let root_dir = temp.path().join("models");
        std::fs::create_dir(&root_dir).unwrap();
        let root = canonical_root(&root_dir).unwrap();
        std::fs::write(root_dir.join("inside.txt"), "inside").unwrap();
        std::fs::write(temp.path().join("outside.txt"), "outside").unwrap();
        std::os::unix::fs::symlink(root_dir.join("inside.txt"), root_dir.join("to-inside")).unwrap();
        std::os::unix::fs::symlink(temp.path().join("outside.txt"), root_dir.join("to-outside")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", root_dir.join("to-zero")).unwrap();
        assert_eq!(read_confined(&root_dir.join("to-inside"), &root, 100).unwrap(), b"inside");
        for link in ["to-outside", "to-zero"] {
            let error = read_confined(&root_dir.join(link), &root, 100).expect_err("leaves the root");
            assert!(matches!(error, BundleError::OutsideRoot { .. }), "{link}: {error}");
        }
    }

    #[test]
    fn files_over_the_limit_are_refused_by_size_and_while_reading() {
        let temp = tempfile::tempdir().unwrap();
        let root = canonical_root(temp.path()).unwrap();
        let path = temp.path().join("big.txt");
        std::fs::write(&path, vec![b'x'; 101]).unwrap();
        assert!(matches!(read_confined(&path, &root, 100), Err(BundleError::TooLarge { limit: 100, .. })));
        assert_eq!(read_confined(&path, &root, 101).unwrap().len(), 101);
        // A sparse file far over the limit is refused from its size, without reading it.
        let sparse = temp.path().join("sparse.txt");
        std::fs::File::create(&sparse).unwrap().set_len(1 << 40).unwrap();
        assert!(matches!(read_confined(&sparse, &root, 1 << 20), Err(BundleError::TooLarge { .. })));
        // /proc files claim a size of 0 and have more: only the bounded read catches them, as it
        // catches a file that grows after its size was checked.
        let proc_root = canonical_root(Path::new("/proc")).unwrap();
        let status = Path::new("/proc/self/status");
        assert_eq!(std::fs::metadata(status).unwrap().len(), 0);
        assert!(matches!(read_confined(status, &proc_root, 16), Err(BundleError::TooLarge { limit: 16, .. })));
    }

    #[test]
    fn every_loaded_file_is_covered_by_its_checksum() {
        let (_temp, dir) = default_copy();
        LifetimeModel::load(&dir).expect("an intact copy loads");
        assert!(dir.join(SURVIVAL_MODEL_FILE).exists(), "the default bundle has a survival model");
        for file in CHECKSUMMED_FILES.into_iter().chain([SURVIVAL_MODEL_FILE]) {
            let path = dir.join(file);
            let original = std::fs::read(&path).unwrap();
            // Trailing whitespace: the file still parses the same, so only the checksum can tell.
            let mut edited = original.clone();
            edited.push(b'\n');
            std::fs::write(&path, &edited).unwrap();
            let error = LifetimeModel::load(&dir).err().expect("an edited file is refused");
            assert!(matches!(&error, BundleError::ChecksumMismatch { file: found, .. } if *found == file), "{error}");
            std::fs::write(&path, &original).unwrap();
        }
        LifetimeModel::load(&dir).expect("restored, it loads again");
    }

    #[test]
    fn a_missing_checksum_refuses_the_bundle_until_it_is_sealed() {
        let (_temp, dir) = default_copy();
        let path = dir.join(MANIFEST_FILE);
        let mut manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        manifest["checksums"].as_object_mut().unwrap().remove(MULTICLASS_MODEL_FILE);
        std::fs::write(&path, serde_json::to_vec_pretty(&manifest).unwrap()).unwrap();
        let error = LifetimeModel::load(&dir).err().expect("refused");
        assert!(matches!(error, BundleError::MissingChecksum { file: MULTICLASS_MODEL_FILE }), "{error}");
        let sealed = seal(&dir, &LoadLimits::default()).unwrap();
        assert_eq!(sealed.checksums.len(), CHECKSUMMED_FILES.len() + 1, "the survival model's too");
        LifetimeModel::load(&dir).expect("sealed, it loads");
    }

    #[test]
    fn sealing_changes_only_the_checksums_member() {
        let checksums: BTreeMap<String, String> =
            [("a.txt".to_owned(), "00ff".to_owned()), ("b.json".to_owned(), "11".to_owned())].into();
        let appended =
            with_checksums("{\n  \"x\": \"a}\\\"{,\",\n  \"y\": [1.0000000000000002, {\"z\": 1}]\n}", &checksums)
                .unwrap();
        let value: serde_json::Value = serde_json::from_str(&appended).unwrap();
        assert_eq!(value["checksums"]["a.txt"], "00ff");
        assert_eq!(value["x"], "a}\"{,");
        assert!(appended.contains("1.0000000000000002"), "{appended}");
        let replaced = with_checksums(&appended.replace("00ff", "dead"), &checksums).unwrap();
        assert_eq!(replaced, appended);
        let only: serde_json::Value = serde_json::from_str(&with_checksums("{}", &checksums).unwrap()).unwrap();
        assert_eq!(only["checksums"]["b.json"], "11");
        assert!(with_checksums("[1, 2]", &checksums).is_none());
        assert!(with_checksums("{\"unterminated\": [", &checksums).is_none());
    }

    fn default_bundle() -> LifetimeModel {
        let dir = default_dir();
        LifetimeModel::load(&dir).unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
    }

    /// The default bundle without its survival model: remaining lifetimes from the regression,
    /// as a bundle trained with `--survival-reading regression` (or before survival) reads them.
    fn regression_bundle() -> LifetimeModel {
        let model = default_bundle();
        assert!(model.survival.is_some(), "the default bundle has a survival model");
        model.without_survival()
    }

    /// Repredicting a VM every `step` seconds of uptime (every second for the first 1,000), reusing
    /// the last evaluation while the uptime stays in its constant range, gives bit for bit what
    /// evaluating every time gives.
    #[test]
    fn remaining_predictions_are_constant_over_their_uptime_ranges() {
        let model = regression_bundle();
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
        let model = regression_bundle();
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
