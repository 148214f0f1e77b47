//! `/v1/drains` and `/v1/migrations`: emptying hosts by live migration (LARS, admin).

use super::{call, command_error, finite_time, path_param, query_param, AppState, NotDurable};
use crate::durable::{CompleteMigration, DrainStatus, FailMigration, StartDrain};
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use domain::VmId;
use placement::defrag::{DrainReport, DrainRequest, Migration};
use serde::Deserialize;
use service_common::auth::AdminAuth;
use service_common::openapi::{AdminRefusals, BadJson, BadPathOrQuery, NotJson};
use service_common::ValidJson;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(drain_status, start_drain))
        .routes(routes!(complete_migration))
        .routes(routes!(fail_migration))
}

/// Starts draining hosts (admin; LARS): they take no new VM and their VMs migrate away, at most
/// `max_in_flight` at a time, longest predicted remaining lifetime first (`order:
/// "longest-remaining-first"`, the default) or in arrival order (`"arrival"`). Each migration
/// reserves the VM's demand on a target the placement policy picks; confirm it with
/// `POST /v1/migrations/{vm_id}/complete` once the live migration finished.
#[utoipa::path(post, path = "/v1/drains", request_body = DrainRequest,
    responses((status = 201, description = "The drain started.", body = DrainReport),
              (status = 404, description = "A listed host is not in the inventory.", body = domain::Problem),
              (status = 409, description = "A drain is in progress.", body = domain::Problem),
              (status = 422, description = "A field breaks a rule, or there is no host to drain.", body = domain::Problem),
              BadJson, NotJson, AdminRefusals, NotDurable),
    security(("bearer" = [])))]
async fn start_drain(
    State(state): State<AppState>,
    _: AdminAuth,
    ValidJson(request): ValidJson<DrainRequest>,
) -> Response {
    match call(&state, "start-drain", StartDrain(request)).await {
        Ok(report) => {
            tracing::info!(hosts = ?report.hosts, in_flight = report.in_flight.len(), "drain started");
            (StatusCode::CREATED, Json(report)).into_response()
        }
        Err(error) => command_error(error),
    }
}

/// Where the current (or last) drain stands: migrations performed, avoided (the VM exited before
/// its turn), in flight, queued.
#[utoipa::path(get, path = "/v1/drains",
    responses((status = 200, description = "The current or last drain.", body = DrainReport),
              (status = 404, description = "No drain was ever started.", body = domain::Problem)))]
async fn drain_status(State(state): State<AppState>) -> Response {
    match call(&state, "drain-status", DrainStatus).await {
        Ok(report) => Json(report).into_response(),
        Err(error) => command_error(error),
    }
}

/// `?completed_at_s=` of a migration's completion.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CompletedQuery {
    completed_at_s: Option<f64>,
}

/// Confirms a migration (admin): the VM now runs on its target, its source capacity is freed, and
/// the next VM of the drain starts migrating.
#[utoipa::path(post, path = "/v1/migrations/{vm_id}/complete",
    params(("vm_id" = String, Path, description = "The migrating VM's id."),
           ("completed_at_s" = Option<f64>, Query, description = "When it finished on the model's clock (that of `requested_at_s`): a service on the request clock (`clock = \"request\"`) runs at it; the latest request time seen when absent.")),
    responses((status = 200, description = "The completed migration.", body = Migration),
              (status = 422, description = "`completed_at_s` is not a finite number.", body = domain::Problem),
              (status = 404, description = "The VM is not migrating (or no drain is running).", body = domain::Problem),
              BadPathOrQuery, AdminRefusals, NotDurable),
    security(("bearer" = [])))]
async fn complete_migration(
    State(state): State<AppState>,
    _: AdminAuth,
    vm_id: Result<Path<String>, PathRejection>,
    query: Result<Query<CompletedQuery>, QueryRejection>,
) -> Response {
    let vm_id = match path_param(vm_id) {
        Ok(id) => id,
        Err(response) => return response,
    };
    let completed_at_s = match query_param(query).and_then(|query| finite_time("completed_at_s", query.completed_at_s))
    {
        Ok(at) => at,
        Err(response) => return response,
    };
    let complete = CompleteMigration { vm: VmId(vm_id), completed_at_s };
    match call(&state, "complete-migration", complete).await {
        Ok(migration) => Json(migration).into_response(),
        Err(error) => command_error(error),
    }
}

/// Reports a migration that failed (admin): the cloud's live migration did not move the VM (it
/// failed, or was cancelled before it did). The reservation on its target is given back and the VM
/// stays on its source; a host consolidation was emptying goes back to service (counted in
/// `migrations_failed`); a drain's VM waits for its turn again.
#[utoipa::path(post, path = "/v1/migrations/{vm_id}/fail",
    params(("vm_id" = String, Path, description = "The migrating VM's id.")),
    responses((status = 200, description = "The migration given up.", body = Migration),
              (status = 404, description = "The VM is not migrating (or no drain or consolidation is on).", body = domain::Problem),
              BadPathOrQuery, AdminRefusals, NotDurable),
    security(("bearer" = [])))]
async fn fail_migration(
    State(state): State<AppState>,
    _: AdminAuth,
    vm_id: Result<Path<String>, PathRejection>,
) -> Response {
    let vm_id = match path_param(vm_id) {
        Ok(id) => id,
        Err(response) => return response,
    };
    match call(&state, "fail-migration", FailMigration { vm: VmId(vm_id) }).await {
        Ok(migration) => Json(migration).into_response(),
        Err(error) => command_error(error),
    }
}
