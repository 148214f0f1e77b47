//! End-to-end regressions of the public API's hardening (issue 15), on the real binaries: ids that
//! HTTP would rewrite are refused; API keys per tenant (no key is 401, another tenant's VM is 404,
//! another tenant's request 403); the dashboard's zone views are the operator's; per-tenant rate limits; new tenants cannot switch predictions off
//! for everyone; request times come from the server's clock; one slow readiness probe does not take
//! a healthy inference server out of rotation.

use control_service::auth::{hash_key, to_hex};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use test_support::binaries::workspace_binary;
use test_support::process::Process;
use test_support::stack::{self, default_models, start_allocator, start_control, start_inference, vm};

const ALICE: &str = "alice-secret-key";
const BOB: &str = "bob-secret-key";
const OPERATOR: &str = "operator-secret-key";

/// `[auth]` with keys for tenants alice and bob and an operator key, plus `extra` sections.
fn keys_config(extra: &str) -> String {
    format!(
        "[auth]\nmode = \"keys\"\n\
         [[auth.keys]]\ntenant = \"alice\"\nsha256 = \"{}\"\n\
         [[auth.keys]]\ntenant = \"bob\"\nsha256 = \"{}\"\n\
         [[auth.keys]]\nadmin = true\nname = \"ops\"\nsha256 = \"{}\"\n{extra}",
        to_hex(&hash_key(ALICE)),
        to_hex(&hash_key(BOB)),
        to_hex(&hash_key(OPERATOR)),
    )
}

/// A single-VM body without a request time (the server's clock applies).
fn tenant_vm(vm_id: &str, tenant: &str) -> Value {
    let mut body = vm(vm_id, tenant, "D2", 2.0);
    if let Some(fields) = body["vm"].as_object_mut() {
        fields.remove("requested_at_s");
    }
    body
}

async fn send(request: reqwest::RequestBuilder) -> (u16, Value) {
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn field(problem: &Value) -> &str {
    problem["errors"][0]["field"].as_str().unwrap_or("?")
}

fn source(decision: &Value) -> &str {
    decision["predictions"][0]["prediction"]["source"].as_str().unwrap_or("?")
}

/// VMs placed, asked of the allocator itself (with the service credential, not a tenant's key).
async fn placed_vms(client: &reqwest::Client, allocator: &Process) -> u64 {
    let stats: Value = stack::service_json(client, allocator.url("/v1/stats")).await;
    stats["vms"].as_u64().unwrap()
}

fn unix_now_s() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64()
}

/// Finding 2: `.` and `..` were placed but could never be looked up or released (HTTP clients
/// normalise dot segments). Ids outside the documented charset are refused, and nothing is placed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_that_urls_would_rewrite_are_refused_and_nothing_is_placed() {
    let dir = tempfile::tempdir().unwrap();
    let inference = start_inference(dir.path(), &default_models(dir.path())).await;
    let allocator = start_allocator(dir.path(), 4).await;
    let control = start_control(dir.path(), &[&inference.base], &allocator.base, 2_000, "").await;
    let client = reqwest::Client::new();

    for id in [".", "..", "a/b", "%2e", "a b", "-x", "a?b"] {
        let (status, problem) = send(client.post(control.url("/allocate")).json(&vm(id, "t1", "D2", 2.0))).await;
        assert_eq!((status, field(&problem)), (422, "vm.vm_id"), "vm_id {id:?}: {problem}");
        assert_eq!(problem["type"], "urn:problem:invalid-request");
    }
    let (status, problem) = send(client.post(control.url("/allocate")).json(&vm("ok-id", "..", "D2", 2.0))).await;
    assert_eq!((status, field(&problem)), (422, "vm.tenant_id"), "{problem}");
    let gang = json!({"gang": {"tenant_id": "t1", "vms": [vm("g.0", "t1", "D2", 2.0)["vm"], vm("..", "t1", "D2", 2.0)["vm"]]}});
    let (status, problem) = send(client.post(control.url("/allocate")).json(&gang)).await;
    assert_eq!((status, field(&problem)), (422, "gang.vms[1].vm_id"), "{problem}");
    assert_eq!(placed_vms(&client, &allocator).await, 0, "nothing was placed");

    // Ids that arrive in the path are held to the same charset.
    for path in ["/allocate/a%2Fb", "/allocate/%252e", "/allocate/a%20b"] {
        let (status, problem) = send(client.get(control.url(path))).await;
        assert_eq!((status, field(&problem)), (422, "vm_id"), "GET {path}: {problem}");
        let (status, _) = send(client.delete(control.url(path))).await;
        assert_eq!(status, 422, "DELETE {path}");
    }
    // A valid id with dots and colons round-trips: placed, found, released.
    let (status, decision) = send(client.post(control.url("/allocate")).json(&vm("r1:vm.7", "t1", "D2", 2.0))).await;
    assert_eq!(status, 201, "{decision}");
    assert_eq!(client.get(control.url("/allocate/r1:vm.7")).send().await.unwrap().status(), 200);
    assert_eq!(client.delete(control.url("/allocate/r1:vm.7")).send().await.unwrap().status(), 204);
    assert_eq!(placed_vms(&client, &allocator).await, 0);
}

