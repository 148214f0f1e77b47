//! The HTTP API of the control service (axum): `POST /allocate` and `/v1/allocate`, release and
//! lookup by VM id, `/v1/stats`, health, readiness, metrics and the OpenAPI document. Thin: the
//! prediction rules are in [`crate::predictions`], the upstream calls in [`crate::upstream`], who
//! may call in [`crate::auth`] and how often in [`crate::rate_limit`]. The routes (the console's
//! too) are listed once, with `utoipa_axum::routes!`, which takes each handler's method and path
//! from its `#[utoipa::path]`: the router and the OpenAPI document come from the same list.
//!
//! A tenant key acts only as its tenant: it places VMs of that tenant (else 403), and looks up and
//! releases only that tenant's VMs (another tenant's VM is 404, checked by the allocator in the same
//! step as the release). Its request times are the server's clock. The operator's key and open mode
//! act for any tenant.

// Handlers return early with a ready `Response` (a problem body); it is built once per request.
#![allow(clippy::result_large_err)]

use crate::auth::Caller;
use crate::control::{micros, unix_now_s, Allocated, Control};
pub use crate::http::AppState;
use crate::http::{
    authorize, operator, pass_through, request_id, upstream_failure, NoApiKey, OperatorOnly, RateLimited,
};
use crate::upstream::{AllocateFailure, Answer, UpstreamError};
use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use domain::{AllocationRequest, ControlStats, HistoryEvent, ProblemKind, StageLatency, VmPrediction, ZoneId};
use serde::Deserialize;
use service_common::openapi::{BadPathOrQuery, MetricsResponses, NotJson};
use service_common::problem::{field_problem, json_body, path_param, problem, query_param};
use service_common::timing::{prefixed, server_timing, SERVER_TIMING};
use std::time::{Duration, Instant};
use utoipa::OpenApi;
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouter};
use utoipa_axum::routes;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "control-service",
        description = "The public front door: lifetime predictions (cache, inference servers, fallback, safeguard) \
                       injected into VM requests, forwarded to the allocator of the request's zone. \
                       `/allocate` and `/v1/allocate` are the same routes. With API keys configured, every \
                       allocation route needs `Authorization: Bearer <key>`: a tenant key acts as its tenant only, \
                       the operator's key for any tenant. Every error is an RFC 9457 problem \
                       (`application/problem+json`)."
    ),
    components(schemas(
        crate::dashboard::ZoneList,
        domain::ExplainRequest,
        domain::RecordPlacement,
        domain::RecordedPlacement,
        domain::HostUpdate,
        domain::HostUpdated,
        crate::timeline::History,
        crate::timeline::Sample,
        crate::timeline::ZoneSample,
        crate::dashboard::ZoneAgents,
        crate::dashboard::AgentHealth,
        domain::AllocationRequest,
        domain::ControlDecision,
        ControlStats,
        StageLatency,
        VmPrediction,
        domain::VmInfo,
        domain::LifetimePrediction,
        domain::Problem
    ))
)]
pub struct ApiDoc;

/// The public request has no `prediction` (the control service fills it in; sending one is a
/// 422); the standard responses.
struct DocumentCompletion;

impl utoipa::Modify for DocumentCompletion {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::schema::Schema;
        use utoipa::openapi::{Ref, RefOr};
        if let Some(components) = openapi.components.as_mut() {
            // A dry run explains a VM with the prediction it is given: the request with it.
            if let Some(vm) = components.schemas.get("VmRequest").cloned() {
                components.schemas.insert("ExplainedVm".to_owned(), vm);
            }
            if let Some(RefOr::T(Schema::Object(vm))) = components.schemas.get_mut("VmRequest") {
                vm.properties.remove("prediction");
            }
        }
        domain::openapi::set_property(openapi, "ExplainRequest", "vm", Ref::from_schema_name("ExplainedVm"));
        domain::openapi::complete(openapi);
    }
}

/// The routes and their OpenAPI document, from one list: each route's `routes!`, the console's
/// ([`crate::dashboard::routes`]) merged in.
fn routes() -> (Router<AppState>, utoipa::openapi::OpenApi) {
    let (router, mut openapi) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(aliased(routes!(allocate), "/v1/allocate", "v1"))
        .routes(aliased(routes!(lookup, release), "/v1/allocate/{vm_id}", "v1"))
        .routes(routes!(stats))
        .routes(routes!(service_common::openapi::healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics_endpoint))
        .merge(crate::dashboard::routes())
        .merge(crate::cloud::routes())
        .split_for_parts();
    // Once every path is in: the standard answers go on each of them.
    utoipa::Modify::modify(&DocumentCompletion, &mut openapi);
    (router, openapi)
}

