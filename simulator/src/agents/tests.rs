//! The agents' model against the single allocator, and the store's and views' rules on hand-made
//! cases: one agent is the single-allocator run exactly; a stale agent that goes for a host
//! another agent filled is refused and decides again; a refused batch changes nothing; a view
//! that cannot apply a followed change is rebuilt; a taken-back decision leaves the view equal to
//! the store.

use super::*;
use crate::engine::{self, SimConfig};
use crate::predict::{PredictionConfig, PredictionSourceConfig};
use crate::workload::{Inventory, SyntheticSpec, TraceSpec, WorkloadConfig};
use domain::{Priority, RequestFacts, Resources, TenantId, VmId};
use placement::{PolicyConfig, Registry, TieBreak};
use traces::{ExtraColumns, VmRecord};

fn record(id: &str, cores: f64, start_s: f64, end_s: Option<f64>) -> VmRecord {
    VmRecord {
        vm_id: id.to_owned(),
        tenant_id: format!("t-{id}"),
        vm_type: "D".to_owned(),
        cores,
        memory_gib: 2.0 * cores,
        priority: Priority::Regular,
        start_s,
        end_s,
        extra: ExtraColumns::default(),
    }
}

/// `hosts` hosts of `cores` cores, PBFR with exact best fit, lowest-index ties, oracle.
fn hand_made(hosts: usize, cores: f64) -> SimConfig {
    SimConfig {
        workload: WorkloadConfig { trace: TraceSpec::Provided { name: "hand-made".to_owned() }, ..Default::default() },
        inventory: Inventory::Fixed { hosts, cores, memory_gib: 2.0 * cores, hosts_per_rack: 2 },
        policy: PolicyConfig { buckets: placement::rules::Buckets::Exact, ..PolicyConfig::preset("pbfr") },
        tie_break: TieBreak::LowestIndex,
        sample_interval_s: 10.0,
        ..SimConfig::default()
    }
}

fn synthetic(policy: &str) -> (Workload, SimConfig) {
    let config = SimConfig {
        workload: WorkloadConfig {
            trace: TraceSpec::Synthetic(SyntheticSpec {
                seed: 5,
                days: 0.5,
                warmup_days: 0.5,
                requests_per_hour: 120.0,
                ..SyntheticSpec::default()
            }),
            ..Default::default()
        },
        inventory: Inventory::Auto { cores: 48.0, memory_gib: 384.0, headroom: 0.2, hosts_per_rack: 10 },
        policy: PolicyConfig::preset(policy),
        prediction: PredictionConfig { source: PredictionSourceConfig::Oracle, ..Default::default() },
        sample_interval_s: 1800.0,
        record_placements: true,
        ..SimConfig::default()
    };
    (Workload::load(&config.workload).unwrap(), config)
}

/// `n` agents without conflict avoidance: the tests of conflicts themselves.
fn agents(n: usize, lag: Lag) -> AgentsConfig {
    AgentsConfig { agents: n, lag, record_placements: true, avoidance: None, ..AgentsConfig::default() }
}

fn host_of<'a>(result: &'a AgentsResult, vm: &str) -> Option<&'a str> {
    let placements = result.placements.as_ref().expect("placements recorded");
    placements.iter().find(|p| p.vm_id == vm).and_then(|p| p.host_id.as_deref())
}

#[test]
fn one_agent_places_exactly_as_the_single_allocator_run() {
    for policy in ["pbfr", "nilas", "lava"] {
        let (workload, config) = synthetic(policy);
        let single = engine::run(&workload, &config, &Registry::standard(), |_| {}).unwrap();
        // One agent sees its own commits at once: the lag changes nothing.
        for lag in [Lag::Commits(0), Lag::Commits(8), Lag::Seconds(60.0), Lag::Saturated] {
            let one = run_agents(&workload, &config, &agents(1, lag), &Registry::standard(), |_| {}).unwrap();
            assert_eq!(one.placements, single.placements, "{policy}, lag {lag}");
            assert_eq!(one.metrics.packing_density, single.metrics.packing_density, "{policy}");
            assert_eq!(one.metrics.empty_hosts_pct, single.metrics.empty_hosts_pct, "{policy}");
            let c = &one.counters;
            assert_eq!(
                (c.arrivals, c.placed, c.rejected),
                (single.counters.arrivals, single.counters.placed, single.counters.rejected)
            );
            assert_eq!((c.conflicts, c.retries, c.failed, c.followed_changes, c.views_out_of_step), (0, 0, 0, 0, 0));
            assert_eq!(c.exits, single.counters.exits);
        }
    }
}

