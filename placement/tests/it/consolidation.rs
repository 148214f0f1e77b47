//! Consolidation under a migration budget on small inventories: which hosts a chooser empties, the
//! budget, the hosts' return to service, and that no host is ever over-committed on the way.

use domain::{
    AllocationOutcome, AllocationRequest, HostId, HostState, InventorySpec, LifetimeClass, LifetimePrediction,
    PredictionSource, Resources, VmId, VmRequest,
};
use placement::config::Buckets;
use placement::consolidation::{ChooserKind, ConsolidationConfig, InFlightLimit};
use placement::{Allocator, AllocatorConfig, Change, ConsolidationError, Engine, PolicyConfig, TieBreak};
use proptest::prelude::*;

const HOUR: f64 = 3600.0;
const DAY: f64 = 86_400.0;

fn allocator(hosts: usize) -> Allocator {
    let spec = InventorySpec::homogeneous("z", hosts, 2, Resources::from_whole(16.0, 64.0, 0.0).unwrap());
    let config = AllocatorConfig {
        policy: PolicyConfig { buckets: Buckets::Exact, ..PolicyConfig::preset("pbfr") },
        tie_break: TieBreak::LowestIndex,
        engine: Engine::Incremental,
        ..Default::default()
    };
    Allocator::new(&spec, &config).unwrap()
}

fn vm(id: &str, cores: f64, lifetime_s: f64) -> VmRequest {
    let mut vm = VmRequest::new(id, "t", &format!("c{cores}"), Resources::from_whole(cores, cores * 2.0, 0.0).unwrap());
    vm.prediction = Some(LifetimePrediction {
        p_long: 0.5,
        class: if lifetime_s >= 2.0 * HOUR { LifetimeClass::Long } else { LifetimeClass::Short },
        interval_class: None,
        expected_lifetime_s: Some(lifetime_s),
        model_version: Some("m-1".into()),
        source: PredictionSource::Model,
    });
    vm
}

/// Places `vm` and returns its host.
fn place(a: &mut Allocator, vm: VmRequest, now: f64) -> HostId {
    match a.allocate(&AllocationRequest::Vm(vm), now).unwrap().outcome {
        AllocationOutcome::Placed { placements } => placements[0].host_id.clone(),
        AllocationOutcome::Rejected { rejection } => panic!("rejected: {}", rejection.detail),
    }
}

fn config(budget: f64, chooser: ChooserKind) -> ConsolidationConfig {
    ConsolidationConfig { budget_per_host_day: budget, chooser, ..ConsolidationConfig::default() }
}

/// Three hosts: h0 with one 4-core VM (`lifetime_s` predicted), h1 with 12 cores in two VMs, h2
/// with 14 cores in two VMs, h3 empty.
fn three_hosts(lifetime_s: f64) -> Allocator {
    let mut a = allocator(4);
    // Best fit with lowest-index ties fills h0 first; a VM too large for what is left opens h1.
    assert_eq!(place(&mut a, vm("big-0", 12.0, 30.0 * DAY), 0.0).as_str(), "z-h0");
    assert_eq!(place(&mut a, vm("big-1", 12.0, 30.0 * DAY), 0.0).as_str(), "z-h1");
    assert_eq!(place(&mut a, vm("big-2", 14.0, 30.0 * DAY), 0.0).as_str(), "z-h2");
    assert_eq!(place(&mut a, vm("small", 4.0, lifetime_s), 0.0).as_str(), "z-h0");
    // h0: 16 of 16 cores now; make room so that h0 is the host with one VM.
    a.release(&VmId::from("big-0"), 1.0).unwrap();
    assert_eq!(place(&mut a, vm("fill-1", 2.0, 30.0 * DAY), 1.0).as_str(), "z-h2");
    a.take_changes().for_each(drop);
    a
}