/// `routes` (of one path) served and documented at `alias` as well, as the same operations
/// (their ids suffixed `_{suffix}`).
fn aliased(routes: UtoipaMethodRouter<AppState>, alias: &str, suffix: &str) -> UtoipaMethodRouter<AppState> {
    let (schemas, mut paths, method_router) = routes;
    if let Some(path) = paths.paths.keys().next().cloned() {
        domain::openapi::alias(&mut paths, &path, alias, suffix);
    }
    (schemas, paths, method_router)
}

/// The document of this deployment: the zones it routes are the only valid `zone`s, and in open
/// mode no route needs a key (nor answers 401).
pub fn openapi_document(control: &Control) -> utoipa::openapi::OpenApi {
    for_deployment(routes().1, control)
}

/// [`openapi_document`] from the document of the routes.
fn for_deployment(mut openapi: utoipa::openapi::OpenApi, control: &Control) -> utoipa::openapi::OpenApi {
    use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};
    let zones: Vec<serde_json::Value> =
        control.allocators.zones().map(|(zone, _)| serde_json::Value::from(zone.as_str())).collect();
    let zone = |nullable: bool| {
        let mut values = zones.clone();
        let types = if nullable {
            values.push(serde_json::Value::Null);
            SchemaType::from_iter([Type::String, Type::Null])
        } else {
            SchemaType::Type(Type::String)
        };
        ObjectBuilder::new()
            .schema_type(types)
            .enum_values(Some(values))
            .description(Some("A zone this control service routes; its default zone when absent."))
    };
    domain::openapi::set_property(&mut openapi, "VmRequest", "zone", zone(true));
    for path in [
        "/allocate/{vm_id}",
        "/v1/allocate/{vm_id}",
        "/v1/zones/{zone}/hosts",
        "/v1/zones/{zone}/hosts/{host_id}",
        "/v1/zones/{zone}/consolidation",
        "/v1/zones/{zone}/explain",
    ] {
        domain::openapi::set_parameter_schema(&mut openapi, path, "zone", zone(false));
    }
    if control.keys.is_open() {
        for (_, _, operation) in domain::openapi::operations_mut(&mut openapi) {
            operation.security = None;
            operation.responses.responses.remove("401");
        }
        if let Some(components) = openapi.components.as_mut() {
            components.security_schemes.clear();
        }
    }
    openapi
}

/// The full router, `/openapi.json` with this deployment's document ([`openapi_document`]; its
/// zones and keys are fixed for the process's life), without the standard layers (see
/// `service_common::layers::apply`).
pub fn router(state: AppState) -> Router {
    let (router, openapi) = routes();
    let document = for_deployment(openapi, &state.control);
    router.route("/openapi.json", get(|| async move { Json(document) })).fallback(not_found).with_state(state)
}

async fn not_found(uri: axum::http::Uri) -> Response {
    problem(ProblemKind::NotFound, format!("no route for `{}`", uri.path()))
}

/// A tenant key places only its own tenant's VMs (403 naming the field otherwise), and its request
/// times are the server's clock: a client's `requested_at_s` must be within the allowed skew (422
/// naming the field), so no client steers its prediction through the time features.
fn apply_caller(
    control: &Control,
    caller: &Caller,
    request: &mut AllocationRequest,
    now_s: f64,
) -> Result<(), Response> {
    let Some(tenant) = caller.tenant() else {
        return Ok(());
    };
    if request.tenant_id() != tenant {
        let field = match request {
            AllocationRequest::Vm(_) => "vm.tenant_id",
            AllocationRequest::Gang(_) => "gang.tenant_id",
        };
        return Err(field_problem(
            ProblemKind::ForbiddenTenant,
            field.to_owned(),
            format!("this API key acts as tenant `{tenant}` only, got `{}`", request.tenant_id()),
        ));
    }
    for i in 0..request.vms().len() {
        if let Some(at) = request.vms()[i].facts.requested_at_s {
            if (at - now_s).abs() > control.max_skew_s {
                return Err(field_problem(
                    ProblemKind::InvalidRequest,
                    format!("{}.requested_at_s", vm_path(request, i)),
                    format!(
                        "must be within {} s of the server's clock ({now_s:.0}), got {at}; leave it out to use \
                         the server's clock",
                        control.max_skew_s
                    ),
                ));
            }
        }
    }
    for vm in request.vms_mut() {
        vm.facts.requested_at_s = Some(now_s);
    }
    Ok(())
}

