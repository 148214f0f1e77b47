//! HTTP routes of the allocator: a thin layer over the [`Worker`] (see `docs/allocator.md`).
//!
//! Every answer comes after the batch it ran in has committed; every error is an
//! `application/problem+json` body.

// axum's rejections are `Response`s; boxing them would only obscure the handlers.
#![allow(clippy::result_large_err)]

use crate::durable::{
    Command, CommandError, HostDetail, HostFilter, HostInfo, HostPage, HostStateChange, HostSummary, Reply,
    StoreStatus, VmInfo,
};
use crate::store::{ExportError, ExportHeader, ExportSink, ExportWindow, ExportedVm, StoreLocation, TraceExport};
use crate::worker::Worker;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use domain::problem::FieldProblem;
pub use domain::ExplainRequest;
use domain::{
    AllocationDecision, AllocationOutcome, AllocationRequest, ClusterId, HostId, HostState, Problem, RackId, Rejection,
    RejectionCode, TenantId, ValidationLimits, VmId, ZoneId,
};
use placement::defrag::{DrainReport, DrainRequest, Migration};
use placement::{AllocateError, DrainError};
use serde::Deserialize;
use service_common::auth::require_bearer;
use service_common::problem::{problem, problem_response, HasLimits};
use service_common::telemetry::PrometheusHandle;
use service_common::ValidJson;
use std::sync::Arc;
use std::time::Instant;
use utoipa::OpenApi;

/// Default and largest page of `GET /v1/hosts`.
pub const DEFAULT_HOST_PAGE: usize = 1000;
pub const MAX_HOST_PAGE: usize = 10_000;
/// Largest `top` of `POST /v1/explain`.
pub use domain::hosts::MAX_EXPLAIN_TOP;
/// Most rows of one export (`max_rows`).
pub const MAX_EXPORT_ROWS: u64 = 1_000_000_000;
/// Exports running at once; another answers 503 `export-busy`.
pub const CONCURRENT_EXPORTS: usize = 1;
/// Bytes of an export's body sent at a time (chunks in flight are bounded too: [`EXPORT_CHUNKS`]).
const EXPORT_CHUNK: usize = 64 * 1024;
/// Chunks of an export waiting for the client at most.
const EXPORT_CHUNKS: usize = 4;

#[derive(Clone)]
pub struct AppState {
    pub worker: Worker,
    pub limits: ValidationLimits,
    pub admin_token: Option<String>,
    pub metrics: Option<PrometheusHandle>,
    /// The zones of this allocator's inventory: a request naming another zone is rejected with
    /// `unknown_zone` (it was routed to the wrong allocator).
    pub zones: Arc<[ZoneId]>,
    /// The store, which `GET /v1/export` reads on a connection of its own (never the worker's).
    pub store: StoreLocation,
    /// Permits of the exports running ([`CONCURRENT_EXPORTS`]).
    pub exports: Arc<tokio::sync::Semaphore>,
}

impl HasLimits for AppState {
    fn limits(&self) -> &ValidationLimits {
        &self.limits
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Allocator",
        description = "Lifetime-aware VM placement over one zone's inventory, with durable state."
    ),
    paths(
        allocate,
        release,
        get_allocation,
        list_hosts,
        get_host,
        drain_host,
        fail_host,
        restore_host,
        start_drain,
        drain_status,
        complete_migration,
        stats,
        quality,
        export,
        explain,
        healthz,
        readyz,
        metrics_endpoint
    ),
    components(schemas(
        domain::AllocationRequest,
        domain::AllocationDecision,
        domain::Resources,
        placement::AllocatorStats,
        domain::QualityReport,
        domain::VersionQuality,
        domain::QualityTally,
        domain::QualityFigures,
        domain::quality::ScoreBin,
        placement::Explanation,
        VmInfo,
        HostInfo,
        HostSummary,
        HostDetail,
        HostPage,
        HostStateChange,
        StoreStatus,
        ExplainRequest,
        DrainRequest,
        DrainReport,
        Migration,
        placement::defrag::DrainHosts,
        placement::defrag::MigrationOrder,
        placement::host_state::HostStateStats,
        crate::durable::PolicyHostState,
        domain::LifetimePrediction,
        domain::HostState,
        domain::Problem
    )),
    modifiers(&DocumentCompletion)
)]
pub struct ApiDoc;

/// What the derived schemas of the library's types cannot say (their resource vectors, host
/// states, the drain request's ranges), and the standard responses.
struct DocumentCompletion;

impl utoipa::Modify for DocumentCompletion {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use domain::openapi::set_property;
        use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Type};
        use utoipa::openapi::Ref;
        let resources = || Ref::from_schema_name("Resources");
        set_property(openapi, "VmInfo", "demand", resources());
        for property in ["capacity", "used", "free"] {
            set_property(openapi, "HostInfo", property, resources());
        }
        set_property(openapi, "HostInfo", "state", Ref::from_schema_name("HostState"));
        set_property(openapi, "HostStateChange", "previous", Ref::from_schema_name("HostState"));
        set_property(openapi, "HostStateChange", "state", Ref::from_schema_name("HostState"));
        let host_id = ObjectBuilder::new().schema_type(Type::String).min_length(Some(1)).max_length(Some(256));
        let listed = ArrayBuilder::new().items(host_id).min_items(Some(1)).max_items(Some(1000));
        let listed = ObjectBuilder::new()
            .property("listed", listed)
            .required("listed")
            .additional_properties(Some(utoipa::openapi::schema::AdditionalProperties::FreeForm(false)))
            .description(Some("These hosts (1 to 1000 ids)."));
        let pick = ObjectBuilder::new()
            .property("pick", ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(1)))
            .required("pick")
            .additional_properties(Some(utoipa::openapi::schema::AdditionalProperties::FreeForm(false)))
            .description(Some("The `n` available non-empty hosts cheapest to empty."));
        domain::openapi::set_schema(
            openapi,
            "DrainHosts",
            utoipa::openapi::schema::OneOfBuilder::new().item(listed).item(pick).into(),
        );
        set_property(
            openapi,
            "DrainRequest",
            "max_in_flight",
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(1))
                .maximum(Some(placement::defrag::MAX_IN_FLIGHT as f64))
                .description(Some("Most migrations in flight at once (default 3).")),
        );
        // `offset` is read as a `usize`: any whole number up to 2^64 - 1, beyond `int64`'s range.
        domain::openapi::set_parameter_schema(
            openapi,
            "/v1/hosts",
            "offset",
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(0))
                .maximum(Some(u64::MAX))
                .description(Some("Hosts to skip.")),
        );
        domain::openapi::complete(openapi);
    }
}

