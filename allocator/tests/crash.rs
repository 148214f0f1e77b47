//! Durability: an allocation or release is acknowledged only once it is durable, and a restart
//! rebuilds exactly the acknowledged state.
//!
//! - `acknowledged_state_survives_sigkill`: a client streams allocations and releases to the real
//!   binary; another thread SIGKILLs it mid-stream; a restart on the same store must hold every
//!   acknowledged allocation on the same host, none of the acknowledged releases, no VM twice and
//!   nothing that was never acknowledged, except the one request in flight, which may go either way.
//! - `reopened_durable_allocator_equals_the_state_before`: the library alone; after reopening, the
//!   hosts, VMs and next decisions equal those of an allocator that never stopped.

mod support;

use allocator::durable::{Command, DurableAllocator, Reply};
use allocator::{Allocator, AllocatorConfig, TieBreak};
use domain::{
    AllocationRequest, GangRequest, HostId, HostState, InventorySpec, LifetimeClass, LifetimePrediction,
    PredictionSource, Priority, Resources, TenantId, VmId, VmRequest,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{send, start, vm};

/// The client's one operation that got no answer.
#[derive(Clone, Debug)]
enum InDoubt {
    Allocate(Vec<String>),
    Release(String),
}

/// What the client knows for sure.
#[derive(Default)]
struct Model {
    /// Acknowledged placements still live: VM -> (host, cores).
    live: HashMap<String, (String, f64)>,
    /// Acknowledged releases.
    released: HashSet<String>,
    /// Requests answered "rejected".
    rejected: HashSet<String>,
    next_id: usize,
}

/// Checks the restarted server against the model and settles the in-doubt operation.
async fn check(client: &reqwest::Client, base: &str, model: &mut Model, in_doubt: Option<InDoubt>) {
    let (status, page) = send(client.get(format!("{base}/v1/hosts?limit=10000"))).await;
    assert_eq!(status, 200);
    let mut found: HashMap<String, String> = HashMap::new();
    let mut used: HashMap<String, f64> = HashMap::new();
    for host in page["hosts"].as_array().unwrap() {
        let host_id = host["host_id"].as_str().unwrap().to_owned();
        used.insert(host_id.clone(), host["used"]["cores"].as_f64().unwrap());
        for vm in host["vms"].as_array().unwrap() {
            let vm = vm.as_str().unwrap().to_owned();
            assert!(found.insert(vm.clone(), host_id.clone()).is_none(), "VM {vm} appears twice");
        }
    }
    let (doubt_allocs, doubt_release) = match &in_doubt {
        Some(InDoubt::Allocate(ids)) => (ids.clone(), None),
        Some(InDoubt::Release(id)) => (Vec::new(), Some(id.clone())),
        None => (Vec::new(), None),
    };
    for (vm, (host, _)) in &model.live {
        if doubt_release.as_ref() != Some(vm) {
            assert_eq!(found.get(vm), Some(host), "acknowledged VM {vm} lost or moved");
        }
    }
    for vm in &model.released {
        assert!(!found.contains_key(vm), "released VM {vm} came back");
    }
    for vm in found.keys() {
        assert!(
            model.live.contains_key(vm) || doubt_allocs.contains(vm),
            "VM {vm} was never acknowledged (answered rejected: {})",
            model.rejected.contains(vm)
        );
    }
    // A gang is all or nothing, even in doubt.
    let present = doubt_allocs.iter().filter(|id| found.contains_key(*id)).count();
    assert!(present == 0 || present == doubt_allocs.len(), "gang {doubt_allocs:?} partly placed");
    // Settle the in-doubt operation with what the store says.
    for id in &doubt_allocs {
        if let Some(host) = found.get(id) {
            let (status, info) = send(client.get(format!("{base}/v1/allocations/{id}"))).await;
            assert_eq!(status, 200);
            model.live.insert(id.clone(), (host.clone(), info["demand"]["cores"].as_f64().unwrap()));
        }
    }
    if let Some(id) = doubt_release {
        if !found.contains_key(&id) {
            model.live.remove(&id);
            model.released.insert(id);
        }
    }
    // Now the model is the server's state exactly: each host uses what its VMs demand.
    let mut expected: HashMap<&str, f64> = HashMap::new();
    for (host, cores) in model.live.values() {
        *expected.entry(host.as_str()).or_insert(0.0) += cores;
    }
    for (host, cores) in &used {
        let want = expected.get(host.as_str()).copied().unwrap_or(0.0);
        assert!((cores - want).abs() < 1e-9, "host {host} uses {cores} cores, its VMs {want}");
    }
    let (_, stats) = send(client.get(format!("{base}/v1/stats"))).await;
    assert_eq!(stats["vms"].as_u64().unwrap() as usize, model.live.len());
}

/// Streams operations until the server dies or `max_ops` are done; returns the operation in doubt.
async fn stream(
    client: &reqwest::Client,
    base: &str,
    model: &mut Model,
    rng: &mut ChaCha8Rng,
    acked: &AtomicUsize,
    max_ops: usize,
) -> Option<InDoubt> {
    let mut cores_of: HashMap<String, f64> = HashMap::new();
    for _ in 0..max_ops {
        let release = !model.live.is_empty() && (model.live.len() > 40 || rng.random_bool(0.35));
        let (op, request) = if release {
            let mut ids: Vec<&String> = model.live.keys().collect();
            ids.sort();
            let id = ids[rng.random_range(0..ids.len())].clone();
            (InDoubt::Release(id.clone()), client.delete(format!("{base}/v1/allocations/{id}")))
        } else {
            let gang = rng.random_range(1..=3usize);
            let tenant = format!("t{}", rng.random_range(0..4));
            let vms: Vec<Value> = (0..gang)
                .map(|_| {
                    model.next_id += 1;
                    let id = format!("vm-{}", model.next_id);
                    let cores = f64::from(rng.random_range(1..=6u32));
                    cores_of.insert(id.clone(), cores);
                    vm(&id, &tenant, cores, cores * 2.0)
                })
                .collect();
            let ids = vms.iter().map(|v| v["vm_id"].as_str().unwrap_or_default().to_owned()).collect();
            let body =
                if gang == 1 { json!({"vm": vms[0]}) } else { json!({"gang": {"tenant_id": tenant, "vms": vms}}) };
            (InDoubt::Allocate(ids), client.post(format!("{base}/v1/allocations")).json(&body))
        };
        let response = match request.timeout(Duration::from_secs(10)).send().await {
            Ok(response) => response,
            Err(_) => return Some(op),
        };
        let status = response.status().as_u16();
        let Ok(body) = response.bytes().await else { return Some(op) };
        match op {
            InDoubt::Release(id) => {
                assert_eq!(status, 204, "{}", String::from_utf8_lossy(&body));
                model.live.remove(&id);
                model.released.insert(id);
            }
            InDoubt::Allocate(ids) => {
                let decision: Value = serde_json::from_slice(&body).unwrap();
                match status {
                    201 => {
                        for placement in decision["placements"].as_array().unwrap() {
                            let id = placement["vm_id"].as_str().unwrap().to_owned();
                            let host = placement["host_id"].as_str().unwrap().to_owned();
                            let cores = cores_of[&id];
                            model.live.insert(id, (host, cores));
                        }
                    }
                    200 => {
                        assert_eq!(decision["status"], "rejected", "{decision}");
                        model.rejected.extend(ids);
                    }
                    other => panic!("unexpected {other}: {decision}"),
                }
            }
        }
        acked.fetch_add(1, Ordering::SeqCst);
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_state_survives_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("crash.db");
    let client = reqwest::Client::new();
    let mut model = Model::default();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut in_doubt = None;
    let mut interrupted = 0;
    // Each round: restart on the same store, check, then stream until killed after `kill_after`
    // acknowledged operations.
    for (round, kill_after) in [60usize, 95, 130, 45].into_iter().enumerate() {
        let server = start(&store, 12, "").await;
        let base = server.base.clone();
        if round > 0 {
            check(&client, &base, &mut model, in_doubt.take()).await;
        }
        let server = Arc::new(Mutex::new(server));
        let acked = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let killer = {
            let (server, acked, done) = (Arc::clone(&server), Arc::clone(&acked), Arc::clone(&done));
            let delay_us = rng.random_range(0..1500u64);
            std::thread::spawn(move || {
                while acked.load(Ordering::SeqCst) < kill_after && !done.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_micros(50));
                }
                // The client is sending its next request: kill in the middle of it.
                std::thread::sleep(Duration::from_micros(delay_us));
                server.lock().unwrap().kill();
            })
        };
        in_doubt = stream(&client, &base, &mut model, &mut rng, &acked, 400).await;
        done.store(true, Ordering::SeqCst);
        killer.join().unwrap();
        interrupted += usize::from(in_doubt.is_some());
        eprintln!(
            "round {round}: killed after {} acknowledged operations; in doubt: {in_doubt:?}; live {}, released {}",
            acked.load(Ordering::SeqCst),
            model.live.len(),
            model.released.len()
        );
    }
    assert!(interrupted >= 3, "the kills should interrupt the stream");
    let server = start(&store, 12, "").await;
    check(&client, &server.base, &mut model, in_doubt.take()).await;
    assert!(model.live.len() + model.released.len() > 150, "too little happened to mean anything");
    assert!(!model.released.is_empty() && !model.live.is_empty());
}

