//! Problem responses, the validating JSON body extractor, and the problems of a path or query that
//! does not parse.

use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{FromRequest, Path, Query, Request};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use domain::{decode_json, Problem, ProblemKind, Validate, ValidationLimits, PROBLEM_CONTENT_TYPE};
use serde::de::DeserializeOwned;

/// A problem body with its status and `application/problem+json` content type.
pub fn problem_response(problem: Problem) -> Response {
    let status = StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = serde_json::to_vec(&problem).unwrap_or_default();
    let mut response = (status, body).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_CONTENT_TYPE));
    response
}

/// A problem of `kind` (its status, `type` and title), saying what happened in `detail`.
pub fn problem(kind: ProblemKind, detail: impl Into<String>) -> Response {
    problem_response(Problem::of(kind, detail))
}

/// A problem of `kind` naming the offending field in `errors`.
pub fn field_problem(kind: ProblemKind, field: impl Into<String>, message: impl Into<String>) -> Response {
    problem_response(Problem::field(kind, field, message))
}

/// A path's parameters, or the problem (400 `malformed-path`) of a path they do not parse from.
/// Handlers take the path as a `Result` and call this where its turn comes (after the caller's
/// credentials, for instance), rather than let axum answer a rejection first.
pub fn path_param<T>(path: Result<Path<T>, PathRejection>) -> Result<T, Response> {
    path.map(|Path(value)| value).map_err(|rejection| problem(ProblemKind::MalformedPath, rejection.body_text()))
}

/// A query's parameters, or the problem (400 `malformed-query`) of a query they do not parse from;
/// as [`path_param`].
pub fn query_param<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, Response> {
    query.map(|Query(value)| value).map_err(|rejection| problem(ProblemKind::MalformedQuery, rejection.body_text()))
}

/// A JSON body parsed and validated by `domain::decode_json` with the limits found in the router
/// state.
pub struct ValidJson<T>(pub T);

/// Router states that carry validation limits.
pub trait HasLimits {
    fn limits(&self) -> &ValidationLimits;
}

impl<S, T> FromRequest<S> for ValidJson<T>
where
    S: HasLimits + Send + Sync,
    T: DeserializeOwned + Validate,
{
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        require_json(request.headers())?;
        let bytes = Bytes::from_request(request, state).await.map_err(|rejection| {
            let kind = if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ProblemKind::BodyTooLarge
            } else {
                ProblemKind::UnreadableBody
            };
            problem(kind, rejection.body_text())
        })?;
        decode_json(&bytes, state.limits()).map(ValidJson).map_err(|err| problem_response(Problem::from(&err)))
    }
}

/// Parses and validates a JSON request body that has been read already (for handlers that time the
/// parsing themselves): 415 unless the content type is JSON, 400 or 422 naming the field otherwise.
pub fn json_body<T: DeserializeOwned + Validate>(
    headers: &HeaderMap,
    bytes: &[u8],
    limits: &ValidationLimits,
) -> Result<T, Response> {
    require_json(headers)?;
    decode_json(bytes, limits).map_err(|err| problem_response(Problem::from(&err)))
}

/// 415 unless the body is declared JSON.
fn require_json(headers: &HeaderMap) -> Result<(), Response> {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json") || v.starts_with("application/problem+json"));
    if !is_json {
        return Err(problem(ProblemKind::UnsupportedMediaType, "send the body as `Content-Type: application/json`"));
    }
    Ok(())
}
