//! The VMs that left are kept (the exits table of both stores, written with the release, pruned
//! past the retention) and exported with the running ones as a trace in the project's format:
//! - the same workload exports the same rows from SQLite and PostgreSQL (both of its write paths:
//!   set-based batches and change by change), in start order, exited VMs with their end on the
//!   model's clock, running ones censored, priority, OS and features in their columns; a window
//!   and a row cap cut it;
//! - exits older than the retention before the newest are pruned, on both stores;
//! - `GET /v1/export` over HTTP: admin only, problems naming the field, a CSV the trace reader
//!   reads back, with its row count in `x-export-rows`.

use crate::support;

use allocator::durable::{job, Allocate, Answer, DurableAllocator, Job, Release};
use allocator::store::{
    self, ExitRetention, ExportError, ExportHeader, ExportSink, ExportWindow, ExportedVm, StoreLocation, TraceExport,
};
use domain::{
    AllocationDecision, AllocationRequest, FeatureValue, HostId, InventorySpec, Priority, RequestFacts, Resources,
    VmId, VmInfo, VmRequest,
};
use placement::allocator::AllocatorConfig;
use placement::journal::Change;
use placement::state::NewVm;
use placement::Registry;
use serde_json::json;
use std::path::Path;
use std::sync::Arc;
use test_support::postgres::Postgres;
use traces::csv_format::{CsvTraceReader, REQUIRED_COLUMNS};
use traces::VmRecord;

fn spec() -> InventorySpec {
    InventorySpec::homogeneous("z", 8, 2, Resources::from_whole(16.0, 64.0, 0.0).unwrap())
}

fn request(id: &str, requested_at_s: Option<f64>) -> VmRequest {
    let mut request = VmRequest::new(id, "t-1", "D2", Resources::from_whole(2.0, 7.5, 0.0).unwrap());
    request.facts.requested_at_s = requested_at_s;
    request
}

/// A command of the workload and its answer, which must be a success.
enum Expect {
    Placed(Answer<AllocationDecision>),
    Released(Answer<VmInfo>),
}

fn allocate(request: VmRequest) -> (Box<dyn Job>, Expect) {
    let (job, answer) = job(Allocate(AllocationRequest::Vm(request)));
    (job, Expect::Placed(answer))
}

fn release(id: &str, ended_at_s: Option<f64>) -> (Box<dyn Job>, Expect) {
    let (job, answer) = job(Release { vm: VmId::from(id), owner: None, ended_at_s });
    (job, Expect::Released(answer))
}

/// The allocator's clock of the workload's placements (Unix-like, far from the model's).
const PLACED_AT: f64 = 1_000_000.0;

/// Places and releases six VMs; every batch's replies must succeed.
/// - `a` (model clock 100; linux, batch_size 2, region eu-west) ends at 400;
/// - `b` (200, no facts) keeps running;
/// - `c` (150, batch_size 1) is released naming no end: its start plus the 30 s it was placed;
/// - `d` (no request time: placed at `PLACED_AT` on the allocator's clock) ends at `PLACED_AT + 99`;
/// - `e` (300) is placed and released in one batch (PostgreSQL writes it change by change), at 350;
/// - `f` (250, low priority) names an end before its start (240): it reads as its start.
fn workload(durable: &mut DurableAllocator) {
    let mut a = request("a", Some(100.0));
    a.facts.details.os = Some("linux".to_owned());
    a.facts.details.features.insert("batch_size".to_owned(), FeatureValue::Number(2.0));
    a.facts.details.features.insert("region".to_owned(), FeatureValue::Text("eu-west".to_owned()));
    let mut c = request("c", Some(150.0));
    c.facts.details.features.insert("batch_size".to_owned(), FeatureValue::Number(1.0));
    let mut f = request("f", Some(250.0));
    f.facts.details.priority = Priority::Low;
    let batches = [
        (vec![allocate(a), allocate(request("b", Some(200.0))), allocate(c), allocate(f)], PLACED_AT),
        (vec![allocate(request("d", None))], PLACED_AT),
        // Releases only: PostgreSQL's set-based write.
        (vec![release("a", Some(400.0)), release("c", None), release("f", Some(240.0))], PLACED_AT + 30.0),
        (vec![release("d", Some(PLACED_AT + 99.0))], PLACED_AT + 99.0),
        // Placed and released in one batch: change by change.
        (vec![allocate(request("e", Some(300.0))), release("e", Some(350.0))], PLACED_AT + 100.0),
    ];
    for (commands, now) in batches {
        let (jobs, expected): (Vec<_>, Vec<_>) = commands.into_iter().unzip();
        durable.execute(jobs, now);
        for expect in expected {
            match expect {
                Expect::Placed(answer) => {
                    let decision = answer.ready().unwrap();
                    assert!(decision.is_placed(), "{decision:?}");
                }
                Expect::Released(answer) => {
                    answer.ready().unwrap();
                }
            }
        }
    }
}

