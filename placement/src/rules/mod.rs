//! Protean's rules (paper 001 s3.2-3.3): validators that filter hosts and strictly ordered
//! preference rules that score them, lower being better.
//!
//! A rule is a small type. It declares which traits of the request it reads ([`RequestTrait`]);
//! requests that agree on every trait read by a policy's rules form one equivalence class and share
//! one cached evaluation ([`crate::select`]). Validators that read the tenant (spread) depend on the
//! single request, so they are applied on top of the cached order instead of inside it.
//!
//! Every rule is registered under its name with its parameters ([`crate::registry`],
//! [`RegisteredRule`]), so that a policy is data: an ordered list of `{rule = "...", ...parameters}`
//! entries in the allocator's TOML ([`crate::policy`]). This module is the framework and names no
//! rule; each built-in rule is a file of its own beside it (the type, its [`PreferenceRule`] or
//! [`ValidatorRule`] impl, its parameters, its [`RegisteredRule`] impl and its tests; checked by
//! `e2e/tests/it/architecture.rs`). Adding one is that file, its `mod` and `pub use` lines here and its
//! line in [`crate::registry::Registry::standard`]; outside the crate, the file and a line in an
//! embedder's own registry. `prefer_hardware.rs` is the worked example. The engine does not change.

mod best_fit;
mod dynamic_best_fit;
mod fits_resources;
mod hardware_compatible;
mod host_available;
mod lifetime_alignment;
mod prefer_hardware;
mod prefer_non_empty;
mod temporal_cost;
mod tenant_spread;

use crate::config::PolicyConfig;
use crate::host_state::HostStateKind;
use crate::lifetime::{ClassIndex, HostLifetime, LifetimeClasses};
use crate::state::{HostIndex, HostRecord, InventoryState, RackIndex};
use domain::{Features, Priority, RequestFacts, Resources};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use std::collections::HashMap;
use std::fmt::Debug;

pub use crate::config::{Buckets, FitWeights};
pub use best_fit::{BestFit, FitParams};
pub use dynamic_best_fit::DynamicBestFit;
pub use fits_resources::FitsResources;
pub use hardware_compatible::{CompatibilityParams, HardwareCompatible};
pub use host_available::HostAvailable;
pub use lifetime_alignment::{AlignmentParams, ClassChoice, LifetimeAlignment};
pub use prefer_hardware::PreferHardware;
pub use prefer_non_empty::PreferNonEmpty;
pub use temporal_cost::{bucket_of, TemporalCost, TemporalParams};
pub use tenant_spread::TenantSpreadRule;

/// Builds a registered rule from its parameters (the entry's fields other than `rule`).
pub type Builder = fn(serde_json::Value, &RuleContext) -> Result<BuiltRule, String>;

/// What a rule's parameters default to: the policy's own settings, and the hardware each VM type
/// runs on.
#[derive(Copy, Clone, Debug)]
pub struct RuleContext<'a> {
    pub policy: &'a PolicyConfig,
    pub compatibility: &'a HashMap<String, Vec<String>>,
}

impl RuleContext<'_> {
    /// Two lifetime classes split at the policy's long-lived threshold.
    pub fn binary_classes(&self) -> Result<LifetimeClasses, String> {
        LifetimeClasses::binary(self.policy.long_threshold_s).map_err(|e| format!("long_threshold_s: {e}"))
    }

    /// The policy's interval classes (`class_cutoffs_s`, default the lifetime-interval model's).
    pub fn interval_classes(&self) -> Result<LifetimeClasses, String> {
        match &self.policy.class_cutoffs_s {
            Some(cutoffs) => LifetimeClasses::new(cutoffs.clone()).map_err(|e| format!("class_cutoffs_s: {e}")),
            None => Ok(LifetimeClasses::doubling_from_15_minutes()),
        }
    }
}

/// A rule built from a policy entry.
#[derive(Debug)]
pub enum BuiltRule {
    Validator(Box<dyn ValidatorRule>),
    /// A preference rule, and the lifetime classes it reads VMs by if it reads their class (every
    /// such rule of a policy must read the same ones).
    Preference(Box<dyn PreferenceRule>, Option<LifetimeClasses>),
}

