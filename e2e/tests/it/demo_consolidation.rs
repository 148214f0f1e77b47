//! The README's demo with consolidation, as `scripts/demo.sh` runs it: the three real services,
//! the allocator with the checked-in `configs/allocator.toml` (its `[consolidation]` section) on
//! the trace's clock, and `vmreplay` replaying a synthetic trace through `POST /allocate` while it
//! confirms consolidation's live migrations as the orchestrator does. Consolidation runs from the
//! config and is steered through the API, and its work shows in `vmreplay`'s summary, the
//! allocator's `GET /v1/consolidation` and `/metrics`, and the operator's console route of the
//! control service.

use crate::support;

use serde_json::Value as Json;
use std::path::{Path, PathBuf};
use std::process::Command;
use test_support::binaries::workspace_binary;

const ADMIN_TOKEN: &str = "e2e-admin-token";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// `configs/allocator.toml` without the lines a test sets itself (address, store, models).
fn checked_in_allocator_config() -> String {
    let text = std::fs::read_to_string(repo_root().join("configs/allocator.toml")).unwrap();
    assert!(text.contains("[consolidation]"), "configs/allocator.toml no longer turns consolidation on");
    text.lines()
        .filter(|line| !["listen", "store", "models_dir"].iter().any(|key| line.starts_with(&format!("{key} ="))))
        .collect::<Vec<_>>()
        .join("\n")
}

async fn get_json(client: &reqwest::Client, url: &str, token: &str) -> Json {
    let response = client.get(url).bearer_auth(token).send().await.unwrap();
    assert!(response.status().is_success(), "GET {url}: {}", response.status());
    response.json().await.unwrap()
}

/// The value of the first series of `name` in a Prometheus text exposition.
fn metric(exposition: &str, name: &str) -> Option<f64> {
    exposition
        .lines()
        .find(|line| line.strip_prefix(name).is_some_and(|rest| rest.starts_with([' ', '{'])))
        .and_then(|line| line.split_whitespace().last())
        .and_then(|value| value.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_consolidates_from_the_config_and_vmreplay_confirms_its_migrations() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    support::copy_dir(&repo_root().join("models/default"), &models.join("default"));
    let inference =
        support::start("inference-server", dir.path(), &format!("models_dir = \"{}\"\n", models.display())).await;
    let allocator_config = format!(
        "store = \"{}\"\nmodels_dir = \"{}\"\n{}",
        dir.path().join("allocator.db").display(),
        models.display(),
        checked_in_allocator_config()
    );
    let allocator =
        support::start_with("allocator", dir.path(), &allocator_config, &["--clock", "request"], Some(ADMIN_TOKEN))
            .await;
    let control = support::start(
        "control-service",
        dir.path(),
        &format!(
            "default_zone = \"zone-1\"\n[zones.zone-1]\nallocator = \"{}\"\n[inference]\nservers = [\"{}\"]\n",
            allocator.base, inference.base
        ),
    )
    .await;
    let client = reqwest::Client::new();

    // From the config: on at the first start, with the checked-in settings.
    let report = get_json(&client, &allocator.url("/v1/consolidation"), support::SERVICE_TOKEN).await;
    assert_eq!(report["config"]["chooser"], "lifetime", "{report}");
    assert_eq!(report["paused"], false, "{report}");
    // Through the API: a larger budget, so that two trace days on an empty zone surely move VMs.
    let mut settings = report["config"].clone();
    settings["budget_per_host_day"] = serde_json::json!(1.0);
    let put =
        client.put(allocator.url("/v1/consolidation")).bearer_auth(ADMIN_TOKEN).json(&settings).send().await.unwrap();
    assert_eq!(put.status(), 200, "PUT /v1/consolidation: {}", put.text().await.unwrap());

    let summary_path = dir.path().join("replay.json");
    let mut replay = Command::new(workspace_binary("vmreplay"));
    replay
        .args(["--synthetic-days", "2", "--speed", "14400", "--concurrency", "8", "--quiet"])
        .args(["--control", &control.base, "--confirm-migrations", &allocator.base, "--migration-s", "1200"])
        .arg("--json")
        .arg(&summary_path)
        .env("VMREPLAY_ADMIN_TOKEN", ADMIN_TOKEN)
        .env_remove("VMREPLAY_API_KEY");
    let output = tokio::task::spawn_blocking(move || replay.output()).await.unwrap().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "vmreplay failed:\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("migrations confirmed"), "the summary says nothing of migrations:\n{stdout}");
    let summary: Json = serde_json::from_slice(&std::fs::read(&summary_path).unwrap()).unwrap();
    let migrations = &summary["migrations"];
    let confirmed = migrations["confirmed"].as_u64().unwrap();
    assert!(confirmed > 0, "vmreplay confirmed no migration: {migrations}");
    assert_eq!(migrations["errors"], 0, "{migrations}");

    // The allocator's own account agrees with what the orchestrator confirmed.
    let report = get_json(&client, &allocator.url("/v1/consolidation"), support::SERVICE_TOKEN).await;
    let counters = &report["counters"];
    assert_eq!(counters["migrations_completed"].as_u64(), Some(confirmed), "{report}");
    assert!(counters["hosts_started"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(&migrations["consolidation"], counters, "the summary's counters are the allocator's at the end");
    // Its metrics, and the operator's console route of the control service.
    let exposition = client.get(allocator.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert_eq!(
        metric(&exposition, "allocator_consolidation_migrations_completed_total"),
        Some(confirmed as f64),
        "allocator /metrics"
    );
    let console = client.get(control.url("/v1/zones/zone-1/consolidation")).send().await.unwrap();
    assert_eq!(console.status(), 200, "the console's consolidation route");
    let console: Json = console.json().await.unwrap();
    assert_eq!(&console["counters"], counters, "the console shows the allocator's consolidation");

    // A wrong admin token is refused before the replay sends anything.
    let bad = Command::new(workspace_binary("vmreplay"))
        .args(["--synthetic-days", "0.01", "--quiet", "--control", &control.base])
        .args(["--confirm-migrations", &allocator.base])
        .env("VMREPLAY_ADMIN_TOKEN", "wrong")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && stderr.contains("admin token"), "{stderr}");
}
