//! HA as operators run it (issue 44): the zone's PostgreSQL under Patroni with etcd (Debian's
//! packages), a synchronous standby and automatic failover, every process in a host of its own on
//! a network lab (`tests/it/support/patroni.rs`: etcd, `pg1`, `pg2`, three `allocator` agents, the
//! clients), faults across real links. Six clients send allocations and releases to random agents
//! (`tests/it/support/faults.rs`), each operation left in doubt sent again until answered. After every
//! cycle the clients pause and the database itself (the primary of the moment) is checked against
//! what was acknowledged: every acknowledged placement there on its host unless acknowledged
//! released, no acknowledged release undone, nothing stored that was never acknowledged, no host
//! over its capacity or using other than what its VMs demand, no VM twice, every agent's view equal
//! to the store; a release answered 404 after a doubt is reconciled against the store (`exits`), so
//! a lost placement cannot hide behind it.
//!
//! - `failover_by_killing_the_primary`: the primary's node is killed (Patroni, PostgreSQL and
//!   everything of its host SIGKILLed at once: a lost machine, not a PostgreSQL crash that Patroni
//!   would restart in place); the standby takes over once the leader key expires; the agents find
//!   it by themselves. Measured: from the fault to each agent's first acknowledged allocation.
//!   Then the node is started again and rejoins as the synchronous standby (pg_rewind).
//! - `failover_by_cutting_the_primarys_link`: the same with the primary's link taken down (packets
//!   vanish both ways: its Patroni cannot renew the key and demotes it, the agents' connections
//!   hang until their `tcp_user_timeout`); healed, it rejoins.
//! - `failover_by_cutting_the_primarys_link_while_agents_wait`: the same, cut while every agent's
//!   statement waits on a lock held there (sent and acknowledged by the primary's TCP, so nothing
//!   is unacknowledged and `tcp_user_timeout` never counts): the agents' keepalives must find the
//!   connections dead. With the kernel's 75 s probe interval no agent served 60 s after the cut.
//! - `an_agent_cut_from_the_database_answers_503_and_catches_up`: one agent cut from both nodes
//!   (both ways) for 16 s, longer than every keepalive and idle timeout on either side, while its
//!   clients still reach it: every write it is sent answers 503 with `Retry-After` within its
//!   deadline; healed, it knows what another agent placed meanwhile and acknowledges again.
//! - `standby_cut_then_primary_killed`: Patroni's default (shipped) synchronous mode: the standby
//!   leaves the synchronous set, commits go on, on the primary alone; then the primary is killed
//!   and the standby, behind, is never promoted; the zone waits (503) until the node is back;
//!   nothing acknowledged is lost. Then strict mode: commits wait while the standby is cut, agents
//!   answer 503 within their deadline; same ending.
//! - `a_weakened_setting_is_caught`: `synchronous_commit = local`, the path between primary and
//!   standby cut (the standby still in the synchronous set, its WAL stream held), the primary
//!   killed, the standby promoted: the same checker must report lost acknowledged placements.
//!
//! `PATRONI_CYCLES=20` for the runs by hand (docs/benchmarks.md); 3 failovers (2 agent cuts) by
//! default. Each test is a whole zone in a lab of its own; up to `PATRONI_ZONES` (default 3) run at
//! once, as many as libtest's threads allow (`scripts/test.sh` gives this binary three). Failover
//! times measured beside another zone include that zone's contention: `PATRONI_ZONES=1` for the
//! figures of docs/benchmarks.md. They need root (network namespaces), and skip with a banner
//! without it unless `NETLAB_REQUIRE=1`.

use crate::support;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use std::future::Future;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use support::faults::{check_store, spread, until_serving_since, Ledger, Load, Losses, AGENTS, CLIENTS};
use support::patroni::{agent_host, Zone, CLIENT, NODES};
use support::vm;

