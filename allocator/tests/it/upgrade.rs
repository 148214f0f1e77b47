//! Stores written by earlier releases open under this release, are upgraded in place, and recover
//! to what those releases held.
//!
//! Schema version 3 (LAVA's state in a table of its own, a drain with a migration in flight, a
//! failed host): the fixture (`fixtures/store-v3.sql`) is that release's own store, dumped after
//! driving its `allocator` binary over HTTP; `fixtures/store-v3-answers.json` holds that binary's
//! answers (`GET /v1/hosts/{id}` of every host and `GET /v1/drains`) at the end of the run.
//!
//! Schema version 4 (no request time or request facts per VM): `fixtures/store-v4.sql`, written by
//! that release's `DurableAllocator` and dumped; its VMs come back with none of either.

use allocator::durable::{Allocate, CompleteMigration, DrainStatus, DurableAllocator, GetHost, Release, Stats};
use allocator::store::sqlite::SCHEMA_VERSION;
use allocator::store::SqliteStore;
use domain::{
    AllocationRequest, FeatureValue, HostId, HostState, InventorySpec, Priority, RequestDetails, Resources, VmId,
    VmRequest,
};
use placement::{AllocatorConfig, PolicyConfig, Registry, TieBreak};
use serde_json::Value;
use std::path::Path;

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// The inventory and policy the fixture was written with (`[generate]` 6 hosts of 16 cores and
/// 64 GiB, two to a rack; LAVA; lowest-index ties).
fn setup() -> (InventorySpec, AllocatorConfig) {
    let spec = InventorySpec::homogeneous("z", 6, 2, Resources::from_whole(16.0, 64.0, 0.0).unwrap());
    let config = AllocatorConfig {
        policy: PolicyConfig::preset("lava"),
        tie_break: TieBreak::LowestIndex,
        ..Default::default()
    };
    (spec, config)
}

fn schema(path: &Path) -> (i64, Vec<String>) {
    let conn = rusqlite::Connection::open(path).unwrap();
    let version = conn.query_row("SELECT value FROM meta WHERE key = 'schema_version'", [], |r| r.get(0)).unwrap();
    let mut statement = conn.prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name").unwrap();
    let tables = statement.query_map([], |r| r.get(0)).unwrap().collect::<Result<_, _>>().unwrap();
    (version, tables)
}

