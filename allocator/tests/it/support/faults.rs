//! The fault harness shared by `postgres_faults.rs` (crashes, partitions),
//! `postgres_failover.rs` (failover to a standby) and `patroni_failover.rs` (Patroni across real
//! links): clients that send allocations and releases of their own to random agents, a ledger of
//! what was acknowledged, and the check of the store and of every agent's view against that ledger
//! (at the end, or after every cycle with the clients paused).
//!
//! A release left in doubt (a 503, or no answer) and answered 404 when sent again is either a
//! release that committed the first time or a placement the store lost: the answer alone cannot
//! tell them apart, and trusting it would let a lost placement hide behind it. Such releases are
//! kept apart ([`Ledger::released_in_doubt`]) and reconciled against the store by the checker: a
//! release that committed moved the VM's row to `exits` in its transaction, so an id in `exits`
//! was released, and one in neither `vms` nor `exits` was lost.

#![allow(dead_code)]

use super::vm;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use test_support::postgres::Postgres;

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
    /// Releases left in doubt (a 503, or no answer) then answered 404: committed the first time,
    /// or the placement was lost. Neither released nor placed until the checker has looked the id
    /// up in the store ([`check_store`]).
    pub released_in_doubt: Vec<String>,
    /// Losses already reported by a check, so that a later check (or a release of the lost VM)
    /// does not count them again.
    pub lost: HashSet<String>,
}

/// What the checker reads of the database: one SQL query, its rows as psql's unaligned output
/// (`-At`: one row a line, columns separated by `|`).
pub trait Database {
    fn query(&self, sql: &str) -> String;
}

impl Database for Postgres {
    fn query(&self, sql: &str) -> String {
        self.psql(sql)
    }
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
            // A release left in doubt: committed the first time, or the placement was lost. The
            // client forgets the VM either way, as a real one would; the checker looks it up.
            404 if retry => {
                ledger.placed.remove(id);
                ledger.released_in_doubt.push(id.clone());
            }
            // The placement was acknowledged and the store lost it: counted, and the client
            // forgets the VM, as a real one would on a 404.
            404 if ledger.lossy => {
                ledger.placed.remove(id);
                if !ledger.lost.contains(id) {
                    ledger.lost_found_by_release.push(id.clone());
                }
            }
            404 => panic!("{id} was acknowledged placed on {:?} and {base} does not know it", ledger.placed.get(id)),
            _ => panic!("release of {id}: unexpected {status}: {}", String::from_utf8_lossy(&body)),
        },
    }
    ledger.acknowledged += 1;
    true
}

/// Whether the clients are to pause, and how many have.
#[derive(Default)]
pub struct Pause {
    requested: AtomicBool,
    parked: AtomicUsize,
}

