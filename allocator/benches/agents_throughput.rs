//! Durable allocation throughput of several allocation agents on one PostgreSQL database, against
//! one allocator on its SQLite file, all in one run (issue 17).
//!
//! `cargo bench -p allocator --bench agents_throughput [-- ALLOCATIONS]` (or `cargo test --release
//! -p allocator --bench agents_throughput -- ALLOCATIONS`) starts a throwaway PostgreSQL cluster
//! (as the tests do) and, for each row, the real `allocator` binaries: 1 agent on SQLite, then 1, 2
//! and 4 agents on one fresh PostgreSQL database. 16 concurrent clients on loopback (one kept-alive
//! connection each, client c talking to agent c mod N, as the control service spreads requests)
//! first fill the zone to a steady state (each client holds 80 VMs of 1 to 8 cores: 60% of the
//! 9,600 cores), then share a fixed number of allocations (default 2,000 after 200 of warm-up):
//! each places a new VM and releases its own oldest, so VMs leave in about the order they came and
//! free room is spread over many hosts, as in a zone in use. A request answered 503 is sent again
//! after 5 ms, as a client
//! would. Reported: allocations per second (each with a release: two durable writes), p50/p99
//! latency of the allocation requests until placed, and, summed over the agents from their
//! `/metrics`, commits, conflicts (batches the store refused) and retries per 100 commits, reloads
//! of the whole state, and the 503 answers per 100 requests (allocations and releases).

#[path = "../tests/support/postgres.rs"]
mod postgres;
mod support;

use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{metric, Server};

const CLIENTS: usize = 16;
const WARMUP: usize = 200;
const HOSTS: usize = 200;
/// VMs each client holds in the steady state: 16 x 80 VMs of 4.5 cores on average, 60% of the
/// zone's 9,600 cores.
const KEEP: usize = 80;
/// The allocations that fill the zone to its steady state.
const FILL: usize = CLIENTS * KEEP;

async fn start(dir: &Path, name: &str, store: &str) -> Server {
    let config = format!(
        "store = \"{store}\"\n\n[generate]\nhosts = {HOSTS}\nhosts_per_rack = 20\ncores = 48\nmemory_gib = 384\n\n[allocator.policy]\nkind = \"la-binary\"\n"
    );
    support::start(dir, name, &config).await
}

/// A counter's value summed over the agents.
async fn counter(agents: &[Server], name: &str) -> f64 {
    let mut sum = 0.0;
    for agent in agents {
        sum += metric(&agent.base, name).await;
    }
    sum
}

struct Figures {
    allocations_per_s: f64,
    p50: Duration,
    p99: Duration,
    /// Allocations and releases answered 503 and sent again.
    unavailable: usize,
}

