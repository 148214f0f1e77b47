//! The simulator and the allocator service place a small trace identically.
//!
//! A seeded trace of 300 VMs (one arrival every 10 s; short VMs living 5 to 405 s, long ones still
//! running at the end) is replayed twice with the same inventory (20 hosts of 16 cores and 64 GiB,
//! 2 to a rack, zone `sim`), policy, predictions and seed (random tie-breaking):
//!
//! - through the simulator ([`simulator::engine::run`], trace time), and
//! - through the real `allocator` binary over HTTP: `POST /v1/allocations` with the very same
//!   predictions ([`simulator::predict::predict`]) and `DELETE /v1/allocations/{id}` for exits, in
//!   the simulator's event order (exits before arrivals at equal times; a rejected VM never exits).
//!
//! and every VM must land on the same host (or be rejected) in both. The inventory is small enough
//! that the long VMs pile up and some VMs are rejected, so rejections are compared too.
//!
//! The service runs on the request clock (`clock = "request"`): its time is each allocation's
//! `requested_at_s` (the VM's arrival) and each release's `ended_at_s` (its exit), so that both
//! runs decide at the same instants and every policy can be compared, NILAS and LAVA included,
//! whose exit times are numbers on that clock. Oracle predictions, and no model in either run: the
//! running VMs' remaining lifetimes are their predictions minus their ages in both. Lifetimes are
//! whole seconds so that they cross JSON exactly.
//!
//! The binary must be built beside this test's (`cargo build --release --workspace`, or `cargo
//! test --release --workspace`, which builds it first).

mod support;

use domain::{AllocationRequest, Priority};
use placement::{PolicyConfig, TieBreak};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;
use simulator::engine::{run, SimConfig};
use simulator::predict::predict;
use simulator::workload::{Inventory, TraceSpec, Workload, WorkloadConfig, SIM_ZONE};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use traces::{ExtraColumns, VmRecord};

const HOSTS: usize = 20;
const HOSTS_PER_RACK: usize = 2;
const SEED: u64 = 11;

/// The seeded trace: 300 VMs, 40% long-lived.
fn trace() -> Vec<VmRecord> {
    let mut rng = ChaCha8Rng::seed_from_u64(2024);
    (0..300)
        .map(|i| {
            let start = 10.0 * i as f64;
            let cores = [1.0, 2.0, 4.0, 8.0][rng.random_range(0..4)];
            let per_core = [2.0, 4.0, 8.0][rng.random_range(0..3)];
            let end =
                if rng.random_bool(0.4) { None } else { Some(start + 5.0 + 10.0 * rng.random_range(0..41) as f64) };
            VmRecord {
                vm_id: format!("vm-{i}"),
                tenant_id: format!("t{}", rng.random_range(0..20)),
                vm_type: "D".to_owned(),
                cores,
                memory_gib: cores * per_core,
                priority: Priority::Regular,
                start_s: start,
                end_s: end,
                extra: ExtraColumns::default(),
            }
        })
        .collect()
}

fn config(kind: &str) -> SimConfig {
    SimConfig {
        workload: WorkloadConfig {
            trace: TraceSpec::Provided { name: "parity".to_owned() },
            ..WorkloadConfig::default()
        },
        inventory: Inventory::Fixed { hosts: HOSTS, cores: 16.0, memory_gib: 64.0, hosts_per_rack: HOSTS_PER_RACK },
        policy: PolicyConfig::preset(kind),
        tie_break: TieBreak::Random,
        seed: SEED,
        record_placements: true,
        ..SimConfig::default()
    }
}