/// Finding 3: anyone could look up or release anyone's VM. A tenant key acts only as its tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_sees_and_releases_only_its_own_vms() {
    let dir = tempfile::tempdir().unwrap();
    let inference = start_inference(dir.path(), &default_models(dir.path())).await;
    let allocator = start_allocator(dir.path(), 4).await;
    let control = start_control(dir.path(), &[&inference.base], &allocator.base, 2_000, &keys_config("")).await;
    let client = reqwest::Client::new();
    let allocate = control.url("/allocate");

    // No key, or a wrong one: 401 with the scheme to use, and nothing placed.
    let response = client.post(&allocate).json(&tenant_vm("a-1", "alice")).send().await.unwrap();
    assert_eq!(response.status(), 401);
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
    let (status, _) = send(client.post(&allocate).bearer_auth("guess").json(&tenant_vm("a-1", "alice"))).await;
    assert_eq!(status, 401);
    assert_eq!(client.get(control.url("/allocate/a-1")).send().await.unwrap().status(), 401);
    assert_eq!(client.delete(control.url("/allocate/a-1")).send().await.unwrap().status(), 401);
    assert_eq!(placed_vms(&client, &allocator).await, 0);

    // Alice places her VM; she cannot place one for bob.
    let (status, decision) = send(client.post(&allocate).bearer_auth(ALICE).json(&tenant_vm("a-1", "alice"))).await;
    assert_eq!(status, 201, "{decision}");
    let (status, problem) = send(client.post(&allocate).bearer_auth(ALICE).json(&tenant_vm("b-1", "bob"))).await;
    assert_eq!((status, field(&problem)), (403, "vm.tenant_id"), "{problem}");

    // Bob cannot see or release it: 404, the very answer of an id that does not exist.
    let (status, hidden) = send(client.get(control.url("/allocate/a-1")).bearer_auth(BOB)).await;
    let (_, missing) = send(client.get(control.url("/allocate/no-such-vm")).bearer_auth(BOB)).await;
    assert_eq!(status, 404);
    assert_eq!(hidden["type"], missing["type"]);
    let (status, _) = send(client.delete(control.url("/allocate/a-1?zone=zone-1")).bearer_auth(BOB)).await;
    assert_eq!(status, 404);
    assert_eq!(placed_vms(&client, &allocator).await, 1, "bob's release changed nothing");
    // Fleet statistics are the operator's.
    assert_eq!(client.get(control.url("/v1/stats")).bearer_auth(BOB).send().await.unwrap().status(), 403);
    let (status, stats) = send(client.get(control.url("/v1/stats")).bearer_auth(OPERATOR)).await;
    assert_eq!((status, &stats["placed"]), (200, &json!(1)));

    // Alice sees hers; the operator sees any; alice releases hers.
    let (status, info) = send(client.get(control.url("/allocate/a-1")).bearer_auth(ALICE)).await;
    assert_eq!((status, &info["tenant_id"]), (200, &json!("alice")));
    assert_eq!(client.get(control.url("/allocate/a-1")).bearer_auth(OPERATOR).send().await.unwrap().status(), 200);
    assert_eq!(client.delete(control.url("/allocate/a-1")).bearer_auth(ALICE).send().await.unwrap().status(), 204);
    assert_eq!(placed_vms(&client, &allocator).await, 0);
}

