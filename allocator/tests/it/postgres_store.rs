//! The PostgreSQL store against a real, throwaway PostgreSQL server: it records what the SQLite
//! store records (the same workload leaves the same stored state in both, and a restart from either
//! rebuilds the same allocator), it refuses over-commits and second placements by itself, bad
//! settings are start-up errors that name the setting, and an outage is survived.

use allocator::durable::{
    job, Allocate, CommandError, CompleteMigration, DrainStatus, DurableAllocator, GetAllocation, GetHost, Release,
    SetHostState, StartDrain, Stats,
};
use allocator::store::postgres::SCHEMA_VERSION;
use allocator::store::{self, Committed, StoreError, StoreLocation, StoredState, REJECTION_STANDS_S};
use domain::{
    AllocationRequest, FeatureValue, HostId, HostState, InventorySpec, LifetimeClass, LifetimePrediction,
    PredictionSource, Priority, Rejection, RejectionCode, RequestDetails, RequestFacts, Resources, VmId, VmRequest,
};
use placement::allocator::AllocatorConfig;
use placement::defrag::{DrainHosts, DrainReport, DrainRequest, MigrationOrder};
use placement::journal::Change;
use placement::policy::PolicyConfig;
use placement::state::NewVm;
use placement::{Registry, TieBreak};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeSet;
use std::sync::Arc;
use test_support::postgres::Postgres;

fn spec() -> InventorySpec {
    InventorySpec::homogeneous("z", 8, 2, Resources::from_whole(16.0, 64.0, 0.0).unwrap())
}

/// LAVA with lowest-index ties: agents on a shared store draw random ties from a sequence of their
/// own, so only deterministic ties let a PostgreSQL run repeat an SQLite run decision by decision.
fn lava() -> AllocatorConfig {
    AllocatorConfig { policy: PolicyConfig::preset("lava"), tie_break: TieBreak::LowestIndex, ..Default::default() }
}

fn vm(id: &str, cores: f64, lifetime_s: f64) -> VmRequest {
    let mut request = VmRequest::new(id, "t", "D", Resources::from_whole(cores, cores * 2.0, 0.0).unwrap());
    request.prediction = Some(LifetimePrediction {
        p_long: if lifetime_s >= 7200.0 { 0.9 } else { 0.1 },
        class: if lifetime_s >= 7200.0 { LifetimeClass::Long } else { LifetimeClass::Short },
        interval_class: None,
        expected_lifetime_s: Some(lifetime_s),
        model_version: Some("m-1".to_owned()),
        source: PredictionSource::Model,
    });
    request
}

/// What the workload's request `vm-{step}` carried besides its demand: a request time on the trace's
/// clock (not the allocator's), and on every third one a low priority, an OS and features.
fn facts(step: u32) -> (Option<f64>, RequestDetails) {
    let requested_at_s = Some(1_600_000_000.0 + 0.5 * f64::from(step));
    if step % 3 != 0 {
        return (requested_at_s, RequestDetails::default());
    }
    let features = [
        ("batch_size".to_owned(), FeatureValue::Number(f64::from(step % 7))),
        ("region".to_owned(), FeatureValue::Text(format!("r{}", step % 2))),
    ];
    let mut details = RequestDetails::default();
    (details.priority, details.os, details.features) = (Priority::Low, Some("linux".to_owned()), features.into());
    (requested_at_s, details)
}

/// `request` with the facts of the workload's `step`.
fn with_facts(mut request: VmRequest, step: u32) -> VmRequest {
    (request.facts.requested_at_s, request.facts.details) = facts(step);
    request
}

/// Every stored VM of the workload carries what its request did.
fn assert_workload_facts(stored: &StoredState, location: &StoreLocation) {
    for vm in &stored.vms {
        let step: u32 = vm.vm.id.as_str().trim_start_matches("vm-").parse().unwrap();
        assert_eq!((vm.vm.facts.requested_at_s, vm.vm.facts.details.clone()), facts(step), "{location}: {}", vm.vm.id);
    }
}

/// A seeded mix of allocations, releases, host states, a drain and its migrations, run the same on
/// every store it is given.
fn workload(durable: &mut DurableAllocator) {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut placed: Vec<VmId> = Vec::new();
    let mut now = 1_000.0;
    for step in 0..400 {
        now += 10.0;
        // A drain's answer: confirm every migration in flight, as the operator's migration tool would.
        let drain = |durable: &mut DurableAllocator, report: Result<DrainReport, CommandError>| {
            for migration in report.map(|r| r.in_flight).unwrap_or_default() {
                let _ = durable.execute_one(CompleteMigration::of(migration.vm_id), now + 1.0);
            }
        };
        if step == 200 {
            let request = DrainRequest {
                hosts: DrainHosts::Pick(2),
                order: MigrationOrder::LongestRemainingFirst,
                max_in_flight: 2,
            };
            let report = durable.execute_one(StartDrain(request), now);
            drain(durable, report);
            continue;
        }
        match rng.random_range(0..10) {
            0..=5 => {
                let id = format!("vm-{step}");
                let lifetime = [600.0, 20_000.0, 500_000.0][rng.random_range(0..3)];
                let request = vm(&id, f64::from(rng.random_range(1..=4u8)), lifetime);
                let decision = durable.execute_one(Allocate(AllocationRequest::Vm(with_facts(request, step))), now);
                if decision.is_ok_and(|d| d.is_placed() && !d.replayed) {
                    placed.push(VmId(id));
                }
            }
            6..=7 if !placed.is_empty() => {
                let vm = placed.swap_remove(rng.random_range(0..placed.len()));
                let _ = durable.execute_one(Release::vm(vm), now);
            }
            8 if step % 50 == 8 => {
                let host = HostId(format!("z-h{}", rng.random_range(0..8)));
                let state = [HostState::Unavailable, HostState::Available][rng.random_range(0..2)];
                let _ = durable.execute_one(SetHostState { host, state }, now);
            }
            _ => {
                let report = durable.execute_one(DrainStatus, now);
                drain(durable, report);
            }
        }
    }
}

/// Every host's state, use, VMs (in any order) and incoming migrations.
type HostSummary = (HostId, HostState, Resources, BTreeSet<VmId>, BTreeSet<VmId>);

