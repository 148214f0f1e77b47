//! The service credential, with the real binaries: the allocator's and the inference server's data
//! routes refuse a caller without the service token (or with a wrong one) with 401 and change
//! nothing; the control service presents the token and the stack works; a control service with a
//! wrong token gets a 502 that names the cause, and places nothing.

use serde_json::{json, Value};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use test_support::stack::{self, SERVICE_TOKEN};

const ADMIN_TOKEN: &str = "credentials-admin-token";

/// Status, `WWW-Authenticate` and JSON body of a request.
async fn send(request: reqwest::RequestBuilder) -> (u16, Option<String>, Value) {
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let challenge = response.headers().get("www-authenticate").and_then(|value| value.to_str().ok()).map(str::to_owned);
    let bytes = response.bytes().await.unwrap();
    (status, challenge, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// Asserts the answer is the 401 problem with its challenge.
fn assert_refused((status, challenge, body): &(u16, Option<String>, Value), what: &str) {
    assert_eq!(*status, 401, "{what}: {body}");
    assert_eq!(challenge.as_deref(), Some("Bearer"), "{what}");
    assert_eq!(body["type"], "urn:problem:unauthorized", "{what}: {body}");
}

async fn json_with_token(client: &reqwest::Client, url: String) -> Value {
    let (status, _, body) = send(client.get(url).bearer_auth(SERVICE_TOKEN)).await;
    assert_eq!(status, 200, "{body}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_routes_refuse_callers_without_the_service_token_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let models = stack::default_models(dir.path());
    let admin = format!("admin_token = \"{ADMIN_TOKEN}\"");
    let inference = stack::start_inference_with(dir.path(), &models, &admin).await;
    let allocator = stack::start_allocator_with(dir.path(), 4, &admin).await;
    let control = stack::start_control(dir.path(), &[&inference.base], &allocator.base, 1_000, "").await;
    let client = reqwest::Client::new();

    // Through the control service, which presents the token: placed.
    let (status, _, placed) =
        send(client.post(control.url("/allocate")).json(&stack::vm("kept", "t", "D2", 2.0))).await;
    assert_eq!(status, 201, "{placed}");
    let stats_before = json_with_token(&client, allocator.url("/v1/stats")).await;
    assert_eq!(stats_before["vms"], 1, "{stats_before}");
    let history_before = json_with_token(&client, inference.url("/v1/history")).await;

    // The allocator, called directly: every data route, without a token and with wrong ones.
    let wrong_credentials: [Option<&str>; 4] =
        [None, Some("Bearer wrong"), Some("Basic dGVzdA=="), Some(SERVICE_TOKEN)];
    for credential in wrong_credentials {
        let with = |request: reqwest::RequestBuilder| match credential {
            Some(value) => request.header("authorization", value),
            None => request,
        };
        let what = format!("credential {credential:?}");
        let calls = [
            with(client.post(allocator.url("/v1/allocations")).json(&stack::vm("sneaked", "t", "D2", 2.0))),
            with(client.delete(allocator.url("/v1/allocations/kept"))),
            with(client.get(allocator.url("/v1/allocations/kept"))),
            with(client.get(allocator.url("/v1/hosts"))),
            with(client.get(allocator.url("/v1/stats"))),
            with(client.post(allocator.url("/v1/explain")).json(&json!({"vm": stack::vm("x", "t", "D2", 2.0)["vm"]}))),
            with(client.get(allocator.url("/v1/no-such-route"))),
            with(client.post(inference.url("/v1/predict")).json(&json!({
                "instances": [{"tenant_id": "t", "vm_type": "D2", "cores": 2.0, "memory_gib": 8.0}],
                "history": [{"event": "started", "vm_id": "sneaked", "tenant_id": "t", "vm_type": "D2", "at_s": 9.0e8}]
            }))),
            with(client.post(inference.url("/v1/history")).json(&json!({
                "events": [{"event": "started", "vm_id": "sneaked-2", "tenant_id": "t", "vm_type": "D2", "at_s": 9.0e8}]
            }))),
            with(client.get(inference.url("/v1/models"))),
        ];
        // The token itself without the `Bearer` scheme is not a credential either.
        for call in calls {
            assert_refused(&send(call).await, &what);
        }
    }
    // Nothing changed: the VM stays placed, nothing else was, the history has no new event.
    assert_eq!(json_with_token(&client, allocator.url("/v1/stats")).await, stats_before);
    let kept = json_with_token(&client, allocator.url("/v1/allocations/kept")).await;
    assert_eq!(kept["vm_id"], "kept", "{kept}");
    let (status, _, _) = send(client.get(allocator.url("/v1/allocations/sneaked")).bearer_auth(SERVICE_TOKEN)).await;
    assert_eq!(status, 404, "the refused allocation was not placed");
    assert_eq!(json_with_token(&client, inference.url("/v1/history")).await, history_before);

    // The probes, the metrics and the documents stay open.
    for url in [
        allocator.url("/healthz"),
        allocator.url("/readyz"),
        allocator.url("/metrics"),
        allocator.url("/openapi.json"),
        inference.url("/healthz"),
        inference.url("/readyz"),
        inference.url("/metrics"),
        inference.url("/openapi.json"),
    ] {
        assert_eq!(client.get(&url).send().await.unwrap().status(), 200, "{url}");
    }
    // Each document says which routes need it.
    let document: Value = client.get(allocator.url("/openapi.json")).send().await.unwrap().json().await.unwrap();
    assert_eq!(document["paths"]["/v1/allocations"]["post"]["security"], json!([{"service_token": []}]));
    assert!(document["paths"]["/readyz"]["get"]["security"].is_null());
    assert_eq!(document["components"]["securitySchemes"]["service_token"]["scheme"], "bearer");
    let document: Value = client.get(inference.url("/openapi.json")).send().await.unwrap().json().await.unwrap();
    assert_eq!(document["paths"]["/v1/predict"]["post"]["security"], json!([{"service_token": []}]));
    assert!(document["paths"]["/v1/predict"]["post"]["responses"]["401"].is_object());

    // With the token, directly: works. The admin token passes the data routes too.
    let (status, _, body) = send(
        client
            .post(allocator.url("/v1/allocations"))
            .bearer_auth(SERVICE_TOKEN)
            .json(&stack::vm("direct", "t", "D2", 2.0)),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, _, body) = send(client.delete(allocator.url("/v1/allocations/direct")).bearer_auth(ADMIN_TOKEN)).await;
    assert_eq!(status, 204, "{body}");
    let (status, _, body) = send(client.post(inference.url("/v1/predict")).bearer_auth(SERVICE_TOKEN).json(&json!({
        "instances": [{"tenant_id": "t", "vm_type": "D2", "cores": 2.0, "memory_gib": 8.0}]
    })))
    .await;
    assert_eq!(status, 200, "{body}");
    // The whole stack, released through the control service.
    let (status, _, body) = send(client.delete(control.url("/allocate/kept"))).await;
    assert_eq!(status, 204, "{body}");
    assert_eq!(json_with_token(&client, allocator.url("/v1/stats")).await["vms"], 0);
}

/// A control service whose tokens are wrong.
struct Misconfigured(Child);

impl Drop for Misconfigured {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_service_with_a_wrong_token_places_nothing_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let models = stack::default_models(dir.path());
    let inference = stack::start_inference(dir.path(), &models).await;
    let allocator = stack::start_allocator(dir.path(), 4).await;
    let port = test_support::listening::free_port();
    let config = dir.path().join("control.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\n[zones.zone-1]\nallocator = \"{}\"\n[inference]\nservers = [\"{}\"]\n\
             timeout_ms = 1000\n[allocator]\nhealth_interval_ms = 100\n",
            allocator.base, inference.base
        ),
    )
    .unwrap();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_control-service"));
    test_support::process::with_service_token(&mut command, SERVICE_TOKEN)
        .env("CONTROL_ALLOCATOR_SERVICE_TOKEN", "not-the-token")
        .env("CONTROL_INFERENCE_SERVICE_TOKEN", "not-the-token")
        .env("RUST_LOG", "error")
        .arg("--config")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let _control = Misconfigured(command.spawn().unwrap());
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    // Ready: the probes need no credential.
    while !client.get(format!("{base}/readyz")).send().await.is_ok_and(|r| r.status().is_success()) {
        assert!(Instant::now() < deadline, "the control service did not become ready");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let (status, _, body) = send(client.post(format!("{base}/allocate")).json(&stack::vm("v", "t", "D2", 2.0))).await;
    assert_eq!((status, &body["type"]), (502, &json!("urn:problem:allocator-credential-refused")), "{body}");
    assert_eq!(json_with_token(&client, allocator.url("/v1/stats")).await["vms"], 0);
}
