//! Failover to a standby (issue 31): three real `allocator` agents reach a PostgreSQL primary that
//! has a streaming-replication standby, through a multi-host URL that selects the writable server
//! (`postgres://alloc@127.0.0.1:P1,127.0.0.1:P2/alloc?target_session_attrs=read-write`). Six
//! clients send allocations and releases to random agents (the harness of `postgres_faults.rs`,
//! `support::faults`); between bursts the primary is SIGKILLed (postmaster and backends) and the
//! operator's runbook runs: synchronous replication switched off on the standby (it would have no
//! standby of its own to wait for), `pg_ctl promote`; the agents must find the new primary by
//! themselves. Then the old primary's directory is rebuilt as a standby of the new one
//! (`pg_basebackup -R`) and started, and synchronous replication switched on again once it
//! streams, so the next cycle fails over the other way.
//!
//! With synchronous replication (`synchronous_standby_names = '*'`, `synchronous_commit = on`) a
//! commit is acknowledged only once the standby has flushed it, so nothing acknowledged may be
//! lost: the final check against the last primary fails on any loss. With asynchronous replication
//! a commit is acknowledged once the primary alone has flushed it, and what had not reached the
//! standby when the primary died is gone after the promotion: those runs count the losses instead
//! (`Ledger::lossy`); everything else is checked the same (nothing stored that was never
//! acknowledged, no VM on two hosts, every agent's view equal to the store).
//!
//! Measured: from `pg_ctl promote` to the first acknowledged allocation through each agent.
//!
//! - `agents_follow_a_promoted_standby`: 3 failovers, synchronous, in the test command.
//! - `agents_follow_a_promoted_asynchronous_standby`: 2 failovers, asynchronous (losses counted).
//! - `a_lagging_asynchronous_standby_loses_acknowledged_writes`: 2 failovers, asynchronous, the
//!   standby held back (its primary's WAL senders stopped) until 20 more writes were acknowledged
//!   before each kill: those are lost, and the harness must find losses (it can fail).
//! - `many_failovers` / `many_asynchronous_failovers` (ignored; `FAILOVER_CYCLES`, default 20): the
//!   long runs of `docs/allocator.md`.

use crate::support;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::faults::{check_store, spread, until_serving_since, Ledger, Load, Losses, AGENTS, CLIENTS, HOSTS};
use support::{start_at, Server};
use test_support::postgres::Postgres;

/// How the standby replicates, and how far behind it is when the primary dies.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// `synchronous_standby_names = '*'`; every other kill comes after the standby stalled a
    /// moment (the primary's WAL senders stopped): commits then wait on the primary, durable
    /// there alone, when it dies.
    Synchronous,
    /// No synchronous standby, a healthy one: what a failover loses on a fast, idle link.
    Asynchronous,
    /// No synchronous standby, and before every kill the WAL senders stopped until the clients
    /// got [`LAG_WRITES`] more acknowledgements: a standby lagging behind, as over a slow link.
    AsynchronousLagging,
}

/// Acknowledged writes that a lagging asynchronous standby misses when the primary dies.
const LAG_WRITES: usize = 20;

struct Run {
    ledger: Ledger,
    /// Acknowledged while the standby was stalled, before the kill (lagging mode).
    lagged: usize,
    losses: Losses,
    /// From `pg_ctl promote` to the first acknowledged allocation, per agent and failover.
    serving: Vec<Duration>,
    /// From `pg_ctl promote` until the rebuilt old primary streams again (synchronously in a
    /// synchronous run): the window in which the new primary's commits are on it alone.
    windows: Vec<Duration>,
}