/// The JSON path of VM `i` of a request, for error messages.
fn vm_path(request: &AllocationRequest, i: usize) -> String {
    match request {
        AllocationRequest::Vm(_) => "vm".to_owned(),
        AllocationRequest::Gang(_) => format!("gang.vms[{i}]"),
    }
}

/// What the control service adds to a request must not come from the client.
fn check_public_request(control: &Control, request: &AllocationRequest) -> Result<ZoneId, Response> {
    for (i, vm) in request.vms().iter().enumerate() {
        if vm.prediction.is_some() {
            return Err(field_problem(
                ProblemKind::InvalidRequest,
                format!("{}.prediction", vm_path(request, i)),
                "is filled in by the control service; leave it out".to_owned(),
            ));
        }
    }
    let zone = request.zone().cloned().unwrap_or_else(|| control.default_zone.clone());
    if !control.allocators.contains(&zone) {
        let i = request.vms().iter().position(|vm| vm.zone.is_some()).unwrap_or(0);
        let known: Vec<&str> = control.allocators.zones().map(|(zone, _)| zone.as_str()).collect();
        return Err(field_problem(
            ProblemKind::InvalidRequest,
            format!("{}.zone", vm_path(request, i)),
            format!("unknown zone `{zone}`; this control service routes {}", known.join(", ")),
        ));
    }
    Ok(zone)
}

/// Places a VM (`{"vm": {...}}`) or a tenant gang (`{"gang": {...}}`) in the request's zone (the
/// default zone when it names none), with a lifetime prediction for every VM.
///
/// 201: placed. 200: rejected (`"status": "rejected"`, a normal answer) or replayed (the VM ids were
/// placed by an earlier request; nothing placed twice). The body is the allocator's decision plus
/// `zone`, `predictions` (each VM's prediction and its source) and `latency_us` (per stage).
/// 4xx from the allocator (409 reused VM id, ...) are passed on. 502: the allocator could not be
/// reached; 504: it did not answer in time (outcome unknown; retrying with the same VM ids is safe).
#[utoipa::path(post, path = "/allocate", request_body = domain::AllocationRequest,
    responses((status = 201, description = "Placed now (`status: placed`).", body = domain::ControlDecision),
              (status = 200, description = "Rejected (`status: rejected`: nothing fits), or replayed (`replayed: true`).", body = domain::ControlDecision),
              (status = 400, description = "Malformed JSON, a wrong type, a missing or unknown field (named in `errors`).", body = domain::Problem),
              (status = 403, description = "A tenant key placing another tenant's VMs.", body = domain::Problem),
              (status = 409, description = "A VM id is placed already with other details, or part of the gang is.", body = domain::Problem),
              (status = 422, description = "A field breaks a rule (named in `errors`): an id outside the charset, a `prediction`, an unknown zone, a `requested_at_s` out of the allowed skew (tenant keys), a gang whose VMs disagree.", body = domain::Problem),
              (status = 502, description = "The zone's allocator could not be reached, or answered unreadably.", body = domain::Problem),
              (status = 503, description = "Overloaded or timed out, or the allocator could not make the change durable; retry.", body = domain::Problem),
              (status = 504, description = "The allocator did not answer in time: the outcome is unknown; retrying with the same VM ids is safe.", body = domain::Problem),
              NoApiKey, NotJson, RateLimited),
    security(("bearer" = [])))]
