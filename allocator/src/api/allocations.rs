//! `/v1/allocations` and `/v1/explain`: placing and releasing VMs, where a VM is, and the dry run.

// axum's rejections are `Response`s; boxing them would only obscure the handlers.
#![allow(clippy::result_large_err)]

use super::{call, call_timed, command_error, field_problem, finite_time, path_param, query_param, AppState};
use crate::durable::{Allocate, CommandError, Explain, GetAllocation, RecordAt, Release, VmInfo};
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use domain::ProblemKind;
use domain::{
    AllocationDecision, AllocationOutcome, AllocationRequest, ExplainRequest, RecordPlacement, Rejection,
    RejectionCode, TenantId, VmId, ZoneId,
};
use serde::Deserialize;
use service_common::openapi::{BadJson, BadPathOrQuery, BrokenRule, NotJson};
use service_common::timing::{server_timing, Timed, SERVER_TIMING};
use service_common::ValidJson;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(allocate))
        .routes(routes!(get_allocation, release, record))
        .routes(routes!(explain))
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
              (status = 409, description = "A VM id is placed already with other details (`vm-id-reused`), or part of the gang is (`partial-gang`).", body = domain::Problem),
              (status = 503, description = "The change could not be made durable and was undone, the store is unavailable, or overloaded or timed out; retry.", body = domain::Problem),
              BadJson, NotJson, BrokenRule))]
async fn allocate(State(state): State<AppState>, body: Timed<ValidJson<AllocationRequest>>) -> Response {
    let Timed { value: ValidJson(request), started, took: parse } = body;
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
    let (reply, stages) = call_timed(&state, "allocate", Allocate(request)).await;
    let mut response = match reply {
        Ok(decision) => {
            let status = if decision.is_placed() && !decision.replayed { StatusCode::CREATED } else { StatusCode::OK };
            (status, Json(decision)).into_response()
        }
        Err(error) => command_error(error),
    };
    // Where the time went, for the control service to pass on (issue 32): reading and parsing the
    // body, the worker's stages, and the whole handler with the answer's encoding.
    let stages = stages.unwrap_or_default();
    let timing = server_timing([
        ("parse", parse),
        ("queue", stages.queue),
        ("decide", stages.decide),
        ("commit", stages.commit),
        ("wake", stages.wake),
        ("total", started.elapsed()),
    ]);
    response.headers_mut().insert(SERVER_TIMING, timing);
    response
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
    let query = query_param(query)?;
    match query.tenant {
        Some(tenant) => match domain::validate::check_id(&tenant, "tenant") {
            Ok(()) => Ok(Some(TenantId(tenant))),
            Err(error) => Err(field_problem(ProblemKind::InvalidRequest, error.field(), error.message())),
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
              (status = 404, description = "Not placed (or another tenant's VM, with `tenant`).", body = domain::Problem),
              (status = 422, description = "`tenant` is not a valid id.", body = domain::Problem),
              (status = 503, description = "The release could not be made durable, or overloaded or timed out; retry.", body = domain::Problem),
              BadPathOrQuery))]
async fn release(
    State(state): State<AppState>,
    vm_id: Result<Path<String>, PathRejection>,
    query: Result<Query<ReleaseQuery>, QueryRejection>,
) -> Response {
    let (query, ended_at_s) = match query {
        Ok(Query(ReleaseQuery { tenant, ended_at_s })) => (Ok(Query(OwnerQuery { tenant })), ended_at_s),
        Err(rejection) => (Err(rejection), None),
    };
    let ended_at_s = match finite_time("ended_at_s", ended_at_s) {
        Ok(at) => at,
        Err(response) => return response,
    };
    let (vm, owner) = match vm_and_owner(vm_id, query) {
        Ok(parsed) => parsed,
        Err(response) => return response,
    };
    match call(&state, "release", Release { vm, owner, ended_at_s }).await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(error) => command_error(error),
    }
}

/// Where a VM is placed. With `?tenant=`, another tenant's VM answers 404 as if it did not exist.
#[utoipa::path(get, path = "/v1/allocations/{vm_id}",
    params(("vm_id" = String, Path, description = "The VM's id."),
           ("tenant" = Option<String>, Query, description = "Show only a VM of this tenant (the id charset).", pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")),
    responses((status = 200, description = "Where the VM is placed.", body = VmInfo),
              (status = 404, description = "Not placed (or another tenant's VM, with `tenant`).", body = domain::Problem),
              (status = 422, description = "`tenant` is not a valid id.", body = domain::Problem),
              BadPathOrQuery))]
