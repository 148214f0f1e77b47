//! Keeps the optional monitoring (`docker compose --profile monitoring`) consistent with the
//! services it watches:
//!
//! - every metric the Grafana dashboard queries is one the real services produce: the three
//!   binaries are started, driven (allocations placed and rejected, releases, a remaining-lifetime
//!   prediction, fallbacks once the inference server is gone) and scraped, and each metric of every
//!   panel's PromQL must be in a scrape, with the labels its selectors and groupings name; only the
//!   metrics of rare events ([`RARE`]: failovers, gate trips, overload, ...) are looked up in the
//!   sources instead, as a string literal of the code that records them;
//! - Prometheus scrapes each compose service that runs one of the three binaries, under the
//!   binary's name as job, on the port of its native config, with the zone the control service
//!   routes to it (also for the two-agent option);
//! - Grafana's provisioned datasource is the one every panel names, the dashboards directory and
//!   the Prometheus config are mounted where the provisioning and the flags expect them, and the
//!   monitoring services are behind a profile, on loopback, with no secret in the file.
//!
//! Docker is not needed. The last part of each test breaks its inputs on purpose and checks that
//! the checks notice.

use crate::support;

use serde_json::Value as Json;
use serde_yaml_ng::Value as Yaml;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const DASHBOARD: &str = "monitoring/grafana/dashboards/lifetime-aware-allocation.json";
const DATASOURCES: &str = "monitoring/grafana/provisioning/datasources/prometheus.yml";
const DASHBOARD_PROVIDERS: &str = "monitoring/grafana/provisioning/dashboards/lifetime-aware-allocation.yml";
const PROMETHEUS: &str = "monitoring/prometheus/prometheus.yml";
const PROMETHEUS_AGENTS: &str = "monitoring/prometheus/prometheus.agents.yml";
const COMPOSE: &str = "docker-compose.yml";
const COMPOSE_AGENTS: &str = "docker-compose.agents.yml";
/// The services of the stack; each runs the binary of the same name with `configs/<name>.toml`.
const SERVICES: [&str; 3] = ["inference-server", "allocator", "control-service"];
/// The crates whose code records the services' metrics.
const SOURCE_DIRS: [&str; 5] =
    ["allocator/src", "control-service/src", "inference-server/src", "lifetime-model/src", "service-common/src"];

/// Metrics that only rare events produce, so a short drive of the stack does not: the dashboard may
/// query them when the sources record them (the name as a string literal, the labels as `"label" =>`
/// in the same file). Each with its labels and the event.
const RARE: [(&str, &[&str], &str); 17] = [
    ("control_allocator_failovers_total", &["zone"], "an agent of a zone with several stops answering"),
    ("control_quality_gate_trips_total", &[], "the stable model's realized quality falls below the floors"),
    ("control_canary_decisions_total", &["verdict"], "an `auto` canary is judged on its realized quality"),
    ("control_history_events_dropped_total", &[], "the history queue to an inference server overflows"),
    ("control_rate_limited_total", &[], "a tenant exceeds its request rate"),
    ("control_auth_failures_total", &["reason"], "a request without a valid API key (with [auth] keys)"),
    ("control_safeguard_trips_total", &[], "the long-share safeguard trips"),
    ("http_refused_total", &["reason"], "a service refuses requests: overload, timeouts, connection cap"),
    ("inference_canary_share", &[], "a rollout with a canary is set"),
    ("inference_history_rebases_total", &[], "the tenant history is rebased onto a new stable model"),
    ("inference_bundle_rejections_total", &[], "a bundle in the models directory cannot be loaded"),
    ("inference_bundle_load_overruns_total", &[], "loading a bundle takes longer than its timeout"),
    ("allocator_commit_conflicts_total", &[], "agents on one PostgreSQL store commit conflicting batches"),
    ("allocator_commit_retries_total", &[], "a conflicting batch is decided again"),
    ("allocator_commit_failures_total", &[], "a commit fails (the store is unavailable)"),
    ("allocator_reloads_total", &["reason"], "the allocator rebuilds its state from the store"),
    ("allocator_follow_rebuilds_total", &["reason"], "an agent rebuilds its view from the change log"),
];

/// Series Prometheus adds to every target itself.
const PROMETHEUS_SERIES: [&str; 3] = ["up", "scrape_duration_seconds", "scrape_samples_scraped"];
/// Labels Prometheus attaches to every series of a target.
const TARGET_LABELS: [&str; 2] = ["job", "instance"];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("e2e has a parent directory").to_path_buf()
}