async fn allocate(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let started = Instant::now();
    let control = &state.control;
    let caller = match authorize(control, &headers) {
        Ok(caller) => caller,
        Err(response) => return response,
    };
    let mut request: AllocationRequest = match json_body(&headers, &body, &control.limits) {
        Ok(request) => request,
        Err(response) => return response,
    };
    let zone = match check_public_request(control, &request) {
        Ok(zone) => zone,
        Err(response) => return response,
    };
    let arrival_s = unix_now_s();
    if let Err(response) = apply_caller(control, &caller, &mut request, arrival_s) {
        return response;
    }
    let validate_us = micros(started.elapsed());
    match control.allocate(zone, request, arrival_s, request_id(&headers), started, validate_us).await {
        Ok(Allocated { created, decision, allocator_timing }) => {
            let timing = stage_timing(&decision.latency_us, allocator_timing.as_deref());
            let status = if created { StatusCode::CREATED } else { StatusCode::OK };
            let mut response = (status, Json(decision)).into_response();
            response.headers_mut().insert(SERVER_TIMING, timing);
            response
        }
        Err(AllocateFailure::Upstream(error)) => upstream_failure(error),
        Err(AllocateFailure::Refused(answer)) => pass_through(answer),
        Err(failure @ AllocateFailure::Unreadable { .. }) => {
            problem(ProblemKind::BadAllocatorAnswer, failure.to_string())
        }
    }
}

