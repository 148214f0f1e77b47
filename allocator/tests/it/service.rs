//! End-to-end tests of the real `allocator` binary on loopback: placement, validation, idempotent
//! retries, releases, admin auth, drained hosts, explain, stats, metrics and the OpenAPI document.

use crate::support;

use serde_json::{json, Value};
use support::{hosts, send, start, vm, TOKEN};

fn with_token() -> String {
    format!("admin_token = \"{TOKEN}\"")
}

fn placements(body: &Value) -> Vec<(String, String)> {
    body["placements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["vm_id"].as_str().unwrap().to_owned(), p["host_id"].as_str().unwrap().to_owned()))
        .collect()
}

#[tokio::test]
async fn places_reads_and_releases_vms_and_gangs() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(&dir.path().join("a.db"), 6, "").await;
    let client = reqwest::Client::new();

    let (status, body) =
        send(client.post(server.url("/v1/allocations")).json(&json!({"vm": vm("v1", "t1", 2.0, 8.0)}))).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["status"], "placed");
    let host = placements(&body)[0].1.clone();
    assert!(!body["rule_stats"].as_array().unwrap().is_empty());

    let (status, info) = send(client.get(server.url("/v1/allocations/v1"))).await;
    assert_eq!(status, 200);
    assert_eq!(info["host_id"], host.as_str());
    assert_eq!(info["demand"]["cores"], 2.0);
    assert_eq!(info["tenant_id"], "t1");

    let gang = json!({"gang": {"tenant_id": "t2", "vms": [vm("g1", "t2", 4.0, 8.0), vm("g2", "t2", 4.0, 8.0), vm("g3", "t2", 4.0, 8.0)]}});
    let (status, body) = send(client.post(server.url("/v1/allocations")).json(&gang)).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(placements(&body).len(), 3);

    let (status, detail) = send(client.get(server.url(&format!("/v1/hosts/{host}")))).await;
    assert_eq!(status, 200);
    assert!(detail["vms"].as_array().unwrap().iter().any(|v| v["vm_id"] == "v1"));
    assert!(detail["used"]["cores"].as_f64().unwrap() >= 2.0);
    assert_eq!(detail["capacity"]["cores"], 16.0);

    let listed: usize = hosts(&client, &server).await.iter().map(|h| h["vms"].as_array().unwrap().len()).sum();
    assert_eq!(listed, 4);
    let (_, stats) = send(client.get(server.url("/v1/stats"))).await;
    assert_eq!(stats["vms"], 4);
    assert_eq!(stats["allocated_cores"], 14.0);

    let (status, body) = send(client.delete(server.url("/v1/allocations/v1"))).await;
    assert_eq!((status, body), (204, Value::Null));
    let (status, body) = send(client.get(server.url("/v1/allocations/v1"))).await;
    assert_eq!(status, 404);
    assert_eq!(body["type"], "urn:problem:unknown-vm");
    let (_, stats) = send(client.get(server.url("/v1/stats"))).await;
    assert_eq!(stats["vms"], 3);
}

/// `?tenant=` restricts a lookup or a release to the tenant's own VMs: another tenant's VM answers
/// 404 exactly like an unknown one, and stays placed.
#[tokio::test]
async fn lookups_and_releases_with_a_tenant_touch_only_its_own_vms() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(&dir.path().join("a.db"), 2, "").await;
    let client = reqwest::Client::new();
    let (status, body) =
        send(client.post(server.url("/v1/allocations")).json(&json!({"vm": vm("owned", "alice", 2.0, 8.0)}))).await;
    assert_eq!(status, 201, "{body}");

    let (status, stranger) = send(client.get(server.url("/v1/allocations/owned?tenant=bob"))).await;
    let (_, unknown) = send(client.get(server.url("/v1/allocations/nothing-here?tenant=bob"))).await;
    assert_eq!(status, 404);
    assert_eq!(
        (&stranger["type"], &unknown["type"]),
        (&json!("urn:problem:unknown-vm"), &json!("urn:problem:unknown-vm"))
    );
    let (status, _) = send(client.delete(server.url("/v1/allocations/owned?tenant=bob"))).await;
    assert_eq!(status, 404);
    let (_, stats) = send(client.get(server.url("/v1/stats"))).await;
    assert_eq!(stats["vms"], 1, "bob's release changed nothing");

    let (status, bad) = send(client.get(server.url("/v1/allocations/owned?tenant=a%2Fb"))).await;
    assert_eq!((status, bad["errors"][0]["field"].as_str()), (422, Some("tenant")));
    let (status, info) = send(client.get(server.url("/v1/allocations/owned?tenant=alice"))).await;
    assert_eq!((status, &info["tenant_id"]), (200, &json!("alice")));
    let (status, _) = send(client.delete(server.url("/v1/allocations/owned?tenant=alice"))).await;
    assert_eq!(status, 204);
    let (_, stats) = send(client.get(server.url("/v1/stats"))).await;
    assert_eq!(stats["vms"], 0);
}