/// The full router, without the standard layers (see `service_common::layers::apply`).
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/allocations", post(allocate))
        .route("/v1/allocations/{vm_id}", get(get_allocation).delete(release))
        .route("/v1/hosts", get(list_hosts))
        .route("/v1/hosts/{host_id}", get(get_host))
        .route("/v1/hosts/{host_id}/drain", post(drain_host))
        .route("/v1/hosts/{host_id}/fail", post(fail_host))
        .route("/v1/hosts/{host_id}/restore", post(restore_host))
        .route("/v1/drains", get(drain_status).post(start_drain))
        .route("/v1/migrations/{vm_id}/complete", post(complete_migration))
        .route("/v1/stats", get(stats))
        .route("/v1/quality", get(quality))
        .route("/v1/export", get(export))
        .route("/v1/explain", post(explain))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_endpoint))
        .route("/openapi.json", get(|| async { Json(ApiDoc::openapi()) }))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

async fn not_found(uri: axum::http::Uri) -> Response {
    problem(StatusCode::NOT_FOUND, "not-found", "Not found", format!("no route for `{}`", uri.path()))
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    problem(
        StatusCode::METHOD_NOT_ALLOWED,
        "method-not-allowed",
        "Method not allowed",
        format!("`{}` does not accept {method}", uri.path()),
    )
}

/// Runs a command on the worker, timing it per endpoint.
async fn call(state: &AppState, endpoint: &'static str, command: Command) -> Result<Reply, CommandError> {
    let started = Instant::now();
    let reply = state.worker.call(command).await;
    metrics::histogram!("allocator_request_duration_seconds", "endpoint" => endpoint)
        .record(started.elapsed().as_secs_f64());
    reply
}

fn retry_later(mut response: Response) -> Response {
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

fn command_error(error: CommandError) -> Response {
    let detail = error.to_string();
    match error {
        CommandError::Conflict(AllocateError::IdReused { .. }) => {
            problem(StatusCode::CONFLICT, "vm-id-reused", "VM id already used", detail)
        }
        CommandError::Conflict(AllocateError::PartialGang { .. }) => {
            problem(StatusCode::CONFLICT, "partial-gang", "Gang partly placed", detail)
        }
        CommandError::UnknownVm(_) => problem(StatusCode::NOT_FOUND, "unknown-vm", "Unknown VM", detail),
        CommandError::UnknownHost(_) => problem(StatusCode::NOT_FOUND, "unknown-host", "Unknown host", detail),
        CommandError::NotDurable(_) => {
            retry_later(problem(StatusCode::SERVICE_UNAVAILABLE, "not-durable", "Change not durable", detail))
        }
        CommandError::Unavailable(_) => {
            retry_later(problem(StatusCode::SERVICE_UNAVAILABLE, "store-unavailable", "Store unavailable", detail))
        }
        CommandError::Drain(DrainError::Busy) => {
            problem(StatusCode::CONFLICT, "drain-busy", "Drain in progress", detail)
        }
        CommandError::Drain(DrainError::NoDrain) => problem(StatusCode::NOT_FOUND, "no-drain", "No drain", detail),
        CommandError::Drain(DrainError::UnknownHost(_)) => {
            problem(StatusCode::NOT_FOUND, "unknown-host", "Unknown host", detail)
        }
        CommandError::Drain(DrainError::NoHosts) => {
            problem(StatusCode::UNPROCESSABLE_ENTITY, "no-hosts-to-drain", "No host to drain", detail)
        }
        CommandError::Drain(DrainError::NotMigrating(_)) => {
            problem(StatusCode::NOT_FOUND, "not-migrating", "VM not migrating", detail)
        }
    }
}

fn unexpected(reply: &Reply) -> Response {
    tracing::error!(?reply, "the worker answered with the wrong kind of reply");
    problem(StatusCode::INTERNAL_SERVER_ERROR, "internal", "Internal error", "unexpected reply from the allocator")
}

fn invalid_field(status: StatusCode, field: &str, message: impl Into<String>) -> Response {
    let message = message.into();
    let (kind, title) = if status == StatusCode::BAD_REQUEST {
        ("malformed-request", "Malformed request")
    } else {
        ("invalid-request", "Invalid request")
    };
    let mut body = Problem::new(status.as_u16(), kind, title, format!("field `{field}`: {message}"));
    body.errors.push(FieldProblem { field: field.to_owned(), message });
    problem_response(body)
}

fn path_param(param: Result<Path<String>, PathRejection>) -> Result<String, Response> {
    param.map(|Path(value)| value).map_err(|rejection| {
        problem(rejection.status(), "malformed-path", "Malformed path parameter", rejection.body_text())
    })
}

/// Places a VM (`{"vm": {...}}`) or a whole gang (`{"gang": {...}}`).
///
/// 201: placed now. 200: placed by an earlier request with the same VM ids (`"replayed": true`,
/// same placements), or rejected (`"status": "rejected"`: nothing fits; a normal answer, not an
/// error). 409: the VM id is placed already with a different tenant, demand or type, or part of the
/// gang is placed. 503: the change could not be made durable and was undone; retry.
#[utoipa::path(post, path = "/v1/allocations", request_body = domain::AllocationRequest,
    responses((status = 201, description = "Placed now (`status: placed`).", body = domain::AllocationDecision),
              (status = 200, description = "Replayed (`replayed: true`), or rejected (`status: rejected`).", body = domain::AllocationDecision),
              (status = 400, description = "Malformed JSON, a wrong type, a missing or unknown field.", body = domain::Problem),
              (status = 409, description = "A VM id is placed already with other details (`vm-id-reused`), or part of the gang is (`partial-gang`).", body = domain::Problem),
              (status = 415, description = "The body is not declared `application/json`.", body = domain::Problem),
              (status = 422, description = "A field breaks a rule (named in `errors`).", body = domain::Problem),
              (status = 503, description = "The change could not be made durable and was undone, the store is unavailable, or overloaded or timed out; retry.", body = domain::Problem)))]
