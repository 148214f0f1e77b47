//! The embedded store's unit tests.

use super::*;
use domain::{
    FeatureValue, HostState, LifetimeClass, LifetimePrediction, PredictionSource, Priority, RequestFacts, Resources,
};
use placement::state::NewVm;
use std::sync::Arc;

/// Every host in its initial policy state.
fn initial(_: &HostId) -> Option<String> {
    None
}

fn vm(id: &str, cores: f64) -> NewVm {
    NewVm {
        id: VmId::from(id),
        facts: RequestFacts::new("t", "D2", Resources::from_whole(cores, 3.3, 0.0).unwrap()),
        placed_at_s: 12.5,
        prediction: Some(LifetimePrediction {
            p_long: 0.75,
            class: LifetimeClass::Long,
            interval_class: Some(3),
            expected_lifetime_s: Some(9000.0),
            model_version: Some("m-1".to_owned()),
            source: PredictionSource::Model,
        }),
    }
}

/// `vm(id, cores)` as a request of a trace replay left it: its own time, a low priority, an OS
/// and features.
fn vm_with_facts(id: &str, cores: f64) -> NewVm {
    let mut vm = vm(id, cores);
    vm.facts.requested_at_s = Some(1_600_000_123.25);
    let details = &mut vm.facts.details;
    details.priority = Priority::Low;
    details.os = Some("linux".to_owned());
    details.features = [
        ("batch_size".to_owned(), FeatureValue::Number(3.0)),
        ("region".to_owned(), FeatureValue::Text("eu-west".to_owned())),
    ]
    .into();
    vm
}

/// The release of `id` (the stores read its id only).
fn released(id: &str) -> Change {
    Change::Released {
        vm: VmId::from(id),
        was: placement::PlacedVm { host: placement::HostIndex(0), record: Arc::new(vm(id, 1.0)) },
        ended_at_s: 20.0,
    }
}

#[test]
fn batches_round_trip_in_placement_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    let mut store = SqliteStore::open(&path).unwrap();
    let (a, b, c) = (vm_with_facts("a", 1.5), vm("b", 2.0), NewVm { prediction: None, ..vm("c", 0.001) });
    store
        .apply(
            &[
                Change::Placed { vm: Arc::new(c.clone()), host: HostId::from("h1") },
                Change::Placed { vm: Arc::new(a.clone()), host: HostId::from("h0") },
                Change::HostState {
                    host: HostId::from("h1"),
                    state: HostState::Unavailable,
                    previous: HostState::Available,
                },
            ],
            &initial,
        )
        .unwrap();
    store
        .apply(
            &[
                released("c"),
                Change::Placed { vm: Arc::new(b.clone()), host: HostId::from("h1") },
                Change::HostState {
                    host: HostId::from("h1"),
                    state: HostState::Failed,
                    previous: HostState::Unavailable,
                },
            ],
            &initial,
        )
        .unwrap();
    drop(store);
    let loaded = SqliteStore::open(&path).unwrap().load().unwrap();
    let ids: Vec<_> = loaded.vms.iter().map(|v| v.vm.id.as_str().to_owned()).collect();
    assert_eq!(ids, ["a", "b"]);
    assert_eq!(loaded.vms[0].vm, a);
    assert_eq!(loaded.vms[1].vm, b);
    assert_eq!(loaded.vms[1].host, HostId::from("h1"));
    assert!(loaded.vms[0].seq < loaded.vms[1].seq);
    assert_eq!(loaded.host_states, [(HostId::from("h1"), HostState::Failed)]);
    // A request with nothing but defaults costs no byte.
    let conn = Connection::open(&path).unwrap();
    let columns = |id: &str| -> (Option<f64>, Option<String>) {
        conn.query_row("SELECT requested_at_s, request FROM vms WHERE vm_id = ?1", [id], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
    };
    assert_eq!(columns("b"), (None, None));
    assert_eq!(columns("a").0, Some(1_600_000_123.25));
}

#[test]
fn unreadable_request_facts_are_refused_naming_the_vm() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.db");
    let mut store = SqliteStore::open(&path).unwrap();
    store.apply(&[Change::Placed { vm: Arc::new(vm("a", 1.0)), host: HostId::from("h0") }], &initial).unwrap();
    store.conn.execute("UPDATE vms SET request = '{\"priority\": \"urgent\"}' WHERE vm_id = 'a'", []).unwrap();
    let err = store.load().unwrap_err();
    assert!(matches!(err, StoreError::CorruptVm { ref vm, .. } if vm == "a"), "{err}");
    assert!(err.to_string().contains("request facts"), "{err}");
}