#[tokio::test]
async fn bad_requests_get_problems_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(&dir.path().join("a.db"), 2, "").await;
    let client = reqwest::Client::new();
    let post = |body: Value| client.post(server.url("/v1/allocations")).json(&body);

    let cases = [
        (json!({"vm": vm("v", "t", 0.0, 4.0)}), 422, "vm.demand.cores"),
        (json!({"vm": vm("", "t", 1.0, 4.0)}), 422, "vm.vm_id"),
        (
            json!({"vm": {"vm_id": "v", "tenant_id": "t", "vm_type": "D", "demand": {"cores": 1, "memory_gib": 1}, "colour": "red"}}),
            400,
            "vm.colour",
        ),
        (
            json!({"vm": {"vm_id": "v", "tenant_id": "t", "vm_type": "D", "demand": {"cores": "two", "memory_gib": 1}}}),
            400,
            "vm.demand.cores",
        ),
        (json!({"gang": {"tenant_id": "t", "vms": []}}), 422, "gang.vms"),
        (
            json!({"gang": {"tenant_id": "t", "vms": [vm("a", "t", 1.0, 1.0), vm("b", "u", 1.0, 1.0)]}}),
            422,
            "gang.vms[1].tenant_id",
        ),
        (json!({"bogus": {}}), 400, "bogus"),
    ];
    for (body, expected_status, field) in cases {
        let (status, problem) = send(post(body.clone())).await;
        assert_eq!(status, expected_status, "{body} -> {problem}");
        assert_eq!(problem["errors"][0]["field"], field, "{body} -> {problem}");
        assert_eq!(problem["status"], expected_status);
    }
    let (status, _) = send(client.post(server.url("/v1/allocations")).body("{\"vm\":")).await;
    assert_eq!(status, 415, "no JSON content type");
    let (status, problem) =
        send(client.post(server.url("/v1/allocations")).header("content-type", "application/json").body("{\"vm\": {"))
            .await;
    assert_eq!(status, 400, "{problem}");

    let explain = |body: Value| client.post(server.url("/v1/explain")).json(&body);
    let (status, problem) = send(explain(json!({"vm": vm("v", "t", 1.0, 1.0), "top": 0}))).await;
    assert_eq!((status, problem["errors"][0]["field"].clone()), (422, json!("top")));
    let (status, problem) = send(explain(json!({"vm": vm("v", "t", 1.0, 1.0), "why_not": "nowhere"}))).await;
    assert_eq!((status, problem["errors"][0]["field"].clone()), (422, json!("why_not")), "{problem}");
    let (status, problem) = send(explain(json!({"vm": vm("v", "t", -1.0, 1.0)}))).await;
    assert_eq!((status, problem["errors"][0]["field"].clone()), (400, json!("vm.demand.cores")), "{problem}");

    for (query, status_expected, field) in [
        ("limit=abc", 400, "limit"),
        ("limit=0", 422, "limit"),
        ("state=broken", 400, "state"),
        ("colour=red", 400, "colour"),
    ] {
        let (status, problem) = send(client.get(server.url(&format!("/v1/hosts?{query}")))).await;
        assert_eq!((status, problem["errors"][0]["field"].clone()), (status_expected, json!(field)), "{query}");
    }
    let (status, _) = send(client.get(server.url("/v1/hosts/nowhere"))).await;
    assert_eq!(status, 404);
    let (_, stats) = send(client.get(server.url("/v1/stats"))).await;
    assert_eq!(stats["vms"], 0, "bad requests change nothing");
}