async fn allocate(State(state): State<AppState>, ValidJson(request): ValidJson<AllocationRequest>) -> Response {
    if let Some(zone) = request.zone().filter(|zone| !state.zones.contains(zone)) {
        let served: Vec<&str> = state.zones.iter().map(ZoneId::as_str).collect();
        let rejection = Rejection {
            code: RejectionCode::UnknownZone,
            detail: format!("zone `{zone}` is not served here (this allocator serves {})", served.join(", ")),
            vm_id: None,
            eliminated_by: Vec::new(),
        };
        let decision = AllocationDecision {
            outcome: AllocationOutcome::Rejected { rejection },
            rule_stats: Vec::new(),
            replayed: false,
        };
        return (StatusCode::OK, Json(decision)).into_response();
    }
    match call(&state, "allocate", Command::Allocate(request)).await {
        Ok(Reply::Allocated(decision)) => {
            let status = if decision.is_placed() && !decision.replayed { StatusCode::CREATED } else { StatusCode::OK };
            (status, Json(decision)).into_response()
        }
        Ok(other) => unexpected(&other),
        Err(error) => command_error(error),
    }
}

/// `?tenant=` of the calls on one VM: the caller's tenant, when the caller may act only on its own VMs
/// (the control service passes it for tenant API keys).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OwnerQuery {
    tenant: Option<String>,
}

/// The owner a call is restricted to, checked like every id a client sends.
fn owner(query: Result<Query<OwnerQuery>, QueryRejection>) -> Result<Option<TenantId>, Response> {
    let Query(query) = query.map_err(|rejection| {
        problem(rejection.status(), "malformed-query", "Malformed query", rejection.body_text())
    })?;
    match query.tenant {
        Some(tenant) => match domain::validate::check_id(&tenant, "tenant") {
            Ok(()) => Ok(Some(TenantId(tenant))),
            Err(error) => Err(invalid_field(StatusCode::UNPROCESSABLE_ENTITY, error.field(), error.message())),
        },
        None => Ok(None),
    }
}

/// `?tenant=` and `?ended_at_s=` of a release.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseQuery {
    tenant: Option<String>,
    ended_at_s: Option<f64>,
}

/// The VM of a `/v1/allocations/{vm_id}` path and the owner its `?tenant=` requires, if any.
fn vm_and_owner(
    vm_id: Result<Path<String>, PathRejection>,
    query: Result<Query<OwnerQuery>, QueryRejection>,
) -> Result<(VmId, Option<TenantId>), Response> {
    Ok((VmId(path_param(vm_id)?), owner(query)?))
}

/// Releases a VM: its host's capacity is free at once. 204, or 404 when it is not placed (also
/// when an earlier release of it succeeded). With `?tenant=`, only a VM of that tenant is released;
/// another tenant's VM answers 404 as if it did not exist (checked and released in one step).
#[utoipa::path(delete, path = "/v1/allocations/{vm_id}",
    params(("vm_id" = String, Path, description = "The VM's id."),
           ("tenant" = Option<String>, Query, description = "Release only a VM of this tenant (the id charset).", pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"),
           ("ended_at_s" = Option<f64>, Query, description = "When the VM ended on the model's clock (that of `requested_at_s`), for its realized outcome; the latest request time seen when absent.")),
    responses((status = 204, description = "Released."),
              (status = 400, description = "An unknown query parameter, or a malformed path.", body = domain::Problem),
              (status = 404, description = "Not placed (or another tenant's VM, with `tenant`).", body = domain::Problem),
              (status = 422, description = "`tenant` is not a valid id.", body = domain::Problem),
              (status = 503, description = "The release could not be made durable, or overloaded or timed out; retry.", body = domain::Problem)))]
async fn release(
    State(state): State<AppState>,
    vm_id: Result<Path<String>, PathRejection>,
    query: Result<Query<ReleaseQuery>, QueryRejection>,
) -> Response {
    let (query, ended_at_s) = match query {
        Ok(Query(ReleaseQuery { tenant, ended_at_s })) => (Ok(Query(OwnerQuery { tenant })), ended_at_s),
        Err(rejection) => (Err(rejection), None),
    };
    if let Some(at) = ended_at_s.filter(|at| !at.is_finite()) {
        return invalid_field(
            StatusCode::UNPROCESSABLE_ENTITY,
            "ended_at_s",
            format!("must be a finite number, got {at}"),
        );
    }
    let (vm, owner) = match vm_and_owner(vm_id, query) {
        Ok(parsed) => parsed,
        Err(response) => return response,
    };
    match call(&state, "release", Command::Release { vm, owner, ended_at_s }).await {
        Ok(Reply::Released(_)) => StatusCode::NO_CONTENT.into_response(),
        Ok(other) => unexpected(&other),
        Err(error) => command_error(error),
    }
}