/// The dashboard's zone views show every tenant's VMs: they are the operator's, like `/v1/stats`.
/// They pass the zone allocator's answers on (its problems too), refuse what the allocator does not
/// know, and change nothing. The page itself holds no data and is served to anyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_zone_views_are_the_operators_and_pass_the_allocator_on() {
    let dir = tempfile::tempdir().unwrap();
    let inference = start_inference(dir.path(), &default_models(dir.path())).await;
    let allocator = start_allocator(dir.path(), 4).await;
    let timeline = keys_config("[dashboard]\nhistory_interval_ms = 100\nhistory_samples = 50\n");
    let control = start_control(dir.path(), &[&inference.base], &allocator.base, 2_000, &timeline).await;
    let client = reqwest::Client::new();
    let (status, decision) =
        send(client.post(control.url("/allocate")).bearer_auth(ALICE).json(&tenant_vm("a-1", "alice"))).await;
    assert_eq!(status, 201, "{decision}");
    let host = decision["placements"][0]["host_id"].as_str().unwrap().to_owned();
    let explain = json!({"vm": {"vm_id": "x", "tenant_id": "dashboard", "vm_type": "D2",
        "demand": {"cores": 2, "memory_gib": 8}}, "why_not": host, "top": 2});

    let views = ["/v1/stats/history", "/v1/zones", "/v1/zones/zone-1/hosts", &format!("/v1/zones/zone-1/hosts/{host}")];
    for view in views {
        assert_eq!(client.get(control.url(view)).send().await.unwrap().status(), 401, "{view}");
        assert_eq!(client.get(control.url(view)).bearer_auth(ALICE).send().await.unwrap().status(), 403, "{view}");
    }
    let explain_url = control.url("/v1/zones/zone-1/explain");
    assert_eq!(client.post(&explain_url).json(&explain).send().await.unwrap().status(), 401);
    assert_eq!(client.post(&explain_url).bearer_auth(BOB).json(&explain).send().await.unwrap().status(), 403);

    // The operator sees what the allocator reports.
    let (status, zones) = send(client.get(control.url("/v1/zones")).bearer_auth(OPERATOR)).await;
    assert_eq!(
        (status, &zones["zones"][0]["zone"], &zones["zones"][0]["agents"][0]["ready"]),
        (200, &json!("zone-1"), &json!(true))
    );
    let (status, page) =
        send(client.get(control.url("/v1/zones/zone-1/hosts?limit=10000")).bearer_auth(OPERATOR)).await;
    let own: Value = stack::service_json(&client, allocator.url("/v1/hosts?limit=10000")).await;
    assert_eq!((status, &page), (200, &own));
    assert_eq!(page["total"], 4);
    let (status, detail) =
        send(client.get(control.url(&format!("/v1/zones/zone-1/hosts/{host}"))).bearer_auth(OPERATOR)).await;
    assert_eq!(
        (status, &detail["vms"][0]["vm_id"], &detail["vms"][0]["tenant_id"]),
        (200, &json!("a-1"), &json!("alice"))
    );
    let (status, filtered) =
        send(client.get(control.url("/v1/zones/zone-1/hosts?empty=false")).bearer_auth(OPERATOR)).await;
    assert_eq!((status, &filtered["total"]), (200, &json!(1)));

    // The timeline behind the charts: samples every 100 ms, the placement and the zone in them.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let history = loop {
        let (status, history) = send(client.get(control.url("/v1/stats/history")).bearer_auth(OPERATOR)).await;
        assert_eq!(status, 200, "{history}");
        let samples = history["samples"].as_array().unwrap();
        if samples.last().is_some_and(|s| s["placed"] == 1) || std::time::Instant::now() > deadline {
            break history;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let last = history["samples"].as_array().unwrap().last().cloned().unwrap_or_default();
    assert_eq!(history["interval_ms"], 100, "{history}");
    assert_eq!(
        (&last["placed"], &last["zones"]["zone-1"]["hosts"], &last["zones"]["zone-1"]["vms"]),
        (&json!(1), &json!(4), &json!(1)),
        "{history}"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (_, history) = send(client.get(control.url("/v1/stats/history")).bearer_auth(OPERATOR)).await;
    let times: Vec<f64> = history["samples"].as_array().unwrap().iter().map(|s| s["at_s"].as_f64().unwrap()).collect();
    assert!(times.len() >= 3 && times.windows(2).all(|w| w[0] < w[1]), "oldest first: {times:?}");

    // Bad input: named, and the allocator's own problems passed on.
    let (status, problem) = send(client.get(control.url("/v1/zones/zone-9/hosts")).bearer_auth(OPERATOR)).await;
    assert_eq!(status, 404, "{problem}");
    assert!(problem["detail"].as_str().unwrap().contains("zone-1"), "{problem}");
    let (status, problem) =
        send(client.get(control.url("/v1/zones/zone-1/hosts?limit=10000&admin=1")).bearer_auth(OPERATOR)).await;
    assert_eq!(status, 400, "{problem}");
    assert!(problem["detail"].as_str().unwrap().contains("`admin`"), "{problem}");
    let (status, problem) = send(client.get(control.url("/v1/zones/zone-1/hosts?limit=0")).bearer_auth(OPERATOR)).await;
    assert_eq!((status, field(&problem)), (422, "limit"), "{problem}");
    let (status, problem) =
        send(client.get(control.url("/v1/zones/zone-1/hosts?offset=9223372036854775808")).bearer_auth(OPERATOR)).await;
    assert_eq!((status, field(&problem)), (422, "offset"), "{problem}");
    let (status, problem) =
        send(client.get(control.url("/v1/zones/zone-1/hosts/no-such-host")).bearer_auth(OPERATOR)).await;
    assert_eq!(status, 404, "{problem}");

    // Why not this host: a dry run that changes nothing.
    let (status, answer) = send(client.post(&explain_url).bearer_auth(OPERATOR).json(&explain)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["why_not"]["host_id"], json!(host), "{answer}");
    assert!(answer["why_not"]["explanation"].is_string(), "{answer}");
    let mut unknown = explain.clone();
    unknown["why_not"] = json!("no-such-host");
    let (status, problem) = send(client.post(&explain_url).bearer_auth(OPERATOR).json(&unknown)).await;
    assert_eq!((status, field(&problem)), (422, "why_not"), "{problem}");
    let (status, problem) = send(
        client.post(&explain_url).bearer_auth(OPERATOR).header("content-type", "application/json").body("{\"vm\": 1"),
    )
    .await;
    assert_eq!(status, 400, "{problem}");
    assert_eq!(placed_vms(&client, &allocator).await, 1, "the views changed nothing");

    // The page and its assets need no key, load nothing from elsewhere and are not cached stale.
    for (path, kind) in
        [("/dashboard", "text/html"), ("/dashboard/app.js", "text/javascript"), ("/dashboard/app.css", "text/css")]
    {
        let response = client.get(control.url(path)).send().await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let headers = response.headers();
        assert!(headers["content-type"].to_str().unwrap().starts_with(kind), "{path}");
        assert!(headers["content-security-policy"].to_str().unwrap().starts_with("default-src 'self'"), "{path}");
        assert_eq!(headers["cache-control"], "no-cache", "{path}");
        let body = response.text().await.unwrap();
        for external in ["=\"http", "='http", "url(http", "fetch('http", "import "] {
            assert!(!body.contains(external), "{path} loads something from another origin: `{external}`");
        }
    }
}

/// Per-tenant token buckets: a tenant over its rate gets 429 with Retry-After; others are not
/// affected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_rate_is_told_when_to_retry_and_others_are_not_slowed() {
    let dir = tempfile::tempdir().unwrap();
    let allocator = start_allocator(dir.path(), 4).await;
    let limits = keys_config("[rate_limit]\nper_second = 0.5\nburst = 3\n");
    let control = start_control(dir.path(), &[], &allocator.base, 2_000, &limits).await;
    let client = reqwest::Client::new();
    for i in 0..3 {
        let (status, _) = send(client.get(control.url("/allocate/nothing")).bearer_auth(ALICE)).await;
        assert_eq!(status, 404, "request {i} is within the burst");
    }
    let response =
        client.post(control.url("/allocate")).bearer_auth(ALICE).json(&tenant_vm("a-1", "alice")).send().await.unwrap();
    assert_eq!(response.status(), 429);
    let retry_after: u64 = response.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry_after), "retry after {retry_after} s at 0.5 requests/s");
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["type"], "urn:problem:rate-limited");
    assert_eq!(placed_vms(&client, &allocator).await, 0, "a limited request changes nothing");
    let (status, decision) =
        send(client.post(control.url("/allocate")).bearer_auth(BOB).json(&tenant_vm("b-1", "bob"))).await;
    assert_eq!(status, 201, "bob has a bucket of his own: {decision}");
    // The operator is not limited (trace replays send bursts).
    for _ in 0..5 {
        assert_eq!(client.get(control.url("/allocate/b-1")).bearer_auth(OPERATOR).send().await.unwrap().status(), 200);
    }
}

