//! The first answer stands (issue 56): a client that sends the same request twice at the same
//! moment (a retry after a timeout, sent to the same agent or to another one) gets one answer for
//! it, placed (the second replayed, on the same hosts) or rejected, never one of each, whatever
//! the batching, the follow, a conflict decided again or a kill in between.
//!
//! Real `allocator` binaries on a small, dense inventory: six clients each send single VMs and
//! gangs, each request twice at once, with a release of one of their earlier VMs sent beside it
//! (so that capacity frees up between the two copies), while agents are SIGKILLed and restarted.
//! A copy left without an answer (a 503, or no answer) is sent again to a random agent until it
//! is answered; every answer counts. Checked: every pair's answers agree, rejections and gangs
//! happened (so the check can fail), and at the end every agent's view holds exactly the VMs the
//! clients were told are placed, on their hosts, and no agent reloaded because a followed change
//! contradicted its view. Each run prints its reloads by reason
//! (`allocator_reloads_total`, scraped from each agent before it is killed and at the end).
//!
//! - `duplicate_sends_on_sqlite_get_one_answer`: one agent on the embedded store.
//! - `duplicate_sends_on_postgres_get_one_answer`: three agents on one PostgreSQL database, each
//!   pair to one agent or to two.
//! - `many_duplicate_sends_get_one_answer` (ignored; `DUPLICATE_PAIRS` per store, default 10,000,
//!   and `DUPLICATE_KILLS`, default 12): both stores, the long run of the closing note.

use crate::support;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{start_restartable_at, vm, Server};
use test_support::postgres::Postgres;

/// Hosts of 16 cores: few, so that requests are often rejected and capacity comes and goes.
const HOSTS: usize = 8;
const CLIENTS: usize = 6;
/// The most requests a client keeps placed.
const LIVE: usize = 5;

/// The answer to one copy of a request.
#[derive(Clone, Debug, PartialEq)]
enum Answer {
    /// Each VM with its host, by VM id.
    Placed(BTreeMap<String, String>),
    /// The rejection's code.
    Rejected(String),
}

/// A pair whose answers disagree: the bug.
#[derive(Debug)]
struct Mismatch {
    ids: Vec<String>,
    answers: Vec<(usize, Answer)>,
}

/// What the pairs came to.
#[derive(Debug, Default)]
struct Figures {
    pairs: usize,
    placed: usize,
    rejected: usize,
    gangs_placed: usize,
    gangs_rejected: usize,
    /// Pairs sent to two different agents.
    to_two_agents: usize,
    /// Copies sent again after a 503 or no answer.
    resent: usize,
    mismatches: Vec<Mismatch>,
}

/// Where the run is: how many pairs are answered, and the VMs the clients hold, by id (with the host
/// they were told).
#[derive(Default)]
struct Shared {
    answered: AtomicUsize,
    figures: Mutex<Figures>,
    placed: Mutex<HashMap<String, String>>,
}

/// The store the agents share.
enum Store {
    Sqlite,
    Postgres(Postgres),
}

/// Runs `pairs` duplicate sends from [`CLIENTS`] clients against `agents` agents on `store`,
/// SIGKILLing a random agent `kills` times along the way; returns the figures and the reloads by
/// metric line (name and labels).
async fn run(store: Store, agents: usize, pairs: usize, kills: usize, seed: u64) -> (Figures, BTreeMap<String, f64>) {
    let dir = tempfile::tempdir().unwrap();
    let location = match &store {
        Store::Sqlite => dir.path().join("allocator.db").display().to_string(),
        Store::Postgres(pg) => pg.url.clone(),
    };
    let mut servers: Vec<Server> = Vec::new();
    for _ in 0..agents {
        servers.push(start_restartable_at(dir.path(), &location, HOSTS, "").await);
    }
    let bases: Arc<Vec<String>> = Arc::new(servers.iter().map(|s| s.base.clone()).collect());
    let shared = Arc::new(Shared::default());
    let per_client = pairs.div_ceil(CLIENTS);
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (bases, shared) = (Arc::clone(&bases), Arc::clone(&shared));
            tokio::spawn(client_loop(c, per_client, bases, shared, seed))
        })
        .collect();
    // The kills, spread over the run by the pairs answered.
    let mut reloads = BTreeMap::new();
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6b69_6c6c);
    let total = per_client * CLIENTS;
    for kill in 1..=kills {
        let due = total * kill / (kills + 1);
        while shared.answered.load(Ordering::SeqCst) < due {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let victim = rng.random_range(0..servers.len());
        add_reloads(&mut reloads, &servers[victim].base).await;
        servers[victim].restart(Duration::from_secs(30)).await;
    }
    for client in clients {
        client.await.unwrap();
    }
    let placed = shared.placed.lock().unwrap().clone();
    let http = reqwest::Client::new();
    for server in &servers {
        let mut seen: HashMap<String, String> = HashMap::new();
        for host in support::hosts(&http, server).await {
            let id = host["host_id"].as_str().unwrap().to_owned();
            for vm in host["vms"].as_array().unwrap() {
                let vm = vm.as_str().unwrap().to_owned();
                assert!(seen.insert(vm.clone(), id.clone()).is_none(), "{}: {vm} on two hosts", server.base);
            }
        }
        assert_eq!(seen, placed, "{}: the view differs from what the clients were told", server.base);
        add_reloads(&mut reloads, &server.base).await;
    }
    drop(servers);
    drop(store);
    let figures = std::mem::take(&mut *shared.figures.lock().unwrap());
    (figures, reloads)
}

