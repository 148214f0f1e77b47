//! The API fuzzer: schemathesis (4.x, installed by `scripts/setup.sh`) against the three real
//! services on loopback, each fuzzed from its own `/openapi.json`, with valid and invalid cases.
//!
//! What it holds the services to: no server error, every answer's status code, content type,
//! headers and body as the document says, invalid requests rejected with a 4xx, valid ones accepted,
//! routes that need a key refusing requests without one, and, in its stateful phase, placed VMs
//! found and released through the links the documents imply. A failure here is a bug in a document
//! or in a handler.
//!
//! Run: `cargo test --release -p control-service --test it api_fuzz:: -- --nocapture` (about 30 s on
//! two cores). `SCHEMATHESIS=/path/to/schemathesis` picks the CLI; the default is `schemathesis` on
//! `PATH`.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use test_support::stack;

/// The version `scripts/setup.sh` installs; the CLI changed a lot between 3.x and 4.x.
const SCHEMATHESIS_MAJOR: &str = "4.";
const OPERATOR_KEY: &str = "fuzz-operator-key";
const ADMIN_TOKEN: &str = "fuzz-admin-token";
/// Test cases per operation and phase: enough to reach every documented rule, small enough for
/// the whole test to stay well under a minute on two cores.
const MAX_EXAMPLES: &str = "50";
const SEED: &str = "20261123";
/// One service's run is killed (and the test fails) past this.
const RUN_BUDGET: Duration = Duration::from_secs(150);

/// Per-operation settings of the runs. Some valid requests are refused for reasons no JSON Schema
/// can state, so those operations may answer a valid case with 422 as well:
/// - allocations (`/allocate`, `/v1/allocate`, `/v1/allocations`): a gang's VMs must all name the
///   gang's tenant, have distinct VM ids and one zone (rules across fields);
/// - `/v1/explain` (and the control service's `/v1/zones/{zone}/explain`, which passes it on):
///   `why_not` must be a host of this inventory; `/v1/drains`: `pick` needs
///   non-empty hosts (the allocator's state);
/// - the inference server's rollout routes: a canary must be a valid bundle of the models
///   directory, and promoting needs a canary (the registry's state).
///
/// Every other check keeps its defaults, and these operations keep every other check.
const SCHEMATHESIS_CONFIG: &str = r#"
[[operations]]
include-path-regex = "^(/v1)?/allocate$|^/v1/(allocations|explain|drains)$|^/v1/zones/\\{zone\\}/explain$|^/v1/models/(canary|promote|rollback)$"
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "409", "422", "429"]

# What a cloud reports: a VM on a host that must exist and have room, whose `request.vm_id` must be the
# path's; a host whose VMs may need more than the capacity given.
[[operations]]
include-path-regex = "^(/v1)?/allocat(e|ions)/\\{vm_id\\}$|^/v1/(zones/\\{zone\\}/)?hosts/\\{host_id\\}$"
include-method = "PUT"
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "409", "422", "429"]
"#;

/// The schemathesis CLI, or a failure that says how to install it.
fn schemathesis() -> PathBuf {
    let program = std::env::var_os("SCHEMATHESIS").map_or_else(|| PathBuf::from("schemathesis"), PathBuf::from);
    let version = Command::new(&program).arg("--version").output();
    let version = match version {
        Ok(output) if output.status.success() => String::from_utf8_lossy(&output.stdout).into_owned(),
        _ => panic!(
            "`{}` is missing: this test runs the schemathesis CLI against the real services. Run \
             scripts/setup.sh (it installs schemathesis 4.x with pip and links it into /usr/local/bin), \
             or point SCHEMATHESIS at the CLI",
            program.display()
        ),
    };
    let number = version.split_whitespace().last().unwrap_or_default().trim_start_matches('v');
    assert!(
        number.starts_with(SCHEMATHESIS_MAJOR),
        "schemathesis {number} found, 4.x needed (run scripts/setup.sh): {version}"
    );
    program
}

