//! Following: an allocator that applies what another one committed (its journal, as a shared
//! store's change log carries it) holds the same inventory, policy state and drain, and makes the
//! same next decision, without writing anything of its own.

use domain::{
    AllocationRequest, FeatureValue, HostId, HostState, InventorySpec, LifetimeClass, LifetimePrediction,
    PredictionSource, Priority, RequestDetails, Resources, VmId, VmRequest,
};
use placement::defrag::{DrainHosts, DrainRequest, MigrationOrder};
use placement::journal::LoggedChange;
use placement::{Allocator, AllocatorConfig, PolicyConfig, TieBreak};
use proptest::prelude::*;

fn allocator(kind: &str) -> Allocator {
    let spec = InventorySpec::homogeneous("z", 8, 2, Resources::from_whole(16.0, 64.0, 0.0).unwrap());
    let config =
        AllocatorConfig { policy: PolicyConfig::preset(kind), tie_break: TieBreak::LowestIndex, ..Default::default() };
    Allocator::new(&spec, &config).unwrap()
}

fn vm(id: &str, cores: u8, lifetime_s: f64) -> VmRequest {
    let cores = f64::from(cores);
    let mut vm = VmRequest::new(id, "t", "D", Resources::from_whole(cores, cores * 2.0, 0.0).unwrap());
    vm.prediction = Some(LifetimePrediction {
        p_long: if lifetime_s >= 7200.0 { 0.9 } else { 0.1 },
        class: if lifetime_s >= 7200.0 { LifetimeClass::Long } else { LifetimeClass::Short },
        interval_class: None,
        expected_lifetime_s: Some(lifetime_s),
        model_version: None,
        source: PredictionSource::Model,
    });
    vm
}

/// Moves everything `leader` changed since the last call over to `follower`.
fn ship(leader: &mut Allocator, follower: &mut Allocator) {
    let changes: Vec<_> = leader.take_changes().collect();
    for change in &changes {
        let logged = LoggedChange::of(change, &|host: &HostId| leader.policy_host_snapshot(host));
        // Through the log's own encoding.
        let logged: LoggedChange = serde_json::from_str(&serde_json::to_string(&logged).unwrap()).unwrap();
        follower.follow(&logged).unwrap();
    }
    assert_eq!(follower.take_changes().count(), 0, "following writes nothing");
}

/// The ids of a host's VMs, sorted.
fn sorted_ids(vms: &[std::sync::Arc<placement::NewVm>]) -> Vec<VmId> {
    let mut ids: Vec<VmId> = vms.iter().map(|vm| vm.id.clone()).collect();
    ids.sort();
    ids
}

/// `overdue_alike`: a host whose VMs all outlived their predicted exits counts as the same
/// whenever its exit time is (it is in the past on both). Such a VM's exit time is fixed when it is
/// first computed, so an allocator that put a released VM back (or rebuilt from the store) computes
/// it later than one that held the VM all along; both read it as "overdue now".
fn same(leader: &Allocator, follower: &Allocator, overdue_alike: bool) -> Result<(), TestCaseError> {
    for (a, b) in leader.state().hosts().iter().zip(follower.state().hosts()) {
        prop_assert_eq!((&a.id, a.state, a.used), (&b.id, b.state, b.used));
        prop_assert_eq!(sorted_ids(&a.vms), sorted_ids(&b.vms));
        let incoming = |h: &placement::HostRecord| h.incoming.iter().map(|vm| vm.id.clone()).collect::<Vec<_>>();
        prop_assert_eq!(incoming(a), incoming(b));
    }
    let now = leader.clock_s().max(follower.clock_s());
    for (i, host) in leader.state().hosts().iter().enumerate() {
        prop_assert_eq!(leader.policy_host_snapshot(&host.id), follower.policy_host_snapshot(&host.id), "host {}", i);
        let index = placement::HostIndex(i as u32);
        let (mut a, mut b) = (*leader.host_lifetime(index), *follower.host_lifetime(index));
        if host.is_empty() {
            // No rule reads an empty host's policy code (LAVA ranks it as empty), and a host never
            // touched still has its initial one.
            (a.state_code, b.state_code) = (0, 0);
        }
        if overdue_alike && a.exit_s <= now && b.exit_s <= now {
            (a.exit_s, b.exit_s) = (now, now);
        }
        prop_assert_eq!(a, b, "host {}", i);
    }
    prop_assert_eq!(leader.drain_report(), follower.drain_report());
    Ok(())
}

