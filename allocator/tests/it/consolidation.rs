//! Consolidation through the real binary: on from the config, the API (plan, rounds, migrations,
//! pause, off, bad settings), `/metrics`, and a SIGKILL in the middle of it losing no placement and
//! no migration.

use crate::support;

use placement::Registry;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use support::{send, start, vm, TOKEN};

/// Consolidation on from the config, rounds only when asked (the period is long), and a budget
/// that fills in a second.
fn config(chooser: &str) -> String {
    format!(
        "admin_token = \"{TOKEN}\"\n[allocator]\ntie_break = \"lowest-index\"\n[consolidation]\nbudget_per_host_day = 86400\nchooser = \"{chooser}\"\nevery_s = 1000000\nmax_in_flight = 2\n"
    )
}

fn admin(request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    request.bearer_auth(TOKEN)
}

async fn place(client: &reqwest::Client, base: &str, id: &str, cores: f64) -> String {
    let (status, body) =
        send(client.post(format!("{base}/v1/allocations")).json(&json!({"vm": vm(id, "t", cores, cores * 2.0)}))).await;
    assert_eq!(status, 201, "{body}");
    body["placements"][0]["host_id"].as_str().unwrap().to_owned()
}

async fn host_state(client: &reqwest::Client, base: &str, host: &str) -> (String, u64) {
    let (status, body) = send(client.get(format!("{base}/v1/hosts/{host}"))).await;
    assert_eq!(status, 200, "{body}");
    (body["state"].as_str().unwrap().to_owned(), body["vm_count"].as_u64().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consolidation_runs_from_the_config_and_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(&dir.path().join("c.db"), 4, &config("fewest-vms")).await;
    let (client, base) = (reqwest::Client::new(), server.base.clone());
    // h0 gets 12 + 2 cores, h1 12; once `a` leaves, h0 holds 2 cores and h1 has 4 free.
    assert_eq!(place(&client, &base, "a", 12.0).await, "z-h0");
    assert_eq!(place(&client, &base, "b", 2.0).await, "z-h0");
    assert_eq!(place(&client, &base, "c", 12.0).await, "z-h1");
    let (status, _) = send(client.delete(format!("{base}/v1/allocations/a"))).await;
    assert_eq!(status, 204);
    let (status, report) = send(client.get(format!("{base}/v1/consolidation"))).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["config"]["chooser"], "fewest-vms");
    tokio::time::sleep(Duration::from_millis(1100)).await;

    // The plan is a dry run.
    let (status, plan) = send(client.get(format!("{base}/v1/consolidation/plan"))).await;
    assert_eq!(status, 200, "{plan}");
    assert_eq!(plan["plan"][0]["host"], "z-h0", "one VM, the least used: {plan}");
    assert_eq!(host_state(&client, &base, "z-h0").await.0, "available");

    // Bad settings are refused naming the field, and change nothing; the admin token is needed.
    let bad = json!({"budget_per_host_day": 1, "chooser": "fewest-vms", "max_in_flight": 0});
    let (status, problem) = send(admin(client.put(format!("{base}/v1/consolidation"))).json(&bad)).await;
    assert_eq!(status, 422, "{problem}");
    assert_eq!(problem["errors"][0]["field"], "max_in_flight", "{problem}");
    let oracle = json!({"budget_per_host_day": 1, "chooser": "oracle"});
    let (status, problem) = send(admin(client.put(format!("{base}/v1/consolidation"))).json(&oracle)).await;
    assert_eq!((status, problem["errors"][0]["field"].as_str()), (422, Some("chooser")), "{problem}");
    let (status, _) = send(client.post(format!("{base}/v1/consolidation/rounds"))).await;
    assert_eq!(status, 401);

    // A round: h0 leaves service and its VM starts migrating onto the other non-empty host (never
    // onto an empty one: that would gain nothing).
    let (status, round) = send(admin(client.post(format!("{base}/v1/consolidation/rounds")))).await;
    assert_eq!(status, 200, "{round}");
    assert_eq!(round["started"][0]["host"], "z-h0", "{round}");
    assert_eq!(host_state(&client, &base, "z-h0").await.0, "unavailable");
    let (_, report) = send(client.get(format!("{base}/v1/consolidation"))).await;
    assert_eq!(report["in_flight"][0]["vm_id"], "b", "{report}");
    assert_eq!(report["in_flight"][0]["target"], "z-h1", "{report}");
    let (status, problem) = send(admin(client.delete(format!("{base}/v1/consolidation")))).await;
    assert_eq!((status, problem["type"].as_str()), (409, Some("urn:problem:consolidation-busy")), "{problem}");

    // The cloud's migration failed: the reservation is given back, b stays on h0, and h0 is
    // back in service; a second report of it finds nothing migrating.
    let (status, migration) = send(admin(client.post(format!("{base}/v1/migrations/b/fail")))).await;
    assert_eq!((status, migration["target"].as_str()), (200, Some("z-h1")), "{migration}");
    assert_eq!(host_state(&client, &base, "z-h0").await, ("available".to_owned(), 1));
    let (_, report) = send(client.get(format!("{base}/v1/consolidation"))).await;
    assert_eq!((report["counters"]["migrations_failed"].as_u64(), report["in_flight"].clone()), (Some(1), json!([])));
    let (_, b) = send(client.get(format!("{base}/v1/allocations/b"))).await;
    assert_eq!(b["host_id"], "z-h0", "{b}");
    let (status, problem) = send(admin(client.post(format!("{base}/v1/migrations/b/fail")))).await;
    assert_eq!((status, problem["type"].as_str()), (404, Some("urn:problem:not-migrating")), "{problem}");

    // The next round starts h0 again.
    let (_, round) = send(admin(client.post(format!("{base}/v1/consolidation/rounds")))).await;
    assert_eq!(round["started"][0]["host"], "z-h0", "{round}");
    let (status, _) = send(admin(client.post(format!("{base}/v1/migrations/b/complete")))).await;
    assert_eq!(status, 200);
    assert_eq!(host_state(&client, &base, "z-h0").await, ("available".to_owned(), 0), "emptied: back in service");
    let (_, report) = send(client.get(format!("{base}/v1/consolidation"))).await;
    assert_eq!(report["counters"]["hosts_emptied"], 1, "{report}");
    assert_eq!(report["counters"]["migrations_completed"], 1, "{report}");

    let metrics = client.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("allocator_consolidation_hosts_emptied_total 1"), "{metrics}");
    assert!(metrics.contains("allocator_consolidation_migrations_completed_total 1"), "{metrics}");

    let (status, report) = send(admin(client.post(format!("{base}/v1/consolidation/pause")))).await;
    assert_eq!((status, report["paused"].as_bool()), (200, Some(true)));
    let (_, round) = send(admin(client.post(format!("{base}/v1/consolidation/rounds")))).await;
    assert_eq!(round["started"], json!([]), "paused: nothing starts");
    let (status, _) = send(admin(client.delete(format!("{base}/v1/consolidation")))).await;
    assert_eq!(status, 204);
    let (status, problem) = send(client.get(format!("{base}/v1/consolidation"))).await;
    assert_eq!((status, problem["type"].as_str()), (404, Some("urn:problem:consolidation-off")));
}