/// The target: from the fault to the first acknowledged allocation (reported by every run;
/// measured over 20 cycles by hand, docs/benchmarks.md).
const TARGET: Duration = Duration::from_secs(15);

/// What fails a run: twice the target. The time is mostly Patroni's (its TTL and loop), but on this
/// shared machine a loaded run read 15.04 s where the quiet ones read 11-13 s, so the test catches
/// a failover that does not happen (agents that never find the new primary), not a slow second.
const FAILS_PAST: Duration = Duration::from_secs(30);

/// The agents' deadline for any request (the HTTP layer's `request_timeout_ms`, 5 s), and the slack
/// allowed on top of it for a loaded machine when checking that a 503 came within it.
const DEADLINE: Duration = Duration::from_secs(5);
const DEADLINE_SLACK: Duration = Duration::from_secs(2);

/// How long an agent is cut from the database: past its `tcp_user_timeout` (5 s), its keepalives
/// (5 s idle + 1 s to the probe that fails), the server's idle-in-transaction timeout (5 s) and the
/// server's own keepalives (5 s idle + 5 probes 2 s apart = 15 s).
const AGENT_CUT: Duration = Duration::from_secs(16);

/// Patroni's ttl in the shipped config: after it, a member that cannot reach etcd is gone from it.
const TTL: Duration = Duration::from_secs(10);

/// Zones running at once, and their limit's wake-ups.
static ZONES: (Mutex<usize>, Condvar) = (Mutex::new(0), Condvar::new());

/// A test's right to run a zone, given back when dropped.
struct ZoneSlot;

/// Waits for a free slot: at most `PATRONI_ZONES` zones at once (default 3; 1 for failover times
/// measured with no other zone beside). The tests wait on Patroni's TTL and loop and on TCP
/// timeouts far more than they compute, so zones side by side shorten the run; the checker's
/// verdicts do not depend on timing, and the failover bound ([`FAILS_PAST`]) is twice the target.
/// libtest runs as many tests at once as `--test-threads` (default: the cores).
fn zone_slot() -> ZoneSlot {
    let limit = std::env::var("PATRONI_ZONES").ok().and_then(|v| v.parse().ok()).unwrap_or(3usize).max(1);
    let (count, freed) = &ZONES;
    let mut running = count.lock().unwrap_or_else(|e| e.into_inner());
    while *running >= limit {
        running = freed.wait(running).unwrap_or_else(|e| e.into_inner());
    }
    *running += 1;
    ZoneSlot
}

impl Drop for ZoneSlot {
    fn drop(&mut self) {
        let (count, freed) = &ZONES;
        *count.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        freed.notify_one();
    }
}