async fn failover_cycles(cycles: usize, seed: u64, mode: Mode) -> Run {
    let synchronous = mode == Mode::Synchronous;
    let first = Postgres::start();
    if synchronous {
        first.set_synchronous_standby_names("*");
    }
    let second = Postgres::standby_of(&first);
    first.wait_for_standby(synchronous);
    let mut nodes = [first, second];
    let mut primary = 0;
    // Both servers, the writable one chosen at each connection: the agents are never told which.
    let url = format!(
        "postgres://alloc@127.0.0.1:{},127.0.0.1:{}/alloc?target_session_attrs=read-write",
        nodes[0].port, nodes[1].port
    );
    let dir = tempfile::tempdir().unwrap();
    let mut servers: Vec<Server> = Vec::new();
    for _ in 0..AGENTS {
        servers.push(start_at(dir.path(), &url, HOSTS, "").await);
    }
    let load = Load::start(
        servers.iter().map(|s| s.base.clone()).collect(),
        Ledger { lossy: !synchronous, ..Ledger::default() },
    );
    let agents = Arc::clone(&load.agents);
    let probe = reqwest::Client::new();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (mut serving, mut windows, mut lagged) = (Vec::new(), Vec::new(), 0);
    for cycle in 0..cycles {
        load.until_acknowledged(rng.random_range(40..160)).await;
        let (old, new) = (primary, 1 - primary);
        match mode {
            Mode::Synchronous if cycle % 2 == 1 => {
                tokio::task::block_in_place(|| nodes[old].pause_wal_senders());
                tokio::time::sleep(Duration::from_millis(rng.random_range(100..400))).await;
            }
            Mode::AsynchronousLagging => {
                let before = load.acknowledged();
                tokio::task::block_in_place(|| nodes[old].pause_wal_senders());
                let paused = Instant::now();
                while load.acknowledged() < before + LAG_WRITES {
                    assert!(paused.elapsed() < Duration::from_secs(60), "no acknowledgement with the standby stalled");
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                lagged += load.acknowledged() - before;
            }
            _ => {}
        }
        tokio::task::block_in_place(|| nodes[old].crash());
        // The runbook. The standby has `synchronous_standby_names = '*'` (copied from the primary
        // by pg_basebackup); promoted with it, every commit would wait for a standby it does not
        // have. Cleared first (ALTER SYSTEM works on a standby), then promoted.
        let promoting = tokio::task::block_in_place(|| {
            if synchronous {
                nodes[new].set_synchronous_standby_names("");
            }
            let promoting = Instant::now();
            nodes[new].promote();
            if promoting.elapsed() > Duration::from_secs(1) {
                println!("failover {cycle}: pg_ctl promote took {} ms", promoting.elapsed().as_millis());
            }
            promoting
        });
        let probes: Vec<_> = agents
            .iter()
            .enumerate()
            .map(|(i, base)| {
                let (probe, base, ledger) = (probe.clone(), base.clone(), Arc::clone(&load.ledger));
                let id = format!("probe-{cycle}-{i}");
                tokio::spawn(async move { until_serving_since(&probe, &base, &id, &ledger, promoting).await })
            })
            .collect();
        for (i, p) in probes.into_iter().enumerate() {
            let took = p.await.unwrap();
            // The outliers, named for the run's record (which cycle, which agent).
            if took > Duration::from_secs(1) {
                println!("failover {cycle}: agent {i} served again {} ms after the promotion", took.as_millis());
            }
            serving.push(took);
        }
        // The old primary comes back as the new one's standby, under load; synchronous replication
        // is switched on again only once it streams (with no standby, every commit would block).
        let new_port = nodes[new].port;
        tokio::task::block_in_place(|| {
            nodes[old].rebuild_as_standby_of(new_port);
            nodes[new].wait_for_standby(false);
            if synchronous {
                nodes[new].set_synchronous_standby_names("*");
                nodes[new].wait_for_standby(true);
            }
        });
        windows.push(promoting.elapsed());
        primary = new;
    }
    let mut ledger = load.stop().await;
    let losses = check_store(&nodes[primary], &probe, &agents, &mut ledger).await;
    drop(servers);
    Run { ledger, lagged, losses, serving, windows }
}

fn summary(cycles: usize, mode: Mode, run: &Run) -> String {
    let (median, p99, max) = spread(&run.serving);
    let (window_median, _, window_max) = spread(&run.windows);
    let ledger = &run.ledger;
    format!(
        "{cycles} failovers ({}), {AGENTS} agents, {CLIENTS} clients: {} acknowledged writes ({} \
         rejections; {} placed at the end, {} released); lost: {} ({} placements missing at the end, {} releases \
         undone, {} placements found missing by their release); {} answers 503 ({} without Retry-After); from \
         `pg_ctl promote` to the first acknowledged allocation through each agent: median {median:.0} ms, p99 \
         {p99:.0} ms, max {max:.0} ms ({} measurements); promotion until the rebuilt standby streamed{}: median \
         {window_median:.0} ms, max {window_max:.0} ms{}",
        match mode {
            Mode::Synchronous => "synchronous replication, the standby stalled before every other kill",
            Mode::Asynchronous => "asynchronous replication",
            Mode::AsynchronousLagging => "asynchronous replication, the standby lagging at every kill",
        },
        ledger.acknowledged,
        ledger.rejected,
        ledger.placed.len(),
        ledger.released.len(),
        run.losses.total(),
        run.losses.placements.len(),
        run.losses.releases.len(),
        run.losses.found_by_release.len(),
        ledger.unavailable,
        ledger.unavailable_without_retry_after,
        run.serving.len(),
        if mode == Mode::Synchronous { " synchronously" } else { "" },
        if mode == Mode::AsynchronousLagging {
            format!("; {} writes acknowledged while the standby lagged", run.lagged)
        } else {
            String::new()
        },
    )
}

fn cycles() -> usize {
    std::env::var("FAILOVER_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(20)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn agents_follow_a_promoted_standby() {
    let run = failover_cycles(3, 5, Mode::Synchronous).await;
    println!("{}", summary(3, Mode::Synchronous, &run));
    assert_eq!(run.losses.total(), 0);
    assert_eq!(run.ledger.unavailable_without_retry_after, 0, "a 503 must say when to retry");
}

/// Asynchronous replication, healthy standby: losses counted, not asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn agents_follow_a_promoted_asynchronous_standby() {
    let run = failover_cycles(2, 6, Mode::Asynchronous).await;
    println!("{}", summary(2, Mode::Asynchronous, &run));
    assert_eq!(run.ledger.unavailable_without_retry_after, 0, "a 503 must say when to retry");
}

/// The harness can fail: with an asynchronous standby that lags, the writes acknowledged in the
/// lag are gone after the failover, and the final check must count them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lagging_asynchronous_standby_loses_acknowledged_writes() {
    let run = failover_cycles(2, 8, Mode::AsynchronousLagging).await;
    println!("{}", summary(2, Mode::AsynchronousLagging, &run));
    assert!(run.losses.total() > 0, "writes acknowledged while the standby lagged must be found lost");
}

