//! Durability: an allocation or release is acknowledged only once it is durable, and a restart
//! rebuilds exactly the acknowledged state.
//!
//! - `acknowledged_state_survives_sigkill`: a client streams allocations and releases to the real
//!   binary; another thread SIGKILLs it mid-stream; a restart on the same store must hold every
//!   acknowledged allocation on the same host, none of the acknowledged releases, no VM twice and
//!   nothing that was never acknowledged, except the one request in flight, which may go either way.
//! - `acknowledged_state_survives_many_sigkills` (ignored: run on demand): the same over 100
//!   kill-and-restart cycles with four concurrent clients; no acknowledged operation may be lost.
//! - `reopened_durable_allocator_equals_the_state_before`: the library alone; after reopening, the
//!   hosts, VMs and next decisions equal those of an allocator that never stopped.

use crate::support;

use allocator::durable::{job, Allocate, Answer, DurableAllocator, Job, Release, SetHostState};
use domain::{
    AllocationDecision, AllocationRequest, GangRequest, HostId, HostState, HostStateChange, InventorySpec,
    LifetimeClass, LifetimePrediction, PredictionSource, RequestDetails, RequestFacts, Resources, TenantId, VmId,
    VmInfo, VmRequest,
};
use placement::{Allocator, AllocatorConfig, Registry, TieBreak};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{send, start, vm};

/// The client's one operation that got no answer.
#[derive(Clone, Debug)]
enum InDoubt {
    Allocate(Vec<String>),
    Release(String),
}

/// What one client knows for sure.
#[derive(Default)]
struct Model {
    /// Prefixed to the client's VM ids, so that concurrent clients never share one.
    prefix: String,
    /// Acknowledged placements still live: VM -> (host, cores).
    live: HashMap<String, (String, f64)>,
    /// Acknowledged releases.
    released: HashSet<String>,
    /// Requests answered "rejected".
    rejected: HashSet<String>,
    next_id: usize,
    /// Operations acknowledged over the client's life, every one of them checked after each restart.
    acknowledged: usize,
}

/// Checks the restarted server against every client's model and settles each client's in-doubt
/// operation. Any acknowledged operation lost (an acknowledged VM missing or moved, a released one
/// back) fails the test.
async fn check(client: &reqwest::Client, base: &str, models: &mut [Model], in_doubt: Vec<Option<InDoubt>>) {
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
    let doubts: Vec<(Vec<String>, Option<String>)> = in_doubt
        .into_iter()
        .map(|doubt| match doubt {
            Some(InDoubt::Allocate(ids)) => (ids, None),
            Some(InDoubt::Release(id)) => (Vec::new(), Some(id)),
            None => (Vec::new(), None),
        })
        .collect();
    for (model, (_, doubt_release)) in models.iter().zip(&doubts) {
        for (vm, (host, _)) in &model.live {
            if doubt_release.as_ref() != Some(vm) {
                assert_eq!(found.get(vm), Some(host), "acknowledged VM {vm} lost or moved");
            }
        }
        for vm in &model.released {
            assert!(!found.contains_key(vm), "released VM {vm} came back");
        }
    }
    for vm in found.keys() {
        let owner = models
            .iter()
            .zip(&doubts)
            .find(|(model, (doubt_allocs, _))| model.live.contains_key(vm) || doubt_allocs.contains(vm));
        assert!(
            owner.is_some(),
            "VM {vm} was never acknowledged (answered rejected: {})",
            models.iter().any(|model| model.rejected.contains(vm))
        );
    }
    for (model, (doubt_allocs, doubt_release)) in models.iter_mut().zip(doubts) {
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
    }
    // Now the models are the server's state exactly: each host uses what its VMs demand.
    let mut expected: HashMap<&str, f64> = HashMap::new();
    for (host, cores) in models.iter().flat_map(|model| model.live.values()) {
        *expected.entry(host.as_str()).or_insert(0.0) += cores;
    }
    for (host, cores) in &used {
        let want = expected.get(host.as_str()).copied().unwrap_or(0.0);
        assert!((cores - want).abs() < 1e-9, "host {host} uses {cores} cores, its VMs {want}");
    }
    let (_, stats) = send(client.get(format!("{base}/v1/stats"))).await;
    assert_eq!(stats["vms"].as_u64().unwrap() as usize, models.iter().map(|model| model.live.len()).sum::<usize>());
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
                    let id = format!("{}vm-{}", model.prefix, model.next_id);
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
        model.acknowledged += 1;
        acked.fetch_add(1, Ordering::SeqCst);
    }
    None
}

/// What a series of kill-and-restart cycles did.
struct Cycles {
    models: Vec<Model>,
    /// Cycles whose kill left some client's operation without an answer.
    interrupted: usize,
    /// Operations left without an answer by a kill, each settled by the next check.
    in_doubt: usize,
}