fn hosts(state: &placement::state::InventoryState) -> Vec<HostSummary> {
    state
        .hosts()
        .iter()
        .map(|h| {
            let ids = |vms: &[std::sync::Arc<NewVm>]| vms.iter().map(|vm| vm.id.clone()).collect();
            (h.id.clone(), h.state, h.used, ids(&h.vms), ids(&h.incoming))
        })
        .collect()
}

/// Every placed VM's record, by id.
fn records(state: &placement::state::InventoryState) -> std::collections::BTreeMap<VmId, NewVm> {
    state.hosts().iter().flat_map(|h| &h.vms).map(|vm| (vm.id.clone(), NewVm::clone(vm))).collect()
}

/// What a store holds, without the ordering details that may differ between backends, and of the
/// rejections that stand only their VM ids (the embedded store keeps each answer, the shared one
/// the id; their ages differ by the time between the runs).
fn canonical(mut stored: StoredState) -> StoredState {
    stored.host_states.sort_by(|a, b| a.0.cmp(&b.0));
    stored.policy_hosts.sort_by(|a, b| a.0.cmp(&b.0));
    stored.migrations.sort_by(|a, b| a.0.cmp(&b.0));
    for rejection in &mut stored.rejections {
        rejection.age_s = 0.0;
        rejection.rejection = None;
    }
    stored.rejections.sort_by(|a, b| a.vm.cmp(&b.vm));
    stored
}

#[test]
fn the_same_workload_leaves_the_same_state_as_the_sqlite_store_and_both_rebuild_alike() {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let sqlite = StoreLocation::Sqlite(dir.path().join("s.db"));
    let postgres = StoreLocation::from(pg.url.clone());
    let mut stats = Vec::new();
    let mut stored = Vec::new();
    for location in [&sqlite, &postgres] {
        let mut durable =
            DurableAllocator::open(&spec(), &lava(), &Registry::standard(), location.clone(), 1_000.0).unwrap();
        workload(&mut durable);
        let live_hosts = hosts(durable.allocator().unwrap().state());
        let live_vms = records(durable.allocator().unwrap().state());
        drop(durable);
        // A restart rebuilds what was acknowledged, each VM's record (its request's facts) included.
        let mut reopened =
            DurableAllocator::open(&spec(), &lava(), &Registry::standard(), location.clone(), 6_000.0).unwrap();
        assert!(
            hosts(reopened.allocator().unwrap().state()) == live_hosts,
            "{location}: the restart rebuilds the hosts"
        );
        assert!(records(reopened.allocator().unwrap().state()) == live_vms, "{location}: the restart rebuilds the VMs");
        let Ok(s) = reopened.execute_one(Stats, 6_000.0) else { panic!("no stats") };
        stats.push(serde_json::to_value(&s).unwrap());
        stored.push(canonical(store::open(location, &spec()).unwrap().load().unwrap()));
        assert_workload_facts(stored.last().unwrap(), location);
    }
    let with_features = stored[0].vms.iter().filter(|v| !v.vm.facts.details.features.is_empty()).count();
    assert!(with_features > 10 && with_features < stored[0].vms.len(), "a mix of requests: {with_features}");
    assert!(stored[0].vms.len() > 50, "the workload placed VMs: {}", stored[0].vms.len());
    assert!(!stored[0].policy_hosts.is_empty(), "LAVA state was recorded");
    assert!(stored[0].drain.is_some(), "a drain was recorded");
    assert_eq!(stored[1], stored[0], "PostgreSQL holds what SQLite holds");
    assert_eq!(stats[1], stats[0]);
    // And the same VMs that left: both export the same trace.
    let exports: Vec<Vec<traces::VmRecord>> = [&sqlite, &postgres]
        .into_iter()
        .map(|location| {
            let path = dir.path().join("export.csv");
            let mut sink = store::TraceExport::new(std::fs::File::create(&path).unwrap());
            store::export_trace(location, &store::ExportWindow::default(), &mut sink).unwrap();
            sink.finish().unwrap();
            traces::csv_format::CsvTraceReader::open(&path).unwrap().collect::<Result<_, _>>().unwrap()
        })
        .collect();
    let exited = exports[0].iter().filter(|r| r.end_s.is_some()).count();
    assert!(exited > 20, "the workload released VMs: {exited}");
    assert_eq!(exports[0].len(), exited + stored[0].vms.len());
    assert!(exports[1] == exports[0], "PostgreSQL exports what SQLite exports");
    // What each host uses, as the database keeps it, is the sum of its VMs' demands.
    let mismatched = pg.psql(
        "SELECT count(*) FROM hosts h WHERE h.cores_used <> COALESCE((SELECT sum(cores_base) FROM vms v
             WHERE v.host_id = h.host_id), 0) + COALESCE((SELECT sum(cores_base) FROM migrations m
             WHERE m.target_host_id = h.host_id), 0)",
    );
    assert_eq!(mismatched, "0");
}

fn new_vm(id: &str, cores: f64) -> Arc<NewVm> {
    Arc::new(NewVm {
        id: VmId::from(id),
        facts: RequestFacts::new("t", "D", Resources::from_whole(cores, 1.0, 0.0).unwrap()),
        placed_at_s: 1.0,
        prediction: None,
    })
}

/// `new_vm(id, cores)` with a request time and facts.
fn new_vm_with_facts(id: &str, cores: f64, at: f64) -> Arc<NewVm> {
    let (_, details) = facts(0);
    let mut vm = NewVm::clone(&new_vm(id, cores));
    (vm.facts.requested_at_s, vm.facts.details) = (Some(at), details);
    Arc::new(vm)
}