/// The `Server-Timing` of a decision: this service's stages (those of `latency_us`), then the
/// allocator's as `alloc-*` (issue 32: where the time of the whole path goes).
fn stage_timing(latency: &StageLatency, allocator: Option<&str>) -> HeaderValue {
    let us = Duration::from_micros;
    let own = server_timing([
        ("validate", us(latency.validate_us)),
        ("cache", us(latency.cache_us)),
        ("inference", us(latency.inference_us)),
        ("allocator", us(latency.allocator_us)),
        ("total", us(latency.total_us)),
    ]);
    let upstream = allocator.map(|value| prefixed(value, "alloc-")).filter(|value| !value.is_empty());
    match upstream.and_then(|upstream| own.to_str().ok().map(|own| format!("{own}, {upstream}"))) {
        Some(both) => HeaderValue::from_str(&both).unwrap_or(own),
        None => own,
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ZoneQuery {
    zone: Option<String>,
    /// Releases only: when the VM ended, on the model's clock (the clock of `requested_at_s`);
    /// the server's clock when absent. The tenants' history records it (issue 18).
    ended_at_s: Option<f64>,
}

/// The zones to ask about a VM: the one named, or every zone in turn.
fn zones_to_ask(control: &Control, query: ZoneQuery) -> Result<Vec<ZoneId>, Response> {
    match query.zone {
        Some(zone) => {
            let zone = ZoneId(zone);
            if !control.allocators.contains(&zone) {
                return Err(field_problem(
                    ProblemKind::InvalidRequest,
                    "zone".to_owned(),
                    format!("unknown zone `{zone}`"),
                ));
            }
            Ok(vec![zone])
        }
        None => Ok(control.allocators.zones().map(|(zone, _)| zone.clone()).collect()),
    }
}

/// Asks each zone in turn; the first answer other than 404 wins.
async fn ask_zones<F, Fut>(zones: Vec<ZoneId>, call: F) -> Response
where
    F: Fn(ZoneId) -> Fut,
    Fut: std::future::Future<Output = Result<Answer, UpstreamError>>,
{
    let mut last = None;
    for zone in zones {
        match call(zone).await {
            Ok(answer) if answer.status == reqwest::StatusCode::NOT_FOUND => last = Some(answer),
            Ok(answer) => return pass_through(answer),
            Err(error) => return upstream_failure(error),
        }
    }
    match last {
        Some(answer) => pass_through(answer),
        None => problem(ProblemKind::UnknownVm, "no zone is configured"),
    }
}

service_common::problem_responses! {
    /// The refusals the routes on one VM (`/allocate/{vm_id}`) share.
    struct VmCallRefusals {
        404: "No zone has the VM (or it is another tenant's, for a tenant key).",
        422: "The VM id is outside the id charset, or the zone is unknown.",
        502: "An allocator could not be reached.",
        504: "An allocator did not answer in time.",
    }
}

/// What to do with a VM id at its zone's allocator.
#[derive(Clone, Copy)]
enum VmCall {
    Release,
    Lookup,
}

/// Runs `call` for the VM of the path at the zone of the query, or at each zone in turn.
async fn vm_call(
    state: &AppState,
    headers: &HeaderMap,
    vm_id: Result<Path<String>, PathRejection>,
    query: Result<Query<ZoneQuery>, QueryRejection>,
    call: VmCall,
) -> Response {
    let control = &state.control;
    let caller = match authorize(control, headers) {
        Ok(caller) => caller,
        Err(response) => return response,
    };
    let query = match query_param(query) {
        Ok(query) => query,
        Err(response) => return response,
    };
    let now_s = unix_now_s();
    let ended_at_s = match (call, query.ended_at_s) {
        (VmCall::Lookup, Some(_)) => {
            return problem(ProblemKind::MalformedQuery, "`ended_at_s` belongs to releases only")
        }
        (_, Some(at)) if !at.is_finite() => {
            return field_problem(
                ProblemKind::InvalidRequest,
                "ended_at_s".to_owned(),
                format!("must be a finite number, got {at}"),
            )
        }
        // A tenant key's clock is the server's, as for `requested_at_s`.
        (_, Some(at)) if caller.tenant().is_some() && (at - now_s).abs() > control.max_skew_s => {
            return field_problem(
                ProblemKind::InvalidRequest,
                "ended_at_s".to_owned(),
                format!(
                    "must be within {} s of the server's clock ({now_s:.0}), got {at}; leave it out to use the \
                     server's clock",
                    control.max_skew_s
                ),
            )
        }
        (_, Some(at)) if caller.tenant().is_none() => at,
        _ => now_s,
    };
    let (vm_id, zones) = match (path_param(vm_id), zones_to_ask(control, query)) {
        (Ok(vm_id), Ok(zones)) => (vm_id, zones),
        (Err(response), _) | (_, Err(response)) => return response,
    };
    if let Err(error) = domain::validate::check_id(&vm_id, "vm_id") {
        return field_problem(ProblemKind::InvalidRequest, error.field().to_owned(), error.message().to_owned());
    }
    let request_id = request_id(headers);
    let vm_id = vm_id.as_str();
    // A tenant key reaches only its own VMs; the allocator checks ownership where the VM lives.
    let owner = caller.tenant();
    let response = ask_zones(zones, |zone| async move {
        match call {
            VmCall::Release => control.allocators.release(&zone, vm_id, owner, Some(ended_at_s), request_id).await,
            VmCall::Lookup => control.allocators.lookup(&zone, vm_id, owner, request_id).await,
        }
    })
    .await;
    if matches!(call, VmCall::Release) && response.status() == StatusCode::NO_CONTENT {
        control.record_history(HistoryEvent::Ended { vm_id: vm_id.to_owned(), at_s: ended_at_s });
    }
    response
}

/// Releases a VM. Without `?zone=` every zone's allocator is asked in turn. 204, or 404 when no
/// zone has it (or, for a tenant key, when it is another tenant's VM).
#[utoipa::path(delete, path = "/allocate/{vm_id}",
    params(("vm_id" = String, Path, description = "The VM's id (the id charset).", pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$", min_length = 1, max_length = 128),
           ("zone" = Option<String>, Query, description = "The VM's zone; every zone is asked when absent."),
           ("ended_at_s" = Option<f64>, Query, description = "When the VM ended, on the model's clock (that of `requested_at_s`; the server's clock when absent, and always for a tenant key beyond the allowed skew). The inference servers' tenant history records it.")),
    responses((status = 204, description = "Released."),
              (status = 503, description = "Overloaded or timed out, or the allocator could not make the release durable; retry.", body = domain::Problem),
              VmCallRefusals, BadPathOrQuery, NoApiKey, RateLimited),
    security(("bearer" = [])))]
async fn release(
    State(state): State<AppState>,
    headers: HeaderMap,
    vm_id: Result<Path<String>, PathRejection>,
    query: Result<Query<ZoneQuery>, QueryRejection>,
) -> Response {
    vm_call(&state, &headers, vm_id, query, VmCall::Release).await
}

/// Where a VM is placed (the allocator's answer). Without `?zone=` every zone is asked in turn. A
/// tenant key sees only its own tenant's VMs (another tenant's is 404).
#[utoipa::path(get, path = "/allocate/{vm_id}",
    params(("vm_id" = String, Path, description = "The VM's id (the id charset).", pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$", min_length = 1, max_length = 128),
           ("zone" = Option<String>, Query, description = "The VM's zone; every zone is asked when absent.")),
    responses((status = 200, description = "Where the VM is placed.", body = domain::VmInfo),
              VmCallRefusals, BadPathOrQuery, NoApiKey, RateLimited),
    security(("bearer" = [])))]
