//! The models directory and what is deployed from it.
//!
//! Every sub-directory with a `manifest.json` is a bundle. A changed bundle is loaded and validated
//! by `LifetimeModel::load_with` (bounded reads of regular files that stay inside the models
//! directory, checksums, schema hash, probe predictions) before it can serve; a bad one is logged and
//! recorded as rejected with its reason, and whatever served before keeps serving.
//!
//! Nothing a request handler calls waits on the disk. Scans ([`Registry::refresh`]) run on the
//! caller's (blocking) thread and each bundle loads on a thread of its own: a scan waits for a load
//! at most [`RegistryOptions::load_timeout`], then goes on without it (the bundle is listed as
//! `loading`, a later scan collects its outcome, and no second load of it starts meanwhile), so a
//! bundle whose read hangs (a hung network mount) cannot stall the others. Handlers only read
//! snapshots that each scan publishes whole ([`Registry::deployment`], [`Registry::statuses`],
//! [`Registry::rollout`]), never the scan's own state.
//!
//! Which bundle serves: `rollout.toml` in the models directory may name the `stable` bundle and a
//! `canary` with its traffic share; without a stable entry the newest valid bundle (by creation time)
//! serves. The admin API edits the same file, so promotions and rollbacks by API and by file are one
//! mechanism. A new [`Deployment`] is swapped in atomically; a request holds the `Arc` of the
//! deployment it started with, so requests in flight finish on the old models.

use crate::bundle::{canonical_root, read_confined, BundleError, LoadLimits, LoadOptions, MANIFEST_FILE};
use crate::LifetimeModel;
use arc_swap::{ArcSwap, ArcSwapOption};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

pub const ROLLOUT_FILE: &str = "rollout.toml";
/// Largest rollout file read, in bytes (a real one is a few lines).
const MAX_ROLLOUT_BYTES: u64 = 64 << 10;

/// How the registry reads bundles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegistryOptions {
    /// Size limits of bundle files.
    pub limits: LoadLimits,
    /// How long a scan waits for one bundle's load before going on without it.
    pub load_timeout: Duration,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        RegistryOptions { limits: LoadLimits::default(), load_timeout: Duration::from_secs(30) }
    }
}

/// The rollout file: which bundle is stable, and which is the canary with what share of traffic.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rollout {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanarySpec>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CanarySpec {
    /// Bundle directory name.
    pub bundle: String,
    /// Share of traffic in (0, 1], chosen by a stable hash of each instance's routing key.
    pub share: f64,
    /// Let the control service promote or roll back the canary by its realized quality: promoted
    /// when its realized average precision is no worse than the stable model's by more than
    /// `margin` over at least `min_resolved` resolved VMs each, rolled back when it is worse.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub auto: bool,
    /// Resolved VMs each side needs first (the control service's `[quality] min_resolved` when
    /// absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub min_resolved: Option<u64>,
    /// In [0, 1]; 0.02 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0, maximum = 1.0))]
    pub margin: Option<f64>,
}

/// Margin of an `auto` canary that names none.
pub const DEFAULT_CANARY_MARGIN: f64 = 0.02;

/// An `auto` canary's criteria, as `GET /v1/models` shows them on the canary.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AutoCanary {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_resolved: Option<u64>,
    pub margin: f64,
}

impl CanarySpec {
    /// Its share, margin and `min_resolved` are in range.
    pub fn check(&self) -> Result<(), String> {
        if !(self.share > 0.0 && self.share <= 1.0) {
            return Err(format!("canary share must be in (0, 1], got {}", self.share));
        }
        if let Some(margin) = self.margin.filter(|m| !(0.0..=1.0).contains(m)) {
            return Err(format!("canary margin must be in [0, 1], got {margin}"));
        }
        if self.min_resolved == Some(0) {
            return Err("canary min_resolved must be at least 1".to_owned());
        }
        Ok(())
    }