/// One kill-and-restart cycle per entry of `kill_after`: restart the binary on the same store,
/// check every client's acknowledged state, then let `clients` clients stream concurrently until a
/// SIGKILL after `kill_after` acknowledged operations (summed over the clients), a random fraction
/// of a request later. A last restart checks the final state.
async fn kill_cycles(kill_after: &[usize], clients: usize, hosts: usize, seed: u64) -> Cycles {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("crash.db");
    let client = reqwest::Client::new();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut states: Vec<(Model, ChaCha8Rng)> = (0..clients)
        .map(|k| {
            let prefix = if clients == 1 { String::new() } else { format!("c{k}-") };
            (Model { prefix, ..Model::default() }, ChaCha8Rng::seed_from_u64(seed.wrapping_add(1 + k as u64)))
        })
        .collect();
    let mut in_doubt: Vec<Option<InDoubt>> = vec![None; clients];
    let (mut interrupted, mut doubted) = (0, 0);
    for (round, &kill_after) in kill_after.iter().enumerate() {
        let server = start(&store, hosts, "").await;
        let base = server.base.clone();
        if round > 0 {
            let mut models: Vec<Model> = states.iter_mut().map(|(model, _)| std::mem::take(model)).collect();
            check(&client, &base, &mut models, std::mem::take(&mut in_doubt)).await;
            in_doubt = vec![None; clients];
            for ((model, _), checked) in states.iter_mut().zip(models) {
                *model = checked;
            }
        }
        let server = Arc::new(Mutex::new(server));
        let acked = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicUsize::new(0));
        let killer = {
            let (server, acked, done) = (Arc::clone(&server), Arc::clone(&acked), Arc::clone(&done));
            let delay_us = rng.random_range(0..1500u64);
            std::thread::spawn(move || {
                while acked.load(Ordering::SeqCst) < kill_after && done.load(Ordering::SeqCst) < clients {
                    std::thread::sleep(Duration::from_micros(50));
                }
                // The clients are sending their next requests: kill in the middle of them.
                std::thread::sleep(Duration::from_micros(delay_us));
                server.lock().unwrap().kill();
            })
        };
        let streams: Vec<_> = states
            .drain(..)
            .map(|(mut model, mut client_rng)| {
                let (client, base, acked, done) = (client.clone(), base.clone(), Arc::clone(&acked), Arc::clone(&done));
                tokio::spawn(async move {
                    let doubt = stream(&client, &base, &mut model, &mut client_rng, &acked, 400).await;
                    done.fetch_add(1, Ordering::SeqCst);
                    (model, client_rng, doubt)
                })
            })
            .collect();
        for (k, task) in streams.into_iter().enumerate() {
            let (model, client_rng, doubt) = task.await.unwrap();
            states.push((model, client_rng));
            in_doubt[k] = doubt;
        }
        killer.join().unwrap();
        let doubts = in_doubt.iter().filter(|d| d.is_some()).count();
        interrupted += usize::from(doubts > 0);
        doubted += doubts;
        eprintln!(
            "round {round}: killed after {} acknowledged operations; in doubt: {doubts}; live {}, released {}",
            acked.load(Ordering::SeqCst),
            states.iter().map(|(model, _)| model.live.len()).sum::<usize>(),
            states.iter().map(|(model, _)| model.released.len()).sum::<usize>(),
        );
    }
    let server = start(&store, hosts, "").await;
    let mut models: Vec<Model> = states.into_iter().map(|(model, _)| model).collect();
    check(&client, &server.base, &mut models, in_doubt).await;
    Cycles { models, interrupted, in_doubt: doubted }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_state_survives_sigkill() {
    // Each round: restart on the same store, check, then stream until killed after `kill_after`
    // acknowledged operations.
    let cycles = kill_cycles(&[60, 95, 130, 45], 1, 12, 7).await;
    assert!(cycles.interrupted >= 3, "the kills should interrupt the stream");
    let model = &cycles.models[0];
    assert!(model.live.len() + model.released.len() > 150, "too little happened to mean anything");
    assert!(!model.released.is_empty() && !model.live.is_empty());
}