/// Finding 4: about 50 requests from brand-new tenants (which the model calls long-lived) tripped
/// the fleet-wide safeguard and switched predictions off for everyone for 10 minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_tenants_cannot_switch_predictions_off_for_an_established_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let inference = start_inference(dir.path(), &default_models(dir.path())).await;
    let allocator = start_allocator(dir.path(), 100).await;
    // Default safeguard (window 600 s, threshold 0.5, 50 predictions), but tenants established
    // after one second instead of an hour.
    let config = "[safeguard]\nestablished_after_s = 1\n";
    let control = start_control(dir.path(), &[&inference.base], &allocator.base, 2_000, config).await;
    let client = reqwest::Client::new();
    let allocate = control.url("/allocate");

    let (status, decision) = send(client.post(&allocate).json(&vm("steady-0", "steady", "D2", 2.0))).await;
    assert_eq!((status, source(&decision)), (201, "model"), "{decision}");
    tokio::time::sleep(Duration::from_millis(1_200)).await;

    let mut long = 0;
    for i in 0..60 {
        let (status, decision) =
            send(client.post(&allocate).json(&vm(&format!("new-{i}"), &format!("newcomer{i}"), "D2", 2.0))).await;
        assert_eq!(status, 201, "{decision}");
        long += usize::from(decision["predictions"][0]["prediction"]["class"] == "long");
    }
    // The premise of the finding: the model calls these unknown tenants long-lived (the newcomers'
    // window trips at the 50th, after which they are placed short), enough to trip a plain
    // fleet-wide share.
    assert!(long >= 45, "only {long} of 60 new tenants were predicted long-lived");

    let (status, decision) = send(client.post(&allocate).json(&vm("steady-1", "steady", "D2", 2.0))).await;
    assert_eq!(status, 201, "{decision}");
    assert!(matches!(source(&decision), "model" | "cache"), "the established tenant lost its predictions: {decision}");
    let stats: Value = client.get(control.url("/v1/stats")).send().await.unwrap().json().await.unwrap();
    assert_eq!(stats["safeguard"]["active"], false, "{stats}");
    // The newcomers' own window did trip: yet another new tenant is placed as short-lived.
    let (_, decision) = send(client.post(&allocate).json(&vm("late-0", "latecomer", "D2", 2.0))).await;
    assert_eq!(source(&decision), "safeguard", "{decision}");
    let metrics = client.get(control.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("control_safeguard_new_tenants_active 1"), "{metrics}");
}

