//! End-to-end tests of the real `inference-server` binary on loopback: serving, validation, hot
//! swap under concurrent load, rejection of a corrupt bundle, and canary traffic shares.

use lifetime_model::bundle::{BINARY_MODEL_FILE, MANIFEST_FILE};
use lifetime_train::train::{train_bundle, TrainConfig, TrainData};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use test_support::process::{with_config, Process};
use traces::synthetic::{generate, SyntheticConfig};

const TOKEN: &str = "test-admin-token";

/// Two small bundles trained once per test binary: `bundle-a` (version a-1) and `bundle-b` (b-1).
fn bundles() -> &'static (tempfile::TempDir, PathBuf, PathBuf) {
    static BUNDLES: OnceLock<(tempfile::TempDir, PathBuf, PathBuf)> = OnceLock::new();
    BUNDLES.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let mut paths = Vec::new();
        for (name, seed) in [("a", 5), ("b", 6)] {
            let records = generate(&SyntheticConfig { span_days: 5.0, seed, ..SyntheticConfig::default() });
            let config = TrainConfig {
                version: format!("{name}-1"),
                iterations: 40,
                max_remaining_vms: 10_000,
                ..TrainConfig::default()
            };
            let path = dir.path().join(format!("bundle-{name}"));
            let data =
                TrainData { source: format!("synthetic seed {seed}"), train: records, eval: None, trace_end_s: None };
            train_bundle(data, &config, &path, &()).unwrap();
            paths.push(path);
        }
        let b = paths.pop().unwrap();
        let a = paths.pop().unwrap();
        (dir, a, b)
    })
}

fn copy_bundle(from: &Path, models: &Path, name: &str) {
    // Copy under a hidden name, then rename: the bundle appears whole.
    let staging = models.join(format!(".{name}.partial"));
    std::fs::create_dir_all(&staging).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), staging.join(entry.file_name())).unwrap();
    }
    std::fs::rename(&staging, models.join(name)).unwrap();
}

/// A fresh models directory holding copies of `bundles` under their names.
fn models_with(bundles: &[(&str, &Path)]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    std::fs::create_dir_all(&models).unwrap();
    for (name, bundle) in bundles {
        copy_bundle(bundle, &models, name);
    }
    (dir, models)
}

/// Starts the server on `models` and waits until it is ready ([`Process::start`]).
async fn start(models: &Path) -> Process {
    let spawn = |port: u16| {
        let config = models.parent().unwrap().join(format!("server-{port}.toml"));
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:{port}\"\nmodels_dir = \"{}\"\nadmin_token = \"{TOKEN}\"\nwatch_interval_ms = 100\nmax_batch = 500\n",
                models.display()
            ),
        )
        .unwrap();
        with_config(&mut Command::new(env!("CARGO_BIN_EXE_inference-server")), &config).spawn().unwrap()
    };
    Process::start("the server", Duration::from_secs(30), spawn).await
}

fn instance(key: &str) -> Value {
    json!({"key": key, "tenant_id": "t3", "vm_type": "D2", "cores": 2, "memory_gib": 8, "requested_at_s": 400000.0,
           "features": {"batch_size": 1}})
}