fn inventory() -> InventorySpec {
    InventorySpec::homogeneous("z", 10, 3, Resources::from_whole(16.0, 64.0, 0.0).unwrap())
}

fn request(id: String, rng: &mut ChaCha8Rng) -> VmRequest {
    let cores = f64::from(rng.random_range(1..=6u32));
    VmRequest {
        vm_id: VmId(id),
        tenant_id: TenantId(format!("t{}", rng.random_range(0..3))),
        vm_type: "D".to_owned(),
        demand: Resources::from_whole(cores, cores * 3.0, 0.0).unwrap(),
        priority: Priority::Regular,
        os: None,
        requested_at_s: None,
        zone: None,
        max_per_rack: rng.random_bool(0.2).then_some(2),
        features: BTreeMap::new(),
        prediction: rng.random_bool(0.6).then(|| LifetimePrediction {
            p_long: 0.8,
            class: if rng.random_bool(0.5) { LifetimeClass::Long } else { LifetimeClass::Short },
            interval_class: None,
            expected_lifetime_s: Some(f64::from(rng.random_range(60..40_000u32))),
            model_version: Some("m1".to_owned()),
            source: PredictionSource::Model,
        }),
    }
}

fn command(id: &mut usize, live: &mut Vec<VmId>, rng: &mut ChaCha8Rng) -> Command {
    match rng.random_range(0..10) {
        0..=5 => {
            *id += 1;
            if rng.random_bool(0.2) {
                let tenant = TenantId::from("gang");
                let vms = (0..3)
                    .map(|k| VmRequest { tenant_id: tenant.clone(), ..request(format!("g{id}-{k}"), rng) })
                    .collect();
                Command::Allocate(AllocationRequest::Gang(GangRequest { tenant_id: tenant, vms }))
            } else {
                Command::Allocate(AllocationRequest::Vm(request(format!("vm-{id}"), rng)))
            }
        }
        6..=8 if !live.is_empty() => Command::Release(live.swap_remove(rng.random_range(0..live.len()))),
        _ => Command::SetHostState {
            host: HostId(format!("z-h{}", rng.random_range(0..10))),
            state: [HostState::Available, HostState::Unavailable, HostState::Failed][rng.random_range(0..3)],
        },
    }
}