/// Where a VM is placed. With `?tenant=`, another tenant's VM answers 404 as if it did not exist.
#[utoipa::path(get, path = "/v1/allocations/{vm_id}",
    params(("vm_id" = String, Path, description = "The VM's id."),
           ("tenant" = Option<String>, Query, description = "Show only a VM of this tenant (the id charset).", pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")),
    responses((status = 200, description = "Where the VM is placed.", body = VmInfo),
              (status = 400, description = "An unknown query parameter, or a malformed path.", body = domain::Problem),
              (status = 404, description = "Not placed (or another tenant's VM, with `tenant`).", body = domain::Problem),
              (status = 422, description = "`tenant` is not a valid id.", body = domain::Problem)))]
async fn get_allocation(
    State(state): State<AppState>,
    vm_id: Result<Path<String>, PathRejection>,
    query: Result<Query<OwnerQuery>, QueryRejection>,
) -> Response {
    let (vm_id, owner) = match vm_and_owner(vm_id, query) {
        Ok(parsed) => parsed,
        Err(response) => return response,
    };
    match call(&state, "get-allocation", Command::GetAllocation(vm_id.clone())).await {
        // One reply is one snapshot: the owner is checked on the very answer sent.
        Ok(Reply::Allocation(info)) if owner.as_ref().is_none_or(|owner| *owner == info.tenant_id) => {
            Json(info).into_response()
        }
        Ok(Reply::Allocation(_)) => command_error(CommandError::UnknownVm(vm_id)),
        Ok(other) => unexpected(&other),
        Err(error) => command_error(error),
    }
}

/// Parses the query of `GET /v1/hosts`, naming the field at fault.
fn host_filter(pairs: &[(String, String)]) -> Result<HostFilter, Response> {
    let mut filter = HostFilter { limit: DEFAULT_HOST_PAGE, ..HostFilter::default() };
    let number = |field: &str, value: &str| {
        value.parse::<usize>().map_err(|_| {
            invalid_field(StatusCode::BAD_REQUEST, field, format!("must be a whole number, got `{value}`"))
        })
    };
    for (key, value) in pairs {
        match key.as_str() {
            "state" => {
                filter.state = Some(match value.as_str() {
                    "available" => HostState::Available,
                    "unavailable" => HostState::Unavailable,
                    "failed" => HostState::Failed,
                    other => {
                        return Err(invalid_field(
                            StatusCode::BAD_REQUEST,
                            "state",
                            format!("must be `available`, `unavailable` or `failed`, got `{other}`"),
                        ))
                    }
                })
            }
            "rack" => filter.rack = Some(RackId(value.clone())),
            "cluster" => filter.cluster = Some(ClusterId(value.clone())),
            "empty" => {
                filter.empty = Some(match value.as_str() {
                    "true" => true,
                    "false" => false,
                    other => {
                        return Err(invalid_field(
                            StatusCode::BAD_REQUEST,
                            "empty",
                            format!("must be `true` or `false`, got `{other}`"),
                        ))
                    }
                })
            }
            "limit" => {
                filter.limit = number("limit", value)?;
                if filter.limit == 0 || filter.limit > MAX_HOST_PAGE {
                    return Err(invalid_field(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "limit",
                        format!("must be between 1 and {MAX_HOST_PAGE}"),
                    ));
                }
            }
            "offset" => filter.offset = number("offset", value)?,
            other => {
                return Err(invalid_field(
                    StatusCode::BAD_REQUEST,
                    other,
                    "unknown parameter; expected state, rack, cluster, empty, limit or offset",
                ))
            }
        }
    }
    Ok(filter)
}

/// Lists hosts with their occupancy and VM ids, in inventory order, filtered by `state`
/// (`available`, `unavailable`, `failed`), `rack`, `cluster` and `empty` (`true`/`false`), paged by
/// `limit` (default 1000, at most 10000) and `offset`.
#[utoipa::path(get, path = "/v1/hosts",
    params(("state" = Option<HostState>, Query, description = "Only hosts in this state."),
           ("rack" = Option<String>, Query, description = "Only hosts of this rack."),
           ("cluster" = Option<String>, Query, description = "Only hosts of this cluster."),
           ("empty" = Option<bool>, Query, description = "Only empty (`true`) or non-empty (`false`) hosts."),
           ("limit" = Option<u64>, Query, minimum = 1, maximum = 10000, description = "Page size (default 1000)."),
           ("offset" = Option<u64>, Query, description = "Hosts to skip.")),
    responses((status = 200, description = "A page of hosts.", body = HostPage),
              (status = 400, description = "An unknown parameter, or a value of the wrong kind (named in `errors`).", body = domain::Problem),
              (status = 422, description = "`limit` out of range.", body = domain::Problem)))]
async fn list_hosts(
    State(state): State<AppState>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Response {
    let pairs = match query {
        Ok(Query(pairs)) => pairs,
        Err(rejection) => {
            return problem(StatusCode::BAD_REQUEST, "malformed-query", "Malformed query", rejection.body_text())
        }
    };
    let filter = match host_filter(&pairs) {
        Ok(filter) => filter,
        Err(response) => return response,
    };
    match call(&state, "list-hosts", Command::ListHosts(filter)).await {
        Ok(Reply::Hosts(page)) => Json(page).into_response(),
        Ok(other) => unexpected(&other),
        Err(error) => command_error(error),
    }
}

/// One host: capacity, used, free, state, lifetime class and its VMs in full.
#[utoipa::path(get, path = "/v1/hosts/{host_id}", params(("host_id" = String, Path, description = "The host's id.")),
    responses((status = 200, description = "The host and its VMs.", body = HostDetail),
              (status = 400, description = "A malformed path.", body = domain::Problem), (status = 404, description = "No such host.", body = domain::Problem)))]
async fn get_host(State(state): State<AppState>, host_id: Result<Path<String>, PathRejection>) -> Response {
    let host_id = match path_param(host_id) {
        Ok(id) => id,
        Err(response) => return response,
    };
    match call(&state, "get-host", Command::GetHost(HostId(host_id))).await {
        Ok(Reply::Host(detail)) => Json(detail).into_response(),
        Ok(other) => unexpected(&other),
        Err(error) => command_error(error),
    }
}

