//! Allocation throughput of the real `allocator` binary with durable commits, group commit against
//! one commit per request.
//!
//! `cargo bench -p allocator --bench service_throughput [-- ALLOCATIONS]` (or `cargo test --release
//! -p allocator --bench service_throughput -- ALLOCATIONS`, same profile) builds and starts the
//! binary twice on a fresh store under `target/` (a real disk: `synchronous = FULL` means an
//! `fsync` per commit), once with `max_batch = 256` (group commit) and once with `max_batch = 1`
//! (one commit per request). Against each, C concurrent clients on loopback (C = 1, 4, 16; one
//! kept-alive connection each) share a fixed number of allocations (default 2,000 after 200 of
//! warm-up); every client allocates a new VM, releases it, and goes on. Reported: allocations per
//! second (each with its release: two durable writes), p50/p99 latency of the allocation requests,
//! and how many writes each commit carried on average (from `/metrics`).

use serde_json::json;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CLIENTS: [usize; 3] = [1, 4, 16];
const WARMUP: usize = 200;
const HOSTS: usize = 200;

struct Server {
    child: Child,
    base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start(dir: &Path, max_batch: usize) -> Server {
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port();
    let store = dir.join(format!("bench-{max_batch}.db"));
    let config = dir.join(format!("bench-{max_batch}.toml"));
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\nstore = \"{}\"\nmax_batch = {max_batch}\n\n[generate]\nhosts = {HOSTS}\nhosts_per_rack = 20\ncores = 48\nmemory_gib = 384\n\n[allocator.policy]\nkind = \"la-binary\"\n",
            store.display()
        ),
    )
    .expect("config written");
    let child = Command::new(env!("CARGO_BIN_EXE_allocator"))
        .arg("--config")
        .arg(&config)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("allocator started");
    let server = Server { child, base: format!("http://127.0.0.1:{port}") };
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !client.get(format!("{}/readyz", server.base)).send().await.is_ok_and(|r| r.status().is_success()) {
        assert!(Instant::now() < deadline, "the allocator did not become ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server
}

/// The `_count` of a Prometheus histogram.
async fn metric_count(base: &str, name: &str) -> f64 {
    let text = reqwest::get(format!("{base}/metrics")).await.expect("metrics").text().await.expect("text");
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{name}_count ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

struct Figures {
    allocations_per_s: f64,
    p50: Duration,
    p99: Duration,
    writes_per_commit: f64,
}

/// `clients` clients share `allocations` allocate+release pairs; `prefix` keeps VM ids unique.
async fn drive(base: &str, clients: usize, allocations: usize, prefix: &str) -> Figures {
    let next = Arc::new(AtomicUsize::new(0));
    let commits_before = metric_count(base, "allocator_commit_duration_seconds").await;
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (next, base, prefix) = (Arc::clone(&next), base.to_owned(), prefix.to_owned());
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                let mut latencies = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= allocations {
                        break latencies;
                    }
                    let id = format!("{prefix}-{i}");
                    let body = json!({"vm": {"vm_id": id, "tenant_id": format!("t{c}"), "vm_type": "D4",
                        "demand": {"cores": 1 + i % 8, "memory_gib": 4 * (1 + i % 8)},
                        "prediction": {"p_long": 0.5, "class": if i % 3 == 0 { "long" } else { "short" }, "source": "model"}}});
                    let sent = Instant::now();
                    let response =
                        client.post(format!("{base}/v1/allocations")).json(&body).send().await.expect("allocate");
                    assert_eq!(response.status().as_u16(), 201, "allocation {id}");
                    response.bytes().await.expect("answer");
                    latencies.push(sent.elapsed());
                    let response =
                        client.delete(format!("{base}/v1/allocations/{id}")).send().await.expect("release");
                    assert_eq!(response.status().as_u16(), 204, "release {id}");
                }
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(allocations);
    for task in tasks {
        latencies.extend(task.await.expect("client"));
    }
    let elapsed = started.elapsed();
    let commits = metric_count(base, "allocator_commit_duration_seconds").await - commits_before;
    latencies.sort();
    Figures {
        allocations_per_s: allocations as f64 / elapsed.as_secs_f64(),
        p50: latencies[latencies.len() / 2],
        p99: latencies[latencies.len() * 99 / 100],
        writes_per_commit: (2 * allocations) as f64 / commits.max(1.0),
    }
}

fn main() {
    let allocations: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(2_000).max(100);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    // A real disk under target/, not a tmpfs: the point is what an fsync costs.
    let dir =
        tempfile::Builder::new().prefix("allocator-bench-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    println!(
        "allocator service throughput: {allocations} allocations (+ as many releases) per row, {HOSTS} hosts, la-binary"
    );
    println!("| commits | clients | allocations/s | p50 | p99 | writes/commit |");
    println!("|---|---:|---:|---:|---:|---:|");
    let mut results = Vec::new();
    for (mode, max_batch) in [("group (max_batch 256)", 256), ("per request (max_batch 1)", 1)] {
        runtime.block_on(async {
            let server = start(dir.path(), max_batch).await;
            drive(&server.base, 4, WARMUP, &format!("warm-{max_batch}")).await;
            for clients in CLIENTS {
                let figures = drive(&server.base, clients, allocations, &format!("b{max_batch}-c{clients}")).await;
                println!(
                    "| {mode} | {clients} | {:.0} | {:.2} ms | {:.2} ms | {:.2} |",
                    figures.allocations_per_s,
                    figures.p50.as_secs_f64() * 1e3,
                    figures.p99.as_secs_f64() * 1e3,
                    figures.writes_per_commit
                );
                results.push((max_batch, clients, figures.allocations_per_s));
            }
        });
    }
    for clients in CLIENTS {
        let rate = |batch| results.iter().find(|r| r.0 == batch && r.1 == clients).map_or(0.0, |r| r.2);
        println!("{clients} clients: group commit / per-request commit = {:.2}x", rate(256) / rate(1).max(1e-9));
    }
}