/// A sink that keeps the header and writes the trace to a file.
struct Capture {
    trace: TraceExport<std::fs::File>,
    header: Option<ExportHeader>,
}

impl ExportSink for Capture {
    fn header(&mut self, header: &ExportHeader) -> Result<(), ExportError> {
        self.header = Some(header.clone());
        self.trace.header(header)
    }

    fn row(&mut self, vm: &ExportedVm) -> Result<(), ExportError> {
        self.trace.row(vm)
    }
}

/// The export of `window`, read back with the trace reader, and its header.
fn export(location: &StoreLocation, window: ExportWindow, dir: &Path) -> (ExportHeader, Vec<VmRecord>, Vec<String>) {
    let path = dir.join("export.csv");
    let mut sink = Capture { trace: TraceExport::new(std::fs::File::create(&path).unwrap()), header: None };
    let written = store::export_trace(location, &window, &mut sink).unwrap();
    sink.trace.finish().unwrap();
    let reader = CsvTraceReader::open(&path).unwrap();
    let extra = reader.extra_column_names().to_vec();
    let records: Vec<VmRecord> = reader.collect::<Result<_, _>>().unwrap();
    assert_eq!(written, records.len() as u64);
    (sink.header.unwrap(), records, extra)
}

fn ids(records: &[VmRecord]) -> Vec<&str> {
    records.iter().map(|r| r.vm_id.as_str()).collect()
}

fn check_workload_export(location: &StoreLocation, dir: &Path) {
    let (header, records, extra) = export(location, ExportWindow::default(), dir);
    assert_eq!(ids(&records), ["a", "c", "b", "f", "e", "d"], "{location}: start order");
    assert_eq!((header.rows_in_window, header.rows), (6, 6));
    assert_eq!(extra, ["os", "batch_size", "region"], "{location}");
    let by_id = |id: &str| records.iter().find(|r| r.vm_id == id).unwrap();
    let a = by_id("a");
    assert_eq!((a.start_s, a.end_s), (100.0, Some(400.0)));
    assert_eq!((a.tenant_id.as_str(), a.vm_type.as_str(), a.cores, a.memory_gib), ("t-1", "D2", 2.0, 7.5));
    assert_eq!(
        (a.extra.get("os"), a.extra.get("batch_size"), a.extra.get("region")),
        (Some("linux"), Some("2"), Some("eu-west"))
    );
    assert_eq!((by_id("b").start_s, by_id("b").end_s), (200.0, None), "{location}: running, censored");
    assert_eq!(by_id("b").extra.get("os"), Some(""));
    assert_eq!(by_id("c").end_s, Some(180.0), "{location}: no end named: start + 30 s placed");
    assert_eq!(by_id("c").extra.get("batch_size"), Some("1"));
    assert_eq!((by_id("d").start_s, by_id("d").end_s), (PLACED_AT, Some(PLACED_AT + 99.0)));
    assert_eq!(by_id("e").end_s, Some(350.0));
    assert_eq!((by_id("f").priority, by_id("f").end_s), (Priority::Low, Some(250.0)));
    // The record is the request again: what the replay client would send for it.
    let again = a.to_request("").unwrap();
    assert_eq!(
        (again.facts.details.os.as_deref(), again.facts.details.features.len(), again.facts.requested_at_s),
        (Some("linux"), 2, Some(100.0))
    );

    // A window on the model's clock, and a cap on the rows.
    let window = ExportWindow { from_s: 150.0, to_s: 300.0, ..ExportWindow::default() };
    let (header, records, extra) = export(location, window, dir);
    assert_eq!(ids(&records), ["c", "b", "f"]);
    assert_eq!(header.rows, 3);
    assert_eq!(extra, ["batch_size"], "{location}: only the window's columns");
    let window = ExportWindow { max_rows: 2, ..ExportWindow::default() };
    let (header, records, _) = export(location, window, dir);
    assert_eq!(ids(&records), ["a", "c"]);
    assert_eq!((header.rows_in_window, header.rows), (6, 2));
    let window = ExportWindow { from_s: 1e9, to_s: 2e9, ..ExportWindow::default() };
    let (header, records, extra) = export(location, window, dir);
    assert!(records.is_empty() && extra.is_empty() && header.rows == 0);
}

