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
//!
//! CPU (issue 32), from the processes' own accounting (`/proc/PID/stat`: user + system time)
//! over the measured allocations, in CPU-seconds per 1,000 allocations (each with its release):
//! the agents (summed), their worker threads alone (`allocator-worker`: the one thread per agent
//! that decides and commits, which bounds one agent's rate), PostgreSQL (the postmaster, every
//! process of the cluster, and those that ended meanwhile, by the postmaster's children's times),
//! and this bench (the 16 clients). `cores busy` is all of it over the elapsed time.
//!
//! Environment: `AGENTS_BENCH_BASELINE=/path/to/allocator` runs every row a second time with that
//! binary (a reference build: before and after in one run, the reference first);
//! `AGENTS_BENCH_ROWS=postgres:2,sqlite:1` chooses the rows (default: sqlite:1, postgres:1,
//! postgres:2, postgres:4); `AGENTS_BENCH_PIN=1` pins agent i to CPU i mod the CPU count
//! (`taskset -c`), everything else unpinned.

mod support;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::Instant;
use support::load::drive;
use support::{cpu, metric, Server};
use test_support::postgres;

const CLIENTS: usize = 16;
const WARMUP: usize = 200;
const HOSTS: usize = 200;
/// VMs each client holds in the steady state: 16 x 80 VMs of 4.5 cores on average, 60% of the
/// zone's 9,600 cores.
const KEEP: usize = 80;
/// The allocations that fill the zone to its steady state.
const FILL: usize = CLIENTS * KEEP;

async fn start(dir: &Path, name: &str, store: &str, binary: &Path, cpu: Option<usize>) -> Server {
    let config = format!(
        "store = \"{store}\"\n\n[generate]\nhosts = {HOSTS}\nhosts_per_rack = 20\ncores = 48\nmemory_gib = 384\n\n[allocator.policy]\nkind = \"la-binary\"\n"
    );
    support::start_with(dir, name, &config, binary, cpu).await
}

/// The CPU counters of one row, in clock ticks.
#[derive(Clone, Copy, Default)]
struct CpuSample {
    agents: u64,
    workers: u64,
    postgres: u64,
    bench: u64,
}

fn sample(agents: &[Server], postmaster: Option<u32>) -> CpuSample {
    let pid = |agent: &Server| agent.id().expect("a running agent");
    CpuSample {
        agents: agents.iter().map(|agent| cpu::process(pid(agent))).sum(),
        workers: agents.iter().map(|agent| cpu::thread(pid(agent), "allocator-worker")).sum(),
        postgres: postmaster.map_or(0, cpu::tree),
        bench: cpu::process(std::process::id()),
    }
}

/// A counter's value summed over the agents.
async fn counter(agents: &[Server], name: &str) -> f64 {
    let mut sum = 0.0;
    for agent in agents {
        sum += metric(&agent.base, name).await;
    }
    sum
}

