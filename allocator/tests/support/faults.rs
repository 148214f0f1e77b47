//! The fault harness shared by `postgres_faults.rs` (crashes, partitions) and
//! `postgres_failover.rs` (failover to a standby): clients that send allocations and releases of
//! their own to random agents, a ledger of what was acknowledged, and the final check of the store
//! and of every agent's view against that ledger.

#![allow(dead_code)]

use super::postgres::Postgres;
use super::vm;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const AGENTS: usize = 3;
pub const CLIENTS: usize = 6;
/// Hosts of 16 cores: enough that most requests fit, few enough that hosts fill and empty.
pub const HOSTS: usize = 40;

/// A client's write.
#[derive(Clone, Debug)]
pub enum Op {
    Allocate { id: String, cores: u32 },
    Release(String),
}

/// What the clients know for sure, together.
#[derive(Default)]
pub struct Ledger {
    /// Acknowledged placements not released since: VM -> host.
    pub placed: HashMap<String, String>,
    /// Acknowledged releases.
    pub released: HashSet<String>,
    /// Acknowledged writes (placements, rejections, releases).
    pub acknowledged: usize,
    pub rejected: usize,
    /// 503 answers, and those of them without `Retry-After`.
    pub unavailable: usize,
    pub unavailable_without_retry_after: usize,
    /// A store that may lose acknowledged writes (asynchronous replication): what would be a
    /// failure is counted instead, so the loss can be measured.
    pub lossy: bool,
    /// Acknowledged placements found missing while the clients ran: a release of one answered 404
    /// when it was sent for the first time (only in a lossy run; else a failure).
    pub lost_found_by_release: Vec<String>,
}

/// Acknowledged writes the store does not hold (always none unless the ledger is lossy).
#[derive(Debug, Default)]
pub struct Losses {
    /// Acknowledged placements missing from the store (or on another host), at the end.
    pub placements: Vec<String>,
    /// Acknowledged releases whose VM is back in the store.
    pub releases: Vec<String>,
    /// Acknowledged placements found missing during the run ([`Ledger::lost_found_by_release`]).
    pub found_by_release: Vec<String>,
}

impl Losses {
    pub fn total(&self) -> usize {
        self.placements.len() + self.releases.len() + self.found_by_release.len()
    }
}

/// Sends one allocation or release to `base`; true when it was answered for sure. `retry`: it was
/// sent before and left in doubt (a 503, or no answer), so it may have been carried out already.
pub async fn send_op(client: &reqwest::Client, base: &str, op: &Op, ledger: &Mutex<Ledger>, retry: bool) -> bool {
    let request = match op {
        Op::Allocate { id, cores } => client
            .post(format!("{base}/v1/allocations"))
            .json(&json!({"vm": vm(id, "t", f64::from(*cores), f64::from(*cores) * 2.0)})),
        Op::Release(id) => client.delete(format!("{base}/v1/allocations/{id}")),
    };
    let Ok(response) = request.timeout(Duration::from_secs(10)).send().await else { return false };
    let status = response.status().as_u16();
    let retry_after = response.headers().contains_key("retry-after");
    let Ok(body) = response.bytes().await else { return false };
    let mut ledger = ledger.lock().unwrap();
    if status == 503 {
        ledger.unavailable += 1;
        if !retry_after {
            ledger.unavailable_without_retry_after += 1;
        }
        return false;
    }
    match op {
        Op::Allocate { id, .. } => {
            let decision: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            match (status, decision["status"].as_str()) {
                (200 | 201, Some("placed")) => {
                    let host = decision["placements"][0]["host_id"].as_str().unwrap_or_default().to_owned();
                    assert!(!ledger.released.contains(id), "{id} placed again after its release: {decision}");
                    if let Some(before) = ledger.placed.insert(id.clone(), host.clone()) {
                        assert_eq!(before, host, "{id} acknowledged on two hosts");
                    }
                }
                (200, Some("rejected")) => {
                    ledger.rejected += 1;
                    assert!(!ledger.placed.contains_key(id), "{id} acknowledged placed, then rejected: {decision}");
                }
                _ => panic!("allocation of {id}: unexpected {status}: {}", String::from_utf8_lossy(&body)),
            }
        }
        Op::Release(id) => match status {
            204 => {
                ledger.placed.remove(id);
                ledger.released.insert(id.clone());
            }
            // A release left in doubt that was committed after all: the VM is gone already.
            404 if retry => {
                ledger.placed.remove(id);
                ledger.released.insert(id.clone());
            }
            // The placement was acknowledged and the store lost it: counted, and the client
            // forgets the VM, as a real one would on a 404.
            404 if ledger.lossy => {
                ledger.placed.remove(id);
                ledger.lost_found_by_release.push(id.clone());
            }
            404 => panic!("{id} was acknowledged placed on {:?} and {base} does not know it", ledger.placed.get(id)),
            _ => panic!("release of {id}: unexpected {status}: {}", String::from_utf8_lossy(&body)),
        },
    }
    ledger.acknowledged += 1;
    true
}