async fn set_host_state(
    state: &AppState,
    headers: &HeaderMap,
    host_id: Result<Path<String>, PathRejection>,
    new_state: HostState,
) -> Response {
    if let Err(response) = require_bearer(headers, state.admin_token.as_deref()) {
        return response;
    }
    let host_id = match path_param(host_id) {
        Ok(id) => id,
        Err(response) => return response,
    };
    match call(state, "set-host-state", Command::SetHostState { host: HostId(host_id), state: new_state }).await {
        Ok(Reply::HostStateSet(change)) => {
            tracing::info!(host = %change.host_id, previous = ?change.previous, state = ?change.state, "host state set");
            Json(change).into_response()
        }
        Ok(other) => unexpected(&other),
        Err(error) => command_error(error),
    }
}

/// Drains a host (admin): it takes no new VM; its VMs stay.
#[utoipa::path(post, path = "/v1/hosts/{host_id}/drain", params(("host_id" = String, Path, description = "The host's id.")),
    responses((status = 200, description = "The host's previous and new state.", body = HostStateChange),
              (status = 400, description = "A malformed path.", body = domain::Problem),
              (status = 401, description = "No valid admin token.", body = domain::Problem),
              (status = 403, description = "No admin token is configured: the admin API is off.", body = domain::Problem),
              (status = 404, description = "No such host.", body = domain::Problem),
              (status = 503, description = "The change could not be made durable, or overloaded or timed out; retry.", body = domain::Problem)),
    security(("bearer" = [])))]
async fn drain_host(
    State(state): State<AppState>,
    headers: HeaderMap,
    host_id: Result<Path<String>, PathRejection>,
) -> Response {
    set_host_state(&state, &headers, host_id, HostState::Unavailable).await
}

/// Marks a host failed (admin): it takes no new VM.
#[utoipa::path(post, path = "/v1/hosts/{host_id}/fail", params(("host_id" = String, Path, description = "The host's id.")),
    responses((status = 200, description = "The host's previous and new state.", body = HostStateChange),
              (status = 400, description = "A malformed path.", body = domain::Problem),
              (status = 401, description = "No valid admin token.", body = domain::Problem),
              (status = 403, description = "No admin token is configured: the admin API is off.", body = domain::Problem),
              (status = 404, description = "No such host.", body = domain::Problem),
              (status = 503, description = "The change could not be made durable, or overloaded or timed out; retry.", body = domain::Problem)),
    security(("bearer" = [])))]
async fn fail_host(
    State(state): State<AppState>,
    headers: HeaderMap,
    host_id: Result<Path<String>, PathRejection>,
) -> Response {
    set_host_state(&state, &headers, host_id, HostState::Failed).await
}

/// Makes a host available again (admin).
#[utoipa::path(post, path = "/v1/hosts/{host_id}/restore", params(("host_id" = String, Path, description = "The host's id.")),
    responses((status = 200, description = "The host's previous and new state.", body = HostStateChange),
              (status = 400, description = "A malformed path.", body = domain::Problem),
              (status = 401, description = "No valid admin token.", body = domain::Problem),
              (status = 403, description = "No admin token is configured: the admin API is off.", body = domain::Problem),
              (status = 404, description = "No such host.", body = domain::Problem),
              (status = 503, description = "The change could not be made durable, or overloaded or timed out; retry.", body = domain::Problem)),
    security(("bearer" = [])))]
async fn restore_host(
    State(state): State<AppState>,
    headers: HeaderMap,
    host_id: Result<Path<String>, PathRejection>,
) -> Response {
    set_host_state(&state, &headers, host_id, HostState::Available).await
}

/// Starts draining hosts (admin; LARS): they take no new VM and their VMs migrate away, at most
/// `max_in_flight` at a time, longest predicted remaining lifetime first (`order:
/// "longest-remaining-first"`, the default) or in arrival order (`"arrival"`). Each migration
/// reserves the VM's demand on a target the placement policy picks; confirm it with
/// `POST /v1/migrations/{vm_id}/complete` once the live migration finished.
#[utoipa::path(post, path = "/v1/drains", request_body = DrainRequest,
    responses((status = 201, description = "The drain started.", body = DrainReport),
              (status = 400, description = "Malformed JSON, a wrong type, a missing or unknown field.", body = domain::Problem),
              (status = 401, description = "No valid admin token.", body = domain::Problem),
              (status = 403, description = "No admin token is configured: the admin API is off.", body = domain::Problem),
              (status = 404, description = "A listed host is not in the inventory.", body = domain::Problem),
              (status = 409, description = "A drain is in progress.", body = domain::Problem),
              (status = 415, description = "The body is not declared `application/json`.", body = domain::Problem),
              (status = 422, description = "A field breaks a rule, or there is no host to drain.", body = domain::Problem),
              (status = 503, description = "The change could not be made durable, or overloaded or timed out; retry.", body = domain::Problem)),
    security(("bearer" = [])))]
async fn start_drain(
    State(state): State<AppState>,
    headers: HeaderMap,
    ValidJson(request): ValidJson<DrainRequest>,
) -> Response {
    if let Err(response) = require_bearer(&headers, state.admin_token.as_deref()) {
        return response;
    }
    match call(&state, "start-drain", Command::StartDrain(request)).await {
        Ok(Reply::Drain(report)) => {
            tracing::info!(hosts = ?report.hosts, in_flight = report.in_flight.len(), "drain started");
            (StatusCode::CREATED, Json(report)).into_response()
        }
        Ok(other) => unexpected(&other),
        Err(error) => command_error(error),
    }
}

