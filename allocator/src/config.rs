//! Configuration of the allocator service (TOML, unknown fields refused). See `docs/allocator.md`.

use crate::store::StoreLocation;
use domain::{InventorySpec, Resources, ValidationLimits};
use placement::allocator::AllocatorConfig;
use placement::consolidation::ConsolidationConfig;
use serde::{Deserialize, Serialize};
use service_common::layers::LayerConfig;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// A homogeneous zone: `hosts` identical hosts in one cluster, `hosts_per_rack` to a rack. No hosts
/// (`hosts = 0`): a zone whose hosts all come while the allocator runs (`PUT /v1/hosts/{host_id}`,
/// a cloud's inventory: docs/openstack.md).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateConfig {
    #[serde(default = "default_zone")]
    pub zone: String,
    pub hosts: usize,
    #[serde(default = "default_hosts_per_rack")]
    pub hosts_per_rack: usize,
    pub cores: f64,
    pub memory_gib: f64,
    #[serde(default)]
    pub ssd_gib: f64,
}

fn default_zone() -> String {
    "zone-1".to_owned()
}

fn default_hosts_per_rack() -> usize {
    20
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceConfig {
    pub listen: SocketAddr,
    /// Where the durable state lives: the path of an SQLite file (created if missing; one allocator
    /// process at a time), or a PostgreSQL URL `postgres://user:password@host:port/database` (the
    /// schema is created if missing).
    pub store: StoreLocation,
    /// Bearer token of the admin routes (drain, fail, restore); they are closed without one. The
    /// environment variable `ALLOCATOR_ADMIN_TOKEN` overrides it.
    pub admin_token: Option<String>,
    /// The service credential: bearer token that every route but the probes, `/metrics` and
    /// `/openapi.json` requires (the control service presents it; the admin token passes too).
    /// Unset: those routes are open, and the allocator says so with a WARN at every start. The
    /// environment variable `ALLOCATOR_SERVICE_TOKEN` (or a file named by
    /// `ALLOCATOR_SERVICE_TOKEN_FILE`) overrides it.
    pub service_token: Option<String>,
    /// Accepted as well while the service token is rotated (docs/operations.md, "Service
    /// credentials"); `ALLOCATOR_PREVIOUS_SERVICE_TOKEN` overrides it.
    pub previous_service_token: Option<String>,
    /// Serve open routes (no service token) on an address other than loopback anyway; refused at start
    /// otherwise (secure by default). `--insecure-open` sets it.
    pub insecure_open: bool,
    /// Most commands per group commit; 1 commits every request on its own.
    pub max_batch: usize,
    /// The allocator's clock: `wall` (Unix time, the default) or `request`: the latest request time
    /// seen (`requested_at_s` of an allocation, `ended_at_s` of a release), for trace replays at
    /// compressed time, where NILAS's and LAVA's exit times must run on the trace's clock.
    pub clock: Clock,
    /// Most commands waiting for the worker; handlers wait for room beyond it (the HTTP layer's
    /// concurrency limit sheds load before that matters).
    pub queue: usize,
    /// Threads of the async runtime that serves HTTP; placement and commits run on the worker
    /// thread whatever this is.
    pub runtime_threads: usize,
    /// A TOML inventory file (`[[zones]]` > `[[zones.clusters]]` > `[[zones.clusters.racks]]` >
    /// `[[zones.clusters.racks.hosts]]`); exactly one of it and `[generate]`.
    pub inventory_file: Option<PathBuf>,
    /// A generated homogeneous zone.
    pub generate: Option<GenerateConfig>,
    /// Placement: policy, tie-breaking, engine, compatibility, reprediction refresh.
    pub allocator: AllocatorConfig,
    /// The inference server's models directory: NILAS and LAVA repredict remaining lifetimes with
    /// the deployed bundle's remaining-lifetime model, in process, following the same rollout
    /// (the stable bundle of `rollout.toml`, else the newest valid one). Without it they use the
    /// initial predictions minus the VMs' ages.
    pub models_dir: Option<PathBuf>,
    /// How often the models directory is rescanned for a new bundle, in seconds.
    pub model_poll_s: f64,
    /// Request validation limits (gang size, text lengths, features).
    pub limits: ValidationLimits,
    /// How the realized outcomes of predictions are resolved and kept (`GET /v1/quality`).
    pub quality: QualityConfig,
    /// The trace export of placements and exits (`GET /v1/export`) and how long exits are kept.
    pub export: ExportConfig,
    /// Consolidation under a migration budget (`[consolidation]`, docs/allocator.md): on from the
    /// first start when the store holds no consolidation of its own; settings an operator PUT
    /// through `/v1/consolidation` are kept in the store and stand over this section.
    pub consolidation: Option<ConsolidationConfig>,
    pub http: LayerConfig,
}

/// What time the allocator places and releases VMs at ([`ServiceConfig::clock`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Clock {
    /// Seconds since the Unix epoch.
    #[default]
    Wall,
    /// The latest request time seen; it never goes back. Requests without one run at the latest.
    Request,
}

