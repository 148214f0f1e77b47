//! Following: an allocator that applies what another one committed (its journal, as a shared
//! store's change log carries it) holds the same inventory, policy state and drain, and makes the
//! same next decision, without writing anything of its own.

use domain::{
    AllocationRequest, HostId, HostState, InventorySpec, LifetimeClass, LifetimePrediction, PredictionSource,
    Resources, VmId, VmRequest,
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

fn same(leader: &Allocator, follower: &Allocator) -> Result<(), TestCaseError> {
    for (a, b) in leader.state().hosts().iter().zip(follower.state().hosts()) {
        prop_assert_eq!((&a.id, a.state, a.used), (&b.id, b.state, b.used));
        let (mut va, mut vb) = (a.vms.clone(), b.vms.clone());
        va.sort();
        vb.sort();
        prop_assert_eq!(va, vb);
        prop_assert_eq!(&a.incoming, &b.incoming);
    }
    for (i, host) in leader.state().hosts().iter().enumerate() {
        prop_assert_eq!(leader.policy_host_snapshot(&host.id), follower.policy_host_snapshot(&host.id), "host {}", i);
        prop_assert_eq!(
            leader.host_lifetime(placement::HostIndex(i as u32)),
            follower.host_lifetime(placement::HostIndex(i as u32))
        );
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
            let now = 1_000.0 + 60.0 * step as f64;
            match op {
                Op::Allocate(cores, lifetime) => {
                    let id = format!("v{step}");
                    let decision = leader.allocate(&AllocationRequest::Vm(vm(&id, cores, lifetime)), now).unwrap();
                    if decision.is_placed() {
                        placed.push(VmId(id));
                    }
                }
                Op::Release(i) if !placed.is_empty() => {
                    let id = placed.swap_remove(i % placed.len());
                    leader.release(&id, now).unwrap();
                }
                Op::Release(_) => {}
                Op::HostState(h, available) => {
                    let state = if available { HostState::Available } else { HostState::Unavailable };
                    leader.set_host_state(&HostId(format!("z-h{h}")), state).unwrap();
                }
                Op::Drain => {
                    let request = DrainRequest {
                        hosts: DrainHosts::Pick(1),
                        order: MigrationOrder::LongestRemainingFirst,
                        max_in_flight: 2,
                    };
                    let _ = leader.start_drain(&request, now);
                }
                Op::Complete => {
                    if let Some(first) = leader.drain_report().and_then(|r| r.in_flight.first().map(|m| m.vm_id.clone())) {
                        leader.complete_migration(&first, now).unwrap();
                    }
                }
            }
            // The follower's clock moves as the leader's (both read the time of the requests they
            // serve): the timers that fire on both are the follower's own changes, like the leader's.
            follower.advance_clock(leader.clock_s());
            follower.take_changes().for_each(drop);
            ship(&mut leader, &mut follower);
            same(&leader, &follower)?;
        }
        // And they decide the next request alike.
        let next = AllocationRequest::Vm(vm("next", 2, 20_000.0));
        let now = 1_000.0 + 60.0 * 121.0;
        let (a, b) = (leader.allocate(&next, now).unwrap(), follower.allocate(&next, now).unwrap());
        prop_assert_eq!(a.outcome, b.outcome);
    }
}
