//! LARS drains (paper 000 s4.4): migration order, VMs that exit during the drain, reservations that
//! never over-commit a host, drained hosts that end empty and stay unavailable until restored, and
//! drains that survive a restart.

use allocator::durable::{Allocate, CompleteMigration, DurableAllocator, StartDrain};
use domain::{
    AllocationOutcome, AllocationRequest, HostId, HostState, InventorySpec, LifetimeClass, LifetimePrediction,
    PredictionSource, Resources, VmId, VmRequest,
};
use placement::defrag::{DrainHosts, DrainRequest, MigrationOrder};
use placement::{Allocator, AllocatorConfig, HostIndex, PolicyConfig, Registry, TieBreak};
use proptest::prelude::*;

const HOUR: f64 = 3600.0;
const MIGRATION_S: f64 = 1200.0;

fn vm(id: &str, cores: f64, lifetime_s: f64) -> VmRequest {
    let mut vm = VmRequest::new(id, "t", "D", Resources::from_whole(cores, cores * 2.0, 0.0).unwrap());
    vm.prediction = Some(LifetimePrediction {
        p_long: if lifetime_s >= 2.0 * HOUR { 0.9 } else { 0.1 },
        class: if lifetime_s >= 2.0 * HOUR { LifetimeClass::Long } else { LifetimeClass::Short },
        interval_class: None,
        expected_lifetime_s: Some(lifetime_s),
        model_version: None,
        source: PredictionSource::Model,
    });
    vm
}

fn allocator(kind: &str, hosts: usize) -> Allocator {
    let config =
        AllocatorConfig { policy: PolicyConfig::preset(kind), tie_break: TieBreak::LowestIndex, ..Default::default() };
    Allocator::new(&InventorySpec::homogeneous("z", hosts, 2, Resources::from_whole(16.0, 64.0, 0.0).unwrap()), &config)
        .unwrap()
}

fn host_of(allocator: &Allocator, vm: &str) -> HostId {
    let placed = allocator.state().vm(&VmId::from(vm)).unwrap();
    allocator.state().hosts()[placed.host.get()].id.clone()
}

/// One host with five VMs placed in arrival order, with these predicted lifetimes.
const ARRIVALS: [(&str, f64); 5] =
    [("a-1h", HOUR), ("b-10h", 10.0 * HOUR), ("c-30m", 0.5 * HOUR), ("d-100h", 100.0 * HOUR), ("e-5h", 5.0 * HOUR)];

fn loaded(kind: &str) -> (Allocator, HostId) {
    let mut a = allocator(kind, 4);
    for (i, (id, lifetime)) in ARRIVALS.iter().enumerate() {
        a.allocate(&AllocationRequest::Vm(vm(id, 2.0, *lifetime)), i as f64).unwrap();
    }
    let source = host_of(&a, "a-1h");
    assert!(ARRIVALS.iter().all(|(id, _)| host_of(&a, id) == source), "best fit packs them on one host");
    (a, source)
}

fn drain(order: MigrationOrder, host: &HostId) -> DrainRequest {
    DrainRequest { hosts: DrainHosts::Listed(vec![host.clone()]), order, max_in_flight: 1 }
}