/// Where the current (or last) drain stands: migrations performed, avoided (the VM exited before
/// its turn), in flight, queued.
#[utoipa::path(get, path = "/v1/drains",
    responses((status = 200, description = "The current or last drain.", body = DrainReport),
              (status = 404, description = "No drain was ever started.", body = domain::Problem)))]
async fn drain_status(State(state): State<AppState>) -> Response {
    match call(&state, "drain-status", Command::DrainStatus).await {
        Ok(Reply::Drain(report)) => Json(report).into_response(),
        Ok(other) => unexpected(&other),
        Err(error) => command_error(error),
    }
}

/// Confirms a migration (admin): the VM now runs on its target, its source capacity is freed, and
/// the next VM of the drain starts migrating.
#[utoipa::path(post, path = "/v1/migrations/{vm_id}/complete", params(("vm_id" = String, Path, description = "The migrating VM's id.")),
    responses((status = 200, description = "The completed migration.", body = Migration),
              (status = 400, description = "A malformed path.", body = domain::Problem),
              (status = 401, description = "No valid admin token.", body = domain::Problem),
              (status = 403, description = "No admin token is configured: the admin API is off.", body = domain::Problem),
              (status = 404, description = "The VM is not migrating (or no drain is running).", body = domain::Problem),
              (status = 503, description = "The change could not be made durable, or overloaded or timed out; retry.", body = domain::Problem)),
    security(("bearer" = [])))]
async fn complete_migration(
    State(state): State<AppState>,
    headers: HeaderMap,
    vm_id: Result<Path<String>, PathRejection>,
) -> Response {
    if let Err(response) = require_bearer(&headers, state.admin_token.as_deref()) {
        return response;
    }
    let vm_id = match path_param(vm_id) {
        Ok(id) => id,
        Err(response) => return response,
    };
    match call(&state, "complete-migration", Command::CompleteMigration(VmId(vm_id))).await {
        Ok(Reply::MigrationCompleted(migration)) => Json(migration).into_response(),
        Ok(other) => unexpected(&other),
        Err(error) => command_error(error),
    }
}

/// Occupancy, packing density, empty hosts, VMs by lifetime, rejections by reason.
#[utoipa::path(get, path = "/v1/stats", responses((status = 200, description = "The statistics.", body = placement::AllocatorStats)))]
async fn stats(State(state): State<AppState>) -> Response {
    match call(&state, "stats", Command::Stats).await {
        Ok(Reply::Stats(stats)) => Json(stats).into_response(),
        Ok(other) => unexpected(&other),
        Err(error) => command_error(error),
    }
}

/// The realized quality of the lifetime predictions VMs were placed with, per model version, over
/// a sliding window of resolved outcomes: a VM resolves when it exits, or as long-lived once it
/// outlives the threshold still running. The windows' tallies add up across zones.
#[utoipa::path(get, path = "/v1/quality", responses((status = 200, description = "The realized quality.", body = domain::QualityReport)))]
async fn quality(State(state): State<AppState>) -> Response {
    match call(&state, "quality", Command::Quality).await {
        Ok(Reply::Quality(report)) => Json(report).into_response(),
        Ok(other) => unexpected(&other),
        Err(error) => command_error(error),
    }
}

/// Parses the query of `GET /v1/export`, naming the field at fault.
fn export_window(pairs: &[(String, String)]) -> Result<ExportWindow, Response> {
    let mut window = ExportWindow::default();
    for (key, value) in pairs {
        match key.as_str() {
            "from_s" | "to_s" => {
                let at: f64 = value.trim().parse().map_err(|_| {
                    invalid_field(StatusCode::BAD_REQUEST, key, format!("must be a number of seconds, got `{value}`"))
                })?;
                if !at.is_finite() {
                    return Err(invalid_field(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        key,
                        format!("must be a finite number, got {at}"),
                    ));
                }
                if key == "from_s" {
                    window.from_s = at;
                } else {
                    window.to_s = at;
                }
            }
            "max_rows" => {
                window.max_rows = value.parse().map_err(|_| {
                    invalid_field(StatusCode::BAD_REQUEST, "max_rows", format!("must be a whole number, got `{value}`"))
                })?;
                if window.max_rows == 0 || window.max_rows > MAX_EXPORT_ROWS {
                    return Err(invalid_field(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "max_rows",
                        format!("must be between 1 and {MAX_EXPORT_ROWS}"),
                    ));
                }
            }
            other => {
                return Err(invalid_field(
                    StatusCode::BAD_REQUEST,
                    other,
                    "unknown parameter; expected from_s, to_s or max_rows",
                ))
            }
        }
    }
    // `to_s` at or before `from_s` is an empty window: an export of no row.
    Ok(window)
}

/// The placements and exits of the VMs that started in `[from_s, to_s)` on the model's clock, as a
/// trace in the project's CSV format (docs/trace-format.md), for retraining (admin: it holds every
/// tenant's VMs). One row per VM in start order: `start_s` is its `requested_at_s` (else its
/// placement time), `end_s` its exit on the model's clock (the release's `ended_at_s`), empty while
/// it runs (censored); then `os` when any VM has one and a column per request feature. At most
/// `max_rows` rows (default 1,000,000), the earliest; `x-export-rows` says how many, and
/// `x-export-truncated` whether the window held more. Streamed: memory stays bounded.
#[utoipa::path(get, path = "/v1/export",
    params(("from_s" = Option<f64>, Query, description = "Earliest start, model clock (default: no bound)."),
           ("to_s" = Option<f64>, Query, description = "Starts before this, model clock (default: no bound); at or before `from_s`, the window is empty."),
           ("max_rows" = Option<u64>, Query, minimum = 1, maximum = 1000000000, description = "Most rows, the earliest starts first (default 1000000).")),
    responses((status = 200, description = "The trace (CSV).", body = String, content_type = "text/csv",
                   headers(("x-export-rows" = u64, description = "Rows in the body."),
                           ("x-export-truncated" = bool, description = "Whether `max_rows` left VMs of the window out."))),
              (status = 400, description = "An unknown parameter, or a value of the wrong kind (named in `errors`).", body = domain::Problem),
              (status = 401, description = "No valid admin token.", body = domain::Problem),
              (status = 403, description = "No admin token is configured: the admin API is off.", body = domain::Problem),
              (status = 422, description = "A value out of range (named in `errors`), or more distinct feature names than an export has columns for.", body = domain::Problem),
              (status = 503, description = "Another export is running, the store cannot be read, or overloaded or timed out; retry.", body = domain::Problem)),
    security(("bearer" = [])))]