async fn lookup(
    State(state): State<AppState>,
    headers: HeaderMap,
    vm_id: Result<Path<String>, PathRejection>,
    query: Result<Query<ZoneQuery>, QueryRejection>,
) -> Response {
    vm_call(&state, &headers, vm_id, query, VmCall::Lookup).await
}

/// Counters of the control service (requests, cache, predictions by source, fallbacks by reason,
/// safeguard) and each zone's allocator statistics (`zones.<zone>.stats`). Fleet-wide: the
/// operator's key (or open mode) only.
#[utoipa::path(get, path = "/v1/stats",
    responses((status = 200, description = "The statistics.", body = ControlStats), NoApiKey, OperatorOnly, RateLimited),
    security(("bearer" = [])))]
async fn stats(State(state): State<AppState>, headers: HeaderMap) -> Response {
    match operator(&state.control, &headers) {
        Ok(_) => Json(state.control.stats(request_id(&headers)).await).into_response(),
        Err(response) => response,
    }
}

/// Ready when every zone's allocator answered its last readiness probe. The inference servers do
/// not count: without them requests are still placed, as short-lived.
#[utoipa::path(get, path = "/readyz",
    responses((status = 200, description = "Ready: `ready`.", body = String, content_type = "text/plain"),
              (status = 503, description = "An allocator did not answer its last readiness probe (`urn:problem:not-ready`).", body = domain::Problem)))]
async fn readyz(State(state): State<AppState>) -> Response {
    // A zone is ready while one of its agents is.
    let down: Vec<String> = state
        .control
        .allocators
        .zones()
        .filter(|(_, agents)| !agents.iter().any(|agent| agent.is_ready()))
        .map(|(zone, agents)| {
            format!("{zone} ({})", agents.iter().map(|a| a.base.as_str()).collect::<Vec<_>>().join(", "))
        })
        .collect();
    if down.is_empty() {
        "ready".into_response()
    } else {
        problem(ProblemKind::NotReady, format!("no answer from the allocator of {}", down.join(", ")))
    }
}

/// Prometheus metrics (text exposition format 0.0.4).
#[utoipa::path(get, path = "/metrics", responses(MetricsResponses))]
async fn metrics_endpoint(State(state): State<AppState>) -> Response {
    let Some(handle) = &state.metrics else {
        return problem(ProblemKind::NoMetrics, "this server does not record metrics");
    };
    let control = &state.control;
    let cache = control.resolver.cache().stats();
    metrics::gauge!("control_cache_hit_ratio").set(cache.hit_rate);
    metrics::gauge!("control_cache_entries").set(cache.entries as f64);
    metrics::gauge!("control_cache_hits").set(cache.hits as f64);
    metrics::gauge!("control_cache_misses").set(cache.misses as f64);
    let safeguard = control.resolver.safeguard().status(control.started.elapsed().as_secs_f64());
    metrics::gauge!("control_safeguard_active").set(if safeguard.active { 1.0 } else { 0.0 });
    metrics::gauge!("control_safeguard_long_share").set(safeguard.long_share);
    metrics::gauge!("control_safeguard_trips").set(safeguard.trips as f64);
    let newcomers = control.resolver.safeguard().newcomer_status(control.started.elapsed().as_secs_f64());
    metrics::gauge!("control_safeguard_new_tenants_active").set(if newcomers.active { 1.0 } else { 0.0 });
    metrics::gauge!("control_safeguard_new_tenants_trips").set(newcomers.trips as f64);
    let ready = control.resolver.predictor().servers().iter().filter(|s| s.is_ready()).count();
    metrics::gauge!("control_inference_servers_ready").set(ready as f64);
    service_common::telemetry::render_metrics(handle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_timing_of_a_decision_has_the_allocators_stages_after_its_own() {
        let latency = StageLatency { validate_us: 10, cache_us: 3, inference_us: 0, allocator_us: 500, total_us: 520 };
        let both = stage_timing(&latency, Some("commit;dur=0.300, total;dur=0.400"));
        assert_eq!(
            both.to_str().unwrap(),
            "validate;dur=0.010, cache;dur=0.003, inference;dur=0.000, allocator;dur=0.500, total;dur=0.520, \
             alloc-commit;dur=0.300, alloc-total;dur=0.400"
        );
        let alone = stage_timing(&latency, Some("garbage"));
        assert!(alone.to_str().unwrap().ends_with("total;dur=0.520"), "{alone:?}");
    }
}
