//! Realized prediction quality through the real `allocator` binary: outcomes resolve on the
//! model's clock (request and exit times, not the allocator's), per model version, and the VMs
//! awaiting theirs survive a restart.

use crate::support;

use serde_json::{json, Value};
use support::{send, start, vm};

/// A VM placed with a model's prediction, requested at `at_s` on the model's clock.
fn predicted(id: &str, version: &str, p_long: f64, at_s: f64) -> Value {
    let mut vm = vm(id, "t1", 1.0, 2.0);
    vm["requested_at_s"] = json!(at_s);
    vm["prediction"] = json!({
        "p_long": p_long,
        "class": if p_long >= 0.5 { "long" } else { "short" },
        "expected_lifetime_s": if p_long >= 0.5 { 36_000.0 } else { 360.0 },
        "model_version": version,
        "source": "model",
    });
    vm
}

fn figures<'a>(report: &'a Value, version: &str) -> &'a Value {
    report["versions"].as_array().unwrap().iter().find(|v| v["version"] == version).unwrap()
}

#[tokio::test]
async fn outcomes_resolve_on_the_models_clock_per_version_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("a.db");
    let server = start(&store, 4, "[quality]\nlong_threshold_s = 7200.0\n").await;
    let client = reqwest::Client::new();
    let place = |body: Value| client.post(server.url("/v1/allocations")).json(&json!({ "vm": body }));
    // Stable: a right long (runs past 2 h), a right short (exits after 6 min), a wrong long.
    for body in [
        predicted("s-long", "stable", 0.9, 1_000.0),
        predicted("s-short", "stable", 0.1, 1_000.0),
        predicted("s-wrong", "stable", 0.8, 1_000.0),
        predicted("c-long", "canary", 0.2, 1_000.0),
        vm("unpredicted", "t1", 1.0, 2.0),
    ] {
        assert_eq!(send(place(body)).await.0, 201);
    }
    let release = |id: &str, at: f64| client.delete(server.url(&format!("/v1/allocations/{id}?ended_at_s={at}")));
    assert_eq!(send(release("s-short", 1_360.0)).await.0, 204);
    assert_eq!(send(release("s-wrong", 2_000.0)).await.0, 204);
    let (status, problem) = send(release("s-long", f64::NAN)).await;
    assert_eq!(status, 422, "{problem}");
    assert_eq!(problem["errors"][0]["field"], "ended_at_s");

    // Resolved, but their cohort (started at 1,000) completes only 2 h later.
    let (_, report) = send(client.get(server.url("/v1/quality"))).await;
    let stable = figures(&report, "stable");
    assert_eq!((stable["resolved_total"].as_u64(), stable["pending"].as_u64()), (Some(0), Some(3)), "{report}");
    // A request 2 h after the others: s-long outlived the threshold, the cohort is complete.
    let late = predicted("late", "stable", 0.1, 8_300.0);
    assert_eq!(send(place(late)).await.0, 201);
    let (_, report) = send(client.get(server.url("/v1/quality"))).await;
    let stable = figures(&report, "stable");
    assert_eq!(stable["resolved_total"], 3, "{report}");
    assert_eq!(stable["figures"]["precision"], 0.5, "s-wrong lived 1,000 s: predicted long, was short");
    assert_eq!(stable["figures"]["recall"], 1.0);

    // Restart: the allocator's store keeps the running VMs' predictions and request times, so
    // they await their outcomes again (the windows start empty).
    drop(server);
    let server = start(&store, 4, "").await;
    let client = reqwest::Client::new();
    let later = predicted("later", "stable", 0.1, 8_400.0);
    assert_eq!(send(client.post(server.url("/v1/allocations")).json(&json!({ "vm": later }))).await.0, 201);
    let (_, report) = send(client.get(server.url("/v1/quality"))).await;
    let stable = figures(&report, "stable");
    assert_eq!(stable["resolved_total"], 1, "s-long, placed before the restart: {report}");
    assert_eq!(stable["figures"]["realized_long_share"], 1.0);
    let canary = figures(&report, "canary");
    assert_eq!((canary["resolved_total"].as_u64(), canary["figures"]["recall"].as_f64()), (Some(1), Some(0.0)));
    assert_eq!(report["clock_s"], 8_400.0);

    let metrics = client.get(server.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(
        metrics.lines().any(|l| l.starts_with("allocator_prediction_quality{")
            && l.contains("version=\"canary\"")
            && l.contains("figure=\"recall\"")),
        "{metrics}"
    );
}
