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
//! entries in the allocator's TOML ([`crate::policy`]). Adding a rule is one module (the type, its
//! [`PreferenceRule`] or [`ValidatorRule`] impl, its [`RegisteredRule`] impl and its tests) plus its
//! line in [`crate::registry::Registry::standard`], or in an embedder's own registry;
//! `prefer_hardware.rs` is the worked example. The engine does not change.

mod prefer_hardware;

use crate::config::PolicyConfig;
use crate::host_state::HostStateKind;
use crate::lifetime::{ClassIndex, HostLifetime, LifetimeClasses};
use crate::state::{HostIndex, HostRecord, InventoryState, RackIndex};
use domain::{FeatureValue, HostState, Priority, Resources, VmRequest};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;

pub use crate::config::{Buckets, FitWeights};
pub use prefer_hardware::PreferHardware;

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

/// The host takes new VMs (not drained for maintenance or defragmentation, not failed).
#[derive(Debug)]
pub struct HostAvailable;

impl ValidatorRule for HostAvailable {
    fn name(&self) -> &'static str {
        <Self as RegisteredRule>::NAME
    }
    fn reads(&self) -> &'static [RequestTrait] {
        &[]
    }
    fn is_valid(&self, host: &HostView, _: &RuleRequest) -> bool {
        host.record.state == HostState::Available
    }
}

/// The VM type runs on the host's hardware generation. Types not listed run everywhere.
#[derive(Debug)]
pub struct HardwareCompatible {
    /// VM type -> hardware generations it runs on.
    pub allowed: HashMap<String, Vec<String>>,
}

impl ValidatorRule for HardwareCompatible {
    fn name(&self) -> &'static str {
        <Self as RegisteredRule>::NAME
    }
    fn reads(&self) -> &'static [RequestTrait] {
        &[RequestTrait::VmType]
    }
    fn is_valid(&self, host: &HostView, request: &RuleRequest) -> bool {
        self.allowed.get(&request.vm_type).is_none_or(|generations| generations.contains(&host.record.hardware))
    }
}

/// The demand fits the host's free capacity in every dimension.
#[derive(Debug)]
pub struct FitsResources;

impl ValidatorRule for FitsResources {
    fn name(&self) -> &'static str {
        <Self as RegisteredRule>::NAME
    }
    fn reads(&self) -> &'static [RequestTrait] {
        &[RequestTrait::Demand]
    }
    fn is_valid(&self, host: &HostView, request: &RuleRequest) -> bool {
        request.demand.fits_within(&host.record.free())
    }
}

/// At most K VMs of the tenant per rack, when the request asks for it.
#[derive(Debug)]
pub struct TenantSpreadRule;

impl ValidatorRule for TenantSpreadRule {
    fn name(&self) -> &'static str {
        <Self as RegisteredRule>::NAME
    }
    fn reads(&self) -> &'static [RequestTrait] {
        &[RequestTrait::Tenant]
    }
    fn is_valid(&self, host: &HostView, request: &RuleRequest) -> bool {
        request.spread.is_none_or(|spread| {
            spread.vms_per_rack.get(&host.record.rack_index).copied().unwrap_or(0) < spread.max_per_rack
        })
    }

    fn rejected_hosts(&self, request: &RuleRequest, state: &InventoryState) -> Option<Vec<HostIndex>> {
        let Some(spread) = request.spread else { return Some(Vec::new()) };
        Some(
            spread
                .vms_per_rack
                .iter()
                .filter(|(_, &count)| count >= spread.max_per_rack)
                .flat_map(|(&rack, _)| state.rack_hosts(rack).iter().copied())
                .collect(),
        )
    }
}

/// Non-empty hosts first: an empty host is opened only when nothing else fits.
#[derive(Debug)]
pub struct PreferNonEmpty;

impl PreferenceRule for PreferNonEmpty {
    fn name(&self) -> &'static str {
        <Self as RegisteredRule>::NAME
    }
    fn reads(&self) -> &'static [RequestTrait] {
        &[]
    }
    fn score(&self, host: &HostView, _: &RuleRequest) -> u32 {
        u32::from(host.record.is_empty())
    }
}

/// Prefer Best Fit (PBFR): the weighted leftover after placement, quantized.
#[derive(Debug)]
pub struct BestFit {
    pub buckets: Buckets,
    pub weights: FitWeights,
}

