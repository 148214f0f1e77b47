//! The `[policy]` settings of the allocator's configuration, as data: the policy's name, its own rule
//! lists if it has them, and the parameters its rules default to (buckets, fit weights, thresholds).
//! Building a [`crate::Policy`] from them is [`crate::policy`]'s job; the rules a name may refer to
//! are [`crate::registry`]'s.

use domain::{ResourceKind, Resources, RESOURCE_DIMS};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One rule of a policy list: its registered name and its parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RuleEntry {
    pub rule: String,
    #[serde(flatten)]
    pub params: serde_json::Map<String, serde_json::Value>,
}

impl RuleEntry {
    pub fn named(rule: &str) -> Self {
        RuleEntry { rule: rule.to_owned(), params: serde_json::Map::new() }
    }
}

/// The `[policy]` section of the allocator's configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// The policy's name: one of the registry's presets ([`crate::registry::Registry::standard`]:
    /// the six published policies) or, with `preferences`, a name of the operator's choosing.
    pub kind: String,
    /// The policy's own preference rules, in strict order (instead of the preset's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preferences: Option<Vec<RuleEntry>>,
    /// The policy's own validators (instead of host-available, hardware-compatible, fits-resources,
    /// tenant-spread).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub validators: Option<Vec<RuleEntry>>,
    /// Best-fit buckets (`pbfr`, `la-binary`, `la-multiclass`); a number or `"exact"`.
    pub buckets: Buckets,
    /// DPBFR: buckets for VMs predicted long-lived.
    pub long_buckets: Buckets,
    /// DPBFR: buckets for short-lived VMs.
    pub short_buckets: Buckets,
    /// Lifetime at which a VM counts as long-lived (`dpbfr`, `la-binary`).
    pub long_threshold_s: f64,
    /// Class cut-offs of `la-multiclass`; default 15 * 2^i minutes, i = 0..10 (the lifetime-interval
    /// model's classes: configure the same cut-offs as the model bundle).
    pub class_cutoffs_s: Option<Vec<f64>>,
    pub prefer_non_empty: bool,
    pub weights: FitWeights,
    /// NILAS and LAVA: the temporal cost's bucket bounds in seconds (0 first, increasing); default
    /// the paper's 0, 30 min, ..., 168 h.
    pub temporal_buckets_s: Option<Vec<f64>>,
    /// A VM is placed as long-lived when its prediction's P(long) is at least this, instead of the
    /// model's own decision threshold (a lower one trades precision for recall).
    pub long_probability: Option<f64>,
    /// NILAS and LAVA: the temporal cost reads an arriving VM's exit as at least this many seconds
    /// from now (0 by default). Every VM then counts as staying a while, so that hosts predicted to
    /// empty sooner are left to empty: a misprediction of "short" costs least there.
    pub exit_floor_s: f64,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            kind: "pbfr".to_owned(),
            preferences: None,
            validators: None,
            buckets: Buckets::Quantized(3),
            long_buckets: Buckets::Quantized(5),
            short_buckets: Buckets::Quantized(3),
            long_threshold_s: domain::prediction::DEFAULT_LONG_THRESHOLD_S,
            class_cutoffs_s: None,
            prefer_non_empty: true,
            weights: FitWeights::default(),
            temporal_buckets_s: None,
            long_probability: None,
            exit_floor_s: 0.0,
        }
    }
}

impl PolicyConfig {
    /// A preset (one of the six published policies, or an embedder's) with default settings.
    pub fn preset(name: &str) -> Self {
        PolicyConfig { kind: name.to_owned(), ..PolicyConfig::default() }
    }
}

/// How a continuous score in [0, 1] is quantized.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Buckets {
    /// `ceil(S * k)`: k buckets (plus 0 for a perfect fit).
    Quantized(u32),
    /// No quantization (k = infinity): exact best fit.
    Exact,
}

impl Buckets {
    /// Resolution of the exact score: far finer than any two distinct fits differ by.
    const EXACT_STEPS: f64 = 1e9;

    pub fn quantize(self, score: f64) -> u32 {
        let score = score.clamp(0.0, 1.0);
        match self {
            Buckets::Quantized(k) => (score * f64::from(k)).ceil() as u32,
            Buckets::Exact => (score * Self::EXACT_STEPS).round() as u32,
        }
    }
}

impl Serialize for Buckets {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Buckets::Quantized(k) => serializer.serialize_u32(*k),
            Buckets::Exact => serializer.serialize_str("exact"),
        }
    }
}

impl<'de> Deserialize<'de> for Buckets {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Wire {
            Count(u32),
            Name(String),
        }
        match Wire::deserialize(deserializer)? {
            Wire::Count(k) if k >= 1 => Ok(Buckets::Quantized(k)),
            Wire::Name(name) if name == "exact" => Ok(Buckets::Exact),
            _ => Err(serde::de::Error::custom("buckets must be a whole number >= 1 or \"exact\"")),
        }
    }
}

/// Weights of the resource dimensions in the best-fit score; higher for scarcer resources.
#[derive(Copy, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FitWeights {
    pub cores: f64,
    pub memory_gib: f64,
    pub ssd_gib: f64,
}

impl Default for FitWeights {
    /// CPU is the usual bottleneck (paper 001 s6.2), so it weighs twice memory; SSD is ignored.
    fn default() -> Self {
        FitWeights { cores: 2.0, memory_gib: 1.0, ssd_gib: 0.0 }
    }
}

impl FitWeights {
    fn as_array(&self) -> [f64; RESOURCE_DIMS] {
        let mut weights = [0.0; RESOURCE_DIMS];
        weights[ResourceKind::Cores.index()] = self.cores;
        weights[ResourceKind::MemoryGib.index()] = self.memory_gib;
        weights[ResourceKind::SsdGib.index()] = self.ssd_gib;
        weights
    }

    /// Weighted share of the host left free after placing `demand`, in [0, 1]: 0 is a perfect fit.
    /// Dimensions the host has none of are left out.
    pub fn leftover_share(&self, capacity: &Resources, free: &Resources, demand: &Resources) -> f64 {
        let weights = self.as_array();
        let (mut sum, mut total) = (0.0, 0.0);
        for kind in ResourceKind::ALL {
            let cap = capacity.base(kind);
            let weight = weights[kind.index()];
            if cap == 0 || weight <= 0.0 {
                continue;
            }
            let left = free.base(kind).saturating_sub(demand.base(kind));
            sum += weight * left as f64 / cap as f64;
            total += weight;
        }
        if total > 0.0 {
            sum / total
        } else {
            0.0
        }
    }
}
