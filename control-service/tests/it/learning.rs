//! The learning loop end to end (issue 18), with the real binaries: the control service feeds
//! every placement and release to the inference server, whose tenants' history then gives the
//! features the trainer computes for the same VMs.

use lifetime_model::dataset::replay;
use lifetime_model::history::{Histories, HistoryKey};
use lifetime_model::LifetimeModel;
use serde_json::Value;
use test_support::stack;
use test_support::stack::*;
use traces::{ExtraColumns, VmRecord};

/// Tenants the bundle never saw, arriving and leaving after its training cut-off: `count` VMs of
/// 5 tenants, one every 7 minutes, living 10 minutes to 5 hours.
fn new_tenants_workload(count: usize, from_s: f64) -> Vec<VmRecord> {
    (0..count)
        .map(|i| {
            let start_s = from_s + 420.0 * i as f64;
            // A spread of lifetimes: short, around the 2 h threshold, long.
            let lifetime_s = [600.0, 1_800.0, 5_400.0, 9_000.0, 18_000.0][(i * 7 + i / 5) % 5];
            VmRecord {
                vm_id: format!("live-{i}"),
                tenant_id: format!("newcomer-{}", i % 5),
                vm_type: ["D2", "D4", "E8"][i % 3].to_owned(),
                cores: [2.0, 4.0, 8.0][i % 3],
                memory_gib: [8.0, 16.0, 64.0][i % 3],
                priority: domain::Priority::Regular,
                start_s,
                end_s: Some(start_s + lifetime_s),
                extra: ExtraColumns::default(),
            }
        })
        .collect()
}

/// A served row as the inference server wrote it (NaN is written as null).
fn row_of(line: &Value) -> Vec<f64> {
    line["row"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap_or(f64::NAN)).collect()
}

fn same(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y || (x.is_nan() && y.is_nan()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_after_the_cut_off_get_the_features_the_trainer_computes() {
    let dir = tempfile::tempdir().unwrap();
    let models = default_models(dir.path());
    let bundle = LifetimeModel::load(models.join("default")).unwrap();
    let served = dir.path().join("served.jsonl");
    let inference = start_inference_with(
        dir.path(),
        &models,
        &format!("watch_interval_ms = 200\n[history]\nserved_rows = \"{}\"", served.display()),
    )
    .await;
    let allocator = start_allocator(dir.path(), 64).await;
    // No cache: every VM's prediction is computed by the inference server.
    let control =
        start_control(dir.path(), &[&inference.url("")], &allocator.url(""), 1_000, "[cache]\nmax_entries = 0\n").await;

    let from_s = bundle.feature_store().as_of_s + 86_400.0;
    let records = new_tenants_workload(60, from_s);
    for record in &records {
        let tenant = HistoryKey::Tenant(record.tenant_id.clone());
        assert!(bundle.feature_store().get(&tenant).is_none(), "the bundle must not know the tenant");
    }
    // Arrivals and releases in time order (a release before an arrival at the same instant).
    let last_start = records.last().unwrap().start_s;
    let mut events: Vec<(f64, bool, usize)> = Vec::new();
    for (i, record) in records.iter().enumerate() {
        events.push((record.start_s, true, i));
        if let Some(end) = record.end_s.filter(|end| *end <= last_start) {
            events.push((end, false, i));
        }
    }
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let client = reqwest::Client::new();
    for (at_s, arrival, i) in events {
        let record = &records[i];
        if arrival {
            let body = serde_json::json!({"vm": {
                "vm_id": record.vm_id, "tenant_id": record.tenant_id, "vm_type": record.vm_type,
                "demand": {"cores": record.cores, "memory_gib": record.memory_gib},
                "requested_at_s": at_s
            }});
            let response = client.post(control.url("/v1/allocate")).json(&body).send().await.unwrap();
            assert_eq!(response.status(), 201, "{}", response.text().await.unwrap());
        } else {
            let url = control.url(&format!("/v1/allocate/{}?ended_at_s={at_s}", record.vm_id));
            let response = client.delete(url).send().await.unwrap();
            assert_eq!(response.status(), 204, "{}", response.text().await.unwrap());
        }
    }

    // What the trainer computes for the same VMs from the same events.
    let trainer = replay(&records, bundle.encoder(), last_start + 1.0, last_start + 1.0, last_start + 1.0);
    let lines: Vec<Value> =
        std::fs::read_to_string(&served).unwrap().lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(lines.len(), records.len(), "one served row per VM");
    let mut with_history = 0;
    for (i, record) in records.iter().enumerate() {
        let line = lines.iter().find(|line| line["key"] == record.vm_id.as_str()).expect("a served row");
        let (served_row, trainer_row) = (row_of(line), trainer.row(i));
        assert!(same(&served_row, trainer_row), "{}: served {served_row:?}\ntrainer {trainer_row:?}", record.vm_id);
        // The tenant-history part of the row is not empty for every VM but each tenant's first.
        let unknown = lifetime_model::history::Past::unknown();
        if !same(&served_row, &bundle.encoder().encode(&record.into(), &unknown, None)) {
            with_history += 1;
        }
    }
    assert!(with_history >= records.len() - 5, "{with_history} of {} VMs had a history", records.len());

    // The server's history says what it did with the events.
    let status: Value = stack::service_json(&client, inference.url("/v1/history")).await;
    assert_eq!(status["live"], true);
    assert_eq!(status["base_version"], "default-1");
    let applied = status["counters"]["applied"].as_u64().unwrap();
    assert!(applied >= records.len() as u64, "{status}");
    assert_eq!(status["counters"]["unknown_vms"], 0, "{status}");
}
