//! Configuration of the inference server (TOML; every field has a default).

use crate::history::HistoryConfig;
use crate::registry::RegistryOptions;
use lifetime_model::bundle::LoadLimits;
use serde::{Deserialize, Serialize};
use service_common::layers::LayerConfig;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// Directory of model bundles (one sub-directory each) and the optional `rollout.toml`.
    pub models_dir: PathBuf,
    /// Bearer token of the admin routes; admin routes are closed without one. The environment
    /// variable `INFERENCE_ADMIN_TOKEN` overrides it.
    pub admin_token: Option<String>,
    /// The service credential: bearer token that every route but the probes, `/metrics` and
    /// `/openapi.json` requires (the control service presents it; the admin token passes too).
    /// Unset: those routes are open, and the server says so with a WARN at every start. The
    /// environment variable `INFERENCE_SERVICE_TOKEN` (or a file named by
    /// `INFERENCE_SERVICE_TOKEN_FILE`) overrides it.
    pub service_token: Option<String>,
    /// Accepted as well while the service token is rotated (docs/operations.md, "Service
    /// credentials"); `INFERENCE_PREVIOUS_SERVICE_TOKEN` overrides it.
    pub previous_service_token: Option<String>,
    /// Serve open routes (no service token) on an address other than loopback anyway; refused at start
    /// otherwise (secure by default). `--insecure-open` sets it.
    pub insecure_open: bool,
    /// Most instances per prediction request.
    pub max_batch: usize,
    /// How often the models directory is checked for changes.
    pub watch_interval_ms: u64,
    /// Largest model file or feature store of a bundle, in bytes; a larger one refuses the bundle.
    pub max_bundle_file_bytes: u64,
    /// Largest bundle manifest, in bytes.
    pub max_manifest_bytes: u64,
    /// How long a scan of the models directory waits for one bundle to load before going on without
    /// it (the load keeps running; a later scan collects its outcome). Requests never wait on loads.
    pub bundle_load_timeout_ms: u64,
    /// Batches of at least this many instances are predicted on the blocking pool, so that they
    /// never hold up the async workers.
    pub blocking_batch_threshold: usize,
    /// Threads of the async runtime that serves HTTP. 1 (the default) runs a single-threaded runtime:
    /// a request is read, predicted and answered on one thread, with no hand-off to wake a second
    /// worker, which is the lowest latency on loopback (docs/benchmarks.md). Large batches still run
    /// on the blocking pool in parallel. More threads spread HTTP parsing of many busy connections.
    pub runtime_threads: usize,
    /// The live tenant history (`[history]`).
    pub history: HistoryConfig,
    pub http: LayerConfig,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8081)),
            models_dir: PathBuf::from("models"),
            admin_token: None,
            service_token: None,
            previous_service_token: None,
            insecure_open: false,
            max_batch: 1024,
            watch_interval_ms: 1_000,
            max_bundle_file_bytes: LoadLimits::default().max_file_bytes,
            max_manifest_bytes: LoadLimits::default().max_manifest_bytes,
            bundle_load_timeout_ms: 30_000,
            blocking_batch_threshold: 16,
            runtime_threads: 1,
            history: HistoryConfig::default(),
            http: LayerConfig::default(),
        }
    }
}

impl ServerConfig {
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    /// How the registry reads bundles, from this configuration.
    pub fn registry_options(&self) -> RegistryOptions {
        RegistryOptions {
            limits: LoadLimits {
                max_file_bytes: self.max_bundle_file_bytes,
                max_manifest_bytes: self.max_manifest_bytes,
            },
            load_timeout: Duration::from_millis(self.bundle_load_timeout_ms),
        }
    }
}