/// LARS moves the longest predicted remaining lifetime first; a VM that exits before its turn is
/// not migrated (saved), one that exits while moving gives its reservation back (cancelled).
#[test]
fn lars_migrates_longest_first_and_skips_vms_that_exit() {
    let (mut a, source) = loaded("pbfr");
    let report = a.start_drain(&drain(MigrationOrder::LongestRemainingFirst, &source), 10.0).unwrap();
    assert_eq!(report.in_flight.len(), 1);
    assert_eq!(report.in_flight[0].vm_id.as_str(), "d-100h");
    let queued: Vec<&str> = report.queued.iter().map(VmId::as_str).collect();
    assert_eq!(queued, ["b-10h", "e-5h", "a-1h", "c-30m"]);
    let source_index = a.state().host_index(&source).unwrap();
    assert_eq!(a.state().hosts()[source_index.get()].state, HostState::Unavailable);
    // The migrating VM holds its demand on both hosts.
    let target = a.state().host_index(&report.in_flight[0].target).unwrap();
    assert_eq!(a.state().hosts()[target.get()].incoming[0].id, VmId::from("d-100h"));
    assert_eq!(a.state().hosts()[target.get()].incoming.len(), 1);
    assert_eq!(a.state().hosts()[target.get()].used, Resources::from_whole(2.0, 4.0, 0.0).unwrap());

    // The 30-minute VM exits while d moves: one migration saved.
    a.release(&VmId::from("c-30m"), 0.5 * HOUR).unwrap();
    let moved = a.complete_migration(&VmId::from("d-100h"), 10.0 + MIGRATION_S).unwrap();
    assert_eq!(host_of(&a, "d-100h"), moved.target);
    let report = a.drain_report().unwrap();
    assert_eq!(report.in_flight[0].vm_id.as_str(), "b-10h");
    // b exits while moving: the reservation goes back, the next one starts.
    a.release(&VmId::from("b-10h"), 0.6 * HOUR).unwrap();
    let report = a.drain_report().unwrap();
    assert_eq!((report.performed, report.avoided, report.cancelled), (1, 1, 1));
    assert_eq!(report.in_flight[0].vm_id.as_str(), "e-5h");
    assert!(a.state().hosts().iter().all(|h| h.incoming.len() <= 1));
    a.complete_migration(&VmId::from("e-5h"), 0.7 * HOUR).unwrap();
    a.complete_migration(&VmId::from("a-1h"), 0.8 * HOUR).unwrap();
    let report = a.drain_report().unwrap();
    assert!(report.done, "{report:?}");
    assert_eq!((report.performed, report.avoided, report.cancelled), (3, 1, 1));
    assert!(a.state().hosts()[source_index.get()].is_empty());
    assert_eq!(a.state().hosts()[source_index.get()].state, HostState::Unavailable, "stays out until restored");
    assert!(a.complete_migration(&VmId::from("a-1h"), HOUR).is_err(), "not migrating any more");
}

/// The baseline moves VMs in arrival order.
#[test]
fn the_baseline_migrates_in_arrival_order() {
    let (mut a, source) = loaded("pbfr");
    let report = a.start_drain(&drain(MigrationOrder::Arrival, &source), 10.0).unwrap();
    let order: Vec<&str> =
        report.in_flight.iter().map(|m| m.vm_id.as_str()).chain(report.queued.iter().map(VmId::as_str)).collect();
    assert_eq!(order, ["a-1h", "b-10h", "c-30m", "d-100h", "e-5h"]);
    assert!(a.start_drain(&drain(MigrationOrder::Arrival, &source), 11.0).is_err(), "one drain at a time");
}

/// Simulated in time (20-minute migrations, VMs exiting at their predicted lifetimes, one migration
/// at a time): LARS performs fewer migrations than the arrival-order baseline on the same host.
#[test]
fn lars_needs_fewer_migrations_than_arrival_order() {
    let run = |order| {
        let (mut a, source) = loaded("pbfr");
        let start = 10.0;
        a.start_drain(&drain(order, &source), start).unwrap();
        let mut exits: Vec<(f64, &str)> = ARRIVALS.iter().enumerate().map(|(i, (id, l))| (i as f64 + l, *id)).collect();
        exits.sort_by(|x, y| x.0.total_cmp(&y.0));
        let mut now = start;
        while let Some(report) = a.drain_report().filter(|r| !r.done) {
            let migration = &report.in_flight[0];
            let done_at = migration.started_at_s.max(now) + MIGRATION_S;
            // VMs that exit before this migration completes.
            for (at, id) in exits.iter().filter(|(at, _)| *at > now && *at <= done_at) {
                if a.state().vm(&VmId::from(*id)).is_some() {
                    a.release(&VmId::from(*id), *at).unwrap();
                }
            }
            now = done_at;
            let still_moving = a.drain_report().unwrap().in_flight.first().map(|m| m.vm_id.clone());
            if let Some(vm) = still_moving {
                a.complete_migration(&vm, now).unwrap();
            }
        }
        a.drain_report().unwrap()
    };
    let lars = run(MigrationOrder::LongestRemainingFirst);
    let baseline = run(MigrationOrder::Arrival);
    assert!(lars.performed < baseline.performed, "LARS {lars:?} vs arrival {baseline:?}");
    assert_eq!(lars.performed + lars.avoided + lars.cancelled, 5);
    assert_eq!(baseline.performed + baseline.avoided + baseline.cancelled, 5);
}

