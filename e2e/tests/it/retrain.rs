//! Retraining from the system's own history, end to end with the real binaries (issue 18): an
//! inference server (a copy of `models/default`, stable), an allocator and the control service in
//! front; a few hundred VMs of a synthetic trace replayed through `POST /v1/allocate` on the model's
//! clock (`requested_at_s` = trace start, releases `?ended_at_s=` = trace end); the allocator's
//! export (`GET /v1/export`) reads back with the trace reader and `vmtrace stats`, one row per VM
//! with what its request carried (exited VMs with their end, running ones censored); then
//! `scripts/retrain.sh` trains a bundle on that export and offers it as a canary, and the new
//! bundle serves: `GET /v1/models` lists it as the canary and later VMs are predicted by it.

use crate::support;

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use test_support::binaries::{binaries_dir, workspace_binary};
use test_support::process::{with_config, with_service_token, Process};
use traces::csv_format::CsvTraceReader;
use traces::synthetic::{generate, SyntheticConfig};
use traces::VmRecord;

const HOUR: f64 = 3_600.0;
const DAY: f64 = 86_400.0;
const ALLOCATOR_TOKEN: &str = "allocator-admin-token";
const INFERENCE_TOKEN: &str = "inference-admin-token";

/// Starts the workspace binary `name` with the configuration `config(port)` on a free port, and
/// waits until it is ready ([`Process::start`]: another port if it exits meanwhile).
async fn start(dir: &Path, name: &str, config: impl Fn(u16) -> String) -> Process {
    let spawn = |port: u16| {
        let path = dir.join(format!("{name}-{port}.toml"));
        std::fs::write(&path, config(port)).unwrap();
        let mut command = Command::new(workspace_binary(name));
        with_service_token(with_config(&mut command, &path), support::SERVICE_TOKEN)
            .env_remove("ALLOCATOR_ADMIN_TOKEN")
            .env_remove("INFERENCE_ADMIN_TOKEN")
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"))
    };
    Process::start(name, Duration::from_secs(60), spawn).await
}

/// Two days of a synthetic trace of 60 tenants, in start order.
fn trace() -> Vec<VmRecord> {
    let config = SyntheticConfig {
        seed: 11,
        span_days: 2.0,
        requests_per_hour: 90.0,
        tenants: 60,
        ..SyntheticConfig::default()
    };
    let mut records = generate(&config);
    records.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
    records
}

fn window(records: &[VmRecord], (from_s, to_s): (f64, f64)) -> Vec<&VmRecord> {
    records.iter().filter(|r| r.start_s >= from_s && r.start_s < to_s).collect()
}

