//! The operator's console: the web dashboard at `/dashboard` (HTML, JavaScript and CSS embedded in
//! the binary: no CDN, no build step) and the read-only zone views it reads besides `/v1/stats`.
//!
//! The zone views pass the zone allocator's public API on as it answered (`GET /v1/hosts`,
//! `GET /v1/hosts/{host_id}`, `GET /v1/consolidation`, `POST /v1/explain`), so the page needs no other origin and the
//! allocators need no CORS. Like `/v1/stats` they show every tenant's VMs, so they take the
//! operator's key (or open mode); the page itself holds no data and is served to anyone.

// Handlers return early with a ready `Response` (a problem body), as in `api`.
#![allow(clippy::result_large_err)]

use crate::http::{
    operator, pass_through, request_id, upstream_failure, AllocatorUnreachable, AppState, NoApiKey, OperatorOnly,
};
use crate::upstream::encode_segment;
use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Json;
use domain::ProblemKind;
use domain::ZoneId;
use serde::Serialize;
use service_common::problem::{field_problem, path_param, problem, query_param};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

const INDEX_HTML: &str = include_str!("../assets/dashboard/index.html");
const APP_JS: &str = include_str!("../assets/dashboard/app.js");
const APP_CSS: &str = include_str!("../assets/dashboard/app.css");

/// The host-listing filters the allocator knows; anything else is refused here, so nothing but
/// these reaches the allocator's URL.
const HOST_FILTERS: [&str; 6] = ["state", "rack", "cluster", "empty", "limit", "offset"];

/// The dashboard's page and assets (not part of the API document), and the zone views.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .route("/dashboard", get(|| asset("text/html; charset=utf-8", INDEX_HTML)))
        .route("/dashboard/", get(|| asset("text/html; charset=utf-8", INDEX_HTML)))
        .route("/dashboard/app.js", get(|| asset("text/javascript; charset=utf-8", APP_JS)))
        .route("/dashboard/app.css", get(|| asset("text/css; charset=utf-8", APP_CSS)))
        .routes(routes!(history))
        .routes(routes!(zones))
        .routes(routes!(zone_hosts))
        .routes(routes!(zone_host))
        .routes(routes!(zone_consolidation))
        .routes(routes!(zone_explain))
}

async fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // The assets change with the binary: revalidate rather than cache across upgrades.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // Everything the page loads comes from this service.
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'",
        ),
    );
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    response
}

/// The zones this control service routes, with their allocation agents.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ZoneList {
    /// Where a request without a `zone` goes.
    pub default_zone: String,
    pub zones: Vec<ZoneAgents>,
}

/// One zone and its agents.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ZoneAgents {
    pub zone: String,
    pub agents: Vec<AgentHealth>,
}

/// One allocation agent as the health checks see it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AgentHealth {
    pub url: String,
    /// It answered its last readiness probe.
    pub ready: bool,
}

/// The control service's counters and its zones' occupancy over the last hour (`[dashboard]`
/// `history_samples` taken every `history_interval_ms`), oldest first. Fleet-wide: the operator's
/// key (or open mode).
#[utoipa::path(get, path = "/v1/stats/history",
    responses((status = 200, description = "The samples.", body = crate::timeline::History), NoApiKey, OperatorOnly),
    security(("bearer" = [])))]
pub async fn history(State(state): State<AppState>, headers: HeaderMap) -> Response {
    match operator(&state.control, &headers) {
        Ok(_) => Json(state.control.timeline.history()).into_response(),
        Err(response) => response,
    }
}

/// The zones and their allocation agents' readiness. Fleet-wide: the operator's key (or open mode).
#[utoipa::path(get, path = "/v1/zones",
    responses((status = 200, description = "The zones.", body = ZoneList), NoApiKey, OperatorOnly),
    security(("bearer" = [])))]
pub async fn zones(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if let Err(response) = operator(&state.control, &headers) {
        return response;
    }
    let zones = state
        .control
        .allocators
        .zones()
        .map(|(zone, agents)| ZoneAgents {
            zone: zone.to_string(),
            agents: agents.iter().map(|a| AgentHealth { url: a.base.clone(), ready: a.is_ready() }).collect(),
        })
        .collect();
    Json(ZoneList { default_zone: state.control.default_zone.to_string(), zones }).into_response()
}

/// The zone's hosts as its allocator lists them (`GET /v1/hosts` of the allocator: `state`, `rack`,
/// `cluster`, `empty`, `limit` up to 10,000 and `offset`). Fleet-wide: the operator's key.
#[utoipa::path(get, path = "/v1/zones/{zone}/hosts",
    params(("zone" = String, Path, description = "A zone this control service routes."),
           ("state" = Option<domain::HostState>, Query, description = "Only hosts in this state."),
           ("rack" = Option<String>, Query, description = "Only this rack's hosts."),
           ("cluster" = Option<String>, Query, description = "Only this cluster's hosts."),
           ("empty" = Option<bool>, Query, description = "Only hosts with no VM (`true`) or with some (`false`)."),
           ("limit" = Option<u64>, Query, minimum = 1, maximum = 10000, description = "Hosts per page (default 1,000)."),
           ("offset" = Option<u64>, Query, description = "Hosts to skip.")),
    responses((status = 200, description = "A page of hosts (the allocator's `HostPage`).", content_type = "application/json"),
              (status = 400, description = "An unknown or malformed filter.", body = domain::Problem),
              (status = 422, description = "`limit` or `offset` out of range.", body = domain::Problem),
              (status = 404, description = "No such zone.", body = domain::Problem),
              NoApiKey, OperatorOnly, AllocatorUnreachable),
    security(("bearer" = [])))]
