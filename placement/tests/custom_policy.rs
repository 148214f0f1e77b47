//! A stateful policy of an embedder's own, outside the crate: one module (its per-host state and
//! its rule) plus one registration line, as LAVA is inside it. The allocator keeps the state,
//! calls its hooks, ranks hosts by it and snapshots it, with no change to the framework.
//!
//! The policy, "two per host": a host takes at most two VMs while others have room. Its state
//! counts the VMs placed on each host since it was last empty.

use domain::{AllocationOutcome, AllocationRequest, InventorySpec, Resources, VmId, VmRequest};
use placement::host_state::{HostStateError, HostStateKind, HostStatePolicy, HostStateStats};
use placement::lifetime::ClassIndex;
use placement::rules::{
    BuiltRule, HostView, NoParams, PreferenceRule, RegisteredRule, RequestTrait, RuleContext, RuleRequest,
};
use placement::state::{HostIndex, HostRecord};
use placement::{Allocator, AllocatorConfig, PolicyConfig, Registry, TieBreak};
use std::any::Any;

const NAME: &str = "two-per-host";

/// The state: VMs placed on each host since it was last empty.
#[derive(Debug)]
struct TwoPerHost {
    placed: Vec<u32>,
}

impl TwoPerHost {
    fn boxed(hosts: usize) -> Box<dyn HostStatePolicy> {
        Box::new(TwoPerHost { placed: vec![0; hosts] })
    }
}

impl HostStatePolicy for TwoPerHost {
    fn name(&self) -> &'static str {
        NAME
    }
    fn on_place(&mut self, host: HostIndex, _: &HostRecord, _: ClassIndex, _: f64) {
        self.placed[host.get()] += 1;
    }
    fn on_release(&mut self, host: HostIndex, record: &HostRecord, _: &VmId, _: f64) {
        if record.is_empty() {
            self.placed[host.get()] = 0;
        }
    }
    fn timer_s(&self, _: HostIndex) -> Option<f64> {
        None
    }
    fn on_timer(&mut self, _: HostIndex, _: &HostRecord, _: f64) -> bool {
        false
    }
    /// 0 below two VMs, 2 at two or more (an empty host's code is the rule's, 1).
    fn code(&self, host: HostIndex) -> u32 {
        if self.placed[host.get()] >= 2 {
            2
        } else {
            0
        }
    }
    fn snapshot(&self, host: HostIndex) -> Option<String> {
        let placed = self.placed[host.get()];
        (placed > 0).then(|| placed.to_string())
    }
    fn restore(&mut self, host: HostIndex, snapshot: Option<&str>) -> Result<(), HostStateError> {
        let error = |detail: String| HostStateError { policy: NAME, host: host.get() as u32, detail };
        self.placed[host.get()] = match snapshot {
            Some(text) => text.parse().map_err(|e| error(format!("unreadable: {e}")))?,
            None => 0,
        };
        Ok(())
    }
    fn stats(&self) -> HostStateStats {
        let full = self.placed.iter().filter(|&&n| n >= 2).count();
        HostStateStats {
            policy: NAME.to_owned(),
            by_state: [("full".to_owned(), full), ("open".to_owned(), self.placed.len() - full)].into(),
            by_class: Default::default(),
        }
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The rule: hosts below two VMs first, then empty hosts, then hosts with two or more.
#[derive(Debug)]
struct TwoPerHostRule;

impl RegisteredRule for TwoPerHostRule {
    const NAME: &'static str = NAME;
    type Params = NoParams;
    fn build(_: NoParams, _: &RuleContext) -> Result<BuiltRule, String> {
        Ok(BuiltRule::Preference(Box::new(TwoPerHostRule), None))
    }
}

impl PreferenceRule for TwoPerHostRule {
    fn name(&self) -> &'static str {
        NAME
    }
    fn reads(&self) -> &'static [RequestTrait] {
        &[]
    }
    fn host_state(&self) -> Option<HostStateKind> {
        Some(HostStateKind { name: NAME, create: TwoPerHost::boxed })
    }
    fn is_host_coded(&self) -> bool {
        true
    }
    fn host_code(&self, host: &HostView) -> u32 {
        if host.record.is_empty() {
            1
        } else {
            host.lifetime.state_code
        }
    }
    fn score(&self, host: &HostView, request: &RuleRequest) -> u32 {
        self.score_of_code(self.host_code(host), request)
    }
}

/// The one registration line (and the preset that names the rule).
fn registry() -> Registry {
    Registry::standard().with_rule::<TwoPerHostRule>().with_preset(NAME, &[NAME, "temporal-cost", "best-fit"])
}

fn allocator(registry: &Registry) -> Result<Allocator, placement::AllocatorError> {
    let spec = InventorySpec::homogeneous("z", 3, 3, Resources::from_whole(16.0, 64.0, 0.0).unwrap());
    let config =
        AllocatorConfig { policy: PolicyConfig::preset(NAME), tie_break: TieBreak::LowestIndex, ..Default::default() };
    Allocator::with_registry(&spec, &config, registry)
}