/// Finding 5: a client steered its own prediction through `requested_at_s`. A tenant's request
/// time must be within the allowed skew of the server's clock; the operator may replay any time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_choose_its_request_time() {
    let dir = tempfile::tempdir().unwrap();
    let inference = start_inference(dir.path(), &default_models(dir.path())).await;
    let allocator = start_allocator(dir.path(), 4).await;
    let control = start_control(dir.path(), &[&inference.base], &allocator.base, 2_000, &keys_config("")).await;
    let client = reqwest::Client::new();
    let allocate = control.url("/allocate");

    for at in [json!(0.0), json!(-1e308), json!(unix_now_s() - 3_600.0), json!(unix_now_s() + 3_600.0)] {
        let mut body = tenant_vm("a-1", "alice");
        body["vm"]["requested_at_s"] = at.clone();
        let (status, problem) = send(client.post(&allocate).bearer_auth(ALICE).json(&body)).await;
        assert_eq!((status, field(&problem)), (422, "vm.requested_at_s"), "requested_at_s {at}: {problem}");
    }
    assert_eq!(placed_vms(&client, &allocator).await, 0);
    // A clock a little off is fine, and so is leaving the time out.
    let mut body = tenant_vm("a-1", "alice");
    body["vm"]["requested_at_s"] = json!(unix_now_s() - 30.0);
    let (status, decision) = send(client.post(&allocate).bearer_auth(ALICE).json(&body)).await;
    assert_eq!(status, 201, "{decision}");
    let (status, decision) = send(client.post(&allocate).bearer_auth(ALICE).json(&tenant_vm("a-2", "alice"))).await;
    assert_eq!(status, 201, "{decision}");
    // The operator replays a trace at its own times (vmreplay).
    let (status, decision) =
        send(client.post(&allocate).bearer_auth(OPERATOR).json(&vm("r-1", "alice", "D2", 2.0))).await;
    assert_eq!(status, 201, "{decision}");
}