/// The long synchronous run (`FAILOVER_CYCLES`, default 20), recorded in `docs/allocator.md`; its
/// p99 from promotion to serving is held to the 10 s of issue 31.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore]
async fn many_failovers() {
    let cycles = cycles();
    let run = failover_cycles(cycles, 2031, Mode::Synchronous).await;
    println!("{}", summary(cycles, Mode::Synchronous, &run));
    assert_eq!(run.losses.total(), 0);
    assert_eq!(run.ledger.unavailable_without_retry_after, 0, "a 503 must say when to retry");
    let (_, p99, _) = spread(&run.serving);
    assert!(p99 <= 10_000.0, "p99 from promotion to serving {p99:.0} ms, over 10 s");
}

/// The long asynchronous runs (`FAILOVER_CYCLES`, default 20), healthy then lagging: measured, not
/// held to zero loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore]
async fn many_asynchronous_failovers() {
    let cycles = cycles();
    for (mode, seed) in [(Mode::Asynchronous, 2032), (Mode::AsynchronousLagging, 2033)] {
        let run = failover_cycles(cycles, seed, mode).await;
        println!("{}", summary(cycles, mode, &run));
        assert_eq!(run.ledger.unavailable_without_retry_after, 0, "a 503 must say when to retry");
    }
}
