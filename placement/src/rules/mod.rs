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
//! `e2e/tests/architecture.rs`). Adding one is that file, its `mod` and `pub use` lines here and its
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
use domain::{FeatureValue, Priority, Resources, VmRequest};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
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

/// A trait of the request that a rule may read.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum RequestTrait {
    /// The demand vector.
    Demand,
    /// The VM's lifetime class under the policy's classes.
    LifetimeClass,
    /// The VM type name.
    VmType,
    /// The VM's predicted exit time: read only by a temporal rule ([`PreferenceRule::exit_buckets`]),
    /// which the index evaluates by ranges of host exit times instead of caching.
    ExitTime,
    /// The tenant and its placement constraints: specific to one request, never cached.
    Tenant,
    /// The VM's priority (regular or low).
    Priority,
    /// The VM's operating system.
    Os,
    /// The request's extra features.
    Features,
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

/// The traits held as text (copied only when a rule reads them).
const TEXT_TRAITS: TraitSet =
    TraitSet(1 << RequestTrait::VmType as u16 | 1 << RequestTrait::Os as u16 | 1 << RequestTrait::Features as u16);

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

/// What rules may read of a request that its placement class is made of: built once per request
/// from the request itself ([`RequestTraits::of`]), and once per migration from the placed VM's
/// whole request. Owned, so that the index keeps one as its class's representative; two requests
/// whose traits agree on everything a policy's rules read ([`RequestTraits::masked`],
/// [`RequestTraits::same_class`]) get the same validity and scores on every host. A new trait that
/// a rule reads is a field here, its [`RequestTrait`], its line in [`RequestTraits::of`] (or
/// `copy_text`), [`RequestTraits::masked`], [`RequestTraits::same_class`] and
/// [`RequestTraits::hash_class`], and the rule.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct RequestTraits {
    /// The demand vector.
    pub demand: Resources,
    /// The VM's lifetime class under the policy's classes.
    pub lifetime_class: ClassIndex,
    pub vm_type: String,
    pub priority: Priority,
    pub os: Option<String>,
    /// The request's extra features (for example a trace's `batch_size`).
    pub features: Features,
}

/// A request's extra features as its [`RequestTraits`] hold them, read as the map itself: a map
/// only when there are any, so that traits without features (most requests, and every request of a
/// policy whose rules read none) have no map to drop. Traits are built and dropped on every
/// request, and an empty map's drop is a call into the map's code every time.
#[derive(Clone, Debug, Default)]
pub struct Features(Option<BTreeMap<String, FeatureValue>>);

static NO_FEATURES: BTreeMap<String, FeatureValue> = BTreeMap::new();

impl From<&BTreeMap<String, FeatureValue>> for Features {
    fn from(features: &BTreeMap<String, FeatureValue>) -> Self {
        Features((!features.is_empty()).then(|| features.clone()))
    }
}

impl std::ops::Deref for Features {
    type Target = BTreeMap<String, FeatureValue>;
    fn deref(&self) -> &BTreeMap<String, FeatureValue> {
        self.0.as_ref().unwrap_or(&NO_FEATURES)
    }
}

impl PartialEq for Features {
    fn eq(&self, other: &Features) -> bool {
        **self == **other
    }
}

impl Eq for Features {}

impl std::hash::Hash for Features {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (**self).hash(state);
    }
}

impl RequestTraits {
    /// The traits of `vm`, in lifetime class `lifetime_class`: those that `reads` names (what a
    /// policy's rules read, [`crate::Policy::read_traits`]), the rest at defaults, so that a
    /// request copies no text a rule does not read. Built on every request: inlined, with the
    /// copies of text out of the way of the policies that read none.
    #[inline]
    pub fn of(vm: &VmRequest, lifetime_class: ClassIndex, reads: TraitSet) -> Self {
        let mut traits =
            RequestTraits { demand: vm.demand, lifetime_class, priority: vm.priority, ..Default::default() };
        if reads.0 & TEXT_TRAITS.0 != 0 {
            traits.copy_text(vm, reads);
        }
        traits
    }

    /// Copies the text traits that `reads` names (VM type, OS, features).
    #[cold]
    #[inline(never)]
    fn copy_text(&mut self, vm: &VmRequest, reads: TraitSet) {
        let reads = |t| reads.contains(t);
        if reads(RequestTrait::VmType) {
            self.vm_type = vm.vm_type.clone();
        }
        if reads(RequestTrait::Os) {
            self.os = vm.os.clone();
        }
        if reads(RequestTrait::Features) {
            self.features = Features::from(&vm.features);
        }
    }

    /// A request of `demand` in class `lifetime_class` of type `vm_type`, the rest at defaults
    /// (for tests and tools).
    pub fn new(demand: Resources, lifetime_class: ClassIndex, vm_type: &str) -> Self {
        RequestTraits { demand, lifetime_class, vm_type: vm_type.to_owned(), ..RequestTraits::default() }
    }

    /// Only what `reads` names, the rest at defaults: the key of the request's placement class.
    pub fn masked(&self, reads: TraitSet) -> Self {
        let reads = |t| reads.contains(t);
        RequestTraits {
            demand: if reads(RequestTrait::Demand) { self.demand } else { Resources::default() },
            lifetime_class: if reads(RequestTrait::LifetimeClass) { self.lifetime_class } else { 0 },
            vm_type: if reads(RequestTrait::VmType) { self.vm_type.clone() } else { String::new() },
            priority: if reads(RequestTrait::Priority) { self.priority } else { Priority::default() },
            os: if reads(RequestTrait::Os) { self.os.clone() } else { None },
            features: if reads(RequestTrait::Features) { self.features.clone() } else { Features::default() },
        }
    }

    /// Whether `self` and `other` agree on every trait in `class`: the same placement class, as
    /// [`RequestTraits::masked`] keys it (`a.masked(c) == b.masked(c)`), without building a key.
    #[inline]
    pub fn same_class(&self, other: &RequestTraits, class: TraitSet) -> bool {
        let reads = |t| class.contains(t);
        (!reads(RequestTrait::Demand) || self.demand == other.demand)
            && (!reads(RequestTrait::LifetimeClass) || self.lifetime_class == other.lifetime_class)
            && (!reads(RequestTrait::VmType) || self.vm_type == other.vm_type)
            && (!reads(RequestTrait::Priority) || self.priority == other.priority)
            && (!reads(RequestTrait::Os) || self.os == other.os)
            && (!reads(RequestTrait::Features) || self.features == other.features)
    }

    /// Hashes only the traits in `class`: requests of one placement class
    /// ([`RequestTraits::same_class`]) hash alike.
    #[inline]
    pub fn hash_class<H: std::hash::Hasher>(&self, class: TraitSet, state: &mut H) {
        use std::hash::Hash;
        let reads = |t| class.contains(t);
        if reads(RequestTrait::Demand) {
            self.demand.hash(state);
        }
        if reads(RequestTrait::LifetimeClass) {
            self.lifetime_class.hash(state);
        }
        if reads(RequestTrait::VmType) {
            self.vm_type.hash(state);
        }
        if reads(RequestTrait::Priority) {
            self.priority.hash(state);
        }
        if reads(RequestTrait::Os) {
            self.os.hash(state);
        }
        if reads(RequestTrait::Features) {
            self.features.hash(state);
        }
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
        with_features.features = Features::from(&BTreeMap::from([("pool".to_owned(), FeatureValue::Number(1.0))]));
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
        assert!(Features::from(&BTreeMap::new()).0.is_none(), "no features, no map");
    }
}
