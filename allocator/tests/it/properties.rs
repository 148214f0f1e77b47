//! Property tests of the allocator over random operation sequences: no over-commit, exact
//! releases, all-or-nothing gangs, lifetime classes that drop on time, and the incremental index
//! agreeing with the full-scan reference on every decision.

use allocator::durable::{Allocate, DurableAllocator, Explain, Release, SetHostState};
use domain::{
    AllocationOutcome, AllocationRequest, GangRequest, HostId, HostState, InventorySpec, LifetimeClass,
    LifetimePrediction, PredictionSource, RequestDetails, RequestFacts, Resources, TenantId, VmId, VmRequest,
};
use placement::select::{full_scan, Chooser};
use placement::{Allocator, AllocatorConfig, Engine, PolicyConfig, Registry, TieBreak};
use proptest::prelude::*;

const HOSTS: usize = 12;

fn inventory() -> InventorySpec {
    InventorySpec::homogeneous("z", HOSTS, 3, Resources::from_whole(16.0, 64.0, 0.0).unwrap())
}

#[derive(Clone, Debug)]
struct VmSpec {
    cores: u8,
    memory: u8,
    tenant: u8,
    /// 0: none, 1: short, 2: long with no lifetime, 3: long with a lifetime, 4: fallback, 5: interval class
    prediction: u8,
    lifetime_h: u16,
    spread: Option<u8>,
}

#[derive(Clone, Debug)]
enum Op {
    Allocate(Vec<VmSpec>),
    Release(u16),
    Drain(u8),
    Restore(u8),
    Wait(u16),
}

fn vm_spec() -> impl Strategy<Value = VmSpec> {
    // A few VM types, as in real workloads, so that cached request classes get reused.
    (0u8..4, 1u8..3, 0u8..4, 0u8..6, 1u16..400, proptest::option::of(1u8..3)).prop_map(
        |(size, memory_per_core, tenant, prediction, lifetime_h, spread)| VmSpec {
            cores: 1 << size,
            memory: (1 << size) * 2 * memory_per_core,
            tenant,
            prediction,
            lifetime_h,
            spread,
        },
    )
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => proptest::collection::vec(vm_spec(), 1..2).prop_map(Op::Allocate),
        1 => proptest::collection::vec(vm_spec(), 2..5).prop_map(Op::Allocate),
        3 => (0u16..400).prop_map(Op::Release),
        1 => (0u8..HOSTS as u8).prop_map(Op::Drain),
        1 => (0u8..HOSTS as u8).prop_map(Op::Restore),
        2 => (1u16..600).prop_map(Op::Wait),
    ]
}

fn prediction(spec: &VmSpec) -> Option<LifetimePrediction> {
    let model = |class, expected, interval| LifetimePrediction {
        p_long: if class == LifetimeClass::Long { 0.9 } else { 0.1 },
        class,
        interval_class: interval,
        expected_lifetime_s: expected,
        model_version: Some("m-1".into()),
        source: PredictionSource::Model,
    };
    let lifetime_s = f64::from(spec.lifetime_h) * 360.0;
    match spec.prediction {
        0 => None,
        1 => Some(model(LifetimeClass::Short, Some(lifetime_s.min(3600.0)), None)),
        2 => Some(model(LifetimeClass::Long, None, None)),
        3 => Some(model(LifetimeClass::Long, Some(lifetime_s), None)),
        4 => Some(LifetimePrediction::fallback(PredictionSource::FallbackTimeout)),
        _ => Some(model(LifetimeClass::Long, Some(lifetime_s), Some(u32::from(spec.lifetime_h % 11)))),
    }
}

fn vm_request(id: usize, spec: &VmSpec, tenant: u8) -> VmRequest {
    VmRequest {
        vm_id: VmId(format!("vm-{id}")),
        facts: RequestFacts {
            tenant_id: TenantId(format!("t-{tenant}")),
            vm_type: format!("c{}m{}", spec.cores, spec.memory),
            demand: Resources::from_whole(f64::from(spec.cores), f64::from(spec.memory), 0.0).unwrap(),
            requested_at_s: None,
            details: RequestDetails::default(),
        },
        zone: None,
        max_per_rack: spec.spread.map(u32::from),
        prediction: prediction(spec),
        candidates: None,
    }
}

/// Turns generated operations into concrete requests, numbering VMs as it goes.
struct Driver {
    next_vm: usize,
    placed: Vec<VmId>,
    now_s: f64,
}

