//! Zone throughput against the number of allocation agents, each agent on a host of its own with a
//! round trip to the database between them (issue 44).
//!
//! `cargo bench -p allocator --bench agents_scaleout [-- ALLOCATIONS]` builds hosts on this machine
//! with `netlab` (network namespaces joined by veth pairs; root needed, refused with the reason
//! otherwise): `db` runs a throwaway PostgreSQL cluster and, in front of it, a latency-injecting
//! proxy per row (half the row's round trip each way); `agent0`..`agent7` run the real `allocator`
//! binaries, which reach the database through the proxy; `client` runs the load. Each row starts
//! its agents on a fresh database: `CLIENTS_PER_AGENT` clients per agent (client c talking to
//! agent c mod N, as the control service spreads requests) fill the zone to 60% of its cores, then
//! share ALLOCATIONS allocations (default 4,000 after 400 of warm-up), each followed by the release
//! of the client's oldest VM (two durable writes), a 503 sent again after 5 ms.
//!
//! Columns: `allocations/s` of the zone; `p50` and `p99` of an allocation request until placed;
//! `refused/100`, the batches the store refused per 100 commits (a conflict, decided again);
//! `cores busy`, the CPU of everything (agents, PostgreSQL, proxy and clients) over the elapsed
//! time; `cpu_ms/alloc`, the agents' and PostgreSQL's CPU per allocation (with its release), then
//! split into `agents_ms` and `database_ms`, and the agents' into `following_ms` (their workers'
//! CPU reading and applying other agents' commits, `allocator_follow_cpu_microseconds_total`, and
//! their listener threads', which receive and decode the notified batches) and `deciding_ms`, the
//! rest (HTTP, deciding, committing); `commands/commit`, the zone's durable writes per
//! commit (how much a commit carries, and so what its fixed costs are shared by). The
//! last row, one agent on its SQLite file, is the embedded store's reference (no database, so no
//! round trip).
//!
//! Environment: `SCALEOUT_ROWS=2:1,2:8,0:sqlite` chooses the rows (`RTT_MS:AGENTS`, or
//! `0:sqlite`; default: round trips 0 and 2 ms by 1, 2, 4 and 8 agents, then `0:sqlite`);
//! `SCALEOUT_BASELINE=/path/to/allocator` runs every row first with that binary (a reference
//! build: before and after in one run), each on a database of its own; `SCALEOUT_AGENT_LOG` is the
//! agents' `RUST_LOG` (default `warn`; their log goes to the bench's standard error);
//! `SCALEOUT_POLICY=nilas` places with the recommended NILAS (exact best fit, an 8-hour exit floor,
//! repredicting with the repository's default bundle) instead of `la-binary`.

mod support;

use netlab::{DelayProxy, Lab, ProxyConfig};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::load::drive;
use support::{cpu, metric};
use test_support::postgres;
use test_support::process::{with_config, Process};

const CLIENTS_PER_AGENT: usize = 8;
const MAX_AGENTS: usize = 8;
const HOSTS: usize = 800;
const CORES: usize = 48;
/// VMs of 4.5 cores on average, held by all clients together in the steady state: 60% of the
/// zone's cores.
const ZONE_VMS: usize = HOSTS * CORES * 6 / 10 * 2 / 9;
const WARMUP: usize = 400;
const AGENT_PORT: u16 = 8080;
const PROXY_PORT: u16 = 6432;
/// The agents' counter of the worker's CPU spent following other agents (microseconds).
const FOLLOW_CPU: &str = "allocator_follow_cpu_microseconds_total";

/// One row of the table: a round trip (ms) and a number of PostgreSQL agents, or one agent on
/// SQLite.
#[derive(Clone, Copy)]
enum Row {
    Postgres { rtt_ms: f64, agents: usize },
    Sqlite,
}

fn rows() -> Vec<Row> {
    let default = "0:1,0:2,0:4,0:8,2:1,2:2,2:4,2:8,0:sqlite";
    let text = std::env::var("SCALEOUT_ROWS").unwrap_or_else(|_| default.to_owned());
    text.split(',')
        .filter_map(|row| row.split_once(':'))
        .filter_map(|(rtt, agents)| match agents.trim() {
            "sqlite" => Some(Row::Sqlite),
            n => Some(Row::Postgres {
                rtt_ms: rtt.trim().parse().ok()?,
                agents: n.parse::<usize>().ok()?.clamp(1, MAX_AGENTS),
            }),
        })
        .collect()
}

/// The agents' placement policy (`SCALEOUT_POLICY`): its `[allocator.policy]` body, and the
/// top-level line naming the model bundles' folder when it repredicts.
struct Policy {
    name: &'static str,
    body: &'static str,
    models: String,
}

