//! `/v1/hosts`: listing hosts, one host, adding, changing or removing one while the allocator
//! runs (a cloud's inventory), and draining, failing or restoring one (admin).

// axum's rejections are `Response`s; boxing them would only obscure the handlers.
#![allow(clippy::result_large_err)]

use super::{
    call, command_error, field_problem, path_param, query_param, AppState, NotDurable, DEFAULT_HOST_PAGE, MAX_HOST_PAGE,
};
use crate::durable::{
    GetHost, HostDetail, HostFilter, HostPage, HostStateChange, ListHosts, RemoveHost, SetHostState, UpdateHost,
};
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use domain::ProblemKind;
use domain::{ClusterId, HostId, HostState, HostUpdate, RackId};
use service_common::auth::AdminAuth;
use service_common::openapi::AdminRefusals;
use service_common::openapi::{BadJson, BrokenRule, NotJson};
use service_common::ValidJson;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_hosts))
        .routes(routes!(get_host, put_host, delete_host))
        .routes(routes!(drain_host))
        .routes(routes!(fail_host))
        .routes(routes!(restore_host))
}

service_common::problem_responses! {
    /// A route on one host whose path does not parse, or names no host of the inventory.
    struct HostRefusals {
        400: "A malformed path.",
        404: "No such host.",
    }
}

/// Parses the query of `GET /v1/hosts`, naming the field at fault.
fn host_filter(pairs: &[(String, String)]) -> Result<HostFilter, Response> {
    let mut filter = HostFilter { limit: DEFAULT_HOST_PAGE, ..HostFilter::default() };
    let number = |field: &str, value: &str| {
        value.parse::<usize>().map_err(|_| {
            field_problem(ProblemKind::MalformedRequest, field, format!("must be a whole number, got `{value}`"))
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
                        return Err(field_problem(
                            ProblemKind::MalformedRequest,
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
                        return Err(field_problem(
                            ProblemKind::MalformedRequest,
                            "empty",
                            format!("must be `true` or `false`, got `{other}`"),
                        ))
                    }
                })
            }
            "limit" => {
                filter.limit = number("limit", value)?;
                if filter.limit == 0 || filter.limit > MAX_HOST_PAGE {
                    return Err(field_problem(
                        ProblemKind::InvalidRequest,
                        "limit",
                        format!("must be between 1 and {MAX_HOST_PAGE}"),
                    ));
                }
            }
            "offset" => filter.offset = number("offset", value)?,
            other => {
                return Err(field_problem(
                    ProblemKind::MalformedRequest,
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
    let filter = match query_param(query).and_then(|pairs| host_filter(&pairs)) {
        Ok(filter) => filter,
        Err(response) => return response,
    };
    match call(&state, "list-hosts", ListHosts(filter)).await {
        Ok(page) => Json(page).into_response(),
        Err(error) => command_error(error),
    }
}

/// One host: capacity, used, free, state, lifetime class and its VMs in full.
#[utoipa::path(get, path = "/v1/hosts/{host_id}", params(("host_id" = String, Path, description = "The host's id.")),
    responses((status = 200, description = "The host and its VMs.", body = HostDetail), HostRefusals))]
async fn get_host(State(state): State<AppState>, host_id: Result<Path<String>, PathRejection>) -> Response {
    let host_id = match path_param(host_id) {
        Ok(id) => id,
        Err(response) => return response,
    };
    match call(&state, "get-host", GetHost(HostId(host_id))).await {
        Ok(detail) => Json(detail).into_response(),
        Err(error) => command_error(error),
    }
}

/// Adds a host to the inventory, or changes its capacity, state, cluster or rack: what a cloud's
/// inventory says of its compute hosts (the OpenStack plug-in's reconciliation, docs/openstack.md).
/// Durable in the store, and seen by every agent of the zone. Refused (409, nothing changed): a
/// capacity below what the host's VMs use. Repeating it changes nothing.
#[utoipa::path(put, path = "/v1/hosts/{host_id}", request_body = HostUpdate,
    params(("host_id" = String, Path, description = "The host's id (the id charset).", pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")),
    responses((status = 200, description = "The host as the inventory now has it (`added`: it is new).", body = domain::HostUpdated),
              (status = 409, description = "The host's VMs use more than the capacity given (`host-in-use`).", body = domain::Problem),
              (status = 422, description = "A field breaks a rule, or the host id is not a valid id.", body = domain::Problem),
              NotDurable, BadJson, NotJson, BrokenRule))]
async fn put_host(
    State(state): State<AppState>,
    host_id: Result<Path<String>, PathRejection>,
    ValidJson(update): ValidJson<HostUpdate>,
) -> Response {
    let host = match checked_host(host_id) {
        Ok(host) => host,
        Err(response) => return response,
    };
    match call(&state, "put-host", UpdateHost { host, update }).await {
        Ok(updated) => {
            tracing::info!(host = %updated.host_id, added = updated.added, capacity = %updated.entry.capacity, state = ?updated.state, "inventory host set");
            Json(updated).into_response()
        }
        Err(error) => command_error(error),
    }
}

/// Removes an empty host from the inventory (its compute host left the cloud). Refused (409,
/// nothing changed) while VMs are on it or migrating to it.
#[utoipa::path(delete, path = "/v1/hosts/{host_id}", params(("host_id" = String, Path, description = "The host's id.")),
    responses((status = 204, description = "Removed."),
              (status = 409, description = "VMs are on it, or arriving (`host-in-use`).", body = domain::Problem),
              HostRefusals, NotDurable))]