#[tokio::test]
async fn retries_are_idempotent_and_reused_ids_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(&dir.path().join("a.db"), 4, "").await;
    let client = reqwest::Client::new();
    let request = json!({"vm": vm("v1", "t", 3.0, 6.0)});
    let (status, first) = send(client.post(server.url("/v1/allocations")).json(&request)).await;
    assert_eq!(status, 201);
    for _ in 0..3 {
        let (status, again) = send(client.post(server.url("/v1/allocations")).json(&request)).await;
        assert_eq!(status, 200, "{again}");
        assert_eq!(again["replayed"], true);
        assert_eq!(placements(&again), placements(&first));
    }
    let (status, problem) =
        send(client.post(server.url("/v1/allocations")).json(&json!({"vm": vm("v1", "t", 4.0, 6.0)}))).await;
    assert_eq!(status, 409);
    assert_eq!(problem["type"], "urn:problem:vm-id-reused");
    let gang = json!({"gang": {"tenant_id": "t", "vms": [vm("v1", "t", 3.0, 6.0), vm("v2", "t", 1.0, 1.0)]}});
    let (status, problem) = send(client.post(server.url("/v1/allocations")).json(&gang)).await;
    assert_eq!(status, 409);
    assert_eq!(problem["type"], "urn:problem:partial-gang");
    let (_, stats) = send(client.get(server.url("/v1/stats"))).await;
    assert_eq!(stats["vms"], 1);
    assert_eq!(stats["allocated_cores"], 3.0);

    let (status, problem) = send(client.delete(server.url("/v1/allocations/never-placed"))).await;
    assert_eq!(status, 404);
    assert_eq!(problem["type"], "urn:problem:unknown-vm");
    assert_eq!(send(client.delete(server.url("/v1/allocations/v1"))).await.0, 204);
    assert_eq!(send(client.delete(server.url("/v1/allocations/v1"))).await.0, 404, "a second release finds nothing");
}

#[tokio::test]
async fn admin_routes_need_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let closed = start(&dir.path().join("closed.db"), 2, "").await;
    let client = reqwest::Client::new();
    let (status, problem) = send(client.post(closed.url("/v1/hosts/z-h0/drain")).bearer_auth(TOKEN)).await;
    assert_eq!(status, 403, "no token configured: admin routes are closed");
    assert_eq!(problem["type"], "urn:problem:admin-disabled");

    let open = start(&dir.path().join("open.db"), 2, &with_token()).await;
    assert_eq!(send(client.post(open.url("/v1/hosts/z-h0/drain"))).await.0, 401);
    assert_eq!(send(client.post(open.url("/v1/hosts/z-h0/drain")).bearer_auth("wrong")).await.0, 401);
    let (status, change) = send(client.post(open.url("/v1/hosts/z-h0/drain")).bearer_auth(TOKEN)).await;
    assert_eq!(status, 200);
    assert_eq!(change, json!({"host_id": "z-h0", "previous": "available", "state": "unavailable"}));
    assert_eq!(send(client.post(open.url("/v1/hosts/nowhere/fail")).bearer_auth(TOKEN)).await.0, 404);
    let (_, host) = send(client.get(open.url("/v1/hosts/z-h0"))).await;
    assert_eq!(host["state"], "unavailable");
}

