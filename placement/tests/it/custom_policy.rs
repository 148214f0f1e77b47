//! A rule of an embedder's own, outside the crate: one type and one registration line. A stateful
//! policy of an embedder's own, run by the shipped allocator service and `simulate`, is the crate
//! `examples/two-per-host-policy`.

use domain::{AllocationOutcome, AllocationRequest, InventorySpec, Resources, VmRequest};
use placement::rules::{
    BuiltRule, HostView, NoParams, PreferenceRule, RegisteredRule, RequestTrait, RuleContext, RuleRequest,
};
use placement::{Allocator, AllocatorConfig, PolicyConfig, Registry, TieBreak};

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
            vm.facts.details.features.insert("pool".to_owned(), domain::FeatureValue::Text(pool.to_owned()));
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

#[test]
fn without_the_registration_the_policy_is_refused_by_name() {
    let spec = InventorySpec::homogeneous("z", 2, 2, Resources::from_whole(16.0, 64.0, 0.0).unwrap());
    let config = AllocatorConfig { policy: PolicyConfig::preset("pooled"), ..Default::default() };
    let error = Allocator::with_registry(&spec, &config, &Registry::standard()).unwrap_err().to_string();
    assert!(error.contains("pooled") && error.contains("unknown policy"), "{error}");
}