/// The long run: `CRASH_CYCLES` (default 100) kill-and-restart cycles with four concurrent clients,
/// each checked for every acknowledged operation. `cargo test --release -p allocator --test it crash::
/// -- --ignored --nocapture` (docs/allocator.md records the last run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "about 100 restarts of the real binary: run on demand"]
async fn acknowledged_state_survives_many_sigkills() {
    let cycles: usize = std::env::var("CRASH_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(100);
    let mut rng = ChaCha8Rng::seed_from_u64(2026);
    let kill_after: Vec<usize> = (0..cycles).map(|_| rng.random_range(10..200)).collect();
    let result = kill_cycles(&kill_after, 4, 48, 2026).await;
    let acknowledged: usize = result.models.iter().map(|model| model.acknowledged).sum();
    eprintln!(
        "{cycles} SIGKILL cycles, 4 concurrent clients: {acknowledged} acknowledged operations, all found after \
         the restarts (0 lost); {} cycles interrupted a request; {} requests in doubt, each settled either way",
        result.interrupted, result.in_doubt
    );
    assert!(result.interrupted * 2 >= cycles, "most kills should interrupt requests in flight");
    assert!(acknowledged > cycles * 50, "too little happened to mean anything");
}

fn inventory() -> InventorySpec {
    InventorySpec::homogeneous("z", 10, 3, Resources::from_whole(16.0, 64.0, 0.0).unwrap())
}

fn request(id: String, rng: &mut ChaCha8Rng) -> VmRequest {
    let cores = f64::from(rng.random_range(1..=6u32));
    VmRequest {
        vm_id: VmId(id),
        facts: RequestFacts {
            tenant_id: TenantId(format!("t{}", rng.random_range(0..3))),
            vm_type: "D".to_owned(),
            demand: Resources::from_whole(cores, cores * 3.0, 0.0).unwrap(),
            requested_at_s: None,
            details: RequestDetails::default(),
        },
        zone: None,
        max_per_rack: rng.random_bool(0.2).then_some(2),
        prediction: rng.random_bool(0.6).then(|| LifetimePrediction {
            p_long: 0.8,
            class: if rng.random_bool(0.5) { LifetimeClass::Long } else { LifetimeClass::Short },
            interval_class: None,
            expected_lifetime_s: Some(f64::from(rng.random_range(60..40_000u32))),
            model_version: Some("m1".to_owned()),
            source: PredictionSource::Model,
        }),
        candidates: None,
    }
}

/// A command sent in a batch, with what it asked and its answer.
enum Sent {
    Allocate(Box<AllocationRequest>, Answer<AllocationDecision>),
    Release(VmId, Answer<VmInfo>),
    SetHostState(HostId, HostState, Answer<HostStateChange>),
}

fn command(id: &mut usize, live: &mut Vec<VmId>, rng: &mut ChaCha8Rng) -> (Box<dyn Job>, Sent) {
    match rng.random_range(0..10) {
        0..=5 => {
            *id += 1;
            let request = if rng.random_bool(0.2) {
                let tenant = TenantId::from("gang");
                let vms = (0..3)
                    .map(|k| VmRequest {
                        facts: RequestFacts {
                            tenant_id: tenant.clone(),
                            ..request(format!("g{id}-{k}"), rng).facts.clone()
                        },
                        ..request(format!("g{id}-{k}"), rng)
                    })
                    .collect();
                AllocationRequest::Gang(GangRequest { tenant_id: tenant, vms })
            } else {
                AllocationRequest::Vm(request(format!("vm-{id}"), rng))
            };
            let (job, answer) = job(Allocate(request.clone()));
            (job, Sent::Allocate(Box::new(request), answer))
        }
        6..=8 if !live.is_empty() => {
            let vm = live.swap_remove(rng.random_range(0..live.len()));
            let (job, answer) = job(Release::vm(vm.clone()));
            (job, Sent::Release(vm, answer))
        }
        _ => {
            let host = HostId(format!("z-h{}", rng.random_range(0..10)));
            let state = [HostState::Available, HostState::Unavailable, HostState::Failed][rng.random_range(0..3)];
            let (job, answer) = job(SetHostState { host: host.clone(), state });
            (job, Sent::SetHostState(host, state, answer))
        }
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
            let class = allocator.host_lifetime(placement::HostIndex(i as u32)).class;
            (h.id.to_string(), h.used, h.vms.iter().map(|vm| vm.id.clone()).collect(), h.state, class)
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
    let mut durable = DurableAllocator::open(&spec, &config, &Registry::standard(), &path, 0.0).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let (mut id, mut live) = (0, Vec::new());
    let mut now = 1_000.0;
    for round in 0..4 {
        for _ in 0..40 {
            let (batch, sent): (Vec<_>, Vec<_>) =
                (0..rng.random_range(1..8)).map(|_| command(&mut id, &mut live, &mut rng)).unzip();
            now += 30.0;
            durable.execute(batch, now);
            for sent in sent {
                match sent {
                    Sent::Allocate(request, answer) => {
                        let expected = twin.allocate(&request, now).unwrap();
                        let reply = answer.ready();
                        assert_eq!(reply.as_ref(), Ok(&expected));
                        if expected.is_placed() {
                            live.extend(request.vms().iter().map(|v| v.vm_id.clone()));
                        }
                    }
                    Sent::Release(vm, answer) => {
                        let reply = answer.ready();
                        assert_eq!(twin.release(&vm, now).is_ok(), reply.is_ok(), "{reply:?}");
                    }
                    Sent::SetHostState(host, state, answer) => {
                        assert_eq!(twin.set_host_state(&host, state).is_ok(), answer.ready().is_ok());
                    }
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
        durable = DurableAllocator::open(&spec, &config, &Registry::standard(), &path, now).unwrap();
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
