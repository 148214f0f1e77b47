//! The example policy run by the shipped programs: `simulate` and the allocator service, each the
//! shipped `main` with one registration line, decide by it; the policy's state is kept by both and
//! made durable by the service.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path)
}

/// The lines of `ours` that are not in `shipped`, after checking that `ours` is `shipped` with
/// lines added only.
fn added_lines(shipped: &str, ours: &str) -> Vec<String> {
    let (shipped, ours) = (
        std::fs::read_to_string(workspace_file(shipped)).unwrap(),
        std::fs::read_to_string(workspace_file(ours)).unwrap(),
    );
    let mut shipped_lines = shipped.lines().peekable();
    let mut added = Vec::new();
    for line in ours.lines() {
        if shipped_lines.peek() == Some(&line) {
            shipped_lines.next();
        } else {
            added.push(line.to_owned());
        }
    }
    assert_eq!(shipped_lines.next(), None, "every line of the shipped main is in the example's");
    added
}

#[test]
fn each_program_is_the_shipped_main_and_one_registration_line() {
    for (shipped, ours) in [
        ("allocator/src/bin/allocator.rs", "examples/two-per-host-policy/src/bin/allocator.rs"),
        ("simulator/src/bin/simulate.rs", "examples/two-per-host-policy/src/bin/simulate.rs"),
    ] {
        assert_eq!(
            added_lines(shipped, ours),
            ["    let registry = two_per_host_policy::register(registry);"],
            "{ours} against {shipped}"
        );
    }
}

/// Five VMs that never leave, one second apart, for three hosts of 16 cores.
const TRACE: &str = "vm_id,tenant_id,vm_type,cores,memory_gib,priority,start_s,end_s
a,t,small,2,4,regular,0,
b,t,small,2,4,regular,1,
c,t,small,2,4,regular,2,
d,t,small,2,4,regular,3,
e,t,small,2,4,regular,4,
";

fn simulate(dir: &Path, policy: &str) -> std::process::Output {
    let trace = dir.join("trace.csv");
    std::fs::write(&trace, TRACE).unwrap();
    Command::new(env!("CARGO_BIN_EXE_two-per-host-simulate"))
        .args(["run", "--trace"])
        .arg(&trace)
        .args(["--hosts", "3", "--host-cores", "16", "--host-memory-gib", "64", "--hosts-per-rack", "3"])
        .args(["--policy", policy, "--prediction", "none", "--tie-break", "lowest-index"])
        .args(["--duration-s", "10", "--record-placements", "--quiet", "--out"])
        .arg(dir.join(format!("{policy}.json")))
        .output()
        .unwrap()
}

fn hosts_of(result: &Value) -> Vec<String> {
    let placements = result["placements"].as_array().expect("placements recorded");
    placements.iter().map(|p| p["host_id"].as_str().expect("placed").to_owned()).collect()
}

#[test]
fn simulate_runs_the_registered_policy_and_keeps_its_state() {
    let dir = tempfile::tempdir().unwrap();
    let output = simulate(dir.path(), two_per_host_policy::NAME);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let result: Value = serde_json::from_slice(&std::fs::read(dir.path().join("two-per-host.json")).unwrap()).unwrap();
    // Best fit alone would stack all five on the first host; the state sends every third VM on.
    assert_eq!(hosts_of(&result), ["sim-h0", "sim-h0", "sim-h1", "sim-h1", "sim-h2"]);
    let states = &result["final_stats"]["host_states"];
    assert_eq!(states["policy"], "two-per-host");
    assert_eq!(states["by_state"]["full"], 2);

    let output = simulate(dir.path(), "pbfr");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let pbfr: Value = serde_json::from_slice(&std::fs::read(dir.path().join("pbfr.json")).unwrap()).unwrap();
    assert_eq!(hosts_of(&pbfr), ["sim-h0"; 5], "the standard presets are still there");
}

#[test]
fn simulate_lists_the_registered_policy_among_its_choices() {
    let dir = tempfile::tempdir().unwrap();
    let output = simulate(dir.path(), "no-such-policy");
    assert!(!output.status.success());
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(message.contains("--policy") && message.contains("two-per-host") && message.contains("nilas"), "{message}");
}
