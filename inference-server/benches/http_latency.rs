//! HTTP prediction latency and throughput on loopback, for several servers with one client.
//!
//! `cargo bench -p inference-server --bench http_latency -- NAME=URL [NAME=URL ...]`; the first
//! target is the reference for the ratios. `scripts/bench-inference.sh` starts our server and the
//! Python (LightGBM + FastAPI/uvicorn) server on the same bundle and runs this against both.
//! Every instance names a tenant the feature store does not know, so both servers do the same work.

use serde_json::{json, Value};
use std::time::{Duration, Instant};

const WARMUP: usize = 200;
const SINGLE_REQUESTS: usize = 3_000;
const BATCH: usize = 64;
const BATCH_REQUESTS_PER_CLIENT: usize = 300;
const CLIENTS: usize = 2;

fn instance(i: usize) -> Value {
    let (vm_type, cores, memory) = [("D2", 2, 8), ("F1", 1, 2), ("E4", 4, 32), ("D8", 8, 32)][i % 4];
    json!({"key": format!("bench-{i}"), "tenant_id": format!("bench-tenant-{i}"), "vm_type": vm_type,
           "cores": cores, "memory_gib": memory, "os": "linux", "requested_at_s": 900000.0 + i as f64,
           "features": {"batch_size": 1 + i % 3}})
}

/// Sends a pre-serialized body and counts the predictions in the answer without parsing the rest,
/// so that the client adds as little as possible to what is measured.
async fn post(client: &reqwest::Client, url: &str, body: &axum::body::Bytes) -> usize {
    let response = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .expect("request sent");
    assert!(response.status().is_success(), "{url} answered {}", response.status());
    let answer = response.bytes().await.expect("answer");
    answer.windows(8).filter(|w| w == b"\"p_long\"").count()
}

fn body(instances: Vec<Value>) -> axum::body::Bytes {
    axum::body::Bytes::from(serde_json::to_vec(&json!({ "instances": instances })).expect("serializable"))
}

struct Figures {
    p50: Duration,
    p99: Duration,
    mean: Duration,
    batch_instances_per_s: f64,
}

async fn measure(base: &str) -> Figures {
    let url = format!("{base}/v1/predict");
    let url = url.as_str();
    let client = reqwest::Client::new();
    let singles: Vec<axum::body::Bytes> = (0..SINGLE_REQUESTS).map(|i| body(vec![instance(i)])).collect();
    for single in singles.iter().take(WARMUP) {
        post(&client, url, single).await;
    }
    let mut samples = Vec::with_capacity(SINGLE_REQUESTS);
    for single in &singles {
        let start = Instant::now();
        assert_eq!(post(&client, url, single).await, 1);
        samples.push(start.elapsed());
    }
    samples.sort();
    let mean = samples.iter().sum::<Duration>() / SINGLE_REQUESTS as u32;

    let started = Instant::now(); // includes building the batch bodies: a few ms, the same for every server
    let workers: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (client, url) = (client.clone(), url.to_owned());
            let batches: Vec<axum::body::Bytes> = (0..BATCH_REQUESTS_PER_CLIENT)
                .map(|r| body((0..BATCH).map(|i| instance(c * 100_000 + r * BATCH + i)).collect()))
                .collect();
            tokio::spawn(async move {
                let mut done = 0;
                for batch in &batches {
                    done += post(&client, &url, batch).await;
                }
                done
            })
        })
        .collect();
    let mut instances = 0;
    for worker in workers {
        instances += worker.await.expect("worker");
    }
    Figures {
        p50: samples[SINGLE_REQUESTS / 2],
        p99: samples[SINGLE_REQUESTS * 99 / 100],
        mean,
        batch_instances_per_s: instances as f64 / started.elapsed().as_secs_f64(),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let targets: Vec<(String, String)> = std::env::args()
        .skip(1)
        .filter_map(|a| a.split_once('=').map(|(n, u)| (n.to_owned(), u.trim_end_matches('/').to_owned())))
        .collect();
    if targets.is_empty() {
        eprintln!("usage: http_latency NAME=URL [NAME=URL ...]");
        return;
    }
    let mut results = Vec::new();
    for (name, url) in &targets {
        eprintln!("measuring {name} at {url} ...");
        results.push((name.clone(), measure(url).await));
    }
    println!(
        "single-instance requests: {SINGLE_REQUESTS} sequential after {WARMUP} warm-up; batches: {CLIENTS} clients x {BATCH_REQUESTS_PER_CLIENT} requests of {BATCH}"
    );
    println!("| server | p50 | p99 | mean | batch-{BATCH} throughput |");
    println!("|---|---:|---:|---:|---:|");
    for (name, f) in &results {
        println!(
            "| {name} | {:.0} us | {:.0} us | {:.0} us | {:.0} predictions/s |",
            f.p50.as_secs_f64() * 1e6,
            f.p99.as_secs_f64() * 1e6,
            f.mean.as_secs_f64() * 1e6,
            f.batch_instances_per_s
        );
    }
    let reference = &results[0].1;
    for (name, f) in results.iter().skip(1) {
        println!(
            "{name} / {}: p50 {:.2}x, p99 {:.2}x, batch throughput {:.2}x",
            results[0].0,
            f.p50.as_secs_f64() / reference.p50.as_secs_f64(),
            f.p99.as_secs_f64() / reference.p99.as_secs_f64(),
            f.batch_instances_per_s / reference.batch_instances_per_s
        );
    }
}