impl PreferenceRule for BestFit {
    fn name(&self) -> &'static str {
        <Self as RegisteredRule>::NAME
    }
    fn reads(&self) -> &'static [RequestTrait] {
        &[RequestTrait::Demand]
    }
    fn score(&self, host: &HostView, request: &RuleRequest) -> u32 {
        let record = host.record;
        self.buckets.quantize(self.weights.leftover_share(&record.capacity, &record.free(), &request.demand))
    }
}

/// DPBFR (paper 003 s4.4 V1): best fit with finer buckets for long-lived VMs.
#[derive(Debug)]
pub struct DynamicBestFit {
    pub long: Buckets,
    pub short: Buckets,
    pub weights: FitWeights,
}

impl PreferenceRule for DynamicBestFit {
    fn name(&self) -> &'static str {
        <Self as RegisteredRule>::NAME
    }
    fn reads(&self) -> &'static [RequestTrait] {
        &[RequestTrait::Demand, RequestTrait::LifetimeClass]
    }
    fn score(&self, host: &HostView, request: &RuleRequest) -> u32 {
        let buckets = if request.lifetime_class > 0 { self.long } else { self.short };
        let record = host.record;
        buckets.quantize(self.weights.leftover_share(&record.capacity, &record.free(), &request.demand))
    }
}

/// Lifetime alignment (LAR, paper 003 Alg. 2 as a rule): a VM above class 0 prefers hosts of its own
/// class; class-0 VMs have no preference.
#[derive(Debug)]
pub struct LifetimeAlignment;

impl PreferenceRule for LifetimeAlignment {
    fn name(&self) -> &'static str {
        <Self as RegisteredRule>::NAME
    }
    fn reads(&self) -> &'static [RequestTrait] {
        &[RequestTrait::LifetimeClass]
    }
    fn score(&self, host: &HostView, request: &RuleRequest) -> u32 {
        u32::from(
            request.lifetime_class != 0 && (host.record.is_empty() || host.lifetime.class != request.lifetime_class),
        )
    }
}

/// NILAS / LAS temporal cost (paper 000 s4.2): the bucket of how much later than the host's last VM
/// this VM is predicted to exit, `max(vm_exit - host_exit, 0)`, over its bucket bounds (the paper's
/// [`TemporalCost::BUCKETS_S`] by default). An empty host's exit is minus infinity, so it costs the
/// most.
#[derive(Debug)]
pub struct TemporalCost {
    bounds_s: Vec<f64>,
}

impl Default for TemporalCost {
    fn default() -> Self {
        TemporalCost { bounds_s: Self::BUCKETS_S.to_vec() }
    }
}

impl TemporalCost {
    /// 0, 30 min, 60 min, 90 min, 2 h, 3 h, 4 h, 6 h, 12 h, 24 h, 168 h.
    pub const BUCKETS_S: [f64; 11] =
        [0.0, 1_800.0, 3_600.0, 5_400.0, 7_200.0, 10_800.0, 14_400.0, 21_600.0, 43_200.0, 86_400.0, 604_800.0];

    /// A temporal cost over other bucket bounds: 0 first, then strictly increasing finite
    /// seconds (`None` otherwise).
    pub fn with_bounds(bounds_s: Vec<f64>) -> Option<Self> {
        let valid = bounds_s.first() == Some(&0.0)
            && bounds_s.windows(2).all(|w| w[0] < w[1])
            && bounds_s.iter().all(|b| b.is_finite());
        valid.then_some(TemporalCost { bounds_s })
    }

    /// The paper's cost of a VM exiting at `vm_exit_s` on a host whose VMs exit by `host_exit_s`.
    pub fn cost(vm_exit_s: f64, host_exit_s: f64) -> u32 {
        bucket_of(&Self::BUCKETS_S, vm_exit_s, host_exit_s)
    }
}

/// Index of `max(vm_exit - host_exit, 0)` in increasing `bounds` (the first 0); a VM that exits no
/// later than the host (both infinite included) is in bucket 0.
pub fn bucket_of(bounds: &[f64], vm_exit_s: f64, host_exit_s: f64) -> u32 {
    if vm_exit_s <= host_exit_s || vm_exit_s.is_nan() || host_exit_s.is_nan() {
        return 0;
    }
    let delta = vm_exit_s - host_exit_s;
    (bounds.partition_point(|&b| b <= delta).max(1) - 1) as u32
}

