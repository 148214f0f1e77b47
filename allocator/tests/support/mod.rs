//! Starting the real `allocator` binary on loopback for the service and crash tests.

#![allow(dead_code)]

pub mod faults;
mod listening;
pub mod patroni;
pub mod postgres;
pub mod proxy;

use listening::listens_on;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const TOKEN: &str = "test-admin-token";

/// A running `allocator` process; killed (SIGKILL) when dropped.
pub struct Server {
    pub child: Option<Child>,
    pub base: String,
    pub config: PathBuf,
}

impl Server {
    /// SIGKILL: no graceful shutdown, no last checkpoint.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

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
/// `postgres://` URL), waiting until `/readyz` answers.
pub async fn start_at(dir: &Path, store: &str, hosts: usize, extra: &str) -> Server {
    for _attempt in 0..5 {
        let port = free_port();
        let config = dir.join(format!("allocator-{port}.toml"));
        std::fs::write(&config, config_text(port, Path::new(store), hosts, extra)).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_allocator"))
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "warn")
            .env_remove("ALLOCATOR_ADMIN_TOKEN")
            // These tests run the allocator in open mode unless their config sets a service token
            // (the credential itself is tested with the whole stack, control-service/tests/credentials.rs).
            .env_remove("ALLOCATOR_SERVICE_TOKEN")
            .env_remove("ALLOCATOR_SERVICE_TOKEN_FILE")
            .env_remove("ALLOCATOR_PREVIOUS_SERVICE_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut server = Server { child: Some(child), base: format!("http://127.0.0.1:{port}"), config };
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = client.get(server.url("/readyz")).send().await {
                // Another test's server may have taken the port in between (this one then fails to
                // bind, after opening its store): only an answer from this child counts.
                let ours = server.child.as_ref().is_some_and(|child| listens_on(child.id(), port));
                if r.status().is_success() && ours {
                    return server;
                }
            }
            // Exited: most likely the port was taken in between; try another one.
            if let Some(child) = server.child.as_mut() {
                if child.try_wait().unwrap().is_some() {
                    server.child = None;
                    break;
                }
            }
            assert!(Instant::now() < deadline, "the allocator did not become ready");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    panic!("the allocator did not start");
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
