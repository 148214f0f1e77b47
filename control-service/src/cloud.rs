//! What a cloud's control plane reports to the zone's allocator (OpenStack Nova through the
//! plug-in of `openstack/`, docs/openstack.md): where a VM really is (`PUT /v1/allocate/{vm_id}`,
//! predicted here when the allocator has not placed it yet) and its compute hosts as they come,
//! change and go (`PUT` and `DELETE /v1/zones/{zone}/hosts/{host_id}`). Operator's key only: these
//! speak for the whole cloud, not for a tenant.

// Handlers return early with a ready `Response` (a problem body); it is built once per request.
#![allow(clippy::result_large_err)]

use crate::control::unix_now_s;
use crate::dashboard::{forward, known_zone};
use crate::http::{operator, request_id, AppState, NoApiKey, OperatorOnly};
use crate::upstream::encode_segment;
use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use domain::{HistoryEvent, HostUpdate, ProblemKind, RecordOutcome, RecordPlacement, RecordedPlacement, ZoneId};
use serde::Deserialize;
use service_common::openapi::NotJson;
use service_common::problem::{field_problem, json_body, path_param, problem, query_param};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(record)).routes(routes!(put_host, delete_host))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordQuery {
    zone: Option<String>,
}

/// Records that a VM is on a host, whatever the allocator decided: a cloud's scheduler put it
/// there, retried elsewhere, or moved it (the allocator's `PUT /v1/allocations/{vm_id}`). A VM the
/// allocator has not placed is predicted first, as `POST /v1/allocate` predicts, and placed there.
/// Repeating it changes nothing. The zone is `?zone=`, else the request's, else the default.
#[utoipa::path(put, path = "/v1/allocate/{vm_id}", request_body = domain::RecordPlacement,
    params(("vm_id" = String, Path, description = "The VM's id; `request.vm_id` must be the same.", pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$", min_length = 1, max_length = 128),
           ("zone" = Option<String>, Query, description = "The VM's zone.")),
    responses((status = 200, description = "What the record changed (the allocator's `RecordedPlacement`).", body = domain::RecordedPlacement),
              (status = 400, description = "Malformed JSON, path or query (named in `errors`).", body = domain::Problem),
              (status = 404, description = "The host is not in the zone's inventory (`unknown-host`).", body = domain::Problem),
              (status = 409, description = "The VM does not fit on the host (`does-not-fit`).", body = domain::Problem),
              (status = 422, description = "A field breaks a rule, or an unknown zone (named in `errors`).", body = domain::Problem),
              (status = 502, description = "The zone's allocator could not be reached.", body = domain::Problem),
              (status = 503, description = "The allocator could not make the change durable; retry.", body = domain::Problem),
              NoApiKey, OperatorOnly, NotJson),
    security(("bearer" = [])))]
async fn record(
    State(state): State<AppState>,
    headers: HeaderMap,
    vm_id: Result<Path<String>, PathRejection>,
    query: Result<Query<RecordQuery>, QueryRejection>,
    body: Bytes,
) -> Response {
    let control = &state.control;
    if let Err(response) = operator(control, &headers) {
        return response;
    }
    let (vm_id, query) = match (path_param(vm_id), query_param(query)) {
        (Ok(vm_id), Ok(query)) => (vm_id, query),
        (Err(response), _) | (_, Err(response)) => return response,
    };
    let mut body: RecordPlacement = match json_body(&headers, &body, &control.limits) {
        Ok(body) => body,
        Err(response) => return response,
    };
    if body.request.vm_id.as_str() != vm_id {
        let detail = format!("must be the path's VM id `{vm_id}`, got `{}`", body.request.vm_id);
        return field_problem(ProblemKind::InvalidRequest, "request.vm_id".to_owned(), detail);
    }
    if body.request.prediction.is_some() {
        let detail = "is filled in by the control service; leave it out".to_owned();
        return field_problem(ProblemKind::InvalidRequest, "request.prediction".to_owned(), detail);
    }
    let zone = query.zone.map(ZoneId).or_else(|| body.request.zone.clone()).unwrap_or(control.default_zone.clone());
    if !control.allocators.contains(&zone) {
        return problem(ProblemKind::UnknownZone, format!("zone `{zone}` is not routed by this control service"));
    }
    let arrival_s = unix_now_s();
    let request_id = request_id(&headers);
    // Predicted only when the allocator has not placed it: it keeps the prediction it has.
    let path = format!("/v1/allocations/{}", encode_segment(&vm_id));
    let placed =
        matches!(control.allocators.get(&zone, &path, request_id).await, Ok(answer) if answer.status.is_success());
    if !placed {
        let clock_s = control.started.elapsed().as_secs_f64();
        let resolved =
            control.resolver.resolve(std::slice::from_ref(&body.request), arrival_s, clock_s, request_id).await;
        body.request.prediction = resolved.predictions.into_iter().next();
    }
    let facts = body.request.facts.clone();
    let answer = control.allocators.put_json(&zone, &path, &body, request_id).await;
    if let Ok(answer) = &answer {
        let recorded: Option<RecordedPlacement> =
            answer.status.is_success().then(|| serde_json::from_slice(&answer.body).ok()).flatten();
        if recorded.is_some_and(|r| r.recorded == RecordOutcome::Placed) {
            control.record_history(HistoryEvent::Started {
                vm_id,
                tenant_id: facts.tenant_id.to_string(),
                vm_type: facts.vm_type,
                at_s: facts.requested_at_s.unwrap_or(arrival_s),
            });
        }
    }
    forward(answer)
}