/// The default allocator over the store at `location`, opened when the workload is placed.
fn open(location: &StoreLocation) -> DurableAllocator {
    DurableAllocator::open(&spec(), &AllocatorConfig::default(), &Registry::standard(), location.clone(), PLACED_AT)
        .unwrap()
}

#[test]
fn placements_and_exits_export_as_a_trace_from_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let location = StoreLocation::Sqlite(dir.path().join("s.db"));
    let mut durable = open(&location);
    workload(&mut durable);
    // Exported while the allocator holds the store open (a connection of its own).
    check_workload_export(&location, dir.path());
    drop(durable);
    check_workload_export(&location, dir.path());
}

#[test]
fn placements_and_exits_export_as_a_trace_from_postgresql() {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let location = StoreLocation::from(pg.url.clone());
    let mut durable = open(&location);
    workload(&mut durable);
    check_workload_export(&location, dir.path());
    assert_eq!(pg.psql("SELECT count(*) FROM exits"), "5");
    assert_eq!(pg.psql("SELECT count(*) FROM vms"), "1");
}

fn new_vm(id: &str, requested_at_s: f64) -> Arc<NewVm> {
    Arc::new(NewVm {
        id: VmId::from(id),
        facts: RequestFacts {
            tenant_id: "t".into(),
            vm_type: "D".to_owned(),
            demand: Resources::from_whole(1.0, 1.0, 0.0).unwrap(),
            requested_at_s: Some(requested_at_s),
            details: Default::default(),
        },
        placed_at_s: 1.0,
        prediction: None,
    })
}

fn placed(vm: &Arc<NewVm>) -> Change {
    Change::Placed { vm: Arc::clone(vm), host: HostId::from("z-h0") }
}

fn released(vm: &Arc<NewVm>, ended_at_s: f64) -> Change {
    Change::Released {
        vm: vm.id.clone(),
        was: placement::PlacedVm { host: placement::HostIndex(0), record: Arc::clone(vm) },
        ended_at_s,
    }
}

/// VMs ending at 10 (started long before), 50, 450 and 500, with a retention of 100 s: the first
/// batch with exits prunes (nothing ended 100 s before its newest exit, 50), the next within a
/// minute does not; a store opened again prunes at its first batch: the exits of the last 100 s
/// before its newest (490) stay.
#[test]
fn exits_past_the_retention_are_pruned_from_both_stores() {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let none = |_: &HostId| None;
    let vms: Vec<Arc<NewVm>> =
        [("old", -1_000.0), ("x", 0.0), ("y", 400.0), ("z", 450.0)].iter().map(|(id, at)| new_vm(id, *at)).collect();
    for location in [StoreLocation::Sqlite(dir.path().join("r.db")), StoreLocation::from(pg.url.clone())] {
        let mut store = store::open(&location, &spec()).unwrap();
        store.set_exit_retention(ExitRetention { retention_s: 100.0 });
        store.apply(&vms.iter().map(placed).collect::<Vec<_>>(), &none).unwrap();
        // The first batch with exits prunes: its newest exit is 50, nothing ended before -50.
        store.apply(&[released(&vms[0], 10.0), released(&vms[1], 50.0)], &none).unwrap();
        let count = |location: &StoreLocation| {
            let (header, _, _) = export(location, ExportWindow::default(), dir.path());
            header.rows
        };
        assert_eq!(count(&location), 4, "{location}");
        // The next batch, within a minute, does not prune.
        store.apply(&[released(&vms[2], 450.0), released(&vms[3], 500.0)], &none).unwrap();
        assert_eq!(count(&location), 4, "{location}");
        drop(store);
        // A store pruning as soon as it may: the exits that ended before 400 go, the old VM that
        // ended at 10 among them; those of the last 100 s stay.
        let mut store = store::open(&location, &spec()).unwrap();
        store.set_exit_retention(ExitRetention { retention_s: 100.0 });
        let w = new_vm("w", 480.0);
        store.apply(&[placed(&w), released(&w, 490.0)], &none).unwrap();
        let (_, records, _) = export(&location, ExportWindow::default(), dir.path());
        assert_eq!(ids(&records), ["y", "z", "w"], "{location}");
    }
}

