//! A store written by the previous release (schema version 3: LAVA's state in a table of its own, a
//! drain with a migration in flight, a failed host) opens under this release, is upgraded in place,
//! and recovers to what the previous release answered about it.
//!
//! The fixture (`fixtures/store-v3.sql`) is the previous release's own store, dumped after driving
//! its `allocator` binary over HTTP; `fixtures/store-v3-answers.json` holds that binary's answers
//! (`GET /v1/hosts/{id}` of every host and `GET /v1/drains`) at the end of the run.

use allocator::durable::{Command, DurableAllocator, Reply};
use domain::{HostId, InventorySpec, Resources};
use placement::{AllocatorConfig, PolicyConfig, TieBreak};
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
    let mut durable = DurableAllocator::open(&spec, &config, &path, stopped_at).unwrap();

    let (version, tables) = schema(&path);
    assert_eq!(version, 4);
    assert!(tables.contains(&"policy_hosts".to_owned()) && !tables.contains(&"lava_hosts".to_owned()), "{tables:?}");

    for before in answers["hosts"].as_array().unwrap() {
        let id = before["host_id"].as_str().unwrap();
        let Ok(Reply::Host(now)) = durable.execute_one(Command::GetHost(HostId::from(id)), stopped_at) else {
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
    let Ok(Reply::Drain(drain)) = durable.execute_one(Command::DrainStatus, stopped_at) else {
        panic!("the drain in flight is recovered")
    };
    assert_eq!(serde_json::to_value(&drain).unwrap(), answers["drain"]);

    // A migration and a release go on as before, and the upgraded store opens again as it is.
    durable.execute_one(Command::CompleteMigration("vm-1".into()), stopped_at + 1.0).unwrap();
    durable.execute_one(Command::Release("vm-3".into()), stopped_at + 2.0).unwrap();
    let Ok(Reply::Stats(stats)) = durable.execute_one(Command::Stats, stopped_at + 2.0) else { panic!("stats") };
    drop(durable);
    let reopened = DurableAllocator::open(&spec, &config, &path, stopped_at + 2.0).unwrap();
    let again = reopened.allocator().unwrap().stats();
    assert_eq!(
        (again.vms, again.allocated_cores, again.host_states),
        (stats.vms, stats.allocated_cores, stats.host_states)
    );
    assert_eq!(schema(&path).0, 4);
}