#[derive(Clone, Debug)]
enum Op {
    Allocate { cores: u8, lifetime_h: u16 },
    Release(u16),
    Drain { count: u8, lars: bool, in_flight: u8 },
    Complete(u8),
    Restore(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (1u8..9, 1u16..300).prop_map(|(cores, lifetime_h)| Op::Allocate { cores, lifetime_h }),
        3 => (0u16..500).prop_map(Op::Release),
        1 => (1u8..4, any::<bool>(), 1u8..4).prop_map(|(count, lars, in_flight)| Op::Drain { count, lars, in_flight }),
        4 => (0u8..8).prop_map(Op::Complete),
        1 => (0u8..8).prop_map(Op::Restore),
    ]
}

fn check_books(a: &Allocator) -> Result<(), TestCaseError> {
    let state = a.state();
    for host in state.hosts() {
        prop_assert!(host.used.fits_within(&host.capacity), "host {} over-committed", host.id);
        // Used = the VMs on it + the VMs migrating to it.
        let sum = host
            .vms
            .iter()
            .chain(&host.incoming)
            .fold(Resources::ZERO, |acc, vm| acc + state.vm(&vm.id).unwrap().facts.demand);
        prop_assert_eq!(sum, host.used, "host {}", host.id);
        for vm in &host.incoming {
            prop_assert!(!host.vms.iter().any(|placed| placed.id == vm.id));
            prop_assert_eq!(state.migration_target(&vm.id), state.host_index(&host.id));
        }
    }
    let totals = state.totals();
    prop_assert_eq!(totals.non_empty_hosts, state.hosts().iter().filter(|h| !h.is_empty()).count());
    prop_assert_eq!(totals.used, state.hosts().iter().fold(Resources::ZERO, |acc, h| acc + h.used));
    Ok(())
}

fn kinds() -> impl Strategy<Value = &'static str> {
    prop_oneof![Just("pbfr"), Just("la-binary"), Just("nilas"), Just("lava")]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Whatever mix of placements, exits, drains and completed migrations: no host is ever
    /// over-committed (a migrating VM counts on both hosts), new VMs never land on a draining host,
    /// and once its migrations are done a drained host is empty and stays unavailable until it is
    /// restored.
    #[test]
    fn drains_never_over_commit_and_end_empty_and_unavailable(kind in kinds(), ops in proptest::collection::vec(op(), 1..120)) {
        let mut a = allocator(kind, 8);
        let (mut now, mut next) = (0.0, 0);
        let mut placed: Vec<VmId> = Vec::new();
        for op in &ops {
            now += 60.0;
            match op {
                Op::Allocate { cores, lifetime_h } => {
                    next += 1;
                    let request = vm(&format!("v{next}"), f64::from(*cores), f64::from(*lifetime_h) * 600.0);
                    let decision = a.allocate(&AllocationRequest::Vm(request), now).unwrap();
                    if let AllocationOutcome::Placed { placements } = decision.outcome {
                        let host = a.state().host_index(&placements[0].host_id).unwrap();
                        prop_assert_eq!(a.state().hosts()[host.get()].state, HostState::Available);
                        placed.extend(placements.into_iter().map(|p| p.vm_id));
                    }
                }
                Op::Release(i) if !placed.is_empty() => {
                    let vm = placed.swap_remove(usize::from(*i) % placed.len());
                    a.release(&vm, now).unwrap();
                }
                Op::Release(_) => {}
                Op::Drain { count, lars, in_flight } => {
                    let order = if *lars { MigrationOrder::LongestRemainingFirst } else { MigrationOrder::Arrival };
                    let request = DrainRequest { hosts: DrainHosts::Pick(usize::from(*count)), order, max_in_flight: usize::from(*in_flight) };
                    if let Ok(report) = a.start_drain(&request, now) {
                        prop_assert!(report.in_flight.len() <= usize::from(*in_flight));
                    }
                }
                Op::Complete(i) => {
                    let in_flight = a.drain_report().map(|r| r.in_flight).unwrap_or_default();
                    if !in_flight.is_empty() {
                        let vm = in_flight[usize::from(*i) % in_flight.len()].vm_id.clone();
                        a.complete_migration(&vm, now).unwrap();
                    }
                }
                Op::Restore(h) => {
                    let id = a.state().hosts()[usize::from(*h)].id.clone();
                    a.set_host_state(&id, HostState::Available).unwrap();
                }
            }
            check_books(&a)?;
        }
        // Finish the drain: complete whatever is in flight until nothing is.
        let mut guard = 0;
        while let Some(report) = a.drain_report().filter(|r| !r.in_flight.is_empty()) {
            now += MIGRATION_S;
            a.complete_migration(&report.in_flight[0].vm_id, now).unwrap();
            check_books(&a)?;
            guard += 1;
            prop_assert!(guard < 1000);
        }
        let restored = ops.iter().any(|op| matches!(op, Op::Restore(_)));
        if let Some(report) = a.drain_report() {
            // (A host restored during its drain keeps its VMs and takes new ones.)
            if report.queued.is_empty() && !restored {
                prop_assert!(report.done);
                for id in &report.hosts {
                    let host = &a.state().hosts()[a.state().host_index(id).unwrap().get()];
                    prop_assert!(host.is_empty(), "drained host {} still has {:?}", id, host.vms);
                    prop_assert_eq!(host.state, HostState::Unavailable);
                }
            }
        }
    }
}

