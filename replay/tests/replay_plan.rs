//! The replay client without a stack: planning a real CSV file end to end (the reader, the window,
//! the request bodies the control service will validate, the schedule), and the `vmreplay` binary's
//! refusals (bad flags, an unreachable control service), which must name the flag and the fix.

use domain::{AllocationRequest, ValidationLimits};
use replay::{self, EventKind, Pacing, WindowSpec};
use std::process::Command;
use traces::TraceSource;

const CSV: &str = "\
vm_id,tenant_id,vm_type,cores,memory_gib,priority,start_s,end_s,os,batch_size
early,t1,D2,2,8,regular,-50,500,linux,1
a,t1,D2,2,8,regular,100,160,linux,1
b,t2,E4,4,32,low,130,,windows,2
c,,F1,1,2,,150,150,,
d,t3,D8,8,32,regular,400,900,linux,1
";

fn write_trace(dir: &tempfile::TempDir) -> std::path::PathBuf {
    let path = dir.path().join("trace.csv");
    std::fs::write(&path, CSV).unwrap();
    path
}

#[test]
fn a_csv_trace_becomes_valid_requests_on_a_compressed_schedule() {
    let dir = tempfile::tempdir().unwrap();
    let source = TraceSource::from_path(write_trace(&dir), None).unwrap();
    assert_eq!(replay::first_start(source.open().unwrap()).unwrap(), -50.0);

    let window = WindowSpec { from_s: Some(100.0), duration_s: Some(200.0), max_vms: None };
    let plan = replay::plan(source.open().unwrap(), 100.0, &window, "run7").unwrap();
    let ids: Vec<&str> = plan.vms.iter().map(|vm| vm.request.vm_id.as_str()).collect();
    assert_eq!(ids, ["run7-a", "run7-b", "run7-c"]);
    assert_eq!((plan.to_s, plan.records_read), (300.0, 5));

    for vm in &plan.vms {
        let body = serde_json::to_vec(&AllocationRequest::Vm(vm.request.clone())).unwrap();
        let back: AllocationRequest = domain::decode_json(&body, &ValidationLimits::default()).unwrap();
        assert_eq!(back.vms()[0], vm.request, "the control service reads back exactly what was planned");
    }
    let b = &plan.vms[1].request;
    assert_eq!(
        (b.facts.details.priority, b.facts.details.os.as_deref(), b.facts.requested_at_s),
        (domain::Priority::Low, Some("windows"), Some(130.0))
    );
    assert_eq!(b.facts.details.features.get("batch_size"), Some(&domain::FeatureValue::Number(2.0)));
    assert_eq!(plan.vms[2].request.facts.tenant_id.as_str(), replay::NO_TENANT);

    // 10 trace seconds per real second: a at 0 s and released at 6 s; b never (no end); c, which
    // ends as it starts, released right after its own allocation.
    let events = replay::schedule(&plan, &Pacing::new(10.0, None).unwrap());
    let got: Vec<(f64, EventKind, &str)> =
        events.iter().map(|e| (e.at_s, e.kind, plan.vms[e.vm].request.vm_id.as_str())).collect();
    assert_eq!(
        got,
        [
            (0.0, EventKind::Allocate, "run7-a"),
            (3.0, EventKind::Allocate, "run7-b"),
            (5.0, EventKind::Allocate, "run7-c"),
            (5.0, EventKind::Release, "run7-c"),
            (6.0, EventKind::Release, "run7-a"),
        ]
    );
}

fn vmreplay(args: &[&str]) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_vmreplay"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .env("RUST_LIB_BACKTRACE", "0")
        .output()
        .unwrap();
    (output.status.code().unwrap_or(-1), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn bad_flags_are_refused_with_the_flag_named() {
    for (args, expected) in [
        (&["--synthetic-days", "1", "--speed", "0"][..], "--speed must be > 0"),
        (&["--synthetic-days", "1", "--max-rate", "0"][..], "--max-rate must be > 0"),
        (&["--synthetic-days", "1", "--concurrency", "0"][..], "--concurrency must be between 1 and 10000"),
        (&["--synthetic-days", "1", "--duration-s", "0"][..], "--duration-s must be > 0"),
        (&["--synthetic-days", "1", "--max-error-rate", "2"][..], "--max-error-rate must be a share"),
        (&["--synthetic-days", "0"][..], "--synthetic-days must be > 0"),
        (&["--synthetic-days", "1", "--control", "localhost"][..], "--control `localhost`"),
    ] {
        let (code, stderr) = vmreplay(args);
        assert_ne!(code, 0, "{args:?}");
        assert!(stderr.contains(expected), "{args:?}: expected {expected:?} in\n{stderr}");
    }
    let (code, stderr) = vmreplay(&[]);
    assert_eq!(code, 2, "clap's usage error");
    assert!(stderr.contains("--synthetic-days"), "{stderr}");
}

#[test]
fn an_unreachable_control_service_is_reported_with_the_way_to_start_it() {
    // A port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let control = format!("http://127.0.0.1:{port}");
    let (code, stderr) = vmreplay(&["--synthetic-days", "0.1", "--max-vms", "5", "--quiet", "--control", &control]);
    assert_eq!(code, 1);
    assert!(stderr.contains(&format!("cannot reach the control service at {control} (--control)")), "{stderr}");
    assert!(stderr.contains("scripts/stack.sh up"), "{stderr}");
}

#[test]
fn an_empty_window_says_where_the_trace_is() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_trace(&dir);
    let (code, stderr) = vmreplay(&[path.to_str().unwrap(), "--from-s", "5000", "--quiet"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("no VM of the trace starts in the window from 5000 s on"), "{stderr}");
    assert!(stderr.contains("between -50 s and 400 s"), "{stderr}");
}