/// Replays the VMs that start in `[from_s, to_s)` through the control service in time order, each
/// request as the replay client builds it (its trace start as `requested_at_s`, its OS and
/// features), releasing those that end inside the window at their end; answers each placed VM's
/// prediction's model version.
async fn replay(control: &Process, records: &[VmRecord], (from_s, to_s): (f64, f64)) -> Vec<String> {
    let window = window(records, (from_s, to_s));
    let mut events: Vec<(f64, bool, usize)> = Vec::new();
    for (i, record) in window.iter().enumerate() {
        events.push((record.start_s, true, i));
        if let Some(end) = record.end_s.filter(|end| *end < to_s) {
            events.push((end, false, i));
        }
    }
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
    let client = reqwest::Client::new();
    let mut versions = Vec::new();
    for (at_s, arrival, i) in events {
        let record = window[i];
        if arrival {
            let body = json!({"vm": record.to_request("").unwrap()});
            let response = client.post(control.url("/v1/allocate")).json(&body).send().await.unwrap();
            let status = response.status();
            let decision: Value = response.json().await.unwrap();
            assert_eq!(status, 201, "{} is placed: {decision}", record.vm_id);
            let prediction = &decision["placements"][0]["prediction"];
            versions.push(prediction["model_version"].as_str().unwrap_or_default().to_owned());
        } else {
            let url = control.url(&format!("/v1/allocate/{}?ended_at_s={at_s}", record.vm_id));
            let status = client.delete(url).send().await.unwrap().status();
            assert_eq!(status, 204, "{} is released", record.vm_id);
        }
    }
    versions
}

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_retrained_on_the_allocators_export_is_offered_as_a_canary_and_serves() {
    // The binaries the script runs, found (or the missing one named) before anything starts.
    for binary in ["vmtrace", "lifetime-train"] {
        workspace_binary(binary);
    }
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    support::copy_dir(&repository().join("models/default"), &models.join("default"));
    // The default bundle stays stable: the retrained one is to be a canary, not the newest valid.
    std::fs::write(models.join("rollout.toml"), "stable = \"default\"\n").unwrap();
    let inference = start(dir.path(), "inference-server", |port| {
        format!(
            "listen = \"127.0.0.1:{port}\"\nmodels_dir = \"{}\"\nadmin_token = \"{INFERENCE_TOKEN}\"\n\
             watch_interval_ms = 200\n",
            models.display()
        )
    })
    .await;
    let store = dir.path().join("allocator.db");
    let allocator = start(dir.path(), "allocator", |port| {
        format!(
            "listen = \"127.0.0.1:{port}\"\nstore = \"{}\"\nadmin_token = \"{ALLOCATOR_TOKEN}\"\n[generate]\n\
             zone = \"zone-1\"\nhosts = 100\nhosts_per_rack = 10\ncores = 64\nmemory_gib = 512\n\
             [allocator.policy]\nkind = \"la-binary\"\n",
            store.display()
        )
    })
    .await;
    let control = start(dir.path(), "control-service", |port| {
        format!(
            "listen = \"127.0.0.1:{port}\"\ndefault_zone = \"zone-1\"\n[zones.zone-1]\nallocator = \"{}\"\n\
             [inference]\nservers = [\"{}\"]\ntimeout_ms = 2000\nhealth_interval_ms = 100\n\
             [allocator]\nhealth_interval_ms = 100\n[safeguard]\nenabled = false\n[rate_limit]\nenabled = false\n",
            allocator.base, inference.base
        )
    })
    .await;

    // A few hundred VMs of a working day, on the model's clock.
    let records = trace();
    let history = (DAY + 6.0 * HOUR, DAY + 12.0 * HOUR);
    let replayed = window(&records, history);
    assert!((300..1_000).contains(&replayed.len()), "{} VMs", replayed.len());
    let served = replay(&control, &records, history).await;
    assert!(served.iter().all(|version| version == "default-1"), "{served:?}");

    // The export holds every replayed VM as the trace had it, up to the window's end.
    let client = reqwest::Client::new();
    let url = allocator.url(&format!("/v1/export?from_s={}&to_s={}", history.0, history.1));
    assert_eq!(client.get(&url).send().await.unwrap().status(), 401, "the export is an admin route");
    let response = client.get(&url).bearer_auth(ALLOCATOR_TOKEN).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-export-rows"], replayed.len().to_string().as_str());
    let export = dir.path().join("export.csv");
    std::fs::write(&export, response.bytes().await.unwrap()).unwrap();
    let reader = CsvTraceReader::open(&export).unwrap();
    let mut columns = reader.extra_column_names().to_vec();
    columns.sort();
    let mut expected_columns: Vec<String> = replayed[0].extra.names().to_vec();
    expected_columns.sort();
    assert_eq!(columns, expected_columns, "the request features the trace carried, as columns");
    let exported: Vec<VmRecord> = reader.collect::<Result<_, _>>().unwrap();
    assert_eq!(exported.len(), replayed.len());
    let (mut exited, mut running) = (0, 0);
    for (row, original) in exported.iter().zip(&replayed) {
        assert_eq!(row.vm_id, original.vm_id, "start order");
        // The request the exported row makes is the one the VM was placed with.
        assert_eq!(row.to_request("").unwrap(), original.to_request("").unwrap(), "{}", row.vm_id);
        let end = original.end_s.filter(|end| *end < history.1);
        assert_eq!(row.end_s, end, "{}: exited with its end, else censored", row.vm_id);
        if end.is_some() {
            exited += 1;
        } else {
            running += 1;
        }
    }
    assert!(exited > 100 && running > 20, "{exited} exited, {running} running");
    // The round trip through the project's own tool.
    let stats = Command::new(workspace_binary("vmtrace")).arg("stats").arg(&export).output().unwrap();
    let text = String::from_utf8_lossy(&stats.stdout);
    assert!(stats.status.success(), "vmtrace stats: {}", String::from_utf8_lossy(&stats.stderr));
    let vms = text.lines().find_map(|line| line.strip_prefix("VMs")).map(str::trim);
    assert_eq!(vms, Some(replayed.len().to_string().as_str()), "{text}");

    // The script: export, round trip, train, copy in, canary.
    let work = dir.path().join("retrain");
    let output = Command::new(repository().join("scripts/retrain.sh"))
        .args(["--allocator", &allocator.base, "--inference", &inference.base])
        .arg("--models-dir")
        .arg(&models)
        .args(["--bundle", "retrained", "--from-s", &history.0.to_string(), "--to-s", &history.1.to_string()])
        .args(["--share", "0.5", "--min-resolved", "100000"])
        .arg("--bin-dir")
        .arg(binaries_dir())
        .arg("--work-dir")
        .arg(&work)
        .args(["--", "--iterations", "30", "--num-leaves", "15", "--max-remaining-vms", "3000"])
        .env("ALLOCATOR_ADMIN_TOKEN", ALLOCATOR_TOKEN)
        .env("INFERENCE_ADMIN_TOKEN", INFERENCE_TOKEN)
        .output()
        .unwrap();
    let log = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    println!("{log}");
    assert!(output.status.success(), "scripts/retrain.sh failed:\n{log}");
    assert!(log.contains(&format!("trained on {} VMs", replayed.len())), "{log}");
    let leftovers: Vec<_> = std::fs::read_dir(&models)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "no staging directory is left: {leftovers:?}");

    // The inference server lists the new bundle as the canary, judged by evidence.
    let listed: Value = client
        .get(inference.url("/v1/models"))
        .bearer_auth(support::SERVICE_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let bundle = |name: &str| listed.as_array().unwrap().iter().find(|b| b["bundle"] == name).cloned().unwrap();
    let retrained = bundle("retrained");
    assert_eq!(retrained["state"], "canary", "{listed:#}");
    assert_eq!(retrained["canary_share"], 0.5);
    assert!(retrained["auto"].is_object(), "an auto canary: {retrained}");
    assert_eq!(bundle("default")["state"], "stable");
    let version = retrained["version"].as_str().unwrap().to_owned();
    assert!(version.starts_with("retrained-"), "{version}");

    // And it serves: later VMs are predicted by it, about half of them.
    let served = replay(&control, &records, (history.1, history.1 + 3.0 * HOUR)).await;
    let by_canary = served.iter().filter(|v| **v == version).count();
    let by_stable = served.iter().filter(|v| *v == "default-1").count();
    println!("after the canary: {by_canary} of {} VMs predicted by {version}, {by_stable} by default-1", served.len());
    assert!(by_canary > 0 && by_stable > 0, "{served:?}");
    assert_eq!(by_canary + by_stable, served.len());
}