/// One client: new VMs and releases of its own, each to a random agent, until `stop`. An operation
/// left in doubt is sent again, to a random agent, until it is answered, as a real client would.
/// Between operations it parks while `pause` asks it to.
pub async fn client_loop(
    name: String,
    index: usize,
    agents: Arc<Vec<String>>,
    ledger: Arc<Mutex<Ledger>>,
    stop: Arc<AtomicBool>,
    pause: Arc<Pause>,
) {
    let client = reqwest::Client::new();
    let mut rng = ChaCha8Rng::seed_from_u64(31 + index as u64);
    let mut own: Vec<String> = Vec::new();
    let mut next = 0;
    while !stop.load(Ordering::SeqCst) {
        if pause.requested.load(Ordering::SeqCst) {
            pause.parked.fetch_add(1, Ordering::SeqCst);
            while pause.requested.load(Ordering::SeqCst) && !stop.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            pause.parked.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        let op = if own.is_empty() || (own.len() < 30 && rng.random_bool(0.6)) {
            next += 1;
            Op::Allocate { id: format!("{name}-{next}"), cores: rng.random_range(1..=4) }
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
    pause: Arc<Pause>,
    clients: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// Starts the clients, recording into `ledger`; their VMs are `c<client>-<n>`.
    pub fn start(agents: Vec<String>, ledger: Ledger) -> Load {
        Load::start_named("c", agents, ledger)
    }

    /// Starts the clients with VM ids `<prefix><client>-<n>`: a second load on the same store needs
    /// ids of its own (an id placed before is refused with 409 for another demand).
    pub fn start_named(prefix: &str, agents: Vec<String>, ledger: Ledger) -> Load {
        let agents = Arc::new(agents);
        let ledger = Arc::new(Mutex::new(ledger));
        let stop = Arc::new(AtomicBool::new(false));
        let pause = Arc::new(Pause::default());
        let clients = (0..CLIENTS)
            .map(|i| {
                let (agents, ledger, stop, pause) =
                    (Arc::clone(&agents), Arc::clone(&ledger), Arc::clone(&stop), Arc::clone(&pause));
                tokio::spawn(client_loop(format!("{prefix}{i}"), i, agents, ledger, stop, pause))
            })
            .collect();
        Load { agents, ledger, stop, pause, clients }
    }

    /// Parks every client once its operation in flight is answered (retries included), so that
    /// the store holds exactly what the ledger says; [`Load::resume`] lets them go on.
    pub async fn pause(&self) {
        self.pause.requested.store(true, Ordering::SeqCst);
        while self.pause.parked.load(Ordering::SeqCst) < self.clients.len() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub fn resume(&self) {
        self.pause.requested.store(false, Ordering::SeqCst);
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

/// The store and every agent's view against what was acknowledged, with every write answered (the
/// clients stopped or paused). Unless the ledger is lossy, any acknowledged write the store lost
/// fails; in a lossy run the losses found by this check are returned (each loss once across
/// checks). Either way: nothing may be stored that was never acknowledged, no host may be over its
/// capacity or use other than what its VMs demand, and every agent's view must equal the store.
/// Releases answered 404 after a doubt are reconciled first ([`Ledger::released_in_doubt`]).
pub async fn check_store(
    db: &impl Database,
    client: &reqwest::Client,
    agents: &[String],
    ledger: &mut Ledger,
) -> Losses {
    let stored: HashMap<String, String> = db
        .query("SELECT vm_id || ' ' || host_id FROM vms")
        .lines()
        .filter_map(|line| line.split_once(' ').map(|(vm, host)| (vm.to_owned(), host.to_owned())))
        .collect();
    let mut losses =
        Losses { found_by_release: std::mem::take(&mut ledger.lost_found_by_release), ..Losses::default() };
    ledger.lost.extend(losses.found_by_release.iter().cloned());
    reconcile_releases(db, &stored, ledger, &mut losses);
    for (vm, host) in &ledger.placed {
        if stored.get(vm) != Some(host) && !ledger.lost.contains(vm) {
            assert!(ledger.lossy, "acknowledged placement of {vm} on {host} lost or moved: {:?}", stored.get(vm));
            losses.placements.push(vm.clone());
        }
    }
    for vm in &ledger.released {
        if stored.contains_key(vm) && !ledger.lost.contains(vm) {
            assert!(ledger.lossy, "acknowledged release of {vm} undone");
            losses.releases.push(vm.clone());
        }
    }
    ledger.lost.extend(losses.placements.iter().chain(&losses.releases).cloned());
    for vm in stored.keys() {
        assert!(
            ledger.placed.contains_key(vm) || ledger.lost.contains(vm),
            "{vm} is in the store but was never acknowledged"
        );
    }
    check_hosts(db);
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

/// Settles each release answered 404 after a doubt against the store: its VM in `exits` (the
/// release moved it there in its transaction) was released; in `vms` still, the 404 was false;
/// in neither, the acknowledged placement was lost and the 404 only said so.
fn reconcile_releases(db: &impl Database, stored: &HashMap<String, String>, ledger: &mut Ledger, losses: &mut Losses) {
    let in_doubt = std::mem::take(&mut ledger.released_in_doubt);
    if in_doubt.is_empty() {
        return;
    }
    let list: Vec<String> = in_doubt.iter().map(|id| format!("'{}'", id.replace('\'', "''"))).collect();
    let exited: HashSet<String> = db
        .query(&format!("SELECT DISTINCT vm_id FROM exits WHERE vm_id IN ({})", list.join(",")))
        .lines()
        .map(str::to_owned)
        .collect();
    for id in in_doubt {
        assert!(
            !stored.contains_key(&id),
            "the release of {id} was answered 404 after a doubt, yet the store holds it"
        );
        if exited.contains(&id) {
            ledger.released.insert(id);
        } else {
            assert!(
                ledger.lossy,
                "acknowledged placement of {id} lost: its release, left in doubt, was answered 404 and the store \
                 has no exit for it"
            );
            if ledger.lost.insert(id.clone()) {
                losses.found_by_release.push(id);
            }
        }
    }
}

/// The hosts in the store itself: none over its capacity in any dimension, and each using exactly
/// what its VMs demand (the database's own `CHECK` refuses the first; the second catches a use
/// written apart from its VMs). A VM id cannot be stored twice (`vms`' primary key).
pub fn check_hosts(db: &impl Database) {
    let used: HashMap<String, [i64; 3]> = db
        .query(
            "SELECT h.host_id, h.cores_used, h.memory_used, h.ssd_used, h.cores_cap, h.memory_cap, h.ssd_cap, \
                    coalesce(v.cores, 0), coalesce(v.memory, 0), coalesce(v.ssd, 0) \
             FROM hosts h LEFT JOIN (SELECT host_id, sum(cores_base) AS cores, sum(memory_base) AS memory, \
                    sum(ssd_base) AS ssd FROM vms GROUP BY host_id) v ON v.host_id = h.host_id",
        )
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line.split('|').collect();
            let n = |i: usize| fields[i].parse::<i64>().unwrap_or_else(|e| panic!("{line}: {e}"));
            let (used, cap, vms) = ([n(1), n(2), n(3)], [n(4), n(5), n(6)], [n(7), n(8), n(9)]);
            for d in 0..3 {
                assert!(used[d] <= cap[d], "host {} over capacity in the store: {line}", fields[0]);
            }
            assert_eq!(used, vms, "host {} uses other than what its VMs demand: {line}", fields[0]);
            (fields[0].to_owned(), used)
        })
        .collect();
    assert!(!used.is_empty(), "the store lists no hosts");
    let orphans = db.query("SELECT count(*) FROM vms WHERE host_id NOT IN (SELECT host_id FROM hosts)");
    assert_eq!(orphans, "0", "VMs on hosts the store does not list");
}

/// Median, p99 and max of `durations`, in ms.
pub fn spread(durations: &[Duration]) -> (f64, f64, f64) {
    let mut ms: Vec<f64> = durations.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    let p99 = ms[((ms.len() as f64 * 0.99).ceil() as usize).clamp(1, ms.len()) - 1];
    (ms[ms.len() / 2], p99, ms[ms.len() - 1])
}
