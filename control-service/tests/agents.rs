//! Several allocation agents for one zone on one PostgreSQL store, behind the control service:
//! requests are spread over the agents, and when one is killed (SIGKILL) the control service fails
//! over to the other, with no failed allocation; every agent answers from the same state.

mod support;

#[path = "../../allocator/tests/support/postgres.rs"]
mod postgres;

use serde_json::Value;
use support::{default_models, start_allocator_on, start_control_agents, start_inference, vm};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agent_fails_over_to_the_other_with_no_failed_allocation() {
    let pg = postgres::Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let inference = start_inference(dir.path(), &default_models(dir.path())).await;
    let mut a = start_allocator_on(dir.path(), 16, &pg.url, "").await;
    let b = start_allocator_on(dir.path(), 16, &pg.url, "").await;
    let control = start_control_agents(dir.path(), &[&inference.base], &[&a.base, &b.base], 2_000, "").await;
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
        let stats: Value = client.get(agent.url("/v1/stats")).send().await.unwrap().json().await.unwrap();
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
    let stats: Value = client.get(b.url("/v1/stats")).send().await.unwrap().json().await.unwrap();
    assert_eq!(stats["vms"], 80);
    assert_eq!(client.delete(control.url("/allocate/v3")).send().await.unwrap().status(), 204);
    assert_eq!(client.delete(control.url("/allocate/v3")).send().await.unwrap().status(), 404);
}