#[test]
fn fewest_vms_empties_the_host_with_one_vm_and_gives_it_back_once_empty() {
    let mut a = three_hosts(30.0 * DAY);
    a.set_consolidation(Some(config(1.0, ChooserKind::FewestVms)), 1.0).unwrap();
    // Not due before an hour; the budget accrues from now: 4 hosts x 1 a day = 1 per 6 h.
    assert_eq!(a.consolidation_due_s(), Some(1.0 + HOUR));
    assert!(a.consolidate(HOUR).unwrap().is_empty(), "a sixth of a migration in the budget: nothing");
    let plan = a.consolidation_plan(7.0 * HOUR).unwrap();
    assert_eq!(plan.len(), 1, "7 h of budget: one migration");
    assert_eq!((plan[0].host.as_str(), plan[0].moves.len()), ("z-h0", 1));
    assert_eq!(a.state().host(placement::HostIndex(0)).unwrap().state, HostState::Available, "a plan changes nothing");
    let started = a.consolidate(7.0 * HOUR).unwrap();
    assert_eq!(started, plan, "the round does what the plan said");
    let changes: Vec<Change> = a.take_changes().collect();
    assert!(changes.iter().any(
        |c| matches!(c, Change::HostState { host, state: HostState::Unavailable, .. } if host.as_str() == "z-h0")
    ));
    let target = changes
        .iter()
        .find_map(|c| match c {
            Change::MigrationStarted { vm, target } if vm.as_str() == "small" => Some(target.clone()),
            _ => None,
        })
        .expect("the VM starts migrating");
    assert_eq!(target.as_str(), "z-h1", "to the only non-empty host with room, never an empty one");
    a.complete_migration(&VmId::from("small"), 7.0 * HOUR + 1200.0).unwrap();
    let h0 = a.state().host(placement::HostIndex(0)).unwrap();
    assert!(h0.is_empty());
    assert_eq!(h0.state, HostState::Available, "back in service at once");
    let report = a.consolidation_report().unwrap();
    assert_eq!((report.counters.hosts_emptied, report.counters.migrations_completed), (1, 1));
    assert!(report.hosts.is_empty() && report.in_flight.is_empty());
    assert!(report.budget < 0.2, "the migration was paid for: {}", report.budget);
}

#[test]
fn the_lifetime_chooser_leaves_a_host_whose_move_would_be_wasted() {
    // At 7 h the VM on h0 is predicted to leave within 30 minutes: moving it would be wasted.
    // (Without a model, its remaining lifetime is the prediction less its age.)
    let mut a = three_hosts(7.5 * HOUR);
    a.set_consolidation(Some(config(1.0, ChooserKind::Lifetime)), 1.0).unwrap();
    let plan = a.consolidation_plan(7.0 * HOUR).unwrap();
    assert!(plan.iter().all(|p| p.host.as_str() != "z-h0"), "{plan:?}");
    // The model-free chooser moves it first (and the move is wasted when the VM leaves soon after).
    let mut b = three_hosts(7.5 * HOUR);
    b.set_consolidation(Some(config(1.0, ChooserKind::FewestVms)), 1.0).unwrap();
    assert_eq!(b.consolidation_plan(7.0 * HOUR).unwrap()[0].host.as_str(), "z-h0");
    // A VM expected to stay long is worth moving for the lifetime chooser too.
    let mut c = three_hosts(30.0 * DAY);
    c.set_consolidation(Some(config(1.0, ChooserKind::Lifetime)), 1.0).unwrap();
    let plan = c.consolidation_plan(7.0 * HOUR).unwrap();
    assert_eq!(plan.len(), 1);
    assert_eq!(plan[0].host.as_str(), "z-h0");
    // The model expects it to stay 30 days; the age's reading, which caps it, gives a VM 7 hours
    // old (placed at 0) a 4,800 / (25,200 + 600 + 4,800) chance of leaving within the 20 minutes
    // of its move and the hour after.
    let (moves, wasted) = (plan[0].expected_migrations, plan[0].expected_wasted);
    assert_eq!(moves, 1.0);
    assert!((wasted - 4_800.0 / 30_600.0).abs() < 1e-9, "{wasted}");
}

#[test]
fn the_lifetime_chooser_leaves_a_vm_whose_batch_is_leaving_for_an_hour() {
    // "small" (alone on h0, placed at 0) is predicted to stay 30 days; "mate", of the same tenant
    // and placed within the minute, leaves at 6.5 h: "small" is likely to follow it soon.
    let mut a = three_hosts(30.0 * DAY);
    a.set_consolidation(Some(config(1.0, ChooserKind::Lifetime)), 1.0).unwrap();
    assert_eq!(place(&mut a, vm("mate", 2.0, 30.0 * DAY), 30.0).as_str(), "z-h1");
    a.release(&VmId::from("mate"), 6.5 * HOUR).unwrap();
    let plan = a.consolidation_plan(7.0 * HOUR).unwrap();
    assert!(plan.iter().all(|p| p.host.as_str() != "z-h0"), "{plan:?}");
    let mut b = three_hosts(30.0 * DAY);
    b.set_consolidation(Some(config(1.0, ChooserKind::FewestVms)), 1.0).unwrap();
    place(&mut b, vm("mate", 2.0, 30.0 * DAY), 30.0);
    b.release(&VmId::from("mate"), 6.5 * HOUR).unwrap();
    assert_eq!(b.consolidation_plan(7.0 * HOUR).unwrap()[0].host.as_str(), "z-h0", "model-free: batches unread");
    // An hour after the exit, "small" is worth moving again.
    let plan = a.consolidation_plan(7.6 * HOUR).unwrap();
    assert_eq!(plan.first().map(|p| p.host.as_str()), Some("z-h0"), "{plan:?}");
}

