//! The composition root: every rule a policy may name, every preset (a named preference list),
//! the validators of a policy that lists none and the rule `prefer_non_empty = false` drops.
//! [`Registry::standard`] is the one place that names the built-in rules and the six published
//! policies; the framework files (`rules/mod.rs`, `policy`, `host_state`, `select`, `allocator`)
//! name none (`e2e/tests/it/architecture.rs` checks it).
//!
//! The presets:
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
//! An embedder registers a rule or a whole policy of its own from outside the crate:
//!
//! ```
//! use placement::registry::Registry;
//! let registry = Registry::standard().with_preset("pack", &["prefer-non-empty", "best-fit"]);
//! assert!(registry.preset("pack").is_some());
//! ```
//!
//! A stateful policy (per-host state, like LAVA) is a rule whose [`crate::rules::PreferenceRule::host_state`]
//! brings its state with it, so registering the rule registers the state too.

use crate::lava::LavaPreference;
use crate::rules::{
    build, BestFit, Builder, DynamicBestFit, FitsResources, HardwareCompatible, HostAvailable, LifetimeAlignment,
    PreferHardware, PreferNonEmpty, RegisteredRule, RuleContext, TemporalCost, TenantSpreadRule,
};

/// Whether a default validator applies in a policy's context ([`RegisteredRule::by_default`]).
type ByDefault = fn(&RuleContext) -> bool;

/// The rules and presets a policy configuration may name, the validators of a policy that lists
/// none, and the rule a configuration's `prefer_non_empty = false` drops from its preset.
#[derive(Clone, Debug, Default)]
pub struct Registry {
    rules: Vec<(&'static str, Builder)>,
    presets: Vec<(&'static str, Vec<&'static str>)>,
    default_validators: Vec<(&'static str, ByDefault)>,
    non_empty_switch: Option<&'static str>,
}

impl Registry {
    /// A registry with nothing in it.
    pub fn empty() -> Self {
        Registry::default()
    }

    /// The built-in rules and the six published policies (PBFR, DPBFR, LA-binary, LA-multiclass,
    /// NILAS, LAVA) as presets. A preset entry `rule:classes` is the rule with `classes` set.
    pub fn standard() -> Self {
        Registry::empty()
            .with_default_validator::<HostAvailable>()
            .with_default_validator::<HardwareCompatible>()
            .with_default_validator::<FitsResources>()
            .with_default_validator::<TenantSpreadRule>()
            .with_non_empty_switch::<PreferNonEmpty>()
            .with_rule::<BestFit>()
            .with_rule::<DynamicBestFit>()
            .with_rule::<LifetimeAlignment>()
            .with_rule::<TemporalCost>()
            .with_rule::<LavaPreference>()
            .with_rule::<PreferHardware>()
            .with_preset("pbfr", &["prefer-non-empty", "best-fit"])
            .with_preset("dpbfr", &["prefer-non-empty", "dynamic-best-fit"])
            .with_preset("la-binary", &["prefer-non-empty", "lifetime-alignment", "best-fit"])
            .with_preset("la-multiclass", &["prefer-non-empty", "lifetime-alignment:intervals", "best-fit"])
            .with_preset("nilas", &["prefer-non-empty", "temporal-cost", "best-fit"])
            .with_preset("lava", &["lava", "temporal-cost", "best-fit"])
    }

    /// Registers rule `R` under its name (replacing a rule of that name).
    pub fn with_rule<R: RegisteredRule>(mut self) -> Self {
        self.rules.retain(|(name, _)| *name != R::NAME);
        self.rules.push((R::NAME, build::<R>));
        self
    }

    /// Registers validator `R` ([`Registry::with_rule`]) and appends it to the validators of a
    /// policy that lists none, where [`RegisteredRule::by_default`] says it applies.
    pub fn with_default_validator<R: RegisteredRule>(mut self) -> Self {
        self.default_validators.retain(|(name, _)| *name != R::NAME);
        self.default_validators.push((R::NAME, R::by_default));
        self.with_rule::<R>()
    }

    /// Registers preference rule `R` ([`Registry::with_rule`]) as the one a configuration's
    /// `prefer_non_empty = false` drops from its preset.
    pub fn with_non_empty_switch<R: RegisteredRule>(mut self) -> Self {
        self.non_empty_switch = Some(R::NAME);
        self.with_rule::<R>()
    }

    /// The validators of a policy that lists none, in `context`, in registration order.
    pub fn default_validators(&self, context: &RuleContext) -> Vec<&'static str> {
        self.default_validators.iter().filter(|(_, applies)| applies(context)).map(|(name, _)| *name).collect()
    }

    /// The preset rule `prefer_non_empty = false` drops, if one is registered.
    pub fn non_empty_switch(&self) -> Option<&'static str> {
        self.non_empty_switch
    }

    /// Registers a preset: a policy name and its preference rules in strict order (replacing a
    /// preset of that name). `prefer-non-empty` in it is dropped when a configuration sets
    /// `prefer_non_empty = false`.
    pub fn with_preset(mut self, name: &'static str, preferences: &[&'static str]) -> Self {
        self.presets.retain(|(n, _)| *n != name);
        self.presets.push((name, preferences.to_vec()));
        self
    }

    /// The builder of the rule named `name`.
    pub fn rule(&self, name: &str) -> Option<Builder> {
        self.rules.iter().find(|(n, _)| *n == name).map(|(_, build)| *build)
    }

    /// The registered rules' names, in registration order.
    pub fn rule_names(&self) -> Vec<&'static str> {
        self.rules.iter().map(|(name, _)| *name).collect()
    }

    /// The preference list of the preset named `name`.
    pub fn preset(&self, name: &str) -> Option<&[&'static str]> {
        self.presets.iter().find(|(n, _)| *n == name).map(|(_, rules)| rules.as_slice())
    }

    /// The presets' names, in registration order, for command lines and messages.
    pub fn preset_names(&self) -> Vec<&'static str> {
        self.presets.iter().map(|(name, _)| *name).collect()
    }
}