/// The counters a run reports: reloads by reason, and notifications that arrived ahead of a
/// commit below them (each a log read instead of a reload).
const COUNTERS: [&str; 3] =
    ["allocator_reloads_total", "allocator_follow_rebuilds_total", "allocator_notified_gaps_total"];

/// Adds the [`COUNTERS`] of the agent at `base` (each line, by its labels) to `into`.
async fn add_reloads(into: &mut BTreeMap<String, f64>, base: &str) {
    let Ok(response) = reqwest::get(format!("{base}/metrics")).await else { return };
    let text = response.text().await.unwrap_or_default();
    for line in text.lines().filter(|l| COUNTERS.iter().any(|name| l.starts_with(name))) {
        if let Some((series, value)) = line.rsplit_once(' ') {
            *into.entry(series.to_owned()).or_default() += value.parse::<f64>().unwrap_or(0.0);
        }
    }
}

/// One client: `pairs` requests, each sent twice at once, with a release of an earlier request's
/// VMs beside it.
async fn client_loop(c: usize, pairs: usize, bases: Arc<Vec<String>>, shared: Arc<Shared>, seed: u64) {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed.wrapping_mul(31).wrapping_add(c as u64));
    let mut mine: Vec<Vec<String>> = Vec::new();
    for step in 0..pairs {
        let gang = rng.random_bool(0.3);
        let size = if gang { rng.random_range(2..=4) } else { 1 };
        let ids: Vec<String> = (0..size).map(|g| format!("c{c}-{step}-g{g}")).collect();
        let tenant = format!("t{c}");
        let vms: Vec<Value> = ids
            .iter()
            .map(|id| {
                let cores = f64::from(rng.random_range(2..=if gang { 6 } else { 12 }));
                vm(id, &tenant, cores, cores * 2.0)
            })
            .collect();
        let body = if gang { json!({"gang": {"tenant_id": tenant, "vms": vms}}) } else { json!({"vm": vms[0]}) };
        let first = rng.random_range(0..bases.len());
        let second = if bases.len() > 1 && rng.random_bool(0.5) {
            (first + rng.random_range(1..bases.len())) % bases.len()
        } else {
            first
        };
        let release = (!mine.is_empty() && (mine.len() >= LIVE || rng.random_bool(0.6)))
            .then(|| mine.swap_remove(rng.random_range(0..mine.len())));
        let (a, b, ()) = tokio::join!(
            decide(&http, &bases, first, &body, seed ^ (step as u64) << 8),
            decide(&http, &bases, second, &body, seed ^ (step as u64) << 16),
            release_all(&http, &bases, release.as_deref().unwrap_or_default(), &shared),
        );
        let mut figures = shared.figures.lock().unwrap();
        figures.pairs += 1;
        figures.to_two_agents += usize::from(first != second);
        figures.resent += a.2 + b.2;
        match (&a.1, &b.1) {
            (Answer::Placed(x), Answer::Placed(y)) if x == y => {
                figures.placed += 1;
                figures.gangs_placed += usize::from(gang);
                shared.placed.lock().unwrap().extend(x.clone());
                mine.push(ids);
            }
            (Answer::Rejected(_), Answer::Rejected(_)) => {
                figures.rejected += 1;
                figures.gangs_rejected += usize::from(gang);
            }
            _ => {
                // Whatever ended placed is the clients' to release: keep it.
                if let Some(Answer::Placed(x)) = [&a.1, &b.1].into_iter().find(|x| matches!(x, Answer::Placed(_))) {
                    shared.placed.lock().unwrap().extend(x.clone());
                    mine.push(ids.clone());
                }
                figures.mismatches.push(Mismatch { ids, answers: vec![(a.0, a.1), (b.0, b.1)] });
            }
        }
        drop(figures);
        shared.answered.fetch_add(1, Ordering::SeqCst);
    }
}

/// Sends `body` to agent `first` until it is answered (a 503 or no answer: again, to a random
/// agent); returns the agent that answered, the answer and how many times it was sent again.
async fn decide(
    http: &reqwest::Client,
    bases: &[String],
    first: usize,
    body: &Value,
    seed: u64,
) -> (usize, Answer, usize) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let started = Instant::now();
    let mut agent = first;
    for resent in 0.. {
        if let Some(answer) = allocate(http, &bases[agent], body).await {
            return (agent, answer, resent);
        }
        assert!(started.elapsed() < Duration::from_secs(60), "no agent answered {body} within 60 s");
        tokio::time::sleep(Duration::from_millis(25)).await;
        agent = rng.random_range(0..bases.len());
    }
    unreachable!()
}

