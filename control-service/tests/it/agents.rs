//! Several allocation agents for one zone on one PostgreSQL store, behind the control service:
//! requests are spread over the agents, and when one is killed (SIGKILL) the control service fails
//! over to the others, with no failed allocation; every agent answers from the same state. The
//! storm test checks every acknowledged allocation and release against the store afterwards.

use serde_json::Value;
use test_support::postgres;
use test_support::stack::{self, default_models, start_allocator_on, start_control_agents, start_inference, vm};

/// The control service's `[allocator]` lines for these tests: an agent that is slow to answer (a
/// loaded machine, a PostgreSQL commit waiting on the disk) is not a failure here; a killed one
/// refuses connections at once, so failover does not wait for this timeout.
const PATIENT_AGENTS: &str = "timeout_ms = 15000\n[http]\nrequest_timeout_ms = 20000";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agent_fails_over_to_the_other_with_no_failed_allocation() {
    let pg = postgres::Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let inference = start_inference(dir.path(), &default_models(dir.path())).await;
    let mut a = start_allocator_on(dir.path(), 16, &pg.url, "").await;
    let b = start_allocator_on(dir.path(), 16, &pg.url, "").await;
    let control =
        start_control_agents(dir.path(), &[&inference.base], &[&a.base, &b.base], 2_000, PATIENT_AGENTS).await;
    let client = reqwest::Client::new();
    let allocate = control.url("/v1/allocate");
    for i in 0..40 {
        let response = client.post(&allocate).json(&vm(&format!("v{i}"), "t1", "D2", 2.0)).send().await.unwrap();
        assert_eq!(response.status(), 201, "{}", response.text().await.unwrap());
    }
    // Both agents took requests (in turn), and each answers from the whole zone's state.
    let mut placed_by = Vec::new();
    for agent in [&a, &b] {
        let metrics = client.get(agent.url("/metrics")).send().await.unwrap().text().await.unwrap();
        placed_by.push(metrics.lines().any(|l| l.starts_with("allocator_decisions_total") && l.contains("placed")));
        let stats: Value = stack::service_json(&client, agent.url("/v1/stats")).await;
        assert_eq!(stats["vms"], 40, "{}: {stats}", agent.base);
    }
    assert_eq!(placed_by, [true, true], "requests are spread over the agents");

    a.kill();
    for i in 40..80 {
        let response = client.post(&allocate).json(&vm(&format!("v{i}"), "t1", "D2", 2.0)).send().await.unwrap();
        assert_eq!(response.status(), 201, "VM v{i} after the kill: {}", response.text().await.unwrap());
    }
    // A retry of a VM placed before the kill, through the surviving agent, gets the same host.
    let first: Value =
        client.post(&allocate).json(&vm("v0", "t1", "D2", 2.0)).send().await.unwrap().json().await.unwrap();
    assert_eq!(first["replayed"], true, "{first}");
    let stats: Value = stack::service_json(&client, b.url("/v1/stats")).await;
    assert_eq!(stats["vms"], 80);
    assert_eq!(client.delete(control.url("/allocate/v3")).send().await.unwrap().status(), 204);
    assert_eq!(client.delete(control.url("/allocate/v3")).send().await.unwrap().status(), 404);
}

/// What the storm's clients saw.
#[derive(Default)]
struct Seen {
    /// Allocations answered 201, with the host given.
    placed: std::collections::HashMap<String, String>,
    /// VMs whose release was answered 204 (or 404 after the VM was placed: only its owner releases
    /// it, so an earlier attempt did).
    released: std::collections::HashSet<String>,
    /// Allocations answered "rejected" (nothing fits).
    rejected: usize,
    /// Requests that failed (5xx or no answer): their outcome is unknown.
    failed_allocations: Vec<String>,
    failed_releases: Vec<String>,
}

const STORM_CLIENTS: usize = 16;
const STORM_OPS: usize = 60;
const STORM_HOSTS: usize = 128;

