//! The learning loop's watch on realized quality, end to end with the real binaries (issue 18):
//! bundles trained by our trainer on a synthetic trace, VMs of a later day replayed through the
//! control service (model clock = trace time), outcomes resolved by the allocator and read back by
//! the control service.
//! - A deliberately bad bundle (labels shuffled at training) is gated within a stated number of
//!   resolved VMs, allocations keep succeeding, and the gate opens when a good bundle is rolled out.
//! - A better canary with `auto = true` is promoted, a worse one rolled back.

use lifetime_model::dataset::shuffle_lifetimes;
use lifetime_train::train::{train_bundle, TrainConfig, TrainData};
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};
use test_support::process::Process;
use test_support::stack::*;
use traces::synthetic::{generate, SyntheticConfig};
use traces::VmRecord;

const DAY: f64 = 86_400.0;
const ADMIN: &str = "inference-admin-token";

/// Six days of a synthetic trace: bundles train on the first four.
fn trace() -> Vec<VmRecord> {
    let config = SyntheticConfig {
        seed: 5,
        span_days: 6.0,
        requests_per_hour: 150.0,
        tenants: 300,
        ..SyntheticConfig::default()
    };
    let mut records = generate(&config);
    records.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
    records
}

/// Trains a small bundle `name` (version `<name>-1`) into `models/<name>`; with `shuffle`, on
/// lifetimes dealt out at random (a bad bundle).
fn train(records: &[VmRecord], models: &Path, name: &str, shuffle: Option<u64>) {
    let mut train: Vec<VmRecord> = records.iter().filter(|r| r.start_s < 4.0 * DAY).cloned().collect();
    if let Some(seed) = shuffle {
        shuffle_lifetimes(&mut train, seed);
    }
    let config = TrainConfig {
        name: name.to_owned(),
        version: format!("{name}-1"),
        iterations: 30,
        num_leaves: 15,
        max_remaining_vms: 3_000,
        ..TrainConfig::default()
    };
    let data = TrainData { source: "synthetic seed 5".into(), train, eval: None, trace_end_s: Some(4.0 * DAY) };
    train_bundle(data, &config, &models.join(name), &()).unwrap();
}

/// Replays the VMs arriving in [from_s, to_s) in time order (releases at their ends inside the
/// window), pausing `pause` every `chunk` requests so that the control service's quality polls
/// keep up; `after_chunk` sees the control service's statistics after each pause. Answers the
/// allocation replies' prediction sources and model versions.
async fn replay(
    control: &Process,
    records: &[VmRecord],
    (from_s, to_s): (f64, f64),
    chunk: usize,
    pause: Duration,
    mut after_chunk: impl FnMut(&Value) -> bool,
) -> Vec<(String, String)> {
    let window: Vec<&VmRecord> = records.iter().filter(|r| r.start_s >= from_s && r.start_s < to_s).collect();
    let mut events: Vec<(f64, bool, usize)> = Vec::new();
    for (i, record) in window.iter().enumerate() {
        events.push((record.start_s, true, i));
        if let Some(end) = record.end_s.filter(|end| *end < to_s) {
            events.push((end, false, i));
        }
    }
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let client = reqwest::Client::new();
    let mut answers = Vec::new();
    for (n, (at_s, arrival, i)) in events.into_iter().enumerate() {
        let record = window[i];
        if arrival {
            let body = json!({"vm": {
                "vm_id": record.vm_id, "tenant_id": record.tenant_id, "vm_type": record.vm_type,
                "demand": {"cores": record.cores, "memory_gib": record.memory_gib},
                "requested_at_s": at_s
            }});
            let response = client.post(control.url("/v1/allocate")).json(&body).send().await.unwrap();
            let status = response.status();
            let decision: Value = response.json().await.unwrap();
            assert!(
                status == 201 || decision["status"] == "rejected",
                "every allocation succeeds: {status} {decision}"
            );
            if let Some(prediction) = decision["placements"].get(0).map(|p| &p["prediction"]) {
                let field = |name: &str| prediction[name].as_str().unwrap_or_default().to_owned();
                answers.push((field("source"), field("model_version")));
            }
        } else {
            let url = control.url(&format!("/v1/allocate/{}?ended_at_s={at_s}", record.vm_id));
            let status = client.delete(url).send().await.unwrap().status();
            assert!(status == 204 || status == 404, "release: {status}");
        }
        if (n + 1) % chunk == 0 {
            tokio::time::sleep(pause).await;
            if after_chunk(&stats(control).await) {
                break;
            }
        }
    }
    answers
}

