//! End-to-end latency of `POST /allocate` through the real stack on loopback (inference server on
//! the default model, allocator with a durable store, control service), at a fixed request rate.
//!
//! Scenarios, each with the same paced open-loop client (reqwest, kept-alive pool):
//! - floor: `GET /healthz` of the control service, a bare HTTP round trip through the same stack of
//!   tower layers;
//! - allocator direct: `POST /v1/allocations` to the allocator with the prediction already filled
//!   in, what the control service adds its work to;
//! - cache hits: every VM has the same features, so after the first the prediction is cached;
//! - cache misses: every VM is of a new tenant, so each request asks the inference server;
//! - cache misses, frozen history: the same through a second control service and inference server
//!   with the learning loop off: the live tenant history (`[inference] history = false`, `[history]
//!   live = false`) and the quality watch (`[quality] enabled = false`: no polling of the zones'
//!   realized quality, no gate). The cost of the loop on the hot path is the difference of the two.
//!   The two run one after the other, twice, in alternation. (The allocator they share resolves
//!   outcomes for both: that part's cost is `cargo bench -p placement --bench outcomes`.)
//!
//! Every placed VM is released right after (not timed), so the zone never fills.
//!
//! `cargo bench -p control-service --bench e2e_latency -- [requests per scenario] [rate per s]`

#[path = "../tests/support/mod.rs"]
mod support;

use serde_json::{json, Value};
use std::time::{Duration, Instant};

