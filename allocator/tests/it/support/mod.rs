//! Starting the real `allocator` binary on loopback for the service and crash tests, and the
//! harnesses of the PostgreSQL fault tests.

#![allow(dead_code)]

pub mod faults;
pub mod patroni;
pub mod proxy;

use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use test_support::process::{with_config, Process};

pub const TOKEN: &str = "test-admin-token";

/// A running `allocator` process; killed (SIGKILL: no graceful shutdown, no last checkpoint) when
/// dropped.
pub type Server = Process;

/// The configuration of a test server: `hosts` hosts of 16 cores and 64 GiB, two to a rack, plus
/// `extra` TOML (top-level keys first, then sections).
pub fn config_text(port: u16, store: &Path, hosts: usize, extra: &str) -> String {
    format!(
        "listen = \"127.0.0.1:{port}\"\nstore = \"{}\"\n{extra}\n[generate]\nzone = \"z\"\nhosts = {hosts}\nhosts_per_rack = 2\ncores = 16\nmemory_gib = 64\n",
        store.display()
    )
}

/// Starts the binary on a free port with the store at `store`, waiting until `/readyz` answers.
pub async fn start(store: &Path, hosts: usize, extra: &str) -> Server {
    let dir = store.parent().unwrap_or(Path::new("."));
    start_at(dir, &store.display().to_string(), hosts, extra).await
}

/// Starts the binary on a free port with its config in `dir` and the store `store` (a path or a
/// `postgres://` URL), waiting until `/readyz` answers from this binary (another test's server may
/// take the port in between: this one then fails to bind, after opening its store, and starts
/// again on another port).
pub async fn start_at(dir: &Path, store: &str, hosts: usize, extra: &str) -> Server {
    let spawn = |port: u16| {
        let config = dir.join(format!("allocator-{port}.toml"));
        std::fs::write(&config, config_text(port, Path::new(store), hosts, extra)).unwrap();
        spawn_with(&config)
    };
    Process::start("the allocator", Duration::from_secs(30), spawn).await
}

/// The binary started with the configuration file `config`.
fn spawn_with(config: &Path) -> std::process::Child {
    with_config(&mut Command::new(env!("CARGO_BIN_EXE_allocator")), config)
        .env_remove("ALLOCATOR_ADMIN_TOKEN")
        // These tests run the allocator in open mode unless their config sets a service token
        // (the credential itself is tested with the whole stack, control-service/tests/it/credentials.rs).
        .env_remove("ALLOCATOR_SERVICE_TOKEN")
        .env_remove("ALLOCATOR_SERVICE_TOKEN_FILE")
        .env_remove("ALLOCATOR_PREVIOUS_SERVICE_TOKEN")
        .spawn()
        .unwrap()
}

pub fn vm(id: &str, tenant: &str, cores: f64, memory_gib: f64) -> Value {
    json!({"vm_id": id, "tenant_id": tenant, "vm_type": "D", "demand": {"cores": cores, "memory_gib": memory_gib}})
}

/// Status and JSON body (null when empty) of a request.
pub async fn send(request: reqwest::RequestBuilder) -> (u16, Value) {
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let is_problem = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/problem+json"));
    let bytes = response.bytes().await.unwrap();
    if status >= 400 {
        assert!(is_problem, "error {status} without a problem body: {}", String::from_utf8_lossy(&bytes));
    }
    let body = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).unwrap_or(Value::Null) };
    (status, body)
}

/// Every host with its VM ids, across pages.
pub async fn hosts(client: &reqwest::Client, server: &Server) -> Vec<Value> {
    let (status, body) = send(client.get(server.url("/v1/hosts?limit=10000"))).await;
    assert_eq!(status, 200, "{body}");
    body["hosts"].as_array().unwrap().clone()
}

/// [`start_at`], restartable: [`Server::restart`] kills it (SIGKILL) and starts it again on the same
/// port with the same configuration and store.
pub async fn start_restartable_at(dir: &Path, store: &str, hosts: usize, extra: &str) -> Server {
    let server = start_at(dir, store, hosts, extra).await;
    let config = dir.join(format!("allocator-{}.toml", server.port()));
    server.restartable(move || spawn_with(&config))
}