/// A running allocator, killed when dropped.
struct Service {
    child: Child,
    base: String,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_service(dir: &Path, kind: &str) -> Service {
    let client = reqwest::Client::new();
    for attempt in 0..5 {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let config = dir.join(format!("allocator-{kind}-{attempt}.toml"));
        let store = dir.join(format!("allocator-{kind}-{attempt}.db"));
        let text = format!(
            "listen = \"127.0.0.1:{port}\"\nstore = \"{}\"\nclock = \"request\"\n\n[generate]\nzone = \"{SIM_ZONE}\"\nhosts = {HOSTS}\n\
             hosts_per_rack = {HOSTS_PER_RACK}\ncores = 16\nmemory_gib = 64\n\n[allocator]\ntie_break = \"random\"\n\
             seed = {SEED}\n\n[allocator.policy]\nkind = \"{kind}\"\n",
            store.display()
        );
        std::fs::write(&config, text).unwrap();
        let child = Command::new(support::workspace_binary("allocator"))
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut service = Service { child, base: format!("http://127.0.0.1:{port}") };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = client.get(format!("{}/readyz", service.base)).send().await {
                if r.status().is_success() {
                    return service;
                }
            }
            if service.child.try_wait().unwrap().is_some() {
                break; // most likely the port was taken meanwhile: another one
            }
            assert!(Instant::now() < deadline, "the allocator did not become ready");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    panic!("the allocator did not start");
}

/// Replays the workload through the service in the simulator's event order; returns VM -> host
/// (`None`: rejected).
async fn replay_over_http(service: &Service, workload: &Workload, kind: &str) -> BTreeMap<String, Option<String>> {
    let config = config(kind);
    let predictions = predict(workload, &config.prediction, &config.policy, config.seed).unwrap();
    let client = reqwest::Client::new();
    let mut placed = BTreeMap::new();
    let mut exits: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let mut next = 0;
    loop {
        let arrival = workload.vms.get(next).map(|vm| vm.arrival_s);
        // Exits first at equal times; nothing after the window's end.
        let exit = exits.peek().map(|Reverse((at, _))| *at as f64).filter(|&at| at <= workload.to_s);
        match (exit, arrival) {
            (Some(at), arrival) if arrival.is_none_or(|a| at <= a) => {
                let Some(Reverse((_, index))) = exits.pop() else { unreachable!() };
                let id = &workload.vms[index].request.vm_id;
                let url = format!("{}/v1/allocations/{id}?ended_at_s={at}", service.base);
                let response = client.delete(url).send().await.unwrap();
                assert_eq!(response.status().as_u16(), 204, "releasing {id}");
            }
            (_, Some(_)) => {
                let vm = &workload.vms[next];
                let mut request = vm.request.clone();
                request.prediction = predictions.per_vm[next].clone();
                request.requested_at_s = Some(vm.arrival_s);
                let response = client
                    .post(format!("{}/v1/allocations", service.base))
                    .json(&AllocationRequest::Vm(request))
                    .send()
                    .await
                    .unwrap();
                let status = response.status().as_u16();
                let body: Value = response.json().await.unwrap();
                let host = match (status, body["status"].as_str()) {
                    (201, Some("placed")) => {
                        if let Some(end) = vm.end_s {
                            exits.push(Reverse((end as u64, next)));
                        }
                        Some(body["placements"][0]["host_id"].as_str().unwrap().to_owned())
                    }
                    (200, Some("rejected")) => None,
                    _ => panic!("unexpected answer {status}: {body}"),
                };
                placed.insert(vm.request.vm_id.0.clone(), host);
                next += 1;
            }
            _ => break,
        }
    }
    placed
}

async fn check_parity(kind: &str, name: &str) {
    let config = config(kind);
    let workload = Workload::from_records(trace(), &config.workload).unwrap();
    assert!(workload.vms.iter().all(|vm| vm.end_s.is_none_or(|e| e.fract() == 0.0)), "whole seconds");
    let simulated = run(&workload, &config, |_| {}).unwrap();
    let simulated: BTreeMap<String, Option<String>> =
        simulated.placements.unwrap().into_iter().map(|p| (p.vm_id, p.host_id)).collect();

    let dir = tempfile::tempdir().unwrap();
    let service = start_service(dir.path(), name).await;
    let served = replay_over_http(&service, &workload, kind).await;

    let rejected = simulated.values().filter(|h| h.is_none()).count();
    let hosts_used = simulated.values().flatten().collect::<std::collections::BTreeSet<_>>().len();
    assert!(rejected > 0 && rejected < 200, "{name}: the trace should fill the inventory ({rejected} rejected)");
    assert!(hosts_used > 10, "{name}: {hosts_used} hosts used");
    let differing: Vec<_> = simulated.iter().filter(|(vm, host)| served.get(*vm) != Some(host)).take(5).collect();
    assert!(
        differing.is_empty() && served.len() == simulated.len(),
        "{name}: simulator and service disagree, e.g. {:?} (service: {:?})",
        differing,
        differing.iter().map(|(vm, _)| served.get(*vm)).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn pbfr_places_the_trace_like_the_service() {
    check_parity("pbfr", "pbfr").await;
}

#[tokio::test]
async fn la_binary_with_oracle_predictions_places_the_trace_like_the_service() {
    check_parity("la-binary", "la-binary").await;
}

#[tokio::test]
async fn nilas_with_oracle_predictions_places_the_trace_like_the_service() {
    check_parity("nilas", "nilas").await;
}

#[tokio::test]
async fn lava_with_oracle_predictions_places_the_trace_like_the_service() {
    check_parity("lava", "lava").await;
}