fn read(relative: &str) -> String {
    let path = repo_root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn yaml(relative: &str, text: &str) -> Yaml {
    let mut value: Yaml = serde_yaml_ng::from_str(text).unwrap_or_else(|e| panic!("{relative}: not valid YAML: {e}"));
    value.apply_merge().unwrap_or_else(|e| panic!("{relative}: bad merge key (<<): {e}"));
    value
}

fn text(value: &Yaml) -> Option<String> {
    match value {
        Yaml::String(s) => Some(s.clone()),
        Yaml::Number(n) => Some(n.to_string()),
        Yaml::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn strings(value: Option<&Yaml>) -> Vec<String> {
    match value {
        Some(Yaml::Sequence(list)) => list.iter().filter_map(text).collect(),
        Some(other) => text(other).into_iter().collect(),
        None => Vec::new(),
    }
}

/// `${NAME:-default}` -> `default` (compose's interpolation when the variable is unset).
fn interpolate_defaults(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let Some(end) = rest[at..].find('}') else { break };
        let inner = &rest[at + 2..at + end];
        out.push_str(inner.split_once(":-").map_or("", |(_, default)| default));
        rest = &rest[at + end + 1..];
    }
    out.push_str(rest);
    out
}

// ---------------------------------------------------------------------------------------------
// PromQL, as far as the checks need it: the metric selectors and the grouping labels.

#[derive(Debug, Default, PartialEq)]
struct Query {
    /// Metric name -> the label names its matchers use (`name{a="x", b=~"y"}` -> a, b).
    selectors: Vec<(String, Vec<String>)>,
    /// The labels of `by (...)`, `without (...)`, `on (...)`, `ignoring (...)`, `group_left(...)`.
    grouping: Vec<String>,
}

const GROUPING_KEYWORDS: [&str; 6] = ["by", "without", "on", "ignoring", "group_left", "group_right"];
const OPERATOR_KEYWORDS: [&str; 6] = ["and", "or", "unless", "bool", "offset", "atan2"];
/// Aggregation operators: `sum by (x) (...)` names no metric `sum`.
const AGGREGATIONS: [&str; 14] = [
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

/// The index just past the bracket closing the one at `open`, skipping quoted strings.
fn skip_bracketed(chars: &[char], open: usize) -> usize {
    let (opening, closing) = match chars[open] {
        '(' => ('(', ')'),
        '[' => ('[', ']'),
        _ => ('{', '}'),
    };
    let mut depth = 0;
    let mut i = open;
    while i < chars.len() {
        match chars[i] {
            '"' | '\'' | '`' => i = skip_string(chars, i) - 1,
            c if c == opening => depth += 1,
            c if c == closing => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    chars.len()
}

/// The index just past the string literal starting at `open`.
fn skip_string(chars: &[char], open: usize) -> usize {
    let quote = chars[open];
    let mut i = open + 1;
    while i < chars.len() && chars[i] != quote {
        i += if chars[i] == '\\' && quote != '`' { 2 } else { 1 };
    }
    i + 1
}

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// The label names at the start of each comma-separated item of a `{...}` or `(...)` body.
fn label_names(body: &[char]) -> Vec<String> {
    let mut names = Vec::new();
    let mut item_start = true;
    let mut i = 0;
    while i < body.len() {
        let c = body[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(body, i);
            continue;
        }
        if c == ',' {
            item_start = true;
        } else if item_start && is_ident_start(c) {
            let start = i;
            while i < body.len() && is_ident(body[i]) {
                i += 1;
            }
            names.push(body[start..i].iter().collect());
            item_start = false;
            continue;
        } else if !c.is_whitespace() {
            item_start = false;
        }
        i += 1;
    }
    names
}

fn parse_promql(expr: &str) -> Query {
    let chars: Vec<char> = expr.chars().collect();
    let mut query = Query::default();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(&chars, i);
        } else if c == '[' || c == '{' {
            // A range or subquery ([5m], [$__rate_interval]), or a selector without a name.
            i = skip_bracketed(&chars, i);
        } else if c.is_ascii_digit() || c == '$' || c == '.' {
            // A number (0.99, 1e3) or a variable outside a string: no metric.
            i += 1;
            while i < chars.len() && (is_ident(chars[i]) || chars[i] == '.') {
                i += 1;
            }
        } else if is_ident_start(c) {
            let start = i;
            while i < chars.len() && is_ident(chars[i]) {
                i += 1;
            }
            let ident: String = chars[start..i].iter().collect();
            let mut next = i;
            while next < chars.len() && chars[next].is_whitespace() {
                next += 1;
            }
            let follows = chars.get(next).copied();
            if GROUPING_KEYWORDS.contains(&ident.as_str()) {
                if follows == Some('(') {
                    let end = skip_bracketed(&chars, next);
                    query.grouping.extend(label_names(&chars[next + 1..end - 1]));
                    i = end;
                }
            } else if OPERATOR_KEYWORDS.contains(&ident.as_str())
                || AGGREGATIONS.contains(&ident.as_str())
                || follows == Some('(')
            {
                // An operator, or a function: its arguments are read on.
            } else if follows == Some('{') {
                let end = skip_bracketed(&chars, next);
                query.selectors.push((ident, label_names(&chars[next + 1..end - 1])));
                i = end;
            } else {
                query.selectors.push((ident, Vec::new()));
            }
        } else {
            i += 1;
        }
    }
    query
}

// ---------------------------------------------------------------------------------------------
// The dashboard.

/// A query of the dashboard: where it is, and the PromQL.
struct DashboardQuery {
    place: String,
    expr: String,
    /// For a `label_values(selector, label)` variable: the label it lists.
    listed_label: Option<String>,
}

fn all_panels(panels: &[Json], out: &mut Vec<Json>) {
    for panel in panels {
        out.push(panel.clone());
        if let Some(nested) = panel.get("panels").and_then(Json::as_array) {
            all_panels(nested, out);
        }
    }
}

fn parse_dashboard(text: &str) -> Json {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{DASHBOARD}: not valid JSON: {e}"))
}

fn dashboard_queries(dashboard: &Json, problems: &mut Vec<String>) -> Vec<DashboardQuery> {
    let mut queries = Vec::new();
    let mut panels = Vec::new();
    all_panels(dashboard["panels"].as_array().map_or(&[][..], Vec::as_slice), &mut panels);
    for panel in &panels {
        let title = panel["title"].as_str().unwrap_or("(untitled)");
        for target in panel["targets"].as_array().into_iter().flatten() {
            let place = format!("{DASHBOARD} panel '{title}' target {}", target["refId"].as_str().unwrap_or("?"));
            match target["expr"].as_str() {
                Some(expr) if !expr.trim().is_empty() => {
                    queries.push(DashboardQuery { place, expr: expr.to_owned(), listed_label: None })
                }
                _ => problems.push(format!("{place}: no PromQL expr")),
            }
        }
    }
    for variable in dashboard["templating"]["list"].as_array().into_iter().flatten() {
        let place = format!("{DASHBOARD} variable '{}'", variable["name"].as_str().unwrap_or("?"));
        if variable["type"] != "query" {
            continue;
        }
        let query = variable["query"]["query"].as_str().or_else(|| variable["query"].as_str()).unwrap_or("");
        if variable["definition"].as_str().is_some_and(|definition| definition != query) {
            problems.push(format!("{place}: definition {} differs from the query '{query}'", variable["definition"]));
        }
        let parsed = query
            .strip_prefix("label_values(")
            .and_then(|rest| rest.strip_suffix(')'))
            .and_then(|inner| inner.rsplit_once(','))
            .map(|(selector, label)| (selector.trim().to_owned(), label.trim().to_owned()));
        match parsed {
            Some((expr, label)) => queries.push(DashboardQuery { place, expr, listed_label: Some(label) }),
            None => problems.push(format!("{place}: '{query}' is not label_values(selector, label)")),
        }
    }
    queries
}

/// What the services were seen to produce.
#[derive(Default)]
struct Exposition {
    /// Sample name (`_bucket`, `_sum`, `_count` included) -> the job whose scrape held it and the
    /// label names of its samples.
    metrics: BTreeMap<String, (String, BTreeSet<String>)>,
}

impl Exposition {
    /// Reads one `/metrics` body of the service `job` (text format 0.0.4).
    fn add(&mut self, job: &str, body: &str) {
        for line in body.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            let name_end = line.find(|c: char| c == '{' || c.is_whitespace()).unwrap_or(line.len());
            let (_, labels) =
                self.metrics.entry(line[..name_end].to_owned()).or_insert_with(|| (job.to_owned(), BTreeSet::new()));
            if line[name_end..].starts_with('{') {
                let chars: Vec<char> = line[name_end..].chars().collect();
                let end = skip_bracketed(&chars, 0);
                labels.extend(label_names(&chars[1..end - 1]));
            }
        }
    }
}

/// The code of the crates that record metrics: file -> text.
fn sources() -> BTreeMap<String, String> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("listing {}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, root, out);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                let relative = path.strip_prefix(root).unwrap_or(&path).display().to_string();
                out.insert(relative, std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    let root = repo_root();
    let mut out = BTreeMap::new();
    for dir in SOURCE_DIRS {
        walk(&root.join(dir), &root, &mut out);
    }
    out
}

/// The base name of a histogram's or summary's series.
fn base_name(name: &str) -> &str {
    ["_bucket", "_sum", "_count"].iter().find_map(|suffix| name.strip_suffix(suffix)).unwrap_or(name)
}

/// Every metric of every query is in `seen` (with the labels the query names) or a [`RARE`] one the
/// sources record; every [`RARE`] entry is used. `target_labels`: the labels prometheus.yml attaches,
/// by job.
fn check_dashboard_metrics(
    dashboard: &str,
    seen: &Exposition,
    sources: &BTreeMap<String, String>,
    target_labels: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let queries = dashboard_queries(&parse_dashboard(dashboard), &mut problems);
    if queries.is_empty() {
        problems.push(format!("{DASHBOARD}: no query at all"));
    }
    let rare: BTreeMap<&str, &[&str]> = RARE.iter().map(|(name, labels, _)| (*name, *labels)).collect();
    // The labels a metric is known to carry.
    let labels_of = |name: &str| -> Option<BTreeSet<String>> {
        let mut labels: BTreeSet<String> = TARGET_LABELS.iter().map(|l| l.to_string()).collect();
        if let Some((job, own)) = seen.metrics.get(name) {
            labels.extend(own.iter().cloned());
            labels.extend(target_labels.get(job).into_iter().flatten().cloned());
            return Some(labels);
        }
        if let Some(own) = rare.get(base_name(name)) {
            labels.extend(own.iter().map(|l| l.to_string()));
            // A rare metric's target labels: those of the job of the service that has its prefix.
            for (job, extra) in target_labels {
                if seen.metrics.iter().any(|(m, (j, _))| j == job && m.split('_').next() == name.split('_').next()) {
                    labels.extend(extra.iter().cloned());
                }
            }
            if base_name(name).ends_with("_seconds") || name.ends_with("_bucket") {
                labels.insert("le".to_owned());
            }
            return Some(labels);
        }
        if PROMETHEUS_SERIES.contains(&name) {
            return Some(labels);
        }
        None
    };
    for query in &queries {
        let parsed = parse_promql(&query.expr);
        if parsed.selectors.is_empty() {
            problems.push(format!("{}: no metric in `{}`", query.place, query.expr));
        }
        let mut in_query = BTreeSet::new();
        for (name, matchers) in &parsed.selectors {
            let Some(labels) = labels_of(name) else {
                problems.push(format!(
                    "{}: `{name}` is not produced by the services (not in their /metrics after the drive, not \
                     in RARE); in `{}`",
                    query.place, query.expr
                ));
                continue;
            };
            for label in matchers.iter().filter(|l| !labels.contains(*l)) {
                problems.push(format!(
                    "{}: `{name}` has no label `{label}` (it has {labels:?}); in `{}`",
                    query.place, query.expr
                ));
            }
            in_query.extend(labels);
        }
        for label in parsed.grouping.iter().chain(&query.listed_label).filter(|l| !in_query.contains(*l)) {
            problems.push(format!(
                "{}: groups or lists by `{label}`, which none of its metrics has ({in_query:?}); in `{}`",
                query.place, query.expr
            ));
        }
    }
    // The rare metrics the dashboard relies on are recorded by the code, with the labels listed.
    for (name, labels, event) in RARE {
        let quoted = format!("\"{name}\"");
        let files: Vec<(&String, &String)> = sources.iter().filter(|(_, text)| text.contains(&quoted)).collect();
        if files.is_empty() {
            problems.push(format!("RARE `{name}` ({event}): no string literal {quoted} in {SOURCE_DIRS:?}"));
        }
        for label in labels.iter() {
            let key = format!("\"{label}\" =>");
            if !files.iter().any(|(_, text)| text.contains(&key)) {
                problems.push(format!("RARE `{name}`: label `{label}` is not recorded ({key} beside {quoted})"));
            }
        }
        let used = queries.iter().any(|q| parse_promql(&q.expr).selectors.iter().any(|(m, _)| base_name(m) == name));
        if !used {
            problems.push(format!("RARE `{name}`: the dashboard does not use it; remove it from RARE"));
        }
    }
    problems
}

// ---------------------------------------------------------------------------------------------
// The real services, driven and scraped.

fn vm(vm_id: &str, tenant: &str, cores: f64) -> Json {
    serde_json::json!({"vm": {
        "vm_id": vm_id, "tenant_id": tenant, "vm_type": "D2",
        "demand": {"cores": cores, "memory_gib": cores * 4.0},
        "requested_at_s": 864_000.0 + 13.0 * 3_600.0
    }})
}

async fn scrape(client: &reqwest::Client, process: &test_support::process::Process) -> String {
    let response =
        client.get(process.url("/metrics")).send().await.unwrap_or_else(|e| panic!("scraping {}: {e}", process.what));
    assert!(response.status().is_success(), "{} /metrics answered {}", process.what, response.status());
    response.text().await.unwrap()
}

/// The labels prometheus.yml attaches to each job's series.
fn prometheus_target_labels(prometheus: &str) -> BTreeMap<String, BTreeSet<String>> {
    let config = yaml(PROMETHEUS, prometheus);
    let mut out = BTreeMap::new();
    for job in config["scrape_configs"].as_sequence().into_iter().flatten() {
        let name = text_of(&job["job_name"]);
        let labels: &mut BTreeSet<String> = out.entry(name).or_default();
        for group in job["static_configs"].as_sequence().into_iter().flatten() {
            if let Some(map) = group["labels"].as_mapping() {
                labels.extend(map.keys().filter_map(text));
            }
        }
    }
    out
}

fn text_of(value: &Yaml) -> String {
    text(value).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_metric_is_produced_by_the_real_services() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    support::copy_dir(&repo_root().join("models/default"), &models.join("default"));
    let mut inference =
        support::start("inference-server", dir.path(), &format!("models_dir = \"{}\"\n", models.display())).await;
    let store = dir.path().join("allocator.db");
    // 4 hosts of 16 cores: the 17th VM of 4 cores is rejected.
    let allocator = support::start(
        "allocator",
        dir.path(),
        &format!(
            "store = \"{}\"\n[generate]\nzone = \"zone-1\"\nhosts = 4\nhosts_per_rack = 2\ncores = 16\nmemory_gib = 64\n\
             [allocator.policy]\nkind = \"la-binary\"\n",
            store.display()
        ),
    )
    .await;
    let control = support::start(
        "control-service",
        dir.path(),
        &format!(
            "default_zone = \"zone-1\"\n[zones.zone-1]\nallocator = \"{}\"\n[inference]\nservers = [\"{}\"]\n\
             timeout_ms = 500\nhealth_interval_ms = 100\n[allocator]\nhealth_interval_ms = 100\n[quality]\npoll_ms = 200\n",
            allocator.base, inference.base
        ),
    )
    .await;
    let client = reqwest::Client::new();
    let allocate = |id: String, tenant: String| {
        let client = client.clone();
        let url = control.url("/allocate");
        async move {
            let response = client.post(url).json(&vm(&id, &tenant, 4.0)).send().await.unwrap();
            assert!(response.status().is_success(), "allocating {id}: {}", response.status());
        }
    };
    // Placed and rejected, from several tenants; then releases.
    for i in 0..20 {
        allocate(format!("vm-{i}"), format!("tenant-{}", i % 5)).await;
    }
    for i in 0..6 {
        let response = client.delete(control.url(&format!("/allocate/vm-{i}"))).send().await.unwrap();
        assert!(response.status().is_success(), "releasing vm-{i}: {}", response.status());
    }
    // A remaining-lifetime prediction (the allocator's repredictions ask for them).
    let remaining = client
        .post(inference.url("/v1/remaining-lifetime"))
        .bearer_auth(support::SERVICE_TOKEN)
        .json(&serde_json::json!({"instances": [{"vm": {"key": "vm-r", "tenant_id": "tenant-0", "vm_type": "D2",
            "cores": 2, "memory_gib": 8, "requested_at_s": 900000.0, "features": {"batch_size": 1}}, "uptime_s": 3600.0}]}))
        .send()
        .await
        .unwrap();
    assert!(remaining.status().is_success(), "remaining lifetime: {}", remaining.status());

    // The quality watch reads the rollout from the inference server and the realized quality from
    // the allocator every 200 ms: wait for its gauges before the inference server goes.
    let deadline = Instant::now() + Duration::from_secs(15);
    while !scrape(&client, &control).await.contains("control_model_quality{") {
        assert!(Instant::now() < deadline, "the control service's quality watch set no control_model_quality");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let prometheus_text = read(PROMETHEUS);
    let target_labels = prometheus_target_labels(&prometheus_text);
    let dashboard = read(DASHBOARD);
    let sources = sources();
    let mut seen = Exposition::default();
    seen.add("inference-server", &scrape(&client, &inference).await);
    // Without the inference server, predictions fall back (new tenants: no cache hit).
    inference.kill();
    tokio::time::sleep(Duration::from_millis(600)).await;
    for i in 20..23 {
        allocate(format!("vm-{i}"), format!("tenant-new-{i}")).await;
    }
    // The quality watch polls every 200 ms and the metrics upkeep runs every 5 s: scrape until the
    // dashboard's metrics are there, or give up after 15 s and report what is missing.
    let deadline = Instant::now() + Duration::from_secs(15);
    let problems = loop {
        let mut round = Exposition { metrics: seen.metrics.clone() };
        round.add("control-service", &scrape(&client, &control).await);
        round.add("allocator", &scrape(&client, &allocator).await);
        let problems = check_dashboard_metrics(&dashboard, &round, &sources, &target_labels);
        if problems.is_empty() || Instant::now() > deadline {
            seen = round;
            break problems;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(problems.is_empty(), "the dashboard and the services disagree:\n  - {}", problems.join("\n  - "));
    for must in ["control_fallbacks_total", "inference_remaining_predictions_total", "allocator_rejections_total"] {
        assert!(seen.metrics.contains_key(must), "the drive did not produce {must}");
    }

    // The check itself: a misspelled metric, a label a metric does not have, a grouping by a label
    // no metric has, a RARE metric the code does not record, and a variable listing a missing label.
    let broken = |from: &str, to: &str| -> Vec<String> {
        assert!(dashboard.contains(from), "the mutation '{from}' no longer applies; update this test");
        check_dashboard_metrics(&dashboard.replace(from, to), &seen, &sources, &target_labels)
    };
    let expect = |problems: Vec<String>, needle: &str| {
        assert!(problems.iter().any(|p| p.contains(needle)), "expected a problem with '{needle}', got {problems:#?}");
    };
    expect(broken("rate(control_requests_total[", "rate(control_request_total["), "`control_request_total` is not");
    expect(broken("allocator_packing_density{zone", "allocator_packing_density{zone_name"), "no label `zone_name`");
    expect(broken("sum by (outcome)", "sum by (result)"), "groups or lists by `result`");
    expect(broken("control_rate_limited_total", "control_rate_limits_total"), "`control_rate_limits_total` is not");
    expect(broken("allocator_hosts, zone)", "allocator_hosts, region)"), "groups or lists by `region`");
    let mut no_source = sources.clone();
    for text in no_source.values_mut() {
        *text = text.replace("\"control_quality_gate_trips_total\"", "\"renamed\"");
    }
    expect(
        check_dashboard_metrics(&dashboard, &seen, &no_source, &target_labels),
        "no string literal \"control_quality_gate_trips_total\"",
    );
}

#[test]
fn promql_parsing_finds_metrics_labels_and_groupings() {
    let q = parse_promql(
        "histogram_quantile(0.99, sum by (le, stage) (rate(control_stage_duration_seconds_bucket{job=\"a,b\", \
         zone=~\"$zone\"}[$__rate_interval]))) / on(instance) group_left up offset 5m",
    );
    assert_eq!(
        q.selectors,
        vec![
            ("control_stage_duration_seconds_bucket".to_owned(), vec!["job".to_owned(), "zone".to_owned()]),
            ("up".to_owned(), vec![])
        ]
    );
    assert_eq!(q.grouping, vec!["le", "stage", "instance"]);
    assert_eq!(parse_promql("max(control_quality_gate_closed) > bool 0.5").selectors.len(), 1);
}

// ---------------------------------------------------------------------------------------------
// Prometheus' targets against the compose services.

/// The compose services (the overlays merged over the base by service name; a later file's keys
/// replace the earlier's).
fn compose_services(files: &[&str], texts: &[String]) -> BTreeMap<String, serde_yaml_ng::Mapping> {
    let mut services: BTreeMap<String, serde_yaml_ng::Mapping> = BTreeMap::new();
    for (file, text) in files.iter().zip(texts) {
        let value = yaml(file, text);
        for (name, body) in value["services"].as_mapping().into_iter().flatten() {
            let entry = services.entry(text_of(name)).or_default();
            for (key, field) in body.as_mapping().into_iter().flatten() {
                entry.insert(key.clone(), field.clone());
            }
        }
    }
    services
}

fn native_port(binary: &str) -> Option<u16> {
    let config: toml::Table = read(&format!("configs/{binary}.toml")).parse().ok()?;
    let listen: std::net::SocketAddr = config.get("listen")?.as_str()?.parse().ok()?;
    Some(listen.port())
}

/// The value of `--flag value` or `--flag=value` in an exec-form command (every occurrence).
fn flag_values(command: &[String], flag: &str) -> Vec<String> {
    let mut values = Vec::new();
    for (i, arg) in command.iter().enumerate() {
        if arg == flag {
            values.extend(command.get(i + 1).cloned());
        } else if let Some(value) = arg.strip_prefix(&format!("{flag}=")) {
            values.push(value.to_owned());
        }
    }
    values
}

fn check_scrape_targets(
    prometheus_file: &str,
    prometheus: &str,
    compose_files: &[&str],
    composes: &[String],
) -> Vec<String> {
    let mut problems = Vec::new();
    let services = compose_services(compose_files, composes);
    let command = |name: &str| strings(services.get(name).and_then(|s| s.get("command")));
    // The zone the control service routes to each `host:port`.
    let mut zone_of = BTreeMap::new();
    for (name, _) in
        services.iter().filter(|(name, _)| command(name).first().map(String::as_str) == Some("control-service"))
    {
        for route in flag_values(&command(name), "--zone") {
            let Some((zone, urls)) = route.split_once('=') else { continue };
            for url in urls.split(',') {
                zone_of
                    .insert(url.trim().trim_start_matches("http://").trim_end_matches('/').to_owned(), zone.to_owned());
            }
        }
    }
    // What must be scraped: each service that runs one of the binaries, on its native port.
    let mut expected = BTreeMap::new();
    for name in services.keys() {
        let argv = command(name);
        let Some(binary) = argv.first().filter(|b| SERVICES.contains(&b.as_str())) else { continue };
        let Some(port) = native_port(binary) else {
            problems.push(format!("configs/{binary}.toml: no readable listen"));
            continue;
        };
        expected.insert(format!("{name}:{port}"), binary.clone());
    }
    let config = yaml(prometheus_file, prometheus);
    let interval = text_of(&config["global"]["scrape_interval"]);
    if !["5s", "10s", "15s", "30s", "1m"].contains(&interval.as_str()) {
        problems.push(format!("{prometheus_file} global.scrape_interval: '{interval}', expected 5s to 1m"));
    }
    let mut scraped = BTreeSet::new();
    for job in config["scrape_configs"].as_sequence().into_iter().flatten() {
        let job_name = text_of(&job["job_name"]);
        let field = format!("{prometheus_file} job {job_name}");
        if let Some(path) = text(&job["metrics_path"]).filter(|p| p != "/metrics") {
            problems.push(format!("{field}: metrics_path {path}, the services serve /metrics"));
        }
        for group in job["static_configs"].as_sequence().into_iter().flatten() {
            let zone = text(&group["labels"]["zone"]);
            for target in strings(Some(&group["targets"])) {
                if !scraped.insert(target.clone()) {
                    problems.push(format!("{field}: {target} is scraped twice"));
                }
                match expected.get(&target) {
                    None => problems.push(format!(
                        "{field}: {target} is no compose service running one of {SERVICES:?} on its native port \
                         ({compose_files:?}; expected {:?})",
                        expected.keys().collect::<Vec<_>>()
                    )),
                    Some(binary) if *binary != job_name => problems.push(format!(
                        "{field}: {target} runs {binary}; the dashboard selects series by job = the binary's name"
                    )),
                    Some(_) => {}
                }
                if let Some(routed) = zone_of.get(&target) {
                    if zone.as_ref() != Some(routed) {
                        problems.push(format!(
                            "{field}: {target} has zone label {zone:?}, but the control service routes zone {routed} \
                             to it"
                        ));
                    }
                } else if expected.get(&target).is_some_and(|b| b == "allocator") {
                    problems.push(format!("{field}: {target} serves no zone of the control service's --zone flags"));
                }
            }
        }
    }
    for (target, binary) in &expected {
        if !scraped.contains(target) {
            problems.push(format!("{prometheus_file}: does not scrape {target} (the {binary} of {compose_files:?})"));
        }
    }
    problems
}

#[test]
fn prometheus_scrapes_each_compose_service_on_its_native_port() {
    let base = [read(COMPOSE)];
    let agents = [read(COMPOSE), read(COMPOSE_AGENTS)];
    let problems = [
        check_scrape_targets(PROMETHEUS, &read(PROMETHEUS), &[COMPOSE], &base),
        check_scrape_targets(PROMETHEUS_AGENTS, &read(PROMETHEUS_AGENTS), &[COMPOSE, COMPOSE_AGENTS], &agents),
    ]
    .concat();
    assert!(problems.is_empty(), "prometheus and compose disagree:\n  - {}", problems.join("\n  - "));

    // The check itself: a wrong port, a missing service, a wrong zone, a job named otherwise.
    let prometheus = read(PROMETHEUS);
    let broken = |from: &str, to: &str| {
        assert!(prometheus.contains(from), "the mutation '{from}' no longer applies; update this test");
        check_scrape_targets(PROMETHEUS, &prometheus.replacen(from, to, 1), &[COMPOSE], &base)
    };
    let expect = |problems: Vec<String>, needle: &str| {
        assert!(problems.iter().any(|p| p.contains(needle)), "expected a problem with '{needle}', got {problems:#?}");
    };
    expect(broken("\"allocator:8082\"", "\"allocator:8083\""), "allocator:8083 is no compose service");
    expect(broken("\"allocator:8082\"", "\"allocator:8082\", \"allocator-2:8082\""), "allocator-2:8082 is no compose");
    expect(broken("\"inference-server:8081\"", "\"control-service:8080\""), "does not scrape inference-server:8081");
    expect(broken("zone: zone-1", "zone: zone-2"), "routes zone zone-1");
    expect(broken("job_name: allocator", "job_name: allocators"), "runs allocator");
    // The agents' file without the second agent.
    let agents_text = read(PROMETHEUS_AGENTS).replacen(", \"allocator-2:8082\"", "", 1);
    expect(
        check_scrape_targets(PROMETHEUS_AGENTS, &agents_text, &[COMPOSE, COMPOSE_AGENTS], &agents),
        "does not scrape allocator-2:8082",
    );
}

// ---------------------------------------------------------------------------------------------
// Grafana's provisioning and the compose wiring of the monitoring services.

/// `SOURCE:TARGET[:MODE]` bind mounts of a service: container target -> host path (relative to the
/// repository) and whether read-only.
fn bind_mounts(service: &serde_yaml_ng::Mapping) -> BTreeMap<String, (String, bool)> {
    let mut out = BTreeMap::new();
    for entry in strings(service.get("volumes")) {
        let parts: Vec<&str> = entry.split(':').collect();
        if let [source, target, rest @ ..] = parts.as_slice() {
            if source.starts_with("./") {
                out.insert(target.to_string(), (source.trim_start_matches("./").to_owned(), rest.contains(&"ro")));
            }
        }
    }
    out
}

/// The host path (relative to the repository) of a path in the container, through the bind mounts.
fn host_path(mounts: &BTreeMap<String, (String, bool)>, path: &str) -> Option<String> {
    mounts
        .iter()
        .filter(|(target, _)| Path::new(path).starts_with(target.as_str()))
        .max_by_key(|(target, _)| target.len())
        .map(|(target, (source, _))| {
            let rest = Path::new(path).strip_prefix(target.as_str()).unwrap();
            if rest.as_os_str().is_empty() {
                return source.clone();
            }
            Path::new(source).join(rest).display().to_string()
        })
}

struct MonitoringFiles {
    compose: String,
    datasources: String,
    providers: String,
    dashboard: String,
}

impl MonitoringFiles {
    fn load() -> MonitoringFiles {
        MonitoringFiles {
            compose: read(COMPOSE),
            datasources: read(DATASOURCES),
            providers: read(DASHBOARD_PROVIDERS),
            dashboard: read(DASHBOARD),
        }
    }
}

fn check_grafana_and_compose(files: &MonitoringFiles) -> Vec<String> {
    let mut problems = Vec::new();
    let services = compose_services(&[COMPOSE], std::slice::from_ref(&files.compose));
    let root = repo_root();

    // `docker compose up` without a profile starts exactly the stack; the rest is behind `monitoring`.
    // The one-shot job that generates the service token runs to completion before the stack starts
    // and serves nothing, so it is no target to scrape.
    let unprofiled: BTreeSet<&str> = services
        .iter()
        .filter(|(name, s)| s.get("profiles").is_none() && name.as_str() != "service-token")
        .map(|(n, _)| n.as_str())
        .collect();
    if unprofiled != BTreeSet::from(SERVICES) {
        problems.push(format!(
            "{COMPOSE}: the services without profiles are {unprofiled:?}; `docker compose up` must start exactly \
             {SERVICES:?}"
        ));
    }
    let empty = serde_yaml_ng::Mapping::new();
    let service = |name: &str| -> &serde_yaml_ng::Mapping { services.get(name).unwrap_or(&empty) };
    for name in ["prometheus", "grafana"] {
        if !services.contains_key(name) {
            problems.push(format!("{COMPOSE} services: no service '{name}'"));
        }
        if strings(service(name).get("profiles")) != ["monitoring"] {
            problems.push(format!("{COMPOSE} services.{name}.profiles: expected [\"monitoring\"]"));
        }
        for port in strings(service(name).get("ports")) {
            if !port.starts_with("127.0.0.1:") {
                problems.push(format!("{COMPOSE} services.{name}.ports: '{port}' is not on the host's loopback"));
            }
        }
        for (target, (source, read_only)) in bind_mounts(service(name)) {
            if !read_only {
                problems.push(format!("{COMPOSE} services.{name}.volumes: ./{source}:{target} is not read-only"));
            }
        }
    }

    // Prometheus reads monitoring/prometheus/<file> through its mount, listens on 9090.
    let prometheus = service("prometheus");
    let prometheus_command = strings(prometheus.get("command"));
    let prometheus_mounts = bind_mounts(prometheus);
    match flag_values(&prometheus_command, "--config.file").as_slice() {
        [config] => {
            let unset = interpolate_defaults(config);
            match host_path(&prometheus_mounts, &unset) {
                Some(host) if host == PROMETHEUS => {}
                other => problems.push(format!(
                    "{COMPOSE} services.prometheus --config.file={config}: is {other:?} on the host, expected {PROMETHEUS}"
                )),
            }
            let agents = config.replace("${PROMETHEUS_CONFIG:-prometheus.yml}", "prometheus.agents.yml");
            if host_path(&prometheus_mounts, &agents).as_deref() != Some(PROMETHEUS_AGENTS) {
                problems.push(format!(
                    "{COMPOSE} services.prometheus --config.file={config}: PROMETHEUS_CONFIG=prometheus.agents.yml \
                     does not select {PROMETHEUS_AGENTS}"
                ));
            }
        }
        other => problems.push(format!("{COMPOSE} services.prometheus.command: --config.file given {other:?}")),
    }
    let prometheus_port = flag_values(&prometheus_command, "--web.listen-address")
        .first()
        .and_then(|a| a.rsplit(':').next().and_then(|p| p.parse::<u16>().ok()))
        .unwrap_or(9090);
    let published = |name: &str| -> Vec<u16> {
        strings(service(name).get("ports")).iter().filter_map(|p| p.rsplit(':').next()?.parse().ok()).collect()
    };
    if published("prometheus") != [prometheus_port] {
        problems.push(format!("{COMPOSE} services.prometheus.ports: expected the container port {prometheus_port}"));
    }

    // The datasource: Prometheus by its service name and port, and the uid every query names.
    let datasources = yaml(DATASOURCES, &files.datasources);
    let prometheus_sources: Vec<&Yaml> = datasources["datasources"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter(|d| d["type"].as_str() == Some("prometheus"))
        .collect();
    let uid = match prometheus_sources.as_slice() {
        [one] => {
            let url = text_of(&one["url"]);
            if url != format!("http://prometheus:{prometheus_port}") {
                problems.push(format!("{DATASOURCES}: url {url}, expected http://prometheus:{prometheus_port}"));
            }
            text_of(&one["uid"])
        }
        other => {
            problems.push(format!("{DATASOURCES}: {} Prometheus datasources, expected one", other.len()));
            String::new()
        }
    };
    if uid.is_empty() {
        problems.push(format!("{DATASOURCES}: the datasource has no fixed uid"));
    }
    let dashboard = parse_dashboard(&files.dashboard);
    if dashboard["uid"].as_str().is_none_or(str::is_empty) {
        problems.push(format!("{DASHBOARD}: no fixed uid"));
    }
    let mut panels = Vec::new();
    all_panels(dashboard["panels"].as_array().map_or(&[][..], Vec::as_slice), &mut panels);
    let mut ids = BTreeSet::new();
    let mut datasource_refs: Vec<(String, &Json)> = Vec::new();
    for panel in &panels {
        let title = panel["title"].as_str().unwrap_or("(untitled)").to_owned();
        if !ids.insert(panel["id"].as_u64().unwrap_or(0)) {
            problems.push(format!("{DASHBOARD} panel '{title}': id {} is not unique", panel["id"]));
        }
        let grid = &panel["gridPos"];
        if grid["x"].as_u64().unwrap_or(99) + grid["w"].as_u64().unwrap_or(99) > 24 {
            problems.push(format!("{DASHBOARD} panel '{title}': gridPos {grid} is wider than 24 columns"));
        }
        if panel["type"] == "row" {
            continue;
        }
        datasource_refs.push((format!("panel '{title}'"), &panel["datasource"]));
        for target in panel["targets"].as_array().into_iter().flatten() {
            datasource_refs.push((format!("panel '{title}' target {}", target["refId"]), &target["datasource"]));
        }
    }
    for variable in dashboard["templating"]["list"].as_array().into_iter().flatten() {
        datasource_refs.push((format!("variable '{}'", variable["name"]), &variable["datasource"]));
    }
    for (place, reference) in datasource_refs {
        if reference["uid"].as_str() != Some(uid.as_str()) || reference["type"] != "prometheus" {
            problems.push(format!(
                "{DASHBOARD} {place}: datasource {reference}, expected {{\"type\": \"prometheus\", \"uid\": \"{uid}\"}} \
                 ({DATASOURCES})"
            ));
        }
    }

    // Grafana: provisioning and dashboards mounted where the provider and the home dashboard say.
    let grafana = service("grafana");
    let grafana_mounts = bind_mounts(grafana);
    let provisioning = "monitoring/grafana/provisioning";
    if host_path(&grafana_mounts, "/etc/grafana/provisioning").as_deref() != Some(provisioning) {
        problems
            .push(format!("{COMPOSE} services.grafana.volumes: ./{provisioning} is not at /etc/grafana/provisioning"));
    }
    let providers = yaml(DASHBOARD_PROVIDERS, &files.providers);
    let dashboard_file = Path::new(DASHBOARD).file_name().unwrap().to_str().unwrap();
    let provider_paths: Vec<String> = providers["providers"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter(|p| p["type"].as_str() == Some("file"))
        .map(|p| text_of(&p["options"]["path"]))
        .collect();
    let served = provider_paths
        .iter()
        .any(|path| host_path(&grafana_mounts, &format!("{path}/{dashboard_file}")).is_some_and(|h| h == DASHBOARD));
    if !served {
        problems.push(format!(
            "{DASHBOARD_PROVIDERS}: no file provider's options.path {provider_paths:?} holds {DASHBOARD} through \
             the mounts of {COMPOSE} services.grafana"
        ));
    }
    let environment = grafana.get("environment").and_then(Yaml::as_mapping).cloned().unwrap_or_default();
    let env = |name: &str| environment.get(name).and_then(text);
    match env("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH") {
        Some(home) => match host_path(&grafana_mounts, &home) {
            Some(host) if root.join(&host).is_file() => {}
            other => problems.push(format!(
                "{COMPOSE} services.grafana GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH={home}: {other:?} is no file"
            )),
        },
        None => problems.push(format!("{COMPOSE} services.grafana: no GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")),
    }
    match env("GF_SECURITY_ADMIN_PASSWORD") {
        Some(password) if password.starts_with("${GRAFANA_ADMIN_PASSWORD") => {}
        other => problems.push(format!(
            "{COMPOSE} services.grafana GF_SECURITY_ADMIN_PASSWORD: {other:?}; pass it from the host as \
             ${{GRAFANA_ADMIN_PASSWORD:-...}}, a secret does not belong in the file"
        )),
    }
    // Grafana's minimum interval is the scrape interval ($__rate_interval is four of it at least).
    let interval = text_of(&yaml(PROMETHEUS, &read(PROMETHEUS))["global"]["scrape_interval"]);
    if prometheus_sources.first().map(|d| text_of(&d["jsonData"]["timeInterval"])) != Some(interval.clone()) {
        problems.push(format!("{DATASOURCES}: jsonData.timeInterval must be the scrape interval {interval}"));
    }
    problems
}

#[test]
fn grafana_provisioning_matches_the_dashboard_and_the_compose_file() {
    let files = MonitoringFiles::load();
    let problems = check_grafana_and_compose(&files);
    assert!(problems.is_empty(), "grafana, prometheus and compose disagree:\n  - {}", problems.join("\n  - "));

    // The check itself.
    let expect = |files: MonitoringFiles, needle: &str| {
        let problems = check_grafana_and_compose(&files);
        assert!(problems.iter().any(|p| p.contains(needle)), "expected a problem with '{needle}', got {problems:#?}");
    };
    let replace = |text: &str, from: &str, to: &str| {
        assert!(text.contains(from), "the mutation '{from}' no longer applies; update this test");
        text.replacen(from, to, 1)
    };
    let base = MonitoringFiles::load;
    expect(
        MonitoringFiles { datasources: replace(&base().datasources, "uid: lava-prometheus", "uid: other"), ..base() },
        "expected {\"type\": \"prometheus\", \"uid\": \"other\"}",
    );
    expect(
        MonitoringFiles {
            providers: replace(&base().providers, "path: /var/lib/grafana/dashboards", "path: /dashboards"),
            ..base()
        },
        "no file provider's options.path",
    );
    expect(
        MonitoringFiles { compose: replace(&base().compose, "    profiles: [\"monitoring\"]\n", ""), ..base() },
        "`docker compose up` must start exactly",
    );
    expect(
        MonitoringFiles {
            compose: replace(
                &base().compose,
                "\"127.0.0.1:${LAVA_GRAFANA_PORT:-3000}:3000\"",
                "\"${LAVA_GRAFANA_PORT:-3000}:3000\"",
            ),
            ..base()
        },
        "not on the host's loopback",
    );
    expect(
        MonitoringFiles { compose: replace(&base().compose, "${GRAFANA_ADMIN_PASSWORD:-admin}", "hunter2"), ..base() },
        "GF_SECURITY_ADMIN_PASSWORD",
    );
    expect(
        MonitoringFiles { compose: replace(&base().compose, "/etc/prometheus:ro", "/etc/prom:ro"), ..base() },
        "--config.file",
    );
}