#[test]
fn agents_with_fresh_views_never_conflict_and_stale_ones_do_but_stay_in_step() {
    let (workload, config) = synthetic("nilas");
    let fresh = run_agents(&workload, &config, &agents(4, Lag::Commits(0)), &Registry::standard(), |_| {}).unwrap();
    assert_eq!((fresh.counters.conflicts, fresh.counters.failed), (0, 0));
    assert!(fresh.counters.followed_changes > 0);
    for lag in [Lag::Saturated, Lag::Commits(16), Lag::Seconds(120.0)] {
        let stale = run_agents(&workload, &config, &agents(4, lag), &Registry::standard(), |_| {}).unwrap();
        let c = &stale.counters;
        assert!(c.conflicts > 0, "lag {lag}: {c:?}");
        assert_eq!(c.retries, c.conflicts, "decided again after every conflict");
        assert_eq!((c.failed, c.delay_s_sum), (0, 0.0), "at once, on an up-to-date view");
        // Every VM runs in the end (503s are sent again), and every view agrees with the store.
        assert_eq!(c.placed + c.rejected, c.arrivals, "lag {lag}: {c:?}");
        assert_eq!((c.views_out_of_step, c.dropped), (0, 0), "lag {lag}");
        assert_eq!(c.vms_at_end, fresh.counters.vms_at_end + c.placed - fresh.counters.placed);
    }
    // Protean's conflict avoidance draws among the top hosts once commits are refused: fewer
    // conflicts than without it; shares of the hosts (on by default, as in the service) fewer still.
    let conflicts = |avoidance| {
        let run = AgentsConfig { avoidance, ..agents(4, Lag::Saturated) };
        run_agents(&workload, &config, &run, &Registry::standard(), |_| {}).unwrap().counters.conflicts
    };
    let (none, random, shares) = (
        conflicts(None),
        conflicts(Some(Avoidance { share: false, ..Avoidance::default() })),
        conflicts(Some(Avoidance::default())),
    );
    assert!(shares < random && random < none, "shares {shares}, random draws {random}, none {none}");
    let dropping = AgentsConfig { on_failure: OnFailure::Drop, max_attempts: 1, ..agents(4, Lag::Commits(16)) };
    let c = run_agents(&workload, &config, &dropping, &Registry::standard(), |_| {}).unwrap().counters;
    assert!(c.dropped > 0 && c.dropped == c.failed && c.failed == c.conflicts, "{c:?}");
    assert_eq!(c.placed + c.rejected + c.dropped, c.arrivals);
}

/// Agent 0 fills most of h0; agent 1, which has not seen that yet, goes for h0 too and is refused,
/// then decides again once it has seen the commit, and takes h1.
#[test]
fn a_stale_agent_that_goes_for_a_full_host_conflicts_and_decides_again() {
    let config = hand_made(2, 4.0);
    let workload =
        Workload::from_records(vec![record("a", 3.0, 0.0, None), record("b", 2.0, 1.0, None)], &config.workload)
            .unwrap();
    for retry in [RetryMode::Immediate, RetryMode::AfterLag] {
        let stale = run_agents(
            &workload,
            &config,
            &AgentsConfig { retry, ..agents(2, Lag::Commits(1)) },
            &Registry::standard(),
            |_| {},
        )
        .unwrap();
        assert_eq!(host_of(&stale, "a"), Some("sim-h0"));
        assert_eq!(host_of(&stale, "b"), Some("sim-h1"), "{retry:?}");
        let c = &stale.counters;
        assert_eq!((c.placement_attempts, c.conflicts, c.retries, c.placed_after_conflict, c.failed), (3, 1, 1, 1, 0));
        assert!((c.conflict_rate_pct() - 100.0 / 3.0).abs() < 1e-9);
        // At once, b is placed at its arrival; after the lag, at the end of the window (1 s).
        assert_eq!(c.delay_s_sum, 0.0);
    }
    // With views up to date, b goes to h1 at once.
    let fresh = run_agents(&workload, &config, &agents(2, Lag::Commits(0)), &Registry::standard(), |_| {}).unwrap();
    assert_eq!(host_of(&fresh, "b"), Some("sim-h1"));
    assert_eq!(fresh.counters.conflicts, 0);
    // In seconds: the commit of a (at 0) is 1 s old when b is decided; a lag of 2 s misses it.
    let seconds = run_agents(&workload, &config, &agents(2, Lag::Seconds(2.0)), &Registry::standard(), |_| {}).unwrap();
    assert_eq!((seconds.counters.conflicts, host_of(&seconds, "b")), (1, Some("sim-h1")));
    let seen = run_agents(&workload, &config, &agents(2, Lag::Seconds(0.5)), &Registry::standard(), |_| {}).unwrap();
    assert_eq!(seen.counters.conflicts, 0);
}

