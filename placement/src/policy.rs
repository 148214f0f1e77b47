//! Placement policies as ordered lists of rules (paper 003 s3.1, s4.4; paper 001 s3):
//! PBFR, DPBFR, LA-binary (LAR), LA-multiclass, NILAS and LAVA, selected by configuration.
//!
//! Every policy starts with the same validators (host available, hardware compatible, fits, tenant
//! spread when asked) and differs in its preference rules:
//!
//! | policy | preference rules, in strict order |
//! |---|---|
//! | `pbfr` | prefer non-empty, best fit (k buckets) |
//! | `dpbfr` | prefer non-empty, best fit with k_long buckets for long VMs, k_short for short |
//! | `la-binary` | prefer non-empty, lifetime alignment over two classes (2 h), best fit |
//! | `la-multiclass` | prefer non-empty, lifetime alignment over the interval classes, best fit |
//! | `nilas` | prefer non-empty, temporal cost (repredicted host exit times), best fit |
//! | `lava` | LAVA host state and class, temporal cost, best fit |
//!
//! "Prefer non-empty" can be switched off per policy; it is on by default because an allocator that
//! opens empty hosts while others have room packs worse whatever its lifetime logic (Protean's
//! `PreferNonEmptyMachines`). LAVA ranks empty hosts last by itself.

use crate::lifetime::{ClassIndex, ClassesError, LifetimeClasses};
use crate::rules::{
    BestFit, Buckets, DynamicBestFit, FitWeights, FitsResources, HardwareCompatible, HostAvailable, HostView,
    LavaPreference, LifetimeAlignment, PreferNonEmpty, PreferenceRule, RequestTrait, RuleRequest, TemporalCost,
    TenantSpreadRule, ValidatorRule,
};
use domain::{Resources, RuleFilterStat};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Most preference rules in one policy.
pub const MAX_PREFERENCE_RULES: usize = 6;

/// The scores of one host under a policy's preference rules, in rule order; compared
/// lexicographically (strict ordering), lower is better. Unused slots are 0.
pub type ScoreKey = [u32; MAX_PREFERENCE_RULES];

#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    Pbfr,
    Dpbfr,
    LaBinary,
    LaMulticlass,
    Nilas,
    Lava,
}