async fn stats(control: &Process) -> Value {
    reqwest::get(control.url("/v1/stats")).await.unwrap().json().await.unwrap()
}

fn version<'a>(stats: &'a Value, name: &str) -> Option<&'a Value> {
    stats["quality"]["versions"].as_array()?.iter().find(|v| v["version"] == name)
}

/// Waits until `check` holds of the control service's statistics.
async fn wait_for(control: &Process, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stats = stats(control).await;
        if check(&stats) {
            return stats;
        }
        assert!(Instant::now() < deadline, "{what}: {:#}", stats["quality"]);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn write_rollout(models: &Path, text: &str) {
    std::fs::write(models.join("rollout.toml"), text).unwrap();
}

const MIN_RESOLVED: u64 = 150;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_bundle_is_gated_on_its_realized_quality_and_a_good_one_opens_the_gate() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    let records = trace();
    train(&records, &models, "bad", Some(1));
    train(&records, &models, "good", None);
    write_rollout(&models, "stable = \"bad\"\n");
    let inference = start_inference_with(dir.path(), &models, "watch_interval_ms = 200").await;
    let allocator = start_allocator(dir.path(), 600).await;
    let control = start_control(
        dir.path(),
        &[&inference.url("")],
        &allocator.url(""),
        1_000,
        &format!(
            "[quality]\npoll_ms = 100\nmin_resolved = {MIN_RESOLVED}\nmin_precision = 0.5\n\
             min_average_precision = 0.5\nhysteresis = 0.02\n"
        ),
    )
    .await;

    // A day after the bundles' data: replay until the gate closes.
    let from_s = 4.5 * DAY;
    let mut closed_at: Option<Value> = None;
    let answers = replay(&control, &records, (from_s, from_s + 10.0 * 3_600.0), 40, Duration::from_millis(250), |s| {
        if s["quality"]["gated"] == true && closed_at.is_none() {
            closed_at = Some(s.clone());
        }
        false
    })
    .await;
    let closed = closed_at.expect("the gate closed on the bad bundle");
    let reason = closed["quality"]["reason"].as_str().unwrap().to_owned();
    // The gate judged the first window of at least MIN_RESOLVED VMs the polls saw.
    let resolved_when_closed: u64 =
        reason.split(" over ").nth(1).and_then(|rest| rest.split(' ').next()).and_then(|n| n.parse().ok()).unwrap();
    println!("gate closed: {reason}");
    assert!(reason.contains("bad-1"), "{reason}");
    assert!(
        (MIN_RESOLVED..MIN_RESOLVED + 200).contains(&resolved_when_closed),
        "closed after {resolved_when_closed} resolved VMs"
    );
    // Allocations went on; after the gate closed the bad model's answers are shadows.
    let gated = answers.iter().filter(|(source, version)| source == "quality_gate" && version == "bad-1").count();
    assert!(gated > 50, "{gated} gated answers of {}", answers.len());
    assert!(answers.last().is_some_and(|(source, _)| source == "quality_gate"), "{:?}", answers.last());

    // The good bundle becomes stable: the gate opens for it.
    write_rollout(&models, "stable = \"good\"\n");
    let opened = wait_for(&control, "the gate opens for the good bundle", |s| {
        s["quality"]["stable_version"] == "good-1" && s["quality"]["gated"] == false
    })
    .await;
    assert_eq!(opened["quality"]["trips"], 1);
    let answers = replay(
        &control,
        &records,
        (from_s + 10.0 * 3_600.0, from_s + 20.0 * 3_600.0),
        40,
        Duration::from_millis(50),
        |_| false,
    )
    .await;
    assert!(answers.iter().all(|(source, _)| source != "quality_gate"), "the good model is not gated");
    assert!(answers.iter().any(|(source, version)| source == "model" && version == "good-1"));
    let after = wait_for(&control, "the good model's window fills", |s| {
        version(s, "good-1").is_some_and(|v| v["figures"]["resolved"].as_u64() >= Some(MIN_RESOLVED))
    })
    .await;
    let (good, bad) = (version(&after, "good-1").unwrap(), version(&after, "bad-1").unwrap());
    println!("good: {:#}\nbad: {:#}", good["figures"], bad["figures"]);
    assert_eq!(after["quality"]["gated"], false, "{:#}", after["quality"]);
    let ap = |v: &Value| v["figures"]["average_precision"].as_f64().unwrap();
    assert!(ap(good) > ap(bad) + 0.1, "good {} vs bad {}", ap(good), ap(bad));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_better_canary_is_promoted_and_a_worse_one_rolled_back_on_evidence() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    let records = trace();
    train(&records, &models, "bad", Some(1));
    train(&records, &models, "good", None);
    train(&records, &models, "worse", Some(2));
    write_rollout(
        &models,
        "stable = \"bad\"\n[canary]\nbundle = \"good\"\nshare = 0.5\nauto = true\nmin_resolved = 100\nmargin = 0.01\n",
    );
    let inference =
        start_inference_with(dir.path(), &models, &format!("watch_interval_ms = 200\nadmin_token = \"{ADMIN}\"")).await;
    let allocator = start_allocator(dir.path(), 600).await;
    let control = start_control(
        dir.path(),
        &[&inference.url("")],
        &allocator.url(""),
        1_000,
        // Only the canary is judged here: the gate stays out of it, and so does the long-share
        // safeguard (every tenant of a compressed replay is new to this control service within
        // seconds, and the newcomers' window would place them all as short-lived whatever the
        // models say).
        &format!(
            "[quality]\npoll_ms = 100\ngate = false\ninference_admin_token = \"{ADMIN}\"\n[safeguard]\nenabled = false\n"
        ),
    )
    .await;

    let from_s = 4.5 * DAY;
    let promoted = |s: &Value| s["quality"]["last_canary_decision"]["verdict"] == "promote";
    let answers =
        replay(&control, &records, (from_s, from_s + 12.0 * 3_600.0), 40, Duration::from_millis(150), promoted).await;
    // Both versions served (the canary half of the routing keys).
    for served in ["bad-1", "good-1"] {
        assert!(answers.iter().filter(|(_, version)| version == served).count() > 200, "{served}");
    }
    let stats = wait_for(&control, "the better canary is promoted", |s| {
        promoted(s) && s["quality"]["stable_version"] == "good-1"
    })
    .await;
    let decision = &stats["quality"]["last_canary_decision"];
    println!("promoted: {decision:#}");
    assert_eq!(decision["applied"], true, "{decision}");
    assert!(decision["canary_average_precision"].as_f64() > decision["stable_average_precision"].as_f64());
    assert!(decision["canary_resolved"].as_u64() >= Some(100) && decision["stable_resolved"].as_u64() >= Some(100));
    let rollout = std::fs::read_to_string(models.join("rollout.toml")).unwrap();
    assert!(rollout.contains("stable = \"good\"") && !rollout.contains("[canary]"), "{rollout}");

    // A worse canary next to the good stable bundle: rolled back.
    write_rollout(
        &models,
        "stable = \"good\"\n[canary]\nbundle = \"worse\"\nshare = 0.5\nauto = true\nmin_resolved = 100\n",
    );
    wait_for(&control, "the worse canary serves", |s| s["quality"]["canary_version"] == "worse-1").await;
    let rolled_back = |s: &Value| s["quality"]["last_canary_decision"]["verdict"] == "rollback";
    replay(
        &control,
        &records,
        (from_s + 12.0 * 3_600.0, from_s + 30.0 * 3_600.0),
        40,
        Duration::from_millis(150),
        rolled_back,
    )
    .await;
    let stats = wait_for(&control, "the worse canary is rolled back", |s| {
        rolled_back(s) && s["quality"]["canary_version"].is_null()
    })
    .await;
    let decision = &stats["quality"]["last_canary_decision"];
    println!("rolled back: {decision:#}");
    assert_eq!((decision["canary_version"].as_str(), decision["applied"].as_bool()), (Some("worse-1"), Some(true)));
    assert!(
        decision["canary_average_precision"].as_f64().unwrap()
            < decision["stable_average_precision"].as_f64().unwrap() - 0.01
    );
    assert_eq!(stats["quality"]["stable_version"], "good-1");
}