enum Step {
    Allocate(Box<AllocationRequest>),
    Release(VmId),
    SetState(HostId, HostState),
    Wait,
}

impl Driver {
    fn new() -> Self {
        Driver { next_vm: 0, placed: Vec::new(), now_s: 1_000_000.0 }
    }

    fn step(&mut self, op: &Op) -> Step {
        self.now_s += 1.0;
        match op {
            Op::Allocate(specs) => {
                let tenant = specs[0].tenant;
                let vms: Vec<VmRequest> = specs
                    .iter()
                    .map(|spec| {
                        self.next_vm += 1;
                        vm_request(self.next_vm, spec, tenant)
                    })
                    .collect();
                let request = if vms.len() == 1 {
                    AllocationRequest::Vm(vms.into_iter().next().unwrap())
                } else {
                    AllocationRequest::Gang(GangRequest { tenant_id: vms[0].facts.tenant_id.clone(), vms })
                };
                Step::Allocate(Box::new(request))
            }
            Op::Release(i) if !self.placed.is_empty() => {
                let at = usize::from(*i) % self.placed.len();
                Step::Release(self.placed.swap_remove(at))
            }
            Op::Release(_) => Step::Wait,
            Op::Drain(h) => Step::SetState(HostId(format!("z-h{h}")), HostState::Unavailable),
            Op::Restore(h) => Step::SetState(HostId(format!("z-h{h}")), HostState::Available),
            Op::Wait(minutes) => {
                self.now_s += f64::from(*minutes) * 60.0;
                Step::Wait
            }
        }
    }

    fn record(&mut self, outcome: &AllocationOutcome) {
        if let AllocationOutcome::Placed { placements } = outcome {
            self.placed.extend(placements.iter().map(|p| p.vm_id.clone()));
        }
    }
}

fn config(policy: &PolicyConfig, engine: Engine, tie_break: TieBreak) -> AllocatorConfig {
    AllocatorConfig { policy: policy.clone(), engine, tie_break, seed: 7, ..Default::default() }
}

/// Every published policy, and the robust settings of NILAS and LAVA (an exit floor, exact best
/// fit, a policy threshold on P(long)).
fn policies() -> impl Strategy<Value = PolicyConfig> {
    let robust = |kind| PolicyConfig {
        exit_floor_s: 4.0 * 3600.0,
        buckets: placement::rules::Buckets::Exact,
        long_probability: Some(0.3),
        ..PolicyConfig::preset(kind)
    };
    prop_oneof![
        Just(PolicyConfig::preset("pbfr")),
        Just(PolicyConfig::preset("dpbfr")),
        Just(PolicyConfig::preset("la-binary")),
        Just(PolicyConfig::preset("la-multiclass")),
        Just(PolicyConfig::preset("nilas")),
        Just(PolicyConfig::preset("lava")),
        Just(robust("nilas")),
        Just(robust("lava")),
    ]
}

