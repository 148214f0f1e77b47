//! The standard tower stack of every service.

use crate::problem::problem;
use crate::refusals::{self, Refusal};
use axum::error_handling::HandleErrorLayer;
use axum::http::{header, HeaderName, HeaderValue, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{BoxError, Router};
use domain::ProblemKind;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tower::ServiceBuilder;
use tower_http::classify::ServerErrorsFailureClass;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

/// The header that carries a request id across the three services.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Requests admitted in flight per core by default. Measured with the overload bench
/// (`control-service/benches/overload.rs`, docs/benchmarks.md): with more, admitted requests only
/// queue for the same cores and their latency grows with the queue; with fewer, the cores idle
/// between requests that wait on an upstream.
pub const ADMITTED_PER_CORE: usize = 8;

/// The default admission limit: [`ADMITTED_PER_CORE`] per core this process may run on.
pub fn default_max_concurrency() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get) * ADMITTED_PER_CORE
}

/// Limits of the standard stack and of its connections (`[http]` of every service).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LayerConfig {
    /// A request taking longer is answered 503.
    pub request_timeout_ms: u64,
    /// Requests in flight beyond this are refused at once with 503, `Retry-After` and a problem
    /// body. Default: [`default_max_concurrency`] (8 per core).
    pub max_concurrency: usize,
    /// Larger bodies are refused with 413.
    pub max_body_bytes: usize,
    /// Open connections beyond this are closed as soon as they are accepted
    /// ([`crate::server::serve`]).
    pub max_connections: usize,
    /// A connection that began a request head must complete it within this time, or it is closed.
    pub header_read_timeout_ms: u64,
    /// A connection with no request in flight that sends nothing for this long is closed. Longer
    /// than the callers' pool idle timeouts (the control service keeps idle connections 90 s), so
    /// that a caller is not caught reusing a connection the server is closing.
    pub idle_timeout_ms: u64,
}

impl Default for LayerConfig {
    fn default() -> Self {
        LayerConfig {
            request_timeout_ms: 5_000,
            max_concurrency: default_max_concurrency(),
            max_body_bytes: 1 << 20,
            max_connections: 4_096,
            header_read_timeout_ms: 10_000,
            idle_timeout_ms: 120_000,
        }
    }
}

/// The answer to a request beyond the admission limit: 503, `Retry-After: 1`, a problem body.
pub(crate) fn overloaded() -> Response {
    let mut response = problem(ProblemKind::Overloaded, "too many requests in flight; retry shortly");
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

async fn overload_or_timeout(error: BoxError) -> Response {
    if error.is::<tower::timeout::error::Elapsed>() {
        refusals::record(Refusal::Timeout);
        // It may still be carried out (a write waiting for its batch): retrying is safe.
        let mut response = problem(ProblemKind::Timeout, "the request took too long; it may still be carried out");
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return response;
    }
    problem(ProblemKind::Internal, error.to_string())
}

/// Wraps `router` in the standard stack.
pub fn apply(router: Router, config: &LayerConfig) -> Router {
    let max_body_bytes = config.max_body_bytes;
    let request_id = HeaderName::from_static(REQUEST_ID_HEADER);
    let trace = TraceLayer::new_for_http()
        .make_span_with(|request: &Request<_>| {
            let id = request.headers().get(REQUEST_ID_HEADER).and_then(|v| v.to_str().ok()).unwrap_or("-");
            tracing::info_span!("request", method = %request.method(), path = %request.uri().path(), request_id = %id)
        })
        .on_failure(log_failure);
    router.layer(
        ServiceBuilder::new()
            .layer(SetRequestIdLayer::new(request_id.clone(), MakeRequestUuid))
            .layer(trace)
            .layer(PropagateRequestIdLayer::new(request_id))
            .layer(HandleErrorLayer::new(overload_or_timeout))
            .timeout(Duration::from_millis(config.request_timeout_ms.max(1)))
            .map_response(move |response: axum::http::Response<_>| {
                problem_for_oversized_body(response.into_response(), max_body_bytes)
            })
            .layer(RequestBodyLimitLayer::new(config.max_body_bytes))
            .map_response(IntoResponse::into_response),
    )
}

/// A body over the limit is refused with 413 by the body-limit layer or by the extractor that
/// reads it, both in plain text; every other refusal is a problem body, so this one is too.
fn problem_for_oversized_body(response: Response, max_body_bytes: usize) -> Response {
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/problem+json"));
    if response.status() != StatusCode::PAYLOAD_TOO_LARGE || is_problem {
        return response;
    }
    problem(ProblemKind::BodyTooLarge, format!("the request body is over the limit of {max_body_bytes} bytes"))
}

/// Logs a failed request. A 503 is the service refusing work by design (overloaded, timed out, not
/// ready) and is already counted and summarised by [`refusals`]: at DEBUG, so an overload does not
/// write one ERROR line per refused request. Every other 5xx is a real failure: ERROR.
fn log_failure(class: ServerErrorsFailureClass, latency: Duration, _span: &tracing::Span) {
    let latency_ms = latency.as_secs_f64() * 1_000.0;
    match class {
        ServerErrorsFailureClass::StatusCode(StatusCode::SERVICE_UNAVAILABLE) => {
            tracing::debug!(status = 503, latency_ms, "request refused");
        }
        ServerErrorsFailureClass::StatusCode(status) => {
            tracing::error!(status = status.as_u16(), latency_ms, "request failed");
        }
        ServerErrorsFailureClass::Error(error) => tracing::error!(%error, latency_ms, "request failed"),
    }
}

/// Resolves on Ctrl-C or SIGTERM, for `axum::serve(..).with_graceful_shutdown(..)`: requests in
/// flight finish, new connections are refused.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = terminate => {} }
    tracing::info!("shutting down");
}

/// The async runtime of a service binary: `threads` <= 1 runs a single-threaded runtime (no hand-off
/// between workers, the lowest latency on loopback), more a multi-threaded one.
pub fn runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    if threads <= 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread().worker_threads(threads).enable_all().build()
    }
}
