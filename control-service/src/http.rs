//! What the control service's HTTP handlers share ([`crate::api`] and [`crate::dashboard`]): the
//! caller of a request (API key, rate limit, operator-only reads) and the documented refusals that
//! go with it, the problem answers for failed upstream calls, and passing an allocator's answer on
//! as it came.

// Handlers answer early with a whole `Response` as the error: the size is the point.
#![allow(clippy::result_large_err)]

use crate::auth::{AuthError, Caller};
use crate::control::Control;
use crate::upstream::{Answer, UpstreamError};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use domain::ProblemKind;
use service_common::layers::REQUEST_ID_HEADER;
use service_common::problem::problem;
use service_common::telemetry::PrometheusHandle;
use std::sync::Arc;

service_common::problem_responses! {
    /// A route that needs an API key ([`authorize`]) called without a valid one.
    pub(crate) struct NoApiKey { 401: "No valid API key." }

    /// A tenant over its request rate ([`authorize`]).
    pub(crate) struct RateLimited { 429: "The tenant is over its request rate." }

    /// A fleet-wide route ([`operator`]) called with a tenant's key.
    pub(crate) struct OperatorOnly { 403: "A tenant key: the statistics and the zone views need the operator's key." }

    /// A zone view whose allocator could not be reached.
    pub(crate) struct AllocatorUnreachable { 502: "The allocator could not be reached." }
}

/// The state every handler gets: the service and the metrics it renders.
#[derive(Clone)]
pub struct AppState {
    pub control: Arc<Control>,
    pub metrics: Option<PrometheusHandle>,
}

pub(crate) fn request_id(headers: &HeaderMap) -> Option<&str> {
    headers.get(REQUEST_ID_HEADER).and_then(|v| v.to_str().ok())
}

/// The caller of a request (401 without a valid key), after its tenant's rate limit (429).
pub(crate) fn authorize(control: &Control, headers: &HeaderMap) -> Result<Caller, Response> {
    let authorization = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    let caller = control.keys.authenticate(authorization).map_err(|error| {
        metrics::counter!("control_auth_failures_total", "reason" => match error {
            AuthError::Missing => "missing",
            AuthError::Unknown => "unknown",
        })
        .increment(1);
        let mut response = problem(ProblemKind::Unauthorized, error.to_string());
        response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        response
    })?;
    if let Some(tenant) = caller.tenant() {
        if let Err(wait) = control.rate_limiter.check(tenant, control.started.elapsed().as_secs_f64()) {
            metrics::counter!("control_rate_limited_total").increment(1);
            let retry_after_s = wait.as_secs_f64().ceil().max(1.0) as u64;
            let mut response = problem(
                ProblemKind::RateLimited,
                format!("tenant `{tenant}` is over its request rate; retry in {retry_after_s} s"),
            );
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(retry_after_s));
            return Err(response);
        }
    }
    Ok(caller)
}

pub(crate) fn upstream_failure(error: UpstreamError) -> Response {
    let detail = error.to_string();
    match error {
        UpstreamError::Timeout { .. } => problem(
            ProblemKind::AllocatorTimeout,
            format!("{detail}; the outcome is unknown, and retrying with the same VM ids is safe"),
        ),
        // The failure already counted against the allocator's health (`Allocators::send`).
        UpstreamError::Unreachable { .. } => {
            let mut response = problem(ProblemKind::AllocatorUnreachable, detail);
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            response
        }
        UpstreamError::UnknownZone(_) => problem(ProblemKind::UnknownZone, detail),
        UpstreamError::CredentialRefused { .. } => problem(ProblemKind::AllocatorCredentialRefused, detail),
    }
}

/// An allocator answer passed on as it came.
pub(crate) fn pass_through(answer: Answer) -> Response {
    let status = StatusCode::from_u16(answer.status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut response = (status, answer.body).into_response();
    for (name, value) in [(header::CONTENT_TYPE, answer.content_type), (header::RETRY_AFTER, answer.retry_after)] {
        if let Some(value) = value.and_then(|v| HeaderValue::from_str(&v).ok()) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

/// The caller of a fleet-wide read (statistics, the zone views): the operator's key or open mode;
/// 401 without a valid key, 403 for a tenant key.
pub(crate) fn operator(control: &Control, headers: &HeaderMap) -> Result<Caller, Response> {
    let caller = authorize(control, headers)?;
    if caller.is_operator() {
        Ok(caller)
    } else {
        Err(problem(ProblemKind::OperatorOnly, "fleet-wide statistics and the zone views need the operator's API key"))
    }
}
