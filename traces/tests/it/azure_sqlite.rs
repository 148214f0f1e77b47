//! The Azure packing-trace 2020 sqlite reader, on a small trace this test builds itself.

use domain::Priority;
use rusqlite::Connection;
use traces::azure_sqlite::MachineType;
use traces::{TraceError, TraceSource, TraceStats, VmRecord};

/// Two machine types: machine 0 hosts VM types 1 and 2; machine 1 hosts only type 1, at other
/// fractions (a bigger machine).
fn build_trace(path: &std::path::Path) {
    let db = Connection::open(path).unwrap();
    db.execute_batch(
        "CREATE TABLE vmType (id INTEGER PRIMARY KEY, vmTypeId INTEGER, machineId INTEGER,
                              core REAL, memory REAL, hdd REAL, ssd REAL, nic REAL);
         CREATE TABLE vm (vmId INTEGER, tenantId INTEGER, vmTypeId INTEGER, priority INTEGER,
                          starttime REAL, endtime REAL);
         INSERT INTO vmType VALUES (1, 1, 0, 0.125, 0.0625, 0, 0.1, 0.01),
                                   (2, 2, 0, 0.5,   0.25,   0, 0.2, 0.05),
                                   (3, 1, 1, 0.0625, 0.03125, 0, 0.05, 0.01);
         INSERT INTO vm VALUES (10, 7, 1, 1, -0.5, 0.25),
                               (11, 7, 2, 0,  0.0, NULL),
                               (12, 8, 1, 1,  1.5, 2.0),
                               (13, 9, 2, 1, -2.0, NULL);",
    )
    .unwrap();
}

fn read(path: &std::path::Path, machine_id: i64, cores: f64, memory_gib: f64) -> (Vec<VmRecord>, u64) {
    let machine = MachineType { machine_id, cores, memory_gib, ssd_gib: 0.0 };
    let mut reader = TraceSource::from_path(path, Some(machine)).unwrap().open().unwrap();
    let records = reader.by_ref().collect::<Result<Vec<_>, _>>().unwrap();
    (records, reader.skipped())
}

#[test]
fn maps_fractions_onto_the_chosen_machine_and_keeps_censoring() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("packing.sqlite");
    build_trace(&path);

    let (records, skipped) = read(&path, 0, 48.0, 384.0);
    assert_eq!(skipped, 0);
    let ids: Vec<&str> = records.iter().map(|r| r.vm_id.as_str()).collect();
    assert_eq!(ids, ["10", "11", "12", "13"]);
    let first = &records[0];
    assert_eq!((first.cores, first.memory_gib), (6.0, 24.0));
    assert_eq!((first.start_s, first.end_s), (-43_200.0, Some(21_600.0)));
    assert_eq!((first.tenant_id.as_str(), first.vm_type.as_str(), first.priority), ("7", "1", Priority::Regular));
    let second = &records[1];
    assert_eq!((second.cores, second.memory_gib, second.priority), (24.0, 96.0, Priority::Low));
    assert!(second.is_censored() && records[3].is_censored());
    assert_eq!(records[3].start_s, -172_800.0);

    let stats = TraceStats::of(&records);
    assert_eq!((stats.vms, stats.tenants), (4, 3));
    assert_eq!(stats.censored_share, 0.5);
    assert_eq!(stats.negative_start_share, 0.5);
}

#[test]
fn vms_the_machine_cannot_host_are_skipped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("packing.sqlite");
    build_trace(&path);
    let (records, skipped) = read(&path, 1, 96.0, 768.0);
    assert_eq!(skipped, 2);
    assert_eq!(records.iter().map(|r| r.vm_id.as_str()).collect::<Vec<_>>(), ["10", "12"]);
    assert_eq!((records[0].cores, records[0].memory_gib), (6.0, 24.0));
}

#[test]
fn an_unknown_machine_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("packing.sqlite");
    build_trace(&path);
    let machine = MachineType { machine_id: 5, cores: 1.0, memory_gib: 1.0, ssd_gib: 0.0 };
    let err = TraceSource::from_path(&path, Some(machine)).unwrap().open().err().unwrap();
    assert!(matches!(&err, TraceError::AzureTrace(m) if m.contains("machineId 5")), "{err}");
}