fn policy() -> Policy {
    match std::env::var("SCALEOUT_POLICY").as_deref() {
        Ok("nilas") => Policy {
            name: "nilas-survival",
            // The recommended NILAS (configs/allocator.toml), repredicting with the default bundle.
            body: "kind = \"nilas\"\nbuckets = \"exact\"\nexit_floor_s = 28800.0\n",
            models: format!("models_dir = \"{}/../models\"\n", env!("CARGO_MANIFEST_DIR")),
        },
        Ok("la-binary") | Err(_) => Policy { name: "la-binary", body: "kind = \"la-binary\"\n", models: String::new() },
        Ok(other) => panic!("SCALEOUT_POLICY: `la-binary` or `nilas`, got `{other}`"),
    }
}

/// Agent `i` in its host's namespace (killed when dropped).
fn start_agent(lab: &Lab, binary: &Path, i: usize, dir: &Path, store: &str) -> Process {
    let policy = policy();
    let host = lab.host(&format!("agent{i}")).expect("agent host");
    let config = dir.join(format!("agent{i}.toml"));
    std::fs::write(
        &config,
        format!(
            "listen = \"{}\"\nstore = \"{store}\"\n{}\n[generate]\nhosts = {HOSTS}\nhosts_per_rack = 20\ncores = {CORES}\nmemory_gib = 384\n\n[allocator.policy]\n{}",
            host.socket_addr(AGENT_PORT),
            policy.models,
            policy.body,
        ),
    )
    .expect("config written");
    let child = with_config(&mut host.command(binary), &config)
        .env("RUST_LOG", std::env::var("SCALEOUT_AGENT_LOG").unwrap_or_else(|_| "warn".to_owned()))
        .env("ALLOCATOR_SERVICE_TOKEN", support::SERVICE_TOKEN)
        .env_remove("ALLOCATOR_SERVICE_TOKEN_FILE")
        .spawn()
        .expect("allocator started");
    Process::new(child, format!("http://{}", host.socket_addr(AGENT_PORT)), format!("agent{i}"))
}