/// One host of 4 cores: a (3 cores) until 5, b (2 cores) from 1, c (1 core) at 9.
#[test]
fn after_max_attempts_the_vm_fails_and_goes_to_the_next_agent() {
    let config = hand_made(1, 4.0);
    let records = vec![record("a", 3.0, 0.0, Some(5.0)), record("b", 2.0, 1.0, None), record("c", 1.0, 9.0, None)];
    let workload = Workload::from_records(records, &config.workload).unwrap();
    // b: agent 1 misses a's commit and is refused; with one attempt per agent that is a 503 at
    // once, and the request goes to agent 0, one commit later.
    let one_attempt = AgentsConfig { max_attempts: 1, retry: RetryMode::AfterLag, ..agents(2, Lag::Commits(1)) };
    let result = run_agents(&workload, &config, &one_attempt, &Registry::standard(), |_| {}).unwrap();
    let c = &result.counters;
    assert_eq!((c.conflicts, c.failed, c.retries), (1, 1, 1), "{c:?}");
    // Agent 0 decides b again once one more commit came (a's exit at 5): h0 has room then.
    assert_eq!(host_of(&result, "b"), Some("sim-h0"));
    assert_eq!((c.placed, c.rejected, c.views_out_of_step), (3, 0, 0));
    assert_eq!((c.placed_after_conflict, c.delay_s_sum, c.delay_s_max), (1, 4.0, 4.0));
    // Decided again at once by agent 0, on an up-to-date view: h0 is full then, b is rejected.
    let at_once = AgentsConfig { retry: RetryMode::Immediate, ..one_attempt.clone() };
    let result = run_agents(&workload, &config, &at_once, &Registry::standard(), |_| {}).unwrap();
    assert_eq!(host_of(&result, "b"), None);
    assert_eq!((result.counters.failed, result.counters.rejected, result.counters.placed), (1, 1, 2));
    let dropped = run_agents(
        &workload,
        &config,
        &AgentsConfig { on_failure: OnFailure::Drop, ..one_attempt },
        &Registry::standard(),
        |_| {},
    )
    .unwrap();
    assert_eq!(host_of(&dropped, "b"), None);
    assert_eq!((dropped.counters.dropped, dropped.counters.placed), (1, 2));
}

fn spec_of(config: &SimConfig, workload: &Workload) -> InventorySpec {
    config.inventory.size(workload).unwrap().spec
}

fn new_vm(id: &str, cores: f64) -> NewVm {
    NewVm {
        id: VmId(id.to_owned()),
        facts: RequestFacts {
            tenant_id: TenantId(format!("t-{id}")),
            vm_type: "D".to_owned(),
            demand: Resources::from_whole(cores, 2.0 * cores, 0.0).unwrap(),
            requested_at_s: None,
            details: Default::default(),
        },
        placed_at_s: 0.0,
        prediction: None,
    }
}

fn placed(id: &str, cores: f64, host: &str) -> LoggedChange {
    LoggedChange::Placed { vm: new_vm(id, cores), host: HostId(host.to_owned()) }
}

#[test]
fn the_store_refuses_a_batch_whole_and_never_over_commits() {
    let config = hand_made(2, 4.0);
    let workload = Workload::from_records(vec![record("a", 1.0, 0.0, None)], &config.workload).unwrap();
    let mut store = Store::new(&spec_of(&config, &workload)).unwrap();
    assert_eq!(store.commit(0, 0.0, vec![placed("x", 3.0, "sim-h0")]).unwrap(), Ok(()));
    // The second placement does not fit: the first of the batch is taken back with it.
    let refused = store.commit(1, 1.0, vec![placed("y", 1.0, "sim-h1"), placed("z", 2.0, "sim-h0")]).unwrap();
    assert!(refused.is_err(), "{refused:?}");
    // A VM id placed twice.
    assert!(store.commit(1, 1.0, vec![placed("x", 1.0, "sim-h1")]).unwrap().is_err());
    assert_eq!(store.head(), 1);
    assert_eq!(store.state().vm_count(), 1);
    for host in store.state().hosts() {
        assert!(host.used.fits_within(&host.capacity));
    }
    assert_eq!(store.state().hosts()[1].used, Resources::ZERO);
    // A release of a VM the store does not hold is an error, not a refusal.
    assert!(store.commit(0, 2.0, vec![LoggedChange::Released { vm: VmId("nope".to_owned()) }]).is_err());
}