/// `[export]`: the VMs that left, kept for the trace export.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExportConfig {
    /// Seconds on the model's clock an exit is kept: exits that ended more than this before the
    /// newest exit are deleted (at most once a minute). 30 days by default; `inf` keeps them all.
    pub retention_s: f64,
}

impl Default for ExportConfig {
    fn default() -> Self {
        ExportConfig { retention_s: crate::store::DEFAULT_EXIT_RETENTION_S }
    }
}

impl ExportConfig {
    pub fn retention(&self) -> crate::store::ExitRetention {
        crate::store::ExitRetention { retention_s: self.retention_s }
    }
}

/// `[quality]`: realized prediction quality.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QualityConfig {
    /// Lifetime at and above which a VM is long-lived: the model's threshold (2 h by default).
    pub long_threshold_s: f64,
    /// Most resolved outcomes kept per model version (the sliding window).
    pub window: usize,
    /// Most model versions kept (least recently seen dropped first).
    pub max_versions: usize,
    /// Most VMs awaiting their outcome; beyond it VMs are not tracked (bounded memory).
    pub max_pending: usize,
}

impl Default for QualityConfig {
    fn default() -> Self {
        let defaults = placement::outcomes::OutcomeConfig::default();
        QualityConfig {
            long_threshold_s: defaults.long_threshold_s,
            window: defaults.window,
            max_versions: defaults.max_versions,
            max_pending: defaults.max_pending,
        }
    }
}

impl QualityConfig {
    pub fn outcome_config(&self) -> placement::outcomes::OutcomeConfig {
        placement::outcomes::OutcomeConfig {
            long_threshold_s: self.long_threshold_s,
            window: self.window,
            max_versions: self.max_versions,
            max_pending: self.max_pending,
        }
    }
}

/// The allocator's default admission limit (`[http] max_concurrency`), when no `[http]` section
/// is given: one full group-commit batch.
pub const ALLOCATOR_MAX_CONCURRENCY: usize = 256;

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8082)),
            store: StoreLocation::Sqlite(PathBuf::from("allocator.db")),
            admin_token: None,
            service_token: None,
            previous_service_token: None,
            insecure_open: false,
            max_batch: 256,
            clock: Clock::Wall,
            queue: 4096,
            runtime_threads: 1,
            inventory_file: None,
            generate: None,
            allocator: AllocatorConfig::default(),
            models_dir: None,
            model_poll_s: 10.0,
            limits: ValidationLimits::default(),
            quality: QualityConfig::default(),
            export: ExportConfig::default(),
            consolidation: None,
            // More in flight than the control service's default: the group commit batches
            // whatever is in flight, and each control service in front bounds its own share.
            http: LayerConfig { max_concurrency: ALLOCATOR_MAX_CONCURRENCY, ..LayerConfig::default() },
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("the configuration needs an inventory: set `inventory_file` or a `[generate]` section")]
    NoInventory,
    #[error("the configuration gives both `inventory_file` and `[generate]`; keep one")]
    TwoInventories,
    #[error("generate.{field}: {message}")]
    Generate { field: &'static str, message: String },
    #[error("max_batch must be at least 1")]
    MaxBatch,
    #[error("quality.{field}: {message}")]
    Quality { field: &'static str, message: String },
    #[error("export.retention_s: must be a positive number of seconds (or inf), got {0}")]
    Retention(f64),
    #[error(transparent)]
    Consolidation(#[from] placement::consolidation::ConsolidationConfigError),
    #[error("consolidation.chooser: `oracle` reads true lifetimes, which only the simulator knows; use `lifetime` or a model-free chooser")]
    ConsolidationOracle,
}

impl ServiceConfig {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        Self::parse(&text).map_err(|message| ConfigError::Parse { path: path.to_owned(), message })
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    /// Checks what serde cannot.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.max_batch == 0 {
            return Err(ConfigError::MaxBatch);
        }
        let q = &self.quality;
        if !(q.long_threshold_s.is_finite() && q.long_threshold_s > 0.0) {
            let message = format!("must be a positive number of seconds, got {}", q.long_threshold_s);
            return Err(ConfigError::Quality { field: "long_threshold_s", message });
        }
        for (field, value) in [("window", q.window), ("max_versions", q.max_versions), ("max_pending", q.max_pending)] {
            if value == 0 {
                return Err(ConfigError::Quality { field, message: "must be at least 1".to_owned() });
            }
        }
        if self.export.retention_s.is_nan() || self.export.retention_s <= 0.0 {
            return Err(ConfigError::Retention(self.export.retention_s));
        }
        if let Some(consolidation) = &self.consolidation {
            consolidation.check()?;
            if consolidation.chooser == placement::consolidation::ChooserKind::Oracle {
                return Err(ConfigError::ConsolidationOracle);
            }
        }
        match (&self.inventory_file, &self.generate) {
            (None, None) => Err(ConfigError::NoInventory),
            (Some(_), Some(_)) => Err(ConfigError::TwoInventories),
            _ => Ok(()),
        }
    }

    /// The inventory this configuration describes.
    pub fn inventory(&self) -> Result<InventorySpec, ConfigError> {
        self.check()?;
        if let Some(path) = &self.inventory_file {
            return load_inventory(path);
        }
        let Some(generate) = &self.generate else { return Err(ConfigError::NoInventory) };
        if generate.hosts_per_rack == 0 {
            return Err(ConfigError::Generate { field: "hosts_per_rack", message: "must be at least 1".to_owned() });
        }
        if generate.zone.is_empty() {
            return Err(ConfigError::Generate { field: "zone", message: "must not be empty".to_owned() });
        }
        let capacity =
            Resources::from_whole(generate.cores, generate.memory_gib, generate.ssd_gib).map_err(|(kind, error)| {
                ConfigError::Generate {
                    field: match kind {
                        domain::ResourceKind::Cores => "cores",
                        domain::ResourceKind::MemoryGib => "memory_gib",
                        domain::ResourceKind::SsdGib => "ssd_gib",
                    },
                    message: error.to_string(),
                }
            })?;
        Ok(InventorySpec::homogeneous(&generate.zone, generate.hosts, generate.hosts_per_rack, capacity))
    }
}