impl PreferenceRule for TemporalCost {
    fn name(&self) -> &'static str {
        <Self as RegisteredRule>::NAME
    }
    fn reads(&self) -> &'static [RequestTrait] {
        &[RequestTrait::ExitTime]
    }
    fn score(&self, host: &HostView, request: &RuleRequest) -> u32 {
        bucket_of(&self.bounds_s, request.exit_s, host.lifetime.exit_s)
    }
    fn exit_buckets(&self) -> Option<&[f64]> {
        Some(&self.bounds_s)
    }
}

impl RegisteredRule for HostAvailable {
    const NAME: &'static str = "host-available";
    type Params = NoParams;
    fn build(_: NoParams, _: &RuleContext) -> Result<BuiltRule, String> {
        Ok(BuiltRule::Validator(Box::new(HostAvailable)))
    }
}

/// `hardware-compatible` reads the allocator's `compatibility` table unless given its own.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompatibilityParams {
    pub allowed: Option<HashMap<String, Vec<String>>>,
}

impl RegisteredRule for HardwareCompatible {
    const NAME: &'static str = "hardware-compatible";
    type Params = CompatibilityParams;
    fn build(params: CompatibilityParams, context: &RuleContext) -> Result<BuiltRule, String> {
        let allowed = params.allowed.unwrap_or_else(|| context.compatibility.clone());
        Ok(BuiltRule::Validator(Box::new(HardwareCompatible { allowed })))
    }
}

impl RegisteredRule for FitsResources {
    const NAME: &'static str = "fits-resources";
    type Params = NoParams;
    fn build(_: NoParams, _: &RuleContext) -> Result<BuiltRule, String> {
        Ok(BuiltRule::Validator(Box::new(FitsResources)))
    }
}

impl RegisteredRule for TenantSpreadRule {
    const NAME: &'static str = "tenant-spread";
    type Params = NoParams;
    fn build(_: NoParams, _: &RuleContext) -> Result<BuiltRule, String> {
        Ok(BuiltRule::Validator(Box::new(TenantSpreadRule)))
    }
}

impl RegisteredRule for PreferNonEmpty {
    const NAME: &'static str = "prefer-non-empty";
    type Params = NoParams;
    fn build(_: NoParams, _: &RuleContext) -> Result<BuiltRule, String> {
        Ok(BuiltRule::Preference(Box::new(PreferNonEmpty), None))
    }
}

/// `best-fit` and `dynamic-best-fit` default to the policy's buckets and weights.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FitParams {
    pub buckets: Option<Buckets>,
    pub long_buckets: Option<Buckets>,
    pub short_buckets: Option<Buckets>,
    pub weights: Option<FitWeights>,
}

fn checked_weights(weights: FitWeights) -> Result<FitWeights, String> {
    let all = [weights.cores, weights.memory_gib, weights.ssd_gib];
    if all.iter().any(|w| !w.is_finite() || *w < 0.0) || all.iter().all(|w| *w == 0.0) {
        return Err("weights: at least one weight must be positive, and none negative or non-finite".to_owned());
    }
    Ok(weights)
}

impl RegisteredRule for BestFit {
    const NAME: &'static str = "best-fit";
    type Params = FitParams;
    fn build(params: FitParams, context: &RuleContext) -> Result<BuiltRule, String> {
        if params.long_buckets.is_some() || params.short_buckets.is_some() {
            return Err("long_buckets and short_buckets belong to `dynamic-best-fit`".to_owned());
        }
        let weights = checked_weights(params.weights.unwrap_or(context.policy.weights))?;
        let buckets = params.buckets.unwrap_or(context.policy.buckets);
        Ok(BuiltRule::Preference(Box::new(BestFit { buckets, weights }), None))
    }
}

impl RegisteredRule for DynamicBestFit {
    const NAME: &'static str = "dynamic-best-fit";
    type Params = FitParams;
    fn build(params: FitParams, context: &RuleContext) -> Result<BuiltRule, String> {
        if params.buckets.is_some() {
            return Err("`dynamic-best-fit` takes long_buckets and short_buckets, not buckets".to_owned());
        }
        let rule = DynamicBestFit {
            long: params.long_buckets.unwrap_or(context.policy.long_buckets),
            short: params.short_buckets.unwrap_or(context.policy.short_buckets),
            weights: checked_weights(params.weights.unwrap_or(context.policy.weights))?,
        };
        Ok(BuiltRule::Preference(Box::new(rule), Some(context.binary_classes()?)))
    }
}

