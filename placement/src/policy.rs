//! Placement policies as data: an ordered list of validator and preference rules from the
//! allocator's configuration (paper 003 s3.1, s4.4; paper 001 s3), over lifetime classes.
//!
//! A policy is a name (`kind`) and, optionally, its own rule lists:
//!
//! ```toml
//! [allocator.policy]
//! kind = "my-policy"
//! preferences = [{rule = "prefer-non-empty"}, {rule = "lifetime-alignment", classes = "binary"},
//!                {rule = "best-fit", buckets = 3}]
//! ```
//!
//! Without `preferences`, `kind` names a preset of the registry ([`crate::registry`]: the six
//! published policies, or an embedder's own).
//!
//! Every policy starts with the same validators (host available, hardware compatible when a
//! compatibility table is configured, fits, tenant spread) unless it lists its own. Rule parameters
//! default to the policy's settings (`buckets`, `weights`, `long_threshold_s`, ...), so a preset and
//! its overrides stay one line. "Prefer non-empty" can be switched off for a preset
//! (`prefer_non_empty = false`); it is on by default because an allocator that opens empty hosts
//! while others have room packs worse whatever its lifetime logic (Protean's
//! `PreferNonEmptyMachines`). LAVA ranks empty hosts last by itself.
//!
//! A bad list (an unknown rule, a bad parameter, a rule in the wrong list, rules that disagree on
//! lifetime classes, a rule whose state or inputs the request path cannot provide) is refused when
//! the policy is built, naming the entry. A built [`Policy`] answers what it reads (predictions,
//! interval classes, exit times, per-host state), so that no caller decides by the policy's name.

pub use crate::config::{PolicyConfig, RuleEntry};
use crate::host_state::{HostStateKind, HostStatePolicy};
use crate::lifetime::{ClassesError, HostLifetime, LifetimeClasses};
use crate::registry::Registry;
use crate::rules::{
    BuiltRule, HostView, PreferenceRule, RequestTrait, RequestTraits, RuleContext, RuleRequest, TraitSet, ValidatorRule,
};
use domain::RuleFilterStat;

use std::collections::HashMap;

/// Most preference rules in one policy.
pub const MAX_PREFERENCE_RULES: usize = 6;

/// The scores of one host under a policy's preference rules, in rule order; compared
/// lexicographically (strict ordering), lower is better. Unused slots are 0.
pub type ScoreKey = [u32; MAX_PREFERENCE_RULES];

/// The preference list: the configured one, or the preset's from the registry.
fn preference_entries(config: &PolicyConfig, registry: &Registry) -> Result<Vec<RuleEntry>, PolicyError> {
    if let Some(list) = &config.preferences {
        return Ok(list.clone());
    }
    let names = registry.preset(&config.kind).ok_or_else(|| PolicyError::Invalid {
        field: "kind".to_owned(),
        message: format!(
            "unknown policy `{}`: name one of {}, or give the policy's own `preferences`",
            config.kind,
            registry.preset_names().join(", ")
        ),
    })?;
    Ok(names
        .iter()
        .filter(|name| config.prefer_non_empty || registry.non_empty_switch() != Some(**name))
        .map(|name| match name.split_once(':') {
            Some((rule, classes)) => {
                let mut entry = RuleEntry::named(rule);
                entry.params.insert("classes".to_owned(), serde_json::Value::from(classes));
                entry
            }
            None => RuleEntry::named(name),
        })
        .collect())
}