/// Hosts as comparable tuples: id, used, VMs in order, state.
fn hosts_of(allocator: &Allocator) -> Vec<(String, Resources, Vec<VmId>, HostState, u8)> {
    allocator
        .state()
        .hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let class = allocator.host_lifetime(allocator::HostIndex(i as u32)).class;
            (h.id.to_string(), h.used, h.vms.clone(), h.state, class)
        })
        .collect()
}

#[test]
fn reopened_durable_allocator_equals_the_state_before() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lib.db");
    let config = AllocatorConfig { tie_break: TieBreak::LowestIndex, ..AllocatorConfig::default() };
    let spec = inventory();
    // The twin never stops and never touches a disk.
    let mut twin = Allocator::new(&spec, &config).unwrap();
    let mut durable = DurableAllocator::open(&spec, &config, &path, 0.0).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let (mut id, mut live) = (0, Vec::new());
    let mut now = 1_000.0;
    for round in 0..4 {
        for _ in 0..40 {
            let batch: Vec<Command> =
                (0..rng.random_range(1..8)).map(|_| command(&mut id, &mut live, &mut rng)).collect();
            now += 30.0;
            let replies = durable.execute(&batch, now);
            for (command, reply) in batch.iter().zip(&replies) {
                match command {
                    Command::Allocate(request) => {
                        let expected = twin.allocate(request, now).unwrap();
                        assert!(
                            matches!(reply, Ok(Reply::Allocated(d)) if *d == expected),
                            "{reply:?} != {expected:?}"
                        );
                        if expected.is_placed() {
                            live.extend(request.vms().iter().map(|v| v.vm_id.clone()));
                        }
                    }
                    Command::Release(vm) => {
                        assert_eq!(twin.release(vm, now).is_ok(), reply.is_ok(), "{reply:?}");
                    }
                    Command::SetHostState { host, state } => {
                        assert_eq!(twin.set_host_state(host, *state).is_ok(), reply.is_ok());
                    }
                    _ => {}
                }
            }
        }
        let before = hosts_of(durable.allocator().unwrap());
        assert_eq!(before, hosts_of(&twin), "round {round}: the durable allocator drifted from its twin");
        let vms_before: Vec<_> = {
            let mut vms: Vec<_> = twin.state().vms().map(|(id, vm)| (id.clone(), vm.clone())).collect();
            vms.sort_by(|a, b| a.0.cmp(&b.0));
            vms
        };
        drop(durable);
        durable = DurableAllocator::open(&spec, &config, &path, now).unwrap();
        let reopened = durable.allocator().unwrap();
        assert_eq!(hosts_of(reopened), before, "round {round}: reopening changed the hosts");
        let mut vms_after: Vec<_> = reopened.state().vms().map(|(id, vm)| (id.clone(), vm.clone())).collect();
        vms_after.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(vms_after, vms_before, "round {round}: reopening changed the VMs");
        let (a, b) = (reopened.stats(), twin.stats());
        assert_eq!(
            (a.vms, a.allocated_cores, a.empty_hosts, a.vms_long),
            (b.vms, b.allocated_cores, b.empty_hosts, b.vms_long)
        );
        // And the next decisions are the same too (checked by the next round's loop).
    }
    assert!(live.len() > 10);
}
