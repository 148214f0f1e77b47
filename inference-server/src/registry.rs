//! The models directory and what is deployed from it.
//!
//! Every sub-directory with a `manifest.json` is a bundle. A changed bundle is loaded and validated
//! by `LifetimeModel::load` (parses, schema hash matches, probe predictions reproduce) before it can
//! serve; a bad one is logged and recorded as rejected, and whatever served before keeps serving.
//!
//! Which bundle serves: `rollout.toml` in the models directory may name the `stable` bundle and a
//! `canary` with its traffic share; without a stable entry the newest valid bundle (by creation time)
//! serves. The admin API edits the same file, so promotions and rollbacks by API and by file are one
//! mechanism. A new [`Deployment`] is swapped in atomically; a request holds the `Arc` of the
//! deployment it started with, so requests in flight finish on the old models.

use arc_swap::ArcSwapOption;
use lifetime_model::{bundle::MANIFEST_FILE, LifetimeModel};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

pub const ROLLOUT_FILE: &str = "rollout.toml";

/// The rollout file: which bundle is stable, and which is the canary with what share of traffic.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rollout {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanarySpec>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CanarySpec {
    /// Bundle directory name.
    pub bundle: String,
    /// Share of traffic in (0, 1], chosen by a stable hash of each instance's routing key.
    pub share: f64,
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

/// FNV-1a of `key`, mapped onto [0, 1): the same key always lands on the same side.
pub fn unit_hash(key: &str) -> f64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    // Finalise (splitmix64) so that keys differing only at the end still spread evenly.
    hash ^= hash >> 30;
    hash = hash.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash ^= hash >> 27;
    hash = hash.wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^= hash >> 31;
    (hash >> 11) as f64 / (1u64 << 53) as f64
}

/// What the registry knows of one bundle directory.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct BundleStatus {
    pub bundle: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// `stable`, `canary`, `available` or `rejected`.
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub canary_share: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_unix_s: Option<u64>,
    /// Why the bundle was rejected.
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

/// Modification times and sizes of a bundle's files: a cheap change detector.
type Fingerprint = Vec<(String, Option<SystemTime>, u64)>;

#[derive(Default)]
struct ScanState {
    loaded: HashMap<String, (Fingerprint, Arc<LifetimeModel>)>,
    rejected: HashMap<String, (Fingerprint, String)>,
    rollout: Rollout,
    rollout_fingerprint: Option<(Option<SystemTime>, u64)>,
}

pub struct Registry {
    dir: PathBuf,
    current: ArcSwapOption<Deployment>,
    state: Mutex<ScanState>,
}

fn fingerprint(dir: &Path) -> Fingerprint {
    let mut files: Fingerprint = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let meta = entry.metadata().ok()?;
            meta.is_file().then(|| (entry.file_name().to_string_lossy().into_owned(), meta.modified().ok(), meta.len()))
        })
        .collect();
    files.sort();
    files
}

impl Registry {
    /// A registry of `dir`, with nothing loaded yet; call [`Registry::refresh`].
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Registry { dir: dir.into(), current: ArcSwapOption::empty(), state: Mutex::new(ScanState::default()) }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The deployment serving now, if any bundle is valid.
    pub fn deployment(&self) -> Option<Arc<Deployment>> {
        self.current.load_full()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ScanState> {
        // A panic while holding the lock cannot leave the state half-updated in a harmful way:
        // every field is replaced whole. Keep serving.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Rescans the directory, (re)loads changed bundles and swaps the deployment if it changed.
    /// Returns whether it did.
    pub fn refresh(&self) -> Result<bool, RegistryError> {
        let mut state = self.lock();
        let entries =
            std::fs::read_dir(&self.dir).map_err(|source| RegistryError::Io { path: self.dir.clone(), source })?;
        let mut present = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if !path.join(MANIFEST_FILE).is_file() {
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            let print = fingerprint(&path);
            present.push(name.clone());
            let unchanged = state.loaded.get(&name).is_some_and(|(p, _)| *p == print)
                || state.rejected.get(&name).is_some_and(|(p, _)| *p == print);
            if unchanged {
                continue;
            }
            match LifetimeModel::load(&path) {
                Ok(model) => {
                    tracing::info!(bundle = %name, version = %model.version(), "bundle loaded and validated");
                    state.rejected.remove(&name);
                    state.loaded.insert(name, (print, Arc::new(model)));
                }
                Err(error) => {
                    tracing::warn!(bundle = %name, %error, "bundle rejected; whatever served before keeps serving");
                    metrics::counter!("inference_bundle_rejections_total").increment(1);
                    state.rejected.insert(name, (print, error.to_string()));
                }
            }
        }
        state.loaded.retain(|name, _| present.contains(name));
        state.rejected.retain(|name, _| present.contains(name));
        self.read_rollout(&mut state);
        self.redeploy(&state)
    }

    fn read_rollout(&self, state: &mut ScanState) {
        let path = self.dir.join(ROLLOUT_FILE);
        let stat = || std::fs::metadata(&path).ok().map(|m| (m.modified().ok(), m.len()));
        let print = stat();
        if print == state.rollout_fingerprint {
            return;
        }
        let text = std::fs::read_to_string(&path);
        if stat() != print {
            return; // being written right now: read it on the next scan
        }
        state.rollout_fingerprint = print;
        match text {
            Err(_) => state.rollout = Rollout::default(),
            Ok(text) => match toml::from_str::<Rollout>(&text) {
                Ok(rollout) => state.rollout = rollout,
                Err(error) => {
                    tracing::warn!(file = %path.display(), %error, "rollout file ignored; keeping the previous rollout")
                }
            },
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

    pub fn rollout(&self) -> Rollout {
        self.lock().rollout.clone()
    }

    /// Writes a new rollout file (atomically) and applies it.
    pub fn set_rollout(&self, rollout: &Rollout) -> Result<(), RegistryError> {
        {
            let state = self.lock();
            for name in rollout.stable.iter().chain(rollout.canary.as_ref().map(|c| &c.bundle)) {
                if !state.loaded.contains_key(name) {
                    return Err(RegistryError::UnknownBundle(name.clone()));
                }
            }
        }
        if let Some(canary) = &rollout.canary {
            if !(canary.share > 0.0 && canary.share <= 1.0) {
                return Err(RegistryError::Invalid(format!("canary share must be in (0, 1], got {}", canary.share)));
            }
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

    /// Every bundle directory with its state.
    pub fn statuses(&self) -> Vec<BundleStatus> {
        let state = self.lock();
        let deployment = self.current.load_full();
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
                BundleStatus {
                    bundle: name.clone(),
                    version: Some(model.version().to_owned()),
                    state: state.to_owned(),
                    canary_share,
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
            created_unix_s: None,
            reason: Some(reason.clone()),
        }));
        statuses.sort_by(|a, b| a.bundle.cmp(&b.bundle));
        statuses
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_hash_is_stable_and_spreads_evenly() {
        assert_eq!(unit_hash("vm-1"), unit_hash("vm-1"));
        let share = (0..20_000).filter(|i| unit_hash(&format!("vm-{i}")) < 0.1).count() as f64 / 20_000.0;
        assert!((share - 0.1).abs() < 0.01, "{share}");
    }
}