async fn predict(client: &reqwest::Client, base: &str, keys: &[String]) -> Result<Vec<String>, String> {
    let instances: Vec<Value> = keys.iter().map(|k| instance(k)).collect();
    let response = client
        .post(format!("{base}/v1/predict"))
        .json(&json!({"instances": instances}))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !response.status().is_success() {
        return Err(format!("status {}", response.status()));
    }
    let body: Value = response.json().await.map_err(|e| e.to_string())?;
    Ok(body["predictions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["model_version"].as_str().unwrap().to_owned())
        .collect())
}

async fn served_version(client: &reqwest::Client, base: &str) -> String {
    predict(client, base, &["probe".to_owned()]).await.unwrap().remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_validates_and_documents() {
    let (_, a, _) = bundles();
    let (_dir, models) = models_with(&[("bundle-a", a)]);
    let server = start(&models).await;
    let client = reqwest::Client::new();
    let base = &server.base;

    let body: Value = client
        .post(format!("{base}/v1/predict"))
        .json(&json!({"instances": [instance("vm-1"), instance("vm-2")], "interval_class": true}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let first = &body["predictions"][0];
    assert_eq!(first["model_version"], "a-1");
    assert_eq!(first["source"], "model");
    let p = first["p_long"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&p));
    assert!(first["expected_lifetime_s"].as_f64().unwrap() > 0.0);
    assert!(first["interval_class"].as_u64().is_some());

    let remaining: Value = client
        .post(format!("{base}/v1/remaining-lifetime"))
        .json(&json!({"instances": [{"vm": instance("vm-1"), "uptime_s": 3600.0}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(remaining["predictions"][0]["remaining_lifetime_s"].as_f64().unwrap() >= 1.0);

    // Bad input: a problem body naming the field, 4xx.
    let bad = client
        .post(format!("{base}/v1/predict"))
        .json(&json!({"instances": [{"tenant_id": "t", "vm_type": "D2", "cores": -1, "memory_gib": 8}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 422);
    assert_eq!(bad.headers()["content-type"], "application/problem+json");
    let problem: Value = bad.json().await.unwrap();
    assert_eq!(problem["errors"][0]["field"], "instances[0].cores");
    let too_many: Vec<Value> = (0..501).map(|i| instance(&i.to_string())).collect();
    let status =
        client.post(format!("{base}/v1/predict")).json(&json!({"instances": too_many})).send().await.unwrap().status();
    assert_eq!(status, 422);
    let status = client
        .post(format!("{base}/v1/predict"))
        .body("{")
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 400);

    // Admin routes need the token.
    let status = client.post(format!("{base}/v1/models/reload")).send().await.unwrap().status();
    assert_eq!(status, 401);
    let status = client.post(format!("{base}/v1/models/reload")).bearer_auth(TOKEN).send().await.unwrap().status();
    assert_eq!(status, 200);

    let models_list: Value = client.get(format!("{base}/v1/models")).send().await.unwrap().json().await.unwrap();
    assert_eq!(models_list[0]["state"], "stable");
    let metrics = client.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("inference_predictions_total{model_version=\"a-1\"}"), "{metrics}");
    assert!(metrics.contains("inference_prediction_duration_seconds_bucket"), "{metrics}");
    let openapi: Value = client.get(format!("{base}/openapi.json")).send().await.unwrap().json().await.unwrap();
    assert!(openapi["paths"]["/v1/predict"].is_object());
    assert_eq!(client.get(format!("{base}/healthz")).send().await.unwrap().status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swaps_under_load_and_rejects_a_corrupt_bundle() {
    let (_, a, b) = bundles();
    let (dir, models) = models_with(&[("bundle-a", a)]);
    let server = start(&models).await;
    let base = server.base.clone();

    // Concurrent load for the whole swap.
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(AtomicUsize::new(0));
    let versions = Arc::new(Mutex::new(std::collections::BTreeSet::new()));
    let mut workers = Vec::new();
    for w in 0..4 {
        let (stop, failures, requests, versions, base) =
            (stop.clone(), failures.clone(), requests.clone(), versions.clone(), base.clone());
        workers.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let keys: Vec<String> = (0..8).map(|k| format!("w{w}-{i}-{k}")).collect();
                match predict(&client, &base, &keys).await {
                    Ok(v) => versions.lock().unwrap().extend(v),
                    Err(_) => {
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
                requests.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        }));
    }
    let client = reqwest::Client::new();
    tokio::time::sleep(Duration::from_millis(300)).await;
    copy_bundle(b, &models, "bundle-b"); // newer name, same creation second or later: it wins
    let deadline = Instant::now() + Duration::from_secs(20);
    while served_version(&client, &base).await != "b-1" {
        assert!(Instant::now() < deadline, "the new bundle was never served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A corrupt bundle that would otherwise be the newest: rejected, b-1 keeps answering.
    let staging = dir.path().join("corrupt");
    std::fs::create_dir_all(&staging).unwrap();
    for entry in std::fs::read_dir(b).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), staging.join(entry.file_name())).unwrap();
    }
    let model = std::fs::read_to_string(staging.join(BINARY_MODEL_FILE)).unwrap();
    std::fs::write(staging.join(BINARY_MODEL_FILE), &model[..model.len() / 3]).unwrap();
    let manifest = std::fs::read_to_string(staging.join(MANIFEST_FILE)).unwrap();
    std::fs::write(staging.join(MANIFEST_FILE), manifest.replace("\"b-1\"", "\"c-1\"")).unwrap();
    std::fs::rename(&staging, models.join("bundle-c")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let list: Value = client.get(format!("{base}/v1/models")).send().await.unwrap().json().await.unwrap();
        let states: Vec<(String, String)> = list
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (s["bundle"].as_str().unwrap().to_owned(), s["state"].as_str().unwrap().to_owned()))
            .collect();
        if states.contains(&("bundle-c".to_owned(), "rejected".to_owned())) {
            assert!(states.contains(&("bundle-b".to_owned(), "stable".to_owned())), "{states:?}");
            let reason = list.as_array().unwrap().iter().find(|s| s["bundle"] == "bundle-c").unwrap()["reason"].clone();
            assert!(reason.as_str().unwrap().contains(BINARY_MODEL_FILE), "{reason}");
            break;
        }
        assert!(Instant::now() < deadline, "the corrupt bundle was never rejected: {states:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(served_version(&client, &base).await, "b-1");

    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.await.unwrap();
    }
    let total = requests.load(Ordering::Relaxed);
    let versions = versions.lock().unwrap().clone();
    eprintln!("{total} requests under load, versions served {versions:?}");
    assert_eq!(failures.load(Ordering::Relaxed), 0, "requests failed during the swap");
    assert!(total > 20, "{total}");
    assert!(versions.contains("a-1") && versions.contains("b-1"), "{versions:?}");
    assert!(!versions.contains("c-1"));
}

async fn canary_share(client: &reqwest::Client, base: &str, canary: &str, n: usize) -> f64 {
    let mut hits = 0;
    for chunk in (0..n).collect::<Vec<_>>().chunks(250) {
        let keys: Vec<String> = chunk.iter().map(|i| format!("vm-{i}")).collect();
        let versions = predict(client, base, &keys).await.unwrap();
        hits += versions.iter().filter(|v| *v == canary).count();
    }
    hits as f64 / n as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canary_share_promotion_and_rollback() {
    let (_, a, b) = bundles();
    let (_dir, models) = models_with(&[("bundle-a", a), ("bundle-b", b)]);
    std::fs::write(models.join("rollout.toml"), "stable = \"bundle-a\"\n").unwrap();
    let server = start(&models).await;
    let client = reqwest::Client::new();
    let base = &server.base;
    assert_eq!(served_version(&client, base).await, "a-1");

    // By the admin API.
    let response = client
        .post(format!("{base}/v1/models/canary"))
        .bearer_auth(TOKEN)
        .json(&json!({"bundle": "bundle-b", "share": 0.25}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let share = canary_share(&client, base, "b-1", 4_000).await;
    eprintln!("canary share measured {share:.3} for 0.25 configured");
    assert!((share - 0.25).abs() < 0.03, "measured canary share {share}");
    // Routing is stable: the same keys land on the same side again.
    assert_eq!(canary_share(&client, base, "b-1", 4_000).await, share);
    let written = std::fs::read_to_string(models.join("rollout.toml")).unwrap();
    assert!(written.contains("bundle-b") && written.contains("0.25"), "{written}");

    let bad = client
        .post(format!("{base}/v1/models/canary"))
        .bearer_auth(TOKEN)
        .json(&json!({"bundle": "no-such-bundle", "share": 0.5}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 422);

    assert_eq!(
        client.post(format!("{base}/v1/models/rollback")).bearer_auth(TOKEN).send().await.unwrap().status(),
        200
    );
    assert_eq!(canary_share(&client, base, "b-1", 1_000).await, 0.0);

    // By file, written the way an operator should: to a temporary name, then renamed into place.
    std::fs::write(
        models.join(".rollout.edit"),
        "stable = \"bundle-a\"\n[canary]\nbundle = \"bundle-b\"\nshare = 0.5\n",
    )
    .unwrap();
    std::fs::rename(models.join(".rollout.edit"), models.join("rollout.toml")).unwrap();
    // Wait for the watcher to apply it, then measure.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let list: Value = client.get(format!("{base}/v1/models")).send().await.unwrap().json().await.unwrap();
        if list.as_array().unwrap().iter().any(|s| s["state"] == "canary" && s["canary_share"] == 0.5) {
            break;
        }
        assert!(Instant::now() < deadline, "the rollout file was never applied: {list}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let share = canary_share(&client, base, "b-1", 4_000).await;
    eprintln!("canary share measured {share:.3} for 0.5 configured by file");
    assert!((share - 0.5).abs() < 0.04, "measured canary share {share}");

    assert_eq!(client.post(format!("{base}/v1/models/promote")).bearer_auth(TOKEN).send().await.unwrap().status(), 200);
    assert_eq!(canary_share(&client, base, "b-1", 1_000).await, 1.0);
    let list: Value = client.get(format!("{base}/v1/models")).send().await.unwrap().json().await.unwrap();
    let stable: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["state"] == "stable")
        .map(|s| s["bundle"].as_str().unwrap())
        .collect();
    assert_eq!(stable, ["bundle-b"]);
}