struct Sample {
    client_us: Vec<u64>,
    stages: Vec<[u64; 5]>,
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn ms(us: u64) -> String {
    format!("{:.3}", us as f64 / 1_000.0)
}

/// Sends `count` requests made by `make` at `rate` per second (open loop: a slow answer does not
/// delay the next send), then releases what was placed: request `i` placed VM `vm_id(first_id + i)`.
async fn run<F>(client: &reqwest::Client, count: usize, rate: f64, release: Option<(&str, usize)>, make: F) -> Sample
where
    F: Fn(usize) -> reqwest::RequestBuilder,
{
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = Vec::with_capacity(count);
    for i in 0..count {
        ticker.tick().await;
        let request = make(i);
        tasks.push(tokio::spawn(async move {
            let started = Instant::now();
            let response = request.send().await.expect("request failed");
            let status = response.status();
            let body = response.bytes().await.expect("body");
            let elapsed = started.elapsed().as_micros() as u64;
            assert!(status.is_success(), "HTTP {status}: {}", String::from_utf8_lossy(&body));
            (elapsed, serde_json::from_slice::<Value>(&body).ok())
        }));
    }
    let mut sample = Sample { client_us: Vec::with_capacity(count), stages: Vec::new() };
    for (i, task) in tasks.into_iter().enumerate() {
        let (elapsed, body) = task.await.expect("task");
        sample.client_us.push(elapsed);
        if let Some(latency) = body.as_ref().map(|b| &b["latency_us"]).filter(|l| l.is_object()) {
            let stage = |name: &str| latency[name].as_u64().unwrap_or(0);
            sample.stages.push([
                stage("validate_us"),
                stage("cache_us"),
                stage("inference_us"),
                stage("allocator_us"),
                stage("total_us"),
            ]);
        }
        if let Some((base, first_id)) = release {
            let released = client.delete(format!("{base}/{}", vm_id(first_id + i))).send().await;
            assert_eq!(released.map(|r| r.status().as_u16()).ok(), Some(204), "release of request {i}");
        }
    }
    sample.client_us.sort_unstable();
    sample
}

fn vm_id(i: usize) -> String {
    format!("bench-{}-{i}", std::process::id())
}

fn body(i: usize, tenant: &str, prediction: Option<Value>) -> Value {
    let mut vm = json!({"vm_id": vm_id(i), "tenant_id": tenant, "vm_type": "D2", "demand": {"cores": 2, "memory_gib": 8},
                        "requested_at_s": 864_000.0 + 13.0 * 3_600.0});
    if let Some(prediction) = prediction {
        vm["prediction"] = prediction;
    }
    json!({"vm": vm})
}

fn report(name: &str, sample: &Sample, floor_p50: u64) {
    let c = &sample.client_us;
    let median_stage = |k: usize| {
        let mut values: Vec<u64> = sample.stages.iter().map(|s| s[k]).collect();
        values.sort_unstable();
        percentile(&values, 50.0)
    };
    let stages = if sample.stages.is_empty() {
        "-".to_owned()
    } else {
        format!(
            "validate {} / cache {} / inference {} / allocator {} / total {}",
            median_stage(0),
            median_stage(1),
            median_stage(2),
            median_stage(3),
            median_stage(4)
        )
    };
    println!(
        "| {name} | {} | {} | {} | {} | {:.1}x | {stages} |",
        c.len(),
        ms(percentile(c, 50.0)),
        ms(percentile(c, 99.0)),
        ms(*c.last().unwrap_or(&0)),
        percentile(c, 50.0) as f64 / floor_p50.max(1) as f64,
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let count: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(2_000);
    let rate: f64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(200.0);
    let dir = tempfile::tempdir().unwrap();
    let inference = support::start_inference(dir.path(), &support::default_models(dir.path())).await;
    let allocator = support::start_allocator(dir.path(), 1_000).await;
    let control = support::start_control(
        dir.path(),
        &[&inference.base],
        &allocator.base,
        20,
        // Unknown tenants are mostly predicted long; the safeguard would trip and hide the model.
        "[safeguard]\nenabled = false\n",
    )
    .await;
    // The same stack with the live tenant history off, for the loop's cost on the hot path.
    let frozen_inference =
        support::start_inference_with(dir.path(), &support::default_models(dir.path()), "[history]\nlive = false")
            .await;
    let frozen = support::start_control_full(
        dir.path(),
        &[&frozen_inference.base],
        &[&allocator.base],
        20,
        "history = false",
        "[safeguard]\nenabled = false\n[quality]\nenabled = false\n",
    )
    .await;
    // The service credential goes with every call: the direct calls to the allocator and the
    // inference server need it, and the control service (open mode) ignores it.
    let client =
        reqwest::Client::builder().tcp_nodelay(true).default_headers(support::service_credential()).build().unwrap();
    // Warm the connection pools of the client and of the control services.
    for (k, front) in [&control, &frozen].into_iter().enumerate() {
        for i in 0..50 {
            let id = 1_000_000 + 100 * k + i;
            let _ = client.get(front.url("/healthz")).send().await;
            let _ = client.post(front.url("/allocate")).json(&body(id, &format!("warm-{id}"), None)).send().await;
            let _ = client.delete(front.url(&format!("/allocate/{}", vm_id(id)))).send().await;
        }
    }

    println!("{count} requests per scenario at {rate} requests/s; latencies in ms on the client, stage medians in us");
    println!();
    println!("| scenario | requests | p50 ms | p99 ms | max ms | p50 / floor | server stage medians (us) |");
    println!("|---|---:|---:|---:|---:|---:|---|");
    let floor = run(&client, count, rate, None, |_| client.get(control.url("/healthz"))).await;
    let floor_p50 = percentile(&floor.client_us, 50.0);
    report("floor: GET /healthz", &floor, floor_p50);

    let prediction = json!({"p_long": 0.2, "class": "short", "source": "model"});
    let direct = run(&client, count, rate, Some((&allocator.url("/v1/allocations"), 0)), |i| {
        client.post(allocator.url("/v1/allocations")).json(&body(i, "direct", Some(prediction.clone())))
    })
    .await;
    report("allocator direct", &direct, floor_p50);

    let hits = run(&client, count, rate, Some((&control.url("/allocate"), 2 * count)), |i| {
        client.post(control.url("/allocate")).json(&body(2 * count + i, "same-tenant", None))
    })
    .await;
    report("control: cache hits", &hits, floor_p50);

    // Live history and frozen history in alternation, twice: ratios hold on a noisy machine.
    for round in 0..2 {
        for (name, front, at) in [
            ("control: cache misses", &control, 4 + 4 * round),
            ("control: cache misses, frozen history", &frozen, 6 + 4 * round),
        ] {
            let misses = run(&client, count, rate, Some((&front.url("/allocate"), at * count)), |i| {
                client.post(front.url("/allocate")).json(&body(at * count + i, &format!("tenant-{at}-{i}"), None))
            })
            .await;
            report(name, &misses, floor_p50);
        }
    }

    let history: Value = client.get(inference.url("/v1/history")).send().await.unwrap().json().await.unwrap();
    println!();
    println!("live history: {history}");
    let stats: Value = client.get(control.url("/v1/stats")).send().await.unwrap().json().await.unwrap();
    println!();
    println!(
        "control service: cache hit rate {:.3}, fallbacks {}, predictions by source {}",
        stats["cache"]["hit_rate"].as_f64().unwrap_or(0.0),
        stats["fallbacks"],
        stats["predictions_by_source"]
    );
}