/// The figures of one run, from its JSON report.
#[derive(Debug)]
struct FuzzRun {
    operations: u64,
    cases: u64,
    server_errors: u64,
    schema_violations: u64,
    failures: Vec<Value>,
    errors: Vec<Value>,
    exit_code: i64,
    wall: Duration,
}

/// Fuzzes one service from its `/openapi.json` with every check, positive and negative cases,
/// `authorization` sent on every request.
fn fuzz(program: &Path, dir: &Path, name: &str, base: &str, authorization: &str) -> FuzzRun {
    let config = dir.join("schemathesis.toml");
    std::fs::write(&config, SCHEMATHESIS_CONFIG).unwrap();
    let report = dir.join(format!("{name}-report.json"));
    let log = dir.join(format!("{name}-schemathesis.log"));
    let started = Instant::now();
    let mut child = Command::new(program)
        .current_dir(dir)
        .arg("--config-file")
        .arg(&config)
        .arg("--no-color")
        .arg("run")
        .arg(format!("{base}/openapi.json"))
        // Every check; none is left out: each one applies to these APIs.
        .args(["--checks", "all"])
        .args(["--mode", "all"])
        .args(["--phases", "examples,coverage,fuzzing,stateful"])
        .args(["--max-examples", MAX_EXAMPLES, "--seed", SEED])
        // One worker: the same seed gives the same cases in the same order.
        .args(["--workers", "1"])
        // Texts are limited in UTF-8 bytes and the documents' `maxLength` counts characters: the
        // same for ASCII, so a generated valid text is really valid.
        .args(["--generation-codec", "ascii"])
        .args(["--generation-database", "none"])
        .args(["--request-timeout", "10"])
        .arg("--header")
        .arg(format!("Authorization: {authorization}"))
        .args(["--report", "json", "--report-json-path"])
        .arg(&report)
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", program.display()));
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > RUN_BUDGET {
            let _ = child.kill();
            let _ = child.wait();
            panic!("schemathesis on {name} ran over {RUN_BUDGET:?}; its log: {}", log.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let wall = started.elapsed();
    let output = std::fs::read_to_string(&log).unwrap_or_default();
    let report: Value = match std::fs::read(&report) {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap(),
        Err(error) => panic!("schemathesis on {name} ({status}) wrote no report ({error}):\n{output}"),
    };
    let failures = report["failures"].as_array().cloned().unwrap_or_default();
    let count_of = |types: &[&str]| -> u64 {
        failures
            .iter()
            .filter(|failure| types.contains(&failure["type"].as_str().unwrap_or_default()))
            .map(|failure| failure["count"].as_u64().unwrap_or(1))
            .sum()
    };
    let run = FuzzRun {
        operations: report["operations"]["tested"].as_u64().unwrap_or(0),
        cases: report["test_cases"]["generated"].as_u64().unwrap_or(0),
        server_errors: count_of(&["ServerError", "ContentTypeServerError"]),
        schema_violations: count_of(&["JsonSchemaError", "MalformedJson", "ContentDeserializationError"]),
        failures,
        errors: report["errors"].as_array().cloned().unwrap_or_default(),
        exit_code: report["exit_code"].as_i64().unwrap_or(-1),
        wall,
    };
    println!(
        "{name}: {} operations, {} cases, {} server errors, {} schema violations, {} failures, {:.1} s",
        run.operations,
        run.cases,
        run.server_errors,
        run.schema_violations,
        run.failures.len(),
        wall.as_secs_f64()
    );
    let selected = report["operations"]["selected"].as_u64().unwrap_or(0);
    assert!(
        status.success() && run.exit_code == 0 && run.failures.is_empty() && run.errors.is_empty(),
        "schemathesis found problems in {name} ({status}):\n{output}"
    );
    assert_eq!((run.server_errors, run.schema_violations), (0, 0));
    assert!(
        run.operations > 0 && run.operations == selected,
        "{name}: {} of {selected} operations tested",
        run.operations
    );
    assert!(run.cases >= run.operations, "{name}: only {} cases", run.cases);
    run
}

async fn get_json(url: &str, authorization: &str) -> Value {
    let response = reqwest::Client::new().get(url).header("authorization", authorization).send().await.unwrap();
    assert!(response.status().is_success(), "{url}: {}", response.status());
    response.json().await.unwrap()
}

/// What every document must hold for a client or fuzzer to be generated from it.
fn check_document(name: &str, document: &Value, paths: &[&str]) {
    for path in paths {
        assert!(document["paths"][path].is_object(), "{name}: {path} is not documented");
    }
    let bearer = &document["components"]["securitySchemes"]["bearer"];
    assert_eq!((bearer["type"].as_str(), bearer["scheme"].as_str()), (Some("http"), Some("bearer")), "{name}");
    let problem = &document["components"]["schemas"]["Problem"];
    assert!(problem["properties"]["status"].is_object(), "{name}: no Problem schema");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fuzzer_finds_no_server_error_and_no_schema_violation() {
    let program = schemathesis();
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let models = stack::default_models(dir.path());
    let admin = format!("admin_token = \"{ADMIN_TOKEN}\"");
    let inference = stack::start_inference_with(dir.path(), &models, &admin).await;
    let allocator = stack::start_allocator_with(dir.path(), 64, &admin).await;
    let operator_hash = control_service::auth::to_hex(&control_service::auth::hash_key(OPERATOR_KEY));
    let auth = format!(
        "[auth]\nmode = \"keys\"\n[[auth.keys]]\nsha256 = \"{operator_hash}\"\nadmin = true\nname = \"fuzz\"\n"
    );
    let control = stack::start_control(dir.path(), &[&inference.base], &allocator.base, 200, &auth).await;
    let operator = format!("Bearer {OPERATOR_KEY}");
    let admin = format!("Bearer {ADMIN_TOKEN}");

    let client = reqwest::Client::new();
    let document: Value = client.get(control.url("/openapi.json")).send().await.unwrap().json().await.unwrap();
    check_document(
        "control-service",
        &document,
        &["/allocate", "/v1/allocate", "/allocate/{vm_id}", "/v1/allocate/{vm_id}", "/v1/stats", "/metrics"],
    );
    // The zone a valid request may name is one this deployment routes.
    assert_eq!(document["components"]["schemas"]["VmRequest"]["properties"]["zone"]["enum"][0], "zone-1");
    let document: Value = client.get(allocator.url("/openapi.json")).send().await.unwrap().json().await.unwrap();
    check_document("allocator", &document, &["/v1/allocations", "/v1/hosts/{host_id}/fail", "/metrics"]);
    let document: Value = client.get(inference.url("/openapi.json")).send().await.unwrap().json().await.unwrap();
    check_document("inference-server", &document, &["/v1/predict", "/v1/models/canary", "/metrics"]);

    let control_run = fuzz(&program, dir.path(), "control-service", &control.base, &operator);
    // Valid requests were really placed, not only answered.
    let stats = get_json(&control.url("/v1/stats"), &operator).await;
    let placed = stats["placed"].as_u64().unwrap_or(0);
    println!("control-service: {placed} allocations placed of {} requests", stats["requests"]);
    assert!(placed > 0, "the fuzzer placed no VM through the control service: {stats}");

    // The allocator and the inference server run with a service token (stack::SERVICE_TOKEN); the
    // admin token passes that check too, so one header reaches their data and admin routes alike,
    // and the fuzzer's auth checks see the data routes refuse requests without it.
    let allocator_run = fuzz(&program, dir.path(), "allocator", &allocator.base, &admin);
    let inference_run = fuzz(&program, dir.path(), "inference-server", &inference.base, &admin);

    let runs = [&control_run, &allocator_run, &inference_run];
    println!(
        "total: {} operations, {} cases, {} server errors, {} schema violations; {:.1} s fuzzing, {:.1} s in all",
        runs.iter().map(|run| run.operations).sum::<u64>(),
        runs.iter().map(|run| run.cases).sum::<u64>(),
        runs.iter().map(|run| run.server_errors).sum::<u64>(),
        runs.iter().map(|run| run.schema_violations).sum::<u64>(),
        runs.iter().map(|run| run.wall.as_secs_f64()).sum::<f64>(),
        started.elapsed().as_secs_f64()
    );
}