/// Which lifetime classes `lifetime-alignment` aligns VMs by.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClassChoice {
    /// Short and long, split at the policy's `long_threshold_s` (LA-binary).
    #[default]
    Binary,
    /// The policy's `class_cutoffs_s`, the lifetime-interval model's classes (LA-multiclass).
    Intervals,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlignmentParams {
    #[serde(default)]
    pub classes: ClassChoice,
}

impl RegisteredRule for LifetimeAlignment {
    const NAME: &'static str = "lifetime-alignment";
    type Params = AlignmentParams;
    fn build(params: AlignmentParams, context: &RuleContext) -> Result<BuiltRule, String> {
        let classes = match params.classes {
            ClassChoice::Binary => context.binary_classes()?,
            ClassChoice::Intervals => context.interval_classes()?,
        };
        Ok(BuiltRule::Preference(Box::new(LifetimeAlignment), Some(classes)))
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemporalParams {
    /// Bucket bounds in seconds (0 first, increasing); default the policy's `temporal_buckets_s`.
    pub buckets_s: Option<Vec<f64>>,
}

impl RegisteredRule for TemporalCost {
    const NAME: &'static str = "temporal-cost";
    type Params = TemporalParams;
    fn build(params: TemporalParams, context: &RuleContext) -> Result<BuiltRule, String> {
        let (field, bounds) = match params.buckets_s {
            Some(bounds) => ("buckets_s", Some(bounds)),
            None => ("the policy's temporal_buckets_s", context.policy.temporal_buckets_s.clone()),
        };
        let rule = match bounds {
            Some(bounds) => TemporalCost::with_bounds(bounds.clone()).ok_or_else(|| {
                format!("{field}: must start at 0 and increase strictly, in finite seconds; got {bounds:?}")
            })?,
            None => TemporalCost::default(),
        };
        Ok(BuiltRule::Preference(Box::new(rule), None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Paper 000 s4.2: "if delta T = 70m, the temporal cost is 2".
    #[test]
    fn temporal_cost_follows_the_papers_example() {
        let minute = 60.0;
        assert_eq!(TemporalCost::cost(1_000.0 + 70.0 * minute, 1_000.0), 2);
        assert_eq!(TemporalCost::cost(1_000.0, 5_000.0), 0, "exits before the host: no cost");
        assert_eq!(TemporalCost::cost(29.0 * minute, 0.0), 0);
        assert_eq!(TemporalCost::cost(30.0 * minute, 0.0), 1);
        assert_eq!(TemporalCost::cost(90.0 * minute, 0.0), 3);
        assert_eq!(TemporalCost::cost(1e9, 0.0), 10);
        assert_eq!(TemporalCost::cost(100.0, f64::NEG_INFINITY), 10, "an empty host costs the most");
        assert_eq!(TemporalCost::cost(f64::INFINITY, f64::INFINITY), 0);
        assert_eq!(TemporalCost::cost(f64::INFINITY, 1e6), 10);
    }

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

    #[test]
    fn quantization_follows_protean() {
        assert_eq!(Buckets::Quantized(3).quantize(0.0), 0);
        assert_eq!(Buckets::Quantized(3).quantize(0.2), 1);
        assert_eq!(Buckets::Quantized(3).quantize(0.34), 2);
        assert_eq!(Buckets::Quantized(3).quantize(1.0), 3);
        assert!(Buckets::Exact.quantize(0.3) < Buckets::Exact.quantize(0.3000001));
    }

    #[test]
    fn buckets_parse_from_numbers_or_exact() {
        #[derive(Deserialize)]
        struct W {
            b: Buckets,
        }
        assert_eq!(toml::from_str::<W>("b = 5").unwrap().b, Buckets::Quantized(5));
        assert_eq!(toml::from_str::<W>("b = \"exact\"").unwrap().b, Buckets::Exact);
        assert!(toml::from_str::<W>("b = 0").is_err());
        assert!(toml::from_str::<W>("b = \"fine\"").is_err());
    }

    #[test]
    fn leftover_share_weighs_dimensions() {
        let cap = Resources::from_whole(48.0, 384.0, 0.0).unwrap();
        let weights = FitWeights::default();
        let full = weights.leftover_share(&cap, &cap, &cap);
        assert_eq!(full, 0.0);
        let half_cores = Resources::from_whole(24.0, 384.0, 0.0).unwrap();
        let share = weights.leftover_share(&cap, &cap, &half_cores);
        assert!((share - 2.0 / 3.0 * 0.5).abs() < 1e-12, "{share}");
    }
}