#[test]
fn a_version_3_store_of_the_previous_release_opens_upgraded_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("allocator.db");
    let dump = std::fs::read_to_string(fixture("store-v3.sql")).unwrap();
    rusqlite::Connection::open(&path).unwrap().execute_batch(&dump).unwrap();
    assert_eq!(schema(&path).0, 3);
    let answers: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("store-v3-answers.json")).unwrap()).unwrap();

    // The instant the previous release stopped: no LAVA deadline has passed yet.
    let stopped_at = 1_795_461_664.0;
    let (spec, config) = setup();
    let mut durable = DurableAllocator::open(&spec, &config, &Registry::standard(), &path, stopped_at).unwrap();

    let (version, tables) = schema(&path);
    assert_eq!(version, SCHEMA_VERSION);
    assert!(tables.contains(&"policy_hosts".to_owned()) && !tables.contains(&"lava_hosts".to_owned()), "{tables:?}");
    assert!(tables.contains(&"exits".to_owned()), "{tables:?}");
    assert!(tables.contains(&"consolidation".to_owned()), "version 7's table: {tables:?}");
    assert!(tables.contains(&"rejections".to_owned()), "version 8's table: {tables:?}");
    assert!(tables.contains(&"inventory".to_owned()), "version 9's table: {tables:?}");

    for before in answers["hosts"].as_array().unwrap() {
        let id = before["host_id"].as_str().unwrap();
        let Ok(now) = durable.execute_one(GetHost(HostId::from(id)), stopped_at) else {
            panic!("host {id} is in the inventory")
        };
        let now = serde_json::to_value(&now).unwrap();
        for field in ["state", "used", "vm_count"] {
            assert_eq!(now[field], before[field], "host {id}: {field}");
        }
        let vm_ids = |host: &Value| -> Vec<Value> {
            host["vms"].as_array().unwrap().iter().map(|vm| vm["vm_id"].clone()).collect()
        };
        assert_eq!(vm_ids(&now), vm_ids(before), "host {id}: its VMs in placement order");
        // Version 3's LAVA columns are the same state in the opaque policy row.
        let expected = match &before["lava"] {
            Value::Object(lava) if lava["state"] != "empty" => before["lava"].clone(),
            _ => Value::Null,
        };
        assert_eq!(now["policy_state"]["state"], expected, "host {id}: LAVA state");
        if !expected.is_null() {
            assert_eq!(now["policy_state"]["policy"], "lava");
        }
    }
    let Ok(drain) = durable.execute_one(DrainStatus, stopped_at) else { panic!("the drain in flight is recovered") };
    // The report gained `failed` since (issue 59: migrations the cloud reported failed), 0 here.
    let mut expected_drain = answers["drain"].clone();
    expected_drain["failed"] = 0.into();
    assert_eq!(serde_json::to_value(&drain).unwrap(), expected_drain);

    // A migration and a release go on as before, and the upgraded store opens again as it is.
    durable.execute_one(CompleteMigration::of("vm-1".into()), stopped_at + 1.0).unwrap();
    durable.execute_one(Release::vm("vm-3".into()), stopped_at + 2.0).unwrap();
    let Ok(stats) = durable.execute_one(Stats, stopped_at + 2.0) else { panic!("stats") };
    // The release is kept as an exit; a VM of version 3 has no request time, so it started and
    // ended on the allocator's clock.
    let exit: (String, f64, f64) = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("SELECT vm_id, start_s, ended_at_s FROM exits", [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap();
    assert_eq!(exit.0, "vm-3");
    assert!(exit.1 < stopped_at && exit.2 == stopped_at + 2.0, "{exit:?}");
    drop(durable);
    let reopened = DurableAllocator::open(&spec, &config, &Registry::standard(), &path, stopped_at + 2.0).unwrap();
    let again = reopened.allocator().unwrap().stats();
    assert_eq!(
        (again.vms, again.allocated_cores, again.host_states),
        (stats.vms, stats.allocated_cores, stats.host_states)
    );
    assert_eq!(schema(&path).0, SCHEMA_VERSION);
}

fn vm_columns(path: &Path) -> Vec<String> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut statement = conn.prepare("SELECT name FROM pragma_table_info('vms')").unwrap();
    let columns = statement.query_map([], |r| r.get(0)).unwrap().collect::<Result<_, _>>().unwrap();
    columns
}