/// One client of the storm: allocates its own VMs and releases every other one, oldest first.
async fn storm_client(control: String, c: usize, done: std::sync::Arc<std::sync::atomic::AtomicUsize>) -> Seen {
    let client = reqwest::Client::new();
    let mut seen = Seen::default();
    let mut live = std::collections::VecDeque::new();
    for k in 0..STORM_OPS {
        let id = format!("s{c}-{k}");
        let cores = 1 + (c + k) % 4;
        let answer = client
            .post(format!("{control}/v1/allocate"))
            .json(&vm(&id, &format!("t{c}"), "D2", cores as f64))
            .send()
            .await;
        match answer {
            Ok(response) if response.status() == 201 || response.status() == 200 => {
                let status = response.status();
                let decision: Value = response.json().await.unwrap();
                if decision["status"] == "rejected" {
                    assert_eq!(status, 200, "{decision}");
                    seen.rejected += 1;
                } else {
                    // 200 and `replayed`: the control service sent the request again (its agent
                    // died after committing), and another agent answered with the first placement.
                    assert!(status == 201 || decision["replayed"] == true, "{status} {decision}");
                    let host = decision["placements"][0]["host_id"].as_str().unwrap().to_owned();
                    seen.placed.insert(id.clone(), host);
                    live.push_back(id);
                }
            }
            Ok(response) if response.status().is_client_error() => {
                panic!("allocation {id}: {} {}", response.status(), response.text().await.unwrap())
            }
            other => {
                let why = match other {
                    Ok(response) => format!("{} {}", response.status(), response.text().await.unwrap_or_default()),
                    Err(error) => error.to_string(),
                };
                eprintln!("storm: allocation {id} failed: {why}");
                seen.failed_allocations.push(id)
            }
        }
        if k % 2 == 1 {
            if let Some(oldest) = live.pop_front() {
                match client.delete(format!("{control}/v1/allocate/{oldest}")).send().await.map(|r| r.status().as_u16())
                {
                    Ok(204 | 404) => {
                        seen.released.insert(oldest);
                    }
                    Ok(status) if status < 500 => panic!("release {oldest}: {status}"),
                    _ => seen.failed_releases.push(oldest),
                }
            }
        }
        done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    seen
}

/// The storm: 4 agents on one PostgreSQL zone behind the control service, 16 concurrent clients
/// allocating and releasing, one agent killed with SIGKILL a third of the way through and started
/// again afterwards. Every acknowledged allocation and release is then checked against the store,
/// and the restarted agent against the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_over_four_agents_with_one_killed_loses_nothing_and_the_agents_agree() {
    let pg = postgres::Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let inference = start_inference(dir.path(), &default_models(dir.path())).await;
    let mut agents = Vec::new();
    for _ in 0..4 {
        agents.push(start_allocator_on(dir.path(), STORM_HOSTS, &pg.url, "").await);
    }
    let urls: Vec<&str> = agents.iter().map(|a| a.base.as_str()).collect();
    let control = start_control_agents(dir.path(), &[&inference.base], &urls, 2_000, PATIENT_AGENTS).await;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let clients: Vec<_> = (0..STORM_CLIENTS)
        .map(|c| tokio::spawn(storm_client(control.base.clone(), c, std::sync::Arc::clone(&done))))
        .collect();
    let kill_at = STORM_CLIENTS * STORM_OPS / 3;
    while done.load(std::sync::atomic::Ordering::Relaxed) < kill_at {
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    agents[0].kill();
    let killed_at = done.load(std::sync::atomic::Ordering::Relaxed);
    let mut seen = Seen::default();
    for client in clients {
        let one = client.await.unwrap();
        seen.placed.extend(one.placed);
        seen.released.extend(one.released);
        seen.rejected += one.rejected;
        seen.failed_allocations.extend(one.failed_allocations);
        seen.failed_releases.extend(one.failed_releases);
    }
    assert!(killed_at < STORM_CLIENTS * STORM_OPS * 2 / 3, "the kill came {killed_at} operations in: not mid-storm");
    // The control service failed over: no client saw a failed allocation or release beyond the
    // requests in flight on the killed agent (at most one per client).
    let failed = seen.failed_allocations.len() + seen.failed_releases.len();
    eprintln!(
        "storm: {} operations, agent 0 killed after {killed_at}: {} placed, {} released, {} rejected, {} allocations \
         and {} releases failed",
        STORM_CLIENTS * STORM_OPS,
        seen.placed.len(),
        seen.released.len(),
        seen.rejected,
        seen.failed_allocations.len(),
        seen.failed_releases.len()
    );
    assert!(
        failed <= STORM_CLIENTS,
        "{failed} failed requests: {:?} {:?}",
        seen.failed_allocations,
        seen.failed_releases
    );
    assert!(
        seen.placed.len() > STORM_CLIENTS * STORM_OPS * 3 / 4,
        "placed {} of {}",
        seen.placed.len(),
        STORM_CLIENTS * STORM_OPS
    );

    // The killed agent starts again on the same port and catches up from the store.
    agents[0].restart(stack::READY_WITHIN).await;

    // Against the store: nothing acknowledged lost, no VM on two hosts, no released VM back.
    let rows = pg.psql("SELECT vm_id || ' ' || host_id FROM vms ORDER BY vm_id");
    let stored: std::collections::HashMap<&str, &str> = rows.lines().filter_map(|line| line.split_once(' ')).collect();
    assert_eq!(stored.len(), rows.lines().count(), "a VM id appears once (the primary key)");
    for (vm, host) in &seen.placed {
        if seen.released.contains(vm) {
            assert!(!stored.contains_key(vm.as_str()), "released VM {vm} is back");
        } else if !seen.failed_releases.contains(vm) {
            assert_eq!(stored.get(vm.as_str()), Some(&host.as_str()), "acknowledged VM {vm} on {host}");
        }
    }
    for vm in stored.keys() {
        assert!(
            seen.placed.contains_key(*vm) || seen.failed_allocations.iter().any(|f| f == vm),
            "VM {vm} in the store was never acknowledged nor in flight"
        );
    }
    // No host is over-committed in any dimension, and each uses exactly what its VMs demand.
    assert_eq!(
        pg.psql(
            "SELECT count(*) FROM hosts h WHERE h.cores_used > h.cores_cap OR h.memory_used > h.memory_cap
                 OR h.ssd_used > h.ssd_cap
                 OR h.cores_used <> COALESCE((SELECT sum(cores_base) FROM vms v WHERE v.host_id = h.host_id), 0)
                 OR h.memory_used <> COALESCE((SELECT sum(memory_base) FROM vms v WHERE v.host_id = h.host_id), 0)"
        ),
        "0"
    );

    // Every agent, the restarted one too, answers from the same state: same stats, same hosts.
    let client = reqwest::Client::new();
    let mut views = Vec::new();
    for agent in &agents {
        let stats: Value = stack::service_json(&client, agent.url("/v1/stats")).await;
        let hosts: Value = stack::service_json(&client, agent.url("/v1/hosts?limit=1000")).await;
        let hosts: Vec<_> = hosts["hosts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| (h["host_id"].clone(), h["state"].clone(), h["used"].clone(), sorted(&h["vms"])))
            .collect();
        assert_eq!(stats["vms"].as_u64(), Some(stored.len() as u64), "{}: {stats}", agent.base);
        views.push((stats["hosts"].clone(), stats["vms"].clone(), stats["empty_hosts"].clone(), hosts));
    }
    for (i, view) in views.iter().enumerate().skip(1) {
        assert!(*view == views[0], "agent {i} disagrees with agent 0");
    }
}

fn sorted(vms: &Value) -> Vec<String> {
    let mut ids: Vec<String> = vms.as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_owned()).collect();
    ids.sort();
    ids
}