/// One client: new VMs and releases of its own, each to a random agent, until `stop`. An operation
/// left in doubt is sent again, to a random agent, until it is answered, as a real client would.
pub async fn client_loop(index: usize, agents: Arc<Vec<String>>, ledger: Arc<Mutex<Ledger>>, stop: Arc<AtomicBool>) {
    let client = reqwest::Client::new();
    let mut rng = ChaCha8Rng::seed_from_u64(31 + index as u64);
    let mut own: Vec<String> = Vec::new();
    let mut next = 0;
    while !stop.load(Ordering::SeqCst) {
        let op = if own.is_empty() || (own.len() < 30 && rng.random_bool(0.6)) {
            next += 1;
            Op::Allocate { id: format!("c{index}-{next}"), cores: rng.random_range(1..=4) }
        } else {
            Op::Release(own.swap_remove(rng.random_range(0..own.len())))
        };
        let mut retry = false;
        while !send_op(&client, &agents[rng.random_range(0..agents.len())], &op, &ledger, retry).await {
            retry = true;
            // `Retry-After: 1` says a second; a quarter keeps the outage well covered.
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        if let Op::Allocate { id, .. } = &op {
            if ledger.lock().unwrap().placed.contains_key(id) {
                own.push(id.clone());
            }
        }
    }
}

/// The agents at `agents` under load from [`CLIENTS`] clients ([`client_loop`]) sharing one ledger.
pub struct Load {
    pub agents: Arc<Vec<String>>,
    pub ledger: Arc<Mutex<Ledger>>,
    stop: Arc<AtomicBool>,
    clients: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// Starts the clients, recording into `ledger`.
    pub fn start(agents: Vec<String>, ledger: Ledger) -> Load {
        let agents = Arc::new(agents);
        let ledger = Arc::new(Mutex::new(ledger));
        let stop = Arc::new(AtomicBool::new(false));
        let clients = (0..CLIENTS)
            .map(|i| tokio::spawn(client_loop(i, Arc::clone(&agents), Arc::clone(&ledger), Arc::clone(&stop))))
            .collect();
        Load { agents, ledger, stop, clients }
    }

    pub fn acknowledged(&self) -> usize {
        self.ledger.lock().unwrap().acknowledged
    }

    /// Waits until the clients have had `more` writes acknowledged.
    pub async fn until_acknowledged(&self, more: usize) {
        let target = self.acknowledged() + more;
        while self.acknowledged() < target {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Stops the clients once their operations in flight are answered; returns the ledger.
    pub async fn stop(self) -> Ledger {
        self.stop.store(true, Ordering::SeqCst);
        for client in self.clients {
            client.await.unwrap();
        }
        Arc::try_unwrap(self.ledger).ok().unwrap().into_inner().unwrap()
    }
}

/// Waits until `base` acknowledges a placement again; returns how long that took.
pub async fn until_serving(client: &reqwest::Client, base: &str, id: &str, ledger: &Mutex<Ledger>) -> Duration {
    until_serving_since(client, base, id, ledger, Instant::now()).await
}

/// Waits until `base` acknowledges a placement again, trying every 20 ms; returns how long that
/// took since `since` (an event all agents are measured from, such as a promotion).
pub async fn until_serving_since(
    client: &reqwest::Client,
    base: &str,
    id: &str,
    ledger: &Mutex<Ledger>,
    since: Instant,
) -> Duration {
    let op = Op::Allocate { id: id.to_owned(), cores: 1 };
    let mut retry = false;
    while !send_op(client, base, &op, ledger, retry).await {
        retry = true;
        assert!(since.elapsed() < Duration::from_secs(60), "{base} did not serve again after the database came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    since.elapsed()
}

/// The store and every agent's view against what was acknowledged. Unless the ledger is lossy, any
/// acknowledged write the store lost fails; in a lossy run the losses are returned. Either way,
/// nothing may be stored that was never acknowledged, and every agent's view must equal the store.
pub async fn check_store(pg: &Postgres, client: &reqwest::Client, agents: &[String], ledger: &Ledger) -> Losses {
    let stored: HashMap<String, String> = pg
        .psql("SELECT vm_id || ' ' || host_id FROM vms")
        .lines()
        .filter_map(|line| line.split_once(' ').map(|(vm, host)| (vm.to_owned(), host.to_owned())))
        .collect();
    let mut losses = Losses { found_by_release: ledger.lost_found_by_release.clone(), ..Losses::default() };
    for (vm, host) in &ledger.placed {
        if stored.get(vm) != Some(host) {
            assert!(ledger.lossy, "acknowledged placement of {vm} on {host} lost or moved: {:?}", stored.get(vm));
            losses.placements.push(vm.clone());
        }
    }
    for vm in &ledger.released {
        if stored.contains_key(vm) {
            assert!(ledger.lossy, "acknowledged release of {vm} undone");
            losses.releases.push(vm.clone());
        }
    }
    for vm in stored.keys() {
        assert!(
            ledger.placed.contains_key(vm) || losses.releases.contains(vm),
            "{vm} is in the store but was never acknowledged"
        );
    }
    for base in agents {
        let (status, page) = super::send(client.get(format!("{base}/v1/hosts?limit=10000"))).await;
        assert_eq!(status, 200, "{page}");
        let mut seen: HashMap<String, String> = HashMap::new();
        for host in page["hosts"].as_array().unwrap() {
            let id = host["host_id"].as_str().unwrap().to_owned();
            assert!(host["used"]["cores"].as_f64().unwrap() <= 16.0 + 1e-9, "{base}: {id} over capacity");
            for vm in host["vms"].as_array().unwrap() {
                let vm = vm.as_str().unwrap().to_owned();
                assert!(seen.insert(vm.clone(), id.clone()).is_none(), "{base}: {vm} on two hosts");
            }
        }
        assert_eq!(seen, stored, "{base}'s view differs from the store");
    }
    losses
}

/// Median, p99 and max of `durations`, in ms.
pub fn spread(durations: &[Duration]) -> (f64, f64, f64) {
    let mut ms: Vec<f64> = durations.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    let p99 = ms[((ms.len() as f64 * 0.99).ceil() as usize).clamp(1, ms.len()) - 1];
    (ms[ms.len() / 2], p99, ms[ms.len() - 1])
}