fn place(allocator: &mut Allocator, id: &str, now_s: f64) -> String {
    let vm = VmRequest::new(id, "tenant", "small", Resources::from_whole(2.0, 4.0, 0.0).unwrap());
    match allocator.allocate(&AllocationRequest::Vm(vm), now_s).unwrap().outcome {
        AllocationOutcome::Placed { placements } => placements[0].host_id.as_str().to_owned(),
        AllocationOutcome::Rejected { rejection } => panic!("rejected: {}", rejection.detail),
    }
}

#[test]
fn an_embedders_stateful_policy_is_one_module_and_one_registration_line() {
    let mut allocator = allocator(&registry()).unwrap();
    assert_eq!(allocator.host_state().map(|state| state.name()), Some(NAME), "the allocator keeps the rule's state");
    // Best fit alone would stack all of them on the first host; the state sends every third VM on.
    let hosts: Vec<String> =
        ["a", "b", "c", "d", "e"].iter().enumerate().map(|(i, id)| place(&mut allocator, id, i as f64)).collect();
    assert_eq!(hosts, ["z-h0", "z-h0", "z-h1", "z-h1", "z-h2"]);
    let state = allocator.host_state().unwrap();
    assert_eq!(state.stats().by_state["full"], 2);
    assert_eq!(state.snapshot(HostIndex(0)).as_deref(), Some("2"), "what the store would keep");
    // Emptying a host resets its count, so it takes VMs again.
    allocator.release(&VmId::from("a"), 10.0).unwrap();
    allocator.release(&VmId::from("b"), 11.0).unwrap();
    assert_eq!(allocator.host_state().unwrap().snapshot(HostIndex(0)), None);
}

#[test]
fn without_the_registration_the_policy_is_refused_by_name() {
    let error = allocator(&Registry::standard()).unwrap_err().to_string();
    assert!(error.contains(NAME) && error.contains("unknown policy"), "{error}");
}

/// A rule of the embedder's that reads a request feature the wire already carries (`pool`, one of
/// the request's `features`): the VM prefers hosts whose hardware generation the pool names. No
/// framework change: the rule declares that it reads the features, and requests that differ in
/// them fall in different placement classes of the index.
#[derive(Debug)]
struct PoolRule;

impl RegisteredRule for PoolRule {
    const NAME: &'static str = "pool";
    type Params = NoParams;
    fn build(_: NoParams, _: &RuleContext) -> Result<BuiltRule, String> {
        Ok(BuiltRule::Preference(Box::new(PoolRule), None))
    }
}

impl PreferenceRule for PoolRule {
    fn name(&self) -> &'static str {
        "pool"
    }
    fn reads(&self) -> &'static [RequestTrait] {
        &[RequestTrait::Features]
    }
    fn score(&self, host: &HostView, request: &RuleRequest) -> u32 {
        match request.features.get("pool") {
            Some(domain::FeatureValue::Text(pool)) if *pool != host.record.hardware => 1,
            _ => 0,
        }
    }
}

#[test]
fn an_embedders_rule_reads_a_request_feature_with_no_framework_change() {
    let registry = Registry::standard().with_rule::<PoolRule>().with_preset("pooled", &["pool", "best-fit"]);
    // Two clusters of two hosts: generations gen8 and gen9.
    let mut spec = InventorySpec::homogeneous("z", 2, 2, Resources::from_whole(16.0, 64.0, 0.0).unwrap());
    let mut gen9 = spec.zones[0].clusters[0].clone();
    spec.zones[0].clusters[0].hardware = "gen8".to_owned();
    gen9.hardware = "gen9".to_owned();
    gen9.id = domain::ClusterId("z-c1".to_owned());
    gen9.racks[0].id = domain::RackId("z-r1".to_owned());
    for (i, host) in gen9.racks[0].hosts.iter_mut().enumerate() {
        host.id = domain::HostId(format!("z-h{}", i + 2));
    }
    spec.zones[0].clusters.push(gen9);
    let config = AllocatorConfig {
        policy: PolicyConfig::preset("pooled"),
        tie_break: TieBreak::LowestIndex,
        ..Default::default()
    };
    let mut allocator = Allocator::with_registry(&spec, &config, &registry).unwrap();
    let mut place = |id: &str, pool: Option<&str>, now_s: f64| {
        let mut vm = VmRequest::new(id, "tenant", "small", Resources::from_whole(2.0, 4.0, 0.0).unwrap());
        if let Some(pool) = pool {
            vm.features.insert("pool".to_owned(), domain::FeatureValue::Text(pool.to_owned()));
        }
        let decision = allocator.allocate(&AllocationRequest::Vm(vm), now_s).unwrap();
        let AllocationOutcome::Placed { placements } = decision.outcome else { panic!("rejected") };
        let host = placements[0].host_id.clone();
        allocator.state().hosts()[allocator.state().host_index(&host).unwrap().get()].hardware.clone()
    };
    // Alternating pools: the cached classes of the two feature values must not mix.
    for i in 0..6 {
        assert_eq!(place(&format!("a{i}"), Some("gen9"), i as f64), "gen9");
        assert_eq!(place(&format!("b{i}"), Some("gen8"), i as f64 + 0.5), "gen8");
    }
    assert_eq!(place("none", None, 10.0), "gen8", "no pool: best fit, then the lowest index");
}