#[test]
fn a_version_4_store_gains_the_request_columns_and_its_vms_have_no_request_facts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("allocator.db");
    let dump = std::fs::read_to_string(fixture("store-v4.sql")).unwrap();
    rusqlite::Connection::open(&path).unwrap().execute_batch(&dump).unwrap();
    assert_eq!(schema(&path).0, 4);
    assert!(!vm_columns(&path).contains(&"request".to_owned()));

    // The fixture's inventory and policy: 4 hosts of 16 cores and 64 GiB, two to a rack; PBFR.
    let spec = InventorySpec::homogeneous("z", 4, 2, Resources::from_whole(16.0, 64.0, 0.0).unwrap());
    let config = AllocatorConfig::default();
    let now = 1_800_000_010.0;
    let mut durable = DurableAllocator::open(&spec, &config, &Registry::standard(), &path, now).unwrap();
    assert_eq!(schema(&path).0, SCHEMA_VERSION);
    let columns = vm_columns(&path);
    assert!(columns.contains(&"requested_at_s".to_owned()) && columns.contains(&"request".to_owned()), "{columns:?}");

    // Every VM is where it was, with no request time and default facts.
    let stored = SqliteStore::open(&path).unwrap().load().unwrap();
    let placed: Vec<(&str, &str)> = stored.vms.iter().map(|v| (v.vm.id.as_str(), v.host.as_str())).collect();
    assert_eq!(placed, [("vm-0", "z-h2"), ("vm-1", "z-h2"), ("vm-2", "z-h2"), ("vm-3", "z-h2"), ("vm-5", "z-h1")]);
    for vm in &stored.vms {
        assert_eq!(
            (vm.vm.facts.requested_at_s, &vm.vm.facts.details),
            (None, &RequestDetails::default()),
            "{}",
            vm.vm.id
        );
    }
    assert_eq!(stored.vms[2].vm.prediction, None);
    assert!(stored.vms[0].vm.prediction.is_some());
    assert_eq!(stored.host_states, [(HostId::from("z-h3"), HostState::Unavailable)]);
    let Ok(stats) = durable.execute_one(Stats, now) else { panic!("stats") };
    assert_eq!((stats.vms, stats.allocated_cores), (5, 20.0));

    // A placement under this release keeps its request's facts, next to the upgraded rows.
    let mut request = VmRequest::new("vm-6", "tenant-a", "D4", Resources::from_whole(4.0, 16.0, 0.0).unwrap());
    request.facts.requested_at_s = Some(1_600_000_360.0);
    request.facts.details.priority = Priority::Low;
    request.facts.details.os = Some("windows".to_owned());
    request.facts.details.features.insert("batch_size".to_owned(), FeatureValue::Number(2.0));
    durable.execute_one(Allocate(AllocationRequest::Vm(request)), now + 1.0).unwrap();
    drop(durable);
    let reopened = DurableAllocator::open(&spec, &config, &Registry::standard(), &path, now + 2.0).unwrap();
    let vm6 = reopened.allocator().unwrap().state().vm(&VmId::from("vm-6")).unwrap().record.clone();
    assert_eq!(vm6.facts.requested_at_s, Some(1_600_000_360.0));
    assert_eq!(vm6.facts.details.priority, Priority::Low);
    assert_eq!(vm6.facts.details.os.as_deref(), Some("windows"));
    assert_eq!(vm6.facts.details.features.get("batch_size"), Some(&FeatureValue::Number(2.0)));
    assert_eq!(reopened.allocator().unwrap().stats().vms, 6);
    drop(reopened);
    assert_eq!(schema(&path).0, SCHEMA_VERSION);
}

#[test]
fn a_version_5_store_gains_the_exits_table_and_keeps_its_vms() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("allocator.db");
    let spec = InventorySpec::homogeneous("z", 4, 2, Resources::from_whole(16.0, 64.0, 0.0).unwrap());
    let config = AllocatorConfig::default();
    let mut request = VmRequest::new("vm-0", "tenant-a", "D4", Resources::from_whole(4.0, 16.0, 0.0).unwrap());
    request.facts.requested_at_s = Some(1_000.0);
    let mut durable = DurableAllocator::open(&spec, &config, &Registry::standard(), &path, 10.0).unwrap();
    durable.execute_one(Allocate(AllocationRequest::Vm(request)), 11.0).unwrap();
    drop(durable);
    // Version 5 is version 9 without the exits, consolidation, rejections and inventory tables.
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch(
            "DROP TABLE exits; DROP TABLE consolidation; DROP TABLE rejections; DROP TABLE inventory;
             UPDATE meta SET value = 5 WHERE key = 'schema_version'",
        )
        .unwrap();
    assert_eq!(
        schema(&path),
        (5, ["drain", "host_states", "meta", "migrations", "policy_hosts", "vms"].map(String::from).to_vec())
    );

    let mut durable = DurableAllocator::open(&spec, &config, &Registry::standard(), &path, 20.0).unwrap();
    let (version, tables) = schema(&path);
    assert_eq!(version, SCHEMA_VERSION);
    assert!(tables.contains(&"exits".to_owned()) && tables.contains(&"rejections".to_owned()), "{tables:?}");
    assert_eq!(durable.allocator().unwrap().stats().vms, 1);
    // Its VM's release is kept as an exit, at the end the release names.
    let release = Release { vm: VmId::from("vm-0"), owner: None, ended_at_s: Some(1_600.0) };
    durable.execute_one(release, 21.0).unwrap();
    let exit: (String, f64, f64) = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("SELECT vm_id, start_s, ended_at_s FROM exits", [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap();
    assert_eq!(exit, ("vm-0".to_owned(), 1_000.0, 1_600.0));
}
