//! What each policy does, on small inventories where the right answer is known.

use domain::{
    AllocationOutcome, AllocationRequest, GangRequest, HostId, HostState, InventorySpec, LifetimeClass,
    LifetimePrediction, PredictionSource, RejectionCode, Resources, TenantId, VmId, VmRequest,
};
use placement::{Allocator, AllocatorConfig, Engine, PolicyConfig, TieBreak};

const HOUR: f64 = 3600.0;

fn allocator(kind: &str, hosts: usize) -> Allocator {
    let spec = InventorySpec::homogeneous("z", hosts, 2, Resources::from_whole(16.0, 64.0, 0.0).unwrap());
    let config = AllocatorConfig {
        policy: PolicyConfig::preset(kind),
        tie_break: TieBreak::LowestIndex,
        engine: Engine::Incremental,
        ..Default::default()
    };
    Allocator::new(&spec, &config).unwrap()
}

fn vm(id: &str, cores: f64, lifetime_s: Option<f64>) -> VmRequest {
    let mut vm =
        VmRequest::new(id, "tenant", &format!("c{cores}"), Resources::from_whole(cores, cores * 2.0, 0.0).unwrap());
    vm.prediction = lifetime_s.map(|lifetime| LifetimePrediction {
        p_long: if lifetime >= 2.0 * HOUR { 0.9 } else { 0.1 },
        class: if lifetime >= 2.0 * HOUR { LifetimeClass::Long } else { LifetimeClass::Short },
        interval_class: None,
        expected_lifetime_s: Some(lifetime),
        model_version: Some("m-1".into()),
        source: PredictionSource::Model,
    });
    vm
}

fn host_of(decision: &domain::AllocationDecision) -> HostId {
    match &decision.outcome {
        AllocationOutcome::Placed { placements } => placements[0].host_id.clone(),
        AllocationOutcome::Rejected { rejection } => panic!("rejected: {}", rejection.detail),
    }
}

fn place(a: &mut Allocator, vm: VmRequest, now: f64) -> HostId {
    host_of(&a.allocate(&AllocationRequest::Vm(vm), now).unwrap())
}

#[test]
fn best_fit_fills_the_fullest_host_that_fits_and_opens_empty_hosts_last() {
    let mut a = allocator("pbfr", 4);
    assert_eq!(place(&mut a, vm("a", 8.0, None), 0.0).as_str(), "z-h0", "lowest index among empty hosts");
    assert_eq!(place(&mut a, vm("b", 4.0, None), 1.0).as_str(), "z-h0", "non-empty host first");
    assert_eq!(place(&mut a, vm("c", 8.0, None), 2.0).as_str(), "z-h1", "does not fit h0 any more");
    // 4 cores fit both h0 (4 free) and h1 (8 free); the tighter fit wins.
    assert_eq!(place(&mut a, vm("d", 4.0, None), 3.0).as_str(), "z-h0");
    let stats = a.stats();
    assert_eq!((stats.vms, stats.empty_hosts), (4, 2));
    assert!((stats.packing_density - 24.0 / 32.0).abs() < 1e-9, "{}", stats.packing_density);
}

/// h0 holds a long VM and much free space; h1 holds a short VM and little free space.
fn long_host_and_tight_short_host(kind: &str) -> Allocator {
    let mut a = allocator(kind, 4);
    assert_eq!(place(&mut a, vm("long-1", 2.0, Some(10.0 * HOUR)), 0.0).as_str(), "z-h0");
    a.set_host_state(&HostId::from("z-h0"), HostState::Unavailable).unwrap();
    assert_eq!(place(&mut a, vm("short-1", 12.0, Some(0.5 * HOUR)), 1.0).as_str(), "z-h1");
    a.set_host_state(&HostId::from("z-h0"), HostState::Available).unwrap();
    a
}