#[tokio::test]
async fn drained_and_failed_hosts_take_no_new_vm() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(&dir.path().join("a.db"), 4, &with_token()).await;
    let client = reqwest::Client::new();
    let (status, _) =
        send(client.post(server.url("/v1/allocations")).json(&json!({"vm": vm("first", "t", 1.0, 1.0)}))).await;
    assert_eq!(status, 201);
    let (_, info) = send(client.get(server.url("/v1/allocations/first"))).await;
    let busy = info["host_id"].as_str().unwrap().to_owned();
    // Drain the host that "prefer non-empty" would fill next, and fail another one.
    assert_eq!(send(client.post(server.url(&format!("/v1/hosts/{busy}/drain"))).bearer_auth(TOKEN)).await.0, 200);
    let failed = if busy == "z-h3" { "z-h2" } else { "z-h3" };
    assert_eq!(send(client.post(server.url(&format!("/v1/hosts/{failed}/fail"))).bearer_auth(TOKEN)).await.0, 200);
    for i in 0..12 {
        let (status, body) =
            send(client.post(server.url("/v1/allocations")).json(&json!({"vm": vm(&format!("v{i}"), "t", 2.0, 4.0)})))
                .await;
        assert_eq!(status, 201, "{body}");
        let host = &placements(&body)[0].1;
        assert!(host != &busy && host != failed, "placed on {host}");
    }
    let (_, page) = send(client.get(server.url("/v1/hosts?state=unavailable"))).await;
    assert_eq!(page["total"], 1);
    assert_eq!(page["hosts"][0]["vms"], json!(["first"]), "a drained host keeps its VMs");
    let (_, page) = send(client.get(server.url("/v1/hosts?empty=true"))).await;
    assert_eq!(page["total"], 1);
    assert_eq!(page["hosts"][0]["host_id"], failed);

    // Two hosts of 16 cores are open and 24 of their 32 cores are taken: 12 cores fit nowhere.
    let (status, body) =
        send(client.post(server.url("/v1/allocations")).json(&json!({"vm": vm("too-big", "t", 12.0, 4.0)}))).await;
    assert_eq!(status, 200, "a rejection is a normal answer");
    assert_eq!(body["status"], "rejected");
    assert_eq!(body["rejection"]["code"], "no_feasible_host");
    assert_eq!(send(client.get(server.url("/v1/allocations/too-big"))).await.0, 404);
    let (_, stats) = send(client.get(server.url("/v1/stats"))).await;
    assert_eq!(stats["rejections"]["no_feasible_host"], 1);
    assert_eq!(stats["available_hosts"], 2);

    assert_eq!(send(client.post(server.url(&format!("/v1/hosts/{busy}/restore"))).bearer_auth(TOKEN)).await.0, 200);
    // The same request again within 30 s is a client's retry: it gets the first answer, replayed.
    let (status, body) =
        send(client.post(server.url("/v1/allocations")).json(&json!({"vm": vm("too-big", "t", 12.0, 4.0)}))).await;
    assert_eq!((status, &body["status"], &body["replayed"]), (200, &json!("rejected"), &json!(true)), "{body}");
    // A new request fits on the restored host.
    let (status, body) =
        send(client.post(server.url("/v1/allocations")).json(&json!({"vm": vm("too-big-2", "t", 12.0, 4.0)}))).await;
    assert_eq!(status, 201);
    assert_eq!(placements(&body)[0].1, busy);
}

#[tokio::test]
async fn explain_changes_nothing_and_predicts_the_pick() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(&dir.path().join("a.db"), 8, "").await;
    let client = reqwest::Client::new();
    for i in 0..5 {
        let (status, _) =
            send(client.post(server.url("/v1/allocations")).json(&json!({"vm": vm(&format!("v{i}"), "t", 3.0, 8.0)})))
                .await;
        assert_eq!(status, 201);
    }
    let before = hosts(&client, &server).await;
    let (_, mut stats_before) = send(client.get(server.url("/v1/stats"))).await;
    let probe = vm("probe", "t", 5.0, 8.0);
    let mut picks = Vec::new();
    for _ in 0..3 {
        let (status, explanation) =
            send(client.post(server.url("/v1/explain")).json(&json!({"vm": probe, "why_not": "z-h7", "top": 3}))).await;
        assert_eq!(status, 200, "{explanation}");
        assert!(explanation["top"].as_array().unwrap().len() <= 3);
        assert_eq!(explanation["why_not"]["host_id"], "z-h7");
        assert!(explanation["why_not"]["explanation"].is_string());
        picks.push(explanation["would_pick"].as_str().unwrap().to_owned());
    }
    assert!(picks.windows(2).all(|w| w[0] == w[1]), "{picks:?}");
    assert_eq!(hosts(&client, &server).await, before, "explain changed the hosts");
    let (_, mut stats_after) = send(client.get(server.url("/v1/stats"))).await;
    // The index may have cached a new request class; nothing else may move.
    stats_before["classes_cached"] = Value::Null;
    stats_after["classes_cached"] = Value::Null;
    assert_eq!(stats_after, stats_before);
    assert_eq!(send(client.get(server.url("/v1/allocations/probe"))).await.0, 404);
    // Explain drew ties with a copy of the generator: the real placement lands where it said.
    let (status, body) = send(client.post(server.url("/v1/allocations")).json(&json!({"vm": probe}))).await;
    assert_eq!(status, 201);
    assert_eq!(placements(&body)[0].1, picks[0]);
}