fn cycles(default: usize) -> usize {
    std::env::var("PATRONI_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Starts a zone, or says why not (no root: skipped, unless `NETLAB_REQUIRE=1`).
fn zone(test: &str) -> Option<Arc<Zone>> {
    if !netlab::testing::lab_or_skip(test) {
        return None;
    }
    Some(Arc::new(Zone::start(AGENTS)))
}

/// Runs `body` in the client host, on a runtime of its own thread, and returns what it returns; a
/// panic in it fails the test (after the zone's logs are printed, by its drop).
fn in_client<T, Fut>(zone: &Arc<Zone>, body: impl FnOnce(Arc<Zone>) -> Fut + Send + 'static) -> T
where
    T: Send + 'static,
    Fut: Future<Output = T>,
{
    let inner = Arc::clone(zone);
    match zone.host(CLIENT).spawn_async(move || body(inner)).expect("a thread in the client host").join() {
        Ok(value) => value,
        Err(e) => panic!("the test body failed: {e}"),
    }
}

/// Runs blocking zone operations (processes, psql, Patroni's REST API) off the clients' runtime.
async fn blocking<T: Send + 'static>(zone: &Arc<Zone>, f: impl FnOnce(&Zone) -> T + Send + 'static) -> T {
    let zone = Arc::clone(zone);
    tokio::task::spawn_blocking(move || f(&zone)).await.expect("a blocking zone operation")
}

/// Pauses the clients, checks the database and every agent against the ledger, resumes them.
async fn check_cycle(zone: &Arc<Zone>, load: &Load, probe: &reqwest::Client) -> Losses {
    load.pause().await;
    let mut ledger = std::mem::take(&mut *load.ledger.lock().unwrap());
    let losses = check_store(&**zone, probe, &load.agents, &mut ledger).await;
    *load.ledger.lock().unwrap() = ledger;
    load.resume();
    losses
}

/// Each agent's first acknowledged allocation from `since` (a VM of its own per agent, sent every
/// 20 ms until placed; recorded in the ledger).
async fn agents_serving(load: &Load, probe: &reqwest::Client, prefix: &str, since: Instant) -> Vec<Duration> {
    let tasks: Vec<_> = load
        .agents
        .iter()
        .enumerate()
        .map(|(i, base)| {
            let (probe, base, ledger) = (probe.clone(), base.clone(), Arc::clone(&load.ledger));
            let id = format!("{prefix}-{i}");
            tokio::spawn(async move { until_serving_since(&probe, &base, &id, &ledger, since).await })
        })
        .collect();
    let mut took = Vec::new();
    for task in tasks {
        took.push(task.await.unwrap());
    }
    took
}

/// Sends an allocation of `id` to `base`; asserts that it is answered 503 with `Retry-After`
/// within the agent's deadline (the write cannot commit). Returns how long the answer took.
async fn expect_503(probe: &reqwest::Client, base: &str, id: &str, why: &str) -> Duration {
    let sent = Instant::now();
    let response = probe
        .post(format!("{base}/v1/allocations"))
        .json(&json!({"vm": vm(id, "t", 1.0, 2.0)}))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{base} did not answer {id} ({why}): {e}"));
    let took = sent.elapsed();
    let status = response.status().as_u16();
    let retry_after = response.headers().contains_key("retry-after");
    let body = response.text().await.unwrap_or_default();
    assert_eq!(status, 503, "{base} answered {id} with {status} ({why}): {body}");
    assert!(retry_after, "{base}'s 503 for {id} has no Retry-After ({why}): {body}");
    assert!(took <= DEADLINE + DEADLINE_SLACK, "{base} answered {id} after {took:?}, past its deadline ({why})");
    took
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Fault {
    /// The primary's node killed (every process of its host).
    Kill,
    /// The primary's link taken down.
    Cut,
    /// The primary's link taken down while every agent's statement waits on a lock there: sent,
    /// acknowledged by the primary's TCP, unanswered. No data of the agent's is unacknowledged,
    /// so its `tcp_user_timeout` does not fire; only its keepalives can find the connection dead.
    CutWhileWaiting,
}

#[derive(Default)]
struct FailoverRun {
    ledger: Ledger,
    /// From the fault to the first acknowledged allocation through any agent, per failover.
    first: Vec<Duration>,
    /// From the fault to each agent's first acknowledged allocation.
    per_agent: Vec<Duration>,
    /// From healing (node started again, link up) to a synchronous standby again.
    rejoined: Vec<Duration>,
}

async fn failover_cycles(zone: Arc<Zone>, fault: Fault, cycles: usize, seed: u64) -> FailoverRun {
    let load = Load::start(zone.agent_bases(), Ledger::default());
    let probe = reqwest::Client::new();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut run = FailoverRun::default();
    for cycle in 0..cycles {
        let old = blocking(&zone, |z| z.wait_healthy()).await;
        load.until_acknowledged(rng.random_range(40..160)).await;
        let holder = match fault {
            Fault::CutWhileWaiting => Some(blocking(&zone, move |z| z.hold_agents_tables(old, AGENTS)).await),
            Fault::Kill | Fault::Cut => None,
        };
        let fault_at = Instant::now();
        match fault {
            Fault::Kill => blocking(&zone, move |z| z.kill_node(old)).await,
            Fault::Cut | Fault::CutWhileWaiting => blocking(&zone, move |z| z.link_down(NODES[old])).await,
        }
        let took = agents_serving(&load, &probe, &format!("after-{cycle}"), fault_at).await;
        if let Some(mut holder) = holder {
            // Its session is on the cut node, which has demoted itself: nothing to wait for.
            let _ = holder.kill();
            let _ = holder.wait();
        }
        let new = blocking(&zone, |z| z.leader()).await;
        assert_eq!(new, Some(1 - old), "cycle {cycle}: the agents served again, but not through the standby");
        let first = took.iter().min().copied().unwrap_or_default();
        let healing = Instant::now();
        match fault {
            Fault::Kill => blocking(&zone, move |z| z.start_node(old)).await,
            Fault::Cut | Fault::CutWhileWaiting => blocking(&zone, move |z| z.link_up(NODES[old])).await,
        }
        let leader = blocking(&zone, |z| z.wait_healthy()).await;
        assert_eq!(leader, 1 - old, "cycle {cycle}: the healed node took the lead back");
        run.rejoined.push(healing.elapsed());
        let losses = check_cycle(&zone, &load, &probe).await;
        assert_eq!(losses.total(), 0);
        println!(
            "{fault:?} {cycle}: {} -> {}, first acknowledged allocation {} ms after the fault, each agent's {:?} ms; \
             {} rejoined as the synchronous standby {} ms after healing; {} acknowledged so far, 0 lost",
            NODES[old],
            NODES[1 - old],
            first.as_millis(),
            took.iter().map(Duration::as_millis).collect::<Vec<_>>(),
            NODES[old],
            healing.elapsed().as_millis(),
            load.acknowledged()
        );
        run.first.push(first);
        run.per_agent.extend(took);
    }
    run.ledger = load.stop().await;
    run
}

fn report_failovers(fault: Fault, cycles: usize, run: &FailoverRun) {
    let (first_median, _, first_max) = spread(&run.first);
    let (median, _, max) = spread(&run.per_agent);
    let (rejoin_median, _, rejoin_max) = spread(&run.rejoined);
    let ledger = &run.ledger;
    println!(
        "{cycles} failovers ({}), {AGENTS} agents, {CLIENTS} clients: {} acknowledged writes ({} rejections, {} \
         releases), 0 lost, checked against the database after every failover; {} answers 503 ({} without \
         Retry-After); from the fault to the first acknowledged allocation: median {first_median:.0} ms, max \
         {first_max:.0} ms; to each agent's first: median {median:.0} ms, max {max:.0} ms ({} measurements); the \
         old primary back as the synchronous standby: median {rejoin_median:.0} ms, max {rejoin_max:.0} ms after \
         healing",
        match fault {
            Fault::Kill => "primary's node SIGKILLed",
            Fault::Cut => "primary's link cut",
            Fault::CutWhileWaiting => "primary's link cut while the agents' statements wait on a lock there",
        },
        ledger.acknowledged,
        ledger.rejected,
        ledger.released.len(),
        ledger.unavailable,
        ledger.unavailable_without_retry_after,
        run.per_agent.len(),
    );
    assert_eq!(ledger.unavailable_without_retry_after, 0, "a 503 must say when to retry");
    let slowest = Duration::from_secs_f64(max / 1e3);
    if slowest > TARGET {
        println!(
            "over the {TARGET:?} target: an agent's first acknowledged allocation came {max:.0} ms after the fault"
        );
    }
    assert!(
        slowest <= FAILS_PAST,
        "an agent's first acknowledged allocation came {max:.0} ms after the fault: no failover within {FAILS_PAST:?}"
    );
}

/// One failover test: `fault` repeated `default_cycles` times (`PATRONI_CYCLES` overrides) on a
/// zone of its own, then reported and judged.
fn failover_test(test: &str, fault: Fault, default_cycles: usize, seed: u64) {
    let _slot = zone_slot();
    let Some(zone) = zone(test) else { return };
    let cycles = cycles(default_cycles);
    let run = in_client(&zone, move |zone| failover_cycles(zone, fault, cycles, seed));
    report_failovers(fault, cycles, &run);
}

#[test]
fn failover_by_killing_the_primary() {
    failover_test("failover_by_killing_the_primary", Fault::Kill, 3, 44);
}

#[test]
fn failover_by_cutting_the_primarys_link() {
    failover_test("failover_by_cutting_the_primarys_link", Fault::Cut, 3, 45);
}

/// A commit waiting for the synchronous standby's flush, or a statement waiting on a lock, when
/// the primary vanishes: CI once saw an agent not serve 60 s after the cut (its request had been
/// acknowledged, and keepalives then probed every 75 s, the kernel's default interval).
#[test]
fn failover_by_cutting_the_primarys_link_while_agents_wait() {
    failover_test("failover_by_cutting_the_primarys_link_while_agents_wait", Fault::CutWhileWaiting, 2, 47);
}

#[derive(Default)]
struct AgentCutRun {
    ledger: Ledger,
    /// 503 answers the cut agent gave to the probe while cut, and the slowest of them.
    answers: usize,
    slowest: Duration,
    /// From healing until the cut agent knew the marker placed elsewhere during the cut, and
    /// until it acknowledged a write again.
    knew: Vec<Duration>,
    served: Vec<Duration>,
}

async fn agent_cut_cycles(zone: Arc<Zone>, cycles: usize, seed: u64) -> AgentCutRun {
    let load = Load::start(zone.agent_bases(), Ledger::default());
    let probe = reqwest::Client::new();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut run = AgentCutRun::default();
    for cycle in 0..cycles {
        blocking(&zone, |z| z.wait_healthy()).await;
        load.until_acknowledged(rng.random_range(40..160)).await;
        let (cut, other) = (cycle % AGENTS, (cycle + 1) % AGENTS);
        let (base, name) = (load.agents[cut].clone(), agent_host(cut));
        // Cut from both database nodes, both ways; its clients (and the test) still reach it.
        let host = name.clone();
        blocking(&zone, move |z| NODES.iter().for_each(|node| z.partition(&host, node))).await;
        let cut_at = Instant::now();
        let marker = format!("marker-{cycle}");
        until_serving_since(&probe, &load.agents[other], &marker, &load.ledger, Instant::now()).await;
        // One VM the cut agent is asked to place, again and again, as a client retrying would.
        let id = format!("cut-{cycle}");
        while cut_at.elapsed() < AGENT_CUT {
            let took = expect_503(&probe, &base, &id, "cut from the database").await;
            run.answers += 1;
            run.slowest = run.slowest.max(took);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let host = name.clone();
        blocking(&zone, move |z| NODES.iter().for_each(|node| z.heal_partition(&host, node))).await;
        let healed = Instant::now();
        loop {
            let known = probe.get(format!("{base}/v1/allocations/{marker}")).send().await;
            if known.is_ok_and(|r| r.status() == 200) {
                break;
            }
            assert!(healed.elapsed() < Duration::from_secs(60), "{name} never learnt of {marker} after healing");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let knew = healed.elapsed();
        // The VM it could not place while cut, sent again until answered (it may have committed
        // meanwhile: a replay then).
        let served = until_serving_since(&probe, &base, &id, &load.ledger, healed).await;
        let losses = check_cycle(&zone, &load, &probe).await;
        assert_eq!(losses.total(), 0);
        println!(
            "agent cut {cycle}: {name} cut {} ms, answered 503 with Retry-After {} times so far (slowest {} ms); \
             after healing it knew {marker} in {} ms and acknowledged a write in {} ms",
            AGENT_CUT.as_millis(),
            run.answers,
            run.slowest.as_millis(),
            knew.as_millis(),
            served.as_millis()
        );
        run.knew.push(knew);
        run.served.push(served);
    }
    run.ledger = load.stop().await;
    run
}

#[test]
fn an_agent_cut_from_the_database_answers_503_and_catches_up() {
    let _slot = zone_slot();
    let Some(zone) = zone("an_agent_cut_from_the_database_answers_503_and_catches_up") else { return };
    let cycles = cycles(2);
    let run = in_client(&zone, move |zone| agent_cut_cycles(zone, cycles, 46));
    let (knew_median, _, knew_max) = spread(&run.knew);
    let (served_median, _, served_max) = spread(&run.served);
    let ledger = &run.ledger;
    println!(
        "{cycles} agent cuts of {} s: {} acknowledged writes, 0 lost, checked after every cut; the cut agent \
         answered 503 with Retry-After {} times, the slowest in {} ms; after healing it knew the others' \
         placements in a median {knew_median:.0} ms (max {knew_max:.0} ms) and acknowledged a write in a median \
         {served_median:.0} ms (max {served_max:.0} ms); {} answers 503 in all ({} without Retry-After)",
        AGENT_CUT.as_secs(),
        ledger.acknowledged,
        run.answers,
        run.slowest.as_millis(),
        ledger.unavailable,
        ledger.unavailable_without_retry_after
    );
    assert!(run.answers > 0);
    assert_eq!(ledger.unavailable_without_retry_after, 0, "a 503 must say when to retry");
}

/// The standby cut while the primary runs, then the primary's node killed; `strict`: Patroni's
/// `synchronous_mode_strict`. `ledger`: what the runs before on the same store acknowledged (the
/// check is of the whole store). Returns the ledger after the final check.
async fn standby_cut_then_primary_killed_in(zone: Arc<Zone>, strict: bool, ledger: Ledger) -> Ledger {
    let mode = if strict { "strict" } else { "default" };
    // Each mode's clients with VM ids of their own: both run on the same store.
    let load = Load::start_named(&format!("{mode}-c"), zone.agent_bases(), ledger);
    let probe = reqwest::Client::new();
    let leader = blocking(&zone, |z| z.wait_healthy()).await;
    let standby = 1 - leader;
    if strict {
        blocking(&zone, |z| z.patch_config(&json!({"synchronous_mode_strict": true}))).await;
        // Applied by the leader at its next loop (loop_wait 2 s).
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    load.until_acknowledged(50).await;
    blocking(&zone, move |z| z.link_down(NODES[standby])).await;
    let cut_at = Instant::now();
    if strict {
        // Commits wait for the standby: nothing is acknowledged, agents answer 503 in time.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let before = load.acknowledged();
        for (i, base) in load.agents.iter().enumerate() {
            expect_503(&probe, base, &format!("strict-{i}"), "strict mode, the standby cut").await;
        }
        while cut_at.elapsed() < TTL + Duration::from_secs(2) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(load.acknowledged(), before, "strict mode: a write was acknowledged with the standby cut");
        println!(
            "{mode}: standby {} cut; no write acknowledged for {} ms",
            NODES[standby],
            cut_at.elapsed().as_millis()
        );
    } else {
        // The standby leaves the synchronous set; commits go on, on the primary alone.
        let deadline = Instant::now() + Duration::from_secs(60);
        while blocking(&zone, move |z| z.is_sync_standby(standby)).await {
            assert!(Instant::now() < deadline, "the cut standby stayed in the synchronous set");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let left = cut_at.elapsed();
        let before = load.acknowledged();
        load.until_acknowledged(30).await;
        println!(
            "{mode}: standby {} cut; out of the synchronous set after {} ms; writes acknowledged again (primary \
             alone) {} ms after the cut ({} since)",
            NODES[standby],
            left.as_millis(),
            cut_at.elapsed().as_millis(),
            load.acknowledged() - before
        );
    }
    blocking(&zone, move |z| z.kill_node(leader)).await;
    let killed_at = Instant::now();
    blocking(&zone, move |z| z.link_up(NODES[standby])).await;
    // Three ttl: the standby, behind (default mode) or out of the set (both), is never promoted;
    // every agent answers 503 within its deadline meanwhile.
    let mut round = 0;
    while killed_at.elapsed() < 3 * TTL {
        let role = blocking(&zone, move |z| z.role(standby)).await;
        assert!(
            !matches!(role.as_deref(), Some("master" | "primary")),
            "{mode}: the standby was promoted {} ms after the primary was killed",
            killed_at.elapsed().as_millis()
        );
        for (i, base) in load.agents.iter().enumerate() {
            expect_503(&probe, base, &format!("{mode}-down-{round}-{i}"), "no primary").await;
        }
        round += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "{mode}: {} not promoted in {} ms after the primary was killed",
        NODES[standby],
        killed_at.elapsed().as_millis()
    );
    // The lost node is back: it is the one that may lead, and it has everything.
    let restarted = Instant::now();
    blocking(&zone, move |z| z.start_node(leader)).await;
    let back = blocking(&zone, |z| z.wait_healthy()).await;
    assert_eq!(back, leader, "{mode}: another node than the old primary leads");
    let took = agents_serving(&load, &probe, &format!("{mode}-back"), restarted).await;
    // The VMs sent while no write could commit, sent again until answered (the waiting commits of
    // strict mode may be in the store: replays).
    for round in 0..round {
        for (i, base) in load.agents.iter().enumerate() {
            let id = format!("{mode}-down-{round}-{i}");
            until_serving_since(&probe, base, &id, &load.ledger, Instant::now()).await;
        }
    }
    if strict {
        for (i, base) in load.agents.iter().enumerate() {
            until_serving_since(&probe, base, &format!("strict-{i}"), &load.ledger, Instant::now()).await;
        }
        blocking(&zone, |z| z.patch_config(&json!({"synchronous_mode_strict": false}))).await;
    }
    let losses = check_cycle(&zone, &load, &probe).await;
    assert_eq!(losses.total(), 0);
    println!(
        "{mode}: {} back as the leader; agents served again {:?} ms after its restart; 0 acknowledged writes lost",
        NODES[leader],
        took.iter().map(Duration::as_millis).collect::<Vec<_>>()
    );
    load.stop().await
}

#[test]
fn standby_cut_then_primary_killed() {
    let _slot = zone_slot();
    let Some(zone) = zone("standby_cut_then_primary_killed") else { return };
    let mut ledger = Ledger::default();
    for strict in [false, true] {
        ledger = in_client(&zone, move |zone| standby_cut_then_primary_killed_in(zone, strict, ledger));
        println!(
            "{}: {} acknowledged writes so far, 0 lost; {} answers 503 ({} without Retry-After)",
            if strict { "strict" } else { "default" },
            ledger.acknowledged,
            ledger.unavailable,
            ledger.unavailable_without_retry_after
        );
        assert_eq!(ledger.unavailable_without_retry_after, 0, "a 503 must say when to retry");
    }
}

/// Acknowledged writes the standby misses (its WAL stream held) before the primary is killed.
const LAG_WRITES: usize = 20;

async fn weakened(zone: Arc<Zone>) -> Losses {
    let load = Load::start(zone.agent_bases(), Ledger { lossy: true, ..Ledger::default() });
    let probe = reqwest::Client::new();
    let leader = blocking(&zone, |z| z.wait_healthy()).await;
    // The setting under test: commits acknowledged on the primary's flush alone. The other two
    // changes only arrange the fault, so that whether the standby is promoted does not depend on
    // the machine's speed (it found no loss once in a loaded run): the standby stays in the
    // synchronous set while its stream is held (the WAL sender does not time out), and is not
    // judged too far behind to promote (Patroni compares it with the leader's last report).
    blocking(&zone, |z| {
        z.patch_config(&json!({
            "maximum_lag_on_failover": 1_073_741_824_u64,
            "postgresql": {"parameters": {"synchronous_commit": "local", "wal_sender_timeout": "60s"}}
        }))
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while blocking(&zone, move |z| z.try_psql_on(leader, "allocator", "SHOW synchronous_commit")).await.as_deref()
        != Some("local")
    {
        assert!(Instant::now() < deadline, "synchronous_commit = local not applied");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut found = Losses::default();
    for attempt in 0..3 {
        let leader = blocking(&zone, |z| z.wait_healthy()).await;
        let standby = 1 - leader;
        load.until_acknowledged(50).await;
        // The path between the two cut: the standby receives nothing more, yet stays in the
        // synchronous set for a while (its member key in etcd is alive; its WAL sender has not timed
        // out), so it is the one to promote; the primary acknowledges on its own flush alone.
        blocking(&zone, move |z| z.partition(NODES[leader], NODES[standby])).await;
        let before = load.acknowledged();
        let cut_at = Instant::now();
        while load.acknowledged() < before + LAG_WRITES && cut_at.elapsed() < Duration::from_secs(2) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let lagged = load.acknowledged() - before;
        blocking(&zone, move |z| z.kill_node(leader)).await;
        let killed_at = Instant::now();
        // The path stays cut until the standby is promoted: the killed primary's kernel still holds
        // the WAL its sender wrote into the socket and retransmits it as soon as the path is back,
        // so a heal before the promotion hands the standby every write it missed (what a CI run
        // that found no loss did).
        let promoted = loop {
            if blocking(&zone, |z| z.leader()).await == Some(standby) {
                break true;
            }
            if killed_at.elapsed() > Duration::from_secs(40) {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        blocking(&zone, move |z| z.heal_partition(NODES[leader], NODES[standby])).await;
        if promoted {
            agents_serving(&load, &probe, &format!("weak-{attempt}"), killed_at).await;
            let losses = check_cycle(&zone, &load, &probe).await;
            println!(
                "synchronous_commit = local, attempt {attempt}: {lagged} writes acknowledged with the standby's \
                 stream held, then the primary killed and the standby promoted: {} placements missing, {} releases \
                 undone, {} lost placements found by their release",
                losses.placements.len(),
                losses.releases.len(),
                losses.found_by_release.len()
            );
            found.placements.extend(losses.placements);
            found.releases.extend(losses.releases);
            found.found_by_release.extend(losses.found_by_release);
        } else {
            println!("synchronous_commit = local, attempt {attempt}: the standby was not promoted (judged behind)");
        }
        if found.total() > 0 || attempt == 2 {
            break;
        }
        // Another try: the killed node back as the standby.
        blocking(&zone, move |z| z.start_node(leader)).await;
    }
    load.stop().await;
    found
}

/// The checks can fail: with the shipped setting weakened (`synchronous_commit = local`: commits
/// acknowledged on the primary's flush alone) and a failover to a standby that missed the last of
/// them, the same checker reports lost acknowledged placements.
#[test]
fn a_weakened_setting_is_caught() {
    let _slot = zone_slot();
    let Some(zone) = zone("a_weakened_setting_is_caught") else { return };
    let losses = in_client(&zone, weakened);
    println!(
        "synchronous_commit = local: the checker found {} lost acknowledged writes ({} placements missing, {} \
         releases undone, {} placements found missing by their release)",
        losses.total(),
        losses.placements.len(),
        losses.releases.len(),
        losses.found_by_release.len()
    );
    assert!(
        losses.total() > 0,
        "with synchronous_commit = local and a failover, acknowledged writes must be found lost"
    );
}