async fn delete_host(State(state): State<AppState>, host_id: Result<Path<String>, PathRejection>) -> Response {
    let host = match path_param(host_id) {
        Ok(id) => HostId(id),
        Err(response) => return response,
    };
    match call(&state, "delete-host", RemoveHost(host.clone())).await {
        Ok(()) => {
            tracing::info!(%host, "inventory host removed");
            axum::http::StatusCode::NO_CONTENT.into_response()
        }
        Err(error) => command_error(error),
    }
}

/// A host id from the path, checked like every id a client sends.
fn checked_host(host_id: Result<Path<String>, PathRejection>) -> Result<HostId, Response> {
    let host = path_param(host_id)?;
    domain::validate::check_id(&host, "host_id")
        .map_err(|error| field_problem(ProblemKind::InvalidRequest, error.field(), error.message()))?;
    Ok(HostId(host))
}

/// The admin routes that set a host's state: each is this with its state.
async fn set_host_state(
    state: &AppState,
    host_id: Result<Path<String>, PathRejection>,
    new_state: HostState,
) -> Response {
    let host_id = match path_param(host_id) {
        Ok(id) => id,
        Err(response) => return response,
    };
    match call(state, "set-host-state", SetHostState { host: HostId(host_id), state: new_state }).await {
        Ok(change) => {
            tracing::info!(host = %change.host_id, previous = ?change.previous, state = ?change.state, "host state set");
            Json(change).into_response()
        }
        Err(error) => command_error(error),
    }
}

/// Drains a host (admin): it takes no new VM; its VMs stay.
#[utoipa::path(post, path = "/v1/hosts/{host_id}/drain", params(("host_id" = String, Path, description = "The host's id.")),
    responses((status = 200, description = "The host's previous and new state.", body = HostStateChange),
              HostRefusals, AdminRefusals, NotDurable),
    security(("bearer" = [])))]
async fn drain_host(
    State(state): State<AppState>,
    _: AdminAuth,
    host_id: Result<Path<String>, PathRejection>,
) -> Response {
    set_host_state(&state, host_id, HostState::Unavailable).await
}

/// Marks a host failed (admin): it takes no new VM.
#[utoipa::path(post, path = "/v1/hosts/{host_id}/fail", params(("host_id" = String, Path, description = "The host's id.")),
    responses((status = 200, description = "The host's previous and new state.", body = HostStateChange),
              HostRefusals, AdminRefusals, NotDurable),
    security(("bearer" = [])))]
async fn fail_host(
    State(state): State<AppState>,
    _: AdminAuth,
    host_id: Result<Path<String>, PathRejection>,
) -> Response {
    set_host_state(&state, host_id, HostState::Failed).await
}

/// Makes a host available again (admin).
#[utoipa::path(post, path = "/v1/hosts/{host_id}/restore", params(("host_id" = String, Path, description = "The host's id.")),
    responses((status = 200, description = "The host's previous and new state.", body = HostStateChange),
              HostRefusals, AdminRefusals, NotDurable),
    security(("bearer" = [])))]
async fn restore_host(
    State(state): State<AppState>,
    _: AdminAuth,
    host_id: Result<Path<String>, PathRejection>,
) -> Response {
    set_host_state(&state, host_id, HostState::Available).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

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
}