#[tokio::test]
async fn serves_health_metrics_and_openapi() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(&dir.path().join("a.db"), 2, "").await;
    let client = reqwest::Client::new();
    assert_eq!(
        send(client.post(server.url("/v1/allocations")).json(&json!({"vm": vm("v", "t", 1.0, 1.0)}))).await.0,
        201
    );
    assert_eq!(client.get(server.url("/healthz")).send().await.unwrap().status(), 200);
    let (status, ready) = send(client.get(server.url("/readyz"))).await;
    assert_eq!(status, 200);
    assert_eq!(ready["vms"], 1);
    let metrics = client.get(server.url("/metrics")).send().await.unwrap().text().await.unwrap();
    for name in [
        "allocator_decisions_total{outcome=\"placed\"}",
        "allocator_commit_duration_seconds_bucket",
        "allocator_decision_duration_seconds_bucket",
        "allocator_batch_commands",
    ] {
        assert!(metrics.contains(name), "{name} missing from /metrics");
    }
    let (status, doc) = send(client.get(server.url("/openapi.json"))).await;
    assert_eq!(status, 200);
    for path in
        ["/v1/allocations", "/v1/allocations/{vm_id}", "/v1/hosts", "/v1/hosts/{host_id}", "/v1/stats", "/v1/explain"]
    {
        assert!(doc["paths"][path].is_object(), "{path} missing from the OpenAPI document");
    }
    let (status, problem) = send(client.get(server.url("/v1/nothing-here"))).await;
    assert_eq!((status, problem["type"].clone()), (404, json!("urn:problem:not-found")));
    let (status, problem) = send(client.put(server.url("/v1/stats"))).await;
    assert_eq!((status, problem["type"].clone()), (405, json!("urn:problem:method-not-allowed")));
}