/// The `[policy]` section of the allocator's configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    pub kind: PolicyKind,
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
            kind: PolicyKind::Pbfr,
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
    pub fn of_kind(kind: PolicyKind) -> Self {
        PolicyConfig { kind, ..PolicyConfig::default() }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyError {
    #[error("policy.{field}: {source}")]
    Classes { field: &'static str, source: ClassesError },
    #[error("a policy may have at most {MAX_PREFERENCE_RULES} preference rules, got {0}")]
    TooManyPreferences(usize),
    #[error("preference rule `{0}` reads the tenant; only validators may depend on a single request")]
    RequestSpecificPreference(&'static str),
    #[error("policy.weights: at least one weight must be positive, and none negative or non-finite")]
    Weights,
    #[error("preference rule `{0}` reads the VM's exit time but is not a temporal rule")]
    ExitTimeOutsideTemporalRule(&'static str),
    #[error("a policy may have at most one temporal preference rule")]
    TwoTemporalRules,
    #[error("host-coded preference rule `{0}` must come first, above a temporal rule")]
    MisplacedHostCodedRule(&'static str),
    #[error("policy.temporal_buckets_s: must start at 0 and increase strictly, in finite seconds; got {0:?}")]
    TemporalBuckets(Vec<f64>),
    #[error("policy.{field}: {message}")]
    Invalid { field: &'static str, message: String },
}

/// A policy: validators, then strictly ordered preference rules, over lifetime classes.
#[derive(Debug)]
pub struct Policy {
    name: String,
    validators: Vec<Box<dyn ValidatorRule>>,
    preferences: Vec<Box<dyn PreferenceRule>>,
    classes: LifetimeClasses,
    /// Traits read by the rules that can be cached (everything but the tenant).
    class_traits: Vec<RequestTrait>,
    /// How many leading validators are cacheable; the rest read the tenant.
    cached_validators: usize,
    /// The level of the temporal preference rule (NILAS), if any.
    temporal_level: Option<usize>,
    /// Whether the first preference rule is host-coded (LAVA): the index caches its host codes
    /// and ranks them per request.
    coded_first: bool,
    /// Whether the rules read LAVA host state.
    lava: bool,
    /// The least time from now a temporal rule reads as an arriving VM's exit.
    exit_floor_s: f64,
}

/// The traits of a request that its equivalence class is made of: two requests with the same key
/// get the same validity and scores on every host from the cacheable rules.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClassKey {
    pub demand: Option<Resources>,
    pub lifetime_class: Option<ClassIndex>,
    pub vm_type: Option<String>,
}

impl Policy {
    /// The policy a configuration describes; `compatibility` maps VM types to the hardware
    /// generations they run on (types not listed run everywhere).
    pub fn from_config(
        config: &PolicyConfig,
        compatibility: &HashMap<String, Vec<String>>,
    ) -> Result<Self, PolicyError> {
        let weights = [config.weights.cores, config.weights.memory_gib, config.weights.ssd_gib];
        if weights.iter().any(|w| !w.is_finite() || *w < 0.0) || weights.iter().all(|w| *w == 0.0) {
            return Err(PolicyError::Weights);
        }
        let binary = || {
            LifetimeClasses::binary(config.long_threshold_s)
                .map_err(|source| PolicyError::Classes { field: "long_threshold_s", source })
        };
        let interval_classes = || match &config.class_cutoffs_s {
            Some(cutoffs) => LifetimeClasses::new(cutoffs.clone())
                .map_err(|source| PolicyError::Classes { field: "class_cutoffs_s", source }),
            None => Ok(LifetimeClasses::doubling_from_15_minutes()),
        };
        let best_fit =
            || Box::new(BestFit { buckets: config.buckets, weights: config.weights }) as Box<dyn PreferenceRule>;
        let temporal = || -> Result<Box<dyn PreferenceRule>, PolicyError> {
            Ok(Box::new(match &config.temporal_buckets_s {
                Some(bounds) => TemporalCost::with_bounds(bounds.clone())
                    .ok_or_else(|| PolicyError::TemporalBuckets(bounds.clone()))?,
                None => TemporalCost::default(),
            }))
        };
        if config.long_probability.is_some_and(|p| !(0.0..=1.0).contains(&p)) {
            return Err(PolicyError::Invalid { field: "long_probability", message: "must be in [0, 1]".into() });
        }
        if !(config.exit_floor_s.is_finite() && config.exit_floor_s >= 0.0) {
            return Err(PolicyError::Invalid { field: "exit_floor_s", message: "must be >= 0 seconds".into() });
        }
        let (classes, mut preferences): (LifetimeClasses, Vec<Box<dyn PreferenceRule>>) = match config.kind {
            PolicyKind::Pbfr => (binary()?, vec![best_fit()]),
            PolicyKind::Dpbfr => (
                binary()?,
                vec![Box::new(DynamicBestFit {
                    long: config.long_buckets,
                    short: config.short_buckets,
                    weights: config.weights,
                })],
            ),
            PolicyKind::LaBinary => (binary()?, vec![Box::new(LifetimeAlignment), best_fit()]),
            PolicyKind::LaMulticlass => (interval_classes()?, vec![Box::new(LifetimeAlignment), best_fit()]),
            // NILAS reads only exit times; its classes only turn interval predictions into lifetimes.
            PolicyKind::Nilas => (interval_classes()?.by_expected_lifetime(), vec![temporal()?, best_fit()]),
            PolicyKind::Lava => {
                let lava = crate::lava::classes();
                let top = (lava.count() - 1) as ClassIndex;
                let rules: Vec<Box<dyn PreferenceRule>> =
                    vec![Box::new(LavaPreference { top_class: top }), temporal()?, best_fit()];
                (lava.by_expected_lifetime(), rules)
            }
        };
        let classes = classes.reading_long(config.long_probability);
        if config.prefer_non_empty && config.kind != PolicyKind::Lava {
            preferences.insert(0, Box::new(PreferNonEmpty));
        }
        let mut validators: Vec<Box<dyn ValidatorRule>> = vec![Box::new(HostAvailable)];
        if !compatibility.is_empty() {
            validators.push(Box::new(HardwareCompatible { allowed: compatibility.clone() }));
        }
        validators.push(Box::new(FitsResources));
        validators.push(Box::new(TenantSpreadRule));
        let name = serde_json::to_value(config.kind).ok().and_then(|v| v.as_str().map(str::to_owned));
        let mut policy = Policy::from_rules(name.unwrap_or_default(), validators, preferences, classes)?;
        policy.exit_floor_s = config.exit_floor_s;
        Ok(policy)
    }

    /// A policy from any rules. Validators that read the tenant must come last: they are applied
    /// per request on top of the cached evaluation.
    pub fn from_rules(
        name: impl Into<String>,
        mut validators: Vec<Box<dyn ValidatorRule>>,
        preferences: Vec<Box<dyn PreferenceRule>>,
        classes: LifetimeClasses,
    ) -> Result<Self, PolicyError> {
        if preferences.len() > MAX_PREFERENCE_RULES {
            return Err(PolicyError::TooManyPreferences(preferences.len()));
        }
        if let Some(rule) = preferences.iter().find(|r| r.reads().contains(&RequestTrait::Tenant)) {
            return Err(PolicyError::RequestSpecificPreference(rule.name()));
        }
        if let Some(rule) =
            preferences.iter().find(|r| r.reads().contains(&RequestTrait::ExitTime) && r.exit_buckets().is_none())
        {
            return Err(PolicyError::ExitTimeOutsideTemporalRule(rule.name()));
        }
        let mut temporal = preferences.iter().enumerate().filter(|(_, r)| r.exit_buckets().is_some()).map(|(i, _)| i);
        let temporal_level = temporal.next();
        if temporal.next().is_some() {
            return Err(PolicyError::TwoTemporalRules);
        }
        let lava = preferences.iter().any(|r| r.name() == "lava");
        // A host-coded rule is ranked per request where the index already walks the groups above
        // the temporal level, so it must be the first rule and a temporal rule must follow it.
        let coded: Vec<usize> =
            preferences.iter().enumerate().filter(|(_, r)| r.is_host_coded()).map(|(i, _)| i).collect();
        if let Some(&level) = coded.iter().find(|&&level| level != 0 || temporal_level.is_none()) {
            return Err(PolicyError::MisplacedHostCodedRule(preferences[level].name()));
        }
        let coded_first = !coded.is_empty();
        // Stable: request-specific validators move behind the cacheable ones, keeping their order.
        validators.sort_by_key(|v| v.reads().contains(&RequestTrait::Tenant));
        let cached_validators = validators.iter().filter(|v| !v.reads().contains(&RequestTrait::Tenant)).count();
        let mut class_traits: Vec<RequestTrait> = validators[..cached_validators]
            .iter()
            .flat_map(|v| v.reads())
            .chain(preferences.iter().skip(usize::from(coded_first)).flat_map(|p| p.reads()))
            .copied()
            .collect();
        // What the host-coded rule reads is applied to the codes per request, and the exit time
        // is read by ranges: neither is cached per request class.
        class_traits.retain(|t| *t != RequestTrait::ExitTime);
        class_traits.sort_by_key(|t| *t as u8);
        class_traits.dedup();
        Ok(Policy {
            name: name.into(),
            validators,
            preferences,
            classes,
            class_traits,
            cached_validators,
            temporal_level,
            coded_first,
            lava,
            exit_floor_s: 0.0,
        })
    }

    /// The level of the temporal preference rule (NILAS's temporal cost), if the policy has one.
    pub fn temporal_level(&self) -> Option<usize> {
        self.temporal_level
    }

    /// Whether the rules read hosts' exit times, which then follow repredictions.
    pub fn reads_exit_times(&self) -> bool {
        self.temporal_level.is_some() || self.lava
    }

    /// Whether any rule may read a host's lifetime summary (class, exit time, LAVA state): when
    /// none does (PBFR), a summary that changes on its own as time passes is no change of the host
    /// to the index, and the policy's decisions do not depend on the predictions at all.
    pub fn reads_host_lifetime(&self) -> bool {
        self.reads_exit_times() || self.class_traits.contains(&RequestTrait::LifetimeClass)
    }

    /// Whether the rules read LAVA host state, which the allocator then keeps.
    pub fn is_lava(&self) -> bool {
        self.lava
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn classes(&self) -> &LifetimeClasses {
        &self.classes
    }

    /// The least time from now a temporal rule reads as an arriving VM's exit
    /// ([`PolicyConfig::exit_floor_s`]).
    pub fn exit_floor_s(&self) -> f64 {
        self.exit_floor_s
    }

    pub fn validators(&self) -> &[Box<dyn ValidatorRule>] {
        &self.validators
    }

    pub fn preferences(&self) -> &[Box<dyn PreferenceRule>] {
        &self.preferences
    }

    /// Number of leading validators whose result depends only on the request's class.
    pub fn cached_validators(&self) -> usize {
        self.cached_validators
    }

    /// The equivalence class of a request.
    pub fn class_key(&self, request: &RuleRequest) -> ClassKey {
        let reads = |t| self.class_traits.contains(&t);
        ClassKey {
            demand: reads(RequestTrait::Demand).then_some(request.demand),
            lifetime_class: reads(RequestTrait::LifetimeClass).then_some(request.lifetime_class),
            vm_type: reads(RequestTrait::VmType).then(|| request.vm_type.to_owned()),
        }
    }

    /// Index of the first validator in `range` that rejects the host, if any.
    pub fn first_rejection(
        &self,
        host: &HostView,
        request: &RuleRequest,
        range: std::ops::Range<usize>,
    ) -> Option<usize> {
        let start = range.start;
        self.validators[range].iter().position(|v| !v.is_valid(host, request)).map(|i| start + i)
    }

    /// The host's scores under every preference rule.
    pub fn score(&self, host: &HostView, request: &RuleRequest) -> ScoreKey {
        let mut key = [0; MAX_PREFERENCE_RULES];
        for (slot, rule) in key.iter_mut().zip(&self.preferences) {
            *slot = rule.score(host, request);
        }
        key
    }

    /// What a request class can cache of the host's scores: the temporal rule's slot is 0, and a
    /// host-coded first rule holds the host's code instead of its score ([`Policy::rank_codes`]).
    pub fn cached_score(&self, host: &HostView, request: &RuleRequest) -> ScoreKey {
        let mut key = [0; MAX_PREFERENCE_RULES];
        for (level, (slot, rule)) in key.iter_mut().zip(&self.preferences).enumerate() {
            if Some(level) == self.temporal_level {
                continue;
            }
            *slot = if rule.is_host_coded() { rule.host_code(host) } else { rule.score(host, request) };
        }
        key
    }

    /// A cached key with its host code (if the policy has a host-coded rule) replaced by the
    /// score that code has for this request.
    pub fn rank_codes(&self, mut key: ScoreKey, request: &RuleRequest) -> ScoreKey {
        if self.coded_first {
            key[0] = self.preferences[0].score_of_code(key[0], request);
        }
        key
    }

    /// Filtering statistics of one decision: for each validator the hosts it saw and kept, then
    /// for each preference rule the hosts that tie with the best on it and every rule above.
    ///
    /// `eliminated[i]` is how many hosts validator `i` removed; `tied[j]` how many valid hosts share
    /// the best score's first `j + 1` entries.
    pub fn filter_stats(&self, hosts: usize, eliminated: &[usize], tied: &[usize]) -> Vec<RuleFilterStat> {
        let mut stats = Vec::with_capacity(self.validators.len() + self.preferences.len());
        let mut remaining = hosts;
        for (rule, &removed) in self.validators.iter().zip(eliminated) {
            let kept = remaining.saturating_sub(removed);
            stats.push(RuleFilterStat { rule: rule.name().to_owned(), hosts_in: remaining, hosts_kept: kept });
            remaining = kept;
        }
        for (rule, &kept) in self.preferences.iter().zip(tied) {
            stats.push(RuleFilterStat { rule: rule.name().to_owned(), hosts_in: remaining, hosts_kept: kept });
            remaining = kept;
        }
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule_names(policy: &Policy) -> (Vec<&str>, Vec<&str>) {
        (
            policy.validators().iter().map(|r| r.name()).collect(),
            policy.preferences().iter().map(|r| r.name()).collect(),
        )
    }

    #[test]
    fn policies_have_their_rules_in_order() {
        let none = HashMap::new();
        let pbfr = Policy::from_config(&PolicyConfig::of_kind(PolicyKind::Pbfr), &none).unwrap();
        assert_eq!(
            rule_names(&pbfr),
            (vec!["host-available", "fits-resources", "tenant-spread"], vec!["prefer-non-empty", "best-fit"])
        );
        assert_eq!(pbfr.cached_validators(), 2);
        let lar = Policy::from_config(&PolicyConfig::of_kind(PolicyKind::LaBinary), &none).unwrap();
        assert_eq!(rule_names(&lar).1, vec!["prefer-non-empty", "lifetime-alignment", "best-fit"]);
        assert_eq!(lar.classes().count(), 2);
        let multi = Policy::from_config(&PolicyConfig::of_kind(PolicyKind::LaMulticlass), &none).unwrap();
        assert_eq!(multi.classes().count(), 11);
        let nilas = Policy::from_config(&PolicyConfig::of_kind(PolicyKind::Nilas), &none).unwrap();
        assert_eq!(rule_names(&nilas).1, vec!["prefer-non-empty", "temporal-cost", "best-fit"]);
        assert_eq!(nilas.temporal_level(), Some(1));
        let lava = Policy::from_config(&PolicyConfig::of_kind(PolicyKind::Lava), &none).unwrap();
        assert_eq!(rule_names(&lava).1, vec!["lava", "temporal-cost", "best-fit"]);
        assert!(lava.is_lava() && lava.reads_exit_times() && !multi.reads_exit_times());
        assert_eq!(lava.classes().count(), 5);
        let compat = HashMap::from([("M128".to_owned(), vec!["gen8".to_owned()])]);
        let dpbfr = Policy::from_config(
            &PolicyConfig { prefer_non_empty: false, ..PolicyConfig::of_kind(PolicyKind::Dpbfr) },
            &compat,
        )
        .unwrap();
        assert_eq!(
            rule_names(&dpbfr),
            (
                vec!["host-available", "hardware-compatible", "fits-resources", "tenant-spread"],
                vec!["dynamic-best-fit"]
            )
        );
    }

    #[test]
    fn class_key_holds_only_what_rules_read() {
        let none = HashMap::new();
        let request = RuleRequest {
            demand: Resources::from_whole(2.0, 8.0, 0.0).unwrap(),
            lifetime_class: 1,
            vm_type: "D2",
            exit_s: 5_000.0,
            spread: None,
        };
        let pbfr = Policy::from_config(&PolicyConfig::default(), &none).unwrap();
        assert_eq!(
            pbfr.class_key(&request),
            ClassKey { demand: Some(request.demand), lifetime_class: None, vm_type: None }
        );
        let lar = Policy::from_config(&PolicyConfig::of_kind(PolicyKind::LaBinary), &none).unwrap();
        assert_eq!(lar.class_key(&request).lifetime_class, Some(1));
        let nilas = Policy::from_config(&PolicyConfig::of_kind(PolicyKind::Nilas), &none).unwrap();
        assert_eq!(
            nilas.class_key(&request),
            ClassKey { demand: Some(request.demand), lifetime_class: None, vm_type: None },
            "the exit time is not part of the class"
        );
        let lava = Policy::from_config(&PolicyConfig::of_kind(PolicyKind::Lava), &none).unwrap();
        assert_eq!(
            lava.class_key(&request),
            ClassKey { demand: Some(request.demand), lifetime_class: None, vm_type: None },
            "LAVA's rule ranks cached host codes per request: its lifetime class is not part of the class"
        );
    }

    #[test]
    fn bad_configurations_name_the_field() {
        let none = HashMap::new();
        let bad_threshold = PolicyConfig { long_threshold_s: -1.0, ..PolicyConfig::of_kind(PolicyKind::LaBinary) };
        let err = Policy::from_config(&bad_threshold, &none).unwrap_err().to_string();
        assert!(err.contains("long_threshold_s"), "{err}");
        let bad_cutoffs =
            PolicyConfig { class_cutoffs_s: Some(vec![10.0, 5.0]), ..PolicyConfig::of_kind(PolicyKind::LaMulticlass) };
        assert!(Policy::from_config(&bad_cutoffs, &none).unwrap_err().to_string().contains("class_cutoffs_s"));
        let bad_weights = PolicyConfig {
            weights: FitWeights { cores: 0.0, memory_gib: 0.0, ssd_gib: 0.0 },
            ..PolicyConfig::default()
        };
        assert_eq!(Policy::from_config(&bad_weights, &none).unwrap_err(), PolicyError::Weights);
    }
}