async fn wait_ready(base: &str) {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !client.get(format!("{base}/readyz")).send().await.is_ok_and(|r| r.status().is_success()) {
        assert!(Instant::now() < deadline, "agent {base} did not become ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn counter(bases: &[String], name: &str) -> f64 {
    let mut sum = 0.0;
    for base in bases {
        sum += metric(base, name).await;
    }
    sum
}

/// What one row measured.
struct Measured {
    figures: support::load::Figures,
    commits: f64,
    conflicts: f64,
    /// Clock ticks over the measured allocations: the agents, PostgreSQL, and everything.
    agent_ticks: u64,
    /// Of the agents' CPU, following others' commits: the workers' (seconds, from
    /// `allocator_follow_cpu_microseconds_total`) and the listener threads' (clock ticks).
    follow_worker_s: f64,
    listener_ticks: u64,
    database_ticks: u64,
    all_ticks: u64,
    elapsed_s: f64,
}

/// Starts the row's agents, loads the zone and measures; runs in the client host's namespace.
#[allow(clippy::too_many_arguments)]
async fn run_row(
    lab: Arc<Lab>,
    binary: PathBuf,
    dir: PathBuf,
    store: String,
    agents: usize,
    allocations: usize,
    postmaster: Option<u32>,
    row: usize,
) -> Measured {
    let agents: Vec<Process> = (0..agents).map(|i| start_agent(&lab, &binary, i, &dir, &store)).collect();
    let bases: Vec<String> = agents.iter().map(|agent| agent.base.clone()).collect();
    for base in &bases {
        wait_ready(base).await;
    }
    let clients = CLIENTS_PER_AGENT * agents.len();
    let keep = ZONE_VMS / clients;
    let mut held = vec![VecDeque::new(); clients];
    drive(&bases, keep * clients, &format!("fill{row}"), &mut held, keep).await;
    drive(&bases, WARMUP, &format!("warm{row}"), &mut held, keep).await;
    let (commits0, conflicts0) =
        (counter(&bases, "allocator_commits_total").await, counter(&bases, "allocator_commit_conflicts_total").await);
    let follow0 = counter(&bases, FOLLOW_CPU).await;
    let pids: Vec<u32> = agents.iter().map(|agent| agent.id().expect("a running agent")).collect();
    let agent = || pids.iter().map(|pid| cpu::process(*pid)).sum::<u64>();
    let database = || postmaster.map_or(0, cpu::tree);
    let listeners = || pids.iter().map(|pid| cpu::thread(*pid, "allocator-listen")).sum::<u64>();
    let everything = || agent() + database() + cpu::process(std::process::id());
    let (agent0, listen0, database0, all0, started) = (agent(), listeners(), database(), everything(), Instant::now());
    let figures = drive(&bases, allocations, &format!("r{row}"), &mut held, keep).await;
    let (agent1, listen1, database1, all1, elapsed_s) =
        (agent(), listeners(), database(), everything(), started.elapsed().as_secs_f64());
    Measured {
        figures,
        commits: counter(&bases, "allocator_commits_total").await - commits0,
        conflicts: counter(&bases, "allocator_commit_conflicts_total").await - conflicts0,
        agent_ticks: agent1.saturating_sub(agent0),
        follow_worker_s: (counter(&bases, FOLLOW_CPU).await - follow0) * 1e-6,
        listener_ticks: listen1.saturating_sub(listen0),
        database_ticks: database1.saturating_sub(database0),
        all_ticks: all1.saturating_sub(all0),
        elapsed_s,
    }
}

fn main() {
    let allocations: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(4_000).max(100);
    if let Err(error) = Lab::available() {
        eprintln!("agents_scaleout needs network namespaces: {error}");
        std::process::exit(2);
    }
    let mut names = vec!["db".to_owned(), "client".to_owned()];
    names.extend((0..MAX_AGENTS).map(|i| format!("agent{i}")));
    let lab = Arc::new(Lab::new(names).expect("the lab's hosts"));
    let db = lab.host("db").expect("db host").clone();
    let client = lab.host("client").expect("client host").clone();
    // The cluster runs in the database host's namespace (its children inherit the thread's).
    let pg = Arc::new(db.run(postgres::Postgres::start).expect("PostgreSQL in the db host"));
    let postmaster = std::fs::read_to_string(pg.data_dir().join("data").join("postmaster.pid"))
        .ok()
        .and_then(|pid| pid.lines().next().and_then(|line| line.trim().parse().ok()));
    let dir = tempfile::Builder::new().prefix("scaleout-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let ticks = cpu::ticks_per_s();
    println!(
        "zone throughput by agents: {allocations} allocations (+ as many releases) per row, {CLIENTS_PER_AGENT} clients per agent, {HOSTS} hosts, {}; each agent, the database and the clients on hosts of their own (network namespaces), the round trip from a delaying proxy",
        policy().name
    );
    let mut binaries: Vec<(&str, PathBuf)> = Vec::new();
    if let Some(baseline) = std::env::var_os("SCALEOUT_BASELINE") {
        binaries.push(("reference", PathBuf::from(baseline)));
    }
    binaries.push(("this build", PathBuf::from(env!("CARGO_BIN_EXE_allocator"))));
    println!(
        "| binary | agents | store | rtt_ms | allocations/s | p50 | p99 | refused/100 | cores busy | cpu_ms/alloc | agents_ms | deciding_ms | following_ms | database_ms | commands/commit |"
    );
    println!("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let runs = rows().into_iter().flat_map(|row| binaries.iter().map(move |binary| (row, binary)));
    for (row, (kind, (label, binary))) in runs.enumerate() {
        let (store, agents, rtt_ms, _proxy) = match kind {
            Row::Sqlite => (dir.path().join(format!("row{row}.db")).display().to_string(), 1, 0.0, None),
            Row::Postgres { rtt_ms, agents } => {
                let name = format!("scaleout{row}");
                let admin = Arc::clone(&pg);
                db.run(move || admin.psql(&format!("CREATE DATABASE {name}"))).expect("database created");
                let delay = Duration::from_secs_f64(rtt_ms / 2000.0);
                let listen = db.socket_addr(PROXY_PORT + row as u16);
                let upstream = std::net::SocketAddr::from(([127, 0, 0, 1], pg.port));
                let proxy = DelayProxy::start_in(&db, listen, upstream, ProxyConfig::delay(delay)).expect("proxy");
                (format!("postgres://alloc@{listen}/scaleout{row}"), agents, rtt_ms, Some(proxy))
            }
        };
        let (lab, dir, binary) = (Arc::clone(&lab), dir.path().to_owned(), binary.clone());
        let postmaster = if matches!(kind, Row::Sqlite) { None } else { postmaster };
        let measured = client
            .spawn_async(move || run_row(lab, binary, dir, store, agents, allocations, postmaster, row))
            .expect("the client host")
            .join()
            .expect("the row ran");
        let figures = &measured.figures;
        let per_allocation_ms = 1e3 / ticks / allocations as f64;
        let agents_ms = measured.agent_ticks as f64 * per_allocation_ms;
        let following_ms =
            measured.listener_ticks as f64 * per_allocation_ms + measured.follow_worker_s * 1e3 / allocations as f64;
        println!(
            "| {label} | {agents} | {} | {rtt_ms:.0} | {:.0} | {:.2} ms | {:.2} ms | {:.2} | {:.2} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.1} |",
            if matches!(kind, Row::Sqlite) { "sqlite" } else { "postgres" },
            figures.allocations_per_s,
            figures.p50.as_secs_f64() * 1e3,
            figures.p99.as_secs_f64() * 1e3,
            100.0 * measured.conflicts / measured.commits.max(1.0),
            measured.all_ticks as f64 / ticks / measured.elapsed_s,
            (measured.agent_ticks + measured.database_ticks) as f64 * per_allocation_ms,
            agents_ms,
            (agents_ms - following_ms).max(0.0),
            following_ms,
            measured.database_ticks as f64 * per_allocation_ms,
            // Each allocation comes with a release: two commands.
            2.0 * allocations as f64 / measured.commits.max(1.0),
        );
    }
}