/// LAVA with in-process repredictions from the checked-in bundle, and a LARS drain driven over
/// HTTP: host state in `/v1/hosts` and `/v1/stats`, migrations confirmed one by one, the drained
/// host ending empty and unavailable.
#[tokio::test]
async fn lava_state_and_a_lars_drain_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let models = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models");
    let extra = format!(
        "{}\nmodels_dir = \"{}\"\nmodel_poll_s = 0.2\n[allocator.policy]\nkind = \"lava\"\n",
        with_token(),
        models.display()
    );
    let server = start(&dir.path().join("a.db"), 4, &extra).await;
    let client = reqwest::Client::new();
    for i in 0..4 {
        let (status, body) =
            send(client.post(server.url("/v1/allocations")).json(&json!({"vm": vm(&format!("v{i}"), "t", 2.0, 4.0)})))
                .await;
        assert_eq!(status, 201, "{body}");
    }
    let (_, info) = send(client.get(server.url("/v1/allocations/v0"))).await;
    let source = info["host_id"].as_str().unwrap().to_owned();
    let (_, detail) = send(client.get(server.url(&format!("/v1/hosts/{source}")))).await;
    assert_eq!(detail["policy_state"]["policy"], "lava", "{detail}");
    assert_eq!(detail["policy_state"]["state"]["state"], "open", "{detail}");
    assert_eq!(detail["policy_state"]["state"]["class"], 0);
    // The allocator follows the models directory: the bundle's model repredicts exit times.
    let mut stats = Value::Null;
    for _ in 0..50 {
        stats = send(client.get(server.url("/v1/stats"))).await.1;
        if stats["reprediction_model"].is_string() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(stats["reprediction_model"].is_string(), "{stats}");
    assert_eq!(stats["host_states"]["policy"], "lava", "{stats}");
    assert_eq!(stats["host_states"]["by_state"]["open"], 1, "{stats}");
    assert_eq!(stats["policy"], "lava");

    let request = json!({"hosts": {"listed": [source]}, "order": "longest-remaining-first", "max_in_flight": 1});
    assert_eq!(send(client.post(server.url("/v1/drains")).json(&request)).await.0, 401);
    let bad = json!({"hosts": {"listed": [source]}, "max_in_flight": 0});
    let (status, body) = send(client.post(server.url("/v1/drains")).bearer_auth(TOKEN).json(&bad)).await;
    assert_eq!(status, 422);
    assert_eq!(body["errors"][0]["field"], "max_in_flight", "{body}");
    let (status, report) = send(client.post(server.url("/v1/drains")).bearer_auth(TOKEN).json(&request)).await;
    assert_eq!(status, 201, "{report}");
    assert_eq!(report["in_flight"].as_array().unwrap().len(), 1);
    assert_eq!(report["queued"].as_array().unwrap().len(), 3);
    let (status, body) = send(client.post(server.url("/v1/drains")).bearer_auth(TOKEN).json(&request)).await;
    assert_eq!((status, body["type"].as_str()), (409, Some("urn:problem:drain-busy")));

    let mut done = report;
    for _ in 0..4 {
        let vm_id = done["in_flight"][0]["vm_id"].as_str().unwrap().to_owned();
        let (status, moved) =
            send(client.post(server.url(&format!("/v1/migrations/{vm_id}/complete"))).bearer_auth(TOKEN)).await;
        assert_eq!(status, 200, "{moved}");
        assert_ne!(moved["target"], source.as_str());
        let (_, info) = send(client.get(server.url(&format!("/v1/allocations/{vm_id}")))).await;
        assert_eq!(info["host_id"], moved["target"]);
        done = send(client.get(server.url("/v1/drains"))).await.1;
    }
    assert_eq!(done["done"], true, "{done}");
    assert_eq!(done["performed"], 4);
    let (_, detail) = send(client.get(server.url(&format!("/v1/hosts/{source}")))).await;
    assert_eq!((detail["vm_count"].as_u64(), detail["state"].as_str()), (Some(0), Some("unavailable")));
    let (status, body) = send(client.post(server.url("/v1/migrations/v0/complete")).bearer_auth(TOKEN)).await;
    assert_eq!((status, body["type"].as_str()), (404, Some("urn:problem:not-migrating")));
}

/// A policy list the request path cannot serve is refused at start-up: the binary exits with a
/// message naming the entry, before it listens.
#[test]
fn a_bad_policy_list_is_refused_at_start_up_naming_the_entry() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("[{rule = \"prefer-non-empty\"}, {rule = \"best-fitt\"}]", "policy.preferences[1]: `best-fitt`: unknown rule"),
        ("[{rule = \"best-fit\", bukets = 3}]", "policy.preferences[0]: `best-fit`: unknown field `bukets`"),
        ("[{rule = \"best-fit\"}, {rule = \"lava\"}, {rule = \"temporal-cost\"}]", "`lava` must come first"),
    ];
    for (i, (preferences, expected)) in cases.iter().enumerate() {
        let store = dir.path().join(format!("bad-{i}.db"));
        let extra = format!("[allocator.policy]\nkind = \"mine\"\npreferences = {preferences}\n");
        let config = dir.path().join(format!("bad-{i}.toml"));
        std::fs::write(&config, support::config_text(1, &store, 2, &extra)).unwrap();
        let output =
            std::process::Command::new(env!("CARGO_BIN_EXE_allocator")).arg("--config").arg(&config).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{preferences}: started anyway");
        assert!(stderr.contains(expected), "{preferences}: {stderr}");
    }
}