/// A rule that a policy can name: its name, its parameters and how it is built from them.
pub trait RegisteredRule {
    const NAME: &'static str;
    /// Its parameters (`#[serde(deny_unknown_fields)]`, so that a misspelt one is refused).
    type Params: DeserializeOwned;
    fn build(params: Self::Params, context: &RuleContext) -> Result<BuiltRule, String>;
    /// For a default validator ([`crate::registry::Registry::with_default_validator`]): whether a
    /// policy that lists no validators of its own gets it in this context (by default, always).
    fn by_default(context: &RuleContext) -> bool {
        let _ = context;
        true
    }
}

/// A rule without parameters.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}

/// The [`Builder`] of a registered rule: its parameters decoded, then [`RegisteredRule::build`].
pub fn build<R: RegisteredRule>(params: serde_json::Value, context: &RuleContext) -> Result<BuiltRule, String> {
    let params = serde_json::from_value(params).map_err(|e| e.to_string())?;
    R::build(params, context)
}

/// The traits a request's facts give the rules, one line each: its [`RequestTrait`], its field
/// of [`RequestTraits`] and how it is read off the [`RequestFacts`]. A trait in the first group is
/// copied on every request; one in the second (text) only when a policy's rules read it, out of
/// the way of the policies that read none. A typed request fact that a rule reads is one line here.
macro_rules! request_traits {
    (
        copied always { $( $(#[$always_doc:meta])* $always:ident => $always_field:ident: $always_ty:ty = |$f1:ident| $always_copy:expr; )* }
        copied when read { $( $(#[$read_doc:meta])* $read:ident => $read_field:ident: $read_ty:ty = |$f2:ident| $read_copy:expr; )* }
    ) => {
        /// A trait of the request that a rule may read.
        #[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
        pub enum RequestTrait {
            $( $(#[$always_doc])* $always, )*
            $( $(#[$read_doc])* $read, )*
            /// The VM's lifetime class under the policy's classes.
            LifetimeClass,
            /// The VM's predicted exit time: read only by a temporal rule
            /// ([`PreferenceRule::exit_buckets`]), which the index evaluates by ranges of host exit
            /// times instead of caching.
            ExitTime,
            /// The tenant and its placement constraints: specific to one request, never cached.
            Tenant,
        }

        /// The traits copied only when read.
        const TEXT_TRAITS: TraitSet = TraitSet(0 $( | 1 << RequestTrait::$read as u16 )*);

        /// What rules may read of a request that its placement class is made of: built once per
        /// request from the request's facts ([`RequestTraits::of`]), and once per migration from
        /// the placed VM's. Owned, so that the index keeps one as its class's representative; two
        /// requests whose traits agree on everything a policy's rules read
        /// ([`RequestTraits::masked`], [`RequestTraits::same_class`]) get the same validity and
        /// scores on every host.
        #[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
        pub struct RequestTraits {
            $( $(#[$always_doc])* pub $always_field: $always_ty, )*
            $( $(#[$read_doc])* pub $read_field: $read_ty, )*
            /// The VM's lifetime class under the policy's classes.
            pub lifetime_class: ClassIndex,
        }

        impl RequestTraits {
            /// The traits of `facts`, in lifetime class `lifetime_class`: those that `reads` names
            /// (what a policy's rules read, [`crate::Policy::read_traits`]), the rest at defaults,
            /// so that a request copies no text a rule does not read. Built on every request:
            /// inlined, with the copies of text out of the way of the policies that read none.
            #[inline]
            pub fn of(facts: &RequestFacts, lifetime_class: ClassIndex, reads: TraitSet) -> Self {
                let mut traits = RequestTraits { lifetime_class, ..Default::default() };
                $( traits.$always_field = { let $f1 = facts; $always_copy }; )*
                if reads.0 & TEXT_TRAITS.0 != 0 {
                    traits.copy_text(facts, reads);
                }
                traits
            }

            /// Copies the text traits that `reads` names.
            #[cold]
            #[inline(never)]
            fn copy_text(&mut self, facts: &RequestFacts, reads: TraitSet) {
                $( if reads.contains(RequestTrait::$read) { self.$read_field = { let $f2 = facts; $read_copy }; } )*
            }

            /// Only what `reads` names, the rest at defaults: the key of the request's placement
            /// class.
            pub fn masked(&self, reads: TraitSet) -> Self {
                let mut masked = RequestTraits::default();
                $( if reads.contains(RequestTrait::$always) { masked.$always_field = self.$always_field.clone(); } )*
                $( if reads.contains(RequestTrait::$read) { masked.$read_field = self.$read_field.clone(); } )*
                if reads.contains(RequestTrait::LifetimeClass) {
                    masked.lifetime_class = self.lifetime_class;
                }
                masked
            }

            /// Whether `self` and `other` agree on every trait in `class`: the same placement
            /// class, as [`RequestTraits::masked`] keys it (`a.masked(c) == b.masked(c)`), without
            /// building a key.
            #[inline]
            pub fn same_class(&self, other: &RequestTraits, class: TraitSet) -> bool {
                $( (!class.contains(RequestTrait::$always) || self.$always_field == other.$always_field) && )*
                $( (!class.contains(RequestTrait::$read) || self.$read_field == other.$read_field) && )*
                (!class.contains(RequestTrait::LifetimeClass) || self.lifetime_class == other.lifetime_class)
            }

            /// Hashes only the traits in `class`: requests of one placement class
            /// ([`RequestTraits::same_class`]) hash alike.
            #[inline]
            pub fn hash_class<H: std::hash::Hasher>(&self, class: TraitSet, state: &mut H) {
                use std::hash::Hash;
                $( if class.contains(RequestTrait::$always) { self.$always_field.hash(state); } )*
                $( if class.contains(RequestTrait::$read) { self.$read_field.hash(state); } )*
                if class.contains(RequestTrait::LifetimeClass) {
                    self.lifetime_class.hash(state);
                }
            }
        }
    };
}

request_traits! {
    copied always {
        /// The demand vector.
        Demand => demand: Resources = |facts| facts.demand;
        /// The VM's priority (regular or low).
        Priority => priority: Priority = |facts| facts.details.priority;
    }
    copied when read {
        /// The VM type name.
        VmType => vm_type: String = |facts| facts.vm_type.clone();
        /// The VM's operating system.
        Os => os: Option<String> = |facts| facts.details.os.clone();
        /// The request's further features (for example a trace's `batch_size`).
        Features => features: Features = |facts| facts.details.features.clone();
    }
}

/// A set of [`RequestTrait`]s (what a policy's rules read), as bits: read on every request.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct TraitSet(u16);

impl TraitSet {
    #[inline]
    pub fn contains(self, t: RequestTrait) -> bool {
        self.0 & 1 << t as u16 != 0
    }
}

impl FromIterator<RequestTrait> for TraitSet {
    fn from_iter<I: IntoIterator<Item = RequestTrait>>(traits: I) -> Self {
        TraitSet(traits.into_iter().fold(0, |bits, t| bits | 1 << t as u16))
    }
}

/// A tenant's spread constraint for one request: at most `max_per_rack` of its VMs on one rack.
#[derive(Copy, Clone, Debug)]
pub struct TenantSpread<'a> {
    pub max_per_rack: u32,
    /// The tenant's VMs per rack right now.
    pub vms_per_rack: &'a HashMap<RackIndex, u32>,
}

impl RequestTraits {
    /// A request of `demand` in class `lifetime_class` of type `vm_type`, the rest at defaults
    /// (for tests and tools).
    pub fn new(demand: Resources, lifetime_class: ClassIndex, vm_type: &str) -> Self {
        RequestTraits { demand, lifetime_class, vm_type: vm_type.to_owned(), ..RequestTraits::default() }
    }
}

/// What rules may read of a request: its traits (built by the caller, once per request), and what
/// is specific to this one request (its
/// exit time and its tenant's spread), which no placement class caches.
#[derive(Clone, Debug)]
pub struct RuleRequest<'a> {
    pub traits: &'a RequestTraits,
    /// When the VM is predicted to exit (request time + predicted lifetime), in the allocator's
    /// clock; infinite when only "long" is known.
    pub exit_s: f64,
    /// Present only when the request asks for spread.
    pub spread: Option<TenantSpread<'a>>,
}

impl std::ops::Deref for RuleRequest<'_> {
    type Target = RequestTraits;
    fn deref(&self) -> &RequestTraits {
        self.traits
    }
}

/// What rules may read of a host.
#[derive(Copy, Clone, Debug)]
pub struct HostView<'a> {
    pub index: HostIndex,
    pub record: &'a HostRecord,
    pub lifetime: &'a HostLifetime,
}

/// A hard constraint.
pub trait ValidatorRule: Debug + Send + Sync {
    fn name(&self) -> &'static str;
    fn reads(&self) -> &'static [RequestTrait];
    fn is_valid(&self, host: &HostView, request: &RuleRequest) -> bool;

    /// For a rule that reads the tenant: every host it rejects for this request, when that list is
    /// cheap to name (a few racks), so that the cached evaluation is corrected instead of walked.
    /// `None` makes the engine check the rule on every otherwise valid host.
    fn rejected_hosts(&self, _request: &RuleRequest, _state: &InventoryState) -> Option<Vec<HostIndex>> {
        None
    }
}

/// A soft preference: a quantized score, lower is better.
pub trait PreferenceRule: Debug + Send + Sync {
    fn name(&self) -> &'static str;
    fn reads(&self) -> &'static [RequestTrait];
    fn score(&self, host: &HostView, request: &RuleRequest) -> u32;

    /// For a temporal rule: its score is the index of `max(request exit - host exit, 0)` in these
    /// increasing bucket bounds (the first is 0). The index then finds the best hosts by ranges of
    /// host exit times ([`crate::select`]) instead of caching a score per host.
    fn exit_buckets(&self) -> Option<&[f64]> {
        None
    }

    /// Whether the rule is host-coded: its score is [`PreferenceRule::score_of_code`] of a code
    /// of the host alone ([`PreferenceRule::host_code`]) and the request. The index then caches
    /// the code, not the score, so requests that differ only in what this rule reads share one
    /// cached class, and the codes are ranked per request when choosing.
    fn is_host_coded(&self) -> bool {
        false
    }

    /// The kind of per-host policy state the rule reads ([`crate::host_state`]), which the
    /// allocator then keeps; at most one kind per policy. The rule brings its state with it, so
    /// registering the rule is all a stateful policy needs.
    fn host_state(&self) -> Option<HostStateKind> {
        None
    }

    /// The host's code (host-coded rules only).
    fn host_code(&self, _host: &HostView) -> u32 {
        0
    }

    /// The score of a host with this code for this request (host-coded rules only).
    fn score_of_code(&self, code: u32, _request: &RuleRequest) -> u32 {
        code
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_class_is_one_masked_key() {
        use std::hash::{DefaultHasher, Hasher};
        let demand = |cores| Resources::from_whole(cores, 8.0, 0.0).unwrap();
        let mut with_features = RequestTraits::new(demand(2.0), 1, "D2");
        with_features.features = Features::from([("pool".to_owned(), domain::FeatureValue::Number(1.0))]);
        let variants = [
            RequestTraits::new(demand(2.0), 1, "D2"),
            RequestTraits::new(demand(2.0), 0, "D2"),
            RequestTraits::new(demand(4.0), 1, "D2"),
            RequestTraits::new(demand(2.0), 1, "D4"),
            RequestTraits { priority: Priority::Low, ..RequestTraits::new(demand(2.0), 1, "D2") },
            RequestTraits { os: Some("linux".into()), ..RequestTraits::new(demand(2.0), 1, "D2") },
            with_features,
        ];
        let all = [
            RequestTrait::Demand,
            RequestTrait::LifetimeClass,
            RequestTrait::VmType,
            RequestTrait::Priority,
            RequestTrait::Os,
            RequestTrait::Features,
        ];
        let hash = |traits: &RequestTraits, class| {
            let mut hasher = DefaultHasher::new();
            traits.hash_class(class, &mut hasher);
            hasher.finish()
        };
        for mask in 0..1u32 << all.len() {
            let class: TraitSet = all.iter().enumerate().filter(|(i, _)| mask & 1 << i != 0).map(|(_, t)| *t).collect();
            for a in &variants {
                for b in &variants {
                    let same = a.masked(class) == b.masked(class);
                    assert_eq!(a.same_class(b, class), same, "{a:?} {b:?} {class:?}");
                    if same {
                        assert_eq!(hash(a, class), hash(b, class));
                    }
                }
            }
        }
    }
}
