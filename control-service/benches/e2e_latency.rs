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
//!   (The allocator they share resolves outcomes for both: that part's cost is `cargo bench -p
//!   placement --bench outcomes`.)
//!
//! Stacks, each running the first four scenarios, in alternation, twice:
//! - `durable`: this build, the allocator's store on the temporary directory's disk (`synchronous
//!   = FULL`: an `fsync` per batch), as the service runs;
//! - `tmpfs`: this build, the allocator's store on `/dev/shm`, where an `fsync` costs nothing. For
//!   comparison only: a store on tmpfs does not survive a power loss. The difference between the
//!   two is what the durable commit costs;
//! - `before`: with `STACK_BINARIES_DIR` set to a directory holding another build's
//!   `control-service`, `allocator` and `inference-server` (an older commit's), the same
//!   scenarios through those, on a disk store: before and after in one run.
//!
//! Every placed VM is released right after (not timed), so the zone never fills. The stage
//! columns are the medians of the answers' `Server-Timing` entries (the control service's stages,
//! and the allocator's as `alloc-*`), or of the control service's `latency_us` for a build without
//! them.
//!
//! `cargo bench -p control-service --bench e2e_latency -- [requests per scenario] [rate per s]`

use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};
use test_support::binaries::BINARIES_DIR_VARIABLE;
use test_support::process::Process;
use test_support::stack;

#[derive(Default)]
struct Sample {
    client_us: Vec<u64>,
    /// Every stage an answer reported, in microseconds, in order of first appearance.
    stages: Vec<(String, Vec<u64>)>,
}