/// Adds a host to the zone's inventory, or changes its capacity, state or place (the allocator's
/// `PUT /v1/hosts/{host_id}`): a cloud's compute host as its inventory says.
#[utoipa::path(put, path = "/v1/zones/{zone}/hosts/{host_id}", request_body = domain::HostUpdate,
    params(("zone" = String, Path, description = "A zone this control service routes."),
           ("host_id" = String, Path, description = "The host's id (the id charset).")),
    responses((status = 200, description = "The host as the inventory now has it (the allocator's `HostUpdated`).", body = domain::HostUpdated),
              (status = 400, description = "Malformed JSON or path (named in `errors`).", body = domain::Problem),
              (status = 404, description = "No such zone.", body = domain::Problem),
              (status = 409, description = "The host's VMs use more than the capacity given (`host-in-use`).", body = domain::Problem),
              (status = 422, description = "A field breaks a rule (named in `errors`).", body = domain::Problem),
              (status = 502, description = "The zone's allocator could not be reached.", body = domain::Problem),
              NoApiKey, OperatorOnly, NotJson),
    security(("bearer" = [])))]
async fn put_host(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
    body: Bytes,
) -> Response {
    let (zone, host_id) = match zone_host(&state, &headers, path) {
        Ok(pair) => pair,
        Err(response) => return response,
    };
    let update: HostUpdate = match json_body(&headers, &body, &state.control.limits) {
        Ok(update) => update,
        Err(response) => return response,
    };
    let path = format!("/v1/hosts/{}", encode_segment(&host_id));
    forward(state.control.allocators.put_json(&zone, &path, &update, request_id(&headers)).await)
}

/// Removes an empty host from the zone's inventory (the allocator's `DELETE /v1/hosts/{host_id}`);
/// 409 while VMs are on it.
#[utoipa::path(delete, path = "/v1/zones/{zone}/hosts/{host_id}",
    params(("zone" = String, Path, description = "A zone this control service routes."),
           ("host_id" = String, Path, description = "The host's id.")),
    responses((status = 204, description = "Removed."),
              (status = 404, description = "No such zone or host.", body = domain::Problem),
              (status = 409, description = "VMs are on it (`host-in-use`).", body = domain::Problem),
              (status = 502, description = "The zone's allocator could not be reached.", body = domain::Problem),
              NoApiKey, OperatorOnly),
    security(("bearer" = [])))]
async fn delete_host(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Response {
    let (zone, host_id) = match zone_host(&state, &headers, path) {
        Ok(pair) => pair,
        Err(response) => return response,
    };
    let path = format!("/v1/hosts/{}", encode_segment(&host_id));
    forward(state.control.allocators.delete(&zone, &path, request_id(&headers)).await)
}

/// The operator's zone (404 for one not routed here) and host of a host route's path, checked as
/// the zone views' `GET` of the same path checks them.
fn zone_host(
    state: &AppState,
    headers: &HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<(ZoneId, String), Response> {
    let (zone, host_id) = path_param(path)?;
    Ok((known_zone(state, headers, Ok(Path(zone)))?, host_id))
}
