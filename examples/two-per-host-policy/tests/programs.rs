//! The example policy run by the shipped programs: `simulate` and the allocator service, each the
//! shipped `main` with one registration line, decide by it; the policy's state is kept by both and
//! made durable by the service.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;
use test_support::process::{with_config, Process};

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

/// The example's allocator on `port` over `store`: three hosts of 16 cores in one rack, the
/// policy `two-per-host`, ties to the lowest index.
fn allocator(dir: &Path, store: &Path, port: u16) -> Child {
    let config = dir.join(format!("allocator-{port}.toml"));
    let text = format!(
        "listen = \"127.0.0.1:{port}\"\nstore = \"{}\"\n[generate]\nzone = \"z\"\nhosts = 3\nhosts_per_rack = 3\n\
         cores = 16\nmemory_gib = 64\n[allocator]\ntie_break = \"lowest-index\"\n[allocator.policy]\nkind = \"two-per-host\"\n",
        store.display()
    );
    std::fs::write(&config, text).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_two-per-host-allocator"));
    with_config(&mut command, &config);
    for variable in ["ALLOCATOR_ADMIN_TOKEN", "ALLOCATOR_SERVICE_TOKEN", "ALLOCATOR_SERVICE_TOKEN_FILE"] {
        command.env_remove(variable);
    }
    command.spawn().unwrap()
}

async fn place(client: &reqwest::Client, server: &Process, id: &str) -> String {
    let vm =
        json!({"vm": {"vm_id": id, "tenant_id": "t", "vm_type": "small", "demand": {"cores": 2, "memory_gib": 4}}});
    let response = client.post(server.url("/v1/allocations")).json(&vm).send().await.unwrap();
    let body: Value = response.json().await.unwrap();
    body["placements"][0]["host_id"].as_str().unwrap_or_else(|| panic!("not placed: {body}")).to_owned()
}

#[tokio::test]
async fn the_allocator_service_runs_the_registered_policy_and_its_store_keeps_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("allocator.db");
    let ready = Duration::from_secs(30);
    let mut server = Process::start("the example's allocator", ready, |port| allocator(dir.path(), &store, port)).await;
    let port = server.port();
    let (respawn_dir, respawn_store) = (dir.path().to_owned(), store.clone());
    server = server.restartable(move || allocator(&respawn_dir, &respawn_store, port));
    let client = reqwest::Client::new();
    let mut hosts = Vec::new();
    for id in ["a", "b", "c", "d"] {
        hosts.push(place(&client, &server, id).await);
    }
    assert_eq!(hosts, ["z-h0", "z-h0", "z-h1", "z-h1"], "best fit alone would stack them on z-h0");
    let stats: Value = client.get(server.url("/v1/stats")).send().await.unwrap().json().await.unwrap();
    assert_eq!(stats["host_states"]["policy"], "two-per-host", "{stats}");
    assert_eq!(stats["host_states"]["by_state"]["full"], 2, "{stats}");
    // After a restart the counts come back from the store: the next VM opens z-h2, as it would
    // have before (a policy that forgot them would take z-h0 again).
    server.restart(ready).await;
    assert_eq!(place(&client, &server, "e").await, "z-h2");
}
