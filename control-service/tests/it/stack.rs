//! End-to-end tests of the whole stack: the real `inference-server`, `allocator` and
//! `control-service` binaries on loopback, talking HTTP. They cover the happy path (predictions,
//! cache hits, placement, rejection, release, replays, bad input), the inference server killed
//! mid-run, an injected slow inference server, and a model that calls everything long-lived.

use serde_json::{json, Value};
use std::time::Duration;
use test_support::stack::{default_models, start_allocator, start_control, start_inference, vm};

async fn post(client: &reqwest::Client, url: &str, body: &Value) -> (u16, Value) {
    let response = client.post(url).json(body).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn get_json(client: &reqwest::Client, url: &str) -> Value {
    client.get(url).send().await.unwrap().json().await.unwrap()
}

fn source(decision: &Value) -> &str {
    decision["predictions"][0]["prediction"]["source"].as_str().unwrap_or("?")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn happy_path_predicts_caches_places_rejects_and_releases() {
    let dir = tempfile::tempdir().unwrap();
    let inference = start_inference(dir.path(), &default_models(dir.path())).await;
    let allocator = start_allocator(dir.path(), 4).await;
    let control = start_control(dir.path(), &[&inference.base], &allocator.base, 2_000, "").await;
    let client = reqwest::Client::new();
    let allocate = control.url("/v1/allocate");

    // A gang of two is placed whole, with one prediction per VM; the request id comes back.
    let gang = json!({"gang": {"tenant_id": "t2", "vms": [vm("g-0", "t2", "D2", 2.0)["vm"], vm("g-1", "t2", "D2", 2.0)["vm"]]}});
    let response = client.post(&allocate).header("x-request-id", "e2e-gang").json(&gang).send().await.unwrap();
    assert_eq!(response.status(), 201);
    assert_eq!(response.headers()["x-request-id"], "e2e-gang");
    let decision: Value = response.json().await.unwrap();
    assert_eq!(decision["placements"].as_array().unwrap().len(), 2);
    assert_eq!(decision["predictions"].as_array().unwrap().len(), 2);
    assert_eq!(decision["zone"], "zone-1");

    // The first VM of a type asks the model; the same features again hit the cache.
    let (status, first) = post(&client, &allocate, &vm("a-0", "t1", "D4", 4.0)).await;
    assert_eq!(status, 201, "{first}");
    assert_eq!(source(&first), "model");
    assert_eq!(first["predictions"][0]["prediction"]["model_version"], "default-1");
    let latency = &first["latency_us"];
    assert!(latency["inference_us"].as_u64().unwrap() > 0);
    assert!(latency["total_us"].as_u64().unwrap() >= latency["allocator_us"].as_u64().unwrap());
    for i in 1..15 {
        let (status, decision) = post(&client, &allocate, &vm(&format!("a-{i}"), "t1", "D4", 4.0)).await;
        assert_eq!(status, 201, "{decision}");
        assert_eq!(source(&decision), "cache");
        assert_eq!(decision["latency_us"]["inference_us"], 0);
        assert_eq!(decision["placements"][0]["prediction"]["source"], "cache");
    }
    // 4 hosts x 16 cores are now full: the next VM is rejected, a normal answer.
    let (status, rejected) = post(&client, &allocate, &vm("a-15", "t1", "D4", 4.0)).await;
    assert_eq!(status, 200);
    assert_eq!(rejected["status"], "rejected");
    assert_eq!(rejected["rejection"]["code"], "no_feasible_host");

    // Release frees capacity; a second release and a lookup of the released VM are 404.
    let placed_on = get_json(&client, &control.url("/allocate/a-3")).await["host_id"].clone();
    assert!(placed_on.is_string());
    assert_eq!(client.delete(control.url("/allocate/a-3")).send().await.unwrap().status(), 204);
    assert_eq!(client.delete(control.url("/allocate/a-3")).send().await.unwrap().status(), 404);
    assert_eq!(client.get(control.url("/allocate/a-3?zone=zone-1")).send().await.unwrap().status(), 404);
    // The rejected request again, within 30 s, is a client's retry: the first answer, replayed.
    let (status, decision) = post(&client, &allocate, &vm("a-15", "t1", "D4", 4.0)).await;
    assert_eq!((status, &decision["status"], &decision["replayed"]), (200, &json!("rejected"), &json!(true)));
    // A new request takes the freed room.
    let (status, decision) = post(&client, &allocate, &vm("a-16", "t1", "D4", 4.0)).await;
    assert_eq!(status, 201, "{decision}");
    assert_eq!(decision["placements"][0]["host_id"], placed_on);
    // A retry of a placed VM is answered with the earlier decision, placing nothing twice.
    let (status, replay) = post(&client, &control.url("/allocate"), &vm("a-4", "t1", "D4", 4.0)).await;
    assert_eq!((status, &replay["replayed"]), (200, &json!(true)));

    // Bad input is refused with a problem naming the field, and changes nothing.
    let before = get_json(&client, &control.url("/v1/stats")).await;
    let mut with_prediction = vm("b-0", "t1", "D4", 4.0);
    with_prediction["vm"]["prediction"] = json!({"p_long": 1.0, "class": "long", "source": "model"});
    let (status, problem) = post(&client, &allocate, &with_prediction).await;
    assert_eq!((status, problem["errors"][0]["field"].as_str()), (422, Some("vm.prediction")));
    let mut other_zone = vm("b-0", "t1", "D4", 4.0);
    other_zone["vm"]["zone"] = json!("zone-9");
    let (status, problem) = post(&client, &allocate, &other_zone).await;
    assert_eq!((status, problem["errors"][0]["field"].as_str()), (422, Some("vm.zone")));
    let (status, problem) = post(&client, &allocate, &json!({"vm": {"vm_id": "b-0"}})).await;
    assert_eq!(status, 400, "{problem}");
    let response = client.post(&allocate).body("{}").send().await.unwrap();
    assert_eq!(response.status(), 415);
    let after = get_json(&client, &control.url("/v1/stats")).await;
    assert_eq!(after["requests"], before["requests"]);
    assert_eq!(after["zones"]["zone-1"]["stats"]["vms"], before["zones"]["zone-1"]["stats"]["vms"]);

    // Statistics and metrics tell the same story.
    // Placed answers: the gang, a-0..a-14, a-16 after the release, and the replay of a-4; rejected:
    // a-15 and its retry.
    assert_eq!(after["placed"], 18);
    assert_eq!(after["rejected"], 2);
    assert_eq!(after["zones"]["zone-1"]["stats"]["vms"], 17);
    // Hits: a-1..a-14, a-15 twice, a-16 and the replay of a-4 (the gang's second VM shared its
    // first's model call within the request).
    assert_eq!(after["cache"]["hits"], 18, "{after}");
    assert_eq!(after["predictions_by_source"], json!({"cache": 18, "model": 3}));
    assert!(after["cache"]["hit_rate"].as_f64().unwrap() > 0.8);
    assert_eq!(after["fallbacks"], json!({}));
    let metrics = client.get(control.url("/metrics")).send().await.unwrap().text().await.unwrap();
    for needle in [
        "control_cache_hit_ratio",
        "control_predictions_total{source=\"cache\"} 18",
        "control_stage_duration_seconds_bucket{stage=\"allocator\"",
        "control_stage_duration_seconds_count{stage=\"inference\"}",
        "control_safeguard_active 0",
        "control_requests_total{outcome=\"rejected\"} 2",
    ] {
        assert!(metrics.contains(needle), "/metrics lacks `{needle}`:\n{metrics}");
    }
    let openapi = get_json(&client, &control.url("/openapi.json")).await;
    assert!(openapi["paths"]["/allocate"]["post"].is_object());
}

/// No wall-clock bound is asserted: the budget is generous, so a live server's answers come from
/// the model however loaded the machine is, and a dead server's requests fall back at once
/// (refused connections, then no server in rotation), never by waiting out the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_inference_server_mid_run_falls_back_without_failing_an_allocation() {
    const BUDGET_MS: u64 = 2_000;
    let dir = tempfile::tempdir().unwrap();
    let mut inference = start_inference(dir.path(), &default_models(dir.path())).await;
    let allocator = start_allocator(dir.path(), 40).await;
    let control = start_control(dir.path(), &[&inference.base], &allocator.base, BUDGET_MS, "").await;
    let client = reqwest::Client::new();
    let mut sources = Vec::new();
    for i in 0..40 {
        if i == 15 {
            inference.kill();
        }
        // A tenant of its own per VM: every request misses the cache and needs the model.
        let (status, decision) =
            post(&client, &control.url("/allocate"), &vm(&format!("k-{i}"), &format!("t{i}"), "D2", 2.0)).await;
        assert_eq!(status, 201, "request {i}: {decision}");
        sources.push(source(&decision).to_owned());
    }
    assert!(sources[..15].iter().all(|s| s == "model"), "{sources:?}");
    assert!(sources[15..].iter().all(|s| s == "fallback_error" || s == "fallback_unavailable"), "{sources:?}");
    let stats = get_json(&client, &control.url("/v1/stats")).await;
    let fallbacks = &stats["fallbacks"];
    let counted = fallbacks["error"].as_u64().unwrap_or(0) + fallbacks["unavailable"].as_u64().unwrap_or(0);
    assert_eq!(counted, 25, "{stats}");
    assert_eq!(stats["placed"], 40);
    // Once the probes have seen it down, the server is reported unhealthy and no longer called.
    let mut stats = get_json(&client, &control.url("/v1/stats")).await;
    for _ in 0..200 {
        if stats["inference_servers"][0]["healthy"] == false {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        stats = get_json(&client, &control.url("/v1/stats")).await;
    }
    assert_eq!(stats["inference_servers"][0]["healthy"], false, "{stats}");
    let (_, decision) = post(&client, &control.url("/allocate"), &vm("k-last", "t-last", "D2", 2.0)).await;
    assert_eq!(source(&decision), "fallback_unavailable", "no server in rotation: none is called");
}

/// An inference server that answers only after `delay`: ready, but too slow for the budget.
async fn slow_inference_server(delay: Duration) -> String {
    use axum::routing::{get, post};
    let app = axum::Router::new()
        .route(
            "/v1/predict",
            post(move || async move {
                tokio::time::sleep(delay).await;
                axum::http::StatusCode::SERVICE_UNAVAILABLE
            }),
        )
        .route("/readyz", get(|| async { "ready" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{address}")
}

/// The server never answers in time (it waits a minute); every request still gets its decision,
/// as short-lived, after waiting out the budget and no longer: the test client gives up after 30 s,
/// half the server's delay. No upper bound on the wait is asserted (the machine is shared).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_inference_server_times_out_into_short_lived_fallbacks() {
    const BUDGET_MS: u64 = 40;
    let dir = tempfile::tempdir().unwrap();
    let slow = slow_inference_server(Duration::from_secs(60)).await;
    let allocator = start_allocator(dir.path(), 10).await;
    let control = start_control(dir.path(), &[&slow], &allocator.base, BUDGET_MS, "").await;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
    for i in 0..5 {
        let (status, decision) =
            post(&client, &control.url("/allocate"), &vm(&format!("s-{i}"), "t1", "D2", 2.0)).await;
        assert_eq!(status, 201, "{decision}");
        assert_eq!(source(&decision), "fallback_timeout");
        assert_eq!(decision["predictions"][0]["prediction"]["class"], "short");
        let waited = decision["latency_us"]["inference_us"].as_u64().unwrap();
        assert!(waited >= BUDGET_MS * 1_000, "the budget was waited out: inference stage {waited} us");
    }
    let stats = get_json(&client, &control.url("/v1/stats")).await;
    assert_eq!(stats["fallbacks"], json!({"timeout": 5}));
    // Timeouts are not cached: the slow server was asked every time.
    assert_eq!(stats["cache"]["entries"], 0);
    // A slow server stays in rotation (it is up, only slow).
    assert_eq!(stats["inference_servers"][0]["healthy"], true);
}

/// A bundle trained with a one-minute threshold: almost every VM lives longer, so the model calls
/// everything long-lived.
fn all_long_models(dir: &std::path::Path) -> std::path::PathBuf {
    use lifetime_train::train::{train_bundle, TrainConfig, TrainData};
    use traces::synthetic::{generate, SyntheticConfig};
    let records = generate(&SyntheticConfig { span_days: 3.0, seed: 11, ..SyntheticConfig::default() });
    let config = TrainConfig {
        version: "all-long-1".into(),
        long_threshold_s: 60.0,
        iterations: 20,
        max_remaining_vms: 5_000,
        ..TrainConfig::default()
    };
    let models = dir.join("models");
    let data = TrainData { source: "synthetic seed 11".into(), train: records, eval: None, trace_end_s: None };
    train_bundle(data, &config, &models.join("all-long"), &()).unwrap();
    models
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_calls_everything_long_trips_the_safeguard_which_later_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let inference = start_inference(dir.path(), &all_long_models(dir.path())).await;
    let allocator = start_allocator(dir.path(), 20).await;
    let safeguard =
        "[safeguard]\nenabled = true\nwindow_s = 60\nthreshold = 0.5\nmin_predictions = 5\ncooldown_s = 2\n\
         established_after_s = 0\n\
                     [cache]\nmax_entries = 0\n";
    let control = start_control(dir.path(), &[&inference.base], &allocator.base, 2_000, safeguard).await;
    let client = reqwest::Client::new();
    for i in 0..5 {
        let (status, decision) =
            post(&client, &control.url("/allocate"), &vm(&format!("l-{i}"), "t1", "D2", 2.0)).await;
        assert_eq!(status, 201, "{decision}");
        assert_eq!(source(&decision), "model");
        assert_eq!(decision["predictions"][0]["prediction"]["class"], "long", "{decision}");
    }
    // Five long of five: tripped. Everything is short-lived now, without asking the model.
    let stats = get_json(&client, &control.url("/v1/stats")).await;
    assert_eq!(stats["safeguard"]["active"], true, "{stats}");
    assert_eq!(stats["safeguard"]["trips"], 1);
    for i in 5..8 {
        let (status, decision) =
            post(&client, &control.url("/allocate"), &vm(&format!("l-{i}"), "t1", "D2", 2.0)).await;
        assert_eq!(status, 201);
        assert_eq!(source(&decision), "safeguard");
        assert_eq!(decision["placements"][0]["prediction"]["class"], "short");
        assert_eq!(decision["latency_us"]["inference_us"], 0);
    }
    let metrics = client.get(control.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("control_safeguard_active 1"), "{metrics}");
    assert!(metrics.contains("control_fallbacks_total{reason=\"safeguard\"} 3"), "{metrics}");
    // After the cooldown the model is trusted again.
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    let (_, decision) = post(&client, &control.url("/allocate"), &vm("l-8", "t1", "D2", 2.0)).await;
    assert_eq!(source(&decision), "model");
    let stats = get_json(&client, &control.url("/v1/stats")).await;
    assert_eq!(stats["safeguard"]["active"], false);
    assert_eq!(
        (stats["safeguard"]["trips"].as_u64(), stats["safeguard"]["window_predictions"].as_u64()),
        (Some(1), Some(1))
    );
}
