//! Conflict avoidance (Protean, paper 001 s5.3): an agent that draws from the top N valid hosts
//! spreads its placements over them; without it, or with probability 0, it decides exactly as
//! before (the same hosts, the same random sequence).

use domain::{AllocationOutcome, AllocationRequest, HostId, InventorySpec, Resources, VmId, VmRequest};
use placement::rules::Buckets;
use placement::{Allocator, AllocatorConfig, ConflictAvoidance, HostIndex, HostShare, PolicyConfig, TieBreak};
use std::collections::BTreeSet;
use std::sync::Arc;

/// 8 hosts of 16 cores, filled to 1..8 cores: best fit ranks them by fill.
fn filled() -> Allocator {
    let spec = InventorySpec::homogeneous("z", 8, 2, Resources::from_whole(16.0, 64.0, 0.0).unwrap());
    // Exact best fit: one host has the best score.
    let policy = PolicyConfig { buckets: Buckets::Exact, ..PolicyConfig::preset("pbfr") };
    let config = AllocatorConfig { policy, tie_break: TieBreak::Random, ..Default::default() };
    let mut allocator = Allocator::new(&spec, &config).unwrap();
    for h in 0..8u32 {
        for others in 0..8u32 {
            let state = if others == h { domain::HostState::Available } else { domain::HostState::Failed };
            allocator.set_host_state(&HostId(format!("z-h{others}")), state).unwrap();
        }
        let vm =
            VmRequest::new(&format!("fill{h}"), "t", "D", Resources::from_whole(f64::from(h + 1), 4.0, 0.0).unwrap());
        assert!(allocator.allocate(&AllocationRequest::Vm(vm), 100.0).unwrap().is_placed());
    }
    for h in 0..8 {
        allocator.set_host_state(&HostId(format!("z-h{h}")), domain::HostState::Available).unwrap();
    }
    allocator.take_changes().for_each(drop);
    allocator
}

/// The hosts 40 one-core VMs land on, each released again right after.
fn landings(allocator: &mut Allocator) -> Vec<HostId> {
    (0..40)
        .map(|i| {
            let vm = VmRequest::new(&format!("v{i}"), "t", "D", Resources::from_whole(1.0, 1.0, 0.0).unwrap());
            let decision = allocator.allocate(&AllocationRequest::Vm(vm), 200.0).unwrap();
            let AllocationOutcome::Placed { placements } = decision.outcome else { panic!("rejected") };
            allocator.release(&VmId(format!("v{i}")), 200.0).unwrap();
            placements[0].host_id.clone()
        })
        .collect()
}

#[test]
fn avoidance_draws_among_the_top_hosts_and_probability_zero_changes_nothing() {
    let mut plain = filled();
    let best = landings(&mut plain);
    assert_eq!(best.iter().collect::<BTreeSet<_>>().len(), 1, "best fit: always the fullest host: {best:?}");

    let mut zero = filled();
    zero.set_conflict_avoidance(Some(ConflictAvoidance { top: 3, probability: 0.0, share: None }));
    assert_eq!(landings(&mut zero), best, "probability 0 decides as without avoidance");

    let mut avoiding = filled();
    let vm = VmRequest::new("probe", "t", "D", Resources::from_whole(1.0, 1.0, 0.0).unwrap());
    let top3: BTreeSet<HostId> =
        avoiding.explain(&vm, None, 3, 200.0).unwrap().top.into_iter().map(|ranked| ranked.host_id).collect();
    avoiding.set_conflict_avoidance(Some(ConflictAvoidance { top: 3, probability: 1.0, share: None }));
    let spread: BTreeSet<HostId> = landings(&mut avoiding).into_iter().collect();
    assert!(spread.is_subset(&top3), "{spread:?} outside the top 3 {top3:?}");
    assert!(spread.len() > 1, "40 draws among 3 hosts used only {spread:?}");
}

/// Hosts tied with the last of the top N share its chances: the ranking orders ties by host
/// index, and cutting there would send every agent to the same lowest-index hosts.
#[test]
fn hosts_tied_at_the_cut_share_the_draw() {
    let spec = InventorySpec::homogeneous("z", 8, 2, Resources::from_whole(16.0, 64.0, 0.0).unwrap());
    let config =
        AllocatorConfig { policy: PolicyConfig::preset("pbfr"), tie_break: TieBreak::Random, ..Default::default() };
    let mut allocator = Allocator::new(&spec, &config).unwrap();
    // Every host is empty: all 8 tie.
    allocator.set_conflict_avoidance(Some(ConflictAvoidance { top: 2, probability: 1.0, share: None }));
    let spread: BTreeSet<HostId> = landings(&mut allocator).into_iter().collect();
    assert!(spread.len() > 2, "40 draws over 8 tied hosts used only {spread:?}");
}

/// With a share of the hosts, each agent takes the best of its own hosts among the top ones:
/// agents that know each other land on different hosts, each on its best own one.
#[test]
fn agents_with_shares_take_their_best_own_host_and_never_the_same() {
    let mut landed = Vec::new();
    for me in ["agent-a", "agent-b"] {
        let mut allocator = filled();
        let ids: Vec<HostId> = allocator.state().hosts().iter().map(|host| host.id.clone()).collect();
        let share = HostShare::rendezvous(me, &["agent-a", "agent-b"], &ids);
        // Best fit ranks the fuller hosts first: host 7 (8 cores used) is the best for everyone.
        let best_own = (0..8u32).rev().find(|h| share.is_own(HostIndex(*h))).expect("an own host among 8");
        allocator.set_conflict_avoidance(Some(ConflictAvoidance {
            top: 8,
            probability: 1.0,
            share: Some(Arc::new(share)),
        }));
        let hosts: BTreeSet<HostId> = landings(&mut allocator).into_iter().collect();
        assert_eq!(hosts, BTreeSet::from([HostId(format!("z-h{best_own}"))]), "{me}");
        landed.push(hosts);
    }
    assert!(landed[0].is_disjoint(&landed[1]), "{landed:?}");
}

/// An agent that owns none of the top hosts takes its best own host further down the ranking
/// (up to `top` per agent), not a random top host that another agent owns and may be filling.
#[test]
fn an_agent_owning_none_of_the_top_hosts_takes_its_best_own_host_below_them() {
    let agents = ["agent-a", "agent-b"];
    let mut allocator = filled();
    let ids: Vec<HostId> = allocator.state().hosts().iter().map(|host| host.id.clone()).collect();
    // The agent whose best own host is the lowest in best fit's ranking (host 7, the fullest, first).
    let (me, share, best_own) = agents
        .iter()
        .map(|me| {
            let share = HostShare::rendezvous(me, &agents, &ids);
            let best_own = (0..8u32).rev().find(|h| share.is_own(HostIndex(*h))).expect("an own host among 8");
            (*me, share, best_own)
        })
        .min_by_key(|(_, _, best_own)| *best_own)
        .unwrap();
    // The top hosts down to just above its best own one (the other agent owns host 7, so there is
    // at least one): none of them is its own.
    let top = (7 - best_own) as usize;
    allocator.set_conflict_avoidance(Some(ConflictAvoidance { top, probability: 1.0, share: Some(Arc::new(share)) }));
    let hosts: BTreeSet<HostId> = landings(&mut allocator).into_iter().collect();
    assert_eq!(hosts, BTreeSet::from([HostId(format!("z-h{best_own}"))]), "{me} with the top {top}");
}