/// One copy of an allocation: its answer, or `None` when it is in doubt (a 503, or no answer).
async fn allocate(http: &reqwest::Client, base: &str, body: &Value) -> Option<Answer> {
    let response = http.post(format!("{base}/v1/allocations")).json(body).send().await.ok()?;
    let status = response.status().as_u16();
    let decision: Value = response.json().await.ok()?;
    match (status, decision["status"].as_str()) {
        (503, _) => None,
        (200 | 201, Some("placed")) => Some(Answer::Placed(
            decision["placements"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (p["vm_id"].as_str().unwrap().to_owned(), p["host_id"].as_str().unwrap().to_owned()))
                .collect(),
        )),
        (200, Some("rejected")) => {
            Some(Answer::Rejected(decision["rejection"]["code"].as_str().unwrap_or("").to_owned()))
        }
        _ => panic!("{base}: {body}: unexpected {status}: {decision}"),
    }
}

/// Releases each of `ids` (placed), sending each again until it is answered; a 404 is expected only
/// for a release sent again (the first may have committed).
async fn release_all(http: &reqwest::Client, bases: &[String], ids: &[String], shared: &Shared) {
    for id in ids {
        let started = Instant::now();
        for attempt in 0usize.. {
            let base = &bases[(attempt + id.len()) % bases.len()];
            let status = http.delete(format!("{base}/v1/allocations/{id}")).send().await.map(|r| r.status().as_u16());
            match status {
                Ok(204) => break,
                Ok(404) if attempt > 0 => break,
                Ok(404) => panic!("{base}: {id} was acknowledged placed and is unknown"),
                Ok(503) | Err(_) => {}
                Ok(other) => panic!("{base}: release of {id}: unexpected {other}"),
            }
            assert!(started.elapsed() < Duration::from_secs(60), "no agent released {id} within 60 s");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        shared.placed.lock().unwrap().remove(id);
    }
}

/// Prints what a run came to.
fn report(name: &str, figures: &Figures, reloads: &BTreeMap<String, f64>) {
    eprintln!(
        "{name}: {} pairs ({} to two agents): {} placed ({} gangs), {} rejected ({} gangs), {} copies sent again; \
         {} with two answers",
        figures.pairs,
        figures.to_two_agents,
        figures.placed,
        figures.gangs_placed,
        figures.rejected,
        figures.gangs_rejected,
        figures.resent,
        figures.mismatches.len()
    );
    eprintln!("{name}: reloads: {reloads:?}");
}

/// Every pair got one answer, no agent found a followed change contradicting its view, and the
/// run had enough of each kind to tell.
fn check(name: &str, figures: &Figures, reloads: &BTreeMap<String, f64>) {
    let contradictions: Vec<_> = reloads.iter().filter(|(series, _)| series.contains("follow_contradiction")).collect();
    assert!(contradictions.is_empty(), "{name}: followed changes contradicted a view: {contradictions:?}");
    let examples: Vec<String> =
        figures.mismatches.iter().take(5).map(|m| format!("{:?} answered {:?}", m.ids, m.answers)).collect();
    assert!(
        figures.mismatches.is_empty(),
        "{name}: {} pairs got two different answers (agent, answer), e.g. {examples:#?}",
        figures.mismatches.len(),
    );
    assert!(
        figures.gangs_rejected > 0 && figures.rejected > figures.gangs_rejected,
        "{name}: too few rejections to tell: {figures:?}"
    );
    assert!(
        figures.gangs_placed > 0 && figures.placed > figures.gangs_placed,
        "{name}: too few placements to tell: {figures:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicate_sends_on_sqlite_get_one_answer() {
    let (figures, reloads) = run(Store::Sqlite, 1, 2500, 4, 56).await;
    report("sqlite", &figures, &reloads);
    check("sqlite", &figures, &reloads);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicate_sends_on_postgres_get_one_answer() {
    let (figures, reloads) = run(Store::Postgres(Postgres::start()), 3, 2500, 4, 57).await;
    report("postgres", &figures, &reloads);
    assert!(figures.to_two_agents > 0);
    check("postgres", &figures, &reloads);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "long: DUPLICATE_PAIRS (default 10,000) pairs per store, DUPLICATE_KILLS (default 12) kills"]
async fn many_duplicate_sends_get_one_answer() {
    let var = |name: &str, default: usize| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let (pairs, kills) = (var("DUPLICATE_PAIRS", 10_000), var("DUPLICATE_KILLS", 12));
    let (sqlite, sqlite_reloads) = run(Store::Sqlite, 1, pairs, kills, 560).await;
    let (postgres, postgres_reloads) = run(Store::Postgres(Postgres::start()), 3, pairs, kills, 570).await;
    report("sqlite", &sqlite, &sqlite_reloads);
    report("postgres", &postgres, &postgres_reloads);
    check("sqlite", &sqlite, &sqlite_reloads);
    check("postgres", &postgres, &postgres_reloads);
}