pub async fn zone_hosts(
    State(state): State<AppState>,
    headers: HeaderMap,
    zone: Result<Path<String>, PathRejection>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Response {
    let zone = match known_zone(&state, &headers, zone) {
        Ok(zone) => zone,
        Err(response) => return response,
    };
    let pairs = match query_param(query) {
        Ok(pairs) => pairs,
        Err(response) => return response,
    };
    let mut path = String::from("/v1/hosts");
    for (i, (key, value)) in pairs.iter().enumerate() {
        if !HOST_FILTERS.contains(&key.as_str()) {
            return problem(
                ProblemKind::MalformedQuery,
                format!("unknown filter `{key}`; the filters are {}", HOST_FILTERS.join(", ")),
            );
        }
        // The document says int64: beyond it the allocator would answer an empty page, not an error.
        if key == "offset" && value.parse::<u128>().is_ok_and(|offset| offset > i64::MAX as u128) {
            return field_problem(
                ProblemKind::InvalidRequest,
                "offset".to_owned(),
                format!("must be at most {}, got {value}", i64::MAX),
            );
        }
        path.push(if i == 0 { '?' } else { '&' });
        path.push_str(&format!("{key}={}", encode_segment(value)));
    }
    forward(state.control.allocators.get(&zone, &path, request_id(&headers)).await)
}

/// One host of the zone with its VMs in full (the allocator's `GET /v1/hosts/{host_id}`): their
/// demands, placement times and predictions. Fleet-wide: the operator's key.
#[utoipa::path(get, path = "/v1/zones/{zone}/hosts/{host_id}",
    params(("zone" = String, Path, description = "A zone this control service routes."),
           ("host_id" = String, Path, description = "The host's id.")),
    responses((status = 200, description = "The host and its VMs (the allocator's `HostDetail`).", content_type = "application/json"),
              (status = 404, description = "No such zone or host.", body = domain::Problem),
              NoApiKey, OperatorOnly, AllocatorUnreachable),
    security(("bearer" = [])))]
pub async fn zone_host(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Response {
    let (zone, host_id) = match path_param(path) {
        Ok(pair) => pair,
        Err(response) => return response,
    };
    let zone = match known_zone(&state, &headers, Ok(Path(zone))) {
        Ok(zone) => zone,
        Err(response) => return response,
    };
    let path = format!("/v1/hosts/{}", encode_segment(&host_id));
    forward(state.control.allocators.get(&zone, &path, request_id(&headers)).await)
}

/// The zone's consolidation (the allocator's `GET /v1/consolidation`): its settings, the budget
/// left, the hosts being emptied, the migrations in flight and its counters. Fleet-wide: the
/// operator's key.
#[utoipa::path(get, path = "/v1/zones/{zone}/consolidation",
    params(("zone" = String, Path, description = "A zone this control service routes.")),
    responses((status = 200, description = "The allocator's `ConsolidationReport`.", content_type = "application/json"),
              (status = 404, description = "No such zone, or consolidation is off in it (`type` says which).", body = domain::Problem),
              NoApiKey, OperatorOnly, AllocatorUnreachable),
    security(("bearer" = [])))]
pub async fn zone_consolidation(
    State(state): State<AppState>,
    headers: HeaderMap,
    zone: Result<Path<String>, PathRejection>,
) -> Response {
    let zone = match known_zone(&state, &headers, zone) {
        Ok(zone) => zone,
        Err(response) => return response,
    };
    forward(state.control.allocators.get(&zone, "/v1/consolidation", request_id(&headers)).await)
}

/// A dry run in the zone (the allocator's `POST /v1/explain`): where a VM would go now, the best
/// hosts with their scores and, with `why_not`, why that host loses. Changes nothing.
/// Fleet-wide: the operator's key.
#[utoipa::path(post, path = "/v1/zones/{zone}/explain",
    params(("zone" = String, Path, description = "A zone this control service routes.")),
    request_body = domain::ExplainRequest,
    responses((status = 200, description = "The allocator's `Explanation`.", content_type = "application/json"),
              (status = 400, description = "Malformed JSON or a missing field (named in `errors`).", body = domain::Problem),
              (status = 404, description = "No such zone.", body = domain::Problem),
              (status = 422, description = "An invalid field, such as a host not in the inventory (named in `errors`).", body = domain::Problem),
              NoApiKey, OperatorOnly, AllocatorUnreachable),
    security(("bearer" = [])))]
pub async fn zone_explain(
    State(state): State<AppState>,
    headers: HeaderMap,
    zone: Result<Path<String>, PathRejection>,
    body: Bytes,
) -> Response {
    let zone = match known_zone(&state, &headers, zone) {
        Ok(zone) => zone,
        Err(response) => return response,
    };
    forward(state.control.allocators.explain(&zone, body, request_id(&headers)).await)
}

/// The zone of a zone view's path, for the operator only: 404 for a zone this service does not
/// route (naming those it does).
pub(crate) fn known_zone(
    state: &AppState,
    headers: &HeaderMap,
    zone: Result<Path<String>, PathRejection>,
) -> Result<ZoneId, Response> {
    operator(&state.control, headers)?;
    let zone = ZoneId(path_param(zone)?);
    if state.control.allocators.contains(&zone) {
        return Ok(zone);
    }
    let known: Vec<&str> = state.control.allocators.zones().map(|(zone, _)| zone.as_str()).collect();
    Err(problem(ProblemKind::NotFound, format!("no zone `{zone}`; this control service routes {}", known.join(", "))))
}

/// The allocator's answer passed on as it came, or the upstream failure as a problem.
pub(crate) fn forward(answer: Result<crate::upstream::Answer, crate::upstream::UpstreamError>) -> Response {
    match answer {
        Ok(answer) => pass_through(answer),
        Err(error) => upstream_failure(error),
    }
}