/// What the client knows for sure.
#[derive(Default, Debug)]
struct Acknowledged {
    /// VM -> host.
    vms: HashMap<String, String>,
    released: HashSet<String>,
    /// Migrations in flight the last acknowledged report showed: VM -> target.
    in_flight: HashMap<String, String>,
    /// Hosts being emptied in that report.
    emptying: HashSet<String>,
    completed: u64,
}

/// The state's consolidation, VMs and hosts after a restart, checked against what was
/// acknowledged; `doubt` is the one operation whose answer the kill took (it may have happened).
async fn check(client: &reqwest::Client, base: &str, known: &mut Acknowledged, doubt: Option<&Op>) {
    let (status, report) = send(client.get(format!("{base}/v1/consolidation"))).await;
    assert_eq!(status, 200, "{report}");
    let in_flight: HashMap<String, String> = report["in_flight"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["vm_id"].as_str().unwrap().to_owned(), m["target"].as_str().unwrap().to_owned()))
        .collect();
    let (status, page) = send(client.get(format!("{base}/v1/hosts?limit=1000"))).await;
    assert_eq!(status, 200);
    let mut where_is: HashMap<String, String> = HashMap::new();
    for host in page["hosts"].as_array().unwrap() {
        let id = host["host_id"].as_str().unwrap().to_owned();
        assert!(host["used"]["cores"].as_f64().unwrap() <= host["capacity"]["cores"].as_f64().unwrap());
        for vm in host["vms"].as_array().unwrap() {
            let previous = where_is.insert(vm.as_str().unwrap().to_owned(), id.clone());
            assert!(previous.is_none(), "a VM on two hosts");
        }
    }
    let in_doubt = |vm: &str| match doubt {
        Some(Op::Complete(v)) | Some(Op::Release(v)) | Some(Op::Allocate(v)) => v == vm,
        _ => false,
    };
    for (vm, host) in &known.vms {
        let found = where_is.get(vm);
        let moved = known.in_flight.get(vm);
        let ok = found == Some(host) || (in_doubt(vm) && (found.is_none() || found == moved));
        assert!(ok, "acknowledged VM {vm} on {host} is on {found:?} after the restart");
    }
    for vm in &known.released {
        assert!(!where_is.contains_key(vm), "released VM {vm} is back");
    }
    for (vm, target) in &known.in_flight {
        if in_doubt(vm) {
            continue;
        }
        assert_eq!(in_flight.get(vm), Some(target), "acknowledged migration of {vm} lost: {report}");
    }
    for host in &known.emptying {
        let (state, vms) = host_state(client, base, host).await;
        assert!(state == "unavailable" || vms == 0, "host {host} being emptied is {state} with {vms} VMs");
    }
    assert!(report["counters"]["migrations_completed"].as_u64().unwrap() >= known.completed, "{report}");
    // Settle the doubt: what the store holds is what happened.
    if let Some(Op::Allocate(vm)) = doubt {
        if let Some(host) = where_is.get(vm) {
            known.vms.insert(vm.clone(), host.clone());
        }
    }
    for vm in known.vms.clone().keys() {
        match where_is.get(vm) {
            Some(host) => {
                known.vms.insert(vm.clone(), host.clone());
            }
            None => {
                known.vms.remove(vm);
                known.released.insert(vm.clone());
            }
        }
    }
    known.in_flight = in_flight;
    known.completed = report["counters"]["migrations_completed"].as_u64().unwrap();
    known.emptying =
        report["hosts"].as_array().unwrap().iter().map(|h| h["host"].as_str().unwrap().to_owned()).collect();
}