#[derive(Clone, Debug)]
enum Op {
    Allocate(u8, f64),
    Release(usize),
    HostState(u32, bool),
    Drain,
    Complete,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1..=6u8, prop_oneof![Just(600.0), Just(20_000.0), Just(500_000.0)]).prop_map(|(c, l)| Op::Allocate(c, l)),
        3 => (0..1000usize).prop_map(Op::Release),
        1 => (0..8u32, any::<bool>()).prop_map(|(h, a)| Op::HostState(h, a)),
        1 => Just(Op::Drain),
        2 => Just(Op::Complete),
    ]
}

/// Runs `op` at step `step` on `allocator`; `placed` holds the VMs it may release. Drains and
/// migrations only with `drains`.
fn run_op(allocator: &mut Allocator, op: Op, step: usize, placed: &mut Vec<VmId>, drains: bool) {
    let now = 1_000.0 + 60.0 * step as f64;
    match op {
        Op::Allocate(cores, lifetime) => {
            let id = format!("v{step}");
            let decision = allocator.allocate(&AllocationRequest::Vm(vm(&id, cores, lifetime)), now).unwrap();
            if decision.is_placed() {
                placed.push(VmId(id));
            }
        }
        Op::Release(i) if !placed.is_empty() => {
            let id = placed.swap_remove(i % placed.len());
            allocator.release(&id, now).unwrap();
        }
        Op::HostState(h, available) => {
            let state = if available { HostState::Available } else { HostState::Unavailable };
            allocator.set_host_state(&HostId(format!("z-h{h}")), state).unwrap();
        }
        Op::Drain if drains => {
            let request = DrainRequest {
                hosts: DrainHosts::Pick(1),
                order: MigrationOrder::LongestRemainingFirst,
                max_in_flight: 2,
            };
            let _ = allocator.start_drain(&request, now);
        }
        Op::Complete if drains => {
            if let Some(first) = allocator.drain_report().and_then(|r| r.in_flight.first().map(|m| m.vm_id.clone())) {
                allocator.complete_migration(&first, now).unwrap();
            }
        }
        Op::Release(_) | Op::Drain | Op::Complete => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn a_follower_holds_what_the_leader_holds(
        kind in prop_oneof![Just("pbfr"), Just("nilas"), Just("lava")],
        ops in prop::collection::vec(op(), 1..120),
    ) {
        let (mut leader, mut follower) = (allocator(kind), allocator(kind));
        let mut placed: Vec<VmId> = Vec::new();
        for (step, op) in ops.into_iter().enumerate() {
            run_op(&mut leader, op, step, &mut placed, true);
            // The follower's clock moves as the leader's (both read the time of the requests they
            // serve): the timers that fire on both are the follower's own changes, like the leader's.
            follower.advance_clock(leader.clock_s());
            follower.take_changes().for_each(drop);
            ship(&mut leader, &mut follower);
            same(&leader, &follower, false)?;
        }
        // And they decide the next request alike.
        let next = AllocationRequest::Vm(vm("next", 2, 20_000.0));
        let now = 1_000.0 + 60.0 * 121.0;
        let (a, b) = (leader.allocate(&next, now).unwrap(), follower.allocate(&next, now).unwrap());
        prop_assert_eq!(a.outcome, b.outcome);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// A batch the store refused is taken back: with the policy states of the hosts it names read
    /// back from the store (here: an allocator that followed every committed change), the
    /// allocator holds what the store holds and decides the next request alike.
    #[test]
    fn an_undone_batch_leaves_what_the_store_holds(
        kind in prop_oneof![Just("pbfr"), Just("nilas"), Just("lava")],
        committed in prop::collection::vec(op(), 0..60),
        refused in prop::collection::vec(op(), 1..12),
    ) {
        let (mut agent, mut store) = (allocator(kind), allocator(kind));
        let mut placed: Vec<VmId> = Vec::new();
        let mut step = 0;
        // Runs `ops` on the agent; with `store`, each op's changes are committed to it at once.
        let mut run = |agent: &mut Allocator, ops: Vec<Op>, placed: &mut Vec<VmId>, mut store: Option<&mut Allocator>| {
            for op in ops {
                step += 1;
                // Drains and migrations are not taken back in memory (the agent rebuilds).
                run_op(agent, op, step, placed, false);
                // Time passes for the store's other agents too: their timers fire as the agent's.
                if let Some(store) = store.as_deref_mut() {
                    store.advance_clock(agent.clock_s());
                    store.take_changes().for_each(drop);
                    ship(agent, store);
                }
            }
        };
        run(&mut agent, committed, &mut placed, Some(&mut store));
        run(&mut agent, refused, &mut placed.clone(), None);
        store.advance_clock(agent.clock_s());
        store.take_changes().for_each(drop);
        let batch: Vec<_> = agent.take_changes().collect();
        let hosts = agent.undo(&batch).unwrap();
        for host in hosts {
            let change = LoggedChange::PolicyHostState {
                host: host.clone(),
                policy: agent.host_state().map(|p| p.name().to_owned()).unwrap_or_default(),
                state: store.policy_host_snapshot(&host),
            };
            agent.follow(&change).unwrap();
        }
        prop_assert_eq!(agent.take_changes().count(), 0, "taking back writes nothing");
        // A timer that the store's state read back has not seen fires again, at its own time.
        agent.advance_clock(agent.clock_s());
        agent.take_changes().for_each(drop);
        same(&store, &agent, true)?;
        let next = AllocationRequest::Vm(vm("next", 2, 20_000.0));
        let now = agent.clock_s() + 60.0;
        let (a, b) = (store.allocate(&next, now).unwrap(), agent.allocate(&next, now).unwrap());
        prop_assert_eq!(a.outcome, b.outcome);
    }
}

#[test]
fn a_batch_with_a_migration_is_not_taken_back() {
    let mut agent = allocator("pbfr");
    agent.allocate(&AllocationRequest::Vm(vm("a", 2, 500_000.0)), 1_000.0).unwrap();
    agent.take_changes().for_each(drop);
    let request =
        DrainRequest { hosts: DrainHosts::Pick(1), order: MigrationOrder::LongestRemainingFirst, max_in_flight: 2 };
    agent.start_drain(&request, 1_060.0).unwrap();
    let batch: Vec<_> = agent.take_changes().collect();
    assert!(matches!(agent.undo(&batch), Err(placement::allocator::UndoError::NotReversible)));
}

/// The store judges a batch by its net effect per host: a batch that places a VM and then releases
/// another on the same host is accepted after another agent's batch filled the host, and follows.
#[test]
fn a_batch_follows_by_its_net_effect() {
    let (mut agent_a, mut agent_b) = (allocator("pbfr"), allocator("pbfr"));
    // What the store holds: one host only has room (every other host is failed), with two VMs.
    let shipped: Vec<LoggedChange> = {
        let mut fresh = allocator("pbfr");
        for h in 1..8 {
            fresh.set_host_state(&HostId(format!("z-h{h}")), HostState::Failed).unwrap();
        }
        fresh.allocate(&AllocationRequest::Vm(vm("old", 4, 600.0)), 1_000.0).unwrap();
        fresh.allocate(&AllocationRequest::Vm(vm("filler", 6, 600.0)), 1_000.0).unwrap();
        fresh.take_changes().map(|c| LoggedChange::of(&c, &|_: &HostId| None)).collect()
    };
    agent_a.follow_batch(&shipped).unwrap();
    agent_b.follow_batch(&shipped).unwrap();
    // 16 cores, 10 used. Agent B fills the host (6 cores); agent A, not knowing it, places 4 cores
    // and releases `old` (4 cores) in one batch: net 0, which the store accepts after B's batch.
    let b = vm("b", 6, 600.0);
    assert!(agent_b.allocate(&AllocationRequest::Vm(b), 1_060.0).unwrap().is_placed());
    let b_batch: Vec<LoggedChange> = agent_b.take_changes().map(|c| LoggedChange::of(&c, &|_: &HostId| None)).collect();
    assert!(agent_a.allocate(&AllocationRequest::Vm(vm("a", 4, 600.0)), 1_060.0).unwrap().is_placed());
    agent_a.release(&VmId::from("old"), 1_060.0).unwrap();
    let a_batch: Vec<LoggedChange> = agent_a.take_changes().map(|c| LoggedChange::of(&c, &|_: &HostId| None)).collect();
    let mut follower = allocator("pbfr");
    follower.follow_batch(&shipped).unwrap();
    follower.follow_batch(&b_batch).unwrap();
    // Change by change, the placement comes before the release and does not fit ...
    let mut one_by_one = allocator("pbfr");
    one_by_one.follow_batch(&shipped).unwrap();
    one_by_one.follow_batch(&b_batch).unwrap();
    assert!(a_batch.iter().try_for_each(|change| one_by_one.follow(change)).is_err());
    // ... as a batch, it does.
    follower.follow_batch(&a_batch).unwrap();
    let host = &follower.state().hosts()[0];
    assert_eq!(host.used.base(domain::ResourceKind::Cores), 16_000);
    assert_eq!(sorted_ids(&host.vms), [VmId::from("a"), VmId::from("b"), VmId::from("filler")]);
}

#[test]
fn a_placement_keeps_what_its_request_carried_and_the_log_carries_it_to_a_follower() {
    let mut leader = allocator("pbfr");
    let mut follower = allocator("pbfr");
    let mut request = vm("x", 2, 600.0);
    request.facts.requested_at_s = Some(1_600_000_000.5);
    request.facts.details.priority = Priority::Low;
    request.facts.details.os = Some("linux".to_owned());
    request.facts.details.features.insert("batch_size".to_owned(), FeatureValue::Number(4.0));
    request.facts.details.features.insert("region".to_owned(), FeatureValue::Text("eu".to_owned()));
    leader.allocate(&AllocationRequest::Vm(request.clone()), 1_000.0).unwrap();
    leader.allocate(&AllocationRequest::Vm(vm("plain", 2, 600.0)), 1_001.0).unwrap();
    let x = leader.state().vm(&VmId::from("x")).unwrap().record.clone();
    assert_eq!((x.placed_at_s, x.facts.requested_at_s), (1_000.0, Some(1_600_000_000.5)));
    assert_eq!(x.facts, request.facts);
    let plain = leader.state().vm(&VmId::from("plain")).unwrap().record.clone();
    assert_eq!((plain.facts.requested_at_s, plain.facts.details.is_default()), (None, true));
    // The log leaves defaults out, so a plain placement costs what it did.
    let json = serde_json::to_string(&*plain).unwrap();
    assert!(!json.contains("requested_at_s") && !json.contains("request"), "{json}");
    ship(&mut leader, &mut follower);
    for id in ["x", "plain"] {
        let id = VmId::from(id);
        assert_eq!(follower.state().vm(&id).unwrap().record, leader.state().vm(&id).unwrap().record);
    }
}

#[test]
fn a_logged_placement_of_an_older_release_reads_as_one_without_request_facts() {
    let old = r#"{"change":"placed","host":"z-h0","vm":{"id":"v","tenant":"t","vm_type":"D",
        "demand":{"cores":1,"memory_gib":2,"ssd_gib":0},"placed_at_s":5.0,"prediction":null}}"#;
    let Ok(LoggedChange::Placed { vm, .. }) = serde_json::from_str::<LoggedChange>(old) else {
        panic!("an older release's log row is readable")
    };
    assert_eq!((vm.facts.requested_at_s, vm.facts.details), (None, RequestDetails::default()));
}