#[test]
fn la_binary_puts_long_vms_with_long_vms_until_their_hosts_turn_short() {
    // Best fit alone picks the tight short host for a long VM.
    let mut pbfr = long_host_and_tight_short_host("pbfr");
    assert_eq!(place(&mut pbfr, vm("long-2", 2.0, Some(10.0 * HOUR)), 2.0).as_str(), "z-h1");
    // LA-binary aligns it with the other long VM.
    let mut la = long_host_and_tight_short_host("la-binary");
    let h0 = la.state().host_index(&HostId::from("z-h0")).unwrap();
    assert_eq!(la.host_lifetime(h0).class, 1);
    assert_eq!(place(&mut la, vm("long-2", 2.0, Some(10.0 * HOUR)), 2.0).as_str(), "z-h0");
    // A short VM has no lifetime preference: best fit.
    assert_eq!(place(&mut la, vm("short-2", 2.0, Some(0.5 * HOUR)), 3.0).as_str(), "z-h1");
    // Nine hours on, h0's VMs have under 2 h left: h0 is short now, and a new long VM goes by best
    // fit again (h1, 2 cores free, against h0 with 12).
    la.advance_clock(9.0 * HOUR);
    assert_eq!(la.host_lifetime(h0).class, 0);
    assert_eq!(place(&mut la, vm("long-3", 2.0, Some(10.0 * HOUR)), 9.0 * HOUR).as_str(), "z-h1");
}

#[test]
fn dpbfr_uses_finer_buckets_for_long_vms() {
    // Cores only in the score: S = cores left after placement / 16.
    let dpbfr = || {
        let spec = InventorySpec::homogeneous("z", 3, 2, Resources::from_whole(16.0, 64.0, 0.0).unwrap());
        let mut policy = PolicyConfig::preset("dpbfr");
        policy.weights = placement::rules::FitWeights { cores: 1.0, memory_gib: 0.0, ssd_gib: 0.0 };
        let config = AllocatorConfig { policy, tie_break: TieBreak::LowestIndex, ..Default::default() };
        let mut a = Allocator::new(&spec, &config).unwrap();
        // h0 keeps 6 cores free, h1 4.
        place(&mut a, vm("a", 10.0, None), 0.0);
        a.set_host_state(&HostId::from("z-h0"), HostState::Unavailable).unwrap();
        place(&mut a, vm("b", 12.0, None), 1.0);
        a.set_host_state(&HostId::from("z-h0"), HostState::Available).unwrap();
        a
    };
    // A 1-core VM leaves 5/16 on h0 and 3/16 on h1: with 3 buckets both score ceil(0.94) =
    // ceil(0.56) = 1, a tie, and the lowest index wins; with 5 buckets h1 scores 1 and h0 2.
    assert_eq!(place(&mut dpbfr(), vm("short", 1.0, Some(0.5 * HOUR)), 2.0).as_str(), "z-h0");
    assert_eq!(place(&mut dpbfr(), vm("long", 1.0, Some(10.0 * HOUR)), 2.0).as_str(), "z-h1");
}