#[derive(Clone, Debug)]
enum Op {
    Allocate(String),
    Release(String),
    Complete(String),
    Round,
}

impl Op {
    fn request(&self, client: &reqwest::Client, base: &str, rng: &mut ChaCha8Rng) -> reqwest::RequestBuilder {
        match self {
            Op::Allocate(id) => {
                let cores = f64::from(rng.random_range(1..=6u32));
                client.post(format!("{base}/v1/allocations")).json(&json!({"vm": vm(id, "t", cores, cores * 2.0)}))
            }
            Op::Release(id) => client.delete(format!("{base}/v1/allocations/{id}")),
            Op::Complete(id) => admin(client.post(format!("{base}/v1/migrations/{id}/complete"))),
            Op::Round => admin(client.post(format!("{base}/v1/consolidation/rounds"))),
        }
    }
}

/// Takes what an acknowledged answer says into `known` (and the report the client reads after it).
async fn acknowledge(
    client: &reqwest::Client,
    base: &str,
    op: &Op,
    status: u16,
    body: &Value,
    known: &mut Acknowledged,
) {
    match op {
        Op::Allocate(id) => {
            if status == 201 {
                known.vms.insert(id.clone(), body["placements"][0]["host_id"].as_str().unwrap().to_owned());
            }
        }
        Op::Release(id) => {
            assert_eq!(status, 204, "{body}");
            known.vms.remove(id);
            known.released.insert(id.clone());
        }
        Op::Complete(id) => {
            assert_eq!(status, 200, "{body}");
            known.vms.insert(id.clone(), body["target"].as_str().unwrap().to_owned());
            known.completed += 1;
        }
        Op::Round => assert_eq!(status, 200, "{body}"),
    }
    let (_, report) = send(client.get(format!("{base}/v1/consolidation"))).await;
    known.in_flight = report["in_flight"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["vm_id"].as_str().unwrap().to_owned(), m["target"].as_str().unwrap().to_owned()))
        .collect();
    known.emptying =
        report["hosts"].as_array().unwrap().iter().map(|h| h["host"].as_str().unwrap().to_owned()).collect();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_during_consolidation_loses_no_placement_and_no_migration() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("crash.db");
    let client = reqwest::Client::new();
    let mut rng = ChaCha8Rng::seed_from_u64(43);
    let mut known = Acknowledged::default();
    let mut doubt: Option<Op> = None;
    let mut next_id = 0;
    let (mut rounds_started, mut completions) = (0, 0);
    for cycle in 0..6 {
        let mut server = start(&store, 8, &config("fewest-vms")).await;
        let base = server.base.clone();
        if cycle > 0 {
            check(&client, &base, &mut known, doubt.as_ref()).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let kill_after = rng.random_range(15..40);
        let mut acked = 0;
        doubt = None;
        while doubt.is_none() {
            let op = match rng.random_range(0..10) {
                0..=4 => {
                    next_id += 1;
                    Op::Allocate(format!("vm-{next_id}"))
                }
                5 | 6 if !known.vms.is_empty() => {
                    let mut ids: Vec<&String> = known.vms.keys().collect();
                    ids.sort();
                    Op::Release(ids[rng.random_range(0..ids.len())].clone())
                }
                7 | 8 if !known.in_flight.is_empty() => {
                    let mut ids: Vec<&String> = known.in_flight.keys().collect();
                    ids.sort();
                    Op::Complete(ids[rng.random_range(0..ids.len())].clone())
                }
                _ => Op::Round,
            };
            let request = op.request(&client, &base, &mut rng);
            if acked < kill_after {
                let (status, body) = send(request).await;
                if matches!(op, Op::Round) && body["started"].as_array().is_some_and(|s| !s.is_empty()) {
                    rounds_started += 1;
                }
                completions += usize::from(matches!(op, Op::Complete(_)));
                acknowledge(&client, &base, &op, status, &body, &mut known).await;
                acked += 1;
            } else {
                // The kill lands while this one is in flight.
                let in_flight = tokio::spawn(request.timeout(Duration::from_secs(5)).send());
                tokio::time::sleep(Duration::from_micros(rng.random_range(0..1500))).await;
                server.kill();
                if let Ok(Ok(response)) = in_flight.await {
                    let status = response.status().as_u16();
                    if let Ok(body) = response.json::<Value>().await {
                        // Answered before the kill: acknowledged after all (the report may be gone).
                        if matches!(op, Op::Allocate(_)) && status == 201 {
                            known.vms.insert(
                                op_id(&op).to_owned(),
                                body["placements"][0]["host_id"].as_str().unwrap_or_default().to_owned(),
                            );
                        }
                    }
                }
                doubt = Some(op);
            }
        }
    }
    let server = start(&store, 8, &config("fewest-vms")).await;
    check(&client, &server.base, &mut known, doubt.as_ref()).await;
    assert!(
        rounds_started >= 3 && completions >= 3,
        "too little consolidation: {rounds_started} rounds, {completions} completions"
    );
}

