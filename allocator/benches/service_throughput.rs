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
//! and how many writes each commit carried on average (from `/metrics`). Then, with group commit,
//! requests that fit nowhere (rejected): a rejection stands for 30 s and is recorded with its batch
//! (issue 56), so rejections are commits too; reported beside the allocations of the same run.

mod support;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{metric, Server};

const CLIENTS: [usize; 3] = [1, 4, 16];
const WARMUP: usize = 200;
const HOSTS: usize = 200;

async fn start(dir: &Path, max_batch: usize) -> Server {
    let store = dir.join(format!("bench-{max_batch}.db"));
    let config = format!(
        "store = \"{}\"\nmax_batch = {max_batch}\n\n[generate]\nhosts = {HOSTS}\nhosts_per_rack = 20\ncores = 48\nmemory_gib = 384\n\n[allocator.policy]\nkind = \"la-binary\"\n",
        store.display()
    );
    support::start(dir, &format!("bench-{max_batch}"), &config).await
}

struct Figures {
    allocations_per_s: f64,
    p50: Duration,
    p99: Duration,
    writes_per_commit: f64,
}

/// What the clients send.
#[derive(Clone, Copy, PartialEq)]
enum Requests {
    /// A VM that fits, then its release.
    PlaceAndRelease,
    /// A VM larger than any host: rejected.
    FitsNowhere,
}

/// `clients` clients share `allocations` requests (with `PlaceAndRelease`, each followed by its
/// release); `prefix` keeps VM ids unique.
async fn drive(base: &str, clients: usize, allocations: usize, prefix: &str, requests: Requests) -> Figures {
    let next = Arc::new(AtomicUsize::new(0));
    let commits_before = metric(base, "allocator_commit_duration_seconds_count").await;
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (next, base, prefix) = (Arc::clone(&next), base.to_owned(), prefix.to_owned());
            tokio::spawn(async move {
                let client = support::client();
                let mut latencies = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= allocations {
                        break latencies;
                    }
                    let id = format!("{prefix}-{i}");
                    let mut body = support::vm_body(&prefix, i, c);
                    if requests == Requests::FitsNowhere {
                        body["vm"]["demand"]["cores"] = serde_json::json!(4 * 48);
                    }
                    let sent = Instant::now();
                    let response =
                        client.post(format!("{base}/v1/allocations")).json(&body).send().await.expect("allocate");
                    let expected = if requests == Requests::FitsNowhere { 200 } else { 201 };
                    assert_eq!(response.status().as_u16(), expected, "allocation {id}");
                    response.bytes().await.expect("answer");
                    latencies.push(sent.elapsed());
                    if requests == Requests::FitsNowhere {
                        continue;
                    }
                    let response = client.delete(format!("{base}/v1/allocations/{id}")).send().await.expect("release");
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
    let commits = metric(base, "allocator_commit_duration_seconds_count").await - commits_before;
    latencies.sort();
    Figures {
        allocations_per_s: allocations as f64 / elapsed.as_secs_f64(),
        p50: latencies[latencies.len() / 2],
        p99: latencies[latencies.len() * 99 / 100],
        writes_per_commit: (if requests == Requests::FitsNowhere { allocations } else { 2 * allocations }) as f64
            / commits.max(1.0),
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
            drive(&server.base, 4, WARMUP, &format!("warm-{max_batch}"), Requests::PlaceAndRelease).await;
            for clients in CLIENTS {
                let prefix = format!("b{max_batch}-c{clients}");
                let figures = drive(&server.base, clients, allocations, &prefix, Requests::PlaceAndRelease).await;
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
    println!("\nrejected requests (fit nowhere), group commit (max_batch 256): each batch's rejections are one commit");
    println!("| clients | rejections/s | p50 | p99 | rejections/commit | rejections/s / allocations/s |");
    println!("|---:|---:|---:|---:|---:|---:|");
    runtime.block_on(async {
        let server = start(dir.path(), 256).await;
        for clients in CLIENTS {
            let figures =
                drive(&server.base, clients, allocations, &format!("r-c{clients}"), Requests::FitsNowhere).await;
            let allocations_per_s = results.iter().find(|r| r.0 == 256 && r.1 == clients).map_or(0.0, |r| r.2);
            println!(
                "| {clients} | {:.0} | {:.2} ms | {:.2} ms | {:.2} | {:.2}x |",
                figures.allocations_per_s,
                figures.p50.as_secs_f64() * 1e3,
                figures.p99.as_secs_f64() * 1e3,
                figures.writes_per_commit,
                figures.allocations_per_s / allocations_per_s.max(1e-9)
            );
        }
    });
}