    /// Its criteria, when it is to be judged automatically.
    pub fn auto(&self) -> Option<AutoCanary> {
        self.auto.then(|| AutoCanary {
            min_resolved: self.min_resolved,
            margin: self.margin.unwrap_or(DEFAULT_CANARY_MARGIN),
        })
    }
}

/// The models serving right now.
pub struct Deployment {
    pub stable_name: String,
    pub stable: Arc<LifetimeModel>,
    pub canary: Option<(String, Arc<LifetimeModel>, f64)>,
}

impl Deployment {
    /// The model for a routing key: the canary for a stable `share` of keys, else the stable one.
    pub fn route(&self, key: &str) -> &Arc<LifetimeModel> {
        match &self.canary {
            Some((_, model, share)) if unit_hash(key) < *share => model,
            _ => &self.stable,
        }
    }
}

/// The canary routing hash lives beside the routing key in `domain`, where the control service's
/// cache reads it too.
pub use domain::inference::unit_hash;

/// What the registry knows of one bundle directory.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BundleStatus {
    pub bundle: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// `stable`, `canary`, `available`, `rejected`, or `loading` (a load still running after the
    /// load timeout; a later scan collects its outcome).
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub canary_share: Option<f64>,
    /// The canary's criteria when the rollout lets the control service judge it (`auto = true`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto: Option<AutoCanary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_unix_s: Option<u64>,
    /// Why the bundle was rejected, or how long it has been loading.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no valid bundle in {0}")]
    NoBundle(PathBuf),
    #[error("unknown or invalid bundle `{0}`")]
    UnknownBundle(String),
    #[error("{0}")]
    Invalid(String),
}

/// Names, kinds, modification times and sizes of a bundle's entries: a cheap change detector.
type Fingerprint = Vec<(String, &'static str, Option<SystemTime>, u64)>;

/// What a bundle's load thread hands back: the model, or why it was refused.
type LoadOutcome = Result<LifetimeModel, String>;

/// Loads one bundle directory; the registry's own reads it with its options, tests swap in others.
type Loader = Arc<dyn Fn(&Path) -> Result<LifetimeModel, BundleError> + Send + Sync>;

/// A bundle load running on its own thread.
struct PendingLoad {
    fingerprint: Fingerprint,
    started: Instant,
    outcome: Receiver<LoadOutcome>,
    /// Whether the overrun was logged already (once per load).
    reported: bool,
}

/// The scanner's state; only [`Registry::refresh`] touches it.
#[derive(Default)]
struct ScanState {
    loaded: HashMap<String, (Fingerprint, Arc<LifetimeModel>)>,
    rejected: HashMap<String, (Fingerprint, String)>,
    loading: HashMap<String, PendingLoad>,
    rollout: Rollout,
    rollout_fingerprint: Option<(Option<SystemTime>, u64)>,
}

/// What request handlers read, replaced whole after every scan.
#[derive(Default)]
struct Published {
    statuses: Vec<BundleStatus>,
    rollout: Rollout,
    /// Bundles that loaded and validated, which a rollout may name.
    loaded: Vec<String>,
}

pub struct Registry {
    dir: PathBuf,
    options: RegistryOptions,
    loader: Loader,
    current: ArcSwapOption<Deployment>,
    published: ArcSwap<Published>,
    scan: Mutex<ScanState>,
    /// Loaded bundles dropped so far (removed from the directory, or replaced by a changed copy).
    retired: AtomicU64,
}

fn entry_kind(file_type: std::fs::FileType) -> &'static str {
    if file_type.is_file() {
        "file"
    } else if file_type.is_dir() {
        "dir"
    } else {
        "other"
    }
}

fn fingerprint(dir: &Path) -> Fingerprint {
    let mut files: Fingerprint = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            // Through symlinks, so that a changed link target counts as a change; `stat` never
            // blocks on a FIFO.
            let meta = std::fs::metadata(entry.path()).or_else(|_| entry.metadata()).ok()?;
            Some((
                entry.file_name().to_string_lossy().into_owned(),
                entry_kind(meta.file_type()),
                meta.modified().ok(),
                meta.len(),
            ))
        })
        .collect();
    files.sort();
    files
}