#[test]
fn a_queued_vm_whose_batch_starts_leaving_waits_for_it() {
    // h0 holds x and y (tenants u and w), h1 and h2 three small VMs each; one migration at a time.
    let mut a = allocator(4);
    let put = |a: &mut Allocator, id: &str, tenant: &str, cores: f64, host: &str| {
        let mut request = vm(id, cores, 30.0 * DAY);
        request.facts.tenant_id = tenant.into();
        let record = placement::NewVm::of(&request, 0.0);
        a.restore(record, &HostId::from(host), 0.0).unwrap();
    };
    put(&mut a, "x", "u", 4.0, "z-h0");
    put(&mut a, "y", "w", 4.0, "z-h0");
    put(&mut a, "y-mate", "w", 2.0, "z-h1");
    for (i, host) in ["z-h1", "z-h1", "z-h2", "z-h2", "z-h2"].into_iter().enumerate() {
        put(&mut a, &format!("v{i}"), "v", 2.0, host);
    }
    let settings = ConsolidationConfig { max_in_flight: InFlightLimit::Fixed(1), ..config(4.0, ChooserKind::Lifetime) };
    a.set_consolidation(Some(settings), 1.0).unwrap();
    let started = a.consolidate(7.0 * HOUR).unwrap();
    assert_eq!(started.first().map(|p| p.host.as_str()), Some("z-h0"), "{started:?}");
    let report = a.consolidation_report().unwrap();
    assert_eq!(report.in_flight.len(), 1);
    let (moving, queued) = (report.in_flight[0].vm_id.clone(), report.hosts[0].queue.clone());
    assert_eq!(queued.len(), 1);
    // y's batch-mate leaves while y waits in line: when the slot frees, y waits for it to follow.
    let waiting = queued[0].clone();
    let mate = if waiting.as_str() == "y" { "y-mate" } else { panic!("x moves first: {moving} then {waiting}") };
    a.release(&VmId::from(mate), 7.0 * HOUR + 60.0).unwrap();
    a.complete_migration(&moving, 7.0 * HOUR + 1200.0).unwrap();
    let report = a.consolidation_report().unwrap();
    assert!(report.in_flight.is_empty(), "{report:?}");
    assert_eq!(report.hosts[0].queue, queued, "y still waits");
    // An hour after its mate left, y moves.
    a.consolidate(8.5 * HOUR).unwrap();
    let report = a.consolidation_report().unwrap();
    assert_eq!(report.in_flight.iter().map(|m| m.vm_id.as_str()).collect::<Vec<_>>(), ["y"], "{report:?}");
}

#[test]
fn a_moved_vm_that_exits_within_the_hour_counts_as_wasted() {
    let mut a = three_hosts(30.0 * DAY);
    a.set_consolidation(Some(config(1.0, ChooserKind::FewestVms)), 1.0).unwrap();
    assert_eq!(a.consolidate(7.0 * HOUR).unwrap().len(), 1);
    a.complete_migration(&VmId::from("small"), 7.0 * HOUR + 1200.0).unwrap();
    a.release(&VmId::from("small"), 7.5 * HOUR).unwrap();
    assert_eq!(a.consolidation_report().unwrap().counters.wasted, 1);
}

#[test]
fn settings_are_checked_and_the_oracle_needs_true_lifetimes() {
    let mut a = allocator(2);
    let bad = ConsolidationConfig { max_in_flight: InFlightLimit::Fixed(0), ..ConsolidationConfig::default() };
    let error = a.set_consolidation(Some(bad), 0.0).unwrap_err();
    assert!(error.to_string().contains("consolidation.max_in_flight"), "{error}");
    assert_eq!(a.set_consolidation(Some(config(0.1, ChooserKind::Oracle)), 0.0), Err(ConsolidationError::NoOracle));
    assert!(a.consolidation().is_none(), "a refused setting changes nothing");
    assert_eq!(a.consolidation_plan(0.0), Err(ConsolidationError::Off));
    assert_eq!(a.pause_consolidation(true), Err(ConsolidationError::Off));
}