fn op_id(op: &Op) -> &str {
    match op {
        Op::Allocate(id) | Op::Release(id) | Op::Complete(id) => id,
        Op::Round => "",
    }
}

/// The service's durable allocator (commands, group commit, the SQLite store, reopened now and
/// then) makes the same consolidation choices as the placement core alone on the same events:
/// the hosts each round starts, the migrations and their targets, and every VM's host.
#[test]
fn the_durable_allocator_consolidates_as_the_core_does_across_restarts() {
    use allocator::durable::{
        Allocate, CompleteMigration, ConsolidationRound, DurableAllocator, Release, SetConsolidation,
    };
    use domain::{AllocationRequest, InventorySpec, Resources, VmId, VmRequest};
    use placement::consolidation::{ChooserKind, ConsolidationConfig};
    use placement::{Allocator, AllocatorConfig, Change, TieBreak};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("twin.db");
    let spec = InventorySpec::homogeneous("z", 10, 2, Resources::from_whole(16.0, 64.0, 0.0).unwrap());
    // Lowest-index ties: a restart cannot restore a tie-breaking generator's state.
    let config = AllocatorConfig { tie_break: TieBreak::LowestIndex, ..AllocatorConfig::default() };
    let settings = ConsolidationConfig {
        budget_per_host_day: 4.0,
        chooser: ChooserKind::FewestVms,
        every_s: 3600.0,
        ..ConsolidationConfig::default()
    };
    let mut core = Allocator::new(&spec, &config).unwrap();
    core.set_consolidation(Some(settings.clone()), 0.0).unwrap();
    let mut durable = DurableAllocator::open(&spec, &config, &Registry::standard(), &path, 0.0).unwrap();
    let request = SetConsolidation { config: Some(settings), only_if_off: false };
    durable.execute_one(request, 0.0).unwrap();
    core.take_changes().for_each(drop);

    let mut rng = ChaCha8Rng::seed_from_u64(5);
    // Pending events: (time, kind, VM), kind 0 exit, 1 migration done.
    let mut pending: Vec<(f64, u8, String)> = Vec::new();
    let (mut rounds, mut migrations) = (0, 0);
    for step in 0..1500 {
        let now = 60.0 * f64::from(step);
        pending.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        while pending.first().is_some_and(|e| e.0 <= now) {
            let (at, kind, vm) = pending.remove(0);
            let id = VmId::from(vm.as_str());
            if kind == 0 {
                let expected = core.release(&id, at).is_ok();
                let release = Release { vm: id, owner: None, ended_at_s: None };
                assert_eq!(durable.execute_one(release, at).is_ok(), expected, "release of {vm} at {at}");
            } else {
                let expected = core.complete_migration(&id, at).ok();
                let got = durable.execute_one(CompleteMigration::of(id), at).ok();
                assert_eq!(got, expected, "completion of {vm}'s migration at {at}");
                migrations += usize::from(expected.is_some());
            }
        }
        if core.consolidation_due_s().is_some_and(|due| due <= now) {
            let expected = core.consolidate(now).unwrap();
            let got = durable.execute_one(ConsolidationRound { due_only: true }, now).unwrap();
            assert_eq!(got, expected, "round at {now}");
            rounds += usize::from(!expected.is_empty());
        }
        // An arrival every 3 minutes: about 70% of the cores in use.
        if step % 3 == 0 {
            let cores = f64::from(rng.random_range(1..=6u32));
            let demand = Resources::from_whole(cores, cores * 2.0, 0.0).unwrap();
            let mut vm = VmRequest::new(&format!("vm-{step}"), "t", "D", demand);
            vm.facts.requested_at_s = Some(now);
            let request = AllocationRequest::Vm(vm);
            let expected = core.allocate(&request, now).unwrap();
            assert_eq!(durable.execute_one(Allocate(request), now).unwrap(), expected, "allocation at {now}");
            if expected.is_placed() {
                let longest = if rng.random_bool(0.2) { 600 } else { 90 };
                let life = 60.0 * f64::from(rng.random_range(1..=longest));
                pending.push((now + life, 0, format!("vm-{step}")));
            }
        }
        for change in core.take_changes() {
            if let Change::MigrationStarted { vm, .. } = change {
                pending.push((now + 1200.0, 1, vm.as_str().to_owned()));
            }
        }
        if step % 400 == 399 {
            drop(durable);
            durable = DurableAllocator::open(&spec, &config, &Registry::standard(), &path, now).unwrap();
        }
    }
    let (a, b) = (durable.allocator().unwrap(), &core);
    let hosts = |x: &Allocator| -> Vec<(String, Vec<VmId>)> {
        x.state().hosts().iter().map(|h| (h.id.to_string(), h.vms.iter().map(|vm| vm.id.clone()).collect())).collect()
    };
    assert_eq!(hosts(a), hosts(b));
    assert_eq!(a.consolidation_report(), b.consolidation_report());
    assert!(rounds >= 5 && migrations >= 10, "too little consolidation: {rounds} rounds, {migrations} migrations");
}