impl Registry {
    /// A registry of `dir` with the default options, with nothing loaded yet; call
    /// [`Registry::refresh`].
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self::with_options(dir, RegistryOptions::default())
    }

    /// A registry of `dir` reading bundles with `options`; nothing is loaded until
    /// [`Registry::refresh`].
    pub fn with_options(dir: impl Into<PathBuf>, options: RegistryOptions) -> Self {
        let dir = dir.into();
        // Bundle files must stay inside the models directory (symlinks included).
        let load_options = LoadOptions { limits: options.limits, confine_to: Some(dir.clone()) };
        let loader: Loader = Arc::new(move |bundle: &Path| LifetimeModel::load_with(bundle, &load_options));
        Self::with_loader(dir, options, loader)
    }

    fn with_loader(dir: PathBuf, options: RegistryOptions, loader: Loader) -> Self {
        Registry {
            dir,
            options,
            loader,
            current: ArcSwapOption::empty(),
            published: ArcSwap::from_pointee(Published::default()),
            scan: Mutex::new(ScanState::default()),
            retired: AtomicU64::new(0),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn options(&self) -> &RegistryOptions {
        &self.options
    }

    /// How many loaded bundles were dropped since the start (removed from the directory, or
    /// replaced by a changed copy). A service that sees it grow can give the freed memory back to
    /// the operating system once the requests that still held the old model are done.
    pub fn retired(&self) -> u64 {
        self.retired.load(Ordering::Relaxed)
    }

    /// The deployment serving now, if any bundle is valid. Never waits.
    pub fn deployment(&self) -> Option<Arc<Deployment>> {
        self.current.load_full()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ScanState> {
        // A panic while holding the lock cannot leave the state half-updated in a harmful way:
        // every field is replaced whole. Keep serving.
        self.scan.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Rescans the directory, (re)loads changed bundles and swaps the deployment if it changed.
    /// Returns whether it did. Blocks on the disk (call it from a blocking thread), but waits for
    /// each load at most the load timeout.
    pub fn refresh(&self) -> Result<bool, RegistryError> {
        let mut state = self.lock();
        let result = self.scan(&mut state);
        self.publish(&state);
        result
    }

    fn scan(&self, state: &mut ScanState) -> Result<bool, RegistryError> {
        let entries =
            std::fs::read_dir(&self.dir).map_err(|source| RegistryError::Io { path: self.dir.clone(), source })?;
        let mut present = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            // A hidden directory is a bundle being copied in (renamed into place when whole).
            if name.starts_with('.') || !path.join(MANIFEST_FILE).is_file() {
                continue;
            }
            let print = fingerprint(&path);
            present.push(name.clone());
            let unchanged = state.loaded.get(&name).is_some_and(|(p, _)| *p == print)
                || state.rejected.get(&name).is_some_and(|(p, _)| *p == print);
            // A load of this bundle still running from an earlier scan: collected below, never doubled.
            if unchanged || state.loading.contains_key(&name) {
                continue;
            }
            match self.start_load(&name, path) {
                Ok(outcome) => {
                    let pending = PendingLoad { fingerprint: print, started: Instant::now(), outcome, reported: false };
                    state.loading.insert(name, pending);
                }
                Err(reason) => self.record(state, name, print, Err(reason)),
            }
        }
        // Loads of bundles that disappeared are abandoned (their threads finish into the void).
        state.loading.retain(|name, _| present.contains(name));
        self.collect_loads(state);
        let before = state.loaded.len();
        state.loaded.retain(|name, _| present.contains(name));
        self.retired.fetch_add((before - state.loaded.len()) as u64, Ordering::Relaxed);
        state.rejected.retain(|name, _| present.contains(name));
        self.read_rollout(state);
        self.redeploy(state)
    }

    /// Starts loading the bundle at `path` on a thread of its own.
    fn start_load(&self, name: &str, path: PathBuf) -> Result<Receiver<LoadOutcome>, String> {
        let (sender, receiver) = mpsc::sync_channel(1);
        let loader = Arc::clone(&self.loader);
        std::thread::Builder::new()
            .name(format!("load-{name}"))
            .spawn(move || {
                let outcome = loader(&path).map_err(|error| error.to_string());
                // The scan may have given up on this bundle; then nobody wants the outcome.
                let _ = sender.send(outcome);
            })
            .map(|_| receiver)
            .map_err(|error| format!("could not start loading the bundle: {error}"))
    }

    /// Waits for the running loads until the load timeout (counted from now) and records those that
    /// finished; the others are left running for a later scan.
    fn collect_loads(&self, state: &mut ScanState) {
        let deadline = Instant::now() + self.options.load_timeout;
        let mut names: Vec<String> = state.loading.keys().cloned().collect();
        names.sort();
        for name in names {
            let Some(pending) = state.loading.get_mut(&name) else { continue };
            let outcome = match pending.outcome.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(outcome) => outcome,
                Err(RecvTimeoutError::Disconnected) => Err("the bundle's load panicked".to_owned()),
                Err(RecvTimeoutError::Timeout) => {
                    if !pending.reported {
                        pending.reported = true;
                        metrics::counter!("inference_bundle_load_overruns_total").increment(1);
                        tracing::warn!(
                            bundle = %name,
                            timeout = ?self.options.load_timeout,
                            "bundle load still running after the load timeout (a read that blocks?); \
                             the scan goes on without it and a later scan collects its outcome"
                        );
                    }
                    continue;
                }
            };
            if let Some(pending) = state.loading.remove(&name) {
                self.record(state, name, pending.fingerprint, outcome);
            }
        }
    }

    fn record(&self, state: &mut ScanState, name: String, print: Fingerprint, outcome: LoadOutcome) {
        match outcome {
            Ok(model) => {
                tracing::info!(bundle = %name, version = %model.version(), "bundle loaded and validated");
                state.rejected.remove(&name);
                if state.loaded.insert(name, (print, Arc::new(model))).is_some() {
                    self.retired.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(reason) => {
                tracing::warn!(bundle = %name, error = %reason, "bundle rejected; whatever served before keeps serving");
                metrics::counter!("inference_bundle_rejections_total").increment(1);
                state.rejected.insert(name, (print, reason));
            }
        }
    }

    fn read_rollout(&self, state: &mut ScanState) {
        let path = self.dir.join(ROLLOUT_FILE);
        let stat = || std::fs::metadata(&path).ok().map(|m| (m.modified().ok(), m.len()));
        let print = stat();
        if print == state.rollout_fingerprint {
            return;
        }
        if print.is_none() {
            state.rollout_fingerprint = None;
            state.rollout = Rollout::default();
            return;
        }
        // Like a bundle file: a regular file inside the models directory, of bounded size.
        let text = canonical_root(&self.dir).and_then(|root| read_confined(&path, &root, MAX_ROLLOUT_BYTES));
        if stat() != print {
            return; // being written right now: read it on the next scan
        }
        state.rollout_fingerprint = print;
        let parsed = text
            .map_err(|error| error.to_string())
            .and_then(|bytes| String::from_utf8(bytes).map_err(|error| error.to_string()))
            .and_then(|text| toml::from_str::<Rollout>(&text).map_err(|error| error.to_string()))
            .and_then(|rollout| match &rollout.canary {
                Some(canary) => canary.check().map(|()| rollout),
                None => Ok(rollout),
            });
        match parsed {
            Ok(rollout) => state.rollout = rollout,
            Err(error) => {
                tracing::warn!(file = %path.display(), %error, "rollout file ignored; keeping the previous rollout")
            }
        }
    }

    fn redeploy(&self, state: &ScanState) -> Result<bool, RegistryError> {
        let current = self.current.load_full();
        let newest = || {
            state
                .loaded
                .iter()
                .max_by(|a, b| {
                    let key = |m: &LifetimeModel| m.manifest().created_unix_s;
                    key(&a.1 .1).cmp(&key(&b.1 .1)).then_with(|| a.0.cmp(b.0))
                })
                .map(|(name, (_, model))| (name.clone(), Arc::clone(model)))
        };
        let stable = match &state.rollout.stable {
            Some(name) => match state.loaded.get(name) {
                Some((_, model)) => Some((name.clone(), Arc::clone(model))),
                None => {
                    tracing::warn!(bundle = %name, "the rollout's stable bundle is missing or invalid; keeping the current one");
                    current.as_ref().map(|d| (d.stable_name.clone(), Arc::clone(&d.stable))).or_else(newest)
                }
            },
            None => newest(),
        };
        let Some((stable_name, stable)) = stable else {
            return if current.is_some() { Ok(false) } else { Err(RegistryError::NoBundle(self.dir.clone())) };
        };
        let canary = state.rollout.canary.as_ref().and_then(|spec| {
            let share = spec.share.clamp(0.0, 1.0);
            match state.loaded.get(&spec.bundle) {
                Some((_, model)) if spec.bundle != stable_name && share > 0.0 => {
                    Some((spec.bundle.clone(), Arc::clone(model), share))
                }
                _ => None,
            }
        });
        let same = current.as_ref().is_some_and(|d| {
            Arc::ptr_eq(&d.stable, &stable)
                && match (&d.canary, &canary) {
                    (None, None) => true,
                    (Some((_, a, sa)), Some((_, b, sb))) => Arc::ptr_eq(a, b) && sa == sb,
                    _ => false,
                }
        });
        if same {
            return Ok(false);
        }
        tracing::info!(
            stable = %stable_name,
            version = %stable.version(),
            canary = ?canary.as_ref().map(|(n, m, s)| format!("{n} ({}) at {s}", m.version())),
            "deployment swapped"
        );
        metrics::gauge!("inference_canary_share").set(canary.as_ref().map_or(0.0, |c| c.2));
        self.current.store(Some(Arc::new(Deployment { stable_name, stable, canary })));
        Ok(true)
    }

    /// The rollout as of the last scan. Never waits.
    pub fn rollout(&self) -> Rollout {
        self.published.load().rollout.clone()
    }

    /// Writes a new rollout file (atomically) and applies it.
    pub fn set_rollout(&self, rollout: &Rollout) -> Result<(), RegistryError> {
        {
            let published = self.published.load();
            for name in rollout.stable.iter().chain(rollout.canary.as_ref().map(|c| &c.bundle)) {
                if !published.loaded.contains(name) {
                    return Err(RegistryError::UnknownBundle(name.clone()));
                }
            }
        }
        if let Some(canary) = &rollout.canary {
            canary.check().map_err(RegistryError::Invalid)?;
        }
        let text = toml::to_string(rollout).map_err(|e| RegistryError::Invalid(e.to_string()))?;
        let path = self.dir.join(ROLLOUT_FILE);
        let tmp = self.dir.join(format!(".{ROLLOUT_FILE}.tmp"));
        let io = |source| RegistryError::Io { path: path.clone(), source };
        std::fs::write(&tmp, text).map_err(io)?;
        std::fs::rename(&tmp, &path).map_err(io)?;
        self.refresh()?;
        Ok(())
    }

    /// Every bundle directory with its state, as of the last scan. Never waits.
    pub fn statuses(&self) -> Vec<BundleStatus> {
        self.published.load().statuses.clone()
    }

    /// Publishes what handlers read: the statuses against the current deployment, and the rollout.
    fn publish(&self, state: &ScanState) {
        let statuses = self.compute_statuses(state);
        let loaded = state.loaded.keys().cloned().collect();
        self.published.store(Arc::new(Published { statuses, rollout: state.rollout.clone(), loaded }));
    }

    fn compute_statuses(&self, state: &ScanState) -> Vec<BundleStatus> {
        let deployment = self.current.load_full();
        let rollout = &state.rollout;
        let mut statuses: Vec<BundleStatus> = state
            .loaded
            .iter()
            .map(|(name, (_, model))| {
                let (state, canary_share) = match &deployment {
                    Some(d) if d.stable_name == *name => ("stable", None),
                    Some(d) if d.canary.as_ref().is_some_and(|c| c.0 == *name) => {
                        ("canary", d.canary.as_ref().map(|c| c.2))
                    }
                    _ => ("available", None),
                };
                let auto = rollout
                    .canary
                    .as_ref()
                    .filter(|canary| state == "canary" && canary.bundle == *name)
                    .and_then(CanarySpec::auto);
                BundleStatus {
                    bundle: name.clone(),
                    version: Some(model.version().to_owned()),
                    state: state.to_owned(),
                    canary_share,
                    auto,
                    created_unix_s: Some(model.manifest().created_unix_s),
                    reason: None,
                }
            })
            .collect();
        statuses.extend(state.rejected.iter().map(|(name, (_, reason))| BundleStatus {
            bundle: name.clone(),
            version: None,
            state: "rejected".to_owned(),
            canary_share: None,
            auto: None,
            created_unix_s: None,
            reason: Some(reason.clone()),
        }));
        statuses.extend(state.loading.iter().map(|(name, pending)| BundleStatus {
            bundle: name.clone(),
            version: None,
            state: "loading".to_owned(),
            canary_share: None,
            auto: None,
            created_unix_s: None,
            reason: Some(format!("loading for at least {:.0} s", pending.started.elapsed().as_secs_f64())),
        }));
        statuses.sort_by(|a, b| a.bundle.cmp(&b.bundle).then_with(|| a.state.cmp(&b.state)));
        statuses
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Condvar;

    /// A models directory with copies of the default bundle under `names`.
    fn models_with(names: &[&str]) -> tempfile::TempDir {
        let models = tempfile::tempdir().unwrap();
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/default");
        for name in names {
            let bundle = models.path().join(name);
            std::fs::create_dir(&bundle).unwrap();
            crate::bundle::copy_bundle(&source, &bundle).unwrap();
        }
        models
    }

    /// A gate that holds the loads of one bundle until it is opened, as a hung mount would.
    #[derive(Default)]
    struct Gate {
        open: Mutex<bool>,
        opened: Condvar,
        calls: Mutex<usize>,
    }

    impl Gate {
        fn wait(&self) {
            *self.calls.lock().unwrap() += 1;
            let mut open = self.open.lock().unwrap();
            while !*open {
                open = self.opened.wait(open).unwrap();
            }
        }

        fn open(&self) {
            *self.open.lock().unwrap() = true;
            self.opened.notify_all();
        }
    }

    fn gated_registry(dir: &Path, gate: &Arc<Gate>, timeout: Duration) -> Arc<Registry> {
        let gate = Arc::clone(gate);
        let loader: Loader = Arc::new(move |bundle: &Path| {
            if bundle.ends_with("stuck") {
                gate.wait();
            }
            LifetimeModel::load(bundle)
        });
        let options = RegistryOptions { load_timeout: timeout, ..RegistryOptions::default() };
        Arc::new(Registry::with_loader(dir.to_owned(), options, loader))
    }

    fn state_of(registry: &Registry, bundle: &str) -> Vec<String> {
        registry.statuses().into_iter().filter(|s| s.bundle == bundle).map(|s| s.state).collect()
    }

    /// A bundle whose load hangs delays a scan by at most the load timeout, the other bundle serves,
    /// later scans neither wait for it again nor start a second load, and its outcome is collected
    /// once the load finishes.
    #[test]
    fn a_hanging_bundle_load_does_not_stall_scans() {
        let models = models_with(&["good", "stuck"]);
        let gate = Arc::new(Gate::default());
        // Long enough for the good bundle's load on a loaded machine (300 ms once was not); the
        // stuck one never finishes until the gate opens, so any bound below forever shows the point.
        let registry = gated_registry(models.path(), &gate, Duration::from_secs(2));

        let started = Instant::now();
        registry.refresh().expect("the good bundle deploys");
        assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());
        assert_eq!(registry.deployment().expect("deployed").stable_name, "good");
        assert_eq!(state_of(&registry, "stuck"), ["loading"]);

        let started = Instant::now();
        registry.refresh().unwrap();
        assert!(started.elapsed() < Duration::from_secs(20));
        assert_eq!(*gate.calls.lock().unwrap(), 1, "no second load of a bundle still loading");

        gate.open();
        let deadline = Instant::now() + Duration::from_secs(20);
        while state_of(&registry, "stuck") == ["loading"] {
            assert!(Instant::now() < deadline, "the finished load was never collected");
            registry.refresh().unwrap();
        }
        // Same creation time as `good`, later name: it is the newest bundle now, and serves.
        assert_eq!(state_of(&registry, "stuck"), ["stable"]);
    }

    /// While a scan waits on a load, what handlers call answers at once.
    #[test]
    fn handlers_never_wait_for_a_scan() {
        let models = models_with(&["good"]);
        let gate = Arc::new(Gate::default());
        let registry = gated_registry(models.path(), &gate, Duration::from_secs(60));
        registry.refresh().unwrap();
        copy_dir(&models.path().join("good"), &models.path().join("stuck"));
        let scanning = {
            let registry = Arc::clone(&registry);
            std::thread::spawn(move || registry.refresh())
        };
        while *gate.calls.lock().unwrap() == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        let started = Instant::now();
        assert_eq!(registry.deployment().expect("still deployed").stable_name, "good");
        assert!(registry.statuses().iter().any(|s| s.bundle == "good"));
        assert_eq!(registry.rollout(), Rollout::default());
        assert!(started.elapsed() < Duration::from_millis(500), "{:?}", started.elapsed());
        assert!(!scanning.is_finished(), "the scan is still waiting on the load");
        gate.open();
        scanning.join().unwrap().unwrap();
        assert_eq!(state_of(&registry, "stuck"), ["stable"]);
    }

    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }

    /// A rollout file that is not a regular file is ignored without blocking the scan.
    #[test]
    fn a_fifo_rollout_file_is_ignored() {
        let models = models_with(&["good"]);
        let status = std::process::Command::new("mkfifo").arg(models.path().join(ROLLOUT_FILE)).status().unwrap();
        assert!(status.success());
        let registry = Registry::new(models.path());
        let started = Instant::now();
        registry.refresh().unwrap();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(registry.rollout(), Rollout::default());
    }

    /// A bundle being copied in under a hidden name is not loaded until it is renamed into place.
    #[test]
    fn a_hidden_directory_is_never_loaded() {
        let models = models_with(&["good", ".incoming"]);
        let registry = Registry::new(models.path());
        registry.refresh().unwrap();
        assert!(registry.statuses().iter().all(|s| s.bundle != ".incoming"), "{:?}", registry.statuses());
        std::fs::rename(models.path().join(".incoming"), models.path().join("new")).unwrap();
        registry.refresh().unwrap();
        assert!(registry.statuses().iter().any(|s| s.bundle == "new"));
    }

    /// A bundle removed from the directory, or replaced by a changed copy, counts as retired (the
    /// services give its memory back then); a scan that changes nothing does not.
    #[test]
    fn dropped_bundles_count_as_retired() {
        let models = models_with(&["good", "old"]);
        let registry = Registry::new(models.path());
        registry.refresh().unwrap();
        registry.refresh().unwrap();
        assert_eq!(registry.retired(), 0);
        std::fs::remove_dir_all(models.path().join("old")).unwrap();
        registry.refresh().unwrap();
        assert_eq!(registry.retired(), 1);
        // A changed copy under the same name: the loaded model it replaces is dropped.
        let manifest = models.path().join("good").join(MANIFEST_FILE);
        let text = std::fs::read_to_string(&manifest).unwrap();
        std::fs::write(&manifest, format!("{text} ")).unwrap();
        registry.refresh().unwrap();
        assert_eq!(registry.statuses().iter().filter(|s| s.bundle == "good").count(), 1);
        assert_eq!(registry.retired(), 2);
    }
}