#[test]
fn paused_it_starts_nothing_and_off_gives_the_hosts_back() {
    let mut a = three_hosts(30.0 * DAY);
    a.set_consolidation(
        Some(ConsolidationConfig { max_in_flight: InFlightLimit::Fixed(1), ..config(1.0, ChooserKind::FewestVms) }),
        1.0,
    )
    .unwrap();
    a.pause_consolidation(true).unwrap();
    assert!(a.consolidate(7.0 * HOUR).unwrap().is_empty());
    a.pause_consolidation(false).unwrap();
    assert_eq!(a.consolidate(8.0 * HOUR).unwrap().len(), 1);
    assert_eq!(a.set_consolidation(None, 8.0 * HOUR), Err(ConsolidationError::Busy), "a migration is in flight");
    a.complete_migration(&VmId::from("small"), 8.5 * HOUR).unwrap();
    a.set_consolidation(None, 9.0 * HOUR).unwrap();
    assert!(a.consolidation().is_none());
    assert!(a.state().hosts().iter().all(|h| h.state == HostState::Available));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Whatever arrives, exits and migrates, no host is ever over capacity, the migrations started
    /// never exceed what the budget accrued (it starts empty), and exactly the hosts being emptied
    /// are out of service.
    #[test]
    fn consolidation_never_over_commits_and_keeps_to_its_budget(
        events in prop::collection::vec((1u8..=12, 1u32..200_000, 0u8..4), 20..120),
        chooser in prop::sample::select(vec![ChooserKind::FewestVms, ChooserKind::LeastUsed, ChooserKind::Age, ChooserKind::AgeBatches, ChooserKind::Lifetime]),
        budget in prop::sample::select(vec![0.5, 2.0, 8.0]),
    ) {
        let hosts = 8;
        let mut a = allocator(hosts);
        a.set_consolidation(Some(ConsolidationConfig { max_in_flight: InFlightLimit::Fixed(2), ..config(budget, chooser) }), 0.0).unwrap();
        let mut now = 0.0;
        let mut running: Vec<(VmId, f64)> = Vec::new();
        let mut migrating: Vec<(VmId, f64)> = Vec::new();
        for (i, (cores, lifetime, kind)) in events.into_iter().enumerate() {
            now += 900.0;
            // Exits and migration completions due by now.
            running.retain(|(id, end)| {
                if *end <= now {
                    a.release(id, now).unwrap();
                    false
                } else {
                    true
                }
            });
            migrating.retain(|(id, done)| *done > now || { let _ = a.complete_migration(id, now); false });
            if kind > 0 {
                let request = vm(&format!("v{i}"), f64::from(cores), f64::from(lifetime));
                if let AllocationOutcome::Placed { .. } = a.allocate(&AllocationRequest::Vm(request), now).unwrap().outcome {
                    running.push((VmId::from(format!("v{i}").as_str()), now + f64::from(lifetime)));
                }
            }
            if a.consolidation_due_s().is_some_and(|due| due <= now) {
                a.consolidate(now).unwrap();
            }
            for change in a.take_changes() {
                if let Change::MigrationStarted { vm, .. } = change {
                    migrating.push((vm, now + 1200.0));
                }
            }
            for host in a.state().hosts() {
                prop_assert!(host.used.cores() <= host.capacity.cores() && host.used.memory_gib() <= host.capacity.memory_gib());
            }
            let report = a.consolidation_report().unwrap();
            let accrued = budget * hosts as f64 * now / DAY;
            prop_assert!(report.counters.migrations_started as f64 <= accrued + 1e-9,
                "{} migrations started, {accrued} accrued", report.counters.migrations_started);
            for (index, host) in a.state().hosts().iter().enumerate() {
                let emptying = report.hosts.iter().any(|h| h.host == host.id);
                prop_assert_eq!(host.state == HostState::Unavailable, emptying, "host {}", index);
            }
        }
    }
}

#[test]
fn new_settings_keep_the_budget_earned_under_the_old_ones_up_to_a_day_of_the_new() {
    let mut a = allocator(4);
    // One migration per host per second: 4 a second on 4 hosts.
    a.set_consolidation(Some(config(86_400.0, ChooserKind::FewestVms)), 0.0).unwrap();
    a.set_consolidation(Some(config(20.0, ChooserKind::AgeBatches)), 10.0).unwrap();
    let consolidation = a.consolidation().unwrap();
    assert_eq!(consolidation.config.chooser, ChooserKind::AgeBatches);
    assert!((consolidation.budget - 40.0).abs() < 1e-9, "10 s at the old rate: {}", consolidation.budget);
    // A lower budget's bucket holds one day of it: 1 a host-day on 4 hosts.
    a.set_consolidation(Some(config(1.0, ChooserKind::AgeBatches)), 10.0).unwrap();
    assert!((a.consolidation().unwrap().budget - 4.0).abs() < 1e-9, "{}", a.consolidation().unwrap().budget);
    a.set_consolidation(Some(config(0.0, ChooserKind::AgeBatches)), 10.0).unwrap();
    assert_eq!(a.consolidation().unwrap().budget, 0.0, "a budget of 0 spends nothing more");
}