#[tokio::test]
async fn the_export_route_is_admin_only_names_bad_fields_and_answers_a_trace() {
    let dir = tempfile::tempdir().unwrap();
    let server = support::start(&dir.path().join("h.db"), 4, &format!("admin_token = \"{}\"", support::TOKEN)).await;
    let client = reqwest::Client::new();
    for (i, (at, end)) in [(100.0, Some(700.0)), (200.0, None), (300.0, Some(900.0))].into_iter().enumerate() {
        let mut vm = support::vm(&format!("vm-{i}"), "t-1", 1.0, 2.0);
        vm["requested_at_s"] = json!(at);
        vm["os"] = json!("linux");
        vm["features"] = json!({"batch_size": i});
        let (status, body) = support::send(client.post(server.url("/v1/allocations")).json(&json!({"vm": vm}))).await;
        assert_eq!(status, 201, "{body}");
        if let Some(end) = end {
            let url = server.url(&format!("/v1/allocations/vm-{i}?ended_at_s={end}"));
            assert_eq!(support::send(client.delete(url)).await.0, 204);
        }
    }
    let export = |query: &str| client.get(server.url(&format!("/v1/export{query}"))).bearer_auth(support::TOKEN);
    assert_eq!(support::send(client.get(server.url("/v1/export"))).await.0, 401);
    for (query, status, field) in [
        ("?from_s=abc", 400, "from_s"),
        ("?to_s=inf", 422, "to_s"),
        ("?max_rows=0", 422, "max_rows"),
        ("?max_rows=1000000001", 422, "max_rows"),
        ("?max_rows=-3", 400, "max_rows"),
        ("?colour=red", 400, "colour"),
    ] {
        let (got, body) = support::send(export(query)).await;
        assert_eq!(got, status, "{query}: {body}");
        assert_eq!(body["errors"][0]["field"], field, "{query}: {body}");
    }

    let response = export("?from_s=150&max_rows=10").send().await.unwrap();
    assert_eq!(response.status(), 200);
    let header = |name: &str| response.headers()[name].to_str().unwrap().to_owned();
    assert!(header("content-type").starts_with("text/csv"), "{}", header("content-type"));
    assert_eq!((header("x-export-rows"), header("x-export-truncated")), ("2".to_owned(), "false".to_owned()));
    let text = response.text().await.unwrap();
    let mut columns: Vec<&str> = REQUIRED_COLUMNS.to_vec();
    columns.extend(["os", "batch_size"]);
    assert_eq!(text.lines().next().unwrap(), columns.join(","), "{text}");
    let records: Vec<VmRecord> = CsvTraceReader::from_reader(std::io::Cursor::new(text.clone().into_bytes()))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let rows: Vec<(&str, f64, Option<f64>, Option<&str>)> =
        records.iter().map(|r| (r.vm_id.as_str(), r.start_s, r.end_s, r.extra.get("batch_size"))).collect();
    assert_eq!(rows, [("vm-1", 200.0, None, Some("1")), ("vm-2", 300.0, Some(900.0), Some("2"))]);

    // An empty window is no error: the header alone.
    let response = export("?from_s=5&to_s=5").send().await.unwrap();
    assert_eq!((response.status().as_u16(), response.headers()["x-export-rows"].to_str().unwrap()), (200, "0"));
    assert_eq!(response.text().await.unwrap().trim(), REQUIRED_COLUMNS.join(","));

    let response = export("?max_rows=1").send().await.unwrap();
    assert_eq!(response.headers()["x-export-truncated"], "true");
    assert_eq!(response.text().await.unwrap().lines().count(), 2, "the header and one row");

    let (status, doc) = support::send(client.get(server.url("/openapi.json"))).await;
    assert_eq!(status, 200);
    assert!(doc["paths"]["/v1/export"]["get"].is_object());
}