async fn export(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Response {
    if let Err(response) = require_bearer(&headers, state.admin_token.as_deref()) {
        return response;
    }
    let pairs = match query {
        Ok(Query(pairs)) => pairs,
        Err(rejection) => {
            return problem(StatusCode::BAD_REQUEST, "malformed-query", "Malformed query", rejection.body_text())
        }
    };
    let window = match export_window(&pairs) {
        Ok(window) => window,
        Err(response) => return response,
    };
    let Ok(permit) = Arc::clone(&state.exports).try_acquire_owned() else {
        return retry_later(problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "export-busy",
            "Export in progress",
            "another export is running; retry when it is done",
        ));
    };
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let (chunks_tx, chunks_rx) = tokio::sync::mpsc::channel(EXPORT_CHUNKS);
    let location = state.store.clone();
    let started = Instant::now();
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let output = ChunkSink { buffer: Vec::with_capacity(EXPORT_CHUNK), chunks: chunks_tx.clone() };
        let mut sink = StreamedExport { trace: TraceExport::new(output), ready: Some(ready_tx) };
        let result = crate::store::export::export(&location, &window, &mut sink);
        let ready = sink.ready.take();
        let result = result.and_then(|rows| sink.trace.finish().map(|()| rows));
        match result {
            Ok(rows) => {
                tracing::info!(
                    rows,
                    from_s = window.from_s,
                    to_s = window.to_s,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "exported"
                );
            }
            Err(error) => {
                tracing::warn!(%error, "the export failed");
                match ready {
                    // Before the header: the handler answers with a problem.
                    Some(ready) => {
                        let _ = ready.send(Err(error));
                    }
                    // Midway: the body ends in an error, so the client sees it incomplete.
                    None => {
                        let _ = chunks_tx.blocking_send(Err(std::io::Error::other(error.to_string())));
                    }
                }
            }
        }
    });
    let header = match ready_rx.await {
        Ok(Ok(header)) => header,
        Ok(Err(ExportError::TooManyFeatures { limit })) => {
            return invalid_field(
                StatusCode::UNPROCESSABLE_ENTITY,
                "to_s",
                format!("the window's VMs carry more than {limit} distinct feature names; export a shorter window"),
            )
        }
        Ok(Err(error)) => {
            return retry_later(problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "Store unavailable",
                error.to_string(),
            ))
        }
        Err(_) => {
            return problem(StatusCode::INTERNAL_SERVER_ERROR, "internal", "Internal error", "the export stopped")
        }
    };
    let mut response = axum::body::Body::from_stream(Chunks(chunks_rx)).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/csv; charset=utf-8"));
    headers.insert("x-export-rows", HeaderValue::from(header.rows));
    let truncated = if header.rows < header.rows_in_window { "true" } else { "false" };
    headers.insert("x-export-truncated", HeaderValue::from_static(truncated));
    response
}

/// An export's output: the CSV in chunks of [`EXPORT_CHUNK`] bytes, handed to the response body
/// through a bounded channel (a slow client holds the export back rather than filling memory).
struct ChunkSink {
    buffer: Vec<u8>,
    chunks: tokio::sync::mpsc::Sender<Result<axum::body::Bytes, std::io::Error>>,
}

impl ChunkSink {
    fn send(&mut self) -> std::io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buffer, Vec::with_capacity(EXPORT_CHUNK));
        self.chunks
            .blocking_send(Ok(axum::body::Bytes::from(chunk)))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client went away"))
    }
}

impl std::io::Write for ChunkSink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buffer.extend_from_slice(bytes);
        if self.buffer.len() >= EXPORT_CHUNK {
            self.send()?;
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

/// The trace export, telling the handler once its header is known (it then answers 200 and
/// streams the rows).
struct StreamedExport {
    trace: TraceExport<ChunkSink>,
    ready: Option<tokio::sync::oneshot::Sender<Result<ExportHeader, ExportError>>>,
}

impl ExportSink for StreamedExport {
    fn header(&mut self, header: &ExportHeader) -> Result<(), ExportError> {
        self.trace.header(header)?;
        if let Some(ready) = self.ready.take() {
            // The handler is gone (timed out): writing goes on into a closed channel and stops.
            let _ = ready.send(Ok(header.clone()));
        }
        Ok(())
    }

    fn row(&mut self, vm: &ExportedVm) -> Result<(), ExportError> {
        self.trace.row(vm)
    }
}

/// The chunks of an export as the response body's stream.
struct Chunks(tokio::sync::mpsc::Receiver<Result<axum::body::Bytes, std::io::Error>>);

impl futures_core::Stream for Chunks {
    type Item = Result<axum::body::Bytes, std::io::Error>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

/// A dry run: where the VM would go, the best hosts with their rule scores and, with `why_not`,
/// why that host would not be picked. Changes nothing.
#[utoipa::path(post, path = "/v1/explain", request_body = ExplainRequest,
    responses((status = 200, description = "The dry run.", body = placement::Explanation),
              (status = 400, description = "Malformed JSON, a wrong type, a missing or unknown field.", body = domain::Problem),
              (status = 415, description = "The body is not declared `application/json`.", body = domain::Problem),
              (status = 422, description = "A field breaks a rule, or `why_not` is not a host of the inventory.", body = domain::Problem)))]