fn main() {
    let allocations: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(2_000).max(100);
    let baseline = std::env::var_os("AGENTS_BENCH_BASELINE").map(PathBuf::from);
    let pin = std::env::var("AGENTS_BENCH_PIN").is_ok_and(|v| v == "1");
    let rows: Vec<(String, usize)> = std::env::var("AGENTS_BENCH_ROWS")
        .unwrap_or_else(|_| "sqlite:1,postgres:1,postgres:2,postgres:4".to_owned())
        .split(',')
        .filter_map(|row| row.split_once(':'))
        .filter_map(|(kind, n)| Some((kind.trim().to_owned(), n.trim().parse().ok()?)))
        .collect();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let ticks = cpu::ticks_per_s();
    let current = PathBuf::from(env!("CARGO_BIN_EXE_allocator"));
    let mut binaries: Vec<(&str, &Path)> = Vec::new();
    if let Some(baseline) = &baseline {
        binaries.push(("reference", baseline));
    }
    binaries.push(("this build", &current));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    // A real disk under target/: the point is what a durable commit costs.
    let dir =
        tempfile::Builder::new().prefix("agents-bench-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let pg = postgres::Postgres::start();
    let postmaster = std::fs::read_to_string(pg.data_dir().join("data").join("postmaster.pid"))
        .ok()
        .and_then(|pid| pid.lines().next().and_then(|line| line.trim().parse().ok()));
    println!(
        "durable allocation throughput: {allocations} allocations (+ as many releases) per row, {CLIENTS} clients, {HOSTS} hosts, la-binary{}",
        if pin { format!(", agent i pinned to CPU i mod {cpus}") } else { String::new() }
    );
    println!(
        "| binary | store | agents | allocations/s | p50 | p99 | commits | conflicts / 100 commits | retries / 100 commits | full reloads | 503s / 100 requests | agents CPU-s / 1k | of which workers | PostgreSQL CPU-s / 1k | bench CPU-s / 1k | cores busy |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut row = 0;
    for (kind, n) in &rows {
        for (label, binary) in &binaries {
            row += 1;
            let (kind, n) = (kind.as_str(), *n);
            runtime.block_on(async {
                let store = match kind {
                    "sqlite" => dir.path().join(format!("bench{row}.db")).display().to_string(),
                    _ => {
                        let db = format!("bench{row}");
                        pg.psql(&format!("CREATE DATABASE {db}"));
                        format!("{}/{db}", pg.url.trim_end_matches("/alloc"))
                    }
                };
                let mut agents = Vec::new();
                for i in 0..n {
                    let cpu = pin.then_some(i % cpus);
                    agents.push(start(dir.path(), &format!("{kind}-{row}-{i}"), &store, binary, cpu).await);
                }
                let bases: Vec<String> = agents.iter().map(|agent| agent.base.clone()).collect();
                // A zone in use: filled to its steady state, then VMs come and go (warm-up first).
                let mut held = vec![VecDeque::new(); CLIENTS];
                drive(&bases, FILL, &format!("fill{row}"), &mut held, KEEP).await;
                drive(&bases, WARMUP, &format!("warm{row}"), &mut held, KEEP).await;
                let (commits0, conflicts0, retries0, rebuilds0) = (
                    counter(&agents, "allocator_commits_total").await,
                    counter(&agents, "allocator_commit_conflicts_total").await,
                    counter(&agents, "allocator_commit_retries_total").await,
                    counter(&agents, "allocator_reloads_total").await,
                );
                let (cpu0, started) = (sample(&agents, postmaster), Instant::now());
                let figures = drive(&bases, allocations, &format!("r{row}"), &mut held, KEEP).await;
                let (cpu1, elapsed) = (sample(&agents, postmaster), started.elapsed().as_secs_f64());
                let commits = counter(&agents, "allocator_commits_total").await - commits0;
                let conflicts = counter(&agents, "allocator_commit_conflicts_total").await - conflicts0;
                let retries = counter(&agents, "allocator_commit_retries_total").await - retries0;
                let rebuilds = counter(&agents, "allocator_reloads_total").await - rebuilds0;
                // CPU-seconds per 1,000 allocations.
                let per_1k = |before: u64, after: u64| after.saturating_sub(before) as f64 / ticks * 1000.0 / allocations as f64;
                let busy = (cpu1.agents + cpu1.postgres + cpu1.bench)
                    .saturating_sub(cpu0.agents + cpu0.postgres + cpu0.bench) as f64
                    / ticks
                    / elapsed;
                println!(
                    "| {label} | {kind} | {n} | {:.0} | {:.2} ms | {:.2} ms | {commits:.0} | {:.2} | {:.2} | {rebuilds:.0} | {:.2} | {:.3} | {:.3} | {:.3} | {:.3} | {busy:.2} |",
                    figures.allocations_per_s,
                    figures.p50.as_secs_f64() * 1e3,
                    figures.p99.as_secs_f64() * 1e3,
                    100.0 * conflicts / commits.max(1.0),
                    100.0 * retries / commits.max(1.0),
                    100.0 * figures.unavailable as f64 / (2 * allocations) as f64,
                    per_1k(cpu0.agents, cpu1.agents),
                    per_1k(cpu0.workers, cpu1.workers),
                    per_1k(cpu0.postgres, cpu1.postgres),
                    per_1k(cpu0.bench, cpu1.bench),
                );
            });
        }
    }
}