#[test]
fn policy_host_states_round_trip_and_initial_states_are_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let mut store = SqliteStore::open(&path).unwrap();
    let changed = |host: &str| Change::PolicyHostState { host: HostId::from(host), policy: "lava" };
    let snapshots = |host: &HostId| match host.as_str() {
        "h0" => Some(r#"{"state":"recycling"}"#.to_owned()),
        "h1" => Some(r#"{"state":"open"}"#.to_owned()),
        _ => None,
    };
    store.apply(&[changed("h0"), changed("h1")], &snapshots).unwrap();
    // h1 is back in its initial state: its row goes.
    store.apply(&[changed("h1")], &initial).unwrap();
    drop(store);
    let loaded = SqliteStore::open(&path).unwrap().load().unwrap();
    assert_eq!(loaded.policy_hosts, [(HostId::from("h0"), "lava".to_owned(), r#"{"state":"recycling"}"#.to_owned())]);
}

#[test]
fn a_store_of_a_newer_version_is_refused_naming_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v10.db");
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
         INSERT INTO meta (key, value) VALUES ('schema_version', 10), ('next_seq', 1);",
    )
    .unwrap();
    drop(conn);
    let err = SqliteStore::open(&path).unwrap_err().to_string();
    assert!(err.contains("schema version 10 is newer") && err.contains("move the file away"), "{err}");
}

#[test]
fn a_version_1_store_is_upgraded_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v1.db");
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
         INSERT INTO meta (key, value) VALUES ('schema_version', 1), ('next_seq', 1);
         CREATE TABLE vms (vm_id TEXT PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, host_id TEXT NOT NULL,
             tenant_id TEXT NOT NULL, vm_type TEXT NOT NULL, cores_base INTEGER NOT NULL,
             memory_base INTEGER NOT NULL, ssd_base INTEGER NOT NULL, placed_at_s REAL NOT NULL, prediction TEXT);
         CREATE TABLE host_states (host_id TEXT PRIMARY KEY, state TEXT NOT NULL);",
    )
    .unwrap();
    drop(conn);
    let mut store = SqliteStore::open(&path).unwrap();
    let a = vm_with_facts("a", 1.0);
    store.apply(&[Change::Placed { vm: Arc::new(a.clone()), host: HostId::from("h0") }], &initial).unwrap();
    let loaded = store.load().unwrap();
    assert_eq!(loaded.vms.len(), 1);
    assert_eq!(loaded.vms[0].vm, a, "the request's columns were added");
    assert!(loaded.policy_hosts.is_empty());
}

#[test]
fn a_failed_batch_writes_nothing_and_sequences_never_go_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b.db");
    let mut store = SqliteStore::open(&path).unwrap();
    store.apply(&[Change::Placed { vm: Arc::new(vm("a", 1.0)), host: HostId::from("h0") }], &initial).unwrap();
    // The second placement of `a` breaks the primary key: the whole batch is rolled back.
    let err = store
        .apply(
            &[
                Change::Placed { vm: Arc::new(vm("b", 1.0)), host: HostId::from("h0") },
                Change::Placed { vm: Arc::new(vm("a", 1.0)), host: HostId::from("h0") },
            ],
            &initial,
        )
        .unwrap_err();
    assert!(err.to_string().contains("b.db"), "{err}");
    assert_eq!(store.load().unwrap().vms.len(), 1);
    store.apply(&[released("a")], &initial).unwrap();
    drop(store);
    let mut store = SqliteStore::open(&path).unwrap();
    store.apply(&[Change::Placed { vm: Arc::new(vm("d", 1.0)), host: HostId::from("h0") }], &initial).unwrap();
    assert_eq!(store.load().unwrap().vms[0].seq, 2, "the released VM's sequence number is not reused");
}

#[test]
fn open_errors_name_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing-dir").join("x.db");
    let err = SqliteStore::open(&path).unwrap_err();
    assert!(err.to_string().contains("missing-dir"), "{err}");
}

#[test]
fn rejections_stand_for_their_time_with_their_answer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let mut store = SqliteStore::open(&path).unwrap();
    let rejection = domain::Rejection {
        code: domain::RejectionCode::GangDoesNotFit,
        detail: "the gang does not fit".to_owned(),
        vm_id: Some(VmId::from("g1")),
        eliminated_by: Vec::new(),
    };
    let rejected = [(VmId::from("g0"), rejection.clone()), (VmId::from("g1"), rejection.clone())];
    store.apply_decisions(&[], &rejected, &initial).unwrap();
    // An old one no longer stands; the others come back with their answer, after a reopen too.
    store.conn.execute("UPDATE rejections SET at_s = at_s - 31 WHERE vm_id = 'g0'", []).unwrap();
    drop(store);
    let standing = SqliteStore::open(&path).unwrap().load().unwrap().rejections;
    assert_eq!(standing.len(), 1, "{standing:?}");
    assert_eq!((&standing[0].vm, &standing[0].rejection), (&VmId::from("g1"), &Some(rejection)));
    assert!((0.0..1.0).contains(&standing[0].age_s), "{standing:?}");
}
