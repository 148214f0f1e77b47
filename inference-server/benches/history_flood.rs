//! Bounded memory of the live tenant history under bad input (issue 18): the real
//! `inference-server` binary on loopback, with its default `[history]` limits, is flooded through
//! `POST /v1/history` with
//! 1. `started` events of brand-new tenants, one VM each (a flood of new tenants),
//! 2. `ended` events of VMs it never saw,
//! 3. the same events again (duplicates) and ends before their starts (out of order),
//!
//! and its resident memory is sampled along the way, beside the idle server's as the reference.
//! Every request must answer 200, the counters must say what became of the events, and a
//! prediction must still work at the end.
//!
//! `cargo bench -p inference-server --bench history_flood` (`-- EVENTS` to change the flood's
//! size, 2,000,000 by default).

use serde_json::{json, Value};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The service credential of the server under test (credentials on, as deployed).
const SERVICE_TOKEN: &str = "bench-service-token";
/// Events per request: the server's limit.
const PER_REQUEST: usize = 1_000;

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(f64::NAN);
    kib / 1024.0
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn copy_default_bundle(models: &Path) {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/default");
    let target = models.join("default");
    std::fs::create_dir_all(&target).expect("models dir");
    for entry in std::fs::read_dir(&source).expect("models/default") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), target.join(entry.file_name())).expect("copy");
    }
}

async fn status(client: &reqwest::Client, base: &str) -> Value {
    client.get(format!("{base}/v1/history")).send().await.expect("status").json().await.expect("json")
}

async fn send(client: &reqwest::Client, base: &str, events: Vec<Value>) {
    let response =
        client.post(format!("{base}/v1/history")).json(&json!({ "events": events })).send().await.expect("sent");
    assert!(response.status().is_success(), "history answered {}", response.status());
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let total: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(2_000_000);
    let dir = tempfile::tempdir().expect("temp dir");
    let models = dir.path().join("models");
    copy_default_bundle(&models);
    let port = free_port();
    let config = dir.path().join("inference.toml");
    std::fs::write(&config, format!("listen = \"127.0.0.1:{port}\"\nmodels_dir = \"{}\"\n", models.display()))
        .expect("config");
    let child = Command::new(env!("CARGO_BIN_EXE_inference-server"))
        .arg("--config")
        .arg(&config)
        .env("RUST_LOG", "error")
        // Credentials on, as deployed: the measured path includes the check.
        .env("INFERENCE_SERVICE_TOKEN", SERVICE_TOKEN)
        .env_remove("INFERENCE_SERVICE_TOKEN_FILE")
        .stdout(Stdio::null())
        .spawn()
        .expect("inference-server started");
    let pid = child.id();
    let server = Server(child);
    let base = format!("http://127.0.0.1:{port}");
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {SERVICE_TOKEN}").parse().expect("header value"));
    let client = reqwest::Client::builder().default_headers(headers).build().expect("HTTP client");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !client.get(format!("{base}/readyz")).send().await.is_ok_and(|r| r.status().is_success()) {
        assert!(Instant::now() < deadline, "the server did not get ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The bundle's cut-off (known once the history starts: with a first prediction): events must
    // come after it to count.
    let predict = |at_s: f64| json!({"instances": [{"tenant_id": "flood-tenant-1", "vm_type": "D2", "cores": 2, "memory_gib": 8, "requested_at_s": at_s}]});
    let response = client.post(format!("{base}/v1/predict")).json(&predict(0.0)).send().await.expect("predict");
    assert!(response.status().is_success(), "predict answered {}", response.status());
    let first = status(&client, &base).await;
    let after = first["as_of_s"].as_f64().unwrap_or(0.0) + 1_000.0;
    let idle = rss_mib(pid);
    println!("flood of {total} started events of new tenants, then {} ends of unknown VMs, then duplicates and out-of-order ends; default [history] limits", total / 4);
    println!("| phase | events sent | RSS MiB | tenants | running VMs | journal |");
    println!("|---|---:|---:|---:|---:|---:|");
    let row = |phase: &str, sent: usize, s: &Value| {
        println!(
            "| {phase} | {sent} | {:.0} | {} | {} | {} |",
            rss_mib(pid),
            s["tenants"],
            s["running_vms"],
            s["journal_events"]
        );
    };
    println!("| idle (reference) | 0 | {idle:.0} | - | - | - |");
    let started = Instant::now();
    let mut sent = 0;
    let samples = 8;
    for chunk in 0..total.div_ceil(PER_REQUEST) {
        let events = (0..PER_REQUEST)
            .map(|i| chunk * PER_REQUEST + i)
            .map(|n| json!({"event": "started", "vm_id": format!("flood-{n}"), "tenant_id": format!("flood-tenant-{n}"), "at_s": after + n as f64 * 0.01}))
            .collect();
        send(&client, &base, events).await;
        sent += PER_REQUEST;
        if (chunk + 1) % (total / PER_REQUEST / samples).max(1) == 0 {
            row("new tenants", sent, &status(&client, &base).await);
        }
    }
    let flood_s = started.elapsed().as_secs_f64();
    // Ends of VMs the server never saw (or forgot).
    for chunk in 0..(total / 4).div_ceil(PER_REQUEST) {
        let events = (0..PER_REQUEST)
            .map(|i| json!({"event": "ended", "vm_id": format!("ghost-{}", chunk * PER_REQUEST + i), "at_s": after + 1e6}))
            .collect();
        send(&client, &base, events).await;
        sent += PER_REQUEST;
    }
    row("ends of unknown VMs", sent, &status(&client, &base).await);
    // The last tenants' events again (duplicates), and ends that come before their starts.
    for chunk in 0..100 {
        let events: Vec<Value> = (0..PER_REQUEST / 2)
            .flat_map(|i| {
                let n = total - 1 - (chunk * PER_REQUEST / 2 + i);
                [
                    json!({"event": "started", "vm_id": format!("flood-{n}"), "tenant_id": format!("flood-tenant-{n}"), "at_s": after + n as f64 * 0.01}),
                    json!({"event": "ended", "vm_id": format!("early-{n}"), "at_s": after}),
                ]
            })
            .collect();
        send(&client, &base, events).await;
        sent += PER_REQUEST;
    }
    let last = status(&client, &base).await;
    row("duplicates and out of order", sent, &last);
    println!();
    println!("flood rate: {:.0} events/s; counters: {}", total as f64 / flood_s, last["counters"]);
    println!("RSS: idle {idle:.0} MiB, after everything {:.0} MiB", rss_mib(pid));
    // Still serving.
    let response = client.post(format!("{base}/v1/predict")).json(&predict(after)).send().await.expect("predict");
    assert!(response.status().is_success(), "predict answered {}", response.status());
    drop(server);
}