/// Reads a TOML [`InventorySpec`].
pub fn load_inventory(path: &Path) -> Result<InventorySpec, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
    toml::from_str(&text).map_err(|e| ConfigError::Parse { path: path.to_owned(), message: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checked_in_configs_parse() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let config = ServiceConfig::load(&root.join("configs/allocator.toml")).unwrap();
        let inventory = config.inventory().unwrap();
        assert_eq!(inventory.hosts().count(), 200);
        assert_eq!(config.allocator.policy.kind, "nilas");
        assert_eq!(config.allocator.policy.exit_floor_s, 28_800.0);
        let example = load_inventory(&root.join("configs/inventory.example.toml")).unwrap();
        assert!(example.hosts().count() >= 4);
        placement::Allocator::new(&example, &config.allocator).unwrap();
    }

    #[test]
    fn mistakes_are_named() {
        let err = ServiceConfig::parse("listen = \"127.0.0.1:1\"\nmax_bach = 3\n").unwrap_err();
        assert!(err.contains("max_bach"), "{err}");
        // No host at start is a zone whose hosts come while it runs.
        let config = ServiceConfig::parse("[generate]\nhosts = 0\ncores = 8\nmemory_gib = 32\n").unwrap();
        assert_eq!(config.inventory().unwrap().hosts().count(), 0);
        let config =
            ServiceConfig::parse("[generate]\nhosts = 2\nhosts_per_rack = 0\ncores = 8\nmemory_gib = 32\n").unwrap();
        assert!(config.inventory().unwrap_err().to_string().contains("generate.hosts_per_rack"));
        let config = ServiceConfig::parse("").unwrap();
        assert!(matches!(config.inventory(), Err(ConfigError::NoInventory)));
        let config = ServiceConfig::parse("[generate]\nhosts = 2\ncores = -8\nmemory_gib = 32\n").unwrap();
        assert!(config.inventory().unwrap_err().to_string().contains("generate.cores"));
        let config =
            ServiceConfig::parse("[generate]\nhosts = 2\ncores = 8\nmemory_gib = 32\n[export]\nretention_s = 0\n")
                .unwrap();
        assert!(config.inventory().unwrap_err().to_string().contains("export.retention_s"));
        let config = ServiceConfig::parse("[export]\nretention_s = inf\n").unwrap();
        assert_eq!(config.export.retention().cutoff(1e9), None, "inf keeps every exit");
        assert_eq!(ServiceConfig::default().export.retention_s, 30.0 * 86_400.0);
    }
}