impl Sample {
    fn stage(&mut self, name: &str, us: u64) {
        match self.stages.iter_mut().find(|(n, _)| n == name) {
            Some((_, values)) => values.push(us),
            None => self.stages.push((name.to_owned(), vec![us])),
        }
    }
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

/// The stages of a `Server-Timing` header (`name;dur=<ms>, ...`) in microseconds.
fn server_timing(header: &str) -> Vec<(String, u64)> {
    header
        .split(',')
        .filter_map(|entry| {
            let mut parts = entry.trim().split(';');
            let name = parts.next()?.trim().to_owned();
            let dur = parts.find_map(|p| p.trim().strip_prefix("dur="))?.parse::<f64>().ok()?;
            Some((name, (dur * 1_000.0).round() as u64))
        })
        .collect()
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
            let timing = response.headers().get("server-timing").and_then(|v| v.to_str().ok()).map(server_timing);
            let body = response.bytes().await.expect("body");
            let elapsed = started.elapsed().as_micros() as u64;
            assert!(status.is_success(), "HTTP {status}: {}", String::from_utf8_lossy(&body));
            (elapsed, timing, serde_json::from_slice::<Value>(&body).ok())
        }));
    }
    let mut sample = Sample { client_us: Vec::with_capacity(count), stages: Vec::new() };
    for (i, task) in tasks.into_iter().enumerate() {
        let (elapsed, timing, body) = task.await.expect("task");
        sample.client_us.push(elapsed);
        match timing {
            Some(stages) => stages.into_iter().for_each(|(name, us)| sample.stage(&name, us)),
            // A build without `Server-Timing`: the control service's stages from its body.
            None => {
                if let Some(latency) = body.as_ref().and_then(|b| b["latency_us"].as_object()) {
                    for (name, us) in latency {
                        sample.stage(name.trim_end_matches("_us"), us.as_u64().unwrap_or(0));
                    }
                }
            }
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

fn report(name: &str, sample: &mut Sample, floor_p50: u64) {
    let c = &sample.client_us;
    let stages = if sample.stages.is_empty() {
        "-".to_owned()
    } else {
        sample
            .stages
            .iter_mut()
            .map(|(name, values)| {
                values.sort_unstable();
                format!("{name} {}", percentile(values, 50.0))
            })
            .collect::<Vec<_>>()
            .join(" / ")
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

/// One stack: an inference server, an allocator and a control service in front of them.
struct Stack {
    name: &'static str,
    inference: Process,
    allocator: Process,
    control: Process,
}

/// Starts a stack whose allocator keeps its store in `store_dir`; `binaries` is another build's
/// directory (the `before` stack), none for this build.
async fn start_stack(name: &'static str, dir: &Path, models: &Path, store_dir: &Path, binaries: Option<&str>) -> Stack {
    match binaries {
        Some(binaries) => std::env::set_var(BINARIES_DIR_VARIABLE, binaries),
        None => std::env::remove_var(BINARIES_DIR_VARIABLE),
    }
    let inference = stack::start_inference(dir, models).await;
    let store = store_dir.join(format!("allocator-{name}.db")).display().to_string();
    let allocator = stack::start_allocator_on(dir, 1_000, &store, "").await;
    let control = stack::start_control(
        dir,
        &[&inference.base],
        &allocator.base,
        20,
        // Unknown tenants are mostly predicted long; the safeguard would trip and hide the model.
        "[safeguard]\nenabled = false\n",
    )
    .await;
    std::env::remove_var(BINARIES_DIR_VARIABLE);
    Stack { name, inference, allocator, control }
}

/// Warms the connection pools of the client and of the control service `front`.
async fn warm(client: &reqwest::Client, front: &Process, first_id: usize) {
    for i in 0..50 {
        let id = first_id + i;
        let _ = client.get(front.url("/healthz")).send().await;
        let _ = client.post(front.url("/allocate")).json(&body(id, &format!("warm-{id}"), None)).send().await;
        let _ = client.delete(front.url(&format!("/allocate/{}", vm_id(id)))).send().await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let count: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(2_000);
    let rate: f64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(200.0);
    let before = std::env::var(BINARIES_DIR_VARIABLE).ok().filter(|d| !d.is_empty());
    let dir = tempfile::tempdir().unwrap();
    // tmpfs where there is one: the fsync-free comparison; else the disk again (and said so).
    let shm = tempfile::tempdir_in("/dev/shm").ok();
    let tmpfs_dir = shm.as_ref().map_or(dir.path(), |d| d.path());
    // Copied once: a copy made while an inference server watches the directory is a bundle
    // changed after it was sealed, which that server refuses.
    let models = stack::default_models(dir.path());
    let mut stacks = Vec::new();
    if let Some(binaries) = before.as_deref() {
        stacks.push(start_stack("before", dir.path(), &models, dir.path(), Some(binaries)).await);
    }
    stacks.push(start_stack("durable", dir.path(), &models, dir.path(), None).await);
    let tmpfs = if shm.is_some() { "tmpfs" } else { "tmpfs (none: disk)" };
    stacks.push(start_stack(tmpfs, dir.path(), &models, tmpfs_dir, None).await);
    let durable = stacks.iter().find(|s| s.name == "durable").expect("the durable stack");
    // The durable stack with the live tenant history off, for the loop's cost on the hot path.
    let frozen_inference = stack::start_inference_with(dir.path(), &models, "[history]\nlive = false").await;
    let frozen = stack::start_control_full(
        dir.path(),
        &[&frozen_inference.base],
        &[&durable.allocator.base],
        20,
        "history = false",
        "[safeguard]\nenabled = false\n[quality]\nenabled = false\n",
    )
    .await;
    // The service credential goes with every call: the direct calls to the allocator and the
    // inference server need it, and the control service (open mode) ignores it.
    let client =
        reqwest::Client::builder().tcp_nodelay(true).default_headers(stack::service_credential()).build().unwrap();
    for (k, front) in stacks.iter().map(|s| &s.control).chain([&frozen]).enumerate() {
        warm(&client, front, 1_000_000 + 100 * k).await;
    }

    println!("{count} requests per scenario at {rate} requests/s; latencies in ms on the client, stage medians in us");
    println!();
    println!("| scenario | requests | p50 ms | p99 ms | max ms | p50 / floor | server stage medians (us) |");
    println!("|---|---:|---:|---:|---:|---:|---|");
    // Each scenario of each round and stack places VMs of its own range of ids.
    let mut next_id = 0;
    let mut ids = || {
        next_id += count;
        next_id - count
    };
    let prediction = json!({"p_long": 0.2, "class": "short", "source": "model"});
    for round in 1..=2 {
        for stack in &stacks {
            let (name, control, allocator) = (stack.name, &stack.control, &stack.allocator);
            let mut floor = run(&client, count, rate, None, |_| client.get(control.url("/healthz"))).await;
            let floor_p50 = percentile(&floor.client_us, 50.0);
            report(&format!("{name} {round}: floor GET /healthz"), &mut floor, floor_p50);

            let at = ids();
            let mut direct = run(&client, count, rate, Some((&allocator.url("/v1/allocations"), at)), |i| {
                client.post(allocator.url("/v1/allocations")).json(&body(at + i, "direct", Some(prediction.clone())))
            })
            .await;
            report(&format!("{name} {round}: allocator direct"), &mut direct, floor_p50);

            let at = ids();
            let mut hits = run(&client, count, rate, Some((&control.url("/allocate"), at)), |i| {
                client.post(control.url("/allocate")).json(&body(at + i, "same-tenant", None))
            })
            .await;
            report(&format!("{name} {round}: control, cache hits"), &mut hits, floor_p50);

            let at = ids();
            let mut misses = run(&client, count, rate, Some((&control.url("/allocate"), at)), |i| {
                client.post(control.url("/allocate")).json(&body(at + i, &format!("tenant-{at}-{i}"), None))
            })
            .await;
            report(&format!("{name} {round}: control, cache misses"), &mut misses, floor_p50);

            if name == "durable" {
                let at = ids();
                let mut misses = run(&client, count, rate, Some((&frozen.url("/allocate"), at)), |i| {
                    client.post(frozen.url("/allocate")).json(&body(at + i, &format!("tenant-{at}-{i}"), None))
                })
                .await;
                report(&format!("{name} {round}: control, cache misses, frozen history"), &mut misses, floor_p50);
            }
        }
    }

    let history: Value = client.get(durable.inference.url("/v1/history")).send().await.unwrap().json().await.unwrap();
    println!();
    println!("durable stack's live history: {history}");
    let stats: Value = client.get(durable.control.url("/v1/stats")).send().await.unwrap().json().await.unwrap();
    println!();
    println!(
        "durable stack's control service: cache hit rate {:.3}, fallbacks {}, predictions by source {}",
        stats["cache"]["hit_rate"].as_f64().unwrap_or(0.0),
        stats["fallbacks"],
        stats["predictions_by_source"]
    );
}