#[test]
fn request_facts_round_trip_through_both_write_paths_a_reload_and_another_agents_follow() {
    let pg = Postgres::start();
    let location = StoreLocation::from(pg.url.clone());
    let mut writer = store::open(&location, &spec()).unwrap();
    let mut follower = store::open(&location, &spec()).unwrap();
    follower.load().unwrap();
    let none = |_: &HostId| None;
    let host = |h: &str| HostId::from(h);
    let (a, b) = (new_vm_with_facts("a", 1.0, 1_600_000_001.5), new_vm("b", 1.0));
    let (c, d) = (new_vm_with_facts("c", 2.0, 1_600_000_002.5), new_vm("d", 1.0));
    // Placements only: the set-based write.
    let first =
        [Change::Placed { vm: a.clone(), host: host("z-h0") }, Change::Placed { vm: b.clone(), host: host("z-h1") }];
    // A VM placed and released in one batch: written change by change.
    let second = [
        Change::Placed { vm: c.clone(), host: host("z-h2") },
        Change::Placed { vm: d.clone(), host: host("z-h3") },
        Change::Released {
            vm: d.id.clone(),
            was: placement::PlacedVm { host: placement::HostIndex(3), record: d.clone() },
            ended_at_s: 5.0,
        },
    ];
    writer.apply(&first, &none).unwrap();
    writer.apply(&second, &none).unwrap();

    let stored: Vec<NewVm> =
        store::open(&location, &spec()).unwrap().load().unwrap().vms.into_iter().map(|v| v.vm).collect();
    assert_eq!(stored, [NewVm::clone(&a), NewVm::clone(&b), NewVm::clone(&c)]);
    assert_eq!(
        pg.psql("SELECT count(*) FROM vms WHERE request IS NULL AND requested_at_s IS NULL"),
        "1",
        "b's defaults cost nothing"
    );

    // The other agent follows both batches: the placed VMs carry the same facts.
    let store::Followed::Batches(batches) = follower.follow().unwrap() else { panic!("a gap") };
    let followed: Vec<NewVm> = batches
        .iter()
        .flatten()
        .filter_map(|change| match change {
            placement::journal::LoggedChange::Placed { vm, .. } => Some(vm.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(followed, [NewVm::clone(&a), NewVm::clone(&b), NewVm::clone(&c), NewVm::clone(&d)]);
}

#[test]
fn a_version_1_database_gains_the_request_columns_and_its_vms_have_no_request_facts() {
    let pg = Postgres::start();
    let location = StoreLocation::from(pg.url.clone());
    let none = |_: &HostId| None;
    store::open(&location, &spec())
        .unwrap()
        .apply(&[Change::Placed { vm: new_vm("old", 2.0), host: HostId::from("z-h0") }], &none)
        .unwrap();
    // Version 1 is version 2 without the request's columns.
    pg.psql(
        "ALTER TABLE vms DROP COLUMN requested_at_s; ALTER TABLE vms DROP COLUMN request; \
         UPDATE meta SET value = 1 WHERE key = 'schema_version'",
    );
    assert_eq!(
        pg.psql("SELECT count(*) FROM information_schema.columns WHERE table_name = 'vms' AND column_name = 'request'"),
        "0"
    );

    let mut durable = DurableAllocator::open(&spec(), &pbfr(), &Registry::standard(), location.clone(), 10.0).unwrap();
    assert_eq!(pg.psql("SELECT value FROM meta WHERE key = 'schema_version'"), SCHEMA_VERSION.to_string());
    let old = durable.allocator().unwrap().state().vm(&VmId::from("old")).unwrap().record.clone();
    assert_eq!((old.facts.requested_at_s, &old.facts.details), (None, &RequestDetails::default()));
    let request = with_facts(vm("new", 2.0, 600.0), 3);
    assert!(host_of(&durable.execute_one(Allocate(AllocationRequest::Vm(request)), 11.0)).is_some());
    drop(durable);
    let stored = store::open(&location, &spec()).unwrap().load().unwrap();
    let ids: Vec<_> = stored.vms.iter().map(|v| v.vm.id.as_str()).collect();
    assert_eq!(ids, ["old", "new"]);
    assert_eq!((stored.vms[1].vm.facts.requested_at_s, stored.vms[1].vm.facts.details.clone()), facts(3));
}

#[test]
fn a_version_2_database_gains_the_exits_table_and_releases_fill_it() {
    let pg = Postgres::start();
    let location = StoreLocation::from(pg.url.clone());
    let mut durable = DurableAllocator::open(&spec(), &pbfr(), &Registry::standard(), location.clone(), 10.0).unwrap();
    let request = with_facts(vm("kept", 2.0, 600.0), 3);
    assert!(host_of(&durable.execute_one(Allocate(AllocationRequest::Vm(request)), 11.0)).is_some());
    drop(durable);
    // Version 2 is version 3 without the exits table.
    pg.psql("DROP TABLE exits; UPDATE meta SET value = 2 WHERE key = 'schema_version'");

    let mut durable = DurableAllocator::open(&spec(), &pbfr(), &Registry::standard(), location.clone(), 20.0).unwrap();
    assert_eq!(pg.psql("SELECT value FROM meta WHERE key = 'schema_version'"), SCHEMA_VERSION.to_string());
    assert_eq!(durable.allocator().unwrap().stats().vms, 1);
    let release = Release { vm: VmId::from("kept"), owner: None, ended_at_s: Some(1_600_000_900.0) };
    durable.execute_one(release, 21.0).unwrap();
    let start = facts(3).0.unwrap();
    assert_eq!(
        pg.psql("SELECT vm_id || ' ' || start_s || ' ' || ended_at_s || ' ' || (request IS NOT NULL) FROM exits"),
        format!("kept {start} 1600000900 true")
    );
    assert_eq!(pg.psql("SELECT count(*) FROM vms"), "0");
}

#[test]
fn the_database_itself_refuses_an_over_commit_and_a_second_placement() {
    let pg = Postgres::start();
    let mut store = store::open(&StoreLocation::from(pg.url.clone()), &spec()).unwrap();
    let none = |_: &HostId| None;
    let host = HostId::from("z-h0");
    store.apply(&[Change::Placed { vm: new_vm("a", 10.0), host: host.clone() }], &none).unwrap();
    // 10 + 8 cores on a 16-core host, whatever the agent believed.
    let err = store
        .apply(
            &[
                Change::Placed { vm: new_vm("b", 2.0), host: HostId::from("z-h1") },
                Change::Placed { vm: new_vm("c", 8.0), host: host.clone() },
            ],
            &none,
        )
        .unwrap_err();
    assert!(matches!(err, StoreError::Refused { .. }), "{err}");
    assert!(err.to_string().contains("over-committed"), "{err}");
    let err = store.apply(&[Change::Placed { vm: new_vm("a", 1.0), host: HostId::from("z-h2") }], &none).unwrap_err();
    assert!(matches!(err, StoreError::Refused { .. }) && err.to_string().contains("placed already"), "{err}");
    // A host not in the store (an agent with another inventory), by either batch write.
    let nowhere = HostId::from("nowhere");
    let err = store.apply(&[Change::Placed { vm: new_vm("n", 1.0), host: nowhere.clone() }], &none).unwrap_err();
    assert!(matches!(err, StoreError::Refused { .. }) && err.to_string().contains("not in the store"), "{err}");
    let m = new_vm("m", 1.0);
    let was = placement::state::PlacedVm { host: placement::state::HostIndex(0), record: Arc::clone(&m) };
    let placed_and_released =
        [Change::Placed { vm: m, host: nowhere }, Change::Released { vm: VmId::from("m"), was, ended_at_s: 1.0 }];
    let err = store.apply(&placed_and_released, &none).unwrap_err();
    assert!(matches!(err, StoreError::Refused { .. }) && err.to_string().contains("not in the store"), "{err}");
    let stored = store.load().unwrap();
    assert_eq!(stored.vms.iter().map(|v| v.vm.id.as_str()).collect::<Vec<_>>(), ["a"], "refused batches left nothing");
    assert_eq!(pg.psql("SELECT cores_used FROM hosts WHERE host_id = 'z-h1'"), "0");
}

#[test]
fn bad_settings_are_start_up_errors_that_name_the_setting_and_the_fix() {
    let pg = Postgres::start();
    // Nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let unreachable = format!("postgres://alloc:hunter2@127.0.0.1:{port}/alloc");
    let err = DurableAllocator::open(&spec(), &lava(), &Registry::standard(), StoreLocation::from(unreachable), 0.0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("`store`") && err.contains(&port.to_string()), "{err}");
    assert!(!err.contains("hunter2"), "the password never shows: {err}");
    // A role that does not exist.
    let wrong_user = pg.url.replace("alloc@", "nobody@");
    let err = DurableAllocator::open(&spec(), &lava(), &Registry::standard(), StoreLocation::from(wrong_user), 0.0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("`store`") && err.contains("nobody"), "{err}");
    // A schema written by a newer release.
    DurableAllocator::open(&spec(), &lava(), &Registry::standard(), StoreLocation::from(pg.url.clone()), 0.0).unwrap();
    pg.psql(&format!("UPDATE meta SET value = {} WHERE key = 'schema_version'", SCHEMA_VERSION + 1));
    let err = DurableAllocator::open(&spec(), &lava(), &Registry::standard(), StoreLocation::from(pg.url.clone()), 0.0)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("schema version {} is newer", SCHEMA_VERSION + 1))
            && err.contains("point `store` at a database"),
        "{err}"
    );
}

#[test]
fn an_inventory_that_shrinks_a_host_below_its_vms_is_refused_naming_the_fix() {
    let pg = Postgres::start();
    let location = StoreLocation::from(pg.url.clone());
    let mut durable = DurableAllocator::open(&spec(), &lava(), &Registry::standard(), location.clone(), 0.0).unwrap();
    for i in 0..8 {
        durable.execute_one(Allocate(AllocationRequest::Vm(vm(&format!("v{i}"), 12.0, 600.0))), 1.0).unwrap();
    }
    drop(durable);
    let smaller = InventorySpec::homogeneous("z", 8, 2, Resources::from_whole(8.0, 64.0, 0.0).unwrap());
    let err = DurableAllocator::open(&smaller, &lava(), &Registry::standard(), location, 2.0).unwrap_err().to_string();
    assert!(err.contains("less capacity than its VMs"), "{err}");
}

#[test]
fn an_outage_answers_unavailable_writes_nothing_half_and_recovers_by_itself() {
    let mut pg = Postgres::start();
    let location = StoreLocation::from(pg.url.clone());
    let mut durable = DurableAllocator::open(&spec(), &lava(), &Registry::standard(), location.clone(), 0.0).unwrap();
    let allocate = |id: &str| Allocate(AllocationRequest::Vm(vm(id, 2.0, 600.0)));
    assert!(matches!(durable.execute_one(allocate("before"), 1.0), Ok(d) if d.is_placed()));
    pg.stop();
    let (first, during_1) = job(allocate("during-1"));
    let (second, during_2) = job(allocate("during-2"));
    durable.execute(vec![first, second], 2.0);
    for reply in [during_1.ready(), during_2.ready()] {
        assert!(
            matches!(reply, Err(CommandError::NotDurable(_) | CommandError::Unavailable(_))),
            "a write during the outage is refused: {reply:?}"
        );
    }
    assert!(matches!(durable.execute_one(allocate("still-down"), 3.0), Err(CommandError::Unavailable(_))));
    pg.restart();
    assert!(matches!(durable.execute_one(allocate("after"), 4.0), Ok(d) if d.is_placed()));
    let ids: Vec<_> =
        store::open(&location, &spec()).unwrap().load().unwrap().vms.into_iter().map(|v| v.vm.id.0).collect();
    assert_eq!(ids, ["before", "after"], "nothing of the refused writes was kept");
}

fn pbfr() -> AllocatorConfig {
    AllocatorConfig { policy: PolicyConfig::preset("pbfr"), ..Default::default() }
}

fn allocate(id: &str, cores: f64) -> Allocate {
    Allocate(AllocationRequest::Vm(vm(id, cores, 600.0)))
}

fn host_of(reply: &Result<domain::AllocationDecision, CommandError>) -> Option<HostId> {
    match reply {
        Ok(decision) => match &decision.outcome {
            domain::AllocationOutcome::Placed { placements } => Some(placements[0].host_id.clone()),
            domain::AllocationOutcome::Rejected { .. } => None,
        },
        _ => None,
    }
}

#[test]
fn two_agents_on_one_database_follow_each_other_and_retries_answer_alike() {
    let pg = Postgres::start();
    let location = StoreLocation::from(pg.url.clone());
    let mut a = DurableAllocator::open(&spec(), &pbfr(), &Registry::standard(), location.clone(), 0.0).unwrap();
    let mut b = DurableAllocator::open(&spec(), &pbfr(), &Registry::standard(), location.clone(), 0.0).unwrap();
    let x_request = Allocate(AllocationRequest::Vm(with_facts(vm("x", 4.0, 600.0), 3)));
    let x = host_of(&a.execute_one(x_request, 1.0)).expect("placed");
    // A placement may be decided on a view that lacks another agent's latest commit (the store's
    // commit checks it, CHECKED_AT_COMMIT): a read follows the store to its head first, so B
    // decides after following A. It sees x where A put it, and what x's request carried.
    assert!(b.execute_one(GetAllocation(VmId::from("x")), 1.5).is_ok(), "B reads x after following A");
    let y = host_of(&b.execute_one(allocate("y", 4.0), 2.0)).expect("placed");
    assert_eq!(
        b.allocator().unwrap().state().vm(&VmId::from("x")).map(|v| v.host),
        a.allocator().unwrap().state().host_index(&x)
    );
    let record = |agent: &DurableAllocator, id: &str| {
        agent.allocator().unwrap().state().vm(&VmId::from(id)).unwrap().record.clone()
    };
    assert_eq!(record(&b, "x"), record(&a, "x"));
    assert_eq!((record(&b, "x").facts.requested_at_s, record(&b, "x").facts.details.clone()), facts(3));
    // A follows B's placement.
    let Ok(seen) = a.execute_one(GetAllocation(VmId::from("y")), 2.5) else { panic!("A does not see y") };
    assert_eq!(seen.host_id, y);
    // A client's retry of x sent to B gets A's answer.
    let Ok(retry) = b.execute_one(allocate("x", 4.0), 3.0) else { panic!("retry refused") };
    assert!(retry.replayed);
    assert_eq!(host_of(&Ok(retry)), Some(x));
    // A release through B is seen by A.
    b.execute_one(Release::vm(VmId::from("x")), 4.0).unwrap();
    assert_eq!(a.execute_one(GetAllocation(VmId::from("x")), 5.0), Err(CommandError::UnknownVm(VmId::from("x"))));
    // Host states too.
    a.execute_one(SetHostState { host: HostId::from("z-h5"), state: HostState::Failed }, 6.0).unwrap();
    let Ok(host) = b.execute_one(GetHost(HostId::from("z-h5")), 7.0) else { panic!("no host") };
    assert_eq!(host.host.state, HostState::Failed);
}

#[test]
fn concurrent_agents_never_over_commit_and_lose_nothing_acknowledged() {
    let pg = Postgres::start();
    let location = StoreLocation::from(pg.url.clone());
    let threads: Vec<_> = (0..3)
        .map(|agent| {
            let location = location.clone();
            std::thread::spawn(move || {
                let mut durable =
                    DurableAllocator::open(&spec(), &pbfr(), &Registry::standard(), location, 0.0).unwrap();
                let mut rng = ChaCha8Rng::seed_from_u64(agent);
                let mut live: Vec<VmId> = Vec::new();
                let mut refused = 0;
                for step in 0..300 {
                    let now = 10.0 + step as f64;
                    if !live.is_empty() && rng.random_range(0..3) == 0 {
                        let id = live.swap_remove(rng.random_range(0..live.len()));
                        durable.execute_one(Release::vm(id), now).expect("a release of an own VM");
                    } else {
                        let id = format!("a{agent}-{step}");
                        match durable.execute_one(allocate(&id, f64::from(rng.random_range(1..=6u8))), now) {
                            Ok(d) if d.is_placed() => live.push(VmId(id)),
                            Ok(_) => {}
                            Err(_) => refused += 1,
                        }
                    }
                }
                (live, refused)
            })
        })
        .collect();
    let mut acknowledged = BTreeSet::new();
    for thread in threads {
        let (live, _refused) = thread.join().unwrap();
        acknowledged.extend(live);
    }
    let stored = store::open(&location, &spec()).unwrap().load().unwrap();
    let in_store: BTreeSet<VmId> = stored.vms.iter().map(|v| v.vm.id.clone()).collect();
    assert_eq!(in_store, acknowledged, "exactly the acknowledged, unreleased VMs are in the store");
    assert_eq!(
        pg.psql(
            "SELECT count(*) FROM hosts h WHERE h.cores_used > h.cores_cap OR h.cores_used <> COALESCE((SELECT \
             sum(cores_base) FROM vms v WHERE v.host_id = h.host_id), 0)"
        ),
        "0",
        "no host over-committed, and each host's use is its VMs' demand"
    );
    // A new agent, and every agent after following, sees that state.
    let mut late = DurableAllocator::open(&spec(), &pbfr(), &Registry::standard(), location, 0.0).unwrap();
    let Ok(stats) = late.execute_one(Stats, 400.0) else { panic!("no stats") };
    assert_eq!(stats.vms, acknowledged.len());
}

/// `id` answered "rejected" (nothing fits).
fn rejected(id: &str) -> (VmId, Rejection) {
    let rejection = Rejection {
        code: RejectionCode::NoFeasibleHost,
        detail: "nothing fits".to_owned(),
        vm_id: Some(VmId::from(id)),
        eliminated_by: Vec::new(),
    };
    (VmId::from(id), rejection)
}

#[test]
fn a_rejection_is_refused_when_the_vm_is_placed_and_refuses_a_placement_decided_alongside() {
    let pg = Postgres::start();
    let location = StoreLocation::from(pg.url.clone());
    let none = |_: &HostId| None;
    let mut one = store::open(&location, &spec()).unwrap();
    let mut two = store::open(&location, &spec()).unwrap();
    // `two` decided "rejected" for `x` on a view that lacks `one`'s placement of it: refused, to be
    // decided again after following (a replay of `one`'s placement).
    one.apply(&[Change::Placed { vm: new_vm("x", 2.0), host: HostId::from("z-h0") }], &none).unwrap();
    let err = two.apply_decisions(&[], &[rejected("x")], &none).unwrap_err();
    assert!(matches!(err, StoreError::Refused { .. }) && err.to_string().contains("placed by another agent"), "{err}");
    // `two` answers `y` rejected first: `one`'s placement of `y`, decided on a view without that
    // rejection, is refused and nothing of its batch is written.
    two.apply_decisions(&[], &[rejected("y")], &none).unwrap();
    // It stands for every agent that loads the store, by id.
    let standing = one.load().unwrap().rejections;
    assert_eq!(standing.len(), 1, "{standing:?}");
    assert_eq!(standing[0].vm, VmId::from("y"));
    assert!((0.0..REJECTION_STANDS_S).contains(&standing[0].age_s), "{standing:?}");
    let batch = [
        Change::Placed { vm: new_vm("z", 2.0), host: HostId::from("z-h1") },
        Change::Placed { vm: new_vm("y", 2.0), host: HostId::from("z-h1") },
    ];
    let err = one.apply_decisions(&batch, &[], &none).unwrap_err();
    assert!(matches!(&err, StoreError::RejectedElsewhere { vms, .. } if vms == &[VmId::from("y")]), "{err}");
    assert_eq!(pg.psql("SELECT string_agg(vm_id, ',') FROM vms"), "x");
    // After following, still within the time the rejection stands: refused again.
    assert!(matches!(one.follow(), Ok(store::Followed::Batches(_))));
    let err = one.apply_decisions(&batch, &[], &none).unwrap_err();
    assert!(matches!(err, StoreError::RejectedElsewhere { .. }), "{err}");
    // Once it no longer stands, a request for `y` is decided afresh.
    pg.psql("UPDATE rejections SET at = at - INTERVAL '1 hour'");
    one.apply_decisions(&batch, &[], &none).unwrap();
    assert_eq!(pg.psql("SELECT string_agg(vm_id, ',' ORDER BY vm_id) FROM vms"), "x,y,z");
}

#[test]
fn a_placement_that_lands_after_its_vm_was_placed_and_released_elsewhere_is_refused() {
    let pg = Postgres::start();
    let location = StoreLocation::from(pg.url.clone());
    let none = |_: &HostId| None;
    let mut held = store::open(&location, &spec()).unwrap();
    let mut other = store::open(&location, &spec()).unwrap();
    // `held` decided to place `x` on its view, and its commit waits on the network (a partition)
    // while the client gives up, retries on `other`, is answered placed there and releases `x`.
    let x = new_vm("x", 2.0);
    other.apply(&[Change::Placed { vm: x.clone(), host: HostId::from("z-h0") }], &none).unwrap();
    let was = placement::PlacedVm { host: placement::HostIndex(0), record: x.clone() };
    other.apply(&[Change::Released { vm: x.id.clone(), was, ended_at_s: 2.0 }], &none).unwrap();
    // The held commit lands: the primary key cannot refuse it (`x` left `vms`), the releases do,
    // and nothing of its batch is written.
    let late = [
        Change::Placed { vm: new_vm("w", 1.0), host: HostId::from("z-h1") },
        Change::Placed { vm: x.clone(), host: HostId::from("z-h1") },
    ];
    let err = held.apply(&late, &none).unwrap_err();
    assert!(
        matches!(err, StoreError::Refused { .. }) && err.to_string().contains("released by another agent"),
        "{err}"
    );
    assert_eq!(pg.psql("SELECT count(*) FROM vms"), "0");
    // On a view that followed the release, placing the id again is a new decision, not a stale one.
    assert!(matches!(held.follow(), Ok(store::Followed::Batches(_))));
    held.apply(&late, &none).unwrap();
    assert_eq!(pg.psql("SELECT string_agg(vm_id, ',' ORDER BY vm_id) FROM vms"), "w,x");
}

#[test]
fn the_first_answer_stands_across_agents_rejected_or_placed() {
    let pg = Postgres::start();
    let location = StoreLocation::from(pg.url.clone());
    let mut a = DurableAllocator::open(&spec(), &pbfr(), &Registry::standard(), location.clone(), 0.0).unwrap();
    let mut b = DurableAllocator::open(&spec(), &pbfr(), &Registry::standard(), location.clone(), 0.0).unwrap();
    // A fills every host.
    for i in 0..8 {
        assert!(host_of(&a.execute_one(allocate(&format!("full-{i}"), 16.0), 1.0)).is_some());
    }
    // B rejects `x`; A frees a host; the same request sent to A within the time the rejection
    // stands gets that rejection (a client's retry of it), not a placement.
    let first = b.execute_one(allocate("x", 8.0), 2.0).unwrap();
    assert!(!first.is_placed());
    a.execute_one(Release::vm(VmId::from("full-0")), 3.0).unwrap();
    let retry = a.execute_one(allocate("x", 8.0), 4.0).unwrap();
    let domain::AllocationOutcome::Rejected { rejection } = &retry.outcome else { panic!("placed: {retry:?}") };
    assert!(rejection.detail.contains("that first answer stands"), "{}", rejection.detail);
    assert_eq!(a.execute_one(GetAllocation(VmId::from("x")), 5.0), Err(CommandError::UnknownVm(VmId::from("x"))));
    // A placement answered first is what a retry on the other agent gets, replayed.
    let placed = host_of(&a.execute_one(allocate("y", 8.0), 6.0)).expect("room on the freed host");
    let replay = b.execute_one(allocate("y", 8.0), 7.0).unwrap();
    assert!(replay.replayed);
    assert_eq!(host_of(&Ok(replay)), Some(placed));
    // Once the rejection no longer stands, a request for `x` is decided afresh (by an agent that
    // starts now: those that answered or heard of it keep it for its time on their own clock).
    pg.psql("UPDATE rejections SET at = at - INTERVAL '1 hour'");
    a.execute_one(Release::vm(VmId::from("full-1")), 8.0).unwrap();
    let mut c = DurableAllocator::open(&spec(), &pbfr(), &Registry::standard(), location, 9.0).unwrap();
    assert!(host_of(&c.execute_one(allocate("x", 8.0), 9.0)).is_some());
}

/// A store of this release holding VM `old`, turned into an older version by `downgrade` (SQL),
/// then opened again by an agent of this release, which must upgrade it.
fn upgraded_from(pg: &Postgres, downgrade: &str) -> DurableAllocator {
    let location = StoreLocation::from(pg.url.clone());
    let mut durable = DurableAllocator::open(&spec(), &pbfr(), &Registry::standard(), location.clone(), 10.0).unwrap();
    assert!(host_of(&durable.execute_one(allocate("old", 2.0), 11.0)).is_some());
    drop(durable);
    pg.psql(downgrade);
    let durable = DurableAllocator::open(&spec(), &pbfr(), &Registry::standard(), location, 20.0).unwrap();
    assert_eq!(pg.psql("SELECT value FROM meta WHERE key = 'schema_version'"), SCHEMA_VERSION.to_string());
    durable
}

#[test]
fn a_version_4_database_gains_the_batch_functions() {
    let pg = Postgres::start();
    // Version 4 is version 5 without the functions that write a batch in one call.
    let mut durable = upgraded_from(
        &pg,
        "DROP FUNCTION allocator_commit_batch; DROP FUNCTION allocator_log_batch; \
         UPDATE meta SET value = 4 WHERE key = 'schema_version'",
    );
    // The batch locks its hosts instead of a foreign key checking each VM's.
    assert_eq!(pg.psql("SELECT count(*) FROM pg_constraint WHERE conname = 'vms_host_id_fkey'"), "0");
    assert!(host_of(&durable.execute_one(allocate("new", 2.0), 21.0)).is_some());
    durable.execute_one(Release::vm(VmId::from("old")), 22.0).unwrap();
    assert_eq!(pg.psql("SELECT string_agg(vm_id, ',') FROM vms"), "new");
    assert_eq!(pg.psql("SELECT sum(cores_used)::bigint FROM hosts"), "2000", "the host use of `new` alone");
}

#[test]
fn a_version_5_database_gains_the_releases_and_records_them() {
    let pg = Postgres::start();
    // Version 5 is version 6 without the releases, and with the log function of fewer arguments,
    // which version 6 replaces.
    let mut durable = upgraded_from(
        &pg,
        "DROP TABLE releases; UPDATE meta SET value = 5 WHERE key = 'schema_version'; \
         CREATE FUNCTION allocator_log_batch(text, text, bigint, double precision, bigint, text[], text[]) \
         RETURNS bigint LANGUAGE sql AS 'SELECT 0::bigint'",
    );
    durable.execute_one(Release::vm(VmId::from("old")), 21.0).unwrap();
    assert_eq!(pg.psql("SELECT string_agg(vm_id, ',') FROM releases"), "old");
    assert_eq!(pg.psql("SELECT count(*) FROM pg_proc WHERE proname = 'allocator_log_batch'"), "1");
}

#[test]
fn a_version_7_database_takes_its_positions_from_a_sequence_after_its_head() {
    let pg = Postgres::start();
    // Version 7 kept the change log's head in a row, and no host's last position.
    let mut durable = upgraded_from(
        &pg,
        "ALTER TABLE hosts DROP COLUMN last_seq; DROP SEQUENCE log_seq; \
         CREATE TABLE log_head (id INTEGER PRIMARY KEY CHECK (id = 1), seq BIGINT NOT NULL); \
         INSERT INTO log_head VALUES (1, 41); UPDATE meta SET value = 7 WHERE key = 'schema_version'",
    );
    assert_eq!(pg.psql("SELECT count(*) FROM pg_class WHERE relname = 'log_head'"), "0");
    assert!(host_of(&durable.execute_one(allocate("new", 2.0), 21.0)).is_some());
    assert_eq!(pg.psql("SELECT max(seq) FROM changes"), "42", "the next position after the old head");
    assert_eq!(pg.psql("SELECT max(last_seq) FROM hosts"), "42");
}

#[test]
fn a_version_8_database_loses_the_notification_inside_its_commits_and_keeps_its_positions() {
    let pg = Postgres::start();
    // Version 8 notified inside the commit; positions taken and rolled back may lie past the
    // log's last row, and the sequence must not go back over them.
    let mut durable =
        upgraded_from(&pg, "SELECT setval('log_seq', 50); UPDATE meta SET value = 8 WHERE key = 'schema_version'");
    assert!(host_of(&durable.execute_one(allocate("new", 2.0), 21.0)).is_some());
    assert_eq!(pg.psql("SELECT max(seq) FROM changes"), "51", "the next position after the sequence's");
    // Commits no longer notify from inside (the agent does, after the commit).
    assert_eq!(
        pg.psql("SELECT count(*) FROM pg_proc WHERE proname LIKE 'allocator_%' AND prosrc LIKE '%pg_notify%'"),
        "0"
    );
}

/// Polls `condition` for up to 20 s: notifications travel between processes.
fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !condition() {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn an_agent_hears_of_other_agents_commits_and_a_lost_notification_costs_only_a_follow() {
    let pg = Postgres::start();
    let location = StoreLocation::from(pg.url.clone());
    let none = |_: &HostId| None;
    let mut one = store::open(&location, &spec()).unwrap();
    let mut two = store::open(&location, &spec()).unwrap();
    let woken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = Arc::clone(&woken);
    two.set_waker(Arc::new(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }));
    // Listening, and followed since it started to (what committed before is in that follow).
    eventually("the second store listens", || two.follow().is_ok() && two.known_current());
    // Its own commits are no news to it.
    two.apply(&[Change::Placed { vm: new_vm("own", 1.0), host: HostId::from("z-h2") }], &none).unwrap();
    assert!(two.known_current());
    // Another agent's commit is: the store asks to be followed, and wakes its owner once.
    one.apply(&[Change::Placed { vm: new_vm("a", 2.0), host: HostId::from("z-h0") }], &none).unwrap();
    eventually("the second store hears of the first's commit", || !two.known_current());
    eventually("the owner is woken", || woken.load(std::sync::atomic::Ordering::SeqCst) > 0);
    let Ok(store::Followed::Batches(batches)) = two.follow() else { panic!("no batches") };
    assert_eq!(batches.len(), 1);
    assert!(two.known_current(), "followed up to the notified position");

    // The listening connection is cut: until it is back, the store cannot tell, and says so.
    pg.psql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'allocator-listener'");
    // Commits meanwhile may go unheard; the commit still tells which batches before it on its
    // hosts the view lacks.
    one.apply(&[Change::Placed { vm: new_vm("b", 2.0), host: HostId::from("z-h0") }], &none).unwrap();
    let committed = two.apply(&[Change::Placed { vm: new_vm("c", 2.0), host: HostId::from("z-h0") }], &none).unwrap();
    assert_eq!(committed, Committed::AfterOthers, "a batch committed after one on its host it had not followed");
    // Back and listening, the store knows what it has not followed.
    eventually("the listener is back and says the store is behind", || !two.known_current());
    let Ok(store::Followed::Batches(batches)) = two.follow() else { panic!("no batches") };
    assert_eq!(batches.len(), 2, "the other agent's batch and its own, in the log's order");
    // Listening again, and followed since (commits while it was away were in that follow).
    eventually("listening again", || two.follow().is_ok() && two.known_current());
}

/// Schema 9: another agent's batch comes with its notification, and is followed from it without
/// reading the log, as the log would give it; a batch too large for a notification, and any commit
/// while the listener was away, are read from the log.
#[test]
fn an_agent_follows_other_agents_batches_from_their_notifications() {
    let pg = Postgres::start();
    let location = StoreLocation::from(pg.url.clone());
    let none = |_: &HostId| None;
    let mut one = store::open(&location, &spec()).unwrap();
    let mut two = store::open(&location, &spec()).unwrap();
    let mut reader = store::open(&location, &spec()).unwrap();
    eventually("the second store listens", || two.follow().is_ok() && two.known_current());
    reader.follow().unwrap();
    let placed = |id: &str, host: &str| Change::Placed { vm: new_vm(id, 1.0), host: HostId::from(host) };
    one.apply(&[placed("a", "z-h0"), placed("b", "z-h1")], &none).unwrap();
    eventually("the second store hears of the batch", || !two.known_current());
    let Ok(Some(store::Followed::Batches(notified))) = two.follow_notified() else {
        panic!("not from the notification")
    };
    let Ok(store::Followed::Batches(logged)) = reader.follow() else { panic!("no batches") };
    assert_eq!(notified, logged, "the notified batch is the logged one");
    assert_eq!(notified.len(), 1);
    assert!(two.known_current(), "the view holds the notified position");
    assert!(matches!(two.follow(), Ok(store::Followed::Batches(b)) if b.is_empty()), "followed once");

    // Too large to notify: 100 placements in the log's JSON.
    let many: Vec<Change> = (0..100)
        .map(|i| Change::Placed {
            vm: new_vm(&format!("big-{i:03}"), 0.5),
            host: HostId::from(format!("z-h{}", i % 8)),
        })
        .collect();
    one.apply(&many, &none).unwrap();
    eventually("the second store hears of the large batch", || !two.known_current());
    assert!(matches!(two.follow_notified(), Ok(None)), "a batch not carried is read from the log");
    let Ok(store::Followed::Batches(batches)) = two.follow() else { panic!("no batches") };
    assert_eq!(batches.iter().map(Vec::len).collect::<Vec<_>>(), vec![100]);

    // The listener cut: what committed meanwhile was never notified, so only the log will do.
    pg.psql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'allocator-listener'");
    one.apply(&[placed("c", "z-h0")], &none).unwrap();
    eventually("the listener is back", || !two.known_current());
    one.apply(&[placed("d", "z-h0")], &none).unwrap();
    eventually("the notification of d arrives", || {
        matches!(two.follow_notified(), Ok(None))
            && pg.psql("SELECT count(*) FROM changes WHERE body LIKE '%\"d\"%'") == "1"
    });
    let Ok(store::Followed::Batches(batches)) = two.follow() else { panic!("no batches") };
    assert_eq!(batches.len(), 2, "c (never notified) and d, from the log");
}

/// Schema 8: two agents whose batches touch different hosts neither wait for each other nor take
/// their batches back: each commit is in order on its own view, and each agent follows the other's
/// batch once.
#[test]
fn agents_committing_on_different_hosts_keep_their_batches_and_follow_each_other_once() {
    let pg = Postgres::start();
    let location = StoreLocation::from(pg.url.clone());
    let none = |_: &HostId| None;
    let mut one = store::open(&location, &spec()).unwrap();
    let mut two = store::open(&location, &spec()).unwrap();
    for round in 0..3 {
        let a =
            one.apply(&[Change::Placed { vm: new_vm(&format!("a{round}"), 1.0), host: HostId::from("z-h0") }], &none);
        let b =
            two.apply(&[Change::Placed { vm: new_vm(&format!("b{round}"), 1.0), host: HostId::from("z-h1") }], &none);
        assert_eq!((a.unwrap(), b.unwrap()), (Committed::InOrder, Committed::InOrder), "round {round}");
    }
    let followed = |store: &mut Box<dyn store::PlacementStore>| match store.follow() {
        Ok(store::Followed::Batches(batches)) => batches.len(),
        _ => panic!("no batches"),
    };
    assert_eq!((followed(&mut one), followed(&mut two)), (3, 3), "the other's three batches, once each");
    assert_eq!((followed(&mut one), followed(&mut two)), (0, 0));
}

#[test]
fn a_release_on_a_view_that_lacks_the_placement_is_not_answered_unknown() {
    let pg = Postgres::start();
    let location = StoreLocation::from(pg.url.clone());
    let mut a = DurableAllocator::open(&spec(), &pbfr(), &Registry::standard(), location.clone(), 0.0).unwrap();
    let mut b = DurableAllocator::open(&spec(), &pbfr(), &Registry::standard(), location.clone(), 0.0).unwrap();
    // A client places through A and releases through B at once, many times: B's view may not
    // have heard of the placement yet, and must then follow rather than answer 404.
    for i in 0..40 {
        let id = format!("v{i}");
        assert!(host_of(&a.execute_one(allocate(&id, 1.0), f64::from(i))).is_some());
        let released = b.execute_one(Release::vm(VmId::from(id.as_str())), f64::from(i) + 0.5);
        assert!(released.is_ok(), "{id}: {released:?}");
    }
    assert_eq!(pg.psql("SELECT count(*) FROM vms"), "0");
}

#[test]
fn a_version_9_database_gains_the_inventory_of_hosts_changed_at_run_time() {
    let pg = Postgres::start();
    let sql =
        "DROP TABLE inventory; DROP SEQUENCE inventory_seq; UPDATE meta SET value = 9 WHERE key = 'schema_version'";
    let mut durable = upgraded_from(&pg, sql);
    let update = domain::HostUpdate {
        capacity: Resources::from_whole(4.0, 8.0, 0.0).unwrap(),
        ..serde_json::from_str(r#"{"capacity": {"cores": 1, "memory_gib": 1}}"#).unwrap()
    };
    durable.execute_one(allocator::durable::UpdateHost { host: HostId::from("new-host"), update }, 21.0).unwrap();
    assert_eq!(pg.psql("SELECT host_id FROM inventory"), "new-host");
}