async fn get_allocation(
    State(state): State<AppState>,
    vm_id: Result<Path<String>, PathRejection>,
    query: Result<Query<OwnerQuery>, QueryRejection>,
) -> Response {
    let (vm_id, owner) = match vm_and_owner(vm_id, query) {
        Ok(parsed) => parsed,
        Err(response) => return response,
    };
    match call(&state, "get-allocation", GetAllocation(vm_id.clone())).await {
        // One reply is one snapshot: the owner is checked on the very answer sent.
        Ok(info) if owner.as_ref().is_none_or(|owner| *owner == info.tenant_id) => Json(info).into_response(),
        Ok(_) => command_error(CommandError::UnknownVm(vm_id)),
        Err(error) => command_error(error),
    }
}

/// Records that a VM is on a host, whatever this allocator decided: a cloud's own scheduler put it
/// there (or retried, or moved it). Placed there when it is not placed (with `request`'s facts),
/// moved there from another host (no exit is recorded), left as it is when it is there: repeating
/// it changes nothing. The host's state does not matter (the cloud put it there); its capacity
/// does: a VM that does not fit is refused (409) and nothing changes.
#[utoipa::path(put, path = "/v1/allocations/{vm_id}", request_body = RecordPlacement,
    params(("vm_id" = String, Path, description = "The VM's id; `request.vm_id` must be the same.")),
    responses((status = 200, description = "What the record changed.", body = domain::RecordedPlacement),
              (status = 404, description = "The host is not in the inventory (`unknown-host`).", body = domain::Problem),
              (status = 409, description = "The VM does not fit on the host (`does-not-fit`).", body = domain::Problem),
              (status = 503, description = "The change could not be made durable and was undone, or overloaded or timed out; retry.", body = domain::Problem),
              BadJson, NotJson, BrokenRule, BadPathOrQuery))]
async fn record(
    State(state): State<AppState>,
    vm_id: Result<Path<String>, PathRejection>,
    ValidJson(body): ValidJson<RecordPlacement>,
) -> Response {
    let vm_id = match path_param(vm_id) {
        Ok(id) => id,
        Err(response) => return response,
    };
    if body.request.vm_id.as_str() != vm_id {
        let detail = format!("must be the path's VM id `{vm_id}`, got `{}`", body.request.vm_id);
        return field_problem(ProblemKind::InvalidRequest, "request.vm_id", detail);
    }
    if let Some(zone) = body.request.zone.as_ref().filter(|zone| !state.zones.contains(zone)) {
        let detail = format!("zone `{zone}` is not served here");
        return field_problem(ProblemKind::InvalidRequest, "request.zone", detail);
    }
    match call(&state, "record", RecordAt { vm: body.request, host: body.host_id }).await {
        Ok(recorded) => {
            tracing::info!(vm = %recorded.vm_id, host = %recorded.host_id, recorded = ?recorded.recorded, "placement recorded");
            Json(recorded).into_response()
        }
        Err(error) => command_error(error),
    }
}

/// A dry run: where the VM would go, the best hosts with their rule scores and, with `why_not`,
/// why that host would not be picked. Changes nothing.
#[utoipa::path(post, path = "/v1/explain", request_body = ExplainRequest,
    responses((status = 200, description = "The dry run.", body = placement::Explanation),
              (status = 422, description = "A field breaks a rule, or `why_not` is not a host of the inventory.", body = domain::Problem),
              BadJson, NotJson))]
async fn explain(State(state): State<AppState>, ValidJson(request): ValidJson<ExplainRequest>) -> Response {
    let command = Explain { vm: request.vm, why_not: request.why_not, top: request.top.unwrap_or(5) };
    match call(&state, "explain", command).await {
        Ok(explanation) => Json(explanation).into_response(),
        Err(CommandError::UnknownHost(host)) => {
            field_problem(ProblemKind::InvalidRequest, "why_not", format!("host `{host}` is not in the inventory"))
        }
        Err(error) => command_error(error),
    }
}