async fn explain(State(state): State<AppState>, ValidJson(request): ValidJson<ExplainRequest>) -> Response {
    let command =
        Command::Explain { vm: Box::new(request.vm), why_not: request.why_not, top: request.top.unwrap_or(5) };
    match call(&state, "explain", command).await {
        Ok(Reply::Explained(explanation)) => Json(explanation).into_response(),
        Ok(other) => unexpected(&other),
        Err(CommandError::UnknownHost(host)) => {
            invalid_field(StatusCode::UNPROCESSABLE_ENTITY, "why_not", format!("host `{host}` is not in the inventory"))
        }
        Err(error) => command_error(error),
    }
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", responses((status = 200, description = "Alive: `ok`.", body = String, content_type = "text/plain")))]
async fn healthz() -> &'static str {
    "ok"
}

/// The store is open and the allocator answers.
#[utoipa::path(get, path = "/readyz",
    responses((status = 200, description = "Ready: the store and its figures.", body = StoreStatus),
              (status = 503, description = "The store is unavailable.", body = domain::Problem)))]
async fn readyz(State(state): State<AppState>) -> Response {
    match state.worker.call(Command::Status).await {
        Ok(Reply::Status(status)) => Json(status).into_response(),
        Ok(other) => unexpected(&other),
        Err(error) => command_error(error),
    }
}

/// Prometheus metrics (text exposition format 0.0.4).
#[utoipa::path(get, path = "/metrics",
    responses((status = 200, description = "The metrics.", body = String, content_type = "text/plain"),
              (status = 404, description = "This server records no metrics.", body = domain::Problem)))]
async fn metrics_endpoint(State(state): State<AppState>) -> Response {
    match &state.metrics {
        Some(handle) => {
            if let Ok(Reply::Quality(report)) = call(&state, "quality", Command::Quality).await {
                record_quality(&report);
            }
            if let Ok(Reply::Stats(stats)) = call(&state, "stats", Command::Stats).await {
                record_stats(&stats);
            }
            service_common::telemetry::render_metrics(handle)
        }
        None => problem(StatusCode::NOT_FOUND, "no-metrics", "Metrics disabled", "no metrics recorder is installed"),
    }
}

/// The occupancy of `GET /v1/stats` as gauges, read at each scrape (O(VMs), like `/v1/stats`): hosts,
/// empty hosts, VMs and cores by predicted lifetime class, packing density, empty-to-free; and the
/// rejections since start by reason and the repredictions as counters.
fn record_stats(stats: &placement::AllocatorStats) {
    metrics::gauge!("allocator_hosts").set(stats.hosts as f64);
    metrics::gauge!("allocator_available_hosts").set(stats.available_hosts as f64);
    metrics::gauge!("allocator_empty_hosts").set(stats.empty_hosts as f64);
    metrics::gauge!("allocator_packing_density").set(stats.packing_density);
    metrics::gauge!("allocator_empty_to_free_ratio").set(stats.empty_to_free_ratio);
    metrics::gauge!("allocator_allocated_cores").set(stats.allocated_cores);
    metrics::gauge!("allocator_capacity_cores").set(stats.capacity_cores);
    metrics::gauge!("allocator_allocated_memory_gib").set(stats.allocated_memory_gib);
    metrics::gauge!("allocator_capacity_memory_gib").set(stats.capacity_memory_gib);
    for (class, vms, cores) in
        [("short", stats.vms_short, stats.cores_short), ("long", stats.vms_long, stats.cores_long)]
    {
        metrics::gauge!("allocator_vms", "class" => class).set(vms as f64);
        metrics::gauge!("allocator_vm_cores", "class" => class).set(cores);
    }
    for (reason, count) in &stats.rejections {
        metrics::counter!("allocator_rejections_total", "reason" => reason.clone()).absolute(*count);
    }
    metrics::counter!("allocator_repredictions_total").absolute(stats.repredictions);
}

/// The realized quality as gauges, per model version: `allocator_prediction_quality{version, figure}`
/// and the resolved and pending VMs.
fn record_quality(report: &domain::QualityReport) {
    for version in &report.versions {
        let v = version.version.clone();
        metrics::gauge!("allocator_prediction_outcomes_resolved", "version" => v.clone())
            .set(version.resolved_total as f64);
        metrics::gauge!("allocator_prediction_outcomes_pending", "version" => v.clone()).set(version.pending as f64);
        for (figure, value) in version.figures.named() {
            if let Some(value) = value {
                metrics::gauge!("allocator_prediction_quality", "version" => v.clone(), "figure" => figure).set(value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(query: &[(&str, &str)]) -> Vec<(String, String)> {
        query.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn host_queries_are_parsed_and_their_errors_named() {
        let filter =
            host_filter(&pairs(&[("state", "failed"), ("empty", "false"), ("limit", "3"), ("offset", "2")])).unwrap();
        assert_eq!(filter.state, Some(HostState::Failed));
        assert_eq!((filter.empty, filter.limit, filter.offset), (Some(false), 3, 2));
        assert_eq!(host_filter(&[]).unwrap().limit, DEFAULT_HOST_PAGE);
        for (query, status) in [
            (pairs(&[("state", "on")]), StatusCode::BAD_REQUEST),
            (pairs(&[("limit", "0")]), StatusCode::UNPROCESSABLE_ENTITY),
            (pairs(&[("offset", "-1")]), StatusCode::BAD_REQUEST),
            (pairs(&[("colour", "red")]), StatusCode::BAD_REQUEST),
        ] {
            assert_eq!(host_filter(&query).unwrap_err().status(), status, "{query:?}");
        }
    }

    #[test]
    fn the_openapi_document_lists_the_routes() {
        let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        for path in ["/v1/allocations", "/v1/allocations/{vm_id}", "/v1/hosts/{host_id}/drain", "/v1/explain"] {
            assert!(doc["paths"][path].is_object(), "{path}");
        }
    }
}
