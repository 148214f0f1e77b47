//! The `vmtrace` binary as a user runs it.

use std::process::Command;

fn vmtrace(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vmtrace")).args(args).output().expect("run vmtrace");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn generate_then_stats_then_convert() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("demo.csv.gz");
    let trace = trace.to_str().unwrap();
    let (ok, out, err) = vmtrace(&["generate", "--out", trace, "--days", "1", "--seed", "3"]);
    assert!(ok, "{err}");
    assert!(out.contains("wrote"), "{out}");

    let (ok, out, err) = vmtrace(&["stats", trace]);
    assert!(ok, "{err}");
    for needle in ["VMs", "span", "p50", "1h", "core-hours", "core mix", "tenants", "censored"] {
        assert!(out.contains(needle), "missing {needle} in\n{out}");
    }

    let (ok, json, err) = vmtrace(&["stats", trace, "--json"]);
    assert!(ok, "{err}");
    let stats: serde_json::Value = serde_json::from_str(&json).unwrap();
    let vms = stats["vms"].as_u64().unwrap();
    assert!(vms > 1000, "{vms}");

    let copy = dir.path().join("copy.csv");
    let (ok, out, err) = vmtrace(&["convert", trace, "--out", copy.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out.contains(&format!("wrote {vms} VMs")), "{out}");
    let (_, json_copy, _) = vmtrace(&["stats", copy.to_str().unwrap(), "--json"]);
    assert_eq!(json_copy, json, "converting to plain CSV changes nothing");
}

#[test]
fn bad_input_names_the_field_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "vm_id,tenant_id,vm_type,cores,memory_gib,priority,start_s,end_s\nv,t,a,1,2,regular,x,\n")
        .unwrap();
    let (ok, _, err) = vmtrace(&["stats", bad.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("line 2") && err.contains("start_s"), "{err}");

    let (ok, _, err) = vmtrace(&["stats", "trace.sqlite", "--machine-id", "0"]);
    assert!(!ok);
    assert!(err.contains("--machine-cores"), "{err}");

    let (ok, _, err) = vmtrace(&["generate", "--out", "x.csv", "--days=-1"]);
    assert!(!ok);
    assert!(err.contains("--days"), "{err}");

    let (ok, _, err) = vmtrace(&["generate", "--out", "x.csv", "--requests-per-hour", "1e30"]);
    assert!(!ok);
    assert!(err.contains("--requests-per-hour"), "{err}");

    let (ok, _, err) = vmtrace(&["stats", dir.path().join("missing.csv").to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("missing.csv"), "{err}");
}