#[test]
fn a_view_that_cannot_apply_a_followed_change_is_rebuilt_from_the_store() {
    let config = hand_made(1, 4.0);
    let workload = Workload::from_records(vec![record("a", 1.0, 0.0, None)], &config.workload).unwrap();
    let spec = spec_of(&config, &workload);
    let mut store = Store::new(&spec).unwrap();
    let mut a = Agent::new(&spec, agent_config(&config, 0), &Registry::standard()).unwrap();
    // Agent 1 places x and releases it; agent 0 has seen neither and places z where x was.
    store.commit(1, 0.0, vec![placed("x", 3.0, "sim-h0")]).unwrap().unwrap();
    store.commit(1, 1.0, vec![LoggedChange::Released { vm: VmId("x".to_owned()) }]).unwrap().unwrap();
    let mut z = workload.vms[0].request.clone();
    z.vm_id = VmId("z".to_owned());
    z.facts.demand = Resources::from_whole(3.0, 6.0, 0.0).unwrap();
    a.allocator.allocate(&AllocationRequest::Vm(z), 2.0).unwrap();
    let changes: Vec<Change> = a.allocator.take_changes().collect();
    let logged = changes.iter().map(|c| LoggedChange::of(c, &|_| None)).collect();
    store.commit(0, 2.0, logged).unwrap().unwrap();
    // x beside z does not fit in agent 0's view: rebuilt, and then it is the store's.
    let (followed, rebuilt) = a.catch_up(0, &store, &spec, 3.0, |_, _| true).unwrap();
    assert!(rebuilt && followed == 0);
    assert_eq!(a.cursor, store.head());
    assert!(in_step(a.allocator.state(), store.state()));
    assert!(a.allocator.state().vm(&VmId("z".to_owned())).is_some());
}

#[test]
fn a_refused_decision_taken_back_leaves_the_view_equal_to_the_store() {
    for policy in ["nilas", "lava"] {
        let (workload, mut config) = synthetic(policy);
        config.inventory = Inventory::Fixed { hosts: 3, cores: 48.0, memory_gib: 384.0, hosts_per_rack: 2 };
        config.tie_break = TieBreak::LowestIndex;
        let spec = spec_of(&config, &workload);
        let mut store = Store::new(&spec).unwrap();
        let mut fleet: Vec<Agent> =
            (0..2).map(|i| Agent::new(&spec, agent_config(&config, i), &Registry::standard()).unwrap()).collect();
        let mut refusals = 0;
        // Both agents decide every VM of the first hundred on stale views (they follow only what
        // is older than the last 3 commits): some decisions are refused, each is taken back.
        for (i, vm) in workload.vms.iter().take(100).enumerate() {
            let me = i % 2;
            let now = vm.arrival_s;
            let head = store.head();
            fleet[me].catch_up(me, &store, &spec, now, |seq, _| seq + 3 < head).unwrap();
            let mut request = vm.request.clone();
            request.prediction = None;
            fleet[me].allocator.allocate(&AllocationRequest::Vm(request), now).unwrap();
            if let Err(changes) = fleet[me].commit(me, &mut store, now).unwrap() {
                refusals += 1;
                fleet[me].undo(&changes, &store, &spec, now).unwrap();
                fleet[me].catch_up(me, &store, &spec, now, |_, _| true).unwrap();
                // Timers that fired on rows read back are the agent's to commit.
                fleet[me].commit(me, &mut store, now).unwrap().unwrap();
                assert!(in_step(fleet[me].allocator.state(), store.state()), "{policy}: VM {i}");
                if let Some(name) = fleet[me].allocator.host_state().map(|p| p.name()) {
                    for host in store.state().hosts() {
                        let LoggedChange::PolicyHostState { state, .. } = store.policy_state(&host.id, name) else {
                            unreachable!()
                        };
                        assert_eq!(fleet[me].allocator.policy_host_snapshot(&host.id), state, "{policy}: {}", host.id);
                    }
                }
            }
        }
        assert!(refusals > 0, "{policy}: no refusal to take back");
        for host in store.state().hosts() {
            assert!(host.used.fits_within(&host.capacity));
        }
    }
}

#[test]
fn lags_read_and_print_alike() {
    for (text, lag) in
        [("8", Lag::Commits(8)), ("0", Lag::Commits(0)), ("30s", Lag::Seconds(30.0)), ("n-1", Lag::Saturated)]
    {
        assert_eq!(text.parse::<Lag>().unwrap(), lag);
        assert_eq!(lag.to_string(), text);
        let json = serde_json::to_string(&lag).unwrap();
        assert_eq!(serde_json::from_str::<Lag>(&json).unwrap(), lag);
    }
    assert_eq!("N-1".parse::<Lag>().unwrap().resolved(8), Lag::Commits(7));
    for bad in ["", "-1", "x", "-3s", "1.5"] {
        assert!(bad.parse::<Lag>().is_err(), "{bad}");
    }
    assert!(AgentsConfig { agents: 0, ..AgentsConfig::default() }.validate().is_err());
    assert!(AgentsConfig { max_attempts: 0, ..AgentsConfig::default() }.validate().is_err());
    let no_top = Avoidance { top: 0, ..Avoidance::default() };
    assert!(AgentsConfig { avoidance: Some(no_top), ..AgentsConfig::default() }.validate().is_err());
}