/// `allocations` by `CLIENTS` concurrent clients. Each client holds its VMs in `held[c]` (oldest
/// first) and, once it holds `keep`, releases its oldest after every allocation: the zone stays
/// in a steady state in which VMs leave in about the order they came, as in a zone in use.
async fn drive(
    agents: &[Server],
    allocations: usize,
    prefix: &str,
    held: &mut [VecDeque<String>],
    keep: usize,
) -> Figures {
    let next = Arc::new(AtomicUsize::new(0));
    let unavailable = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (next, base, prefix) = (Arc::clone(&next), agents[c % agents.len()].base.clone(), prefix.to_owned());
            let unavailable = Arc::clone(&unavailable);
            let mut mine = std::mem::take(&mut held[c]);
            tokio::spawn(async move {
                let client = support::client();
                let mut latencies = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= allocations {
                        break (latencies, mine);
                    }
                    let id = format!("{prefix}-{i}");
                    let body = support::vm_body(&prefix, i, c);
                    let sent = Instant::now();
                    // A 503 (the store refused the batch MAX_ATTEMPTS times) is retried, as a client
                    // does; the latency counts until the VM is placed.
                    loop {
                        let response =
                            client.post(format!("{base}/v1/allocations")).json(&body).send().await.expect("allocate");
                        match response.status().as_u16() {
                            201 => break,
                            503 => {
                                unavailable.fetch_add(1, Ordering::Relaxed);
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                            status => panic!("allocation {id}: {status}"),
                        }
                    }
                    latencies.push(sent.elapsed());
                    mine.push_back(id);
                    if mine.len() <= keep {
                        continue;
                    }
                    let Some(oldest) = mine.pop_front() else { continue };
                    // A release in a refused batch is answered 503 too, and sent again; 404 after a
                    // 503 means the first one was done after all.
                    let mut retried = false;
                    loop {
                        let response =
                            client.delete(format!("{base}/v1/allocations/{oldest}")).send().await.expect("release");
                        match response.status().as_u16() {
                            204 => break,
                            404 if retried => break,
                            503 => {
                                retried = true;
                                unavailable.fetch_add(1, Ordering::Relaxed);
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                            status => panic!("release {oldest}: {status}"),
                        }
                    }
                }
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(allocations);
    for (c, task) in tasks.into_iter().enumerate() {
        let (mine, kept) = task.await.expect("client");
        latencies.extend(mine);
        held[c] = kept;
    }
    let elapsed = started.elapsed();
    latencies.sort();
    Figures {
        allocations_per_s: allocations as f64 / elapsed.as_secs_f64(),
        p50: latencies[latencies.len() / 2],
        p99: latencies[latencies.len() * 99 / 100],
        unavailable: unavailable.load(Ordering::Relaxed),
    }
}

fn main() {
    let allocations: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(2_000).max(100);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    // A real disk under target/: the point is what a durable commit costs.
    let dir =
        tempfile::Builder::new().prefix("agents-bench-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let pg = postgres::Postgres::start();
    println!(
        "durable allocation throughput: {allocations} allocations (+ as many releases) per row, {CLIENTS} clients, {HOSTS} hosts, la-binary"
    );
    println!(
        "| store | agents | allocations/s | p50 | p99 | commits | conflicts / 100 commits | retries / 100 commits | full reloads | 503s / 100 requests |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let rows: [(&str, usize); 4] = [("sqlite", 1), ("postgres", 1), ("postgres", 2), ("postgres", 4)];
    for (row, (kind, n)) in rows.into_iter().enumerate() {
        runtime.block_on(async {
            let store = match kind {
                "sqlite" => dir.path().join("bench.db").display().to_string(),
                _ => {
                    let db = format!("bench{row}");
                    pg.psql(&format!("CREATE DATABASE {db}"));
                    format!("{}/{db}", pg.url.trim_end_matches("/alloc"))
                }
            };
            let mut agents = Vec::new();
            for i in 0..n {
                agents.push(start(dir.path(), &format!("{kind}-{row}-{i}"), &store).await);
            }
            // A zone in use: filled to its steady state, then VMs come and go (warm-up first).
            let mut held = vec![VecDeque::new(); CLIENTS];
            drive(&agents, FILL, &format!("fill{row}"), &mut held, KEEP).await;
            drive(&agents, WARMUP, &format!("warm{row}"), &mut held, KEEP).await;
            let (commits0, conflicts0, retries0, rebuilds0) = (
                counter(&agents, "allocator_commits_total").await,
                counter(&agents, "allocator_commit_conflicts_total").await,
                counter(&agents, "allocator_commit_retries_total").await,
                counter(&agents, "allocator_reloads_total").await,
            );
            let figures = drive(&agents, allocations, &format!("r{row}"), &mut held, KEEP).await;
            let commits = counter(&agents, "allocator_commits_total").await - commits0;
            let conflicts = counter(&agents, "allocator_commit_conflicts_total").await - conflicts0;
            let retries = counter(&agents, "allocator_commit_retries_total").await - retries0;
            let rebuilds = counter(&agents, "allocator_reloads_total").await - rebuilds0;
            println!(
                "| {kind} | {n} | {:.0} | {:.2} ms | {:.2} ms | {commits:.0} | {:.2} | {:.2} | {rebuilds:.0} | {:.2} |",
                figures.allocations_per_s,
                figures.p50.as_secs_f64() * 1e3,
                figures.p99.as_secs_f64() * 1e3,
                100.0 * conflicts / commits.max(1.0),
                100.0 * retries / commits.max(1.0),
                100.0 * figures.unavailable as f64 / (2 * allocations) as f64,
            );
        });
    }
}