/// A drain with migrations in flight survives a restart: the reservations, the queue and the
/// counters come back, and the migration can be confirmed after it.
#[test]
fn a_drain_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let spec = InventorySpec::homogeneous("z", 4, 2, Resources::from_whole(16.0, 64.0, 0.0).unwrap());
    let config = AllocatorConfig { policy: PolicyConfig::preset("lava"), ..Default::default() };
    let mut durable = DurableAllocator::open(&spec, &config, &Registry::standard(), &path, 0.0).unwrap();
    for (i, (id, lifetime)) in ARRIVALS.iter().enumerate() {
        durable.execute_one(Allocate(AllocationRequest::Vm(vm(id, 2.0, *lifetime))), i as f64).unwrap();
    }
    let source = host_of(durable.allocator().unwrap(), "a-1h");
    let request = DrainRequest {
        hosts: DrainHosts::Listed(vec![source.clone()]),
        order: MigrationOrder::LongestRemainingFirst,
        max_in_flight: 2,
    };
    let Ok(started) = durable.execute_one(StartDrain(request), 10.0) else { panic!("drain refused") };
    assert_eq!(started.in_flight.len(), 2);
    let first = started.in_flight[0].vm_id.clone();
    durable.execute_one(CompleteMigration::of(first.clone()), 20.0).unwrap();
    let live = durable.allocator().unwrap();
    let (state_before, report_before) = (live.state().clone(), live.drain_report());
    let lava_before: Vec<_> = (0..4).map(|i| live.host_state().map(|s| s.snapshot(HostIndex(i)))).collect();
    drop(durable);

    let mut reopened = DurableAllocator::open(&spec, &config, &Registry::standard(), &path, 20.0).unwrap();
    let live = reopened.allocator().unwrap();
    assert_eq!(live.state(), &state_before, "VMs, reservations and host states come back");
    assert_eq!(live.drain_report(), report_before);
    assert_eq!((0..4).map(|i| live.host_state().map(|s| s.snapshot(HostIndex(i)))).collect::<Vec<_>>(), lava_before);
    let next = report_before.unwrap().in_flight[0].vm_id.clone();
    let Ok(done) = reopened.execute_one(CompleteMigration::of(next.clone()), 30.0) else {
        panic!("the restored migration cannot be confirmed")
    };
    assert_eq!(host_of(reopened.allocator().unwrap(), next.as_str()), done.target);
}
