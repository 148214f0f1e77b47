//! Configuration of the control service (TOML; every field has a default except the zone map's
//! content, which defaults to one zone on the allocator's default address). Documented, field by
//! field, in `docs/control-service.md`.

use crate::auth::ApiKeys;
pub use crate::auth::{ApiKeyConfig, AuthConfig, AuthMode, KeysFile};
use crate::feature_key::KeySpec;
use crate::health::HealthPolicy;
use domain::ValidationLimits;
use serde::{Deserialize, Serialize};
use service_common::layers::LayerConfig;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ControlConfig {
    pub listen: SocketAddr,
    /// Zone of requests that name none; must be a key of `zones`.
    pub default_zone: String,
    /// Zone name -> its allocator.
    pub zones: BTreeMap<String, ZoneConfig>,
    pub inference: InferenceConfig,
    pub cache: CacheConfig,
    pub safeguard: SafeguardConfig,
    /// Realized prediction quality: the quality gate and canaries judged by evidence.
    pub quality: QualityConfig,
    /// Calls to the allocators.
    pub allocator: AllocatorClientConfig,
    /// Request validation limits (gang size, text lengths, features).
    pub limits: ValidationLimits,
    /// Who may call the public API (API keys per tenant, or open for local demos).
    pub auth: AuthConfig,
    /// Serve open routes (no API keys) on an address other than loopback anyway; refused at start
    /// otherwise (secure by default). `--insecure-open` sets it.
    pub insecure_open: bool,
    /// Per-tenant request rate limits (tenant API keys only).
    pub rate_limit: RateLimitConfig,
    /// How far a tenant's `requested_at_s` may be from the server's clock.
    pub request_time: RequestTimeConfig,
    /// The operator's console: the figures it shows over time.
    pub dashboard: DashboardConfig,
    /// Threads of the async runtime.
    pub runtime_threads: usize,
    pub http: LayerConfig,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RateLimitConfig {
    pub enabled: bool,
    /// Sustained requests per second of one tenant (token bucket refill).
    pub per_second: f64,
    /// Requests a tenant may send at once after being idle (bucket size).
    pub burst: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RequestTimeConfig {
    /// A tenant's `requested_at_s`, when given, must be within this many seconds of the server's
    /// clock (else 422); the prediction then uses the server's clock. Operator keys and open mode
    /// may set any request time (trace replays).
    pub max_skew_s: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ZoneConfig {
    /// Base URL of the zone's allocator, e.g. `http://127.0.0.1:8082`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocator: Option<String>,
    /// Base URLs of the zone's allocation agents when several serve it from one shared store
    /// (PostgreSQL): requests are spread over them in turn and fail over to the next agent when
    /// one cannot be reached or answers 5xx. With `allocator`, that one comes first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allocators: Vec<String>,
}

impl ZoneConfig {
    /// A zone served by one allocator.
    pub fn single(url: &str) -> ZoneConfig {
        ZoneConfig { allocator: Some(url.to_owned()), allocators: Vec::new() }
    }

    /// Every allocator URL of the zone, in order.
    pub fn urls(&self) -> Vec<String> {
        self.allocator.iter().chain(&self.allocators).cloned().collect()
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InferenceConfig {
    /// Base URLs of the inference servers, asked in turn (round robin). Empty: every VM is placed
    /// with the `fallback_unavailable` prediction.
    pub servers: Vec<String>,
    /// Budget of one prediction call, connection included; past it the VMs fall back to
    /// short-lived (`fallback_timeout`).
    pub timeout_ms: u64,
    /// Also ask for the lifetime interval (the multi-class model; LA-multiclass needs it). It costs
    /// about ten times the binary prediction.
    pub interval_class: bool,
    /// How often each server's `/readyz` is probed.
    pub health_interval_ms: u64,
    /// Idle kept-alive connections per server.
    pub max_idle_connections: usize,
    /// Budget of one `/readyz` probe, independent of the probe interval.
    pub probe_timeout_ms: u64,
    /// Consecutive failed probes or calls before the upstream is marked down (and skipped): one
    /// slow or lost probe is not enough.
    pub down_after_failures: u32,
    /// Consecutive successful probes before a down upstream is used again.
    pub up_after_successes: u32,
    /// Feed every placement and release to the inference servers, which keep their tenants'
    /// history current with them (issue 18); off, they predict from their bundles' frozen history.
    pub history: bool,
    /// History events kept per inference server while it cannot be reached; beyond, the oldest
    /// are dropped (`control_history_events_dropped_total`).
    pub history_max_pending: usize,
    /// How often history events that no prediction took along are sent on their own.
    pub history_flush_ms: u64,
    /// The service credential presented to the inference servers (`Authorization: Bearer`): their
    /// `service_token`. The environment variable `CONTROL_INFERENCE_SERVICE_TOKEN` (or a file
    /// named by `CONTROL_INFERENCE_SERVICE_TOKEN_FILE`) overrides it. Unset: none is sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_token: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CacheConfig {
    /// Most feature keys kept; 0 turns the cache off.
    pub max_entries: u64,
    /// An entry expires this long after it was stored: the model's tenant-history features move
    /// with time, so an old answer goes stale even for identical request features.
    pub ttl_s: u64,
    /// Request times are rounded down to this step inside the key: the model sees the hour of day
    /// and the weekday, so answers within one step are interchangeable. 0 leaves time out of the
    /// key.
    pub time_bucket_s: u64,
    /// What the key keeps of a VM: `tenant`, `vm_type`, `cores`, `memory`, `priority`, `os`,
    /// `features` (every extra feature) or `feature.NAME` (one extra feature). A field left out makes
    /// VMs that differ only in it share one answer: more hits, each served an answer computed for
    /// another VM ([`crate::feature_key`]).
    pub key: Vec<String>,
    /// How often the rollout is read from the inference servers (`GET /v1/models`): a cached answer
    /// serves only VMs routed to the version that gave it, so after a swap or a canary change the
    /// old answers stop serving within this time.
    pub rollout_poll_ms: u64,
}

impl CacheConfig {
    /// The key these settings describe; [`ControlConfig::check`] has refused a bad one by then.
    pub fn key_spec(&self) -> Result<KeySpec, ConfigError> {
        KeySpec::parse(&self.key, self.time_bucket_s).map_err(|error| {
            let field = match error.index() {
                Some(index) => format!("cache.key[{index}]"),
                None => "cache.key".to_owned(),
            };
            invalid(field, error.to_string())
        })
    }
}

/// `[dashboard]`: the timeline behind the console's charts (`GET /v1/stats/history`), sampled from
/// the control service's counters and the zones' statistics.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DashboardConfig {
    /// How often a sample is taken (each reads every zone's `/v1/stats`).
    pub history_interval_ms: u64,
    /// Samples kept (0: no timeline); 720 at 5 s is the last hour.
    pub history_samples: usize,
}

impl Default for DashboardConfig {
    fn default() -> Self {
        DashboardConfig { history_interval_ms: 5_000, history_samples: 720 }
    }
}

/// `[quality]`: what the control service does with the realized quality the allocators measure
/// (`GET /v1/quality` of every zone, added up per model version).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QualityConfig {
    /// Poll the zones' realized quality at all (the gate and auto canaries need it).
    pub enabled: bool,
    /// How often the zones and the inference servers' rollout are polled.
    pub poll_ms: u64,
    /// The quality gate: while the stable model's realized quality is below a floor, its VMs are
    /// placed as short-lived (PBFR) and its answers kept in shadow; it opens again once every
    /// floor is met by `hysteresis` more.
    pub gate: bool,
    /// Resolved VMs in the stable model's window before the gate judges it, and before a canary
    /// and its stable model are compared (unless the rollout sets its own `min_resolved`).
    pub min_resolved: u64,
    /// Floors of the long-lived class's realized figures; an absent floor is not checked.
    pub min_precision: Option<f64>,
    pub min_average_precision: Option<f64>,
    pub min_roc_auc: Option<f64>,
    /// How far above every floor the figures must be for a closed gate to open again.
    pub hysteresis: f64,
    /// Bearer token of the inference servers' admin API, so that a canary with `auto = true` in
    /// `rollout.toml` can be promoted or rolled back. The environment variable
    /// `CONTROL_INFERENCE_ADMIN_TOKEN` overrides it.
    pub inference_admin_token: Option<String>,
}

impl Default for QualityConfig {
    fn default() -> Self {
        QualityConfig {
            enabled: true,
            poll_ms: 2_000,
            gate: true,
            min_resolved: 200,
            min_precision: None,
            min_average_precision: None,
            min_roc_auc: Some(DEFAULT_MIN_ROC_AUC),
            hysteresis: 0.03,
            inference_admin_token: None,
        }
    }
}

/// Default floor of the realized ROC AUC: a backstop below every noisy oracle of the simulator's
/// accuracy sweep (0.614 at its noisiest, where LA-binary and NILAS still beat PBFR), so a model
/// that ranks no better than that (a broken bundle reads about 0.5) is gated whatever the policy.
/// LAVA stops beating PBFR at about 0.84 (docs/evaluation.md, section 3): raise it for LAVA zones.
/// Precision and AP floors are off by default: in a 5,000-outcome window they swing with the
/// window's long-lived share (0.44 to 0.82 for the same predictions), ROC AUC by about 0.015.
pub const DEFAULT_MIN_ROC_AUC: f64 = 0.60;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SafeguardConfig {
    pub enabled: bool,
    /// Length of the sliding window of model predictions (paper 003 s4.3: 10 minutes).
    pub window_s: u64,
    /// Trips when the long-lived share of the window exceeds this.
    pub threshold: f64,
    /// Never trips on fewer predictions than this in the window.
    pub min_predictions: u64,
    /// How long every request is placed as short-lived once tripped; the window restarts after.
    pub cooldown_s: u64,
    /// Most predictions of one tenant counted per window: one tenant alone cannot trip the
    /// safeguard for everyone.
    pub max_per_tenant: u64,
    /// A tenant first seen less than this long ago is new: its predictions go to the newcomers'
    /// window, whose trip places only new tenants as short-lived (a model calls unknown tenants
    /// long-lived). 0: every tenant counts as established.
    pub established_after_s: u64,
    /// Most tenants remembered (first seen, count in the window); the least recently seen are
    /// forgotten first, and count as new again.
    pub max_tenants: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AllocatorClientConfig {
    /// Most time one allocator call may take before the request fails with 504 (its outcome is then
    /// unknown; retrying with the same VM ids is safe).
    pub timeout_ms: u64,
    /// How often each allocator's `/readyz` is probed for the control service's own readiness.
    pub health_interval_ms: u64,
    /// Idle kept-alive connections per allocator.
    pub max_idle_connections: usize,
    /// Budget of one `/readyz` probe, independent of the probe interval.
    pub probe_timeout_ms: u64,
    /// Consecutive failed probes or calls before the upstream is marked down (and skipped): one
    /// slow or lost probe is not enough.
    pub down_after_failures: u32,
    /// Consecutive successful probes before a down upstream is used again.
    pub up_after_successes: u32,
    /// The service credential presented to the allocators (`Authorization: Bearer`): their
    /// `service_token`. The environment variable `CONTROL_ALLOCATOR_SERVICE_TOKEN` (or a file
    /// named by `CONTROL_ALLOCATOR_SERVICE_TOKEN_FILE`) overrides it. Unset: none is sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_token: Option<String>,
}

impl Default for ControlConfig {
    fn default() -> Self {
        ControlConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            default_zone: "zone-1".to_owned(),
            zones: BTreeMap::from([("zone-1".to_owned(), ZoneConfig::single("http://127.0.0.1:8082"))]),
            inference: InferenceConfig::default(),
            cache: CacheConfig::default(),
            safeguard: SafeguardConfig::default(),
            quality: QualityConfig::default(),
            allocator: AllocatorClientConfig::default(),
            limits: ValidationLimits::default(),
            auth: AuthConfig::default(),
            insecure_open: false,
            rate_limit: RateLimitConfig::default(),
            request_time: RequestTimeConfig::default(),
            dashboard: DashboardConfig::default(),
            runtime_threads: 2,
            http: LayerConfig::default(),
        }
    }
}

impl Default for InferenceConfig {
    fn default() -> Self {
        InferenceConfig {
            servers: vec!["http://127.0.0.1:8081".to_owned()],
            timeout_ms: 20,
            interval_class: false,
            health_interval_ms: 1_000,
            max_idle_connections: 64,
            probe_timeout_ms: DEFAULT_HEALTH.probe_timeout_ms,
            down_after_failures: DEFAULT_HEALTH.down_after_failures,
            up_after_successes: DEFAULT_HEALTH.up_after_successes,
            history: true,
            history_max_pending: 100_000,
            history_flush_ms: 100,
            service_token: None,
        }
    }
}

/// Probe budget and thresholds of both kinds of upstream unless configured.
const DEFAULT_HEALTH: HealthPolicy =
    HealthPolicy { probe_timeout_ms: 500, down_after_failures: 3, up_after_successes: 1 };

impl InferenceConfig {
    pub fn health(&self) -> HealthPolicy {
        HealthPolicy {
            probe_timeout_ms: self.probe_timeout_ms,
            down_after_failures: self.down_after_failures,
            up_after_successes: self.up_after_successes,
        }
    }
}

impl AllocatorClientConfig {
    pub fn health(&self) -> HealthPolicy {
        HealthPolicy {
            probe_timeout_ms: self.probe_timeout_ms,
            down_after_failures: self.down_after_failures,
            up_after_successes: self.up_after_successes,
        }
    }
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        RateLimitConfig { enabled: true, per_second: 50.0, burst: 100 }
    }
}

impl Default for RequestTimeConfig {
    fn default() -> Self {
        RequestTimeConfig { max_skew_s: 300.0 }
    }
}

impl Default for CacheConfig {
    fn default() -> Self {
        // Chosen on the measurement of issue 32 (docs/benchmarks.md, "Prediction cache: hit rate
        // against prediction quality"): every field but the extra features that are unique per
        // request (the synthetic trace's `request_id`, which kept the hit rate at 9-11%), a day's
        // bucket (the weekday stays exact, the hour of day does not) and a day's TTL: 64% hits on the
        // demo replay, AUC within 0.002 of fresh answers.
        CacheConfig {
            max_entries: 100_000,
            ttl_s: 86_400,
            time_bucket_s: 86_400,
            key: ["tenant", "vm_type", "cores", "memory", "priority", "os", "feature.batch_size"]
                .map(String::from)
                .to_vec(),
            rollout_poll_ms: 1_000,
        }
    }
}

impl Default for SafeguardConfig {
    fn default() -> Self {
        SafeguardConfig {
            enabled: true,
            window_s: 600,
            threshold: 0.5,
            min_predictions: 50,
            cooldown_s: 600,
            max_per_tenant: 10,
            established_after_s: 3_600,
            max_tenants: 100_000,
        }
    }
}

impl Default for AllocatorClientConfig {
    fn default() -> Self {
        AllocatorClientConfig {
            timeout_ms: 2_000,
            health_interval_ms: 1_000,
            max_idle_connections: 64,
            probe_timeout_ms: DEFAULT_HEALTH.probe_timeout_ms,
            down_after_failures: DEFAULT_HEALTH.down_after_failures,
            up_after_successes: DEFAULT_HEALTH.up_after_successes,
            service_token: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    /// `[auth]`: a key, the keys file or the mode.
    #[error(transparent)]
    Keys(#[from] crate::auth::KeysError),
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { field: field.into(), message: message.into() }
}

fn check_url(field: String, url: &str) -> Result<(), ConfigError> {
    match reqwest::Url::parse(url) {
        Ok(parsed) if matches!(parsed.scheme(), "http" | "https") && parsed.host().is_some() => Ok(()),
        Ok(_) => Err(invalid(field, format!("`{url}` must be an http:// or https:// URL with a host"))),
        Err(error) => Err(invalid(field, format!("`{url}` is not a URL: {error}"))),
    }
}

impl ControlConfig {
    /// Reads, parses and checks a TOML file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        let mut config: ControlConfig =
            toml::from_str(&text).map_err(|e| ConfigError::Parse { path: path.to_owned(), message: e.to_string() })?;
        if let (Some(keys_file), Some(dir)) = (&config.auth.keys_file, path.parent()) {
            config.auth.keys_file = Some(dir.join(keys_file));
        }
        config.check()?;
        Ok(config)
    }

    /// Checks what serde cannot; every error names the field.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.zones.is_empty() {
            return Err(invalid("zones", "at least one zone with its allocator is needed"));
        }
        if !self.zones.contains_key(&self.default_zone) {
            return Err(invalid(
                "default_zone",
                format!("`{}` is not one of the zones ({})", self.default_zone, self.zone_names()),
            ));
        }
        for (name, zone) in &self.zones {
            if zone.urls().is_empty() {
                return Err(invalid(
                    format!("zones.{name}"),
                    "needs `allocator = \"http://...\"` or `allocators = [\"http://...\", ...]`",
                ));
            }
            if let Some(url) = &zone.allocator {
                check_url(format!("zones.{name}.allocator"), url)?;
            }
            for (i, url) in zone.allocators.iter().enumerate() {
                check_url(format!("zones.{name}.allocators[{i}]"), url)?;
            }
        }
        for (i, server) in self.inference.servers.iter().enumerate() {
            check_url(format!("inference.servers[{i}]"), server)?;
        }
        if self.inference.timeout_ms == 0 {
            return Err(invalid("inference.timeout_ms", "must be at least 1"));
        }
        if self.allocator.timeout_ms == 0 {
            return Err(invalid("allocator.timeout_ms", "must be at least 1"));
        }
        let quality = &self.quality;
        for (field, floor) in [
            ("quality.min_precision", quality.min_precision),
            ("quality.min_average_precision", quality.min_average_precision),
            ("quality.min_roc_auc", quality.min_roc_auc),
        ] {
            if let Some(floor) = floor.filter(|f| !(0.0..=1.0).contains(f)) {
                return Err(invalid(field, format!("must be in [0, 1], got {floor}")));
            }
        }
        if !(0.0..=1.0).contains(&quality.hysteresis) {
            return Err(invalid("quality.hysteresis", format!("must be in [0, 1], got {}", quality.hysteresis)));
        }
        if quality.enabled && quality.poll_ms == 0 {
            return Err(invalid("quality.poll_ms", "must be at least 1"));
        }
        if quality.min_resolved == 0 {
            return Err(invalid("quality.min_resolved", "must be at least 1"));
        }
        let dashboard = &self.dashboard;
        if dashboard.history_samples > 0 && dashboard.history_interval_ms < 100 {
            return Err(invalid(
                "dashboard.history_interval_ms",
                "must be at least 100 (each sample reads every zone)",
            ));
        }
        if dashboard.history_samples > 100_000 {
            return Err(invalid(
                "dashboard.history_samples",
                format!("must be at most 100000, got {}", dashboard.history_samples),
            ));
        }
        let safeguard = &self.safeguard;
        if !(0.0..=1.0).contains(&safeguard.threshold) {
            return Err(invalid("safeguard.threshold", format!("must be in [0, 1], got {}", safeguard.threshold)));
        }
        if safeguard.enabled && safeguard.window_s == 0 {
            return Err(invalid("safeguard.window_s", "must be at least 1 second"));
        }
        if safeguard.enabled && safeguard.max_per_tenant == 0 {
            return Err(invalid("safeguard.max_per_tenant", "must be at least 1"));
        }
        if safeguard.max_tenants == 0 {
            return Err(invalid("safeguard.max_tenants", "must be at least 1"));
        }
        for (section, health) in [("inference", self.inference.health()), ("allocator", self.allocator.health())] {
            if health.probe_timeout_ms == 0 {
                return Err(invalid(format!("{section}.probe_timeout_ms"), "must be at least 1"));
            }
            if health.down_after_failures == 0 {
                return Err(invalid(format!("{section}.down_after_failures"), "must be at least 1"));
            }
            if health.up_after_successes == 0 {
                return Err(invalid(format!("{section}.up_after_successes"), "must be at least 1"));
            }
        }
        let rate = &self.rate_limit;
        if rate.enabled && !(rate.per_second.is_finite() && rate.per_second > 0.0) {
            return Err(invalid("rate_limit.per_second", format!("must be a number above 0, got {}", rate.per_second)));
        }
        if rate.enabled && rate.burst == 0 {
            return Err(invalid("rate_limit.burst", "must be at least 1"));
        }
        self.cache.key_spec()?;
        if self.cache.rollout_poll_ms == 0 {
            return Err(invalid("cache.rollout_poll_ms", "must be at least 1"));
        }
        let skew = self.request_time.max_skew_s;
        if !(skew.is_finite() && skew >= 0.0) {
            return Err(invalid("request_time.max_skew_s", format!("must be a finite number >= 0, got {skew}")));
        }
        ApiKeys::from_config(&self.auth)?;
        if self.http.request_timeout_ms <= self.inference.timeout_ms + self.allocator.timeout_ms {
            return Err(invalid(
                "http.request_timeout_ms",
                format!(
                    "must exceed inference.timeout_ms + allocator.timeout_ms ({} ms), or requests time out before \
                     their upstream calls do",
                    self.inference.timeout_ms + self.allocator.timeout_ms
                ),
            ));
        }
        Ok(())
    }

    fn zone_names(&self) -> String {
        self.zones.keys().map(String::as_str).collect::<Vec<_>>().join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_checked_in_config_parses() {
        ControlConfig::default().check().unwrap();
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/control-service.toml");
        let config = ControlConfig::load(&path).unwrap();
        assert!(config.zones.contains_key(&config.default_zone));
        // The checked-in config spells out the measured default of the cache (docs/benchmarks.md).
        assert_eq!(config.cache, CacheConfig::default());
    }

    #[test]
    fn errors_name_the_field() {
        let mut config = ControlConfig { default_zone: "nowhere".into(), ..ControlConfig::default() };
        assert!(config.check().unwrap_err().to_string().starts_with("default_zone:"));
        config.default_zone = "zone-1".into();
        config.inference.servers = vec!["localhost:8081".into()];
        assert!(config.check().unwrap_err().to_string().starts_with("inference.servers[0]:"));
        config.inference.servers.clear();
        config.safeguard.threshold = 1.5;
        assert!(config.check().unwrap_err().to_string().starts_with("safeguard.threshold:"));
        let error = toml::from_str::<ControlConfig>("listen = \"127.0.0.1:1\"\ntimeout = 3").unwrap_err();
        assert!(error.to_string().contains("timeout"));
        config.safeguard.threshold = 0.5;
        config.inference.down_after_failures = 0;
        assert!(config.check().unwrap_err().to_string().starts_with("inference.down_after_failures:"));
        config.inference.down_after_failures = 3;
        config.rate_limit.per_second = 0.0;
        assert!(config.check().unwrap_err().to_string().starts_with("rate_limit.per_second:"));
        config.rate_limit.per_second = 1.0;
        config.auth.keys.push(ApiKeyConfig {
            sha256: "abc".into(),
            tenant: Some("t1".into()),
            admin: false,
            name: None,
        });
        assert!(config.check().unwrap_err().to_string().starts_with("auth.keys[0].sha256:"));
    }

    #[test]
    fn a_bad_cache_key_is_refused_naming_the_entry() {
        let config: ControlConfig =
            toml::from_str("[cache]\nkey = [\"tenant\", \"vm_type\", \"feature.batch_size\"]\n").unwrap();
        config.check().unwrap();
        assert_eq!(config.cache.key_spec().unwrap().entries(), ["tenant", "vm_type", "feature.batch_size"]);
        let config: ControlConfig = toml::from_str("[cache]\nkey = [\"tenant\", \"mem\"]\n").unwrap();
        let error = config.check().unwrap_err().to_string();
        assert!(error.starts_with("cache.key[1]: `mem` is not a key field"), "{error}");
        let config: ControlConfig = toml::from_str("[cache]\nkey = []\n").unwrap();
        let error = config.check().unwrap_err().to_string();
        assert!(error.starts_with("cache.key: the key is empty"), "{error}");
        assert!(error.contains("cache.max_entries = 0"), "the error says how to turn the cache off: {error}");
    }

    #[test]
    fn a_zone_lists_its_agents_and_a_zone_without_one_is_refused_by_name() {
        let config: ControlConfig = toml::from_str(
            "default_zone = \"z\"\n[zones.z]\nallocators = [\"http://127.0.0.1:1\", \"http://127.0.0.1:2\"]",
        )
        .unwrap();
        config.check().unwrap();
        assert_eq!(config.zones["z"].urls(), ["http://127.0.0.1:1", "http://127.0.0.1:2"]);
        let config: ControlConfig = toml::from_str("default_zone = \"z\"\n[zones.z]\n").unwrap();
        assert!(config.check().unwrap_err().to_string().starts_with("zones.z:"));
        let config: ControlConfig =
            toml::from_str("default_zone = \"z\"\n[zones.z]\nallocators = [\"http://a:1\", \"a:2\"]").unwrap();
        assert!(config.check().unwrap_err().to_string().starts_with("zones.z.allocators[1]:"));
    }

    #[test]
    fn a_keys_file_is_found_beside_the_config() {
        let dir = tempfile::tempdir().unwrap();
        let hash = crate::auth::to_hex(&crate::auth::hash_key("k"));
        std::fs::write(dir.path().join("keys.toml"), format!("[[keys]]\ntenant = \"t\"\nsha256 = \"{hash}\"\n"))
            .unwrap();
        let path = dir.path().join("control.toml");
        std::fs::write(&path, "[auth]\nkeys_file = \"keys.toml\"\n").unwrap();
        let config = ControlConfig::load(&path).unwrap();
        assert_eq!(config.auth.keys_file, Some(dir.path().join("keys.toml")));
        assert!(!crate::auth::ApiKeys::from_config(&config.auth).unwrap().is_open());
        std::fs::write(&path, "[auth]\nkeys_file = \"missing.toml\"\n").unwrap();
        assert!(ControlConfig::load(&path).unwrap_err().to_string().contains("missing.toml"));
    }

    #[test]
    fn health_fields_sit_in_their_upstream_sections() {
        let config: ControlConfig = toml::from_str(
            "[inference]\nprobe_timeout_ms = 50\ndown_after_failures = 5\n[allocator]\nup_after_successes = 2\n",
        )
        .unwrap();
        assert_eq!(
            config.inference.health(),
            HealthPolicy { probe_timeout_ms: 50, down_after_failures: 5, up_after_successes: 1 }
        );
        assert_eq!(config.allocator.health().up_after_successes, 2);
        assert!(toml::from_str::<ControlConfig>("[inference]\nprobe_timeout = 50\n").is_err());
    }
}