/// An inference server that answers every instance short-lived, and whose `/readyz` is slow for a
/// while once `slow_until_ms` (milliseconds after `epoch`) is set.
async fn fake_inference_server(epoch: Instant, slow_until_ms: Arc<AtomicU64>) -> String {
    use axum::routing::{get, post};
    let app = axum::Router::new()
        .route(
            "/v1/predict",
            post(|axum::Json(request): axum::Json<Value>| async move {
                let count = request["instances"].as_array().map_or(0, Vec::len);
                let prediction = json!({"p_long": 0.1, "class": "short", "model_version": "fake-1", "source": "model"});
                axum::Json(json!({"predictions": vec![prediction; count]}))
            }),
        )
        .route(
            "/readyz",
            get(move || async move {
                let until = slow_until_ms.load(Ordering::SeqCst);
                let now = epoch.elapsed().as_millis() as u64;
                if now < until {
                    tokio::time::sleep(Duration::from_millis(until - now)).await;
                }
                "ready"
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{address}")
}

/// Finding 9: one `/readyz` answer slower than the probe interval marked a healthy inference server
/// down, and requests fell back. The probe has its own timeout, and one failure is not enough.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_slow_readiness_probe_does_not_take_a_server_out_of_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let epoch = Instant::now();
    let slow_until_ms = Arc::new(AtomicU64::new(0));
    let fake = fake_inference_server(epoch, slow_until_ms.clone()).await;
    let allocator = start_allocator(dir.path(), 20).await;
    // The support config probes every 100 ms; the defaults give a probe 500 ms.
    let control = start_control(dir.path(), &[&fake], &allocator.base, 2_000, "").await;
    let client = reqwest::Client::new();

    // From now on, /readyz takes 300 ms to answer: three probe intervals.
    slow_until_ms.store(epoch.elapsed().as_millis() as u64 + 300, Ordering::SeqCst);
    let watch_until = Instant::now() + Duration::from_millis(900);
    let mut i = 0;
    while Instant::now() < watch_until {
        let stats: Value = client.get(control.url("/v1/stats")).send().await.unwrap().json().await.unwrap();
        assert_eq!(stats["inference_servers"][0]["healthy"], true, "marked down after {:?}", epoch.elapsed());
        if i % 5 == 0 {
            let (status, decision) =
                send(client.post(control.url("/allocate")).json(&vm(&format!("p-{i}"), &format!("t{i}"), "D1", 1.0)))
                    .await;
            assert_eq!(status, 201, "{decision}");
            assert_eq!(source(&decision), "model", "request {i} did not reach the healthy server: {decision}");
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(i > 20, "watched only {i} times");
}

/// `vmreplay` (the `replay` package's binary, built beside this package's) on a short synthetic
/// trace against `control`, with `VMREPLAY_API_KEY` set to `key`. (The servers are other
/// processes, so blocking this test's thread is fine.)
fn vmreplay(control: &str, key: Option<&str>) -> (Option<i32>, String) {
    let mut command = std::process::Command::new(workspace_binary("vmreplay"));
    command
        .args(["--synthetic-days", "0.1", "--max-vms", "5", "--speed", "100000", "--quiet", "--keep"])
        .args(["--control", control])
        .env_remove("VMREPLAY_API_KEY");
    if let Some(key) = key {
        command.env("VMREPLAY_API_KEY", key);
    }
    let output = command.output().unwrap();
    (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
}

/// The trace replay places VMs of many tenants at trace times, far from now: with keys required it
/// needs the operator's key, and says so when it has none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vmreplay_replays_with_the_operators_key() {
    let dir = tempfile::tempdir().unwrap();
    let allocator = start_allocator(dir.path(), 20).await;
    let control = start_control(dir.path(), &[], &allocator.base, 2_000, &keys_config("")).await;
    let (code, stderr) = vmreplay(&control.base, None);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("--api-key"), "{stderr}");
    let (code, stderr) = vmreplay(&control.base, Some(OPERATOR));
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(placed_vms(&reqwest::Client::new(), &allocator).await, 5, "{stderr}");
}