#[test]
fn a_gang_is_placed_whole_or_not_at_all() {
    let mut a = allocator("pbfr", 2);
    let gang = |ids: &[&str], cores| {
        AllocationRequest::Gang(GangRequest {
            tenant_id: TenantId::from("tenant"),
            vms: ids.iter().map(|id| vm(id, cores, None)).collect(),
        })
    };
    // Two 12-core VMs: one per host, 4 cores left on each.
    assert!(a.allocate(&gang(&["g1", "g2"], 12.0), 0.0).unwrap().is_placed());
    let before = a.state().clone();
    // Three 4-core VMs: each fits alone, the three together do not.
    match a.allocate(&gang(&["g3", "g4", "g5"], 4.0), 1.0).unwrap().outcome {
        AllocationOutcome::Rejected { rejection } => {
            assert_eq!(rejection.code, RejectionCode::GangDoesNotFit);
            assert_eq!(rejection.vm_id, Some(VmId::from("g5")));
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert_eq!(a.state(), &before, "a rejected gang changes nothing");
    match a.allocate(&AllocationRequest::Vm(vm("huge", 32.0, None)), 2.0).unwrap().outcome {
        AllocationOutcome::Rejected { rejection } => {
            assert_eq!(rejection.code, RejectionCode::NoFeasibleHost);
            assert_eq!(rejection.eliminated_by[0].rule, "fits-resources");
            assert_eq!(rejection.eliminated_by[0].hosts_in - rejection.eliminated_by[0].hosts_kept, 2);
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert_eq!(a.stats().rejections.values().sum::<u64>(), 2);
}

#[test]
fn retries_return_the_first_answer_and_reused_ids_are_refused() {
    let mut a = allocator("pbfr", 3);
    let first = a.allocate(&AllocationRequest::Vm(vm("a", 2.0, None)), 0.0).unwrap();
    let again = a.allocate(&AllocationRequest::Vm(vm("a", 2.0, None)), 5.0).unwrap();
    assert!(again.replayed && !first.replayed);
    assert_eq!(host_of(&first), host_of(&again));
    assert_eq!(a.state().vm_count(), 1);
    let err = a.allocate(&AllocationRequest::Vm(vm("a", 4.0, None)), 6.0).unwrap_err();
    assert!(err.to_string().contains("demand"), "{err}");
}

#[test]
fn spread_keeps_a_tenant_under_k_vms_per_rack() {
    // 6 hosts, 2 per rack: 3 racks.
    let mut a = allocator("pbfr", 6);
    let mut racks = std::collections::HashMap::new();
    for i in 0..6 {
        let mut request = vm(&format!("s{i}"), 1.0, None);
        request.max_per_rack = Some(2);
        let host = place(&mut a, request, f64::from(i));
        let index = a.state().host_index(&host).unwrap();
        *racks.entry(a.state().hosts()[index.get()].rack.clone()).or_insert(0) += 1;
    }
    assert_eq!(racks.len(), 3);
    assert!(racks.values().all(|&n| n == 2), "{racks:?}");
    let mut seventh = vm("s6", 1.0, None);
    seventh.max_per_rack = Some(2);
    let decision = a.allocate(&AllocationRequest::Vm(seventh), 7.0).unwrap();
    let AllocationOutcome::Rejected { rejection } = decision.outcome else { panic!("every rack holds 2 already") };
    assert_eq!(rejection.eliminated_by.last().unwrap().rule, "tenant-spread");
}

#[test]
fn drained_hosts_take_nothing_and_explain_says_why() {
    let mut a = allocator("pbfr", 2);
    place(&mut a, vm("a", 2.0, None), 0.0);
    a.set_host_state(&HostId::from("z-h0"), HostState::Unavailable).unwrap();
    assert_eq!(place(&mut a, vm("b", 2.0, None), 1.0).as_str(), "z-h1");
    let before = a.state().clone();
    let explanation = a.explain(&vm("c", 2.0, None), Some(&HostId::from("z-h0")), 5, 2.0).unwrap();
    assert_eq!(explanation.would_pick, Some(HostId::from("z-h1")));
    assert_eq!(explanation.why_not.unwrap().rejected_by.as_deref(), Some("host-available"));
    assert_eq!(a.state(), &before, "explain changes nothing");
    a.set_host_state(&HostId::from("z-h0"), HostState::Available).unwrap();
    // h0 and h1 hold 2 cores each: a 14-core VM fits both exactly alike; the lowest index wins.
    let explanation = a.explain(&vm("c", 14.0, None), Some(&HostId::from("z-h1")), 5, 3.0).unwrap();
    assert_eq!(explanation.would_pick, Some(HostId::from("z-h0")));
    assert_eq!(explanation.ties, 2);
    assert!(explanation.why_not.unwrap().explanation.contains("ties"));
    // Against an empty host, the non-empty preference decides.
    let explanation = a.explain(&vm("d", 2.0, None), Some(&HostId::from("z-h1")), 5, 4.0).unwrap();
    assert_eq!(explanation.top.len(), 2);
}

/// NILAS: a VM goes where it does not extend the host's exit time (temporal cost 0) even if another
/// host fits it tighter; the host that would be extended by 70 minutes costs 2.
#[test]
fn nilas_prefers_hosts_the_vm_does_not_outlive() {
    let mut a = allocator("nilas", 3);
    let short_host = place(&mut a, vm("short", 12.0, Some(HOUR)), 0.0);
    // The 12-core host is the tightest fit for what follows; this one exits later.
    let long_host = a.state().hosts().iter().find(|h| h.id != short_host).unwrap().id.clone();
    a.set_host_state(&short_host, HostState::Unavailable).unwrap();
    assert_eq!(place(&mut a, vm("long", 4.0, Some(10.0 * HOUR)), 0.0), long_host);
    a.set_host_state(&short_host, HostState::Available).unwrap();
    // Exits at 2 h 10 m: past the short host by 70 minutes (cost 2), before the long one (cost 0).
    let request = vm("mid", 2.0, Some(2.0 * HOUR + 600.0));
    let explanation = a.explain(&request, Some(&short_host), 3, 0.0).unwrap();
    let temporal =
        |scores: &[placement::allocator::RuleScore]| scores.iter().find(|s| s.rule == "temporal-cost").unwrap().score;
    assert_eq!(temporal(&explanation.why_not.as_ref().unwrap().scores), 2);
    assert_eq!(explanation.why_not.unwrap().outranked_at.as_deref(), Some("temporal-cost"));
    assert_eq!(place(&mut a, request, 0.0), long_host);
}

/// With an exit floor, every arriving VM counts as staying at least that long: a host about to
/// empty is left to empty, though the VM is predicted to leave before it.
#[test]
fn an_exit_floor_leaves_hosts_about_to_empty_alone() {
    let nilas = |exit_floor_s: f64| {
        let spec = InventorySpec::homogeneous("z", 3, 2, Resources::from_whole(16.0, 64.0, 0.0).unwrap());
        let policy = PolicyConfig { exit_floor_s, ..PolicyConfig::preset("nilas") };
        let config = AllocatorConfig { policy, tie_break: TieBreak::LowestIndex, ..Default::default() };
        let mut a = Allocator::new(&spec, &config).unwrap();
        // h0 empties in 30 minutes and is the tighter fit; h1 stays busy for 10 hours.
        assert_eq!(place(&mut a, vm("leaving", 12.0, Some(0.5 * HOUR)), 0.0).as_str(), "z-h0");
        a.set_host_state(&HostId::from("z-h0"), HostState::Unavailable).unwrap();
        assert_eq!(place(&mut a, vm("staying", 4.0, Some(10.0 * HOUR)), 0.0).as_str(), "z-h1");
        a.set_host_state(&HostId::from("z-h0"), HostState::Available).unwrap();
        a
    };
    // A 10-minute VM exits before either host: no temporal cost anywhere, so best fit picks h0.
    assert_eq!(place(&mut nilas(0.0), vm("brief", 2.0, Some(600.0)), 60.0).as_str(), "z-h0");
    // Read as staying at least 4 hours, it would outlive h0 by 3.5 h but not h1.
    let mut floored = nilas(4.0 * HOUR);
    let explanation = floored.explain(&vm("brief", 2.0, Some(600.0)), Some(&HostId::from("z-h0")), 3, 60.0).unwrap();
    assert_eq!(explanation.why_not.unwrap().outranked_at.as_deref(), Some("temporal-cost"));
    assert_eq!(place(&mut floored, vm("brief", 2.0, Some(600.0)), 60.0).as_str(), "z-h1");
}

/// A policy's own P(long) threshold decides which VMs are long-lived, over the prediction's class.
#[test]
fn a_policy_threshold_on_p_long_overrides_the_predicted_class() {
    let la = |long_probability: Option<f64>| {
        let spec = InventorySpec::homogeneous("z", 4, 2, Resources::from_whole(16.0, 64.0, 0.0).unwrap());
        let policy = PolicyConfig { long_probability, ..PolicyConfig::preset("la-binary") };
        let config = AllocatorConfig { policy, tie_break: TieBreak::LowestIndex, ..Default::default() };
        Allocator::new(&spec, &config).unwrap()
    };
    // P(long) 0.1 with a short class: short by default, long from a threshold of 0.05.
    let uncertain = vm("uncertain", 2.0, Some(HOUR));
    let default = la(None);
    assert_eq!(default.policy().classes().vm_lifetime(uncertain.prediction.as_ref()).class, 0);
    let eager = la(Some(0.05));
    assert_eq!(eager.policy().classes().vm_lifetime(uncertain.prediction.as_ref()).class, 1);
    assert!(
        eager.policy().classes().vm_lifetime(uncertain.prediction.as_ref()).lifetime_s >= 2.0 * HOUR,
        "a long VM lives at least the threshold"
    );
    let bad = PolicyConfig { long_probability: Some(1.5), ..PolicyConfig::preset("la-binary") };
    let spec = InventorySpec::homogeneous("z", 1, 1, Resources::from_whole(16.0, 64.0, 0.0).unwrap());
    let err = Allocator::new(&spec, &AllocatorConfig { policy: bad, ..Default::default() }).unwrap_err().to_string();
    assert!(err.contains("long_probability"), "{err}");
    let buckets = PolicyConfig { temporal_buckets_s: Some(vec![60.0, 30.0]), ..PolicyConfig::preset("nilas") };
    let err =
        Allocator::new(&spec, &AllocatorConfig { policy: buckets, ..Default::default() }).unwrap_err().to_string();
    assert!(err.contains("temporal_buckets_s"), "{err}");
}

/// A fake remaining-lifetime model: every VM has `uptime + 1 h` left.
#[derive(Debug)]
struct OneMoreHour;

impl placement::reprediction::Repredictor for OneMoreHour {
    fn version(&self) -> &str {
        "one-more-hour"
    }
    fn encode(&self, _: &domain::VmId, _: &lifetime_model::RequestFeatures) -> Vec<f64> {
        Vec::new()
    }
    fn remaining_s(&self, _: &[f64], uptime_s: f64) -> f64 {
        uptime_s + HOUR
    }
}

/// Exit times follow the model: a VM placed gets its host's exit from the model, arrivals reuse the
/// other VMs' last predictions, and the periodic refresh repredicts them all with their uptime.
#[test]
fn exit_times_follow_repredictions_on_the_refresh_interval() {
    let spec = InventorySpec::homogeneous("z", 2, 2, Resources::from_whole(16.0, 64.0, 0.0).unwrap());
    let mut config = AllocatorConfig { policy: PolicyConfig::preset("nilas"), ..Default::default() };
    config.reprediction.refresh_interval_s = 900.0;
    let mut a = Allocator::new(&spec, &config).unwrap();
    a.set_repredictor(Some(std::sync::Arc::new(OneMoreHour)));
    let host = place(&mut a, vm("a", 2.0, Some(10.0 * HOUR)), 0.0);
    let index = a.state().host_index(&host).unwrap();
    assert_eq!(a.host_lifetime(index).exit_s, HOUR, "the model's exit, not the initial 10 h");
    // Another VM at 600 s: its own prediction, the first VM's last one kept.
    assert_eq!(place(&mut a, vm("b", 2.0, None), 600.0), host);
    assert_eq!(a.host_lifetime(index).exit_s, 600.0 + HOUR);
    // At 900 s the host is repredicted: a (uptime 900) has 900 + 3600 s left, b (300) 3900 s.
    a.advance_clock(900.0);
    assert_eq!(a.host_lifetime(index).exit_s, 900.0 + 900.0 + HOUR);
    assert_eq!(a.stats().reprediction_model.as_deref(), Some("one-more-hour"));
    assert_eq!(a.stats().repredictions, 4);
}

/// A repredictor that keeps the features it was given and answers from them: 1 h left for a
/// low-priority VM, 10 h for another, a minute more per extra feature, less its uptime.
#[derive(Debug, Default)]
struct Recording(std::sync::Mutex<Vec<lifetime_model::RequestFeatures>>);

impl placement::reprediction::Repredictor for Recording {
    fn version(&self) -> &str {
        "recording"
    }
    fn encode(&self, _: &VmId, features: &lifetime_model::RequestFeatures) -> Vec<f64> {
        self.0.lock().unwrap().push(features.clone());
        vec![f64::from(u8::from(features.priority == domain::Priority::Low)), features.extra.len() as f64]
    }
    fn remaining_s(&self, row: &[f64], uptime_s: f64) -> f64 {
        (if row[0] == 1.0 { HOUR } else { 10.0 * HOUR }) + 60.0 * row[1] - uptime_s
    }
}

/// A VM put back from the store (after a restart, or followed from another agent) or placed before
/// the model was set is repredicted from the features its request had: its priority, OS, features
/// and request time, not only its shape, so exit times do not change across a restart.
#[test]
fn restored_vms_are_repredicted_from_the_features_they_were_placed_with() {
    use std::sync::Arc;
    let spec = InventorySpec::homogeneous("z", 2, 2, Resources::from_whole(16.0, 64.0, 0.0).unwrap());
    let config = AllocatorConfig { policy: PolicyConfig::preset("nilas"), ..Default::default() };
    let with_model = |model: &Arc<Recording>| {
        let mut a = Allocator::new(&spec, &config).unwrap();
        a.set_repredictor(Some(model.clone()));
        a
    };
    let (placed_model, restored_model, late_model) =
        (Arc::new(Recording::default()), Arc::new(Recording::default()), Arc::new(Recording::default()));
    let mut placed = with_model(&placed_model);
    let mut request = vm("a", 2.0, Some(10.0 * HOUR));
    request.facts.details.priority = domain::Priority::Low;
    request.facts.details.os = Some("linux".into());
    request.facts.details.features.insert("batch_size".into(), domain::FeatureValue::Number(14.0));
    request.facts.requested_at_s = Some(86_400.0 * 3.0 + 7.0);
    let host = place(&mut placed, request.clone(), 600.0);
    let record = placed.state().vm(&VmId::new("a")).unwrap().record.clone();

    let mut restored = with_model(&restored_model);
    restored.restore(placement::state::NewVm::clone(&record), &host, 600.0).unwrap();
    // A model set after the VM was placed reads the same features.
    let mut late = Allocator::new(&spec, &config).unwrap();
    assert_eq!(place(&mut late, request, 600.0), host);
    late.set_repredictor(Some(late_model.clone()));

    let seen = placed_model.0.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].priority, domain::Priority::Low);
    assert_eq!(seen[0].time_s, 86_400.0 * 3.0 + 7.0, "the request's time, not the placement's");
    assert_eq!(seen[0].extra.len(), 2, "the OS and the feature: {:?}", seen[0].extra);
    assert_eq!(*restored_model.0.lock().unwrap(), seen);
    assert_eq!(*late_model.0.lock().unwrap(), seen);
    let index = placed.state().host_index(&host).unwrap();
    let exit = placed.host_lifetime(index).exit_s;
    assert_eq!(exit, 600.0 + HOUR + 120.0);
    assert_eq!(restored.host_lifetime(index).exit_s, exit);
    assert_eq!(late.host_lifetime(index).exit_s, exit);
}

/// The default bundle's remaining-lifetime model without its constant ranges: every reprediction
/// evaluates the trees.
#[derive(Debug)]
struct EveryTime(placement::reprediction::BundleRepredictor);

impl placement::reprediction::Repredictor for EveryTime {
    fn version(&self) -> &str {
        self.0.version()
    }
    fn encode(&self, id: &domain::VmId, features: &lifetime_model::RequestFeatures) -> Vec<f64> {
        self.0.encode(id, features)
    }
    fn remaining_s(&self, row: &[f64], uptime_s: f64) -> f64 {
        self.0.remaining_s(row, uptime_s)
    }
}

/// Reusing a VM's last evaluation while its uptime stays in the evaluation's constant range changes
/// no exit time, no host summary and no decision of NILAS and LAVA with the default bundle, and
/// saves evaluations.
#[test]
fn repredictions_reused_within_their_uptime_ranges_change_nothing() {
    use placement::reprediction::{BundleRepredictor, Repredictor};
    use rand::{Rng, SeedableRng};
    use std::sync::Arc;

    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/default");
    // Ranges exist where the regression reads remaining lifetimes (a survival curve moves with
    // every second of age).
    let model = Arc::new(lifetime_model::LifetimeModel::load(&dir).unwrap().without_survival());
    for kind in ["nilas", "lava"] {
        let make = |repredictor: Arc<dyn Repredictor>| {
            let spec = InventorySpec::homogeneous("z", 30, 10, Resources::from_whole(48.0, 384.0, 0.0).unwrap());
            let mut config = AllocatorConfig { policy: PolicyConfig::preset(kind), seed: 3, ..Default::default() };
            config.reprediction.refresh_interval_s = 900.0;
            let mut a = Allocator::new(&spec, &config).unwrap();
            a.set_repredictor(Some(repredictor));
            a
        };
        let mut cached = make(Arc::new(BundleRepredictor(model.clone())));
        let mut every_time = make(Arc::new(EveryTime(BundleRepredictor(model.clone()))));
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        // After the bundle's training data, so that tenants have a history.
        let mut now = 800_000.0;
        let mut running: Vec<VmId> = Vec::new();
        for n in 0..4_000 {
            now += rng.random_range(0.0..400.0);
            if running.len() < 40 || rng.random_bool(0.52) {
                let cores = [1.0, 2.0, 4.0, 8.0][rng.random_range(0..4)];
                let mut request = vm(&format!("v{n}"), cores, Some(rng.random_range(60.0..20.0 * 86_400.0)));
                request.facts.tenant_id = TenantId::new(format!("t{}", rng.random_range(0..60)));
                let request = AllocationRequest::Vm(request);
                let decision = cached.allocate(&request, now).unwrap();
                assert_eq!(decision, every_time.allocate(&request, now).unwrap(), "{kind:?} at {now}");
                if decision.is_placed() {
                    running.push(VmId::new(format!("v{n}")));
                }
            } else {
                let id = running.swap_remove(rng.random_range(0..running.len()));
                cached.release(&id, now).unwrap();
                every_time.release(&id, now).unwrap();
            }
            assert_eq!(cached.lifetimes(), every_time.lifetimes(), "{kind:?} at {now}");
        }
        let (made, all) = (cached.repredictions_made(), every_time.repredictions_made());
        // Short-lived VMs here: their uptimes are where the trees cut most densely.
        assert!(made * 5 < all * 4, "{kind:?}: {made} evaluations instead of {all}");
    }
}

/// The worked example of ARCHITECTURE.md: a policy defined only in the allocator's TOML, using the
/// `prefer-hardware` rule (one file in `placement/src/rules/` plus its registration line). New VMs
/// go to the newest generation first and fill it before opening the older one; the unnamed
/// generation comes last.
#[test]
fn a_policy_written_only_in_toml_uses_a_newly_registered_rule() {
    let config: AllocatorConfig = toml::from_str(
        r#"
        tie_break = "lowest-index"
        [policy]
        kind = "newest-hardware-first"
        preferences = [
            { rule = "prefer-non-empty" },
            { rule = "prefer-hardware", order = ["gen9", "gen8"] },
            { rule = "best-fit", buckets = 3 },
        ]
        "#,
    )
    .unwrap();
    // Three clusters of two 16-core hosts, declared oldest first: gen7, gen8, gen9.
    let mut spec = InventorySpec::homogeneous("z", 2, 2, Resources::from_whole(16.0, 64.0, 0.0).unwrap());
    let template = spec.zones[0].clusters[0].clone();
    spec.zones[0].clusters = ["gen7", "gen8", "gen9"]
        .iter()
        .enumerate()
        .map(|(c, generation)| {
            let mut cluster = template.clone();
            cluster.id = domain::ClusterId(format!("z-c{c}"));
            cluster.hardware = (*generation).to_owned();
            cluster.racks[0].id = domain::RackId(format!("z-r{c}"));
            for (h, host) in cluster.racks[0].hosts.iter_mut().enumerate() {
                host.id = HostId(format!("{generation}-h{h}"));
            }
            cluster
        })
        .collect();
    let mut a = Allocator::new(&spec, &config).unwrap();
    assert_eq!(a.policy().name(), "newest-hardware-first");
    let hosts: Vec<String> = (0..6).map(|i| place(&mut a, vm(&format!("v{i}"), 6.0, None), f64::from(i)).0).collect();
    // 6-core VMs, two to a 16-core host: gen9's two hosts, then gen8's, then gen7's.
    assert_eq!(hosts[..4], ["gen9-h0", "gen9-h0", "gen9-h1", "gen9-h1"]);
    assert_eq!(hosts[4..], ["gen8-h0", "gen8-h0"]);
    // The same list under PBFR fills the first declared (gen7) hosts first.
    let mut pbfr =
        Allocator::new(&spec, &AllocatorConfig { tie_break: TieBreak::LowestIndex, ..Default::default() }).unwrap();
    assert_eq!(place(&mut pbfr, vm("p", 6.0, None), 0.0).0, "gen7-h0");
}

/// The names the library lists for command lines (the simulator's `--policy`, `--tie-break`,
/// `--engine`) are the names its configuration reads.
#[test]
fn every_name_the_library_lists_is_one_it_reads() {
    for name in placement::Registry::standard().preset_names() {
        let policy = placement::Policy::from_config(
            &PolicyConfig::preset(name),
            &Default::default(),
            &placement::Registry::standard(),
        )
        .unwrap();
        assert_eq!(policy.name(), name);
    }
    let tie_breaks: Vec<TieBreak> =
        TieBreak::NAMES.iter().map(|n| serde_json::from_value(serde_json::Value::from(*n)).unwrap()).collect();
    assert_eq!(tie_breaks, [TieBreak::Random, TieBreak::LowestIndex]);
    let engines: Vec<Engine> =
        Engine::NAMES.iter().map(|n| serde_json::from_value(serde_json::Value::from(*n)).unwrap()).collect();
    assert_eq!(engines, [Engine::Incremental, Engine::FullScan]);
}