/// Books of an allocator that must hold after every operation, at time `now_s`.
fn check_books(allocator: &mut Allocator, now_s: f64) -> Result<(), TestCaseError> {
    allocator.advance_clock(now_s);
    let state = allocator.state();
    let reads_exits = allocator.policy().reads_exit_times();
    for (i, host) in state.hosts().iter().enumerate() {
        let exit_s = host
            .vms
            .iter()
            .map(|vm| state.vm(&vm.id).unwrap())
            .map(|vm| vm.placed_at_s + allocator.vm_lifetime(vm).lifetime_s)
            .fold(f64::NEG_INFINITY, f64::max);
        if reads_exits {
            // Without a model, a host's exit is its VMs' predicted exits, or the last refresh
            // for VMs that outlived their prediction: never earlier than the predictions say.
            let cached = allocator.lifetimes()[i].exit_s;
            prop_assert!(
                cached >= exit_s && (host.vms.is_empty() || cached <= exit_s.max(now_s)),
                "host {} exit {} vs {}",
                host.id,
                cached,
                exit_s
            );
        } else {
            // Every host's lifetime class is the one its VMs give it now, computed afresh.
            let expected = placement::lifetime::HostLifetime::at(allocator.policy().classes(), exit_s, now_s);
            prop_assert_eq!(allocator.lifetimes()[i].class, expected.class, "host {} at {}", host.id, now_s);
        }
        let lava = allocator.host_state().and_then(|s| s.as_any().downcast_ref::<placement::lava::Lava>());
        if let Some(lava) = lava.map(|l| l.host(placement::HostIndex(i as u32))) {
            // LAVA: empty exactly when the host is, residual VMs are on the host, deadlines ahead.
            prop_assert_eq!(lava.state == placement::lava::LavaState::Empty, host.vms.is_empty());
            prop_assert!(lava.residual_vms.iter().all(|vm| host.vms.iter().any(|placed| placed.id == *vm)));
            prop_assert!(
                lava.deadline_s.is_none_or(|d| d > now_s),
                "deadline {:?} passed at {}",
                lava.deadline_s,
                now_s
            );
        }
    }
    let mut seen = std::collections::HashSet::new();
    for (i, host) in state.hosts().iter().enumerate() {
        prop_assert!(host.used.fits_within(&host.capacity), "host {} over-committed", host.id);
        let sum = host.vms.iter().fold(Resources::ZERO, |acc, vm| {
            let placed = state.vm(&vm.id).expect("listed VMs are placed");
            assert_eq!(placed.host.get(), i);
            acc + placed.facts.demand
        });
        prop_assert_eq!(sum, host.used);
        for vm in &host.vms {
            prop_assert!(seen.insert(vm.id.clone()), "VM {} on two hosts", vm.id);
        }
    }
    prop_assert_eq!(seen.len(), state.vm_count());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// With lowest-index ties, the incremental index and the full scan make the very same decisions
    /// (hosts, rejections and per-rule filtering figures) on every policy.
    #[test]
    fn incremental_and_full_scan_decide_alike(policy in policies(), ops in proptest::collection::vec(op(), 1..150)) {
        let mut incremental = Allocator::new(&inventory(), &config(&policy, Engine::Incremental, TieBreak::LowestIndex)).unwrap();
        let mut reference = Allocator::new(&inventory(), &config(&policy, Engine::FullScan, TieBreak::LowestIndex)).unwrap();
        let mut driver = Driver::new();
        for op in &ops {
            match driver.step(op) {
                Step::Allocate(request) => {
                    let a = incremental.allocate(&request, driver.now_s).unwrap();
                    let b = reference.allocate(&request, driver.now_s).unwrap();
                    prop_assert_eq!(&a, &b);
                    driver.record(&a.outcome);
                }
                Step::Release(vm) => {
                    prop_assert_eq!(incremental.release(&vm, driver.now_s).unwrap(), reference.release(&vm, driver.now_s).unwrap());
                }
                Step::SetState(host, state) => {
                    incremental.set_host_state(&host, state).unwrap();
                    reference.set_host_state(&host, state).unwrap();
                }
                Step::Wait => {}
            }
            prop_assert_eq!(incremental.state(), reference.state());
            prop_assert_eq!(incremental.lifetimes(), reference.lifetimes());
        }
    }

    /// With random ties, every incremental decision picks a host of the best score the full scan
    /// finds on the same state, with the same filtering figures; and the books always balance.
    #[test]
    fn random_ties_pick_a_best_scored_host(policy in policies(), ops in proptest::collection::vec(op(), 1..150)) {
        let mut allocator = Allocator::new(&inventory(), &config(&policy, Engine::Incremental, TieBreak::Random)).unwrap();
        let mut driver = Driver::new();
        for op in &ops {
            match driver.step(op) {
                Step::Allocate(request) if matches!(*request, AllocationRequest::Vm(_)) => {
                    let AllocationRequest::Vm(vm) = *request else { unreachable!() };
                    // The reference on the state as it is now, after this instant's class drops.
                    allocator.release(&VmId::from("no-such-vm"), driver.now_s).ok();
                    let traits = allocator.request_traits(&vm);
                    let reference = full_scan(
                        allocator.policy(), allocator.state(), allocator.lifetimes(),
                        &allocator.rule_request(&vm, &traits), &mut Chooser::new(TieBreak::LowestIndex, 0));
                    let host_scores = |allocator: &Allocator, host: &HostId| {
                        let index = allocator.state().host_index(host).unwrap();
                        let view = placement::rules::HostView {
                            index, record: &allocator.state().hosts()[index.get()], lifetime: &allocator.lifetimes()[index.get()],
                        };
                        allocator.policy().score(&view, &allocator.rule_request(&vm, &allocator.request_traits(&vm)))
                    };
                    // Scores of every host before the placement changes them.
                    let before: Vec<_> = allocator.state().hosts().iter().map(|h| host_scores(&allocator, &h.id)).collect();
                    let decision = allocator.allocate(&AllocationRequest::Vm(vm.clone()), driver.now_s).unwrap();
                    prop_assert_eq!(&decision.rule_stats, &reference.stats);
                    match &decision.outcome {
                        AllocationOutcome::Placed { placements } => {
                            let index = allocator.state().host_index(&placements[0].host_id).unwrap();
                            prop_assert_eq!(Some(before[index.get()]), reference.score);
                        }
                        AllocationOutcome::Rejected { .. } => prop_assert!(reference.host.is_none()),
                    }
                    driver.record(&decision.outcome);
                }
                Step::Allocate(gang) => {
                    let before = allocator.state().clone();
                    let decision = allocator.allocate(&gang, driver.now_s).unwrap();
                    match &decision.outcome {
                        AllocationOutcome::Placed { placements } => prop_assert_eq!(placements.len(), gang.vms().len()),
                        // All or nothing: a rejected gang leaves the inventory exactly as it was.
                        AllocationOutcome::Rejected { .. } => prop_assert_eq!(allocator.state(), &before),
                    }
                    driver.record(&decision.outcome);
                }
                Step::Release(vm) => {
                    let host = allocator.state().vm(&vm).unwrap().host;
                    let free_before = allocator.state().hosts()[host.get()].free();
                    let released = allocator.release(&vm, driver.now_s).unwrap();
                    // Release restores capacity exactly.
                    prop_assert_eq!(allocator.state().hosts()[host.get()].free(), free_before.checked_add(&released.facts.demand).unwrap());
                }
                Step::SetState(host, state) => { allocator.set_host_state(&host, state).unwrap(); }
                Step::Wait => {}
            }
            check_books(&mut allocator, driver.now_s)?;
        }
    }

    /// The state after a restart equals the state before: every acknowledged operation is in the
    /// store and nothing else is, whatever the sequence (gangs, releases, drains, time passing).
    #[test]
    fn state_after_restart_equals_state_before(policy in policies(), ops in proptest::collection::vec(op(), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let config = config(&policy, Engine::Incremental, TieBreak::Random);
        let mut durable = DurableAllocator::open(&inventory(), &config, &Registry::standard(), &path, 0.0).unwrap();
        let mut driver = Driver::new();
        for op in &ops {
            let now_s = driver.now_s;
            match driver.step(op) {
                Step::Allocate(request) => {
                    if let Ok(decision) = durable.execute_one(Allocate(*request), now_s) {
                        driver.record(&decision.outcome);
                    }
                }
                Step::Release(vm) => {
                    let _ = durable.execute_one(Release::vm(vm), now_s);
                }
                Step::SetState(host, state) => {
                    let _ = durable.execute_one(SetHostState { host, state }, now_s);
                }
                Step::Wait => {}
            }
        }
        // Bring the clock to the same instant the reopened allocator starts at (a dry run moves it).
        let probe = VmRequest::new("probe", "t", "D", Resources::from_whole(1.0, 1.0, 0.0).unwrap());
        durable.execute_one(Explain { vm: probe, why_not: None, top: 0 }, driver.now_s).unwrap();
        let live = durable.allocator().unwrap();
        let before = live.state().clone();
        let exits_before: Vec<f64> = live.lifetimes().iter().map(|l| l.exit_s).collect();
        let lava = |a: &Allocator| -> Vec<_> {
            (0..HOSTS).map(|i| a.host_state().map(|s| s.snapshot(placement::HostIndex(i as u32)))).collect()
        };
        let lava_before = lava(live);
        drop(durable);
        let reopened = DurableAllocator::open(&inventory(), &config, &Registry::standard(), &path, driver.now_s).unwrap();
        let live = reopened.allocator().unwrap();
        prop_assert_eq!(live.state(), &before);
        // LAVA state survives the restart unchanged (host state, class, deadline, residual VMs).
        prop_assert_eq!(lava(live), lava_before);
        if !live.policy().reads_exit_times() {
            // Exit times that follow refreshes are recomputed at the restart instead.
            let exits_after: Vec<f64> = live.lifetimes().iter().map(|l| l.exit_s).collect();
            prop_assert_eq!(exits_after, exits_before);
        }
    }
}