/// The validator list: the configured one, or the registry's defaults for this context.
fn validator_entries(config: &PolicyConfig, registry: &Registry, context: &RuleContext) -> Vec<RuleEntry> {
    match &config.validators {
        Some(list) => list.clone(),
        None => registry.default_validators(context).into_iter().map(RuleEntry::named).collect(),
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
    #[error("preference rule `{0}` reads the VM's exit time but is not a temporal rule")]
    ExitTimeOutsideTemporalRule(&'static str),
    #[error("a policy may have at most one temporal preference rule")]
    TwoTemporalRules,
    #[error("host-coded preference rule `{0}` must come first, above a temporal rule")]
    MisplacedHostCodedRule(&'static str),
    #[error("preference rules `{0}` and `{1}` read two different kinds of per-host state; a policy keeps one")]
    TwoHostStates(&'static str, &'static str),
    #[error("policy.{field}: {message}")]
    Invalid { field: String, message: String },
}

/// A rule entry's error, naming the entry.
fn entry_error(list: &str, position: usize, entry: &RuleEntry, message: impl std::fmt::Display) -> PolicyError {
    PolicyError::Invalid { field: format!("{list}[{position}]"), message: format!("`{}`: {message}", entry.rule) }
}

/// A policy: validators, then strictly ordered preference rules, over lifetime classes.
#[derive(Debug)]
pub struct Policy {
    name: String,
    validators: Vec<Box<dyn ValidatorRule>>,
    preferences: Vec<Box<dyn PreferenceRule>>,
    classes: LifetimeClasses,
    /// Traits read by the rules that can be cached (everything but the tenant).
    class_traits: TraitSet,
    /// Traits read by any rule: what a request's [`RequestTraits`] are filled with.
    read_traits: TraitSet,
    /// How many leading validators are cacheable; the rest read the tenant.
    cached_validators: usize,
    /// The level of the temporal preference rule (NILAS), if any.
    temporal_level: Option<usize>,
    /// Whether the first preference rule is host-coded (LAVA): the index caches its host codes
    /// and ranks them per request.
    coded_first: bool,
    /// The per-host state the rules read ([`crate::host_state`]), if any.
    host_state: Option<HostStateKind>,
    /// The least time from now a temporal rule reads as an arriving VM's exit.
    exit_floor_s: f64,
}

/// The traits of a request that its equivalence class is made of: its [`RequestTraits`] with only
/// what the policy's cacheable rules read ([`RequestTraits::masked`]); two requests with the same
/// key get the same validity and scores on every host from those rules.
pub type ClassKey = RequestTraits;

impl Policy {
    /// The policy a configuration describes, its rules and presets looked up in `registry`
    /// ([`Registry::standard`] for the built-in ones); `compatibility` maps VM types to the hardware
    /// generations they run on (types not listed run everywhere).
    pub fn from_config(
        config: &PolicyConfig,
        compatibility: &HashMap<String, Vec<String>>,
        registry: &Registry,
    ) -> Result<Self, PolicyError> {
        if config.long_probability.is_some_and(|p| !(0.0..=1.0).contains(&p)) {
            return Err(PolicyError::Invalid { field: "long_probability".into(), message: "must be in [0, 1]".into() });
        }
        if !(config.exit_floor_s.is_finite() && config.exit_floor_s >= 0.0) {
            return Err(PolicyError::Invalid { field: "exit_floor_s".into(), message: "must be >= 0 seconds".into() });
        }
        let context = RuleContext { policy: config, compatibility };
        let build = |list: &str, position: usize, entry: &RuleEntry| {
            let builder = registry.rule(&entry.rule).ok_or_else(|| {
                let known = registry.rule_names().join(", ");
                entry_error(list, position, entry, format!("unknown rule; the rules are {known}"))
            })?;
            builder(serde_json::Value::Object(entry.params.clone()), &context)
                .map_err(|message| entry_error(list, position, entry, message))
        };
        let mut validators: Vec<Box<dyn ValidatorRule>> = Vec::new();
        for (position, entry) in validator_entries(config, registry, &context).iter().enumerate() {
            match build("validators", position, entry)? {
                BuiltRule::Validator(rule) => validators.push(rule),
                BuiltRule::Preference(..) => {
                    return Err(entry_error(
                        "validators",
                        position,
                        entry,
                        "is a preference rule: list it in `preferences`",
                    ))
                }
            }
        }
        let mut preferences: Vec<Box<dyn PreferenceRule>> = Vec::new();
        let mut classes: Option<LifetimeClasses> = None;
        for (position, entry) in preference_entries(config, registry)?.iter().enumerate() {
            match build("preferences", position, entry)? {
                BuiltRule::Preference(rule, reads) => {
                    match (&classes, reads) {
                        (Some(chosen), Some(wanted)) if *chosen != wanted => {
                            return Err(entry_error(
                                "preferences",
                                position,
                                entry,
                                format!(
                                    "reads VMs by lifetime classes {:?}, an earlier rule by {:?}: a policy has one set of classes",
                                    wanted.cutoffs_s(),
                                    chosen.cutoffs_s()
                                ),
                            ));
                        }
                        (None, Some(wanted)) => classes = Some(wanted),
                        _ => {}
                    }
                    preferences.push(rule);
                }
                BuiltRule::Validator(_) => {
                    return Err(entry_error("preferences", position, entry, "is a validator: list it in `validators`"))
                }
            }
        }
        // Rules that read exit times read a VM's expected lifetime first; with no rule reading
        // classes, those are the lifetime-interval model's (exit times only) or the two of
        // `long_threshold_s`.
        let temporal = preferences.iter().any(|rule| rule.exit_buckets().is_some());
        let classes = match (classes, temporal) {
            (Some(classes), false) => classes,
            (Some(classes), true) => classes.by_expected_lifetime(),
            (None, true) => context
                .interval_classes()
                .map_err(|message| PolicyError::Invalid { field: "class_cutoffs_s".into(), message })?
                .by_expected_lifetime(),
            (None, false) => LifetimeClasses::binary(config.long_threshold_s)
                .map_err(|source| PolicyError::Classes { field: "long_threshold_s", source })?,
        };
        let mut policy = Policy::from_rules(
            config.kind.clone(),
            validators,
            preferences,
            classes.reading_long(config.long_probability),
        )?;
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
        let mut stateful = preferences.iter().filter_map(|r| r.host_state().map(|state| (r.name(), state)));
        let host_state = stateful.next();
        if let Some(((first, state), (second, other))) = host_state.zip(stateful.next()) {
            if state.name != other.name {
                return Err(PolicyError::TwoHostStates(first, second));
            }
        }
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
        // What the host-coded rule reads is applied to the codes per request, and the exit time
        // is read by ranges: neither is cached per request class.
        let class_traits: TraitSet = validators[..cached_validators]
            .iter()
            .flat_map(|v| v.reads())
            .chain(preferences.iter().skip(usize::from(coded_first)).flat_map(|p| p.reads()))
            .filter(|t| **t != RequestTrait::ExitTime)
            .copied()
            .collect();
        let read_traits: TraitSet = validators
            .iter()
            .flat_map(|v| v.reads())
            .chain(preferences.iter().flat_map(|p| p.reads()))
            .copied()
            .collect();
        Ok(Policy {
            name: name.into(),
            validators,
            preferences,
            classes,
            class_traits,
            read_traits,
            cached_validators,
            temporal_level,
            coded_first,
            host_state: host_state.map(|(_, state)| state),
            exit_floor_s: 0.0,
        })
    }

    /// The level of the temporal preference rule (NILAS's temporal cost), if the policy has one.
    pub fn temporal_level(&self) -> Option<usize> {
        self.temporal_level
    }

    /// Whether the rules read hosts' exit times, which then follow repredictions (a stateful policy
    /// such as LAVA reads them through its timers and rules).
    pub fn reads_exit_times(&self) -> bool {
        self.temporal_level.is_some() || self.host_state.is_some()
    }

    /// Whether any rule reads a VM's prediction (its class or exit time): when none does (PBFR),
    /// predictions cannot change a decision.
    pub fn reads_predictions(&self) -> bool {
        let reads_lifetime = |reads: &[RequestTrait]| {
            reads.iter().any(|t| matches!(t, RequestTrait::LifetimeClass | RequestTrait::ExitTime))
        };
        self.host_state.is_some()
            || self.preferences.iter().any(|r| reads_lifetime(r.reads()))
            || self.validators.iter().any(|r| reads_lifetime(r.reads()))
    }

    /// Whether a prediction's interval class is read as an index into this policy's classes (more
    /// than two of them, read by interval: LA-multiclass), which must then be the model bundle's.
    pub fn reads_interval_classes(&self) -> bool {
        self.classes.reads_interval() && self.classes.count() > 2 && self.reads_predictions()
    }

    /// The name of the per-host state the rules read ([`crate::host_state`]), which the allocator
    /// then keeps.
    pub fn host_state(&self) -> Option<&'static str> {
        self.host_state.map(|kind| kind.name)
    }

    /// That state for `hosts` hosts, all in their initial state.
    pub fn create_host_state(&self, hosts: usize) -> Option<Box<dyn HostStatePolicy>> {
        self.host_state.map(|kind| (kind.create)(hosts))
    }

    /// Whether any rule may read a host's lifetime summary (class, exit time, LAVA state): when
    /// none does (PBFR), a summary that changes on its own as time passes is no change of the host
    /// to the index, and the policy's decisions do not depend on the predictions at all.
    pub fn reads_host_lifetime(&self) -> bool {
        self.reads_exit_times() || self.class_traits.contains(RequestTrait::LifetimeClass)
    }

    /// Whether a request class caches the same of a host whose lifetime summary went from `before`
    /// to `after` (its VMs unchanged): only the exit time moved, which only the temporal rule reads
    /// and which the index evaluates per request, not its per-host state code, nor its lifetime
    /// class when a cached rule reads classes (a rule reads a host's class only beside the
    /// request's, as [`Policy::reads_host_lifetime`] assumes too). The index then re-files the host
    /// by its exit time instead of re-evaluating its rules ([`crate::select`]).
    pub fn caches_alike(&self, before: &HostLifetime, after: &HostLifetime) -> bool {
        before.state_code == after.state_code
            && (before.class == after.class || !self.class_traits.contains(RequestTrait::LifetimeClass))
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

    /// What any of the policy's rules reads of a request: a request's traits need nothing else.
    pub fn read_traits(&self) -> TraitSet {
        self.read_traits
    }

    /// The traits that make a request's equivalence class: two requests are of one class when
    /// they agree on these ([`RequestTraits::same_class`]).
    pub fn class_traits(&self) -> TraitSet {
        self.class_traits
    }

    /// The equivalence class of a request.
    pub fn class_key(&self, request: &RuleRequest) -> ClassKey {
        request.traits.masked(self.class_traits)
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
            stats.push(RuleFilterStat { rule: rule.name().into(), hosts_in: remaining, hosts_kept: kept });
            remaining = kept;
        }
        for (rule, &kept) in self.preferences.iter().zip(tied) {
            stats.push(RuleFilterStat { rule: rule.name().into(), hosts_in: remaining, hosts_kept: kept });
            remaining = kept;
        }
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FitWeights;

    fn rule_names(policy: &Policy) -> (Vec<&str>, Vec<&str>) {
        (
            policy.validators().iter().map(|r| r.name()).collect(),
            policy.preferences().iter().map(|r| r.name()).collect(),
        )
    }

    /// The defaults a policy gets when it lists no validators, and the rule `prefer_non_empty =
    /// false` drops, are the registry's: an embedder's registry changes them, no framework file.
    #[test]
    fn default_validators_and_the_non_empty_switch_are_the_registrys() {
        use crate::rules::{BestFit, FitsResources, HardwareCompatible, LifetimeAlignment};
        let registry = Registry::empty()
            .with_default_validator::<HardwareCompatible>()
            .with_default_validator::<FitsResources>()
            .with_non_empty_switch::<LifetimeAlignment>()
            .with_rule::<BestFit>()
            .with_preset("aligned", &["lifetime-alignment", "best-fit"]);
        let config = PolicyConfig { kind: "aligned".into(), ..PolicyConfig::default() };
        let plain = Policy::from_config(&config, &HashMap::new(), &registry).unwrap();
        assert_eq!(rule_names(&plain), (vec!["fits-resources"], vec!["lifetime-alignment", "best-fit"]));
        let compat = HashMap::from([("M128".to_owned(), vec!["gen8".to_owned()])]);
        let switched = PolicyConfig { prefer_non_empty: false, ..config };
        let policy = Policy::from_config(&switched, &compat, &registry).unwrap();
        assert_eq!(rule_names(&policy), (vec!["hardware-compatible", "fits-resources"], vec!["best-fit"]));
    }

    #[test]
    fn policies_have_their_rules_in_order() {
        let none = HashMap::new();
        let pbfr = Policy::from_config(&PolicyConfig::preset("pbfr"), &none, &Registry::standard()).unwrap();
        assert_eq!(
            rule_names(&pbfr),
            (vec!["host-available", "fits-resources", "tenant-spread"], vec!["prefer-non-empty", "best-fit"])
        );
        assert_eq!(pbfr.cached_validators(), 2);
        let lar = Policy::from_config(&PolicyConfig::preset("la-binary"), &none, &Registry::standard()).unwrap();
        assert_eq!(rule_names(&lar).1, vec!["prefer-non-empty", "lifetime-alignment", "best-fit"]);
        assert_eq!(lar.classes().count(), 2);
        let multi = Policy::from_config(&PolicyConfig::preset("la-multiclass"), &none, &Registry::standard()).unwrap();
        assert_eq!(multi.classes().count(), 11);
        let nilas = Policy::from_config(&PolicyConfig::preset("nilas"), &none, &Registry::standard()).unwrap();
        assert_eq!(rule_names(&nilas).1, vec!["prefer-non-empty", "temporal-cost", "best-fit"]);
        assert_eq!(nilas.temporal_level(), Some(1));
        let lava = Policy::from_config(&PolicyConfig::preset("lava"), &none, &Registry::standard()).unwrap();
        assert_eq!(rule_names(&lava).1, vec!["lava", "temporal-cost", "best-fit"]);
        assert!(lava.host_state() == Some("lava") && lava.reads_exit_times() && !multi.reads_exit_times());
        assert!(multi.reads_interval_classes() && !lar.reads_interval_classes() && !nilas.reads_interval_classes());
        assert!(!pbfr.reads_predictions() && lar.reads_predictions() && nilas.reads_predictions());
        assert_eq!(lava.classes().count(), 5);
        let compat = HashMap::from([("M128".to_owned(), vec!["gen8".to_owned()])]);
        let dpbfr = Policy::from_config(
            &PolicyConfig { prefer_non_empty: false, ..PolicyConfig::preset("dpbfr") },
            &compat,
            &Registry::standard(),
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
        let mut traits = RequestTraits::new(domain::Resources::from_whole(2.0, 8.0, 0.0).unwrap(), 1, "D2");
        traits.priority = domain::Priority::Low;
        traits.os = Some("linux".into());
        let request = RuleRequest { traits: &traits, exit_s: 5_000.0, spread: None };
        let demand_only = RequestTraits { demand: traits.demand, ..RequestTraits::default() };
        let pbfr = Policy::from_config(&PolicyConfig::default(), &none, &Registry::standard()).unwrap();
        assert_eq!(pbfr.class_key(&request), demand_only, "nor priority, OS or features, which no rule reads");
        let lar = Policy::from_config(&PolicyConfig::preset("la-binary"), &none, &Registry::standard()).unwrap();
        assert_eq!(lar.class_key(&request), RequestTraits { lifetime_class: 1, ..demand_only.clone() });
        let nilas = Policy::from_config(&PolicyConfig::preset("nilas"), &none, &Registry::standard()).unwrap();
        assert_eq!(nilas.class_key(&request), demand_only, "the exit time is not part of the class");
        let lava = Policy::from_config(&PolicyConfig::preset("lava"), &none, &Registry::standard()).unwrap();
        assert_eq!(
            lava.class_key(&request),
            demand_only,
            "LAVA's rule ranks cached host codes per request: its lifetime class is not part of the class"
        );
    }

    #[test]
    fn bad_configurations_name_the_field() {
        let none = HashMap::new();
        let bad_threshold = PolicyConfig { long_threshold_s: -1.0, ..PolicyConfig::preset("la-binary") };
        let err = Policy::from_config(&bad_threshold, &none, &Registry::standard()).unwrap_err().to_string();
        assert!(err.contains("long_threshold_s"), "{err}");
        let bad_cutoffs =
            PolicyConfig { class_cutoffs_s: Some(vec![10.0, 5.0]), ..PolicyConfig::preset("la-multiclass") };
        assert!(Policy::from_config(&bad_cutoffs, &none, &Registry::standard())
            .unwrap_err()
            .to_string()
            .contains("class_cutoffs_s"));
        let bad_weights = PolicyConfig {
            weights: FitWeights { cores: 0.0, memory_gib: 0.0, ssd_gib: 0.0 },
            ..PolicyConfig::default()
        };
        let err = Policy::from_config(&bad_weights, &none, &Registry::standard()).unwrap_err().to_string();
        assert!(err.contains("preferences[1]") && err.contains("`best-fit`: weights"), "{err}");
    }

    fn from_toml(text: &str) -> Result<Policy, String> {
        let config: PolicyConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        Policy::from_config(&config, &HashMap::new(), &Registry::standard()).map_err(|e| e.to_string())
    }

    #[test]
    fn a_policy_written_as_a_list_is_its_preset() {
        let listed = from_toml(
            r#"kind = "my-la"
               preferences = [{rule = "prefer-non-empty"}, {rule = "lifetime-alignment", classes = "binary"},
                              {rule = "best-fit", buckets = 3}]"#,
        )
        .unwrap();
        let preset =
            Policy::from_config(&PolicyConfig::preset("la-binary"), &HashMap::new(), &Registry::standard()).unwrap();
        assert_eq!(rule_names(&listed), rule_names(&preset));
        assert_eq!(listed.classes(), preset.classes());
        assert_eq!(listed.name(), "my-la");
        let multi =
            from_toml(r#"preferences = [{rule = "lifetime-alignment", classes = "intervals"}, {rule = "best-fit"}]"#)
                .unwrap();
        assert_eq!(multi.classes().count(), 11);
        assert!(multi.reads_interval_classes());
    }

    #[test]
    fn bad_lists_are_refused_naming_the_entry() {
        let cases = [
            (
                r#"preferences = [{rule = "best-fit"}, {rule = "best-fitt"}]"#,
                "preferences[1]: `best-fitt`: unknown rule",
            ),
            (
                r#"preferences = [{rule = "best-fit", bukets = 3}]"#,
                "preferences[0]: `best-fit`: unknown field `bukets`",
            ),
            (r#"preferences = [{rule = "best-fit", buckets = 0}]"#, "preferences[0]: `best-fit`: buckets must be"),
            (r#"preferences = [{rule = "fits-resources"}]"#, "preferences[0]: `fits-resources`: is a validator"),
            (r#"validators = [{rule = "best-fit"}]"#, "validators[0]: `best-fit`: is a preference rule"),
            (
                r#"preferences = [{rule = "lifetime-alignment"}, {rule = "lava"}]"#,
                "preferences[1]: `lava`: reads VMs by lifetime classes",
            ),
            (
                r#"preferences = [{rule = "best-fit"}, {rule = "lava"}, {rule = "temporal-cost"}]"#,
                "`lava` must come first",
            ),
            (r#"preferences = [{rule = "temporal-cost"}, {rule = "temporal-cost"}]"#, "at most one temporal"),
            (r#"kind = "lavva""#, "policy.kind: unknown policy `lavva`: name one of pbfr, dpbfr"),
        ];
        for (text, expected) in cases {
            let err = from_toml(text).unwrap_err();
            assert!(err.contains(expected), "{text}: {err}");
        }
    }
}
